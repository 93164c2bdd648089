// gspmd-onnx inspect (docs/cli.md, "inspect") on a model torch exported as a user would (testdata/tools/
// export_tutorial_mlp.py: renamed weights, a dynamic batch): the table's module paths, filters and symbolic dims;
// the starter files of --template, which run and check; the rule report of --shardings; its errors, exactly.
#include <gtest/gtest.h>

#include <fstream>

#include "cnn_export.h"
#include "core/ir/name_pattern.h"

namespace {

using namespace e2e;

const fs::path& mlp() { return tutorial_mlp(); }

/// The table's row of `name` ("" when absent).
std::string row(const std::string& out, const std::string& name) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(name + " ")) return line;
  return "";
}

TEST(Inspect, ModulePathFromTorchScopes) {
  EXPECT_EQ(gspmd::torch_module_path("/h.0/attn/q/MatMul"), "h.0.attn.q");
  EXPECT_EQ(gspmd::torch_module_path("/blocks/blocks.1/fc_in/MatMul"), "blocks.1.fc_in");  // a Sequential's child
  EXPECT_EQ(gspmd::torch_module_path("/blocks/blocks.1/Erf"), "blocks.1");
  EXPECT_EQ(gspmd::torch_module_path("/MatMul"), "");
  EXPECT_EQ(gspmd::torch_module_path("MatMul_3"), "");
  EXPECT_EQ(gspmd::torch_module_path(""), "");
}

// torch renamed the Linear weights (onnx::MatMul_N): the table gives each its module, --match finds them by it, and
// --weights leaves the activations out. The footer counts one block's parameters: 64x256 + 256 + 256x64 + 64.
TEST(Inspect, ListsRenamedWeightsWithTheirModules) {
  const CmdResult r = cli("inspect " + mlp().string() + " --weights --match 'blocks\\.1\\.'", "inspect_weights");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("name ")) << r.out;
  EXPECT_NE(r.out.find("\n4 values, 4 weights (33088 parameters, 132352 bytes)\n"), std::string::npos) << r.out;
  int renamed = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("onnx::MatMul_")) continue;
    ++renamed;
    const bool fc_in = line.find(" [64,256] ") != std::string::npos && line.ends_with(" blocks.1.fc_in");
    const bool fc_out = line.find(" [256,64] ") != std::string::npos && line.ends_with(" blocks.1.fc_out");
    EXPECT_TRUE(fc_in || fc_out) << line;
    EXPECT_NE(line.find(" float32 "), std::string::npos) << line;
    EXPECT_NE(line.find(" weight "), std::string::npos) << line;
  }
  EXPECT_EQ(renamed, 2) << r.out;
  EXPECT_NE(row(r.out, "blocks.1.fc_in.bias").find(" [256] "), std::string::npos) << r.out;
}

// The dynamic batch shows by name; inputs and outputs say so, with their producer op.
TEST(Inspect, ShowsSymbolicDimsAndKinds) {
  const CmdResult r = cli("inspect " + mlp().string() + " --match '^(x|y)$'", "inspect_kinds");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string x = row(r.out, "x"), y = row(r.out, "y");
  EXPECT_NE(x.find(" [batch,16,64] "), std::string::npos) << r.out;
  EXPECT_NE(x.find(" input "), std::string::npos) << r.out;
  EXPECT_NE(y.find(" [batch,16,10] "), std::string::npos) << r.out;
  EXPECT_NE(y.find(" output "), std::string::npos) << r.out;
  EXPECT_NE(y.find(" Add "), std::string::npos) << r.out;  // the head's bias
  EXPECT_NE(r.out.find("\n2 values, 0 weights (0 parameters, 0 bytes)\n"), std::string::npos) << r.out;
}

// Each template is a sharding file that runs and matches the unpartitioned model. Data parallel has no collective;
// Megatron one all-reduce over model per block (its row-parallel fc_out: batch 8 / 2 x 16 x 64 floats = 16 KiB);
// FSDP splits every weight matrix (8 in the blocks, the head's) over both axes on its largest dim.
TEST(Inspect, TemplatesRunAndCheck) {
  const fs::path d = scratch("inspect_templates");
  for (const std::string plan : {"data", "fsdp", "megatron"}) {
    SCOPED_TRACE(plan);
    const fs::path file = d / (plan + ".sharding.json");
    const CmdResult t =
        cli("inspect " + mlp().string() + " --template " + plan + " --mesh 2x2 -o " + file.string(), "tpl_" + plan);
    ASSERT_EQ(t.code, 0) << t.err;
    const nlohmann::json tpl = read_json(file);
    EXPECT_EQ(tpl["mesh"], nlohmann::json::parse(R"({"shape": [2, 2], "axes": ["data", "model"]})"));
    EXPECT_EQ(tpl["tensors"]["x"], nlohmann::json::parse(plan == "megatron" ? R"(["data", null, null])"
                                                                            : R"([["data", "model"], null, null])"));
    const auto [r, rep] = cli_report(
        "run " + mlp().string() + " --shardings " + file.string() + " --dim batch=8 --check", d, "tpl_run_" + plan);
    ASSERT_FALSE(rep.is_null());
    EXPECT_TRUE(rep["check"]["passed"].get<bool>()) << r.out;
    int all = 0;
    for (const auto& c : rep["collectives"]) all += c["count"].get<int>();
    if (plan == "data") EXPECT_EQ(all, 0) << rep["collectives"].dump(1);
    if (plan == "megatron") {
      EXPECT_EQ(count_collectives(rep, "all-reduce"), 4) << rep["collectives"].dump(1);
      EXPECT_EQ(all, 4);
      for (const auto& c : rep["collectives"]) EXPECT_EQ(c["bytes"].get<int64_t>(), 16384) << c.dump();
    }
    if (plan == "fsdp") {
      int split = 0;
      for (const auto& [name, spec] : tpl["tensors"].items())
        if (name.starts_with("onnx::MatMul_"))
          split += spec.dump() == R"([null,["data","model"]])" || spec.dump() == R"([["data","model"],null])";
      EXPECT_EQ(split, 9) << tpl.dump(1);
    }
  }
}

// A rule that also matches the biases (and activations) is reported with what it matched and why it fails; the
// exit code is 2, with one error line.
TEST(Inspect, ReportsTheTensorsAFailingRuleMatches) {
  const fs::path d = scratch("inspect_rules");
  std::ofstream(d / "bad.json") << R"({"mesh": {"shape": [2, 2], "axes": ["data", "model"]},
    "tensors": {"x": ["data", null, null]},
    "rules": [{"match": "fc_in", "spec": [null, "model"]}, {"match": "fc_out\\.bias$", "spec": ["model"]}]})";
  const CmdResult r = cli("inspect " + mlp().string() + " --shardings " + (d / "bad.json").string(), "inspect_bad");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("bad.json: mesh {data=2, model=2}, 1 tensors named, 2 rules\n"
                       "rules[0] \"fc_in\": annotates 0 tensors\n"
                       "  fails on 'blocks.0.fc_in.bias' float32[256]: spec has 2 entries but the tensor has rank 1\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find("  fails on 6 more\n"
                 "rules[1] \"fc_out\\\\.bias$\": annotates 4 tensors (blocks.0.fc_out.bias, blocks.1.fc_out.bias, "
                 "blocks.2.fc_out.bias, blocks.3.fc_out.bias)\n"),
      std::string::npos)
      << r.out;
  EXPECT_EQ(r.err, "error: " + (d / "bad.json").string() +
                       ": 1 of 2 rules fail on 12 tensors (above): narrow their \"match\"\n");
}

TEST(Inspect, ErrorsExactly) {
  const std::string m = mlp().string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--template mega --mesh 4", "error: --template: 'mega' is not one of data, fsdp, megatron, 2d\n"},
      {"--template data", "error: --template: needs --mesh (the mesh the starter file is for)\n"},
      {"--mesh 2x2", "error: --mesh: only used with --template or --shardings\n"},
      {"--template 2d --mesh 4",
       "error: --template 2d: " + m +
           " over the mesh {data=4} gives no such plan (the 2D plan needs a mesh of two axes and repeated layer "
           "blocks)\n"},
      {"--match '(a'", "error: --match: '(a' is not a regular expression RE2 accepts: missing ): (a\n"},
  };
  for (const auto& [args, err] : cases) {
    const CmdResult r = cli("inspect " + m + " " + args, "inspect_err");
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err, err) << args;
  }
}

}  // namespace
