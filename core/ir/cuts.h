// core/ir: the cut points of a graph's node sequence, shared by --remat full (core/autodiff: the values kept between
// recomputed segments) and pipelining (core/pipeline: the layer blocks' boundaries).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// Cut points of nodes [0, end) of `g` over the values `tracked(v)` marks: cut[k] is true when node k makes at least
/// one tracked value that is read later, and every tracked value made at or before k and read after k is one of node
/// k's results (so node k's results are all that crosses from the nodes before to the nodes after: the residual
/// stream of a transformer, a block output of a CNN). A value is read by the nodes before `end`, and also after all
/// of them when `graph_outputs_read` and it is a graph output. One sweep with a difference array: O(nodes + edges).
std::vector<char> cut_points(const Graph& g, size_t end, const std::function<bool(int)>& tracked,
                             bool graph_outputs_read);

}  // namespace gspmd
