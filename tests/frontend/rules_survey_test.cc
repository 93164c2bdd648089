// Every rule builder against real graphs: the rule of every node of every model in testdata/ and of every ONNX
// backend test (Debian's libonnx-testdata: node, pytorch-converted, pytorch-operator, simple), loaded as the pipeline
// loads it (constants folded) and unfolded (every node kept, as tests/frontend/shape_engine_test.cc loads them), is
// built with get_rule. A builder that throws or builds a rule that fails check() is a bug (RuleResult::kBuilderError):
// the test lists them and fails. "No rule" and "not expressible" are allowed (the partitioner replicates those).
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli/wiring.h"
#include "core/rules/rule.h"
#include "onnx_frontend/frontend.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

namespace fs = std::filesystem;

struct Tally {
  int models = 0, skipped = 0, nodes = 0, ok = 0, no_rule = 0, not_expressible = 0;
  std::vector<std::string> builder_errors;
  std::map<std::string, std::set<std::string>> not_expressible_by_op;  // op -> reasons
};

/// Rules of every node of `g` (not of control-flow bodies: those run whole on every device).
void survey(const std::string& where, const Graph& g, Tally& tally) {
  ++tally.models;
  const RuleTable rules(g);
  for (int n = 0; n < rules.size(); ++n) {
    const RuleResult& r = rules[n];
    const Node& node = g.nodes[static_cast<size_t>(n)];
    ++tally.nodes;
    switch (r.status) {
      case RuleResult::kOk: ++tally.ok; break;
      case RuleResult::kNoRule: ++tally.no_rule; break;
      case RuleResult::kNotExpressible:
        ++tally.not_expressible;
        tally.not_expressible_by_op[node.op_type].insert(r.reason);
        break;
      case RuleResult::kBuilderError:
        tally.builder_errors.push_back(fmt::format("{}: node '{}' ({}): {}", where, node.name, node.op_type, r.reason));
        break;
    }
  }
}

void survey_backend_test(const fs::path& dir, Tally& tally) {
  const std::string model = (dir / "model.onnx").string();
  ModelInfo info;
  std::vector<Tensor> data;
  try {
    test::read_backend_test(dir, info, data);
  } catch (const std::exception&) {
  }
  LoadOptions unfolded = cli::kernel_load_options();
  unfolded.evaluator = [](const Node&, const std::vector<const Tensor*>&, int64_t) -> std::vector<Tensor> {
    throw std::runtime_error("no folding");
  };
  const std::string name = dir.parent_path().filename().string() + "/" + dir.filename().string();
  bool any = false;
  for (const LoadOptions& lo : {cli::kernel_load_options(), unfolded}) {
    if (std::optional<Graph> g = test::load_freezing(model, lo, info.inputs, data)) {
      survey(name, *g, tally);
      any = true;
    }
  }
  if (!any) ++tally.skipped;
}

void print(const char* what, const Tally& t) {
  std::printf(
      "%s: %d graphs (%d models skipped: no static load), %d nodes: %d with a rule, %d without (no rule "
      "registered), %d not expressible, %zu builder errors\n",
      what, t.models, t.skipped, t.nodes, t.ok, t.no_rule, t.not_expressible, t.builder_errors.size());
  for (const auto& [op, reasons] : t.not_expressible_by_op)
    for (const std::string& r : reasons) std::printf("  not expressible: %s: %s\n", op.c_str(), r.c_str());
  for (const std::string& e : t.builder_errors) std::printf("  BUILDER ERROR %s\n", e.c_str());
}

TEST(RulesSurvey, NoBuilderErrorOnTestdataModels) {
  Tally tally;
  std::vector<fs::path> models;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(GSPMD_SOURCE_DIR) / "testdata"))
    if (e.path().extension() == ".onnx") models.push_back(e.path());
  std::sort(models.begin(), models.end());
  for (const fs::path& m : models) {
    LoadOptions lo = cli::kernel_load_options();
    try {
      for (const auto& dims : read_model_info(m.string()).input_dim_params)
        for (const std::string& d : dims)
          if (!d.empty()) lo.dims[d] = 2;  // symbolic dims (batch...): 2
    } catch (const std::exception&) {
    }
    if (std::optional<Graph> g = test::load_freezing(m.string(), lo, {}, {}))
      survey(fs::relative(m, GSPMD_SOURCE_DIR).string(), *g, tally);
    else
      ++tally.skipped;
  }
  print("testdata", tally);
  EXPECT_GE(tally.models, 10);
  EXPECT_TRUE(tally.builder_errors.empty()) << tally.builder_errors.size() << " builder errors (listed above)";
}

TEST(RulesSurvey, NoBuilderErrorOnOnnxBackendTests) {
  const std::vector<fs::path> dirs = test::backend_test_dirs();
  if (dirs.empty()) GTEST_SKIP() << test::kBackendTestData << " is missing (apt-get install libonnx-testdata)";
  Tally tally;
  for (const fs::path& d : dirs) survey_backend_test(d, tally);
  print("ONNX backend tests", tally);
  EXPECT_GE(tally.models, 1500);
  EXPECT_TRUE(tally.builder_errors.empty()) << tally.builder_errors.size() << " builder errors (listed above)";
}

}  // namespace
}  // namespace gspmd
