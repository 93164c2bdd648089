// Factor rules of Einsum (core/rules/einsum.cc), the data-movement and indexing ops (core/rules/index_ops.cc) and
// the registry coverage of the ops issue 3 lists.
#include <memory>

#include <gtest/gtest.h>

#include "core/rules/rule.h"
#include "tests/core/rule_test_util.h"

namespace gspmd {
namespace {

using GB = testing::RuleBuilder;

using Ints = std::vector<int64_t>;
std::map<std::string, AttrValue> eq(const std::string& e) { return {{"equation", e}}; }

TEST(RulesMisc, EinsumLikeMatMul) {
  GB b;
  int x = b.input("x", {2, 4, 8}), w = b.input("w", {8, 16});
  auto r = b.rule(b.node("Einsum", {x, w}, {2, 4, 16}, eq("bsh,hf->bsf")));
  EXPECT_EQ(r.str(), "([i,j,l],[l,k])->([i,j,k]) {i=2, j=4, k=16, l=8} reduction={l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, true}));
  EXPECT_EQ(r.reduction, ReductionKind::kSum);
  // Spaces and implicit output: "ij,jk" -> "ik" (labels appearing once, alphabetical).
  int a = b.input("a", {3, 4}), c = b.input("c", {4, 5});
  EXPECT_EQ(b.rule(b.node("Einsum", {a, c}, {3, 5}, eq("ij, jk"))).str(),
            "([i,k],[k,j])->([i,j]) {i=3, j=5, k=4} reduction={k}");
  // Transposed output and a reduction present in only one operand.
  EXPECT_EQ(b.rule(b.node("Einsum", {a, c}, {5}, eq("ij,jk->k"))).str(),
            "([j,k],[k,i])->([i]) {i=5, j=3, k=4} reduction={j,k}");
  EXPECT_EQ(b.rule(b.node("Einsum", {a}, {4, 3}, eq("ij->ji"))).str(), "([j,i])->([i,j]) {i=4, j=3}");
}

TEST(RulesMisc, EinsumBroadcastAndEllipsis) {
  GB b;
  int a = b.input("a", {1, 3, 4}), c = b.input("c", {2, 4, 5});
  EXPECT_EQ(b.rule(b.node("Einsum", {a, c}, {2, 3, 5}, eq("bij,bjk->bik"))).str(),
            "([1,j,l],[i,l,k])->([i,j,k]) {i=2, j=3, k=5, l=4} reduction={l}");
  int e = b.input("e", {2, 3, 4, 5}), f = b.input("f", {3, 5, 6});
  EXPECT_EQ(b.rule(b.node("Einsum", {e, f}, {2, 3, 4, 6}, eq("...ij,...jk->...ik"))).str(),
            "([i,j,k,m],[j,m,l])->([i,j,k,l]) {i=2, j=3, k=4, l=6, m=5} reduction={m}");
  // Implicit output with ellipsis: ellipsis dims first.
  EXPECT_EQ(b.rule(b.node("Einsum", {e, f}, {2, 3, 4, 6}, eq("...ij,...jk"))).str(),
            "([i,j,k,m],[j,m,l])->([i,j,k,l]) {i=2, j=3, k=4, l=6, m=5} reduction={m}");
  // Diagonals and malformed equations: no rule.
  int s = b.input("s", {4, 4});
  EXPECT_FALSE(b.has(b.node("Einsum", {s}, {4}, eq("ii->i"))));
  EXPECT_FALSE(b.has(b.node("Einsum", {s}, {4}, eq("ij->k"))));
  EXPECT_FALSE(b.has(b.node("Einsum", {s, s}, {4}, eq("ij->i"))));
  EXPECT_FALSE(b.has(b.node("Einsum", {s}, {4}, eq("i..j->i"))));
}

TEST(RulesMisc, PadTileResize) {
  GB b;
  int x = b.input("x", {2, 3, 4});
  int pads = b.ints("pads", {0, 1, 0, 0, 2, 0});
  auto r = b.rule(b.node("Pad", {x, pads}, {2, 6, 4}));
  EXPECT_EQ(r.str(), "([i,j,k],[1])->([i,j,k]) {i=2, j=3, k=4} permutation={j}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));
  int one = b.floats("one", {1.f});
  EXPECT_EQ(b.rule(b.node("Pad", {x, pads, one}, {2, 6, 4})).linear_operands, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(b.rule(b.node("Pad", {x, pads}, {2, 6, 4}, {{"mode", std::string("reflect")}})).linear_operands,
            (std::vector<bool>{true, false}));
  // A shift (pads 1, -1) keeps the size but moves data.
  int shift = b.ints("shift", {0, 0, 1, 0, 0, -1});
  EXPECT_EQ(b.rule(b.node("Pad", {x, shift}, {2, 3, 4})).str(),
            "([i,j,k],[1])->([i,j,k]) {i=2, j=3, k=4} permutation={k}");
  // Opset 18 axes; pads not constant: every dim.
  int axes = b.ints("axes", {-1}), p2 = b.ints("p2", {1, 1});
  EXPECT_EQ(b.rule(b.node("Pad", {x, p2, -1, axes}, {2, 3, 6})).str(),
            "([i,j,k],[1],[],[1])->([i,j,k]) {i=2, j=3, k=4} permutation={k}");
  int dyn = b.input("dyn", {6}, DType::kInt64);
  EXPECT_EQ(b.rule(b.node("Pad", {x, dyn}, {2, 3, 4})).str(),
            "([i,j,k],[1])->([i,j,k]) {i=2, j=3, k=4} permutation={i,j,k}");
  // Opset < 11: pads attribute.
  EXPECT_EQ(b.rule(b.node("Pad", {x}, {4, 3, 4}, {{"pads", Ints{1, 0, 0, 1, 0, 0}}})).str(),
            "([i,j,k])->([i,j,k]) {i=2, j=3, k=4} permutation={i}");

  int t = b.input("t", {2, 3}), rep = b.ints("rep", {1, 2});
  r = b.rule(b.node("Tile", {t, rep}, {2, 6}));
  EXPECT_EQ(r.str(), "([i,j],[1])->([i,j]) {i=2, j=3} permutation={j}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));

  int img = b.input("img", {1, 3, 4, 4}), scales = b.floats("scales", {1, 1, 2, 2});
  r = b.rule(b.node("Resize", {img, -1, scales}, {1, 3, 8, 8}, {{"mode", std::string("linear")}}));
  EXPECT_EQ(r.str(), "([i,j,k,l],[],[1])->([i,j,k,l]) {i=1, j=3, k=4, l=4} need_replication={k,l}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false, false}));
  // Scale 1.1 on a dim of 4 keeps its size (floor(4.4) = 4) but moves the sampling points.
  int near1 = b.floats("near1", {1, 1, 1.1f, 2});
  EXPECT_EQ(b.rule(b.node("Resize", {img, -1, near1}, {1, 3, 4, 8})).str(),
            "([i,j,k,l],[],[1])->([i,j,k,l]) {i=1, j=3, k=4, l=4} need_replication={k,l}");
  int sizes = b.ints("sizes", {1, 3, 4, 8}), empty = b.floats("empty", {});
  EXPECT_EQ(b.rule(b.node("Resize", {img, -1, empty, sizes}, {1, 3, 4, 8})).str(),
            "([i,j,k,l],[],[1],[1])->([i,j,k,l]) {i=1, j=3, k=4, l=4} need_replication={l}");
  b.g.opset = 10;  // Resize-10: X, scales
  EXPECT_EQ(b.rule(b.node("Resize", {img, scales}, {1, 3, 8, 8})).str(),
            "([i,j,k,l],[1])->([i,j,k,l]) {i=1, j=3, k=4, l=4} need_replication={k,l}");
}

TEST(RulesMisc, RangeTopKCumSum) {
  GB b;
  int s = b.ints("start", {0}, true), l = b.ints("limit", {10}, true), d = b.ints("delta", {1}, true);
  EXPECT_EQ(b.rule(b.node("Range", {s, l, d}, {10})).str(), "([],[],[])->([i]) {i=10}");
  int x = b.input("x", {4, 10}), k = b.ints("k", {3});
  auto r = b.rule(b.node("TopK", {x, k}, {4, 3}, {}, {{4, 3}}));
  EXPECT_EQ(r.str(), "([i,j],[1])->([i,k],[i,k]) {i=4, j=10, k=3} need_replication={j,k}");
  EXPECT_EQ(b.rule(b.node("TopK", {x, k}, {3, 10}, {{"axis", int64_t{0}}}, {{3, 10}})).str(),
            "([i,j],[1])->([k,j],[k,j]) {i=4, j=10, k=3} need_replication={i,k}");
  int ax = b.ints("ax", {1}, true);
  r = b.rule(b.node("CumSum", {x, ax}, {4, 10}));
  EXPECT_EQ(r.str(), "([i,j],[])->([i,j]) {i=4, j=10} need_replication={j}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));
}

TEST(RulesMisc, GatherScatterFamily) {
  GB b;
  int x = b.input("x", {4, 5}), idx = b.input("idx", {4, 3}, DType::kInt64);
  auto r = b.rule(b.node("GatherElements", {x, idx}, {4, 3}, {{"axis", int64_t{1}}}));
  EXPECT_EQ(r.str(), "([i,j],[i,k])->([i,k]) {i=4, j=5, k=3} need_replication={j}");
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));
  int idx2 = b.input("idx2", {2, 3}, DType::kInt64);  // smaller than data on the non-axis dim 0 too
  EXPECT_EQ(b.rule(b.node("GatherElements", {x, idx2}, {2, 3}, {{"axis", int64_t{1}}})).str(),
            "([i,k],[j,l])->([j,l]) {i=4, j=2, k=5, l=3} need_replication={i,j,k}");

  int data = b.input("data", {2, 3, 4}), nd = b.input("nd", {5, 2}, DType::kInt64);
  EXPECT_EQ(b.rule(b.node("GatherND", {data, nd}, {5, 4})).str(),
            "([k,l,m],[i,j])->([i,m]) {i=5, j=2, k=2, l=3, m=4} need_replication={j,k,l}");
  int bnd = b.input("bnd", {2, 6, 1}, DType::kInt64);  // batch_dims = 1
  EXPECT_EQ(b.rule(b.node("GatherND", {data, bnd}, {2, 6, 4}, {{"batch_dims", int64_t{1}}})).str(),
            "([i,l,m],[i,j,k])->([i,j,m]) {i=2, j=6, k=1, l=3, m=4} need_replication={k,l}");

  int upd = b.input("upd", {4, 3});
  EXPECT_EQ(b.rule(b.node("ScatterElements", {x, idx, upd}, {4, 5}, {{"axis", int64_t{1}}})).str(),
            "([i,j],[i,k],[i,k])->([i,j]) {i=4, j=5, k=3} need_replication={j,k}");
  int sd = b.input("sd", {4, 5}), si = b.input("si", {3, 1}, DType::kInt64), su = b.input("su", {3, 5});
  EXPECT_EQ(b.rule(b.node("ScatterND", {sd, si, su}, {4, 5})).str(),
            "([k,l],[i,j],[i,l])->([k,l]) {i=3, j=1, k=4, l=5} need_replication={i,j,k}");

  int oi = b.input("oi", {4, 6}, DType::kInt64), depth = b.ints("depth", {10}, true), vals = b.floats("v", {0, 1});
  EXPECT_EQ(b.rule(b.node("OneHot", {oi, depth, vals}, {4, 6, 10})).str(),
            "([i,j],[],[1])->([i,j,k]) {i=4, j=6, k=10} need_replication={k}");
  EXPECT_EQ(b.rule(b.node("OneHot", {oi, depth, vals}, {10, 4, 6}, {{"axis", int64_t{0}}})).str(),
            "([j,k],[],[1])->([i,j,k]) {i=10, j=4, k=6} need_replication={i}");

  int nz = b.input("nz", {3, 4});
  EXPECT_EQ(b.rule(b.node("NonZero", {nz}, {2, 7})).str(),
            "([i,j])->([k,l]) {i=3, j=4, k=2, l=7} need_replication={i,j,k,l}");
  int cond = b.input("cond", {4}, DType::kBool);
  EXPECT_EQ(b.rule(b.node("Compress", {nz, cond}, {3, 2}, {{"axis", int64_t{1}}})).str(),
            "([i,j],[1])->([i,k]) {i=3, j=4, k=2} need_replication={j,k}");
  EXPECT_EQ(b.rule(b.node("Compress", {nz, cond}, {5})).str(),
            "([i,j],[k])->([l]) {i=3, j=4, k=4, l=5} need_replication={i,j,k,l}");
}

TEST(RulesMisc, ElementwiseNewOps) {
  GB b;
  int x = b.input("x", {4, 8}), y = b.input("y", {8});
  for (const char* op : {"Clip", "Sigmoid", "LeakyRelu", "HardSigmoid", "HardSwish", "Abs", "Log", "Reciprocal", "Not",
                         "Elu", "Selu", "Celu", "Softplus", "Softsign", "ThresholdedRelu", "Mish"})
    EXPECT_EQ(b.rule(b.node(op, {x}, {4, 8})).str(), "([i,j])->([i,j]) {i=4, j=8}") << op;
  for (const char* op : {"And", "Or", "Less", "Greater", "PRelu"})
    EXPECT_EQ(b.rule(b.node(op, {x, y}, {4, 8})).str(), "([i,j],[j])->([i,j]) {i=4, j=8}") << op;
  for (const char* op : {"Sum", "Max", "Min", "Mean"})
    EXPECT_EQ(b.rule(b.node(op, {x, y, x}, {4, 8})).str(), "([i,j],[j],[i,j])->([i,j]) {i=4, j=8}") << op;
  EXPECT_EQ(b.rule(b.node("Hardmax", {x}, {4, 8})).str(), "([i,j])->([i,j]) {i=4, j=8} need_replication={j}");
  EXPECT_EQ(b.rule(b.node("LogSoftmax", {x}, {4, 8}, {{"axis", int64_t{0}}})).str(),
            "([i,j])->([i,j]) {i=4, j=8} need_replication={i}");
}

TEST(RulesMisc, ReductionsOnSplitAxes) {
  GB b;
  int x = b.input("x", {4, 6}), ax = b.ints("ax", {1});
  auto r = b.rule(b.node("ReduceMean", {x, ax}, {4, 1}));
  EXPECT_EQ(r.str(), "([i,j],[1])->([i,1]) {i=4, j=6} reduction={j} mean");
  EXPECT_TRUE(r.mean);
  EXPECT_EQ(r.linear_operands, (std::vector<bool>{true, false}));
  std::map<std::string, AttrValue> a1{{"axes", Ints{1}}, {"keepdims", int64_t{0}}};
  EXPECT_EQ(b.rule(b.node("ReduceSumSquare", {x}, {4}, a1)).str(), "([i,j])->([i]) {i=4, j=6} reduction={j}");
  EXPECT_EQ(b.rule(b.node("ReduceL1", {x}, {4}, a1)).str(), "([i,j])->([i]) {i=4, j=6} reduction={j}");
  EXPECT_EQ(b.rule(b.node("ReduceProd", {x}, {4}, a1)).str(), "([i,j])->([i]) {i=4, j=6} reduction={j} reduce=prod");
  EXPECT_EQ(b.rule(b.node("ReduceMin", {x}, {4}, a1)).str(), "([i,j])->([i]) {i=4, j=6} reduction={j} reduce=min");
  for (const char* op : {"ReduceL2", "ReduceLogSumExp", "ReduceLogSum"})
    EXPECT_EQ(b.rule(b.node(op, {x}, {4}, a1)).str(), "([i,j])->([i]) {i=4, j=6} need_replication={j}") << op;
  for (const char* op : {"ArgMax", "ArgMin"})
    EXPECT_EQ(b.rule(b.node(op, {x}, {4}, {{"axis", int64_t{1}}, {"keepdims", int64_t{0}}})).str(),
              "([i,j])->([i]) {i=4, j=6} need_replication={j}")
        << op;
  EXPECT_FALSE(b.rule(b.node("ReduceSum", {x, ax}, {4, 1})).mean);
}

TEST(RulesMisc, Issue3OpsAllRegistered) {
  for (const char* op : {"Conv",
                         "ConvTranspose",
                         "MaxPool",
                         "AveragePool",
                         "LpPool",
                         "GlobalAveragePool",
                         "GlobalMaxPool",
                         "BatchNormalization",
                         "LRN",
                         "InstanceNormalization",
                         "MeanVarianceNormalization",
                         "ReduceSum",
                         "ReduceMax",
                         "ReduceMin",
                         "ReduceMean",
                         "ReduceProd",
                         "ReduceL2",
                         "ReduceL1",
                         "ReduceSumSquare",
                         "ReduceLogSumExp",
                         "ReduceLogSum",
                         "ArgMax",
                         "ArgMin",
                         "Flatten",
                         "Expand",
                         "Pad",
                         "Tile",
                         "Resize",
                         "Range",
                         "ConstantOfShape",
                         "Clip",
                         "Sigmoid",
                         "LeakyRelu",
                         "HardSigmoid",
                         "HardSwish",
                         "Abs",
                         "Log",
                         "Reciprocal",
                         "Not",
                         "And",
                         "Or",
                         "Less",
                         "Greater",
                         "Sum",
                         "Max",
                         "Min",
                         "Mean",
                         "Einsum",
                         "Dropout",
                         "TopK",
                         "CumSum",
                         "Elu",
                         "Selu",
                         "Celu",
                         "Softplus",
                         "Softsign",
                         "ThresholdedRelu",
                         "PRelu",
                         "Mish",
                         "LogSoftmax",
                         "Hardmax",
                         "DepthToSpace",
                         "SpaceToDepth",
                         "GatherElements",
                         "GatherND",
                         "ScatterElements",
                         "ScatterND",
                         "OneHot",
                         "NonZero",
                         "Compress"})
    EXPECT_TRUE(has_rule("", op)) << op;
}

// Rules added with the ONNX backend conformance work (core/rules/misc_ops.cc, PRelu's per-channel slope).
TEST(RulesMisc, ConformanceOps) {
  GB b;
  int x = b.input("x", {2, 3, 4, 5});
  EXPECT_EQ(b.rule(b.node("Trilu", {x}, {2, 3, 4, 5})).str(),
            "([i,j,k,l])->([i,j,k,l]) {i=2, j=3, k=4, l=5} need_replication={k,l}");
  int m = b.input("m", {2, 4, 4});
  EXPECT_EQ(b.rule(b.node("Det", {m}, {2})).str(), "([i,j,k])->([i]) {i=2, j=4, k=4} need_replication={j,k}");
  // PRelu: a [C] slope that cannot broadcast numpy-style is per channel (dim 1), as the kernel reads it.
  int slope = b.input("slope", {3});
  EXPECT_EQ(b.rule(b.node("PRelu", {x, slope}, {2, 3, 4, 5})).str(),
            "([i,j,k,l],[j])->([i,j,k,l]) {i=2, j=3, k=4, l=5}");
  // Losses: "none" keeps N and the trailing dims pass-through; "mean" without weights is a mean reduction; a
  // weighted mean needs replication.
  int scores = b.input("scores", {4, 3, 5}), labels = b.input("labels", {4, 5}, DType::kInt64);
  EXPECT_EQ(
      b.rule(b.node("NegativeLogLikelihoodLoss", {scores, labels}, {4, 5}, {{"reduction", std::string("none")}})).str(),
      "([i,j,k],[i,k])->([i,k]) {i=4, j=3, k=5} need_replication={j}");
  EXPECT_EQ(b.rule(b.node("NegativeLogLikelihoodLoss", {scores, labels}, {})).str(),
            "([i,j,k],[i,k])->([]) {i=4, j=3, k=5} reduction={i,k} need_replication={j} mean");
  int w = b.input("w", {3});
  EXPECT_EQ(b.rule(b.node("NegativeLogLikelihoodLoss", {scores, labels, w}, {})).str(),
            "([i,j,k],[i,k],[1])->([]) {i=4, j=3, k=5} need_replication={i,j,k}");
  // LSTM: only the batch dim is pass-through.
  int xs = b.input("xs", {7, 2, 3}), W = b.input("W", {1, 16, 3}), R = b.input("R", {1, 16, 4});
  EXPECT_EQ(b.rule(b.node("LSTM", {xs, W, R}, {7, 1, 2, 4}, {{"hidden_size", int64_t{4}}})).str(),
            "([i,j,k],[1,1,1],[1,1,1])->([i,l,j,m]) {i=7, j=2, k=3, l=1, m=4} need_replication={i,k,l,m}");
  int grid = b.input("grid", {2, 6, 7, 2});
  EXPECT_EQ(b.rule(b.node("GridSample", {x, grid}, {2, 3, 6, 7})).str(),
            "([i,j,k,l],[i,m,n,1])->([i,j,m,n]) {i=2, j=3, k=4, l=5, m=6, n=7} need_replication={k,l}");
}

}  // namespace
}  // namespace gspmd
