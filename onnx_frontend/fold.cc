// Constant folding of shape sub-graphs and weight transforms.
#include "onnx_frontend/fold.h"

#include <algorithm>
#include <memory>

namespace gspmd::frontend {
namespace {

bool is_nondeterministic(const std::string& op) {
  static const char* const kOps[] = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                                     "Multinomial", "Bernoulli"};
  return std::any_of(std::begin(kOps), std::end(kOps), [&](const char* o) { return op == o; });
}

int64_t value_bytes(const Value& v) {
  try {
    return num_elements(v.shape) * static_cast<int64_t>(dtype_size(v.dtype));
  } catch (const std::exception&) {
    return 0;
  }
}

// Shape / Size folded from a static shape. Returns false when the node is not one of them.
bool fold_shape_op(const Graph& g, const Node& n, int64_t opset, std::vector<Tensor>& out) {
  if (n.op_type == "Shape") {
    const Shape& s = g.values[n.inputs[0]].shape;
    const int64_t r = static_cast<int64_t>(s.size());
    int64_t start = opset >= 15 ? n.i("start", 0) : 0;
    int64_t end = opset >= 15 ? n.i("end", r) : r;
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<int64_t>(start, 0, r);
    end = std::clamp<int64_t>(end, 0, r);
    std::vector<int64_t> dims;
    for (int64_t i = start; i < end; ++i) dims.push_back(s[static_cast<size_t>(i)]);
    out.push_back(Tensor::from_int64s(dims));
    return true;
  }
  if (n.op_type == "Size") {
    out.push_back(Tensor::from_int64s({num_elements(g.values[n.inputs[0]].shape)}, /*scalar=*/true));
    return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> fold_constants(Graph& g, std::unordered_set<std::string>& unknown,
                                        const ConstantEvaluator& evaluator) {
  std::vector<std::string> folded;
  std::vector<char> dead(g.nodes.size(), 0);
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (!n.domain.empty() && n.domain != "ai.onnx") continue;
    if (is_nondeterministic(n.op_type) || n.inputs.empty()) continue;
    std::vector<Tensor> results;
    const bool shape_op = (n.op_type == "Shape" || n.op_type == "Size") && n.inputs.size() == 1 &&
                          n.inputs[0] >= 0 && !unknown.count(g.values[n.inputs[0]].name);
    if (shape_op) {
      fold_shape_op(g, n, g.opset, results);
    } else {
      if (!evaluator) continue;
      bool all_const = true;
      int64_t in_bytes = 0;
      std::vector<const Tensor*> ins;
      for (int v : n.inputs) {
        if (v < 0) {
          ins.push_back(nullptr);
          continue;
        }
        const Value& val = g.values[v];
        if (!val.data) {
          all_const = false;
          break;
        }
        in_bytes += static_cast<int64_t>(val.data->nbytes());
        ins.push_back(val.data.get());
      }
      if (!all_const) continue;
      int64_t out_bytes = 0;
      for (int o : n.outputs)
        if (!unknown.count(g.values[o].name)) out_bytes += value_bytes(g.values[o]);
      if (out_bytes > kMaxExpandingFoldBytes && out_bytes > in_bytes) continue;
      try {
        results = evaluator(n, ins, g.opset);
      } catch (const std::exception&) {
        continue;  // no kernel (or the kernel rejects it): keep the node; the executor reports it if it matters
      }
      if (results.size() < n.outputs.size()) continue;
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      Value& v = g.values[n.outputs[k]];
      v.dtype = results[k].dtype;
      v.shape = results[k].shape;
      v.is_initializer = true;
      v.producer = -1;
      v.data = std::make_shared<const Tensor>(std::move(results[k]));
      unknown.erase(v.name);
    }
    dead[ni] = 1;
    folded.push_back(n.name);
  }
  if (folded.empty()) return folded;
  std::vector<Node> kept;
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    if (dead[ni]) continue;
    for (int o : g.nodes[ni].outputs) g.values[o].producer = static_cast<int>(kept.size());
    kept.push_back(std::move(g.nodes[ni]));
  }
  g.nodes = std::move(kept);
  return folded;
}

}  // namespace gspmd::frontend
