// `--pipeline AXIS` end to end (docs/pipeline.md): run --check is exact against the model as loaded, for the bundled
// GPT and BERT, GPipe and circular, 4 and 16 devices, and a decoder whose layer count does not divide by the
// stages; the report's pipeline section; and the one-line refusals.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/e2e/e2e_util.h"

namespace gspmd {
namespace {

using e2e::cli;
using e2e::CmdResult;
using e2e::count_collectives;
using e2e::read_json;
using e2e::scratch;
namespace fs = std::filesystem;

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
    EXPECT_EQ(p["prefix_and_suffix"], "replicated over stage");
    EXPECT_EQ(count_collectives(j, "collective-permute"), 5);  // one shift per iteration
    // The model's FLOPs, not the pipelined graph's (which also computes the bubble).
    EXPECT_NEAR(j["model_flops"].get<double>(), 5.11e8, 0.01e8);
  }
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
    EXPECT_EQ(count_collectives(j, "collective-permute"), 7);
  }
}

TEST(PipelineCli, BertAndADecoderWhoseLayersDoNotDivideAreExact) {
  const fs::path d = scratch("pipeline_cli_misc");
  const nlohmann::json bert = run_checked(
      "testdata/bert/bert_opset17.onnx --mesh 2x2 --shardings testdata/bert/bert.pipeline.sharding.json "
      "--pipeline stage",
      d, "bert");
  EXPECT_EQ(bert["pipeline"]["microbatches"], 2);  // default: one per stage
  // BERT's attention mask is computed from an input: it travels with the state, one more shift per iteration.
  EXPECT_EQ(count_collectives(bert, "collective-permute"), 6);
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

TEST(PipelineCli, RefusalsAreOneLine) {
  struct Case {
    std::string args, error;
  };
  const std::string gpt = "testdata/gpt/gpt_opset17.onnx --mesh 2x2 ";
  const fs::path d = scratch("pipeline_cli_refusals");
  const fs::path inside = d / "inside.sharding.json", differ = d / "differ.sharding.json";
  std::ofstream(inside) << R"({"mesh": {"shape": [2, 2], "axes": ["x", "y"]},
    "tensors": {"/h.1/attn/Softmax_output_0": [null, "y", null, null]}})";
  std::ofstream(differ) << R"({"mesh": {"shape": [2, 2], "axes": ["x", "y"]},
    "tensors": {"h.0.attn.q.weight": [null, "y"], "h.1.attn.q.weight": ["y", null]}})";
  const std::vector<Case> cases = {
      {gpt + "--pipeline pipe", "error: --pipeline: 'pipe' is not an axis of the mesh {x=2, y=2}\n"},
      {gpt + "--pipeline x --microbatches 3",
       "error: --microbatches: the batch 8 (dim 0 of '/Add_output_0', the stream entering layer 0) does not divide "
       "into 3 microbatches\n"},
      {gpt + "--microbatches 2", "error: --microbatches: only used with --pipeline\n"},
      {gpt + "--pipeline x --schedule zigzag", "error: --schedule: 'zigzag' is not gpipe or circular\n"},
      {gpt + "--pipeline x --training",
       "error: --pipeline: --training through the pipeline is not supported yet; pipeline the forward graph\n"},
      {gpt + "--pipeline x --shardings " + inside.string(),
       "error: " + inside.string() +
           ": tensors.\"/h.1/attn/Softmax_output_0\": '/h.1/attn/Softmax_output_0' is inside the layer blocks, which "
           "--pipeline runs as one stacked layer per iteration: annotate the layer weights instead\n"},
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

}  // namespace
}  // namespace gspmd
