// End-to-end on the bundled GPT-style models: every (model, sharding file, mesh) partitions, runs on the emulated
// pod and equals the unpartitioned run; the Megatron plan has exactly the collectives Megatron-LM has.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

constexpr int kLayers = 2;  // testdata/gpt: 2 transformer blocks

struct Case {
  std::string model;  // gpt_opset13 | gpt_opset17
  std::string mesh;
  std::string sharding;  // "" = none
  std::string name() const {
    std::string s = model + "_" + mesh + "_" + (sharding.empty() ? "none" : sharding);
    for (char& c : s)
      if (!isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
  }
  std::string args() const {
    std::string a = "testdata/gpt/" + model + ".onnx --mesh " + mesh;
    if (!sharding.empty()) a += " --shardings testdata/gpt/gpt." + sharding + ".sharding.json";
    return a;
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

/// Max |a-b| <= atol + rtol*|b| over all elements.
void expect_close(const gspmd::Tensor& a, const gspmd::Tensor& b, double rtol, double atol) {
  ASSERT_EQ(a.shape, b.shape);
  ASSERT_EQ(a.dtype, gspmd::DType::kFloat32);
  ASSERT_EQ(b.dtype, gspmd::DType::kFloat32);
  int bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.data<float>()[i], y = b.data<float>()[i];
    double err = std::fabs(x - y);
    if (!(err <= atol + rtol * std::fabs(y))) ++bad;
    worst = std::max(worst, err);
  }
  EXPECT_EQ(bad, 0) << "worst abs error " << worst;
}

class GptEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(GptEquivalence, RunCheckPassesAndMatchesExporterOutputs) {
  const Case& c = GetParam();
  fs::path dir = scratch("gpt_" + c.name());
  const auto [r, rep] = cli_report(
      "run " + c.args() + " --inputs testdata/gpt/test_data_set_0 --check --outputs " + (dir / "out").string(), dir,
      c.name());
  ASSERT_FALSE(rep.is_null());
  EXPECT_TRUE(rep["check"]["passed"].get<bool>());
  EXPECT_LT(rep["check"]["max_rel_error"].get<double>(), 1e-4);
  EXPECT_EQ(rep["devices"].get<int>(), c.mesh == "1" ? 1 : c.mesh == "2x2" ? 4 : 16);
  EXPECT_GT(rep["simulated"]["step_time_s"].get<double>(), 0);
  EXPECT_GT(rep["simulated"]["flops_utilization"].get<double>(), 0);
  EXPECT_LE(rep["simulated"]["flops_utilization"].get<double>(), 1);
  // The partitioned outputs equal the exporter's (torch's) own outputs.
  gspmd::Tensor got = gspmd::read_tensor_pb((dir / "out" / "output_0.pb").string());
  gspmd::Tensor want =
      gspmd::read_tensor_pb(std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/test_data_set_0/output_0.pb");
  expect_close(got, want, 1e-4, 1e-5);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  // gpt_opset13_nofold: exported without torch's constant folding, so the loader folds the mask/shape chains.
  for (std::string m : {"gpt_opset13", "gpt_opset17", "gpt_opset13_nofold"}) {
    v.push_back({m, "1", ""});
    v.push_back({m, "2x2", "dp"});
    v.push_back({m, "2x2", "megatron"});
    v.push_back({m, "4x4", "2d"});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Gpt, GptEquivalence, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

/// Devices running concurrently (GSPMD_DEVICE_THREADS=4; the suite's OMP_NUM_THREADS=1 runs them one after another):
/// the 2D plan on 4x4 (stacked products, fused epilogues, collectives of several replica groups) still equals torch.
TEST(GptDevicesInParallel, TwoDimensionalPlanMatchesExporterOutputs) {
  const Case c{"gpt_opset17", "4x4", "2d"};
  fs::path dir = scratch("gpt_parallel");
  CmdResult r = sh("GSPMD_DEVICE_THREADS=4 " + std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx run " + c.args() +
                       " --inputs testdata/gpt/test_data_set_0 --check --outputs " + (dir / "out").string(),
                   "gpt_parallel");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  expect_close(gspmd::read_tensor_pb((dir / "out" / "output_0.pb").string()),
               gspmd::read_tensor_pb(std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/test_data_set_0/output_0.pb"), 1e-4,
               1e-5);
}

nlohmann::json partition_report(const Case& c, const fs::path& dir) {
  CmdResult r = cli("partition " + c.args() + " -o " + (dir / "out").string(), "partition_" + c.name());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return read_json(dir / "out" / "report.json");
}

TEST(GptCollectives, MegatronHasTwoAllReducesPerBlockPlusEmbedding) {
  for (auto [mesh, file, local_batch] : {std::tuple{"2x2", "megatron", 4}, std::tuple{"4x4", "2d", 2}}) {
    Case c{"gpt_opset17", mesh, file};
    auto rep = partition_report(c, scratch("megatron_" + c.name()));
    EXPECT_EQ(count_collectives(rep, "all-reduce"), 2 * kLayers + 1) << rep["collectives"].dump(1);
    EXPECT_EQ(count_collectives(rep, "all-gather"), 0) << rep["collectives"].dump(1);
    EXPECT_EQ(count_collectives(rep, "all-to-all"), 0);
    EXPECT_EQ(count_collectives(rep, "reduce-scatter"), 0);
    for (const auto& col : rep["collectives"]) {
      // Every all-reduce is of one [local batch, 64, 128] float32 activation over the model axis.
      EXPECT_EQ(col["bytes"].get<int64_t>(), int64_t{local_batch} * 64 * 128 * 4) << col.dump();
      EXPECT_EQ(col["axes"], nlohmann::json::array({"model"})) << col.dump();
    }
  }
}

TEST(GptCollectives, DataParallelHasNoCollective) {
  for (std::string m : {"gpt_opset13", "gpt_opset17"}) {
    auto rep = partition_report({m, "2x2", "dp"}, scratch("dp_" + m));
    EXPECT_EQ(rep["collectives"].size(), 0u) << rep["collectives"].dump(1);
    EXPECT_EQ(rep["warnings"].size(), 0u) << rep["warnings"].dump(1);
  }
}

TEST(GptPartition, WritesParsableDeviceFilesWithGspmdCollectives) {
  Case c{"gpt_opset13", "2x2", "megatron"};
  fs::path dir = scratch("devicefiles");
  CmdResult r = cli("partition " + c.args() + " -o " + (dir / "out").string(), "devicefiles");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(fs::exists(dir / "out" / ("device_" + std::to_string(k) + ".onnx")));
  EXPECT_FALSE(fs::exists(dir / "out" / "device_4.onnx"));
  // Parse every file with the onnx Python package (an independent reader) and count gspmd-domain nodes.
  CmdResult py = sh(debian_python() +
                        " -c \"import onnx,sys\n"
                        "for k in range(4):\n"
                        "    m = onnx.load(sys.argv[1] + '/device_%d.onnx' % k)\n"
                        "    doms = {o.domain: o.version for o in m.opset_import}\n"
                        "    assert doms.get('gspmd') == 1, doms\n"
                        "    n = [x for x in m.graph.node if x.domain == 'gspmd']\n"
                        "    print(len(n), sorted({x.op_type for x in n}))\n\" " +
                        (dir / "out").string(),
                    "devicefiles_py");
  ASSERT_EQ(py.code, 0) << py.err;
  EXPECT_EQ(py.out, "5 ['AllReduce']\n5 ['AllReduce']\n5 ['AllReduce']\n5 ['AllReduce']\n");
  // shardings.json feeds back as --shardings and gives the same program.
  fs::path dir2 = scratch("devicefiles_again");
  CmdResult r2 = cli("partition testdata/gpt/gpt_opset13.onnx --mesh 2x2 --shardings " +
                         (dir / "out" / "shardings.json").string() + " -o " + (dir2 / "out").string(),
                     "devicefiles_again");
  ASSERT_EQ(r2.code, 0) << r2.err;
  auto a = read_json(dir / "out" / "report.json");
  auto b = read_json(dir2 / "out" / "report.json");
  EXPECT_EQ(count_collectives(a, "all-reduce"), count_collectives(b, "all-reduce"));
}

TEST(GptPartition, OutputDirectoryIsNotHalfWritten) {
  fs::path dir = scratch("halfwritten");
  fs::create_directories(dir / "out");
  { std::ofstream(dir / "out" / "notes.txt") << "mine"; }
  CmdResult r =
      cli("partition testdata/gpt/gpt_opset13.onnx --mesh 2x2 --shardings testdata/gpt/gpt.dp.sharding.json -o " +
              (dir / "out").string(),
          "halfwritten");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + (dir / "out").string() +
                       ": exists and is not a gspmd-onnx output directory; not overwriting\n");
  EXPECT_TRUE(fs::exists(dir / "out" / "notes.txt"));
  EXPECT_FALSE(fs::exists(dir / "out" / "device_0.onnx"));
  // A failing run (bad sharding file) leaves no directory behind.
  CmdResult bad = cli(
      "partition testdata/gpt/gpt_opset13.onnx --mesh 2x2 --shardings /nonexistent.json -o " + (dir / "fresh").string(),
      "halfwritten_bad");
  EXPECT_EQ(bad.code, 2);
  EXPECT_FALSE(fs::exists(dir / "fresh"));
}

}  // namespace

namespace {

TEST(GptExplain, ShowsNotationsOriginPictureAndCollectiveReasons) {
  CmdResult r =
      cli("explain testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json "
          "--value h.0.mlp.fc_in.weight",
          "explain_fc_in");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(
      r.out.find("h.0.mlp.fc_in.weight float32 [128,512]\n"
                 "  sharding  [null, \"model\"]   hlo {devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}   "
                 "sbp (B, S(1))\n"
                 "  annotated [null, model] (testdata/gpt/gpt.megatron.sharding.json: "
                 "tensors.\"h.0.mlp.fc_in.weight\"): a constraint the program keeps\n"
                 "  origin    annotation h.0.mlp.fc_in.weight\n"
                 "  axes      model from annotation h.0.mlp.fc_in.weight (testdata/gpt/gpt.megatron.sharding.json: "
                 "tensors.\"h.0.mlp.fc_in.weight\")\n"
                 "┌─────┬─────┐\n"
                 "│ 0,2 │ 1,3 │\n"
                 "└─────┴─────┘\n"),
      std::string::npos)
      << r.out;
  CmdResult all =
      cli("explain testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json",
          "explain_all");
  ASSERT_EQ(all.code, 0) << all.err;
  // The attention output projection's partial sum is reduced where the replicated bias is added.
  EXPECT_NE(all.out.find("all-reduce over {model} of '/h.0/attn/proj/MatMul_output_0' (131072 bytes per device) for "
                         "/h.0/attn/proj/Add: '/h.0/attn/proj/MatMul_output_0' is unreduced over {model}; "
                         "/h.0/attn/proj/Add (Add) needs operand 0 as [\"data\", null, null]"),
            std::string::npos)
      << all.out;
}

// explain --value shows uneven shards as they are (issue 31): a batch of 8 over 3 devices is drawn as boxes of 3, 3
// and 2 rows (two lines, two, one), each device's index ranges are listed, and the footer counts the collectives it
// lists. Over 32 devices, 24 shards hold only padding and say so.
TEST(GptExplain, UnevenShardsAreDrawnInProportionWithTheirRanges) {
  const fs::path d = scratch("explain_uneven");
  std::ofstream(d / "d3.json")
      << R"({"mesh": {"shape": [3], "axes": ["data"]}, "tensors": {"input_ids": ["data", null]}})";
  CmdResult r =
      cli("explain " + kGpt + " --shardings " + (d / "d3.json").string() + " --value input_ids", "explain_uneven_3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("┌───┐\n"
                       "│ 0 │\n"
                       "│   │\n"
                       "├───┤\n"
                       "│ 1 │\n"
                       "│   │\n"
                       "├───┤\n"
                       "│ 2 │\n"
                       "└───┘\n"
                       "  shards    (index ranges, as DTensor's visualize_sharding lists them)\n"
                       "    [0:3, :]                 device 0\n"
                       "    [3:6, :]                 device 1\n"
                       "    [6:8, :]                 device 2\n"
                       "\n0 of the program's 0 collectives move 'input_ids'\n"),
            std::string::npos)
      << r.out;
  std::ofstream(d / "d32.json")
      << R"({"mesh": {"shape": [32], "axes": ["data"]}, "tensors": {"input_ids": ["data", null]}})";
  r = cli("explain " + kGpt + " --shardings " + (d / "d32.json").string() + " --value input_ids", "explain_uneven_32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("    [7:8, :]                 device 7\n"
                       "    [8:8, :] (padding only)  devices 8,9,10,11,..(+20)\n"),
            std::string::npos)
      << r.out;
  // The footer counts what it lists: the program's collectives that move the value.
  r = cli("explain " + kGpt + " --mesh 2x2 " + kMegatron + " --value /h.0/attn/proj/MatMul_output_0",
          "explain_uneven_footer");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\n1 of the program's 5 collectives move '/h.0/attn/proj/MatMul_output_0'\n  all-reduce over "
                       "{model} of '/h.0/attn/proj/MatMul_output_0'"),
            std::string::npos)
      << r.out;
}

}  // namespace
