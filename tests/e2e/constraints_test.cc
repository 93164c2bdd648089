// Annotations are constraints (docs/partitioning.md, "Annotations are constraints"): over every sharding file of
// testdata/, every closed annotation appears unchanged in `partition`'s shardings.json; the GSPMD paper's 2D plan on
// the bundled GPT keeps its weights sharded on both axes, all-gathers them where they are used, and runs exact.
#include <gtest/gtest.h>

#include "cnn_export.h"
#include "core/ir/name_pattern.h"
#include "e2e_util.h"

using namespace e2e;

namespace {

/// One annotation or shardings.json entry, normalised: per dim the axis names, then the unreduced axes (sorted) and
/// the reduction.
std::string normal(const nlohmann::json& entry) {
  const nlohmann::json& spec = entry.is_object() ? entry.at("spec") : entry;
  std::string s = "[";
  for (const auto& d : spec) {
    s += "(";
    if (d.is_string()) s += d.get<std::string>();
    if (d.is_array())
      for (const auto& a : d) s += a.get<std::string>() + " ";
    s += ")";
  }
  s += "]";
  if (entry.is_object()) {
    std::vector<std::string> u;
    for (const char* key : {"unreduced", "partial"})
      if (entry.contains(key)) {
        if (entry[key].is_string()) u.push_back(entry[key]);
        for (const auto& a : entry[key].is_array() ? entry[key] : nlohmann::json::array()) u.push_back(a);
      }
    std::sort(u.begin(), u.end());
    if (!u.empty()) s += " unreduced " + nlohmann::json(u).dump() + " " + entry.value("reduction", "sum");
  }
  return s;
}

/// Every value `file` annotates (its `tensors`, then its `rules`, first match wins, over the values `written` lists)
/// has exactly that sharding in `written` (partition's shardings.json). Returns the mismatches, one per line.
std::string kept(const fs::path& file, const fs::path& written) {
  const nlohmann::json ann = read_json(file), out = read_json(written);
  std::string bad;
  auto check = [&](const std::string& name, const nlohmann::json& entry) {
    if (!out["tensors"].contains(name))
      bad += name + ": not in shardings.json\n";
    else if (normal(entry) != normal(out["tensors"][name]))
      bad += name + ": annotated " + entry.dump() + ", got " + out["tensors"][name].dump() + "\n";
  };
  for (const auto& [name, entry] : ann["tensors"].items()) check(name, entry);
  for (const auto& [name, entry] : out["tensors"].items()) {
    if (ann["tensors"].contains(name)) continue;
    for (const auto& rule : ann.value("rules", nlohmann::json::array()))
      if (gspmd::NamePattern(rule["match"].get<std::string>(), "rule").search(name)) {
        check(name, rule);
        break;
      }
  }
  return bad;
}

std::string mesh_of_file(const fs::path& file) {
  const nlohmann::json j = read_json(file);
  std::string m;
  for (const auto& n : j["mesh"]["shape"]) m += (m.empty() ? "" : "x") + std::to_string(n.get<int>());
  return m;
}

TEST(Constraints, EveryClosedAnnotationOfTestdataIsKeptInShardingsJson) {
  std::vector<std::pair<std::string, fs::path>> plans;  // (model, sharding file)
  for (const char* p : {"dp", "megatron", "2d", "paper2d"})
    plans.push_back(
        {"testdata/gpt/gpt_opset17.onnx", fs::path("testdata/gpt") / (std::string("gpt.") + p + ".sharding.json")});
  plans.push_back({"testdata/bert/bert_opset17.onnx", "testdata/bert/bert.megatron.sharding.json"});
  plans.push_back({"testdata/frontend/mlp_float16.onnx", "testdata/frontend/half_mlp.sharding.json"});
  plans.push_back({"testdata/frontend/if_sharded.onnx", "testdata/frontend/if_sharded.sharding.json"});
  for (const char* model : {"resnet18", "mobilenet_v2", "conv3x3"}) {
    const Export& e = exported(model);
    ASSERT_TRUE(e.error.empty()) << e.error;
    for (const auto& f : fs::directory_iterator(kCnnDir))
      if (f.path().filename().string().rfind(std::string(model) + ".", 0) == 0 && f.path().extension() == ".json")
        plans.push_back({(e.dir / (std::string(model) + ".onnx")).string(), f.path()});
  }
  ASSERT_EQ(plans.size(), 4u + 1u + 2u + 17u);  // every sharding file of testdata/
  for (const auto& [model, file] : plans) {
    const fs::path dir = scratch("constraints_" + file.stem().string());
    CmdResult r = cli("partition " + model + " --mesh " + mesh_of_file(file) + " --shardings " + file.string() +
                          " -o " + (dir / "out").string(),
                      "constraints_" + file.stem().string());
    ASSERT_EQ(r.code, 0) << file << "\n" << r.out << r.err;
    EXPECT_EQ(kept(file, dir / "out" / "shardings.json"), "") << file;
  }
}

TEST(Constraints, Gspmd2DPlanKeepsWeightsShardedAndGathersThemWhereUsed) {
  const fs::path dir = scratch("constraints_paper2d");
  const auto [r, rep] = cli_report(
      "run testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.paper2d.sharding.json "
      "--inputs testdata/gpt/test_data_set_0 --check",
      dir, "constraints_paper2d");
  ASSERT_FALSE(rep.is_null());
  EXPECT_TRUE(rep["check"]["passed"].get<bool>());
  // Per block: q, k, v, proj, fc_in, fc_out are held [data, model] (or [model, data]) and all-gathered over data
  // where used: the M side (128) whole, the other side split over model.
  std::map<std::string, int64_t> gathered;
  for (const auto& c : rep["collectives"])
    if (c["kind"] == "all-gather" && c["axes"] == nlohmann::json::array({"data"}))
      gathered[c["value"].get<std::string>()] = c["bytes"].get<int64_t>();
  std::map<std::string, int64_t> want;
  for (int l = 0; l < 2; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (const char* w : {"attn.q", "attn.k", "attn.v", "attn.proj"}) want[h + w + ".weight"] = 128 * 64 * 4;
    for (const char* w : {"mlp.fc_in", "mlp.fc_out"}) want[h + w + ".weight"] = 128 * 256 * 4;
  }
  EXPECT_EQ(gathered, want);
}

const std::string kPaper2D = "testdata/gpt/gpt.paper2d.sharding.json";

/// `explain` of the bundled GPT with the paper's 2D plan on 2x2, plus `args`.
CmdResult explain_paper2d(const std::string& args, const std::string& tag) {
  return cli("explain testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings " + kPaper2D + " " + args, tag);
}

TEST(Constraints, ExplainListsEveryAnnotationKeptOrReshardedWithItsCost) {
  CmdResult r = explain_paper2d("--constraints", "constraints_explain");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("22 annotations\n"), std::string::npos) << r.out;
  const std::string& file = kPaper2D;
  EXPECT_NE(r.out.find("input_ids [8,64]\n  annotated [data, null] (" + file +
                       ": tensors.\"input_ids\")\n  kept      as computed; no collective reshards it\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find("h.0.mlp.fc_in.weight [128,512]\n  annotated [data, model] (" + file +
                 ": tensors.\"h.0.mlp.fc_in.weight\")\n  resharded all-gather over {data}, 131072 bytes per device"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  cost      1 collective, "), std::string::npos) << r.out;
}

// An unreduced axis has an origin too: the node whose reduction over a dim split over the axis made the partial sum,
// with the annotation that split it; found through the ops that carry it partial (the loss, past the ReduceSum of
// the training step); "by no annotation" when the partitioner chose the operand's layout (the LM head's input).
TEST(Constraints, ExplainGivesEachUnreducedAxisItsReduction) {
  const std::string& file = kPaper2D;
  const std::string megatron_step =
      "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json --training "
      "--loss mean";
  auto expect_line = [](const CmdResult& r, const std::string& line) {
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("\n  unreduced " + line + "\n"), std::string::npos) << r.out;
  };
  expect_line(explain_paper2d("--value /h.0/attn/proj/MatMul_output_0", "constraints_explain_unreduced"),
              "model from /h.0/attn/proj/MatMul (MatMul), which reduces over dim 0 of 'h.0.attn.proj.weight', split "
              "over model by annotation h.0.attn.proj.weight (" +
                  file + ": tensors.\"h.0.attn.proj.weight\")");
  expect_line(explain_paper2d("--value logits", "constraints_explain_unreduced_logits"),
              "model from /lm_head/MatMul (MatMul), which reduces over dim 2 of '/ln_f/LayerNormalization_output_0', "
              "split over model (by no annotation: a layout the partitioner chose)");
  expect_line(cli("explain " + megatron_step + " --value loss", "constraints_explain_unreduced_loss"),
              "data from grad/step/ReduceSum_2 (ReduceSum), which reduces over dim 0 of 'logits', split over data by "
              "annotation input_ids (testdata/gpt/gpt.megatron.sharding.json: tensors.\"input_ids\")");
  // Every unreduced value of the step has its line.
  const CmdResult r = cli("explain " + megatron_step, "constraints_explain_unreduced_all");
  ASSERT_EQ(r.code, 0) << r.err;
  size_t partial = 0, explained = 0;
  for (size_t at = 0; (at = r.out.find(" unreduced={", at)) != std::string::npos; ++at) ++partial;
  for (size_t at = 0; (at = r.out.find("\n  unreduced ", at)) != std::string::npos; ++at) ++explained;
  EXPECT_GT(partial, 0u);
  EXPECT_EQ(explained, partial) << r.out;
}

// Shardy-style origins per mesh axis, and a 3-D value pictured as a 2-D slice over its split dims.
TEST(Constraints, ExplainGivesEachAxisItsAnnotationAndPicturesThreeDimensionalValues) {
  CmdResult r = explain_paper2d("--value /h.0/attn/q/MatMul_output_0", "constraints_explain_value");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string& file = kPaper2D;
  EXPECT_NE(r.out.find("  axes      data from annotation input_ids (" + file +
                       ": tensors.\"input_ids\"), model from annotation h.0.attn.q.weight (" + file +
                       ": tensors.\"h.0.attn.q.weight\")\n"
                       "dims 0 x 2\n"
                       "┌───┬───┐\n"
                       "│ 0 │ 1 │\n"
                       "├───┼───┤\n"
                       "│ 2 │ 3 │\n"
                       "└───┴───┘\n"),
            std::string::npos)
      << r.out;
}

}  // namespace

// torchvision's ViT exported without constant folding reaches each Linear's weight through a Transpose. The loader
// used to fold Transpose(weight) into a constant of another name, and the Megatron plan on the torch names failed:
// "no value named 'encoder.layers.encoder_layer_0.mlp.0.weight' in the model". An annotated weight is a constraint,
// so it now stays in the graph with its sharding: the MLP's second matmul is all-reduced over `model` once per layer,
// its output [4 over data 2, 17, 64] float32 = 8.5 KiB per device, and the run matches the unpartitioned model and
// torch.
TEST(Constraints, AnnotatedWeightsAreNotFoldedAway) {
  const Export& e = exported_for_training("vit");
  ASSERT_TRUE(e.error.empty()) << e.error;
  const fs::path d = scratch("constraints_vit");
  const std::string data = (e.dir / "test_data_set_0").string();
  const CmdResult r = cli("partition " + (e.dir / "vit.onnx").string() + " --mesh 2x2 --shardings " +
                              (e.dir / "megatron.plan.json").string() + " -o " + (d / "out").string(),
                          "constraints_vit_partition");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json sh = read_json(d / "out" / "shardings.json")["tensors"];
  for (int k = 0; k < 2; ++k) {
    const std::string p = "encoder.layers.encoder_layer_" + std::to_string(k) + ".mlp.";
    EXPECT_EQ(sh[p + "0.weight"], nlohmann::json::parse(R"(["model", null])")) << k;
    EXPECT_EQ(sh[p + "3.weight"], nlohmann::json::parse(R"([null, "model"])")) << k;
  }
  const auto [run, j] =
      cli_report("run " + (e.dir / "vit.onnx").string() + " --mesh 2x2 --shardings " +
                     (e.dir / "megatron.plan.json").string() + " --inputs " + data + " --expected " + data + " --check",
                 d, "constraints_vit_run");
  ASSERT_FALSE(j.is_null());
  EXPECT_TRUE(j["check"]["passed"].get<bool>());
  EXPECT_TRUE(j["expected"]["passed"].get<bool>());
  int reduced = 0;
  for (const auto& c : j["collectives"])
    if (c["kind"] == "all-reduce" && c["axes"] == nlohmann::json{"model"}) {
      ++reduced;
      EXPECT_EQ(c["bytes"], 2 * 17 * 64 * 4);
    }
  EXPECT_EQ(reduced, 2);
}
