// Symbolic dims through the CLI (docs/shapes.md): `partition` of a model with dynamic axes needs no --dim, says at
// which sizes it costed, and its device files run at other sizes with `run --program` on the emulator; --dim still
// specialises; simulate, which needs sizes, asks for them.
#include <gtest/gtest.h>

#include "e2e_util.h"

using namespace e2e;

namespace {

const std::string kLlama = "testdata/llama/model.onnx";
const std::string kTp2 = " --mesh 2 --shardings testdata/llama/tp2.plan.json";

TEST(SymbolicCli, PartitionWithoutDimKeepsTheSymbolsAndTheFilesRunAtOtherSizes) {
  const fs::path d = scratch("symbolic_cli");
  CmdResult r = cli("partition " + kLlama + kTp2 + " -o " + (d / "tp2").string(), "symbolic_partition");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("dims      symbolic, kept in the device files; sizes and times below at the hints batch=17, "
                       "past=23, seq=19 (--dim N=V for others)\n"),
            std::string::npos)
      << r.out;
  const nlohmann::json report = read_json(d / "tp2" / "report.json");
  EXPECT_EQ(report["dim_hints"], (nlohmann::json{{"batch", 17}, {"past", 23}, {"seq", 19}}));
  // the test data is batch 2, seq 5, past 3: not the hints
  r = cli("run " + kLlama + kTp2 + " --program " + (d / "tp2").string() +
              " --inputs testdata/llama/test_data_set_0 --expected testdata/llama/test_data_set_0 --check",
          "symbolic_run_program");
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  // --dim specialises: the files hold that size, and no dims line
  r = cli("partition " + kLlama + kTp2 + " --dim batch=2 --dim seq=5 --dim past=3 -o " + (d / "fixed").string(),
          "symbolic_partition_dim");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("dims      "), std::string::npos) << r.out;
  EXPECT_FALSE(read_json(d / "fixed" / "report.json").contains("dim_hints"));
}

TEST(SymbolicCli, SimulateNeedsSizes) {
  CmdResult r = cli("simulate " + kLlama + kTp2, "symbolic_simulate");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + kLlama + ": input 'input_ids' dim 0 'batch' is symbolic: bind it with --dim batch=N\n");
}

// --collectives ort writes ONNX Runtime's collectives. Its own AllReduce (a float sum over all devices) keeps the
// symbols; the other lowerings write static shapes, so over the symbols they are one line naming the collective and
// the dims, exit 2, with no output folder; with --dim they write the files.
TEST(SymbolicCli, OrtCollectivesKeepTheSymbolsOrSaySo) {
  const fs::path d = scratch("symbolic_ort");
  CmdResult r = cli("partition " + kLlama + kTp2 + " --collectives ort -o " + (d / "tp2").string(), "symbolic_ort_tp2");
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string dp2tp2 = " --mesh 2x2 --shardings testdata/llama/dp2tp2.plan.json --collectives ort -o ";
  r = cli("partition " + kLlama + dp2tp2 + (d / "dp2tp2").string(), "symbolic_ort_dp2tp2");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: --collectives ort: node '/layers.0/self_attn/o_proj/MatMul_output_0/AllReduce_2' (AllReduce): "
            "'/layers.0/self_attn/o_proj/MatMul_output_0' has the dims [ceil(batch / 2), seq, 64], and this "
            "collective's lowering onto ONNX Runtime's writes static shapes: bind the symbols with --dim, or keep "
            "--collectives gspmd\n");
  EXPECT_FALSE(fs::exists(d / "dp2tp2"));
  r = cli("partition " + kLlama + " --dim batch=2 --dim seq=5 --dim past=3" + dp2tp2 + (d / "fixed").string(),
          "symbolic_ort_fixed");
  EXPECT_EQ(r.code, 0) << r.err;
}

// A mean over a split symbolic dim: partitioned without --dim (n's hint is 17), the device files scale each device's
// mean by ceil(n / 2) / n computed from the run's n, and run exact at n = 5 (uneven over 2).
TEST(SymbolicCli, AMeanOverASplitSymbolicDimRunsAtOtherSizes) {
  const fs::path d = scratch("symbolic_mean") / "rows2";
  const std::string dir = "testdata/frontend/mean_rows/";
  const std::string plan = " --mesh 2 --shardings " + dir + "rows2.plan.json";
  CmdResult r = cli("partition testdata/frontend/mean_rows.onnx" + plan + " -o " + d.string(), "symbolic_mean");
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli("run testdata/frontend/mean_rows.onnx" + plan + " --program " + d.string() + " --inputs " + dir +
              "test_data_set_0 --expected " + dir + "test_data_set_0",
          "symbolic_mean_run");
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("expected  passed"), std::string::npos) << r.out;
}

}  // namespace
