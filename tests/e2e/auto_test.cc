// --auto (docs/auto.md): the search's plan against the hand-written ones on shape-only decoders (simulate), on a
// memory-bound decoder, on resnet18, and run --auto --check on the testdata models; its errors, exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "cnn_export.h"
#include "e2e_util.h"

namespace {

using namespace e2e;

struct Sim {
  double step = 0;
  int64_t peak = 0;
  nlohmann::json report;
};

/// simulate MODEL ARGS --report; asserts exit 0.
Sim simulate(const std::string& model, const std::string& args, const std::string& tag) {
  Reported x = cli_report("simulate " + model + " " + args, scratch("auto_sim_" + tag), "auto_" + tag);
  Sim s;
  if (x.report.is_null()) return s;
  s.report = std::move(x.report);
  s.step = s.report["simulated"]["step_time_s"].get<double>();
  s.peak = s.report["simulated"]["per_device"][0]["peak_memory_bytes"].get<int64_t>();
  return s;
}

/// A shape-only decoder from testdata/tools/make_decoder.py (with its Megatron + data sidecar for `mesh`).
fs::path decoder(const std::string& name, const std::string& flags, const std::string& mesh) {
  fs::path d = fs::path(GSPMD_BINARY_DIR) / "e2e-scratch" / "auto-models";
  fs::create_directories(d);
  return make_decoder(d, name, flags + " --weights absent --mesh " + mesh, "auto_make_" + name);
}

struct DecoderCase {
  std::string name, flags, mesh;
};
void PrintTo(const DecoderCase& c, std::ostream* os) { *os << c.name << " (" << c.flags << ", mesh " << c.mesh << ")"; }

class AutoDecoder : public ::testing::TestWithParam<DecoderCase> {};

// No annotations at all: --auto's plan is no slower than Megatron + data and fits in the target's HBM; the report's
// search numbers and the baselines are there, and the chosen cost is exactly the final pipeline's.
TEST_P(AutoDecoder, NoWorseThanMegatronAndFits) {
  const DecoderCase& c = GetParam();
  fs::path model = decoder(c.name, c.flags, c.mesh);
  fs::path meg = model.parent_path() / (c.name + ".megatron.sharding.json");
  fs::path empty = scratch("auto_empty_" + c.name) / "none.sharding.json";
  std::ofstream(empty) << "{\"tensors\": {}}\n";
  Sim megatron = simulate(model.string(), "--mesh " + c.mesh + " --shardings " + meg.string(), c.name + "_meg");
  Sim a = simulate(model.string(), "--mesh " + c.mesh + " --shardings " + empty.string() + " --auto", c.name + "_auto");
  ASSERT_GT(megatron.step, 0);
  ASSERT_GT(a.step, 0);
  EXPECT_LE(a.step, megatron.step * (1 + 1e-9)) << a.report["auto"].dump(1);
  const auto& au = a.report["auto"];
  EXPECT_LE(a.peak, au["memory_limit_bytes"].get<int64_t>());
  EXPECT_EQ(au["memory_limit_bytes"].get<int64_t>(), int64_t{16} << 30);  // tpu-v3: 16 GiB per core
  EXPECT_DOUBLE_EQ(au["chosen"]["step_time_s"].get<double>(), a.step);
  EXPECT_EQ(au["chosen"]["peak_memory_bytes"].get<int64_t>(), a.peak);
  EXPECT_GT(au["evaluations"].get<int>(), 0);
  EXPECT_GT(au["search_time_s"].get<double>(), 0);
  std::set<std::string> names;
  for (const auto& b : au["baselines"]) names.insert(b["name"].get<std::string>());
  EXPECT_TRUE(names.count("data-parallel") && names.count("megatron+data")) << au["baselines"].dump();
  // The layers are costed on one and two of them (docs/auto.md, "Scale"). The generic Megatron seed is the
  // hand-written sidecar's plan, and its cost extrapolated from the cut models is the whole model's: the step to
  // rounding, the peak exactly.
  EXPECT_EQ(au["layer_blocks"].get<int64_t>(), std::stoi(c.flags.substr(c.flags.find("--layers ") + 9)));
  for (const auto& b : au["baselines"])
    if (b["name"] == "megatron+data") {
      EXPECT_TRUE(b["estimated"].get<bool>());
      EXPECT_NEAR(b["step_time_s"].get<double>(), megatron.step, 1e-12 * megatron.step);
      EXPECT_EQ(b["peak_memory_bytes"].get<int64_t>(), megatron.peak);
    }
}

INSTANTIATE_TEST_SUITE_P(
    AutoDecoders, AutoDecoder,
    ::testing::Values(
        DecoderCase{"d4_1024_4x4", "--layers 4 --d-model 1024 --heads 16 --vocab 32000 --batch 64 --seq 512", "4x4"},
        DecoderCase{"d4_2048_8x8", "--layers 4 --d-model 2048 --heads 16 --vocab 32000 --batch 64 --seq 512", "8x8"},
        DecoderCase{"d24_1024_4x4", "--layers 24 --d-model 1024 --heads 16 --vocab 32000 --batch 64 --seq 512", "4x4"},
        DecoderCase{"d24_1024_8x8", "--layers 24 --d-model 1024 --heads 16 --vocab 32000 --batch 64 --seq 512", "8x8"},
        // 24 x 12 x 4096^2 weights are 19 GiB of float32: data parallelism does not fit, Megatron does.
        DecoderCase{"d24_4096_4x4", "--layers 24 --d-model 4096 --heads 32 --vocab 32000 --batch 64 --seq 1024", "4x4"},
        DecoderCase{"d24_4096_8x8", "--layers 24 --d-model 4096 --heads 32 --vocab 32000 --batch 64 --seq 1024",
                    "8x8"}),
    [](const auto& info) { return info.param.name; });

}  // namespace

namespace {

using namespace e2e;

const std::string kNone = "{\"tensors\": {}}\n";

fs::path empty_sidecar(const std::string& tag) {
  fs::path f = scratch("auto_none_" + tag) / "none.sharding.json";
  std::ofstream(f) << kNone;
  return f;
}

// Memory-bound: with a limit below the Megatron + data plan's peak, that plan does not fit; --auto finds one that
// does (and is still no slower than Megatron here).
TEST(AutoMemory, FindsAPlanThatFitsWhereMegatronDoesNot) {
  fs::path model =
      decoder("mb_d4_4096", "--layers 4 --d-model 4096 --heads 32 --vocab 32000 --batch 64 --seq 1024", "4x4");
  fs::path meg = model.parent_path() / "mb_d4_4096.megatron.sharding.json";
  Sim megatron = simulate(model.string(), "--mesh 4x4 --shardings " + meg.string(), "mb_meg");
  ASSERT_GT(megatron.peak, 0);
  const int64_t limit = megatron.peak * 4 / 5;
  Sim a = simulate(
      model.string(),
      "--mesh 4x4 --shardings " + empty_sidecar("mb").string() + " --auto --memory-limit " + std::to_string(limit),
      "mb_auto");
  ASSERT_GT(a.step, 0);
  EXPECT_LE(a.peak, limit);
  EXPECT_EQ(a.report["auto"]["memory_limit_bytes"].get<int64_t>(), limit);
  for (const auto& b : a.report["auto"]["baselines"])
    if (b["name"] == "megatron+data") {
      EXPECT_FALSE(b["fits"].get<bool>()) << b.dump();
    }
}

// resnet18: data parallelism or better.
TEST(AutoCnn, Resnet18IsAtLeastDataParallel) {
  const Export& e = exported("resnet18");
  ASSERT_TRUE(e.error.empty()) << e.error;
  const std::string model = (e.dir / "resnet18.onnx").string();
  // The committed data-parallel sidecar is for 2x2; on a 1-D mesh of 4 the same batch split is written here.
  fs::path dp4 = scratch("auto_cnn_dp4") / "dp4.sharding.json";
  std::ofstream(dp4) << "{\"mesh\": {\"shape\": [4], \"axes\": [\"data\"]}, \"tensors\": "
                        "{\"input\": [\"data\", null, null, null]}}\n";
  for (const auto& [mesh, dp_file] : {std::pair<std::string, fs::path>{"2x2", e.dir / "resnet18.data.sharding.json"},
                                      std::pair<std::string, fs::path>{"4", dp4}}) {
    SCOPED_TRACE(mesh);
    Sim dp = simulate(model, "--mesh " + mesh + " --shardings " + dp_file.string(), "cnn_dp" + mesh);
    Sim a = simulate(model, "--mesh " + mesh + " --shardings " + empty_sidecar("cnn").string() + " --auto",
                     "cnn_auto" + mesh);
    ASSERT_GT(a.step, 0);
    ASSERT_GT(dp.step, 0);
    EXPECT_LE(a.step, dp.step * (1 + 1e-9)) << a.report["auto"].dump(1);
    EXPECT_LE(a.peak, a.report["auto"]["memory_limit_bytes"].get<int64_t>());
    // The data-parallel seed is the sidecar's plan.
    for (const auto& b : a.report["auto"]["baselines"])
      if (b["name"] == "data-parallel") {
        EXPECT_DOUBLE_EQ(b["step_time_s"].get<double>(), dp.step);
      }
  }
}

// Layered costing ties each value of a layer to its copies in every block. The tutorial's MLP starts its first
// block at the graph input, which no node makes: block 0's inner values must not count as the residual stream
// (they once did, giving one-member groups that tied nothing). Every group holds one value per block (4), except the
// input and the head's weight; 6 decisions for 18 tensors.
TEST(AutoLayers, EveryGroupTiesItsValueInEveryBlock) {
  const auto [r, rep] = cli_report("simulate " + tutorial_mlp().string() + " --mesh 2x2 --dim batch=8 --auto",
                                   scratch("auto_mlp_groups"), "auto_mlp_groups");
  ASSERT_FALSE(rep.is_null());
  EXPECT_EQ(rep["auto"]["layer_blocks"].get<int>(), 4);
  EXPECT_EQ(rep["auto"]["groups"].get<int>(), 6);
  EXPECT_EQ(rep["auto"]["variables"].get<int>(), 18);
  for (const auto& c : rep["auto"]["choices"]) {
    const std::string group = c["group"].get<std::string>();
    EXPECT_EQ(c["values"].size(), group == "x" || group.starts_with("onnx::MatMul_# [64,10]") ? 1u : 4u) << c.dump();
  }
}

// --pipeline auto: --auto's plan (1 stage), then each divisor of the mesh's first axis as a stage axis carved out
// of it, costed on the real pipelined program with the fastest microbatch count under two plans: that plan's
// annotations, and a plan searched on one stage's mesh. The report lists every count with the better of its two;
// the plan with the shortest step that fits is the one that runs. Without --auto, refused.
TEST(AutoStages, ChoosesTheStageCountByItsSimulatedStep) {
  const fs::path d = scratch("auto_stages");
  const fs::path dec =
      make_decoder(d, "st4", "--layers 4 --d-model 64 --heads 4 --vocab 128 --batch 8 --seq 16 --weights inputs",
                   "auto_stages_make");
  const auto [r, rep] = cli_report("simulate " + dec.string() + " --mesh 4x2 --auto --pipeline auto", d, "stages");
  ASSERT_FALSE(rep.is_null());
  const nlohmann::json& tried = rep["auto_stages"];
  ASSERT_EQ(tried.size(), 3u) << tried.dump(1);
  double best = 1e30;
  int64_t best_stages = 0;
  for (size_t i = 0; i < tried.size(); ++i) {
    const int64_t stages[] = {1, 2, 4};
    EXPECT_EQ(tried[i]["stages"].get<int64_t>(), stages[i]);
    ASSERT_TRUE(tried[i].contains("step_s")) << tried[i].dump();
    EXPECT_GT(tried[i]["step_s"].get<double>(), 0);
    EXPECT_TRUE(tried[i]["fits"].get<bool>());
    const std::string sharding = tried[i]["sharding"].get<std::string>();
    EXPECT_TRUE(i == 0 ? sharding == "searched" : sharding == "searched" || sharding == "as for 1 stage") << sharding;
    if (tried[i]["step_s"].get<double>() < best) best = tried[i]["step_s"], best_stages = tried[i]["stages"];
  }
  EXPECT_DOUBLE_EQ(rep["simulated"]["step_time_s"].get<double>(), best);
  EXPECT_EQ(rep.contains("pipeline") ? rep["pipeline"]["stages"].get<int64_t>() : 1, best_stages);
  // A pipelined count holds fewer weights per device than the plan without a pipeline on the same devices.
  EXPECT_LT(tried[2]["peak_bytes"].get<int64_t>(), tried[0]["peak_bytes"].get<int64_t>());
  EXPECT_NE(r.out.find("\nstages    --auto chose "), std::string::npos) << r.out;
  // Nothing fits at any count: the error names the closest and every count's peak (static estimates, bytes).
  const CmdResult none =
      cli("simulate " + dec.string() + " --mesh 4x2 --auto --pipeline auto --memory-limit 1000", "auto_stages_none");
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.err.rfind("error: --pipeline auto: no plan fits in 1000 bytes per device at any stage count; the "
                           "closest (1 stage(s)) needs ",
                           0),
            0u)
      << none.err;
  EXPECT_NE(none.err.find(" bytes per device (stages: bytes per device 1: "), std::string::npos) << none.err;
  EXPECT_NE(none.err.find(", 2: "), std::string::npos) << none.err;
  EXPECT_NE(none.err.find(", 4: "), std::string::npos) << none.err;
  const CmdResult no_auto = cli("simulate " + dec.string() + " --mesh 4x2 --pipeline auto", "auto_stages_refused");
  EXPECT_EQ(no_auto.code, 2);
  EXPECT_EQ(no_auto.err, "error: --pipeline auto: only with --auto (the search chooses the stage count)\n");
}

// The chosen plans run correctly on the emulated pod.
TEST(AutoRun, CheckPassesOnTheTestdataModels) {
  fs::path d = scratch("auto_run");
  const auto [r, rep] =
      cli_report("run testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto --inputs testdata/gpt/test_data_set_0 --check", d,
                 "auto_run_gpt");
  ASSERT_FALSE(rep.is_null());
  EXPECT_TRUE(rep["check"]["passed"].get<bool>());
  EXPECT_TRUE(rep.contains("auto"));
  EXPECT_NE(r.out.find("auto      searched "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;

  const Export& e = exported("resnet18");
  ASSERT_TRUE(e.error.empty()) << e.error;
  const Reported c = cli_report("run " + (e.dir / "resnet18.onnx").string() + " --mesh 2x2 --shardings " +
                                    empty_sidecar("run_cnn").string() + " --auto --inputs " +
                                    (e.dir / "test_data_set_0").string() + " --check",
                                d, "auto_run_cnn");
  ASSERT_FALSE(c.report.is_null());
  EXPECT_TRUE(c.report["check"]["passed"].get<bool>());
}

// partition --auto writes the chosen plan as shardings.json; pinned with --shardings (no --auto) it gives the same
// program, and with the Megatron constraint on one weight, that annotation is kept.
TEST(AutoPartition, WritesThePlanWhichReadsBackToTheSameProgram) {
  fs::path d = scratch("auto_partition");
  CmdResult p =
      cli("partition testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto -o " + (d / "out").string(), "auto_part");
  ASSERT_EQ(p.code, 0) << p.out << p.err;
  ASSERT_TRUE(fs::exists(d / "out" / "shardings.json"));
  nlohmann::json rep = read_json(d / "out" / "report.json");
  // simulate pinned to a sharding file gives the searched plan: the same step and collectives
  auto expect_pins = [&](const fs::path& file, const std::string& tag) {
    SCOPED_TRACE(file.string());
    const nlohmann::json pinned =
        cli_report("simulate testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings " + file.string(), d, tag).report;
    ASSERT_FALSE(pinned.is_null());
    EXPECT_DOUBLE_EQ(pinned["simulated"]["step_time_s"].get<double>(), rep["simulated"]["step_time_s"].get<double>());
    EXPECT_EQ(pinned["collectives"], rep["collectives"]);
  };
  expect_pins(d / "out" / "shardings.json", "auto_pinned");
  EXPECT_DOUBLE_EQ(rep["auto"]["chosen"]["step_time_s"].get<double>(), rep["simulated"]["step_time_s"].get<double>());
  // The short file (only the annotations that produce the plan) pins it too.
  ASSERT_TRUE(fs::exists(d / "out" / "auto.sharding.json"));
  nlohmann::json short_file = read_json(d / "out" / "auto.sharding.json");
  EXPECT_LT(short_file["tensors"].size(), read_json(d / "out" / "shardings.json")["tensors"].size());
  expect_pins(d / "out" / "auto.sharding.json", "auto_pinned_short");
  EXPECT_NE(p.out.find("wrote     " + (d / "out").string() +
                       "/device_{0..3}.onnx, shardings.json, auto.sharding.json, "
                       "report.json"),
            std::string::npos)
      << p.out;
}

// The same for a training step whose layers are costed once (a 4-layer decoder): the search chooses the remat
// policy too, and its short file, pinned with that policy, gives the same program, because a weight the search
// annotates passes its sharding to its gradient and optimizer state as the file's annotations do. And `run --check`
// of the searched step, rebuilt under the chosen policy, matches the unpartitioned step.
TEST(AutoPartition, ATrainingPlanReadsBackToTheSameProgram) {
  fs::path d = scratch("auto_partition_training");
  const fs::path model = make_decoder(d, "dec4",
                                      "--layers 4 --d-model 64 --heads 4 --vocab 128 --batch 8 --seq 32 "
                                      "--weights random --mesh 2x2",
                                      "auto_part_train_make");
  const std::string train = " --training --loss mean --optimizer adam", limit = " --memory-limit 3000000";
  CmdResult p =
      cli("partition " + model.string() + " --mesh 2x2 --auto" + train + limit + " -o " + (d / "out").string(),
          "auto_part_train");
  ASSERT_EQ(p.code, 0) << p.out << p.err;
  const nlohmann::json rep = read_json(d / "out" / "report.json");
  EXPECT_EQ(rep["auto"]["layer_blocks"].get<int64_t>(), 4);
  const std::string remat = rep["training"]["remat"].get<std::string>();
  EXPECT_NE(remat, "none") << "under 3 MB the step needs rematerialization";
  const nlohmann::json& update = rep["training"]["shard_update"];
  const nlohmann::json pinned =
      cli_report("simulate " + model.string() + " --mesh 2x2 --shardings " +
                     (d / "out" / "auto.sharding.json").string() + train + " --remat " + remat +
                     (update.is_string() ? " --shard-update " + update.get<std::string>() : ""),
                 d, "auto_part_train_pinned")
          .report;
  ASSERT_FALSE(pinned.is_null());
  EXPECT_DOUBLE_EQ(pinned["simulated"]["step_time_s"].get<double>(), rep["simulated"]["step_time_s"].get<double>());
  EXPECT_EQ(pinned["simulated"]["memory"]["peak_bytes"], rep["simulated"]["memory"]["peak_bytes"]);
  // The same collectives (their reasons name the file instead of --auto).
  auto without_reasons = [](nlohmann::json cs) {
    for (auto& c : cs) c.erase("reason");
    return cs;
  };
  EXPECT_TRUE(without_reasons(pinned["collectives"]) == without_reasons(rep["collectives"]));
  CmdResult r =
      cli("run " + model.string() + " --mesh 2x2 --auto" + train + " --check --report " + (d / "run.json").string(),
          "auto_part_train_run");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(read_json(d / "run.json")["check"]["passed"].get<bool>());
}

// Weight-update sharding is one of the search's choices (issue 30): a 4-layer decoder trained with Adam on 4
// devices, under a limit that plain data parallelism exceeds (its Adam state is whole on every device) and that data
// parallelism with the update sharded over the one axis meets (ZeRO stages 1 and 2). The data-parallel baseline is
// costed with it, its estimate is the pinned plan's step to rounding, and the chosen plan is no slower.
TEST(AutoTraining, ChoosesWeightUpdateShardingWhereDataParallelDoesNotFit) {
  fs::path d = scratch("auto_shard_update");
  const fs::path model = make_decoder(
      d, "dec", "--layers 4 --d-model 128 --heads 4 --vocab 256 --batch 32 --seq 64 --weights random --mesh 4",
      "auto_update_make");
  std::ofstream(d / "dp.json") << R"({"mesh": {"shape": [4], "axes": ["x"]}, "tensors": {"input_ids": ["x", null]}})";
  const std::string train = " --mesh 4 --training --loss mean --optimizer adam";
  auto simulate = [&](const std::string& flags, const std::string& tag) {
    CmdResult r =
        cli("simulate " + model.string() + train + flags + " --report " + (d / (tag + ".json")).string(), tag);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return r.code == 0 ? read_json(d / (tag + ".json")) : nlohmann::json::object();
  };
  const std::string dp = " --shardings " + (d / "dp.json").string();
  const nlohmann::json plain = simulate(dp, "auto_update_dp"),
                       zero = simulate(dp + " --shard-update x", "auto_update_zero");
  ASSERT_FALSE(plain.empty() || zero.empty());
  const int64_t limit = 36000000;
  ASSERT_GT(plain["simulated"]["memory"]["peak_bytes"].get<int64_t>(), limit);
  ASSERT_LT(zero["simulated"]["memory"]["peak_bytes"].get<int64_t>(), limit);

  const nlohmann::json a = simulate(" --auto --memory-limit " + std::to_string(limit), "auto_update_search");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a["training"]["shard_update"], "x");
  EXPECT_LE(a["simulated"]["memory"]["peak_bytes"].get<int64_t>(), limit);
  const double step = a["auto"]["chosen"]["step_time_s"].get<double>();
  EXPECT_EQ(a["simulated"]["step_time_s"].get<double>(), step);
  bool seen = false;
  for (const auto& b : a["auto"]["baselines"]) {
    if (b["fits"].get<bool>()) EXPECT_LE(step, b["step_time_s"].get<double>() * (1 + 1e-12)) << b.dump();
    if (b["name"] != "data-parallel") continue;
    seen = true;
    EXPECT_EQ(b["shard_update"], "x");
    EXPECT_TRUE(b["estimated"].get<bool>());
    EXPECT_NEAR(b["step_time_s"].get<double>(), zero["simulated"]["step_time_s"].get<double>(),
                1e-9 * zero["simulated"]["step_time_s"].get<double>());
    EXPECT_EQ(b["peak_memory_bytes"], zero["simulated"]["memory"]["peak_bytes"]);
  }
  EXPECT_TRUE(seen);
}

TEST(AutoConstraints, TheSidecarsAnnotationsAreKept) {
  fs::path d = scratch("auto_constraints");
  fs::path f = d / "c.sharding.json";
  std::ofstream(f) << "{\"mesh\": {\"shape\": [2, 2], \"axes\": [\"data\", \"model\"]}, \"tensors\": "
                      "{\"input_ids\": [\"model\", null]}}\n";
  CmdResult p = cli("partition testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto --shardings " + f.string() + " -o " +
                        (d / "out").string(),
                    "auto_cons");
  ASSERT_EQ(p.code, 0) << p.out << p.err;
  nlohmann::json sh = read_json(d / "out" / "shardings.json");
  EXPECT_EQ(sh["tensors"]["input_ids"], nlohmann::json::parse("[\"model\", null]")) << sh["tensors"].dump();
  const nlohmann::json report = read_json(d / "out" / "report.json");  // alive while the loop reads it
  ASSERT_FALSE(report["auto"]["choices"].empty());
  for (const auto& c : report["auto"]["choices"])
    for (const auto& v : c["values"]) EXPECT_NE(v.get<std::string>(), "input_ids");
}

// Under a sharding file the seeds are named by what they are (issue 31): the plan with nothing else annotated is
// "annotations only", and the data-parallel seeds, whose only move (the batch over every axis) the file already
// makes, say they are that same plan instead of repeating its numbers under another name.
TEST(AutoConstraints, BaselinesAreNamedByWhatTheyAreUnderTheAnnotations) {
  const fs::path d = scratch("auto_names");
  CmdResult r =
      cli("simulate testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto --shardings "
          "testdata/gpt/gpt.dp.sharding.json --report " +
              (d / "r.json").string(),
          "auto_names");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json b = read_json(d / "r.json")["auto"]["baselines"];
  ASSERT_GE(b.size(), 2u);
  EXPECT_EQ(b[0]["name"], "annotations only");
  EXPECT_FALSE(b[0].contains("same_as"));
  EXPECT_EQ(b[1]["name"], "data-parallel");
  EXPECT_EQ(b[1]["same_as"], "annotations only");
  EXPECT_NE(r.out.find("\n  data-parallel      the same plan as annotations only\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("  replicated "), std::string::npos) << r.out;
  // Without annotations the first seed is the replicated plan, and no seed is another's.
  r = cli("simulate testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto --report " + (d / "free.json").string(),
          "auto_names_free");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json f = read_json(d / "free.json")["auto"]["baselines"];
  EXPECT_EQ(f[0]["name"], "replicated");
  EXPECT_FALSE(f[1].contains("same_as"));
}

TEST(AutoExplain, ShowsTheBaselinesNextToTheChosenPlan) {
  CmdResult r = cli("explain testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto", "auto_explain");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--auto searched "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  auto           step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  data-parallel  step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  megatron+data  step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("    not chosen: its step is "), std::string::npos) << r.out;
}

// --memory-limit takes bytes with a unit, as a user writes them (issue 31): powers of 1024 (KiB, MiB, GiB, TiB) or
// of 1000 (kB, MB, GB, TB), or a plain number (8.5e9).
TEST(AutoMemory, LimitTakesUnits) {
  const fs::path d = scratch("auto_limit_units");
  for (const auto& [text, bytes] : std::vector<std::pair<std::string, int64_t>>{{"16GiB", int64_t{16} << 30},
                                                                                {"512MiB", int64_t{512} << 20},
                                                                                {"8.5e9", 8500000000},
                                                                                {"12GB", 12000000000},
                                                                                {"1.5TiB", int64_t{3} << 39},
                                                                                {"4096", 4096}}) {
    CmdResult r = cli("simulate testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto --memory-limit " + text + " --report " +
                          (d / "r.json").string(),
                      "auto_limit_units");
    if (bytes >= 1000000) {
      ASSERT_EQ(r.code, 0) << text << r.err;
      EXPECT_EQ(read_json(d / "r.json")["auto"]["memory_limit_bytes"], bytes) << text;
    } else {  // too small for any plan: the error names the limit in bytes
      EXPECT_EQ(r.code, 2);
      EXPECT_TRUE(r.err.starts_with("error: --auto: no sharding plan fits in 4096 bytes per device")) << r.err;
    }
  }
}

TEST(AutoErrors, ExactMessages) {
  const std::string gpt = "simulate testdata/gpt/gpt_opset17.onnx --mesh 2x2 ";
  const std::string like = " is not a positive number of bytes (like 17179869184, 8.5e9, 512MiB or 16GiB)\n";
  CmdResult a = cli(gpt + "--auto --memory-limit 0", "auto_err_zero");
  EXPECT_EQ(a.code, 2);
  EXPECT_EQ(a.err, "error: --memory-limit: '0'" + like);
  for (const std::string bad : {"12XB", "GiB", "16 GiB", "-1GiB", "nan", "1e30"}) {
    CmdResult b = cli(gpt + "--auto --memory-limit '" + bad + "'", "auto_err_text");
    EXPECT_EQ(b.code, 2);
    EXPECT_EQ(b.err, "error: --memory-limit: '" + bad + "'" + like);
  }
  CmdResult c = cli(gpt + "--memory-limit 1000000", "auto_err_noauto");
  EXPECT_EQ(c.code, 2);
  EXPECT_EQ(c.err, "error: --memory-limit: only used with --auto\n");
  CmdResult d = cli(gpt + "--auto --memory-limit 1000", "auto_err_nofit");
  EXPECT_EQ(d.code, 2);
  EXPECT_EQ(d.err.rfind("error: --auto: no sharding plan fits in 1000 bytes per device; the best plan found needs ", 0),
            0u)
      << d.err;
  // It names the classical plan the closest plan was searched from.
  EXPECT_TRUE(d.err.ends_with(" bytes per device (searched from the hybrid plan)\n")) << d.err;
  EXPECT_EQ(d.out, "");
}

}  // namespace

namespace {

using namespace e2e;

// The GSPMD paper's scale (issue 30): 128B on 512 TPU v3 cores and GPT-3 175B on 2048, bfloat16, weights as inputs,
// forward and training step, given only the mesh. --auto's plan fits in a v3 core's 16 GiB and is no slower than the
// hand-written 2D plan (the training step's under its fastest --remat policy that fits); the layers are costed once.
// bench/auto_pod.py prints the same rows with the search times.
TEST(AutoPod, PaperModelsFitAndAreNoSlowerThanThe2DPlan) {
  const nlohmann::json rows = bench_rows("auto_pod.py", "", "auto_pod");
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    SCOPED_TRACE(row.dump());
    EXPECT_TRUE(row["fits"].get<bool>());
    EXPECT_LE(row["auto_peak_bytes"].get<int64_t>(), int64_t{16} << 30);
    EXPECT_LE(row["ratio"].get<double>(), 1 + 1e-9);
    EXPECT_EQ(row["layer_blocks"].get<int64_t>(), row["model"] == "128B" ? 64 : 96);
    if (row["step"] == "training") {
      EXPECT_TRUE(row["hand_peak_bytes"].get<int64_t>() <= int64_t{16} << 30);
      EXPECT_NE(row["auto_remat"].get<std::string>(), "");
    }
  }
}

}  // namespace
