// `--pipeline AXIS` end to end (docs/pipeline.md): run --check is exact against the model as loaded, for the bundled
// GPT and BERT, GPipe and circular, 4 and 16 devices, and a decoder whose layer count does not divide by the
// stages; the report's pipeline section; and the one-line refusals.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "tests/e2e/cnn_export.h"
#include "tests/e2e/e2e_util.h"

namespace gspmd {
namespace {

using e2e::cli;
using e2e::CmdResult;
using e2e::count_collectives;
using e2e::read_json;
using e2e::scratch;
namespace fs = std::filesystem;

/// make_decoder's `name` with `flags` in `d`, and its Megatron sidecar on a (stage, data, model) mesh of `shape`
/// written as d/pipe.json; returns the model's path.
fs::path decoder_with_stages(const fs::path& d, const std::string& name, const std::string& flags,
                             const std::vector<int>& shape) {
  const fs::path model = e2e::make_decoder(d, name, flags, "pipeline_cli_make_" + name);
  nlohmann::json side = read_json(d / (name + ".megatron.sharding.json"));
  side["mesh"] = {{"shape", shape}, {"axes", {"stage", "data", "model"}}};
  std::ofstream(d / "pipe.json") << side.dump();
  return model;
}

/// Runs `run --check --pipeline stage` and returns the report; the check must pass.
nlohmann::json run_checked(const std::string& args, const fs::path& dir, const std::string& tag) {
  const fs::path report = dir / (tag + ".json");
  const CmdResult r = cli("run " + args + " --check --report " + report.string(), tag);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.out << r.err;
  if (r.code != 0) return {};
  const nlohmann::json j = read_json(report);
  EXPECT_TRUE(j["check"]["passed"].get<bool>()) << args;
  return j;
}

/// (kind, axes as JSON, bytes) -> count, over a report's collectives.
using CollectiveCounts = std::map<std::tuple<std::string, std::string, int64_t>, int>;
CollectiveCounts collective_counts(const nlohmann::json& report) {
  CollectiveCounts n;
  for (const auto& c : report["collectives"])
    n[{c["kind"], c["axes"].dump(), c["bytes"].get<int64_t>()}] += c["count"].get<int>();
  return n;
}

TEST(PipelineCli, GptOnTwoStagesTimesMegatronIsExact) {
  const fs::path d = scratch("pipeline_cli_gpt");
  for (const std::string sched : {"gpipe", "circular"}) {
    SCOPED_TRACE(sched);
    const nlohmann::json j = run_checked(
        "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.pipeline.sharding.json "
        "--pipeline stage --microbatches 4 --schedule " +
            sched,
        d, "gpt4_" + sched);
    ASSERT_TRUE(j.contains("pipeline"));
    const auto& p = j["pipeline"];
    EXPECT_EQ(p["schedule"], sched);
    EXPECT_EQ(p["stages"], 2);
    EXPECT_EQ(p["microbatches"], 4);
    EXPECT_EQ(p["iterations"], 5);
    EXPECT_DOUBLE_EQ(p["bubble_fraction"].get<double>(), 0.2);  // (S-1)/(M+S-1)
    EXPECT_EQ(p["prefix_and_suffix"], "prefix replicated over stage, suffix with its batch split over stage");
    EXPECT_EQ(count_collectives(j, "collective-permute"), 4);  // one shift per iteration after the first
    // The model's FLOPs, not the pipelined graph's (which also computes the bubble).
    EXPECT_NEAR(j["model_flops"].get<double>(), 5.11e8, 0.01e8);
  }
}

// The report's prefix_and_suffix says how the plan runs them: a user annotation of the gathered results (the last
// layer's output) that keeps their batch whole makes the suffix run replicated over the stage axis.
TEST(PipelineCli, PrefixAndSuffixTextFollowsThePlan) {
  const fs::path d = scratch("pipeline_cli_suffix_text");
  nlohmann::json side = read_json("testdata/gpt/gpt.pipeline.sharding.json");
  side["tensors"]["/h.1/Add_1_output_0"] = {nullptr, nullptr, nullptr};
  std::ofstream(d / "p.json") << side.dump();
  const nlohmann::json j = run_checked(
      "testdata/gpt/gpt_opset17.onnx --shardings " + (d / "p.json").string() + " --pipeline stage --microbatches 2", d,
      "suffix_text");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["pipeline"]["prefix_and_suffix"],
            "prefix replicated over stage, suffix with its batch replicated over stage");
}

// partition --annotated-model with --pipeline writes the model (not its pipelined form) with each layer weight's
// sharding (its stacked weight's without the stage dim) and none inside the layers: read back with the same
// --pipeline, it gives the same program.
TEST(PipelineCli, AnnotatedModelReadsBackToTheSameProgram) {
  const fs::path d = scratch("pipeline_cli_annotated");
  const std::string pipe = " --mesh 2x2 --pipeline stage --microbatches 4 --schedule circular";
  const CmdResult w =
      cli("partition testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.pipeline.sharding.json" + pipe +
              " -o " + (d / "out").string() + " --annotated-model " + (d / "ann.onnx").string(),
          "pipeline_annotated_write");
  ASSERT_EQ(w.code, 0) << w.err;
  const nlohmann::json back = run_checked((d / "ann.onnx").string() + pipe, d, "annotated_back");
  const nlohmann::json first = read_json(d / "out" / "report.json");
  ASSERT_FALSE(back.empty());
  EXPECT_EQ(back["collectives"].size(), first["collectives"].size());
  EXPECT_EQ(count_collectives(back, "collective-permute"), count_collectives(first, "collective-permute"));
  EXPECT_EQ(count_collectives(back, "all-reduce"), count_collectives(first, "all-reduce"));
}

// An annotation inside the layers is a constraint (JAX's with_sharding_constraint) on every layer's copy: a replicated
// attention softmax in one layer holds in every stacked layer of every iteration. Megatron shards the heads over
// `model`, so each of the T = 5 iterations all-gathers its softmax over `model`: the local [1, 2, 2, 64, 64] float32
// becomes [1, 2, 4, 64, 64], 128 KiB. Without the annotation there is no all-gather. The annotated model (each layer's
// values with their copies' sharding) reads back to the same program.
TEST(PipelineCli, AnnotationInsideTheLayersIsAConstraint) {
  const fs::path d = scratch("pipeline_cli_inside");
  nlohmann::json side = read_json("testdata/gpt/gpt.pipeline.sharding.json");
  const std::string pipe = " --mesh 2x2 --pipeline stage --microbatches 4";
  const nlohmann::json plain = run_checked(
      "testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.pipeline.sharding.json" + pipe, d, "plain");
  EXPECT_EQ(count_collectives(plain, "all-gather"), 0);
  side["tensors"]["/h.1/attn/Softmax_output_0"] = {nullptr, nullptr, nullptr, nullptr};
  std::ofstream(d / "softmax.sharding.json") << side.dump();
  const std::string args = "testdata/gpt/gpt_opset17.onnx --shardings " + (d / "softmax.sharding.json").string() + pipe;
  const nlohmann::json j = run_checked(args, d, "softmax");
  ASSERT_FALSE(j.empty());
  int gathers = 0;
  for (const auto& c : j["collectives"])
    if (c["kind"] == "all-gather") {
      ++gathers;
      EXPECT_EQ(c["axes"], nlohmann::json::array({"model"}));
      EXPECT_EQ(c["bytes"], 2 * 4 * 64 * 64 * 4);
    }
  EXPECT_EQ(gathers, 5);
  EXPECT_EQ(count_collectives(j, "collective-permute"), count_collectives(plain, "collective-permute"));

  const CmdResult w =
      cli("partition " + args + " -o " + (d / "out").string() + " --annotated-model " + (d / "ann.onnx").string(),
          "pipeline_inside_partition");
  ASSERT_EQ(w.code, 0) << w.err;
  const nlohmann::json sh = read_json(d / "out" / "shardings.json")["tensors"];
  for (int t = 0; t < 5; ++t)
    EXPECT_EQ(sh[fmt::format("/h.0/attn/Softmax@t{}:0", t)],
              nlohmann::json::parse(R"(["stage", null, null, null, null])"))
        << t;
  const nlohmann::json back = run_checked((d / "ann.onnx").string() + pipe, d, "annotated_back");
  ASSERT_FALSE(back.empty());
  ASSERT_EQ(back["collectives"].size(), j["collectives"].size());
  for (size_t i = 0; i < j["collectives"].size(); ++i)
    for (const char* key : {"kind", "axes", "bytes", "value"})
      EXPECT_EQ(back["collectives"][i][key], j["collectives"][i][key]) << i << " " << key;
}

// GShard's MoE LM (testdata/corpus/gen_moe.py with 4 blocks: dense, MoE, dense, MoE; export_models.py --model moe4,
// G 4 groups of S 8 tokens, M 16, E 4 experts of capacity C 4): layer 1 differs from layer 0, and the layers' weight
// keys repeat every 2 layers, so each block holds a dense and an MoE layer (L = 2 blocks). On stage x expert (2x2),
// 2 microbatches of 2 groups, with GShard's expert plan in every MoE layer (the annotations of layers 1 and 3 agree),
// the collectives of T = M + S - 1 = 3 iterations are exactly:
// - per iteration, the dispatch and the combine all-to-all over `expert` of the local expert inputs / outputs
//   [1 stage, E 4, 1 group, C 4, M 16] float32 = 1 KiB (6);
// - the shifts after the first (which moves zeros): the local state [1, 1, 8, 16] float32 = 512 B (2);
// - the results [4, 8, 16], groups over `expert`, reduce-scattered over `stage` once for the head, whose groups are
//   split over `stage` too: [2, 8, 16] float32 = 1 KiB.
// The forward matches torch's outputs too, and the training step (SGD, GPipe; momentum, circular) the model's own.
// With only the groups and the experts' weights annotated, the state buffers start with the model's own plan of the
// stream (groups over `expert`), so the program is the same as with GShard's annotations.
TEST(PipelineCli, MixtureOfExpertsWithAlternatingLayersPipelinesExactly) {
  const e2e::Export& e = e2e::exported_for_training("moe4");
  ASSERT_TRUE(e.error.empty()) << e.error;
  const fs::path d = scratch("pipeline_cli_moe");
  nlohmann::json weights_only = read_json(e.dir / "stage_expert.plan.json");
  for (auto it = weights_only["tensors"].begin(); it != weights_only["tensors"].end();)
    it = it.key().front() == '/' ? weights_only["tensors"].erase(it) : std::next(it);
  ASSERT_EQ(weights_only["tensors"].size(), 5u);  // input_ids and the two MoE layers' wi and wo
  std::ofstream(d / "weights_only.plan.json") << weights_only.dump();
  const std::string model = (e.dir / "moe4.onnx").string() + " --mesh 2x2 --inputs " +
                            (e.dir / "test_data_set_0").string() + " --pipeline stage --microbatches 2 --shardings ";
  const std::string args = model + (e.dir / "stage_expert.plan.json").string();
  for (const auto& [sched, plan] : {std::pair<std::string, fs::path>{"gpipe", e.dir / "stage_expert.plan.json"},
                                    {"circular", e.dir / "stage_expert.plan.json"},
                                    {"gpipe", d / "weights_only.plan.json"}}) {
    SCOPED_TRACE(sched + " " + plan.string());
    const nlohmann::json j = run_checked(
        model + plan.string() + " --schedule " + sched + " --expected " + (e.dir / "test_data_set_0").string(), d,
        "moe_" + sched + "_" + plan.stem().string());
    ASSERT_FALSE(j.empty());
    EXPECT_TRUE(j["expected"]["passed"].get<bool>());
    EXPECT_EQ(j["pipeline"]["layers"], 2);
    EXPECT_EQ(j["pipeline"]["layers_per_block"], 2);
    EXPECT_EQ(j["pipeline"]["stage_layers"], nlohmann::json::parse("[[0], [2]]"));
    const CollectiveCounts want = {{{"all-to-all", R"(["expert"])", 1024}, 6},
                                   {{"collective-permute", R"(["stage"])", 512}, 2},
                                   {{"reduce-scatter", R"(["stage"])", 1024}, 1}};
    EXPECT_EQ(collective_counts(j), want);
  }
  run_checked(args + " --training --loss mean", d, "moe_train_gpipe");
  run_checked(args + " --training --loss mean --optimizer momentum --schedule circular", d, "moe_train_circular");
}

// torchvision's VisionTransformer (export_models.py --model vit: 2 encoder layers, batch 4, 17 tokens of 64), its
// layers found by their weights' names (encoder.layers.encoder_layer_#), on stage x model with its Megatron plan
// inside each stage: exact against the unpartitioned model and torch, with the shifts of T = 3 iterations (2 that
// move data: the local state [1, 2, 17, 64] float32 = 8.5 KiB), one Megatron all-reduce per iteration, and the
// results [4, 17, 64] reduce-scattered over `stage` by their microbatch rows as each of the 2 leaves the last
// stage (the head's batch is split over `stage`).
TEST(PipelineCli, TorchvisionVitPipelinesExactly) {
  const e2e::Export& e = e2e::exported_for_training("vit");
  ASSERT_TRUE(e.error.empty()) << e.error;
  const fs::path d = scratch("pipeline_cli_vit");
  nlohmann::json plan = read_json(e.dir / "megatron.plan.json");
  plan["mesh"]["axes"] = {"stage", "model"};
  plan["tensors"].erase("input");
  std::ofstream(d / "stage_model.plan.json") << plan.dump();
  const std::string data = (e.dir / "test_data_set_0").string();
  const nlohmann::json j =
      run_checked((e.dir / "vit.onnx").string() + " --mesh 2x2 --shardings " + (d / "stage_model.plan.json").string() +
                      " --inputs " + data + " --expected " + data + " --pipeline stage --microbatches 2",
                  d, "vit");
  ASSERT_FALSE(j.empty());
  EXPECT_TRUE(j["expected"]["passed"].get<bool>());
  const CollectiveCounts want = {{{"collective-permute", R"(["stage"])", 2 * 17 * 64 * 4}, 2},
                                 {{"all-reduce", R"(["model"])", 2 * 17 * 64 * 4}, 3},
                                 {{"reduce-scatter", R"(["stage"])", 2 * 17 * 64 * 4}, 2}};
  EXPECT_EQ(collective_counts(j), want);
}

// --trace: beside each device's ops, a track of its stage with one span per iteration: the microbatch and layers it
// computes, or the bubble.
TEST(PipelineCli, TraceShowsEachStagesIterations) {
  const fs::path d = scratch("pipeline_cli_trace");
  const CmdResult r =
      cli("simulate testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings "
          "testdata/gpt/gpt.pipeline.sharding.json --pipeline stage --microbatches 4 --trace " +
              (d / "t.json").string(),
          "pipeline_trace");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json t = read_json(d / "t.json");
  std::map<int64_t, std::string> tracks;                   // tid -> name
  std::map<int64_t, std::vector<std::string>> iterations;  // tid -> span names in order
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"].get<int64_t>()] = e["args"]["name"];
    if (e["ph"] == "X" && e["cat"] == "pipeline") iterations[e["tid"].get<int64_t>()].push_back(e["name"]);
  }
  // One track for the devices' program, then one per stage: mesh 2x2 (stage, model), devices 2 and 3 are stage 1.
  EXPECT_EQ(tracks, (std::map<int64_t, std::string>{
                        {0, "devices 0..3"}, {1, "stage 0: devices 0..1"}, {2, "stage 1: devices 2..3"}}));
  EXPECT_EQ(iterations[1], (std::vector<std::string>{"t0: microbatch 0, layer 0", "t1: microbatch 1, layer 0",
                                                     "t2: microbatch 2, layer 0", "t3: microbatch 3, layer 0",
                                                     "t4: bubble", "t5: the last results leave"}));
  EXPECT_EQ(iterations[2], (std::vector<std::string>{"t0: bubble", "t1: microbatch 0, layer 1",
                                                     "t2: microbatch 1, layer 1", "t3: microbatch 2, layer 1",
                                                     "t4: microbatch 3, layer 1", "t5: the last results leave"}));
}

TEST(PipelineCli, GptOnFourStagesTimesDataTimesModelIsExact) {
  const fs::path d = scratch("pipeline_cli_gpt16");
  for (const std::string sched : {"gpipe", "circular"}) {
    const nlohmann::json j = run_checked(
        "testdata/gpt/gpt_opset17.onnx --mesh 4x2x2 --shardings testdata/gpt/gpt.pipeline3d.sharding.json "
        "--pipeline stage --microbatches 4 --schedule " +
            sched,
        d, "gpt16_" + sched);
    EXPECT_EQ(j["devices"], 16);
    EXPECT_EQ(j["pipeline"]["padding_slots"], 2);  // 2 layers on 4 stages
    EXPECT_EQ(count_collectives(j, "collective-permute"), 6);
  }
}

// Every stage busy: an 8-layer decoder on 4 stages x data 2 x Megatron 2 (its Megatron sidecar with a stage axis
// added), GPipe (2 layers per stage) and circular (2 rounds); the microbatches are split over data.
TEST(PipelineCli, DecoderOnFourStagesTimesDataTimesModelIsExact) {
  const fs::path d = scratch("pipeline_cli_dec16");
  const fs::path dec = decoder_with_stages(
      d, "d8", "--layers 8 --d-model 32 --heads 4 --vocab 64 --batch 8 --seq 8 --weights random", {4, 2, 2});
  for (const std::string sched : {"gpipe", "circular"}) {
    const nlohmann::json j = run_checked(dec.string() + " --mesh 4x2x2 --shardings " + (d / "pipe.json").string() +
                                             " --pipeline stage --microbatches 4 --schedule " + sched,
                                         d, "d8_" + sched);
    EXPECT_EQ(j["pipeline"]["padding_slots"], 0);
    EXPECT_EQ(j["pipeline"]["stage_layers"], sched == "gpipe" ? nlohmann::json::parse("[[0,1],[2,3],[4,5],[6,7]]")
                                                              : nlohmann::json::parse("[[0,4],[1,5],[2,6],[3,7]]"));
    // T - 1 shifts: GPipe T = M + S - 1 = 7; circular T = M*R + S - 1 = 11.
    EXPECT_EQ(count_collectives(j, "collective-permute"), sched == "gpipe" ? 6 : 10);
  }
}

// A bfloat16 decoder (as the paper's and bench/auto_gpus.py's models are): its stacked LayerNorms normalize with a
// unit scale of the model's type, then scale and shift by the stacked parameters, and the forward pass through four
// stages gives the unpartitioned model's output bit for bit.
TEST(PipelineCli, BFloat16DecoderPipelinesExactly) {
  const fs::path d = scratch("pipeline_cli_bf16");
  const fs::path dec = e2e::make_decoder(
      d, "b4", "--layers 4 --d-model 32 --heads 4 --vocab 64 --batch 8 --seq 8 --weights random --dtype bfloat16",
      "pipeline_cli_make_b4");
  const nlohmann::json j = run_checked(dec.string() + " --mesh 4 --pipeline x --microbatches 4", d, "b4_run");
  ASSERT_TRUE(j.contains("check"));
  EXPECT_EQ(j["check"]["max_abs_error"].get<double>(), 0);
  EXPECT_EQ(j["pipeline"]["stages"], 4);
}

// The GSPMD paper's models take their weights as graph inputs (a step's parameters). --pipeline stacks them into
// graph inputs of the stacked shape, each stage holding its own rows (the stage dim over 'stage'), in place of the
// per-layer inputs; run feeds the stacked inputs and --check gives the model each layer's row. The forward pass and
// the training step match the model. (run's pseudo-random inputs give the weights N(0, 1): logits of tens, which
// float32 rounding between any two plans moves by 1e-4, so the forward check takes atol 1e-3, as it would for
// Megatron on the same inputs.) --inputs, whose files hold the weights per layer, is refused.
TEST(PipelineCli, LayerWeightsThatAreGraphInputsAreStackedAsInputs) {
  const fs::path d = scratch("pipeline_cli_inputs");
  const fs::path dec = e2e::make_decoder(
      d, "in4", "--layers 4 --d-model 32 --heads 4 --vocab 64 --batch 8 --seq 8 --weights inputs", "pipe_make_in4");
  std::ofstream(d / "pipe.json") << R"({"mesh": {"shape": [2, 2], "axes": ["stage", "model"]}, "tensors": {}})";
  const std::string base = dec.string() + " --shardings " + (d / "pipe.json").string() + " --pipeline stage";
  const nlohmann::json fwd = run_checked(base + " --microbatches 4 --atol 1e-3", d, "in4_fwd");
  ASSERT_TRUE(fwd.contains("pipeline"));
  EXPECT_EQ(fwd["pipeline"]["stages"], 2);
  run_checked(base + " --microbatches 4 --training --loss mean --trainable '\\.(weight|bias)$'", d, "in4_train");

  const CmdResult part = cli("partition " + base + " --microbatches 4 -o " + (d / "out").string(), "in4_part");
  ASSERT_EQ(part.code, 0) << part.err;
  const nlohmann::json t = read_json(d / "out" / "shardings.json")["tensors"];
  EXPECT_FALSE(t.contains("h.0.attn.q.weight"));
  EXPECT_EQ(t["h.#.attn.q.weight@slot0"], nlohmann::json::parse(R"(["stage", null, null])"));
  EXPECT_EQ(t["h.#.mlp.fc_in.bias@slot1"], nlohmann::json::parse(R"(["stage", null])"));

  const CmdResult in = cli("run " + base + " --inputs " + d.string(), "in4_inputs");
  EXPECT_EQ(in.code, 2);
  EXPECT_EQ(in.err,
            "error: --inputs: --pipeline stacks the layer weights, which this model takes as graph inputs "
            "('h.0.ln_1.weight' ... into 'h.#.ln_1.weight@slot0'), so their files cannot be fed per layer; run "
            "without --inputs (pseudo-random inputs), or give the weights as initializers\n");
}

TEST(PipelineCli, BertAndADecoderWhoseLayersDoNotDivideAreExact) {
  const fs::path d = scratch("pipeline_cli_misc");
  const nlohmann::json bert = run_checked(
      "testdata/bert/bert_opset17.onnx --mesh 2x2 --shardings testdata/bert/bert.pipeline.sharding.json "
      "--pipeline stage",
      d, "bert");
  EXPECT_EQ(bert["pipeline"]["microbatches"], 2);  // default: the largest divisor of the batch up to the stages
  // BERT's attention mask is computed from an input: it travels with the state, one more shift per iteration.
  EXPECT_EQ(count_collectives(bert, "collective-permute"), 4);
  const fs::path dec = e2e::make_decoder(d, "d5",
                                         "--layers 5 --d-model 32 --heads 4 --vocab 64 --batch 4 --seq 8 "
                                         "--weights random --mesh 2x2",
                                         "pipeline_cli_make5");
  for (const std::string sched : {"gpipe", "circular"}) {
    const nlohmann::json j =
        run_checked(dec.string() + " --mesh 2x2 --pipeline x --microbatches 4 --schedule " + sched, d, "d5_" + sched);
    EXPECT_EQ(j["pipeline"]["padding_slots"], 1);
    if (sched == "circular") {  // explain says which layers each stage runs, and where prefix and suffix run
      const CmdResult e = cli(
          "explain " + dec.string() + " --mesh 2x2 --pipeline x --microbatches 4 --schedule " + sched, "d5_explain");
      ASSERT_EQ(e.code, 0) << e.err;
      EXPECT_NE(e.out.find("  stage 0 runs layers 0, 2, 4\n  stage 1 runs layers 1, 3, padding\n"), std::string::npos)
          << e.out;
      EXPECT_NE(e.out.find("run replicated over 'x'"), std::string::npos) << e.out;
    }
    EXPECT_EQ(j["pipeline"]["stage_layers"], sched == "gpipe" ? nlohmann::json::parse("[[0,1,2],[3,4,-1]]")
                                                              : nlohmann::json::parse("[[0,2,4],[1,3,-1]]"));
  }
}

// A training step through the pipeline: the backward pass runs through the same stages (each forward shift's
// gradient is a shift back), and --check compares the loss and every updated weight, a stacked weight row by row,
// with the model's own training step.
TEST(PipelineCli, TrainingStepsThroughThePipelineAreExact) {
  const fs::path d = scratch("pipeline_cli_training");
  for (const std::string sched : {"gpipe", "circular"}) {
    const nlohmann::json j = run_checked(
        "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.pipeline.sharding.json "
        "--pipeline stage --microbatches 4 --training --loss cross-entropy:labels --optimizer momentum --schedule " +
            sched,
        d, "gpt_train_" + sched);
    // T = 5: 4 shifts forward and their 4 mirror images backward (the first forward shift and the last backward one
    // move zeros: no data).
    EXPECT_EQ(count_collectives(j, "collective-permute"), 8);
    // --remat full keeps the states between the stacked layers (and the microbatches waiting to enter, and the
    // results that left) and recomputes the rest: fewer saved activations, the same result.
    const nlohmann::json rj = run_checked(
        "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.pipeline.sharding.json "
        "--pipeline stage --microbatches 4 --training --loss cross-entropy:labels --optimizer momentum --remat full "
        "--schedule " +
            sched,
        d, "gpt_train_remat_" + sched);
    const auto saved = [](const nlohmann::json& r) {
      return r["simulated"]["memory"]["total"]["saved_activations"].get<double>();
    };
    EXPECT_LT(saved(rj), 0.5 * saved(j));
    EXPECT_GT(rj["training"]["recomputed_nodes"].get<int>(), 0);
    EXPECT_NEAR(rj["model_flops"].get<double>(), j["model_flops"].get<double>(), 1e-6 * j["model_flops"].get<double>());
  }
  const fs::path dec = e2e::make_decoder(d, "d5",
                                         "--layers 5 --d-model 32 --heads 4 --vocab 64 --batch 4 --seq 8 "
                                         "--weights random",
                                         "pipeline_cli_train_make5");
  const nlohmann::json j = run_checked(dec.string() +
                                           " --mesh 2x2 --pipeline x --microbatches 4 --schedule circular --training "
                                           "--loss mean --optimizer momentum",
                                       d, "d5_train");
  EXPECT_EQ(j["pipeline"]["iterations"], 13);
  EXPECT_EQ(count_collectives(j, "collective-permute"), 24);
}

// --pipeline AXIS --auto without --microbatches: every divisor of the batch is costed, the fastest that fits is
// taken, and the program runs exactly.
TEST(PipelineCli, AutoChoosesTheFastestMicrobatchCount) {
  const fs::path d = scratch("pipeline_cli_auto");
  const nlohmann::json j = run_checked(
      "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.pipeline.sharding.json --pipeline stage "
      "--auto",
      d, "auto");
  const auto& tried = j["pipeline"]["auto_microbatches"];
  ASSERT_EQ(tried.size(), 4u);  // the batch 8: 1, 2, 4, 8
  int64_t best = 0;
  double fastest = 1e30;
  for (size_t k = 0; k < tried.size(); ++k) {
    EXPECT_EQ(tried[k]["microbatches"], int64_t{1} << k);
    EXPECT_TRUE(tried[k]["fits"].get<bool>());
    if (tried[k]["step_s"].get<double>() < fastest) {
      fastest = tried[k]["step_s"].get<double>();
      best = tried[k]["microbatches"].get<int64_t>();
    }
  }
  EXPECT_EQ(j["pipeline"]["microbatches"], best);
}

// GPT-3 175B shapes (96 layers, d_model 12288, batch 256, sequence 2048; weights absent) on stage 8 x data 16 x
// model 16 = 2048 devices, GPipe with 16 microbatches: the report gives the bubble, the memory per device and the
// step; the collectives are the shifts and Megatron's all-reduces inside the stages, counted by hand.
TEST(PipelineCli, Gpt3SizedDecoderOnStageDataModelOf2048Devices) {
  const fs::path d = scratch("pipeline_cli_gpt3");
  const fs::path model = decoder_with_stages(
      d, "gpt3", "--layers 96 --d-model 12288 --heads 96 --vocab 50257 --batch 256 --seq 2048 --weights absent",
      {8, 16, 16});
  const CmdResult r = cli("simulate " + model.string() + " --mesh 8x16x16 --shardings " + (d / "pipe.json").string() +
                              " --pipeline stage --microbatches 16 --report " + (d / "r.json").string(),
                          "pipeline_cli_gpt3");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = read_json(d / "r.json");
  EXPECT_EQ(j["devices"], 2048);
  EXPECT_EQ(j["pipeline"]["iterations"], 23);                                  // M + S - 1
  EXPECT_DOUBLE_EQ(j["pipeline"]["bubble_fraction"].get<double>(), 7.0 / 23);  // (S-1)/(M+S-1)
  EXPECT_EQ(j["pipeline"]["layers_per_iteration"], 12);
  // The local state [1, 16/16, 2048, 12288] float32 = 96 MiB per shift (22: not the first, which moves zeros); per
  // iteration 12 layers x Megatron's 2 all-reduces of a microbatch's activations (the same size); one reduce-scatter
  // over stage of the results [256/16, 2048, 12288] for the head, whose batch is split over stage too.
  std::map<std::string, std::pair<int, std::set<int64_t>>> by;
  for (const auto& c : j["collectives"]) {
    auto& e = by[c["kind"].get<std::string>() + " " + c["axes"].dump()];
    e.first += c["count"].get<int>();
    e.second.insert(c["bytes"].get<int64_t>());
  }
  const int64_t state = 2048LL * 12288 * 4;
  EXPECT_EQ(by, (std::map<std::string, std::pair<int, std::set<int64_t>>>{
                    {"collective-permute [\"stage\"]", {22, {state}}},
                    {"all-reduce [\"model\"]", {2 * 12 * 23, {state}}},
                    {"reduce-scatter [\"stage\"]", {1, {16 * state}}}}));
  // Memory per device: its stage's 12 layers' Megatron shards (the layers' 12 D^2 parameters each, / 8 / 16) plus
  // the replicated token and position embeddings (biases and norms: under 1%), and the in-flight activations.
  const double weights = j["simulated"]["memory"]["total"]["weights"].get<double>();
  EXPECT_NEAR(weights, (96.0 * 12 * 12288 * 12288 * 4) / 128 + (50257.0 + 2048) * 12288 * 4, 0.01 * weights);
  EXPECT_GT(j["simulated"]["per_device"][0]["peak_memory_bytes"].get<double>(), weights);
  EXPECT_GT(j["simulated"]["step_time_s"].get<double>(), 0);
  // The model's FLOPs, not the pipelined graph's.
  const double T = 256.0 * 2048, D = 12288, S = 2048, V = 50257;
  const double matmul = 96 * (2 * T * 12 * D * D + 4 * T * S * D) + 2 * T * D * V;
  EXPECT_GT(j["model_flops"].get<double>(), matmul);
  EXPECT_LT(j["model_flops"].get<double>(), 1.01 * matmul);
}

// Models no one here wrote: torch's own nn.TransformerEncoder and nn.Transformer, exported by torch
// (testdata/corpus/gen_transformers.py: unnamed "onnx::MatMul_N" weights, Gemm, sequence-first attention inside
// batch-first layers, opset 13's decomposed LayerNorm, cross-attention to the encoder's output). Pipelined with
// microbatches, they match torch's outputs and the unpartitioned run; a sequence-first encoder, whose stream does not
// lead with the batch, is refused.
TEST(PipelineCli, TorchTransformerModulesPipelineExactly) {
  const fs::path d = scratch("pipeline_cli_torch");
  const CmdResult gen = e2e::sh("GSPMD_CORPUS_CACHE=" + d.string() + " " + e2e::debian_python() +
                                    " testdata/corpus/gen_transformers.py --only "
                                    "encoder_bf_op13,encoder_sf_op17,transformer_bf_op17,decoder_causal_op17",
                                "pipeline_cli_torch_gen");
  ASSERT_EQ(gen.code, 0) << gen.out << gen.err;
  auto model = [&](const std::string& name) { return d / "models" / "transformers" / name; };
  auto args = [&](const std::string& name) {
    const fs::path m = model(name);
    return (m / "model.onnx").string() + " --mesh 2 --pipeline x --inputs " + (m / "test_data_set_0").string() +
           " --expected " + (m / "test_data_set_0").string();
  };
  for (const std::string sched : {"gpipe", "circular"})
    run_checked(args("encoder_bf_op13") + " --microbatches 2 --schedule " + sched, d, "encoder_bf_" + sched);
  run_checked(args("decoder_causal_op17") + " --microbatches 2", d, "decoder_causal");
  run_checked(args("transformer_bf_op17") + " --microbatches 2 --layers '^encoder\\.layers\\.(\\d+)\\.'", d,
              "transformer_encoder_layers");
  // nn.Transformer's decoder layers: their cross-attention reads the encoder's output (sequence-first, batch in dim 1),
  // which travels with the state as the microbatches do.
  run_checked(args("transformer_bf_op17") + " --microbatches 2 --layers '^decoder\\.layers\\.(\\d+)\\.'", d,
              "transformer_decoder_layers");
  run_checked(args("encoder_sf_op17") + " --microbatches 1", d, "encoder_sf_m1");
  const CmdResult sf = cli("run " + args("encoder_sf_op17") + " --microbatches 2", "pipeline_cli_torch_sf");
  EXPECT_EQ(sf.code, 2);
  EXPECT_EQ(sf.err,
            "error: --pipeline: node '/layers.0/self_attn/MatMul_1' (MatMul): combines values whose batch dims differ: "
            "microbatches need the batch dim (dim 0 of the stream entering the first layer) kept whole\n");
}

TEST(PipelineCli, RefusalsAreOneLine) {
  struct Case {
    std::string args, error;
  };
  const std::string gpt = "testdata/gpt/gpt_opset17.onnx --mesh 2x2 ";
  const fs::path d = scratch("pipeline_cli_refusals");
  const fs::path stage_inside = d / "stage_inside.sharding.json", stage_weight = d / "stage_weight.sharding.json",
                 inside_differ = d / "inside_differ.sharding.json", differ = d / "differ.sharding.json";
  std::ofstream(stage_inside) << R"({"mesh": {"shape": [2, 2], "axes": ["x", "y"]},
    "tensors": {"/h.1/attn/Softmax_output_0": [null, "x", null, null]}})";
  std::ofstream(stage_weight) << R"({"mesh": {"shape": [2, 2], "axes": ["x", "y"]},
    "tensors": {"h.0.attn.q.weight": ["x", null], "h.1.attn.q.weight": ["x", null]}})";
  std::ofstream(inside_differ) << R"({"mesh": {"shape": [2, 2], "axes": ["x", "y"]},
    "tensors": {"/h.0/attn/Softmax_output_0": [null, "y", null, null],
                "/h.1/attn/Softmax_output_0": [null, null, null, null]}})";
  std::ofstream(differ) << R"({"mesh": {"shape": [2, 2], "axes": ["x", "y"]},
    "tensors": {"h.0.attn.q.weight": [null, "y"], "h.1.attn.q.weight": ["y", null]}})";
  const std::vector<Case> cases = {
      {gpt + "--pipeline pipe", "error: --pipeline: 'pipe' is not an axis of the mesh {x=2, y=2}\n"},
      {gpt + "--pipeline x --microbatches 3",
       "error: --microbatches: the batch 8 (dim 0 of '/Add_output_0', the stream entering layer 0) does not divide "
       "into 3 microbatches\n"},
      {gpt + "--microbatches 2", "error: --microbatches: only used with --pipeline\n"},
      {gpt + "--pipeline x --schedule zigzag", "error: --schedule: 'zigzag' is not gpipe or circular\n"},
      {gpt + "--pipeline x --shardings " + stage_inside.string(),
       "error: " + stage_inside.string() +
           ": tensors.\"/h.1/attn/Softmax_output_0\": '/h.1/attn/Softmax_output_0' belongs to the layers, whose "
           "stacked copies have their stage dim over 'x' (--pipeline): it cannot be sharded over 'x' too\n"},
      {gpt + "--pipeline x --shardings " + stage_weight.string(),
       "error: " + stage_weight.string() +
           ": tensors.\"h.0.attn.q.weight\": 'h.0.attn.q.weight' belongs to the layers, whose stacked copies have "
           "their stage dim over 'x' (--pipeline): it cannot be sharded over 'x' too\n"},
      {gpt + "--pipeline x --shardings " + inside_differ.string(),
       "error: " + inside_differ.string() +
           ": tensors.\"/h.1/attn/Softmax_output_0\": '/h.0/attn/Softmax_output_0' and '/h.1/attn/Softmax_output_0' "
           "are the same value of two layers, which --pipeline runs as one stacked layer, but are annotated "
           "differently\n"},
      {gpt + "--pipeline x --shardings " + differ.string(),
       "error: --pipeline: 'h.0.attn.q.weight' and 'h.1.attn.q.weight' are stacked into 'h.#.attn.q.weight' but "
       "annotated differently\n"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const CmdResult r = cli("simulate " + cases[i].args, "pipeline_refusal_" + std::to_string(i));
    EXPECT_EQ(r.code, 2) << cases[i].args << "\n" << r.err;
    EXPECT_EQ(r.err, cases[i].error) << cases[i].args;
  }
}

// The stage axis as one more data axis outside the layers (what --pipeline auto gives the data inputs): a training
// step with the token ids' batch over [stage, x] (4-layer decoder, batch 8 in 2 microbatches of 4, stage 2 x x 2 x y 2)
// is exact, and the collectives say where each part runs: each entering microbatch [4, 16, 64] float32 (16 KiB) is
// gathered over {stage, x} for stage 0; the results reach the head in one reduce-scatter over stage; the mean loss is
// all-reduced over {stage, x}; each stage's own layer gradients (2 slots x 16 weights) are all-reduced over x only,
// never over stage.
TEST(PipelineCli, DataInputsSplitOverTheStageAxisTooAreExact) {
  const fs::path d = scratch("pipeline_cli_stage_data");
  const fs::path dec = e2e::make_decoder(
      d, "st4", "--layers 4 --d-model 64 --heads 4 --vocab 128 --batch 8 --seq 16 --weights inputs", "stage_data_make");
  std::ofstream(d / "p.json") << R"({"mesh": {"axes": ["stage", "x", "y"], "shape": [2, 2, 2]},
                                     "tensors": {"input_ids": [["stage", "x"], null]}})";
  const nlohmann::json j = run_checked(dec.string() + " --shardings " + (d / "p.json").string() +
                                           " --pipeline stage --microbatches 2 --training --trainable "
                                           "'\\.(weight|bias)$' --loss mean",
                                       d, "stage_data");
  ASSERT_FALSE(j.empty());
  std::map<std::string, int> layer_grads;  // axes -> all-reduces of a stacked layer weight's gradient
  std::vector<std::string> results;        // the collectives of the gathered results ('h.last', by its name)
  for (const auto& c : j["collectives"]) {
    const std::string value = c["value"].get<std::string>();
    if (c["kind"] == "all-reduce" && value.starts_with("h.#.") && value.ends_with(".grad"))
      layer_grads[c["axes"].dump()] += c["count"].get<int>();
    if (value.starts_with("h.last/"))
      results.push_back(fmt::format("{} {} {}", c["kind"].get<std::string>(), c["axes"].dump(), c["bytes"].dump()));
  }
  EXPECT_EQ(layer_grads, (std::map<std::string, int>{{R"(["x"])", 32}}));
  EXPECT_EQ(results, std::vector<std::string>{R"(reduce-scatter ["stage"] 16384)"});  // [8, 16, 64] float32 / 2
  EXPECT_EQ(j["pipeline"]["prefix_and_suffix"], "prefix split over stage, suffix with its batch split over stage");
  const CollectiveCounts counts = collective_counts(j);
  auto count = [&](const char* kind, const char* axes, int64_t bytes) {
    auto it = counts.find({kind, axes, bytes});
    return it == counts.end() ? 0 : it->second;
  };
  EXPECT_EQ(count("all-gather", R"(["stage","x"])", 4 * 16 * 64 * 4), 2);
  EXPECT_EQ(count("all-reduce", R"(["stage","x"])", 4), 1);
}

}  // namespace
}  // namespace gspmd
