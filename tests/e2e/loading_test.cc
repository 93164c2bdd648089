// Loading through the real CLI: symbolic dims bound by --inputs, --dim that contradicts them, explain's loading
// section (docs/loading.md).
#include <gtest/gtest.h>

#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

const std::string kMlp = "testdata/frontend/mlp.onnx";  // x[batch, 8] -> MatMul -> Relu -> MatMul -> y[batch, 8]

fs::path mlp_inputs(const std::string& tag, int64_t batch) {
  fs::path dir = scratch(tag);
  gspmd::Tensor x(gspmd::DType::kFloat32, {batch, 8});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 5) - 2.f;
  gspmd::write_tensor_pb((dir / "input_0.pb").string(), x, "x");
  return dir;
}

TEST(Loading, InputsBindSymbolicDimsWithoutDim) {
  const fs::path in = mlp_inputs("loading_inputs", 3);
  CmdResult r =
      cli("run " + kMlp + " --mesh 2 --inputs " + in.string() + " --check --report " + (in / "report.json").string(),
          "loading_inputs");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
}

TEST(Loading, DimContradictingInputsIsOneLineError) {
  const fs::path in = mlp_inputs("loading_dim_mismatch", 3);
  CmdResult r = cli("run " + kMlp + " --mesh 2 --dim batch=4 --inputs " + in.string(), "loading_dim_mismatch");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + kMlp + ": --dim batch=4 but the given input 'x' has 3 at dim 0\n");
}

TEST(Loading, ExplainListsFoldedAndRewrittenNodes) {
  CmdResult r = cli("explain testdata/frontend/class_token.onnx --mesh 1 --dim batch=2", "loading_explain");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("loading: 9 nodes folded into constants (203 bytes), 0 rewritten, 0 constant nodes kept, 0 "
                       "shape disagreements\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  folded    node 'expand' (Expand) -> cls_b (64 bytes)\n"), std::string::npos) << r.out;
  CmdResult v =
      cli("explain testdata/frontend/class_token.onnx --mesh 1 --dim batch=2 --value cls_b", "loading_explain_value");
  ASSERT_EQ(v.code, 0) << v.err;
  EXPECT_NE(v.out.find("  folded    at load: node 'expand' (Expand) evaluated once on constants\n"), std::string::npos)
      << v.out;
}

}  // namespace
