// Cut points of a graph's node sequence (core/ir/cuts.h).
#include "core/ir/cuts.h"

namespace gspmd {

std::vector<char> cut_points(const Graph& g, size_t end, const std::function<bool(int)>& tracked,
                             bool graph_outputs_read) {
  std::vector<int> last(g.values.size(), -1);  // the last reader
  for (size_t k = 0; k < end; ++k)
    for (int v : g.nodes[k].inputs)
      if (v >= 0) last[static_cast<size_t>(v)] = static_cast<int>(k);
  if (graph_outputs_read)
    for (int v : g.outputs) last[static_cast<size_t>(v)] = static_cast<int>(end);
  auto crosses = [&](int v, size_t k) {  // made by node k, tracked, read after it
    return v >= 0 && last[static_cast<size_t>(v)] > static_cast<int>(k) && tracked(v);
  };
  std::vector<int> delta(end + 1, 0);  // +1 where a crossing value is made, -1 at its last reader
  for (size_t k = 0; k < end; ++k)
    for (int v : g.nodes[k].outputs)
      if (crosses(v, k)) {
        ++delta[k];
        --delta[static_cast<size_t>(last[static_cast<size_t>(v)])];
      }
  std::vector<char> cut(end, 0);
  int open = 0;
  for (size_t k = 0; k < end; ++k) {
    open += delta[k];
    int mine = 0;
    for (int v : g.nodes[k].outputs) mine += crosses(v, k);
    cut[k] = mine > 0 && open == mine;
  }
  return cut;
}

}  // namespace gspmd
