// onnx_frontend internal: constant folding on a core::Graph (no ONNX headers).
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "core/ir/ir.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::frontend {

/// Folding refuses to materialise a node whose outputs exceed this many bytes when they are also larger than its
/// inputs (an Expand / ConstantOfShape / Tile of a constant to a big tensor stays a node; weight transposes fold).
inline constexpr int64_t kMaxExpandingFoldBytes = int64_t{64} << 20;

/// Folds, in topological order, every ai.onnx node whose inputs are all constants (values with data), plus Shape and
/// Size of any value with a static shape (`unknown` holds the names of values whose shape is not static). Folded
/// outputs become initializers with data; folded nodes are removed from the graph (values are kept; call prune()).
/// Nodes the evaluator throws on stay as they are. Returns the names of the folded nodes (empty: nothing changed).
/// `evaluator` may be empty: then only Shape and Size fold.
std::vector<std::string> fold_constants(Graph& g, std::unordered_set<std::string>& unknown,
                                        const ConstantEvaluator& evaluator);

}  // namespace gspmd::frontend
