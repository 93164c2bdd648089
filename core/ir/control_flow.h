// core/ir: how the control-flow nodes (ONNX If, Loop, Scan) bind their inputs to their bodies' inputs, shared by the
// loader (which types bodies) and the backend (shape functions and kernels). Captured values: ir.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// The most iterations one Loop runs (docs/cli.md#limits): a trip count of 2^40, or a condition that stays true,
/// is an InputError at this count, never an endless run (the kernel); the loader's folding bounds its work with it.
inline constexpr int64_t kMaxLoopIterations = int64_t{1} << 20;

/// Scan's layout (onnx/docs/Operators.md#Scan): opset 9+ (scan_input_axes / scan_output_axes and their directions) and
/// opset 8 (a leading batch dim on every input and output, optional sequence_lens input 0, the scan axis is 1,
/// `directions` for the scan inputs). Axes are as given (may be negative); normalise against the rank.
struct ScanLayout {
  bool batched = false;           // opset 8
  int first_state = 0;            // node input index of the first state value (1 when batched)
  int num_state = 0;              // N: loop-carried state values
  int num_scan_in = 0;            // M: scan inputs (node inputs first_state + N ...)
  std::vector<int64_t> in_axes;   // per scan input (opset 8: 1, the axis after the batch dim)
  std::vector<char> in_reverse;   // per scan input: scanned from the end
  std::vector<int64_t> out_axes;  // per scan output (opset 8: 1)
  std::vector<char> out_reverse;  // per scan output: filled from the end
};

/// Scan's layout for `node` whose body has `body_outputs` outputs, at `opset`. Throws SpecError naming the
/// node when the attributes do not match the inputs (num_scan_inputs, axes lists of the wrong length).
ScanLayout scan_layout(const Node& node, size_t body_outputs, int64_t opset);

/// Number of the node's ONNX inputs (its inputs minus the captured ones).
inline size_t own_inputs(const Node& node) { return node.inputs.size() - static_cast<size_t>(node.captures()); }

/// The types of `body`'s inputs when `node` (If, Loop, Scan) runs it with inputs of `types` (one per node input,
/// nullptr = absent): its formal inputs per the ONNX spec (If: none; Loop: int64 iteration number, bool condition,
/// the carried values; Scan: the states, then one slice per scan input without its scan axis (and batch dim)), then
/// the captured values. Throws SpecError naming the node when a required input is absent or has too few
/// dims, or the body's input count does not match.
std::vector<TensorType> body_input_types(const Node& node, const Graph& body,
                                         const std::vector<const TensorType*>& types, int64_t opset);

}  // namespace gspmd
