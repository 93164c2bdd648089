// core/ir simplification passes (simplify.h).
#include "core/ir/simplify.h"

#include <algorithm>
#include <string>
#include <vector>

namespace gspmd {

void fold_transposes(Graph& g, size_t first, bool forward_too) {
  std::vector<int> uses(g.values.size(), 0);
  for (const Node& n : g.nodes)
    for (int v : n.inputs)
      if (v >= 0) ++uses[static_cast<size_t>(v)];
  for (int v : g.outputs) ++uses[static_cast<size_t>(v)];
  auto perm_of = [&](const Node& t) {
    std::vector<int64_t> perm = t.ints("perm");
    if (perm.empty())
      for (size_t d = g.values[static_cast<size_t>(t.inputs[0])].shape.size(); d-- > 0;)
        perm.push_back(static_cast<int64_t>(d));
    return perm;
  };
  auto is_transpose = [&](int p) {
    return p >= (forward_too ? 0 : static_cast<int>(first)) && g.nodes[static_cast<size_t>(p)].op_type == "Transpose" &&
           g.nodes[static_cast<size_t>(p)].domain.empty() && !g.nodes[static_cast<size_t>(p)].outputs.empty();
  };
  for (size_t k = first; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    if (!n.domain.empty()) continue;
    if (n.op_type == "Transpose" && !n.outputs.empty()) {  // Einsum -> Transpose: one Einsum
      const int x = n.inputs[0];
      const int p = g.values[static_cast<size_t>(x)].producer;
      if (p < static_cast<int>(first) || uses[static_cast<size_t>(x)] != 1) continue;
      Node& e = g.nodes[static_cast<size_t>(p)];
      if (e.op_type != "Einsum" || !e.domain.empty()) continue;
      const std::string eq = e.s("equation");
      const size_t arrow = eq.find("->");
      const std::string out = eq.substr(arrow + 2);
      std::string permuted;
      for (int64_t d : perm_of(n)) permuted += out[static_cast<size_t>(d)];
      e.attrs["equation"] = eq.substr(0, arrow + 2) + permuted;
      e.outputs[0] = n.outputs[0];
      g.values[static_cast<size_t>(n.outputs[0])].producer = p;
      uses[static_cast<size_t>(x)] = 0;
      n.inputs.clear();  // dropped by prune (no outputs)
      n.outputs.clear();
    } else if (n.op_type == "Einsum") {  // Transpose -> Einsum: the Einsum reads the Transpose's input
      const std::string eq = n.s("equation");
      const size_t arrow = eq.find("->");
      std::vector<std::string> terms;
      for (size_t b = 0, e; b <= arrow; b = e + 1) {
        e = std::min(eq.find(',', b), arrow);
        terms.push_back(eq.substr(b, e - b));
      }
      bool changed = false;
      for (size_t i = 0; i < n.inputs.size() && i < terms.size(); ++i) {
        for (int y = n.inputs[i]; y >= 0 && is_transpose(g.values[static_cast<size_t>(y)].producer); y = n.inputs[i]) {
          const Node& t = g.nodes[static_cast<size_t>(g.values[static_cast<size_t>(y)].producer)];
          const std::vector<int64_t> perm = perm_of(t);
          std::string x_term(terms[i].size(), ' ');
          for (size_t d = 0; d < perm.size(); ++d) x_term[static_cast<size_t>(perm[d])] = terms[i][d];
          terms[i] = x_term;
          --uses[static_cast<size_t>(y)];
          n.inputs[i] = t.inputs[0];
          ++uses[static_cast<size_t>(n.inputs[i])];
          changed = true;
        }
      }
      if (!changed) continue;
      std::string lhs;
      for (const std::string& t : terms) lhs += (lhs.empty() ? "" : ",") + t;
      n.attrs["equation"] = lhs + eq.substr(arrow);
    }
  }
}

}  // namespace gspmd
