// onnx_frontend internal: the load-time pass that types every value and folds constants, on a core::Graph (no ONNX
// headers).
#pragma once

#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/ir/ir.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::frontend {

/// Folding refuses to materialise a node whose outputs exceed this many bytes when they are also larger than its
/// inputs (an Expand / ConstantOfShape / Tile of a constant to a big tensor stays a node; weight transposes fold).
inline constexpr int64_t kMaxExpandingFoldBytes = int64_t{64} << 20;

/// Rewrites for inference, before typing: Dropout that is not in training mode (opset < 12, or training_mode absent
/// or a constant false) becomes Identity when its mask is unused; trailing outputs that no node reads and that are not
/// graph outputs are dropped from their node (they need no type). Each rewrite is noted in `report`.
void simplify_for_inference(Graph& g, LoadReport& report);

/// One pass in topological order. For each node:
/// - an If whose condition is a constant: replaced by its taken branch's nodes (renamed "<if>/<node>"), which the
///   pass then visits; noted in report.rewrites;
/// - a control-flow node with typed inputs: each body is typed (and folded) by this pass, its inputs typed as the
///   node binds them (core/ir/control_flow.h);
/// - every input a constant (and the node deterministic, and the outputs within kMaxExpandingFoldBytes): evaluated
///   once by `opts.evaluator`; its outputs become initializers and the node leaves the graph;
/// - Shape / Size of a value with a static shape: folded likewise;
/// - otherwise `opts.shape_function` types its outputs (the executor's own shape functions). Where ONNX inference
///   also typed an output, the two must agree: a disagreement is noted in report.shape_disagreements (and thrown as
///   InputError when opts.strict_shapes). Ops without a shape function keep ONNX's types.
/// `unknown` holds the names of values without a static type; typed values leave it, and `why` maps each value left
/// unknown to the reason (a data-dependent shape, an untyped input, a shape-function error).
void infer_and_fold(Graph& g, std::unordered_set<std::string>& unknown, std::map<std::string, std::string>& why,
                    const LoadOptions& opts, LoadReport& report);

}  // namespace gspmd::frontend
