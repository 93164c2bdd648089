// partition --notation spec|hlo|sbp round-trips through the CLI, and a mesh's device order ("devices") runs exactly
// and moves every device's slices and replica groups (docs/sharding-file.md).
#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <sstream>
#include <tuple>

#include "e2e_util.h"

using namespace e2e;

namespace {

/// `partition MODEL --mesh MESH --shardings FILE --notation N -o DIR`; returns DIR/shardings.json's text.
std::string partition(const std::string& model, const std::string& mesh, const std::string& file,
                      const std::string& notation, const fs::path& dir, const std::string& tag) {
  CmdResult r = cli("partition " + model + " --mesh " + mesh + " --shardings " + file + " --notation " + notation +
                        " -o " + dir.string(),
                    tag);
  EXPECT_EQ(r.code, 0) << r.err;
  return read_file(dir / "shardings.json");
}

/// Counts the entries of a written sharding file in each notation: {spec, hlo, sbp}.
std::array<int, 3> notation_counts(const std::string& text) {
  std::array<int, 3> n{0, 0, 0};
  const nlohmann::json file = nlohmann::json::parse(text);
  for (const auto& e : file["tensors"])
    ++n[e.is_object() && e.contains("hlo") ? 1 : e.is_object() && e.contains("sbp") ? 2 : 0];
  return n;
}

struct Plan {
  std::string name, mesh, file;
};

// The plan written in HLO and in SBP, fed back as --shardings, gives the same shardings.json as the plan written as
// partition specs: the GPT Megatron plan (unreduced values) on 2x2, the 2D plan on 4x4, and a Megatron plan on 2x4
// with a permuted device order and dims split over two axes (data and the sub-axis model:(1)2 split the batch;
// model and data, model major, split a weight: SBP writes those as specs).
TEST(Notations, EveryNotationGivesTheSamePlan) {
  const fs::path d = scratch("notations");
  {
    nlohmann::json plan = read_json(std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/gpt.megatron.sharding.json");
    plan["mesh"] = {{"shape", {2, 4}}, {"axes", {"data", "model"}}, {"devices", {5, 2, 7, 0, 3, 6, 1, 4}}};
    plan["tensors"]["input_ids"] = {{"data", "model:(1)2"}, nullptr};
    plan["tensors"]["wte.weight"] = {{"model", "data"}, nullptr};  // model major: no SBP form
    std::ofstream(d / "ordered.sharding.json") << plan.dump(1);
  }
  const std::vector<Plan> plans = {{"megatron", "2x2", "testdata/gpt/gpt.megatron.sharding.json"},
                                   {"2d", "4x4", "testdata/gpt/gpt.2d.sharding.json"},
                                   {"ordered", "2x4", (d / "ordered.sharding.json").string()}};
  for (const Plan& p : plans) {
    const std::string spec = partition(kGpt, p.mesh, p.file, "spec", d / (p.name + "_spec"), p.name + "_spec");
    EXPECT_EQ(notation_counts(spec)[0], static_cast<int>(nlohmann::json::parse(spec)["tensors"].size()));
    for (const std::string notation : {"hlo", "sbp"}) {
      const std::string tag = p.name + "_" + notation;
      const std::string written = partition(kGpt, p.mesh, p.file, notation, d / tag, tag);
      const std::array<int, 3> n = notation_counts(written);
      const int total = n[0] + n[1] + n[2];
      if (notation == "hlo") {
        EXPECT_EQ(n[1], total) << tag;  // HLO writes every sharding
      } else if (p.name != "ordered") {
        EXPECT_EQ(n[2], total) << tag;
      } else {  // values split over model:(1)2 or over [model, data] are written as specs
        EXPECT_GT(n[0], 0) << tag;
        EXPECT_GT(n[2], 0) << tag;
      }
      const std::string again =
          partition(kGpt, p.mesh, (d / tag / "shardings.json").string(), "spec", d / (tag + "_again"), tag + "_again");
      EXPECT_EQ(again, spec) << tag;
    }
  }
  // what the files hold
  const std::string hlo = read_file(d / "megatron_hlo" / "shardings.json");
  EXPECT_NE(hlo.find(R"("h.0.mlp.fc_in.weight": {"hlo":"{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}"})"),
            std::string::npos)
      << hlo;
  EXPECT_NE(hlo.find(R"(last_tile_dims={unreduced}}"})"), std::string::npos) << hlo;
  const std::string sbp = read_file(d / "megatron_sbp" / "shardings.json");
  EXPECT_NE(sbp.find(R"j("h.0.mlp.fc_in.weight": {"sbp":["B","S(1)"]})j"), std::string::npos) << sbp;
  EXPECT_NE(sbp.find(R"j({"sbp":["S(0)","P"]})j"), std::string::npos) << sbp;
  const std::string ordered = read_file(d / "ordered_hlo" / "shardings.json");
  EXPECT_NE(ordered.find(R"("mesh": {"shape":[2,4],"axes":["data","model"],"devices":[5,2,7,0,3,6,1,4]})"),
            std::string::npos)
      << ordered;
  const std::string ordered_spec = read_file(d / "ordered_spec" / "shardings.json");
  EXPECT_NE(ordered_spec.find(R"("input_ids": [["data","model:(1)2"],null])"), std::string::npos) << ordered_spec;
  EXPECT_NE(ordered_spec.find(R"("wte.weight": [["model","data"],null])"), std::string::npos) << ordered_spec;
}

// A permuted device order runs exactly, moves each device's weight slices and changes the replica groups, the
// device coordinates and the program fingerprint of the exported device files.
TEST(DeviceOrder, RunsExactlyAndMovesSlicesAndGroups) {
  const fs::path d = scratch("device_order");
  nlohmann::json plan = read_json(std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/gpt.megatron.sharding.json");
  plan["mesh"]["devices"] = {3, 1, 2, 0};  // device 0 at (data 1, model 1), device 2 at (1, 0)
  const std::string file = (d / "ordered.sharding.json").string();
  std::ofstream(file) << plan.dump(1);
  CmdResult run = cli("run " + kGpt + " --mesh 2x2 --shardings " + file +
                          " --inputs testdata/gpt/test_data_set_0 --check --report " + (d / "report.json").string(),
                      "device_order_run");
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  const nlohmann::json rep = read_json(d / "report.json");
  EXPECT_TRUE(rep["check"]["passed"].get<bool>());
  EXPECT_EQ(rep["mesh"]["devices"], nlohmann::json::array({3, 1, 2, 0}));
  EXPECT_EQ(count_collectives(rep, "all-reduce"), 5);
  // explain: the order, the HLO text with its device ids, and which devices hold each column block
  CmdResult ex = cli("explain " + kGpt + " --mesh 2x2 --shardings " + file + " --value h.0.mlp.fc_in.weight",
                     "device_order_explain");
  ASSERT_EQ(ex.code, 0) << ex.err;
  EXPECT_NE(ex.out.find("mesh {data=2, model=2} (4 devices in the order 3,1,2,0)"), std::string::npos) << ex.out;
  EXPECT_NE(ex.out.find("hlo {devices=[1,2,2]3,2,1,0 last_tile_dim_replicate}"), std::string::npos) << ex.out;
  EXPECT_NE(ex.out.find("│ 2,3 │ 0,1 │"), std::string::npos) << ex.out;

  ASSERT_EQ(cli("partition " + kGpt + " --mesh 2x2 --shardings " + file + " -o " + (d / "ordered").string(),
                "device_order_partition")
                .code,
            0);
  ASSERT_EQ(
      cli("partition " + kGpt + " --mesh 2x2 " + kMegatron + " -o " + (d / "plain").string(), "device_order_plain")
          .code,
      0);
  // Read the device files with the onnx package: the first AllReduce's groups (over model: rows of the mesh), the
  // metadata, and device 0's slice of fc_in.weight ([128, 512] split over model on dim 1: device 0 is model tile 1
  // in the order, tile 0 without it).
  CmdResult py =
      sh(debian_python() +
             " -c \"import onnx,sys\n"
             "from onnx import numpy_helper as nh\n"
             "full = {t.name: nh.to_array(t) for t in onnx.load('" +
             kGpt +
             "').graph.initializer}\n"
             "for d in sys.argv[1:]:\n"
             "    m = onnx.load(d + '/device_0.onnx')\n"
             "    ar = [n for n in m.graph.node if n.op_type == 'AllReduce'][0]\n"
             "    meta = {p.key: p.value for p in m.metadata_props}\n"
             "    w = {t.name: nh.to_array(t) for t in m.graph.initializer}['h.0.mlp.fc_in.weight']\n"
             "    tile = [t for t in range(2) if (w == full['h.0.mlp.fc_in.weight'][:, 256*t:256*(t+1)]).all()]\n"
             "    print(list(onnx.helper.get_attribute_value([a for a in ar.attribute if a.name == "
             "'replica_groups'][0])), meta['gspmd.device_coords'], meta.get('gspmd.mesh_devices'), tile, "
             "meta['gspmd.program_fingerprint'])\n\" " +
             (d / "ordered").string() + " " + (d / "plain").string(),
         "device_order_py");
  ASSERT_EQ(py.code, 0) << py.err;
  std::istringstream lines(py.out);
  std::string ordered, plain;
  std::getline(lines, ordered);
  std::getline(lines, plain);
  EXPECT_EQ(ordered.substr(0, ordered.rfind(' ')), "[2, 0, 3, 1] 1,1 3,1,2,0 [1]") << py.out;
  EXPECT_EQ(plain.substr(0, plain.rfind(' ')), "[0, 1, 2, 3] 0,0 None [0]") << py.out;
  EXPECT_NE(ordered.substr(ordered.rfind(' ')), plain.substr(plain.rfind(' '))) << "the fingerprints must differ";
}

// On a GPU cluster (dgx-h100: 8 GPUs per node, device k on node k / 8) the order decides which groups cross nodes:
// Megatron on 2x8 (data, model) keeps each model group of 8 on one node; with the devices listed column-major, each
// model group holds 4 GPUs of each node, and the attention projection's reduction crosses InfiniBand.
TEST(DeviceOrder, GpuNodesFollowTheOrder) {
  const fs::path d = scratch("device_order_gpu");
  nlohmann::json plan = read_json(std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/gpt.megatron.sharding.json");
  plan["mesh"]["devices"] = nlohmann::json::array();
  for (int p = 0; p < 16; ++p) plan["mesh"]["devices"].push_back(p % 8 * 2 + p / 8);
  std::ofstream(d / "ordered.sharding.json") << plan.dump(1);
  // the report, and the time of the collectives at the attention projection
  auto simulate = [&](const std::string& shardings, const std::string& tag) {
    CmdResult r = cli("simulate " + kGpt + " --mesh 2x8 " + shardings + " --target dgx-h100 --report " +
                          (d / (tag + ".json")).string(),
                      tag);
    EXPECT_EQ(r.code, 0) << r.err;
    nlohmann::json rep = read_json(d / (tag + ".json"));
    double proj = 0;
    int n = 0;
    for (const auto& c : rep["collectives"]) {
      if (c["node"] != "/h.0/attn/proj/Add") continue;
      proj += c["time_s"].get<double>() * c["count"].get<int>();
      ++n;
    }
    return std::tuple{rep, proj, n};
  };
  const auto [in, in_proj, in_n] = simulate(kMegatron, "device_order_gpu_in");
  const auto [across, across_proj, across_n] =
      simulate("--shardings " + (d / "ordered.sharding.json").string(), "device_order_gpu_across");
  EXPECT_EQ(across["mesh"]["devices"].size(), 16u);
  EXPECT_EQ(in_n, 1);  // one all-reduce over model on NVSwitch
  EXPECT_NEAR(in_proj, 2 * (7.0 / 8 * 131072 / 450e9 + 4e-6), 1e-15);
  EXPECT_GT(across_n, 0);
  EXPECT_GT(across_proj, in_proj);  // over the NICs
  EXPECT_GT(across["simulated"]["communication_time_s"].get<double>(),
            in["simulated"]["communication_time_s"].get<double>());
}

TEST(DeviceOrder, BadInput) {
  const fs::path d = scratch("device_order_bad");
  const std::string file = (d / "bad.sharding.json").string();
  std::ofstream(file) << R"({"mesh": {"axes": ["data", "model"], "devices": [3, 1, 2, 0]}})";
  CmdResult r = cli("partition " + kGpt + " --mesh 2x4 --shardings " + file + " -o " + (d / "out").string(), "bad_n");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + file + ": mesh.devices: has 4 entries but --mesh 2x4 has 8 devices\n");
  EXPECT_FALSE(fs::exists(d / "out"));
  r = cli("partition " + kGpt + " --mesh 2x2 " + kMegatron + " --notation xml -o " + (d / "out").string(),
          "bad_notation");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("error: usage: --notation: xml not in {spec,hlo,sbp}"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d / "out"));
}

}  // namespace
