#include "core/rules/rule.h"

#include <memory>

#include <gtest/gtest.h>

#include "tests/core/rule_test_util.h"

namespace gspmd {
namespace {

using GB = testing::RuleBuilder;

TEST(Rules, Registry) {
  EXPECT_TRUE(has_rule("", "MatMul"));
  EXPECT_TRUE(has_rule("ai.onnx", "Gather"));
  EXPECT_TRUE(has_rule("", "LayerNormalization"));
  EXPECT_FALSE(has_rule("", "NoSuchOp"));
  EXPECT_FALSE(has_rule("gspmd", "MatMul"));
  register_rule("test", "MyOp", [](const Graph&, const Node& n) -> std::optional<OpShardingRule> {
    OpShardingRule r;
    r.factor_sizes = {4};
    r.factor_kinds = {FactorKind::kPassThrough};
    r.operands = {{{0}}};
    r.results = {{{0}}};
    return r;
  });
  EXPECT_TRUE(has_rule("test", "MyOp"));
  GB b;
  int x = b.input("x", {4});
  int n = b.node("MyOp", {x}, {4});
  b.g.nodes[n].domain = "test";
  EXPECT_EQ(b.rule(n).str(), "([i])->([i]) {i=4}");
  b.g.nodes[n].op_type = "Unknown";
  EXPECT_FALSE(get_rule(b.g, b.g.nodes[n]).has_value());
}

TEST(Rules, MatMulBatchBroadcast) {
  GB b;
  int a = b.input("a", {2, 1, 4, 8}), w = b.input("w", {3, 8, 5});
  auto r = b.rule(b.node("MatMul", {a, w}, {2, 3, 4, 5}));
  EXPECT_EQ(r.str(), "([i,1,k,m],[j,m,l])->([i,j,k,l]) {i=2, j=3, k=4, l=5, m=8} reduction={m}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, true}));
  EXPECT_EQ(r.reduction, ReductionKind::kSum);

  int v = b.input("v", {8});
  EXPECT_EQ(b.rule(b.node("MatMul", {v, w}, {3, 5})).str(), "([k],[i,k,j])->([i,j]) {i=3, j=5, k=8} reduction={k}");
  EXPECT_EQ(b.rule(b.node("MatMul", {a, v}, {2, 1, 4})).str(),
            "([i,j,k,l],[l])->([i,j,k]) {i=2, j=1, k=4, l=8} reduction={l}");
  int x = b.input("x", {2, 6, 16}), w1 = b.input("w1", {16, 32});
  EXPECT_EQ(b.rule(b.node("MatMul", {x, w1}, {2, 6, 32})).str(),
            "([i,j,l],[l,k])->([i,j,k]) {i=2, j=6, k=32, l=16} reduction={l}");
  // Inconsistent shapes: no rule.
  int bad = b.node("MatMul", {x, a}, {2, 6, 5});
  EXPECT_FALSE(get_rule(b.g, b.g.nodes[bad]).has_value());
}

TEST(Rules, Gemm) {
  GB b;
  int a = b.input("a", {4, 8}), w = b.input("w", {5, 8}), c = b.input("c", {5});
  auto r = b.rule(b.node("Gemm", {a, w, c}, {4, 5}, {{"transB", int64_t{1}}}));
  EXPECT_EQ(r.str(), "([i,k],[j,k],[j])->([i,j]) {i=4, j=5, k=8} reduction={k}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{false, false, false}));
  int at = b.input("at", {8, 4}), c2 = b.input("c2", {4, 1});
  r = b.rule(b.node("Gemm", {at, w, c2}, {4, 5}, {{"transA", int64_t{1}}, {"transB", int64_t{1}}}));
  EXPECT_EQ(r.str(), "([k,i],[j,k],[i,1])->([i,j]) {i=4, j=5, k=8} reduction={k}");
  int w2 = b.input("w2", {8, 5});
  r = b.rule(b.node("Gemm", {a, w2}, {4, 5}));
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, true}));
}

TEST(Rules, ElementwiseBroadcast) {
  GB b;
  int x = b.input("x", {4, 1, 8}), y = b.input("y", {8});
  auto r = b.rule(b.node("Add", {x, y}, {4, 3, 8}));
  EXPECT_EQ(r.str(), "([i,1,k],[k])->([i,j,k]) {i=4, j=3, k=8}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, true}));
  EXPECT_EQ(b.rule(b.node("Div", {x, y}, {4, 1, 8})).linear_operands, (std::vector<bool>{true, false}));
  EXPECT_EQ(b.rule(b.node("Pow", {x, y}, {4, 1, 8})).linear_operands, (std::vector<bool>{false, false}));
  int c = b.input("c", {4, 1, 1}, DType::kBool);
  EXPECT_EQ(b.rule(b.node("Where", {c, x, y}, {4, 1, 8})).str(), "([i,j,1],[i,j,k],[k])->([i,j,k]) {i=4, j=1, k=8}");
  EXPECT_EQ(b.rule(b.node("Erf", {x}, {4, 1, 8})).str(), "([i,j,k])->([i,j,k]) {i=4, j=1, k=8}");
  int lo = b.input("lo", {});
  EXPECT_EQ(b.rule(b.node("Clip", {x, lo, -1}, {4, 1, 8})).str(), "([i,j,k],[],[])->([i,j,k]) {i=4, j=1, k=8}");
  int ratio = b.input("ratio", {});
  auto d = b.rule(b.node("Dropout", {x, ratio}, {4, 1, 8}, {}, {{4, 1, 8}}));
  EXPECT_EQ(d.str(), "([i,j,k],[])->([i,j,k],[i,j,k]) {i=4, j=1, k=8}");
  EXPECT_EQ(d.linear_operands, (std::vector<bool>{true, false}));
  int s = b.input("s", {4, 1, 8});
  EXPECT_EQ(b.rule(b.node("Sum", {x, y, s}, {4, 1, 8})).linear_operands, (std::vector<bool>{true, true, true}));
}

TEST(Rules, ReshapeDecomposition) {
  GB b;
  int x = b.input("x", {2, 4, 12}), sh = b.ints("sh", {2, 4, 3, 4});
  auto r = b.rule(b.node("Reshape", {x, sh}, {2, 4, 3, 4}));
  EXPECT_EQ(r.str(), "([i,j,kl],[1])->([i,j,k,l]) {i=2, j=4, k=3, l=4}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));

  int y = b.input("y", {2, 4, 3, 4});
  EXPECT_EQ(b.rule(b.node("Reshape", {y, sh}, {2, 4, 12})).str(), "([i,j,k,l],[1])->([i,j,kl]) {i=2, j=4, k=3, l=4}");

  int bs = b.input("bs", {8, 6});
  EXPECT_EQ(b.rule(b.node("Reshape", {bs, sh}, {2, 4, 6})).str(), "([ij,k],[1])->([i,j,k]) {i=2, j=4, k=6}");

  int t = b.input("t", {2, 3});
  r = b.rule(b.node("Reshape", {t, sh}, {3, 2}));
  EXPECT_EQ(r.str(), "([i,j],[1])->([k,l]) {i=2, j=3, k=3, l=2} need_replication={i,j,k,l}");

  int u = b.input("u", {6, 2});
  r = b.rule(b.node("Reshape", {u, sh}, {4, 3}));  // major factor 2 is common, the rest is not
  EXPECT_EQ(r.str(), "([ij,k],[1])->([il,m]) {i=2, j=3, k=2, l=2, m=3} need_replication={j,k,l,m}");

  // Size-1 dims are factorless; Unsqueeze/Squeeze/Flatten decompose the same way.
  int w = b.input("w", {4, 1, 8}), ax = b.ints("ax", {1});
  EXPECT_EQ(b.rule(b.node("Squeeze", {w, ax}, {4, 8})).str(), "([i,1,j],[1])->([i,j]) {i=4, j=8}");
  int v = b.input("v", {4, 8});
  EXPECT_EQ(b.rule(b.node("Unsqueeze", {v, ax}, {4, 1, 8})).str(), "([i,j],[1])->([i,1,j]) {i=4, j=8}");
  int f = b.input("f", {2, 3, 4, 5});
  EXPECT_EQ(b.rule(b.node("Flatten", {f}, {6, 20}, {{"axis", int64_t{2}}})).str(),
            "([i,j,k,l])->([ij,kl]) {i=2, j=3, k=4, l=5}");
  // [4,6] -> [2,12]: 4 = 2*2 shared with 12 = 2*6.
  int q = b.input("q", {4, 6});
  EXPECT_EQ(b.rule(b.node("Reshape", {q, sh}, {2, 12})).str(), "([ij,k],[1])->([i,jk]) {i=2, j=2, k=6}");
}

TEST(Rules, ProjectCompoundDim) {
  GB b;
  int x = b.input("x", {2, 4, 12}), sh = b.ints("sh", {2, 4, 3, 4});
  auto r = b.rule(b.node("Reshape", {x, sh}, {2, 4, 3, 4}));  // factors i,j,k=3,l=4; dim 2 = (k,l)
  DeviceMesh m{{3, 2, 4}, {"x", "y", "z"}};
  TensorSharding s = TensorSharding::replicated(3);
  s.dims[2] = {0, 1};  // 12 over x(3) then y(2): k gets x, l gets y
  FactorSharding fs;
  EXPECT_TRUE(project_to_factors(s, r.operands[0], r, m, fs));
  ASSERT_EQ(fs.size(), 4u);
  EXPECT_EQ(fs[2], (std::vector<int>{0}));
  EXPECT_EQ(fs[3], (std::vector<int>{1}));
  EXPECT_EQ(sharding_from_factors(fs, r.results[0]).dims, (std::vector<std::vector<int>>{{}, {}, {0}, {1}}));
  EXPECT_EQ(sharding_from_factors(fs, r.operands[0], r, m).dims, (std::vector<std::vector<int>>{{}, {}, {0, 1}}));

  s.dims[2] = {1};  // y(2) does not divide k=3: not expressible
  s.dims[0] = {0};  // x(3) on a single-factor dim of 2: allowed (uneven)
  FactorSharding fs2;
  EXPECT_FALSE(project_to_factors(s, r.operands[0], r, m, fs2));
  EXPECT_EQ(fs2[0], (std::vector<int>{0}));
  EXPECT_TRUE(fs2[2].empty());

  // [B,S,H*D] -> [B,S,H,D] with H=4: a split of 2 goes to H; back on the merged dim.
  GB c;
  int q = c.input("q", {2, 8, 16}), sh2 = c.ints("sh", {2, 8, 4, 4});
  auto r2 = c.rule(c.node("Reshape", {q, sh2}, {2, 8, 4, 4}));
  DeviceMesh m2{{2, 2}, {"data", "model"}};
  TensorSharding qs = TensorSharding::replicated(3);
  qs.dims = {{0}, {}, {1}};
  FactorSharding f3;
  EXPECT_TRUE(project_to_factors(qs, r2.operands[0], r2, m2, f3));
  EXPECT_EQ(sharding_from_factors(f3, r2.results[0]).dims, (std::vector<std::vector<int>>{{0}, {}, {1}, {}}));
  // h partially split and d split: the merged dim can only take h's axes.
  FactorSharding f4(r2.num_factors());
  f4[2] = {1};
  f4[3] = {0};
  EXPECT_EQ(sharding_from_factors(f4, r2.operands[0], r2, m2).dims, (std::vector<std::vector<int>>{{}, {}, {1}}));
  // h fully split (4 over data*model) then d: both.
  FactorSharding f5(r2.num_factors());
  f5[2] = {0, 1};
  EXPECT_EQ(sharding_from_factors(f5, r2.operands[0], r2, m2).dims, (std::vector<std::vector<int>>{{}, {}, {0, 1}}));
}

TEST(Rules, Gather) {
  GB b;
  int table = b.input("table", {100, 16}), ids = b.input("ids", {2, 5}, DType::kInt64);
  auto r = b.rule(b.node("Gather", {table, ids}, {2, 5, 16}));
  EXPECT_EQ(r.str(), "([i,l],[j,k])->([j,k,l]) {i=100, j=2, k=5, l=16} reduction={i}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));
  int d = b.input("d", {3, 7, 4}), idx = b.input("idx", {6}, DType::kInt64);
  EXPECT_EQ(b.rule(b.node("Gather", {d, idx}, {3, 6, 4}, {{"axis", int64_t{-2}}})).str(),
            "([i,j,l],[k])->([i,k,l]) {i=3, j=7, k=6, l=4} reduction={j}");
}

TEST(Rules, SoftmaxAxis) {
  GB b;
  int x = b.input("x", {2, 3, 4});
  auto r = b.rule(b.node("Softmax", {x}, {2, 3, 4}));
  EXPECT_EQ(r.str(), "([i,j,k])->([i,j,k]) {i=2, j=3, k=4} need_replication={k}");
  r = b.rule(b.node("LogSoftmax", {x}, {2, 3, 4}, {{"axis", int64_t{1}}}));
  EXPECT_EQ(r.str(), "([i,j,k])->([i,j,k]) {i=2, j=3, k=4} need_replication={j}");
  b.g.opset = 11;  // coerce to 2-D: everything from the axis on
  r = b.rule(b.node("Softmax", {x}, {2, 3, 4}));
  EXPECT_EQ(r.str(), "([i,j,k])->([i,j,k]) {i=2, j=3, k=4} need_replication={j,k}");
}

TEST(Rules, LayerNorm) {
  GB b;
  int x = b.input("x", {2, 3, 8}), sc = b.input("scale", {8}), bi = b.input("bias", {8});
  auto r = b.rule(b.node("LayerNormalization", {x, sc, bi}, {2, 3, 8}, {}, {{2, 3, 1}, {2, 3, 1}}));
  EXPECT_EQ(r.str(), "([i,j,k],[k],[k])->([i,j,k],[i,j,1],[i,j,1]) {i=2, j=3, k=8} need_replication={k}");
}

TEST(Rules, Reductions) {
  GB b;
  int x = b.input("x", {4, 6, 8}), ax = b.ints("axes", {1});
  auto r = b.rule(b.node("ReduceSum", {x, ax}, {4, 1, 8}));
  EXPECT_EQ(r.str(), "([i,j,k],[1])->([i,1,k]) {i=4, j=6, k=8} reduction={j}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));
  r = b.rule(b.node("ReduceMax", {x}, {4, 8}, {{"axes", std::vector<int64_t>{-2}}, {"keepdims", int64_t{0}}}));
  EXPECT_EQ(r.str(), "([i,j,k])->([i,k]) {i=4, j=6, k=8} reduction={j} reduce=max");
  r = b.rule(b.node("ReduceMean", {x}, {1, 1, 8}, {{"axes", std::vector<int64_t>{0, 1}}}));
  EXPECT_EQ(r.str(), "([i,j,k])->([1,1,k]) {i=4, j=6, k=8} reduction={i,j} mean");
  EXPECT_TRUE(r.mean);
  EXPECT_EQ(r.reduction, ReductionKind::kSum);
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true}));
  r = b.rule(b.node("ReduceMin", {x}, {}, {{"keepdims", int64_t{0}}}));  // no axes: all
  EXPECT_EQ(r.str(), "([i,j,k])->([]) {i=4, j=6, k=8} reduction={i,j,k} reduce=min");
  int empty = b.ints("none", {});
  r = b.rule(b.node("ReduceSum", {x, empty}, {4, 6, 8}, {{"noop_with_empty_axes", int64_t{1}}}));
  EXPECT_EQ(r.str(), "([i,j,k],[1])->([i,j,k]) {i=4, j=6, k=8}");
}

TEST(Rules, DataMovement) {
  GB b;
  int x = b.input("x", {2, 3, 4});
  EXPECT_EQ(b.rule(b.node("Transpose", {x}, {3, 2, 4}, {{"perm", std::vector<int64_t>{1, 0, 2}}})).str(),
            "([i,j,k])->([j,i,k]) {i=2, j=3, k=4}");
  EXPECT_EQ(b.rule(b.node("Transpose", {x}, {4, 3, 2})).str(), "([i,j,k])->([k,j,i]) {i=2, j=3, k=4}");
  int y = b.input("y", {2, 5, 4});
  EXPECT_EQ(b.rule(b.node("Concat", {x, y}, {2, 8, 4}, {{"axis", int64_t{1}}})).str(),
            "([i,j,k],[i,j,k])->([i,j,k]) {i=2, j=8, k=4} permutation={j}");
  int st = b.ints("st", {1}), en = b.ints("en", {3}), ax = b.ints("ax", {2});
  EXPECT_EQ(b.rule(b.node("Slice", {x, st, en, ax}, {2, 3, 2})).str(),
            "([i,j,k],[1],[1],[1])->([i,j,k]) {i=2, j=3, k=4} permutation={k}");
  int z0 = b.ints("z0", {0}), big = b.ints("big", {100}), ax0 = b.ints("ax0", {0}), neg = b.ints("neg", {-1});
  EXPECT_EQ(b.rule(b.node("Slice", {x, z0, big, ax0, neg}, {2, 3, 4})).str(),  // reversed dim 0
            "([i,j,k],[1],[1],[1],[1])->([i,j,k]) {i=2, j=3, k=4} permutation={i}");
  int sp = b.ints("sp", {1, 3});
  EXPECT_EQ(b.rule(b.node("Split", {x, sp}, {2, 3, 1}, {{"axis", int64_t{2}}}, {{2, 3, 3}})).str(),
            "([i,j,k],[1])->([i,j,k],[i,j,k]) {i=2, j=3, k=4} permutation={k}");
  int e = b.input("e", {3, 1}), es = b.ints("es", {2, 3, 4});
  EXPECT_EQ(b.rule(b.node("Expand", {e, es}, {2, 3, 4})).str(), "([j,1],[1])->([i,j,k]) {i=2, j=3, k=4}");
  EXPECT_EQ(b.rule(b.node("ConstantOfShape", {es}, {2, 3, 4})).str(), "([1])->([i,j,k]) {i=2, j=3, k=4}");
  EXPECT_EQ(b.rule(b.node("Constant", {}, {5})).str(), "()->([i]) {i=5}");
  EXPECT_EQ(b.rule(b.node("Identity", {x}, {2, 3, 4})).linear_operands, (std::vector<bool>{true}));
}

}  // namespace
}  // namespace gspmd
