// Partitioning Softmax, LogSoftmax and LayerNormalization over a split normalized dim (the split-reduction handler,
// core/partition/split_reduction.cc).
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Softmax, LayerNorm, reductions

TEST(OpsPartition, SoftmaxAndLayerNorm) {
  std::vector<Case> cs;
  for (int64_t axis : {-1, 1}) {
    Builder B("Softmax axis " + std::to_string(axis));
    int X = B.fin("X", {3, 5, 7});
    B.out(B.opf("Softmax", {X}, "Y", {3, 5, 7}, {{"axis", axis}}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Softmax opset 13 axis 0 [5,7]", 13);
    int X = B.fin("X", {5, 7});
    B.out(B.opf("Softmax", {X}, "Y", {5, 7}, {{"axis", int64_t{0}}}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("LayerNormalization axis -1 scale/bias inputs");
    int X = B.fin("X", {3, 5, 7});
    int S = B.fin("scale", {7});
    int Bi = B.fin("bias", {7});
    B.out(B.opf("LayerNormalization", {X, S, Bi}, "Y", {3, 5, 7}, {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("LayerNormalization axis 1 scale/bias [5,7] weights");
    int X = B.fin("X", {3, 5, 7});
    int S = B.weight("scale", {5, 7});
    int Bi = B.weight("bias", {5, 7});
    B.out(B.opf("LayerNormalization", {X, S, Bi}, "Y", {3, 5, 7}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  {
    // Two normalized dims and all three outputs: Mean and InvStdDev are [3,1,1] and keep dim 0's split.
    Builder B("LayerNormalization axis 1 with Mean and InvStdDev outputs");
    int X = B.fin("X", {3, 5, 7});
    auto outs = B.op("LayerNormalization", {X, B.weight("scale", {5, 7}), B.weight("bias", {5, 7})},
                     {{"Y", DType::kFloat32, {3, 5, 7}},
                      {"Mean", DType::kFloat32, {3, 1, 1}},
                      {"InvStdDev", DType::kFloat32, {3, 1, 1}}},
                     {{"axis", int64_t{1}}});
    B.out(outs[0], true);
    B.out(outs[1]);
    B.out(outs[2]);
    cs.push_back(B.done(80));
  }
  {
    Builder B("LayerNormalization axis -1 no bias, 2-D [9,6]");
    int X = B.fin("X", {9, 6});
    int S = B.weight("scale", {6}, false);
    B.out(B.opf("LayerNormalization", {X, S}, "Y", {9, 6}), true);
    cs.push_back(B.done());
  }
  {
    // The opset-13 export of LayerNorm: ReduceMean(axes attr) ... Sqrt, Div, Mul, Add.
    Builder B("LayerNorm decomposition opset 13", 13);
    int X = B.fin("X", {3, 5, 7});
    int mean =
        B.opf("ReduceMean", {X}, "mean", {3, 5, 1}, {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}});
    int d = B.opf("Sub", {X, mean}, "d", {3, 5, 7});
    int sq = B.opf("Pow", {d, B.scalar("two", 2.f)}, "sq", {3, 5, 7});
    int var =
        B.opf("ReduceMean", {sq}, "var", {3, 5, 1}, {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}});
    int ve = B.opf("Add", {var, B.scalar("eps", 1e-5f)}, "ve", {3, 5, 1});
    int sd = B.opf("Sqrt", {ve}, "sd", {3, 5, 1});
    int n = B.opf("Div", {d, sd}, "n", {3, 5, 7});
    int m = B.opf("Mul", {n, B.weight("gamma", {7})}, "m", {3, 5, 7});
    B.out(B.opf("Add", {m, B.weight("beta", {7})}, "Y", {3, 5, 7}), true);
    cs.push_back(B.done());
  }
  run_all("Softmax/LayerNormalization", cs);
}

}  // namespace
}  // namespace gspmd::ops_partition
