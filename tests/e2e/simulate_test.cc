// `gspmd-onnx simulate` and `--trace` (docs/cli.md): the cost model's report without weights or execution, the
// static peak-memory estimate against the emulator's measurement, and the Chrome trace's structure and sums.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "backend/profile/host_target.h"
#include "e2e_util.h"

namespace {

using namespace e2e;

TEST(Simulate, SameReportAsRunWithoutHostOrCheck) {
  fs::path d = scratch("simulate_same");
  const auto [s, sim] = cli_report("simulate " + kGpt + " --mesh 2x2 " + kMegatron, d, "sim");
  const nlohmann::json run = cli_report("run " + kGpt + " --mesh 2x2 " + kMegatron, d, "simrun").report;
  ASSERT_FALSE(sim.is_null() || run.is_null());
  EXPECT_FALSE(sim.contains("host"));
  EXPECT_FALSE(sim.contains("check"));
  EXPECT_TRUE(run.contains("host"));
  EXPECT_EQ(sim["collectives"], run["collectives"]);
  EXPECT_EQ(sim["model_flops"], run["model_flops"]);
  EXPECT_DOUBLE_EQ(sim["simulated"]["step_time_s"].get<double>(), run["simulated"]["step_time_s"].get<double>());
  // The static estimate follows the emulator's accounting rules, so it equals the measured peak on every device.
  ASSERT_EQ(sim["simulated"]["per_device"].size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    const auto& ds = sim["simulated"]["per_device"][k];
    const auto& dr = run["simulated"]["per_device"][k];
    EXPECT_GT(ds["peak_memory_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(ds["peak_memory_bytes"], dr["peak_memory_bytes"]) << "device " << k;
  }
  EXPECT_NE(s.out.find("memory "), std::string::npos) << s.out;
}

TEST(Simulate, WorksWithoutTheWeightsExternalData) {
  // Re-save the GPT with its large weights in an external file, then delete that file: simulate needs only shapes,
  // run needs the data and says which file is missing.
  fs::path d = scratch("simulate_external");
  const fs::path model = d / "gpt_ext.onnx";
  CmdResult py =
      sh(debian_python() + " -c \"import onnx; m = onnx.load('" + kGpt + "'); onnx.save_model(m, '" + model.string() +
             "', save_as_external_data=True, all_tensors_to_one_file=True, location='gpt_ext.bin', "
             "size_threshold=1024)\"",
         "simext_py");
  ASSERT_EQ(py.code, 0) << py.err;
  ASSERT_TRUE(fs::exists(d / "gpt_ext.bin"));
  CmdResult with_data =
      cli("simulate " + model.string() + " --mesh 2x2 " + kMegatron + " --report " + (d / "with.json").string(),
          "simext_with");
  ASSERT_EQ(with_data.code, 0) << with_data.err;
  fs::remove(d / "gpt_ext.bin");
  CmdResult without =
      cli("simulate " + model.string() + " --mesh 2x2 " + kMegatron + " --report " + (d / "without.json").string(),
          "simext_without");
  ASSERT_EQ(without.code, 0) << without.err;
  nlohmann::json a = read_json(d / "with.json"), b = read_json(d / "without.json");
  // The same plan. Compute may differ by a node or two: with the file present, small external tensors are read and
  // weight-only subgraphs can fold; without it they stay in the program.
  EXPECT_EQ(a["collectives"], b["collectives"]);
  EXPECT_DOUBLE_EQ(a["simulated"]["communication_time_s"].get<double>(),
                   b["simulated"]["communication_time_s"].get<double>());
  EXPECT_NEAR(a["simulated"]["step_time_s"].get<double>(), b["simulated"]["step_time_s"].get<double>(),
              0.01 * a["simulated"]["step_time_s"].get<double>());
  EXPECT_EQ(count_collectives(b, "all-reduce"), 5);
  CmdResult run = cli("run " + model.string() + " --mesh 2x2 " + kMegatron, "simext_run");
  EXPECT_EQ(run.code, 2) << run.err;
  EXPECT_NE(run.err.find("gpt_ext.bin"), std::string::npos) << run.err;
}

// The summary as a newcomer reads it (issue 31): the sharding file picked up beside the model is named, a graph
// output's reshard says so instead of an empty node, and entries that differ only in their reasons (LayerNorm's mean
// and variance over a split d_model) are one line with their counts summed.
TEST(Simulate, SummaryNamesItsSourcesAndGroupsAlikeLines) {
  const fs::path d = scratch("simulate_summary");
  fs::copy_file(kGpt, d / "gpt.onnx", fs::copy_options::overwrite_existing);
  fs::copy_file("testdata/gpt/gpt.megatron.sharding.json", d / "gpt.sharding.json",
                fs::copy_options::overwrite_existing);
  CmdResult r = cli("simulate " + (d / "gpt.onnx").string() + " --mesh 2x2", "simulate_summary_sibling");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\nshardings " + (d / "gpt.sharding.json").string() +
                       " (found beside the model; --shardings FILE reads another)\n"),
            std::string::npos)
      << r.out;
  r = cli("simulate " + kGpt + " --mesh 2x2 " + kMegatron, "simulate_summary_flag");
  EXPECT_EQ(r.out.find("shardings "), std::string::npos) << r.out;

  std::ofstream(d / "head.json") << R"({"mesh": {"shape": [2, 2], "axes": ["data", "model"]},
                                       "tensors": {"lm_head.weight": ["model", null]}})";
  r = cli("simulate " + kGpt + " --mesh 2x2 --shardings " + (d / "head.json").string(), "simulate_summary_output");
  EXPECT_NE(r.out.find("\n  all-reduce         over {model}   1.00 MiB x1  at graph output 'logits'\n"),
            std::string::npos)
      << r.out;

  r = cli("simulate " + kGpt + " --mesh 2x2 --shardings testdata/gpt/gpt.paper2d.sharding.json --report " +
              (d / "p.json").string(),
          "simulate_summary_alike");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\n  all-reduce         over {model}    1.0 KiB x2  at /h.0/ln_1/LayerNormalization "
                       "(/Add_output_0)\n"),
            std::string::npos)
      << r.out;
  std::set<std::string> lines;
  size_t listed = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("  all-") || line.starts_with("  reduce-") || line.starts_with("  collective-")) {
      ++listed;
      EXPECT_TRUE(lines.insert(line).second) << "printed twice: " << line;
    }
  EXPECT_LT(listed, read_json(d / "p.json")["collectives"].size());
}

// Padding is visible (issue 31): a batch of 8 over data=32 leaves 24 shards with only padding, over data=3 the shards
// hold 3, 3 and 2 rows; the summary warns with the amount and the report lists each padded dim.
TEST(Simulate, PaddedShardsAreWarnedAbout) {
  const fs::path d = scratch("simulate_padding");
  CmdResult r = cli("simulate " + kGpt + " --mesh 32x64 " + kMegatron + " --report " + (d / "big.json").string(),
                    "simulate_padding_big");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\nwarning   padding: 'input_ids' dim 0 of 8 over {data}=32: 24 of 32 shards hold only padding\n"
                       "warning   padding: 'logits' dim 0 of 8 over {data}=32: 24 of 32 shards hold only padding\n"),
            std::string::npos)
      << r.out;
  const nlohmann::json pads = read_json(d / "big.json")["padding"];
  ASSERT_EQ(pads.size(), 2u);
  EXPECT_EQ(pads[0], nlohmann::json::parse(R"({"value": "input_ids", "dim": 0, "size": 8, "axes": ["data"],
      "shards": 32, "per_shard": 1, "padding": 24, "empty_shards": 24})"));

  std::ofstream(d / "d3.json")
      << R"({"mesh": {"shape": [3], "axes": ["data"]}, "tensors": {"input_ids": ["data", null]}})";
  r = cli("simulate " + kGpt + " --mesh 3 --shardings " + (d / "d3.json").string(), "simulate_padding_3");
  EXPECT_NE(
      r.out.find("\nwarning   padding: 'input_ids' dim 0 of 8 over {data}=3: shards of 3, 1 of 9 indices padding\n"),
      std::string::npos)
      << r.out;
  // Even shards: no padding, no warning.
  r = cli("simulate " + kGpt + " --mesh 2x2 " + kMegatron + " --report " + (d / "even.json").string(),
          "simulate_padding_even");
  EXPECT_EQ(r.out.find("padding"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(d / "even.json")["padding"], nlohmann::json::array());
}

// The mesh comes from where it is written (issue 31): without --mesh, the sharding file's, the sibling file's or the
// annotated model's mesh is used; with none of them the error says what to give.
TEST(Simulate, MeshComesFromTheShardingFile) {
  const fs::path d = scratch("simulate_mesh_from_file");
  auto mesh_of = [&](const std::string& args, const std::string& tag) {
    const nlohmann::json rep = cli_report("simulate " + args, d, tag).report;
    return rep.is_null() ? rep : rep["mesh"];
  };
  const nlohmann::json two_by_two = nlohmann::json::parse(R"({"shape": [2, 2], "axes": ["data", "model"]})");
  auto same = [&](const nlohmann::json& m) {
    return m["shape"] == two_by_two["shape"] && m["axes"] == two_by_two["axes"];
  };
  EXPECT_TRUE(same(mesh_of(kGpt + " " + kMegatron, "mesh_flag_file")));
  fs::copy_file(kGpt, d / "gpt.onnx", fs::copy_options::overwrite_existing);
  fs::copy_file("testdata/gpt/gpt.megatron.sharding.json", d / "gpt.sharding.json",
                fs::copy_options::overwrite_existing);
  EXPECT_TRUE(same(mesh_of((d / "gpt.onnx").string(), "mesh_sibling")));
  CmdResult p = cli("partition " + kGpt + " " + kMegatron + " -o " + (d / "out").string() + " --annotated-model " +
                        (d / "annotated.onnx").string(),
                    "mesh_partition");
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_TRUE(same(mesh_of((d / "annotated.onnx").string(), "mesh_annotated")));

  CmdResult none = cli("simulate " + kGpt, "mesh_none");
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.err, "error: " + kGpt +
                          ": no mesh: give --mesh, or a sharding file that names one (--shardings FILE, or "
                          "gpt_opset17.sharding.json beside the model)\n");
  std::ofstream(d / "no_mesh.json") << R"({"tensors": {"input_ids": ["x", null]}})";
  CmdResult bare = cli("simulate " + kGpt + " --shardings " + (d / "no_mesh.json").string(), "mesh_bare");
  EXPECT_EQ(bare.code, 2);
  EXPECT_EQ(bare.err,
            "error: " + (d / "no_mesh.json").string() + ": mesh: the file has no mesh and no --mesh was given\n");
}

// Every device runs the same program with the same simulated timeline: one track holds it for all 16 (issue 31: 2048
// devices used to write 2048 identical tracks), and its spans sum to the step.
TEST(Trace, OneTrackForTheDevicesAndSpansSumToTheStep) {
  fs::path d = scratch("trace");
  for (const char* cmd : {"simulate", "run"}) {
    SCOPED_TRACE(cmd);
    const fs::path trace = d / (std::string(cmd) + ".trace.json"), report = d / (std::string(cmd) + ".json");
    CmdResult r = cli(std::string(cmd) + " " + kGpt + " --mesh 4x4 --shardings testdata/gpt/gpt.2d.sharding.json" +
                          " --trace " + trace.string() + " --report " + report.string(),
                      std::string("trace_") + cmd);
    ASSERT_EQ(r.code, 0) << r.err;
    nlohmann::json t = read_json(trace), rep = read_json(report);
    ASSERT_TRUE(t.contains("traceEvents"));
    std::map<int64_t, std::string> tracks;
    std::map<int64_t, double> busy, end;
    std::map<int64_t, int> collectives, spans;
    for (const auto& e : t["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"].get<int64_t>()] = e["args"]["name"];
      if (e["ph"] != "X") continue;
      const int64_t tid = e["tid"].get<int64_t>();
      const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
      EXPECT_GE(ts + 1e-4, end[tid]) << "spans of a track overlap";  // (printed with 6 decimals: rounding)
      end[tid] = ts + dur;
      busy[tid] += dur;
      ++spans[tid];
      if (e["cat"] == "collective") {
        ++collectives[tid];
        EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
      }
    }
    ASSERT_EQ(tracks.size(), 1u);
    EXPECT_EQ(tracks[0], "devices 0..15");
    const double step_us = rep["simulated"]["step_time_s"].get<double>() * 1e6;
    EXPECT_NEAR(busy[0], step_us, 1e-6 * step_us + 1e-3);
    EXPECT_EQ(collectives[0], count_collectives(rep, "all-reduce"));
    EXPECT_EQ(collectives[0], 5);
  }
}

TEST(Trace, OverlapPutsCollectivesOnTheirOwnTrack) {
  fs::path d = scratch("trace_overlap");
  const std::string base = "simulate " + kGpt + " --mesh 2x2 " + kMegatron;
  CmdResult a = cli(base + " --report " + (d / "seq.json").string(), "overlap_seq");
  CmdResult b = cli(base + " --overlap --report " + (d / "ovl.json").string() + " --trace " + (d / "t.json").string(),
                    "overlap_ovl");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  nlohmann::json seq = read_json(d / "seq.json"), ovl = read_json(d / "ovl.json"), t = read_json(d / "t.json");
  EXPECT_FALSE(seq["simulated"]["overlap"].get<bool>());
  EXPECT_TRUE(ovl["simulated"]["overlap"].get<bool>());
  const double s1 = seq["simulated"]["step_time_s"].get<double>(), s2 = ovl["simulated"]["step_time_s"].get<double>();
  EXPECT_LE(s2, s1 * (1 + 1e-12));
  EXPECT_GE(s2, std::max(ovl["simulated"]["compute_time_s"].get<double>(),
                         ovl["simulated"]["communication_time_s"].get<double>()) *
                    (1 - 1e-12));
  EXPECT_NE(b.out.find(", overlapped)"), std::string::npos) << b.out;
  std::map<int64_t, std::string> tracks;
  int collectives_on_own_track = 0, collectives = 0;
  double end = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"].get<int64_t>()] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    end = std::max(end, e["ts"].get<double>() + e["dur"].get<double>());
    if (e["cat"] == "collective") {
      ++collectives;
      collectives_on_own_track += e["tid"].get<int64_t>() == 1;
    }
  }
  EXPECT_EQ(tracks, (std::map<int64_t, std::string>{{0, "devices 0..3"}, {1, "devices 0..3 collectives"}}));
  EXPECT_EQ(collectives, 5);
  EXPECT_EQ(collectives_on_own_track, collectives);
  EXPECT_NEAR(end, s2 * 1e6, 1e-3);  // the last span ends at the step
}

TEST(RunProgress, OnlyOnATerminal) {
  // Under `script` stderr is a terminal: with the delay at 0 the progress line appears (and is erased at the end);
  // redirected to a file, nothing but errors is ever written to stderr.
  fs::path d = scratch("progress");
  CmdResult tty = sh("GSPMD_PROGRESS_DELAY_MS=0 script -qec '" + std::string(GSPMD_BINARY_DIR) +
                         "/bin/gspmd-onnx run " + kGpt + " --mesh 2x2 " + kMegatron + " >/dev/null' /dev/null",
                     "progress_tty");
  ASSERT_EQ(tty.code, 0) << tty.err;
  EXPECT_NE(tty.out.find("run: 4 devices, node "), std::string::npos) << tty.out;
  CmdResult file = sh("GSPMD_PROGRESS_DELAY_MS=0 " + std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx run " + kGpt +
                          " --mesh 2x2 " + kMegatron,
                      "progress_file");
  ASSERT_EQ(file.code, 0) << file.err;
  EXPECT_EQ(file.err, "");
}

TEST(Trace, UnwritablePathIsAnInputError) {
  CmdResult r = cli("simulate " + kGpt + " --mesh 2x2 --trace /nonexistent-dir/t.json", "trace_bad");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --trace: /nonexistent-dir/t.json: no such directory\n");
}

}  // namespace

namespace {

// --target host with more OpenMP threads than cores (OMP_NUM_THREADS): the summary and the report warn, naming both.
TEST(Simulate, HostTargetWarnsOfOversubscribedThreads) {
  const int cores = gspmd::host_cores();
  const auto [r, rep] = cli_report("simulate " + kGpt + " --mesh 2x2 " + kMegatron + " --target host",
                                   scratch("host_threads"), "host_threads");
  ASSERT_FALSE(rep.is_null());
  EXPECT_EQ(r.out.find("OpenMP runs"), std::string::npos) << r.out;  // ctest's OMP_NUM_THREADS=1: no warning
  const CmdResult over = sh("OMP_NUM_THREADS=" + std::to_string(cores + 1) + " " + GSPMD_BINARY_DIR +
                                "/bin/gspmd-onnx simulate " + kGpt + " --mesh 2x2 " + kMegatron + " --target host",
                            "host_threads_over");
  ASSERT_EQ(over.code, 0) << over.err;
  EXPECT_NE(over.out.find(fmt::format("\nwarning   host: OpenMP runs {} threads on {} cores (OMP_NUM_THREADS): kernels "
                                      "oversubscribe the cores, so the host times may not repeat; set "
                                      "OMP_NUM_THREADS={}\n",
                                      cores + 1, cores, cores)),
            std::string::npos)
      << over.out;
}

}  // namespace
