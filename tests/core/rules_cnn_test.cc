// Factor rules of convolution, pooling and the CNN normalisations (core/rules/conv_pool.cc).
#include <memory>

#include <gtest/gtest.h>

#include "core/rules/rule.h"
#include "tests/core/rule_test_util.h"

namespace gspmd {
namespace {

using GB = testing::RuleBuilder;

using Ints = std::vector<int64_t>;

TEST(RulesCnn, Conv2d) {
  GB b;
  int x = b.input("x", {2, 3, 8, 8}), w = b.input("w", {4, 3, 3, 3}), bias = b.input("b", {4});
  auto r = b.rule(b.node("Conv", {x, w, bias}, {2, 4, 6, 6}, {{"kernel_shape", Ints{3, 3}}}));
  EXPECT_EQ(r.str(), "([i,m,k,l],[j,m,1,1],[j])->([i,j,k,l]) {i=2, j=4, k=8, l=8, m=3} reduction={m} windowed={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(r.reduction, ReductionKind::kSum);
  EXPECT_FALSE(r.mean);
  r = b.rule(b.node("Conv", {x, w}, {2, 4, 4, 4}, {{"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}}));
  EXPECT_EQ(r.str(), "([i,m,k,l],[j,m,1,1])->([i,j,k,l]) {i=2, j=4, k=8, l=8, m=3} reduction={m} windowed={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, true}));
  // Absent optional bias.
  r = b.rule(b.node("Conv", {x, w, -1}, {2, 4, 6, 6}));
  EXPECT_EQ(r.str(), "([i,m,k,l],[j,m,1,1],[])->([i,j,k,l]) {i=2, j=4, k=8, l=8, m=3} reduction={m} windowed={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, true, false}));
  // Mismatched channels: no rule.
  int w5 = b.input("w5", {4, 5, 3, 3});
  EXPECT_FALSE(b.has(b.node("Conv", {x, w5}, {2, 4, 6, 6})));
}

TEST(RulesCnn, Conv1dAnd3d) {
  GB b;
  int x = b.input("x", {2, 3, 10}), w = b.input("w", {4, 3, 3});
  EXPECT_EQ(b.rule(b.node("Conv", {x, w}, {2, 4, 8})).str(),
            "([i,l,k],[j,l,1])->([i,j,k]) {i=2, j=4, k=10, l=3} reduction={l} windowed={k}");
  int x3 = b.input("x3", {1, 2, 4, 6, 6}), w3 = b.input("w3", {5, 2, 3, 3, 3});
  b.node("Conv", {x3, w3}, {1, 5, 2, 4, 4});
  // Factor order n, o, spatial..., c: n=i, o=j, d=k, h=l, w=m, c=n.
  EXPECT_EQ(b.rule(static_cast<int>(b.g.nodes.size()) - 1).str(),
            "([i,n,k,l,m],[j,n,1,1,1])->([i,j,k,l,m]) {i=1, j=5, k=4, l=6, m=6, n=2} reduction={n} windowed={k,l,m}");
}

TEST(RulesCnn, ConvIdentityWindowIsPassThrough) {
  GB b;
  int x = b.input("x", {2, 3, 8, 8}), w = b.input("w", {4, 3, 1, 1});
  EXPECT_EQ(b.rule(b.node("Conv", {x, w}, {2, 4, 8, 8})).str(),
            "([i,m,k,l],[j,m,1,1])->([i,j,k,l]) {i=2, j=4, k=8, l=8, m=3} reduction={m}");
  // A strided 1x1 conv (ResNet downsample) reads every other row: windowed.
  EXPECT_EQ(b.rule(b.node("Conv", {x, w}, {2, 4, 4, 4}, {{"strides", Ints{2, 2}}})).str(),
            "([i,m,k,l],[j,m,1,1])->([i,j,k,l]) {i=2, j=4, k=8, l=8, m=3} reduction={m} windowed={k,l}");
  // 3x3 with SAME padding keeps the size but is a real window.
  int w3 = b.input("w3", {4, 3, 3, 3});
  EXPECT_EQ(b.rule(b.node("Conv", {x, w3}, {2, 4, 8, 8}, {{"auto_pad", std::string("SAME_UPPER")}})).str(),
            "([i,m,k,l],[j,m,1,1])->([i,j,k,l]) {i=2, j=4, k=8, l=8, m=3} reduction={m} windowed={k,l}");
}

TEST(RulesCnn, GroupedConv) {
  GB b;
  // G=2, C=8 (C/G=4), O=6 (O/G=3): n=i, g=j, og=k, h=l, w=m, cg=n.
  int x = b.input("x", {2, 8, 8, 8}), w = b.input("w", {6, 4, 3, 3}), bias = b.input("b", {6});
  auto r = b.rule(b.node("Conv", {x, w, bias}, {2, 6, 6, 6}, {{"group", int64_t{2}}}));
  EXPECT_EQ(r.str(),
            "([i,jn,l,m],[jk,n,1,1],[jk])->([i,jk,l,m]) {i=2, j=2, k=3, l=8, m=8, n=4} reduction={n} windowed={l,m}");
  // Depthwise (C = O = G): cg and og have size 1 and are left out; W dim 1 has no factor.
  int xd = b.input("xd", {1, 4, 5, 5}), wd = b.input("wd", {4, 1, 3, 3});
  r = b.rule(b.node("Conv", {xd, wd}, {1, 4, 5, 5}, {{"group", int64_t{4}}, {"pads", Ints{1, 1, 1, 1}}}));
  EXPECT_EQ(r.str(), "([i,j,k,l],[j,1,1,1])->([i,j,k,l]) {i=1, j=4, k=5, l=5} windowed={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, true}));
  // Channel multiplier 2 (O = 2G), C/G = 1.
  int wm = b.input("wm", {8, 1, 3, 3});
  r = b.rule(b.node("Conv", {xd, wm}, {1, 8, 3, 3}, {{"group", int64_t{4}}}));
  EXPECT_EQ(r.str(), "([i,j,l,m],[jk,1,1,1])->([i,jk,l,m]) {i=1, j=4, k=2, l=5, m=5} windowed={l,m}");
  // A split of the compound dim (g, cg) over 2 goes to g.
  DeviceMesh mesh{{2}, {"x"}};
  r = b.rule(0);
  TensorSharding s = TensorSharding::replicated(4);
  s.dims[1] = {0};
  FactorSharding fs;
  EXPECT_TRUE(project_to_factors(s, r.operands[0], r, mesh, fs));
  EXPECT_EQ(fs[1], (std::vector<int>{0}));
  EXPECT_EQ(sharding_from_factors(fs, r.results[0], r, mesh).dims, (std::vector<std::vector<int>>{{}, {0}, {}, {}}));
}

TEST(RulesCnn, ConvTranspose) {
  GB b;
  // n=i, o=j, h=k, w=l (need replication), c=m (reduction). W is [C, O/G, kh, kw].
  int x = b.input("x", {2, 4, 5, 5}), w = b.input("w", {4, 3, 3, 3}), bias = b.input("b", {3});
  auto r = b.rule(b.node("ConvTranspose", {x, w, bias}, {2, 3, 7, 7}));
  EXPECT_EQ(r.str(),
            "([i,m,k,l],[m,j,1,1],[j])->([i,j,k,l]) {i=2, j=3, k=5, l=5, m=4} reduction={m} need_replication={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{false, false, false}));
  // G=2: X dim 1 = W dim 0 = (g, cg), W dim 1 = (og), Y dim 1 = (g, og).
  int w2 = b.input("w2", {4, 3, 3, 3});
  r = b.rule(b.node("ConvTranspose", {x, w2}, {2, 6, 7, 7}, {{"group", int64_t{2}}}));
  EXPECT_EQ(r.str(),
            "([i,jn,l,m],[jn,k,1,1])->([i,jk,l,m]) {i=2, j=2, k=3, l=5, m=5, n=2} reduction={n} "
            "need_replication={l,m}");
}

TEST(RulesCnn, Pools) {
  GB b;
  int x = b.input("x", {2, 3, 8, 8});
  std::map<std::string, AttrValue> k2{{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}};
  auto r = b.rule(b.node("MaxPool", {x}, {2, 3, 4, 4}, k2));
  EXPECT_EQ(r.str(), "([i,j,k,l])->([i,j,k,l]) {i=2, j=3, k=8, l=8} windowed={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{false}));
  r = b.rule(b.node("AveragePool", {x}, {2, 3, 4, 4}, k2));
  EXPECT_EQ(r.str(), "([i,j,k,l])->([i,j,k,l]) {i=2, j=3, k=8, l=8} windowed={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true}));
  EXPECT_EQ(b.rule(b.node("LpPool", {x}, {2, 3, 4, 4}, k2)).str(),
            "([i,j,k,l])->([i,j,k,l]) {i=2, j=3, k=8, l=8} windowed={k,l}");
  // MaxPool's Indices are flat indices into the whole input: nothing may be split.
  r = b.rule(b.node("MaxPool", {x}, {2, 3, 4, 4}, k2, {{2, 3, 4, 4}}));
  EXPECT_EQ(r.str(), "([i,j,k,l])->([i,j,k,l],[i,j,k,l]) {i=2, j=3, k=8, l=8} need_replication={i,j,k,l}");
  // 1-D pool with kernel 3, SAME padding.
  int x1 = b.input("x1", {2, 3, 9});
  EXPECT_EQ(b.rule(b.node("MaxPool", {x1}, {2, 3, 9}, {{"kernel_shape", Ints{3}}, {"pads", Ints{1, 1}}})).str(),
            "([i,j,k])->([i,j,k]) {i=2, j=3, k=9} windowed={k}");
  // No kernel_shape: no rule.
  EXPECT_FALSE(b.has(b.node("MaxPool", {x}, {2, 3, 4, 4})));
}

TEST(RulesCnn, GlobalPools) {
  GB b;
  int x = b.input("x", {2, 3, 8, 8});
  auto r = b.rule(b.node("GlobalAveragePool", {x}, {2, 3, 1, 1}));
  EXPECT_EQ(r.str(), "([i,j,k,l])->([i,j,1,1]) {i=2, j=3, k=8, l=8} reduction={k,l} mean");
  EXPECT_TRUE(r.mean);
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true}));
  r = b.rule(b.node("GlobalMaxPool", {x}, {2, 3, 1, 1}));
  EXPECT_EQ(r.str(), "([i,j,k,l])->([i,j,1,1]) {i=2, j=3, k=8, l=8} reduction={k,l} reduce=max");
  EXPECT_FALSE(r.mean);
  EXPECT_EQ(b.rule(b.node("GlobalLpPool", {x}, {2, 3, 1, 1})).str(),
            "([i,j,k,l])->([i,j,1,1]) {i=2, j=3, k=8, l=8} need_replication={k,l}");
}

TEST(RulesCnn, Normalizations) {
  GB b;
  int x = b.input("x", {2, 3, 8, 8});
  int sc = b.input("scale", {3}), bi = b.input("bias", {3}), mu = b.input("mean", {3}), var = b.input("var", {3});
  auto r = b.rule(b.node("BatchNormalization", {x, sc, bi, mu, var}, {2, 3, 8, 8}));
  EXPECT_EQ(r.str(), "([i,j,k,l],[j],[j],[j],[j])->([i,j,k,l]) {i=2, j=3, k=8, l=8}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{false, false, false, false, false}));
  // Training mode: batch statistics over n and the spatial dims.
  r = b.rule(
      b.node("BatchNormalization", {x, sc, bi, mu, var}, {2, 3, 8, 8}, {{"training_mode", int64_t{1}}}, {{3}, {3}}));
  EXPECT_EQ(r.str(), "([i,j,k,l],[j],[j],[j],[j])->([i,j,k,l],[j],[j]) {i=2, j=3, k=8, l=8} need_replication={i,k,l}");
  EXPECT_EQ(b.rule(b.node("LRN", {x}, {2, 3, 8, 8}, {{"size", int64_t{3}}})).str(),
            "([i,j,k,l])->([i,j,k,l]) {i=2, j=3, k=8, l=8} need_replication={j}");
  EXPECT_EQ(b.rule(b.node("InstanceNormalization", {x, sc, bi}, {2, 3, 8, 8})).str(),
            "([i,j,k,l],[j],[j])->([i,j,k,l]) {i=2, j=3, k=8, l=8} need_replication={k,l}");
  EXPECT_EQ(b.rule(b.node("MeanVarianceNormalization", {x}, {2, 3, 8, 8})).str(),
            "([i,j,k,l])->([i,j,k,l]) {i=2, j=3, k=8, l=8} need_replication={i,k,l}");
  EXPECT_EQ(b.rule(b.node("MeanVarianceNormalization", {x}, {2, 3, 8, 8}, {{"axes", Ints{-1}}})).str(),
            "([i,j,k,l])->([i,j,k,l]) {i=2, j=3, k=8, l=8} need_replication={l}");
}

TEST(RulesCnn, DepthSpace) {
  GB b;
  int x = b.input("x", {1, 8, 2, 3});
  EXPECT_EQ(b.rule(b.node("DepthToSpace", {x}, {1, 2, 4, 6}, {{"blocksize", int64_t{2}}})).str(),
            "([i,j,k,l])->([i,m,n,o]) {i=1, j=8, k=2, l=3, m=2, n=4, o=6} need_replication={j,k,l,m,n,o}");
  int y = b.input("y", {2, 2, 4, 6});
  EXPECT_EQ(b.rule(b.node("SpaceToDepth", {y}, {2, 8, 2, 3}, {{"blocksize", int64_t{2}}})).str(),
            "([i,j,k,l])->([i,m,n,o]) {i=2, j=2, k=4, l=6, m=8, n=2, o=3} need_replication={j,k,l,m,n,o}");
}

}  // namespace
}  // namespace gspmd
