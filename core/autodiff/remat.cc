// Rematerialization's choice of saved values (--remat, docs/training.md): the backward pass reads the cut values
// (and, under dots, contraction outputs) as they are and recomputes the rest from them (jax.checkpoint).
#include <unordered_set>

#include "core/autodiff/step_builder.h"
#include "core/ir/cuts.h"

namespace gspmd {

std::string_view remat_name(RematPolicy p) {
  switch (p) {
    case RematPolicy::kNone: return "none";
    case RematPolicy::kFull: return "full";
    case RematPolicy::kDots: return "dots";
  }
  return "none";
}

namespace autodiff {

std::vector<char> remat_saved(const Graph& g, size_t forward_nodes, const std::vector<bool>& needs_grad,
                              RematPolicy policy, const std::vector<std::string>& keep) {
  static const std::unordered_set<std::string> kNondeterministic = {
      "Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"};
  static const std::unordered_set<std::string> kContractions = {
      "MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "FusedMatMul", "MatMulInteger", "ConvInteger"};
  std::vector<char> saved(g.values.size(), 1);
  std::vector<char> kept(g.values.size(), 0);
  for (const std::string& name : keep)
    if (const int v = g.find(name); v >= 0) kept[static_cast<size_t>(v)] = 1;
  const auto recomputable = [&](int v) {
    return v >= 0 && static_cast<size_t>(v) < needs_grad.size() && needs_grad[static_cast<size_t>(v)] &&
           g.values[static_cast<size_t>(v)].producer >= 0 && !kept[static_cast<size_t>(v)];
  };
  const std::vector<char> cut = cut_points(g, forward_nodes, recomputable, /*graph_outputs_read=*/false);
  for (size_t i = 0; i < forward_nodes; ++i) {
    const Node& n = g.nodes[i];
    const bool keep = cut[i] || kNondeterministic.count(n.op_type) ||
                      (policy == RematPolicy::kDots && kContractions.count(n.op_type));
    for (int v : n.outputs)
      if (recomputable(v) && !keep) saved[static_cast<size_t>(v)] = 0;
  }
  return saved;
}

}  // namespace autodiff
}  // namespace gspmd
