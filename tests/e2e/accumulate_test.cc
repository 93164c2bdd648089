// --accumulate K end to end (docs/training.md, "Gradient accumulation"): one step over K microbatches equals torch's
// step on the whole batch; the gradients' reductions over the data axis happen once per step (their partial sums are
// accumulated unreduced), the activations' per microbatch; the step's peak holds one microbatch's saved activations;
// bad flags are one-line errors.
#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>

#include "tests/e2e/e2e_util.h"

namespace e2e {
namespace {

const std::string kTrain = " --training --loss cross-entropy:labels";

std::string plan(const std::string& name) { return " --shardings testdata/gpt/gpt." + name + ".sharding.json"; }

/// torch_reference.py's GPT exported at batch 4 / k, with torch's step on all 4 rows (its inputs are those rows).
fs::path make_reference(const std::string& name, const std::string& args) {
  const fs::path d = scratch("accumulate_ref_" + name);
  const CmdResult r = sh(debian_python() + " testdata/training/torch_reference.py make " + d.string() + args,
                         "accumulate_ref_make_" + name);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return d;
}

/// Runs the step on d's inputs and compares its loss and updated weights with torch's.
void expect_torch_step(const fs::path& d, const std::string& args, const std::string& tag) {
  const fs::path out = d / ("out_" + tag);
  const CmdResult r = cli("run " + (d / "model.onnx").string() + kTrain + " --inputs " + (d / "inputs").string() +
                              " --outputs " + out.string() + args,
                          "accumulate_run_" + tag);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const CmdResult c =
      sh(debian_python() + " testdata/training/torch_reference.py compare " + d.string() + " " + out.string(),
         "accumulate_cmp_" + tag);
  EXPECT_EQ(c.code, 0) << c.out << c.err;
  EXPECT_NE(c.out.find("within 0.0001"), std::string::npos) << c.out;
}

TEST(Accumulate, MicrobatchStepsEqualTorchsWholeBatchStep) {
  // Adam under Megatron: the model at batch 2, two microbatches of the 4 rows torch trains on at once.
  const fs::path adam = make_reference("adam", " --opset 17 --fold --optimizer adam --lr 0.01 --accumulate 2");
  expect_torch_step(adam, " --mesh 2x2" + plan("megatron") + " --optimizer adam --lr 0.01 --accumulate 2", "adam");
  // SGD (the implied gradient is compared) under the 2D plan on 16 devices with recompute: four microbatches of 1.
  const fs::path sgd = make_reference("sgd", " --opset 13 --accumulate 4");
  expect_torch_step(sgd, " --mesh 4x4" + plan("2d") + " --lr 1 --remat full --accumulate 4", "sgd_2d");
}

/// (kind, axes as JSON) -> count, over a report's collectives.
std::map<std::pair<std::string, std::string>, int> counts(const nlohmann::json& report) {
  std::map<std::pair<std::string, std::string>, int> n;
  for (const auto& c : report["collectives"]) n[{c["kind"], c["axes"].dump()}] += c["count"].get<int>();
  return n;
}

/// run --check of the bundled GPT's step under `shardings` with --accumulate k (its report in `dir`); returns the
/// collective counts.
std::map<std::pair<std::string, std::string>, int> checked_counts(const std::string& shardings, int k,
                                                                  const fs::path& dir, const std::string& tag) {
  const fs::path rep = dir / fmt::format("{}_{}.json", tag, k);
  const CmdResult r = cli("run testdata/gpt/gpt_opset17.onnx --shardings " + shardings + kTrain +
                              fmt::format(" --accumulate {} --check --report ", k) + rep.string(),
                          fmt::format("accumulate_counts_{}_{}", tag, k));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  if (r.code != 0) return {};
  const nlohmann::json j = read_json(rep);
  EXPECT_TRUE(j["check"]["passed"].get<bool>());
  return counts(j);
}

// Megatron on 2x2: each of the 37 weights' gradients (and the loss) is all-reduced over data once per step, with or
// without accumulation (the microbatches' gradients are partial sums over data, added before the one reduction);
// the model axis's all-reduces of the activations (forward and backward) happen once per microbatch.
TEST(Accumulate, GradientsAreReducedOncePerStepActivationsPerMicrobatch) {
  const fs::path d = scratch("accumulate_counts_megatron");
  const std::string megatron = "testdata/gpt/gpt.megatron.sharding.json";
  auto one = checked_counts(megatron, 1, d, "megatron"), two = checked_counts(megatron, 2, d, "megatron");
  const std::pair<std::string, std::string> data{"all-reduce", R"(["data"])"}, model{"all-reduce", R"(["model"])"};
  EXPECT_EQ(one[data], 38);
  EXPECT_EQ(two[data], 38);
  EXPECT_EQ(one[model], 17);
  EXPECT_EQ(two[model], 34);
  EXPECT_EQ(two.size(), 2u);
}

// FSDP over 4 devices (the 12 layer matrices split over data, the batch too): every microbatch gathers each matrix
// for its forward pass and again for its backward pass, and reduce-scatters its gradient into the matrix's shards,
// where it is accumulated (a full-size partial sum would hold the whole gradient); the replicated weights (biases,
// LayerNorms, the embeddings) and the loss are all-reduced once per step.
TEST(Accumulate, FsdpGathersAndReduceScattersPerMicrobatch) {
  const fs::path d = scratch("accumulate_counts_fsdp");
  std::ofstream(d / "fsdp.json")
      << R"({"mesh": {"shape": [4], "axes": ["data"]}, "tensors": {"input_ids": ["data", null]},
      "rules": [{"match": "\\.(q|k|v|proj|fc_in|fc_out)\\.weight$", "spec": ["data", null]}]})";
  const std::string fsdp = (d / "fsdp.json").string();
  auto one = checked_counts(fsdp, 1, d, "fsdp"), three = checked_counts(fsdp, 3, d, "fsdp");
  const std::pair<std::string, std::string> gather{"all-gather", R"(["data"])"},
      scatter{"reduce-scatter", R"(["data"])"}, reduce{"all-reduce", R"(["data"])"};
  EXPECT_EQ(one[gather], 24);
  EXPECT_EQ(three[gather], 3 * 24);
  EXPECT_EQ(one[scatter], 12);
  EXPECT_EQ(three[scatter], 3 * 12);
  EXPECT_EQ(one[reduce], 26);
  EXPECT_EQ(three[reduce], 26);
}

// A decoder step at batch 2 accumulated over 4 microbatches against the same step at batch 2 and at batch 8 (data
// parallel over 2 devices, Adam): the accumulated step's peak holds one microbatch's saved activations (as the batch-2
// step, a quarter of the batch-8 step's), each weight's gradient counts once, and at the peak the gradients are the
// accumulator plus the gradients in flight of the microbatch at its peak.
TEST(Accumulate, PeakHoldsOneMicrobatchsActivations) {
  const fs::path d = scratch("accumulate_memory");
  const std::string flags = "--layers 2 --d-model 64 --heads 4 --vocab 128 --seq 16 --weights random";
  for (int b : {2, 8})
    ASSERT_TRUE(fs::exists(make_decoder(d, fmt::format("b{}", b), flags + fmt::format(" --batch {}", b),
                                        fmt::format("accumulate_memory_make_{}", b))));
  std::ofstream(d / "dp.json") << R"({"mesh": {"shape": [2], "axes": ["data"]},
                                      "tensors": {"input_ids": ["data", null]}})";
  auto memory = [&](const std::string& model, const std::string& extra, const std::string& tag) {
    const fs::path rep = d / (tag + ".json");
    const CmdResult r = cli("simulate " + (d / model).string() + " --shardings " + (d / "dp.json").string() +
                                " --training --loss mean --optimizer adam --report " + rep.string() + extra,
                            "accumulate_memory_" + tag);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return read_json(rep)["simulated"]["memory"];
  };
  const nlohmann::json one = memory("b2.onnx", "", "one"), acc = memory("b2.onnx", " --accumulate 4", "acc"),
                       whole = memory("b8.onnx", "", "whole");
  const auto at = [](const nlohmann::json& m, const char* kind) { return m["at_peak"][kind].get<int64_t>(); };
  EXPECT_EQ(acc["total"]["gradients"], one["total"]["gradients"]);
  EXPECT_EQ(acc["total"]["optimizer_state"], one["total"]["optimizer_state"]);
  EXPECT_EQ(at(acc, "gradients"), one["total"]["gradients"].get<int64_t>() + at(one, "gradients"));
  // One microbatch's saved activations (and a few scalars: the microbatches' losses): not the whole batch's.
  EXPECT_GE(at(acc, "saved_activations"), at(one, "saved_activations"));
  EXPECT_LE(at(acc, "saved_activations"), at(one, "saved_activations") + 1024);
  EXPECT_GT(at(whole, "saved_activations"), 3 * at(acc, "saved_activations"));
  EXPECT_LT(acc["peak_bytes"].get<int64_t>(), whole["peak_bytes"].get<int64_t>());
}

// With the pipeline (each microbatch of the step runs the whole pipeline) and with --auto (which searches the
// accumulated step), run --check is exact.
TEST(Accumulate, PipelineAndAutoAreExact) {
  for (const std::string args :
       {" --mesh 2x2" + plan("pipeline") + " --pipeline stage --microbatches 2", std::string(" --mesh 2x2 --auto")}) {
    SCOPED_TRACE(args);
    const CmdResult r =
        cli("run testdata/gpt/gpt_opset17.onnx" + args + kTrain + " --accumulate 2 --check", "accumulate_pipeline");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  }
}

// --auto on an accumulated step costs the model cut to 1 and 2 layers with 2 and 3 microbatches and extrapolates to
// all of them: the Megatron baseline's estimate for 8 microbatches is the step that plan has, costed on the whole
// graph (its time within 0.1%, its peak within 1%).
TEST(Accumulate, AutoExtrapolatesOverMicrobatches) {
  const fs::path d = scratch("accumulate_auto");
  const fs::path model = make_decoder(
      d, "dec", "--layers 4 --d-model 64 --heads 4 --vocab 128 --batch 4 --seq 16 --weights random --mesh 2x2",
      "accumulate_auto_make");
  const std::string step = " --training --loss mean --optimizer adam --remat none";
  const fs::path auto_rep = d / "auto.json";
  const CmdResult a =
      cli("simulate " + model.string() + " --mesh 2x2 --auto" + step + " --accumulate 8 --report " + auto_rep.string(),
          "accumulate_auto");
  ASSERT_EQ(a.code, 0) << a.out << a.err;
  EXPECT_NE(a.out.find("costed on 1 and 2 of 4 alike layer blocks"), std::string::npos) << a.out;
  const nlohmann::json search = read_json(auto_rep);
  nlohmann::json megatron;
  for (const auto& b : search["auto"]["baselines"])
    if (b["name"] == "megatron+data") megatron = b;
  ASSERT_TRUE(megatron.is_object());
  ASSERT_TRUE(megatron["estimated"].get<bool>());
  ASSERT_EQ(megatron["remat"], "none");
  ASSERT_TRUE(megatron["shard_update"].is_null());
  const fs::path rep = d / "megatron.json";
  const CmdResult r = cli("simulate " + model.string() + " --shardings " + (d / "dec.megatron.sharding.json").string() +
                              step + " --accumulate 8 --report " + rep.string(),
                          "accumulate_auto_megatron");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json whole = read_json(rep)["simulated"];
  EXPECT_NEAR(megatron["step_time_s"].get<double>(), whole["step_time_s"].get<double>(),
              1e-3 * whole["step_time_s"].get<double>());
  EXPECT_NEAR(megatron["peak_memory_bytes"].get<double>(), whole["memory"]["peak_bytes"].get<double>(),
              1e-2 * whole["memory"]["peak_bytes"].get<double>());
}

TEST(Accumulate, BadFlagsAreOneLineErrors) {
  const std::string model = "simulate testdata/gpt/gpt_opset17.onnx --mesh 2x2" + plan("megatron");
  const std::pair<std::string, std::string> cases[] = {
      {" --accumulate 2", "error: --accumulate: only used with --training\n"},
      {kTrain + " --accumulate 0", "error: --accumulate: 0 is not a microbatch count from 1 to 256\n"},
      {kTrain + " --accumulate 257", "error: --accumulate: 257 is not a microbatch count from 1 to 256\n"},
  };
  for (const auto& [args, error] : cases) {
    const CmdResult r = cli(model + args, "accumulate_bad");
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err, error) << args;
  }
}

}  // namespace
}  // namespace e2e
