// float16 and bfloat16 models end to end: load, Megatron partition over 2 devices, run, --check against the
// unpartitioned run; the collectives move 2 bytes per element; the outputs keep the model's dtype.
#include <gtest/gtest.h>

#include <fstream>

#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

class HalfPrecision : public ::testing::TestWithParam<std::string> {};

TEST_P(HalfPrecision, MegatronRunMatchesUnpartitioned) {
  const std::string dtype = GetParam();
  const fs::path dir = scratch("half_" + dtype);
  CmdResult r = cli("run testdata/frontend/mlp_" + dtype +
                        ".onnx --mesh 2 --shardings "
                        "testdata/frontend/half_mlp.sharding.json --check --report " +
                        (dir / "report.json").string() + " --outputs " + (dir / "out").string(),
                    "half_" + dtype);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  const nlohmann::json rep = read_json(dir / "report.json");
  // The LayerNorm reads the model-split hidden dim whole: all-gather of r[4,16]; the second matmul's partial sums
  // o[4,6] are all-reduced: 2 bytes per element.
  ASSERT_EQ(rep["collectives"].size(), 2u) << rep["collectives"].dump();
  EXPECT_EQ(count_collectives(rep, "all-gather"), 1);
  EXPECT_EQ(count_collectives(rep, "all-reduce"), 1);
  for (const auto& c : rep["collectives"])
    EXPECT_EQ(c["bytes"].get<int64_t>(), c["kind"] == "all-gather" ? 4 * 16 * 2 : 4 * 6 * 2) << c.dump();
  const gspmd::Tensor y = gspmd::read_tensor_pb((dir / "out" / "output_0.pb").string());
  EXPECT_EQ(gspmd::dtype_name(y.dtype), dtype);
  EXPECT_EQ(y.shape, (gspmd::Shape{4, 6}));
}

// A 16-bit training step over 3 devices with the LayerNorm's input split over its hidden dim (16 = 6 + 6 + 4): the
// backward's means over that dim are rescaled by 6/16, in float32 (not a power of two: rounded in the 16-bit type,
// the scale would be off by up to half a unit), and the padding of the last shard is masked in the 16-bit type.
// Both were refused ("mean of bfloat16 over a split dim", "MaskPad of bfloat16 is not supported by the pod").
TEST_P(HalfPrecision, TrainingStepOverAnUnevenSplitHiddenDim) {
  const std::string dtype = GetParam();
  const fs::path dir = scratch("half_train_" + dtype);
  const fs::path plan = dir / "plan.json";
  std::ofstream(plan) << (R"({"mesh": {"shape": [3], "axes": ["model"]},
                       "tensors": {"w1": [null, "model"], "w2": ["model", null], "r": [null, "model"]}})");
  CmdResult r = cli("run testdata/frontend/mlp_" + dtype + ".onnx --mesh 3 --shardings " + plan.string() +
                        " --training --loss mean --check",
                    "half_train_" + dtype);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Cli, HalfPrecision, ::testing::Values("float16", "bfloat16"));

}  // namespace
