// Symbolic dims through the CLI (docs/shapes.md): `partition` of a model with dynamic axes needs no --dim, says at
// which sizes it costed, and its device files run at other sizes with `run --program` on the emulator; --dim still
// specialises; simulate, which needs sizes, asks for them.
#include <fstream>
#include <map>
#include <tuple>

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
                       "past=23, seq=19 (--hint N=V to plan at others, --dim N=V to bind)\n"),
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

// --collectives ort writes ONNX Runtime's collectives over the symbols too: dp2tp2's all-reduces over `model` (two
// devices of four) become an AllGather of every device's value and a sum over the group's rows, their shapes dims
// over the symbols (tests/e2e/device_files_test.cc runs them); with --dim the files are static.
TEST(SymbolicCli, OrtCollectivesKeepTheSymbols) {
  const fs::path d = scratch("symbolic_ort");
  CmdResult r = cli("partition " + kLlama + kTp2 + " --collectives ort -o " + (d / "tp2").string(), "symbolic_ort_tp2");
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string dp2tp2 = " --mesh 2x2 --shardings testdata/llama/dp2tp2.plan.json --collectives ort -o ";
  r = cli("partition " + kLlama + dp2tp2 + (d / "dp2tp2").string(), "symbolic_ort_dp2tp2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(read_json(d / "dp2tp2" / "report.json").contains("dim_hints"));
  r = cli("partition " + kLlama + " --dim batch=2 --dim seq=5 --dim past=3" + dp2tp2 + (d / "fixed").string(),
          "symbolic_ort_fixed");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(read_json(d / "fixed" / "report.json").contains("dim_hints"));
}

// testdata/frontend/<name>.onnx partitioned without --dim by <name>/<plan>.plan.json over 2 devices; its device files
// run test_data_set_0 (other sizes than the hints) and must give its expected outputs.
void expect_files_run_test_data(const std::string& name, const std::string& plan) {
  const fs::path d = scratch("symbolic_" + name) / plan;
  const std::string dir = "testdata/frontend/" + name + "/";
  const std::string model = "testdata/frontend/" + name + ".onnx --mesh 2 --shardings " + dir + plan + ".plan.json";
  CmdResult r = cli("partition " + model + " -o " + d.string(), "symbolic_" + name);
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli("run " + model + " --program " + d.string() + " --inputs " + dir + "test_data_set_0 --expected " + dir +
              "test_data_set_0",
          "symbolic_" + name + "_run");
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("expected  passed"), std::string::npos) << r.out;
}

// A mean over a split symbolic dim: partitioned without --dim (n's hint is 17), the device files scale each device's
// mean by ceil(n / 2) / n computed from the run's n, and run exact at n = 5 (uneven over 2).
TEST(SymbolicCli, AMeanOverASplitSymbolicDimRunsAtOtherSizes) { expect_files_run_test_data("mean_rows", "rows2"); }

// LayerNormalization over a split symbolic dim: the columns n over 2 (n's hint is 17); each device's statistics are
// divided by n computed from the run's n, and the device files run exact at n = 5 (uneven over 2).
TEST(SymbolicCli, ALayerNormOverASplitSymbolicDimRunsAtOtherSizes) {
  expect_files_run_test_data("layer_norm_cols", "cols2");
}

// A vocab-parallel lookup of a symbolic table: the rows over 2 (vocab's hint is 17); each device's offset, shard size
// and the id range check are computed from the run's vocabulary, and the files run exact at vocab = 5 (uneven over
// 2) with a negative id. An id past the table is the unpartitioned run's own line.
TEST(SymbolicCli, AVocabParallelLookupOfASymbolicTableRunsAtOtherSizes) {
  expect_files_run_test_data("lookup_vocab", "vocab2");
  const std::string dir = "testdata/frontend/lookup_vocab/";
  CmdResult r =
      cli("run testdata/frontend/lookup_vocab.onnx --mesh 2 --shardings " + dir + "vocab2.plan.json --program " +
              (fs::path(GSPMD_BINARY_DIR) / "e2e-scratch" / "symbolic_lookup_vocab" / "vocab2").string() +
              " --inputs " + dir + "test_data_set_1",
          "symbolic_lookup_vocab_range");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + dir +
                       "test_data_set_1/input_1.pb: input 'ids' holds index 5 (element 1), out of range for Gather "
                       "'lookup' (axis 0 of size 5)\n");
}

// Halo windows over symbolic image dims: a CNN exported with dynamic height and width (testdata/cnn/dyn_cnn: a
// ResNet-style stem, a stride-2 conv, a dilated conv, an average pool) partitioned by rows over 2, and by rows and
// columns over 2x2, without --dim. Every windowed op exchanges halos (two collective-permutes per split dim); the
// files serve every size from the smallest whose shards are as wide as the halos, and run exact against torch at
// other sizes than the hints, on the emulator. A smaller image is refused in one line; `run` without --program
// partitions for its size and is exact.
TEST(SymbolicCli, HaloWindowsOverSymbolicImageDimsRunAtOtherSizes) {
  const std::string dir = "testdata/cnn/dyn_cnn/";
  for (const auto& [plan, mesh, least] :
       {std::tuple<std::string, std::string, std::string>{"rows2", "2", "height >= 17"},
        {"rows2cols2", "2x2", "height >= 17, width >= 17"}}) {
    const fs::path d = scratch("symbolic_halo") / plan;
    const std::string model =
        "testdata/cnn/dyn_cnn/model.onnx --mesh " + mesh + " --shardings " + dir + plan + ".plan.json";
    CmdResult r = cli("partition " + model + " -o " + d.string(), "symbolic_halo_" + plan);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("dims      the device files serve " + least +
                         " (halo windows need shards as wide as their halos)\n"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("gathered instead"), std::string::npos) << r.out;
    const nlohmann::json report = read_json(d / "report.json");
    std::map<std::string, int> kinds;
    for (const auto& c : report["collectives"]) ++kinds[c["kind"].get<std::string>()];
    // 6 windowed ops, each split on 1 or 2 dims, each dim a halo from both sides; the head's mean all-reduced
    const int split_dims = plan == "rows2" ? 1 : 2;
    EXPECT_EQ(kinds, (std::map<std::string, int>{{"collective-permute", 12 * split_dims}, {"all-reduce", 1}}));
    for (const char* set : {"test_data_set_0", "test_data_set_1"}) {
      r = cli("run " + model + " --program " + d.string() + " --inputs " + dir + set + " --expected " + dir + set,
              "symbolic_halo_run_" + plan);
      EXPECT_EQ(r.code, 0) << r.err << r.out;
      EXPECT_NE(r.out.find("expected  passed"), std::string::npos) << plan << " " << set << "\n" << r.out;
    }
    r = cli("run " + model + " --program " + d.string() + " --inputs " + dir + "test_data_set_2",
            "symbolic_halo_small_" + plan);
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "error: " + (d / "device_0.onnx").string() +
                         ": the device files serve height >= 17 (halo windows need shards as wide as their halos), "
                         "and this run's height is 9: run without --program, or partition with --dim\n");
  }
  CmdResult r = cli("run testdata/cnn/dyn_cnn/model.onnx --mesh 2 --shardings " + dir + "rows2.plan.json --inputs " +
                        dir + "test_data_set_2 --expected " + dir + "test_data_set_2",
                    "symbolic_halo_small_static");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("expected  passed"), std::string::npos) << r.out;
}

// --hint plans at a realistic size without binding it: the image rows over 4 at the hint 19 are shards too narrow for
// five of the six windowed layers' halos, gathered with a warning; at --hint height=45 two are, the files serve
// height >= 33, and `run --program` (which partitions again at the files' hints to check them) runs them exact at
// 45x38; a --hint that names no symbol kept, or a bound one, is one line.
TEST(SymbolicCli, AHintPlansAtARealisticSizeWithoutBindingIt) {
  const fs::path d = scratch("symbolic_hint");
  fs::create_directories(d);
  {
    std::ofstream(d / "rows4.plan.json")
        << R"({"mesh": {"shape": [4], "axes": ["rows"]}, "tensors": {"image": [null, null, "rows", null]}})";
  }
  const std::string dir = "testdata/cnn/dyn_cnn/";
  const std::string model = dir + "model.onnx --mesh 4 --shardings " + (d / "rows4.plan.json").string();
  auto gathered = [](const std::string& out) {
    int n = 0;
    for (size_t at = out.find("gathered instead"); at != std::string::npos; at = out.find("gathered instead", at + 1))
      ++n;
    return n;
  };
  CmdResult r = cli("partition " + model + " -o " + (d / "primes").string(), "symbolic_hint_primes");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(gathered(r.out), 5) << r.out;
  r = cli("partition " + model + " --hint height=45 -o " + (d / "h45").string(), "symbolic_hint_45");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(gathered(r.out), 2) << r.out;
  EXPECT_NE(r.out.find("the hints batch=17, height=45, width=47 (--hint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dims      the device files serve height >= 33 "), std::string::npos) << r.out;
  const nlohmann::json report = read_json(d / "h45" / "report.json");
  std::map<std::string, int> kinds;
  for (const auto& c : report["collectives"]) ++kinds[c["kind"].get<std::string>()];
  EXPECT_EQ(kinds, (std::map<std::string, int>{{"collective-permute", 8}, {"all-gather", 2}, {"all-reduce", 1}}));
  r = cli("run " + model + " --program " + (d / "h45").string() + " --inputs " + dir + "test_data_set_0 --expected " +
              dir + "test_data_set_0",
          "symbolic_hint_run");
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("expected  passed"), std::string::npos) << r.out;
  r = cli("partition " + model + " --hint hieght=45 -o " + (d / "bad").string(), "symbolic_hint_unknown");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + dir +
                       "model.onnx: --hint hieght=45: the model's inputs have no dim named 'hieght' (their symbolic "
                       "dims: batch, height, width)\n");
  r = cli("partition " + model + " --hint height=45 --dim height=45 -o " + (d / "bad").string(), "symbolic_hint_bound");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + dir +
                       "model.onnx: --hint height=45: 'height' is bound by --dim or --inputs, so it has "
                       "no hint\n");
  EXPECT_FALSE(fs::exists(d / "bad"));
}

// SAME padding of a stride-2 dim changes with the size's parity, so a symbolic one is refused in one line whether the
// dim is split (cols2: the halo window) or held whole beside a split one (rows2: the local Conv's pads), and no
// output is left.
TEST(SymbolicCli, SamePaddingThatChangesWithTheSizeIsRefused) {
  for (const char* plan : {"rows2", "cols2"}) {
    const fs::path d = scratch("symbolic_same") / plan;
    CmdResult r = cli(std::string("partition testdata/frontend/same_stride2.onnx --mesh 2 --shardings "
                                  "testdata/frontend/same_stride2/") +
                          plan + ".plan.json -o " + d.string(),
                      std::string("symbolic_same_") + plan);
    EXPECT_EQ(r.code, 3);
    EXPECT_EQ(r.err,
              "error: unsupported: conv (Conv): its SAME padding of the symbolic dim 3 (w) of 'x' changes with the "
              "size: bind it with --dim\n");
    EXPECT_FALSE(fs::exists(d));
  }
}

}  // namespace
