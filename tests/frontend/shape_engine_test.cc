// The shape engine against the kernels: every node of every ONNX backend test (Debian's libonnx-testdata: node,
// pytorch-converted, pytorch-operator, simple) runs
// through run_kernel on the test's data, and infer_types must give exactly the types the kernel produced:
// - with every input's values known: equal;
// - with only the model's own constants known: equal, or a DataDependentError (the shape needs an input's values).
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "core/shapes/shapes.h"
#include "onnx_frontend/frontend.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

namespace fs = std::filesystem;

std::string types_str(const std::vector<TensorType>& ts) {
  std::string s;
  for (const auto& t : ts) s += (s.empty() ? "" : " ") + type_str(t.dtype, t.shape);
  return s;
}

struct Tally {
  int models = 0, skipped = 0, nodes = 0, data_dependent = 0;
  std::vector<std::string> disagreements;
  std::map<std::string, int> nodes_by_op;
};

void check_model(const fs::path& dir, Tally& tally) {
  const std::string model = (dir / "model.onnx").string();
  ModelInfo info;
  std::vector<Tensor> data;
  try {
    test::read_backend_test(dir, info, data);
  } catch (const std::exception&) {
    ++tally.skipped;
    return;
  }
  LoadOptions unfolded;  // nodes stay nodes
  unfolded.evaluator = [](const Node&, const std::vector<const Tensor*>&, int64_t) -> std::vector<Tensor> {
    throw std::runtime_error("no folding");
  };
  std::optional<Graph> loaded = test::load_freezing(model, unfolded, info.inputs, data);
  if (!loaded) {
    ++tally.skipped;
    return;
  }
  const Graph& g = *loaded;
  ++tally.models;
  std::map<int, Tensor> live;
  for (int v : g.inputs) {
    auto it = std::find(info.inputs.begin(), info.inputs.end(), g.values[v].name);
    if (it == info.inputs.end()) return;
    live[v] = data[static_cast<size_t>(it - info.inputs.begin())];
  }
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].data) live[static_cast<int>(v)] = *g.values[v].data;
  for (const Node& n : g.nodes) {
    std::vector<const Tensor*> ins;
    std::vector<TensorType> in_types(n.inputs.size());
    std::vector<const TensorType*> types;
    std::vector<const Tensor*> consts;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int v = n.inputs[k];
      if (v < 0 || !live.count(v)) {
        if (v >= 0) return;  // an input this walk could not compute (skipped node before): stop here
        ins.push_back(nullptr);
        types.push_back(nullptr);
        consts.push_back(nullptr);
        continue;
      }
      ins.push_back(&live[v]);
      in_types[k] = {live[v].dtype, live[v].shape};
      types.push_back(&in_types[k]);
      consts.push_back(g.values[v].data ? g.values[v].data.get() : nullptr);
    }
    std::vector<Tensor> outs;
    try {
      outs = run_kernel(n, ins, g.opset);
    } catch (const std::exception&) {
      return;  // no kernel (or the kernel rejects it): the conformance run reports it
    }
    std::vector<TensorType> actual;
    for (size_t k = 0; k < n.outputs.size() && k < outs.size(); ++k) actual.push_back({outs[k].dtype, outs[k].shape});
    ++tally.nodes;
    ++tally.nodes_by_op[n.op_type];
    const std::string where = fmt::format("{}: node '{}' ({})", dir.filename().string(), n.name, n.op_type);
    auto compare = [&](const std::vector<const Tensor*>& values, bool known) {
      try {
        std::vector<TensorType> ours = infer_types(n, types, values, g.opset, &kernel_evaluator());
        ours.resize(std::min(ours.size(), actual.size()));
        if (ours != actual)
          tally.disagreements.push_back(fmt::format("{} [{}]: shape function {} vs kernel {}", where,
                                                    known ? "values known" : "constants only", types_str(ours),
                                                    types_str(actual)));
      } catch (const DataDependentError& e) {
        // A control-flow body's values stay unknown even when the node's inputs are known (test_loop11's Slice of
        // the iteration number): a data-dependent answer is right there.
        if (known && !n.has_body())
          tally.disagreements.push_back(fmt::format("{} [values known]: DataDependentError: {}", where, e.what()));
        else
          ++tally.data_dependent;
      } catch (const std::exception& e) {
        tally.disagreements.push_back(
            fmt::format("{} [{}]: {}", where, known ? "values known" : "constants only", e.what()));
      }
    };
    compare(ins, true);
    compare(consts, false);
    for (size_t k = 0; k < n.outputs.size() && k < outs.size(); ++k) live[n.outputs[k]] = std::move(outs[k]);
  }
}

TEST(ShapeEngine, AgreesWithKernelsOnOnnxBackendTests) {
  const std::vector<fs::path> dirs = test::backend_test_dirs();
  if (dirs.empty()) GTEST_SKIP() << test::kBackendTestData << " is missing (apt-get install libonnx-testdata)";
  Tally tally;
  for (const auto& d : dirs) check_model(d, tally);
  std::printf(
      "shape engine: %d models checked (%d skipped: unreadable data or no static load), %d nodes, "
      "%d data-dependent with constants only, %zu disagreements\n",
      tally.models, tally.skipped, tally.nodes, tally.data_dependent, tally.disagreements.size());
  for (const auto& d : tally.disagreements) std::printf("  %s\n", d.c_str());
  EXPECT_GE(tally.models, 950);  // the rest need folding (shape sub-graphs) or sequence data
  EXPECT_TRUE(tally.disagreements.empty()) << tally.disagreements.size() << " disagreements (listed above)";
}

}  // namespace
}  // namespace gspmd
