// core/ir/shift_op.h: the pipeline's (core/pipeline) one op of its own, the stage shift (GSPMD §3.3: "shift the
// per-stage state buffer to the next stage with a collective-permute"). It lives in the ONNX domain "gspmd.pipeline",
// version 1, in the unpartitioned (global) graph that the pipeline transformation builds (core/pipeline/schedule.h);
// the partitioner lowers it to standard ONNX ops and collectives, so it never appears in an SPMD program or an exported
// device model.
//
//   Shift(x, [in]) -> (y, out)        attrs shift (1 or -1, default 1), wrap (0 or 1, default 0).
//   x: [S, ...], the state of S stages; in: [1, ...]; y: [S, ...]; out: [1, ...].
//   With shift = 1 the "enter" row is 0 and the "exit" row S-1; with shift = -1 they are S-1 and 0.
//     y[s]       = x[s - shift]                                    for every s but the enter row;
//     y[enter]   = (in if given, else 0) + (wrap ? x[exit] : 0);
//     out        = x[exit]                                         (the row that leaves the last stage).
//   Partitioned with dim 0 split one row per device over axes A: y is a collective-permute over A by `shift`
//   (cyclic when wrap), with `in` added on the enter device; out is x on the exit device and 0 elsewhere, a partial
//   sum over A (reduced only where a consumer needs it whole). Otherwise dim 0 is gathered and the shift is local.
//   An output that nothing reads is not computed (no collective-permute after the last iteration), and a state that is
//   zeros by construction (an Expand of a zero constant: the initial state, a gradient that nothing sends back) is
//   not sent: only the entering row is set.
//   The gradient of Shift is Shift: dx, d_in = Shift(dy, d_out; shift = -shift, same wrap).
#pragma once

#include <cstdint>

namespace gspmd {

/// The ONNX domain of the pipeline's ops (Node::domain).
inline constexpr const char* kPipelineDomain = "gspmd.pipeline";
/// The op type of the stage shift.
inline constexpr const char* kShiftOp = "Shift";

}  // namespace gspmd
