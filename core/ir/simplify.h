// core/ir: simplification passes over a graph, run by the builders that emit nodes (the training step's backward
// pass, core/autodiff) before the graph is propagated and partitioned.
#pragma once

#include <cstddef>

#include "core/ir/ir.h"

namespace gspmd {

/// Folds Transposes into the Einsums among nodes [first, end of graph) of `g`, as XLA folds transposes into dots:
/// - an Einsum whose result only a Transpose reads computes the transposed result itself (its output labels
///   permuted);
/// - an Einsum reading a Transpose's result reads the Transpose's input (that operand's labels permuted), when the
///   Transpose is among those nodes, or anywhere with `forward_too` (the training step without --remat, where every
///   forward value is kept anyway).
/// A Transpose left without readers stays in the graph for Graph::prune to drop. Equations must be explicit and
/// ellipsis-free (as the gradient rules emit them). Used by the training step (core/autodiff). O(nodes + edges).
void fold_transposes(Graph& g, size_t first, bool forward_too);

}  // namespace gspmd
