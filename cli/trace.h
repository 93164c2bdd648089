// Chrome trace / Perfetto JSON timeline of the simulated step (run --trace, simulate --trace).
#pragma once

#include <string>

#include "core/cost/cost.h"
#include "core/partition/spmd.h"

namespace gspmd::cli {

/// Writes the simulated step of `p` as Chrome trace JSON ({"traceEvents": [...]}, loadable by Perfetto and
/// chrome://tracing) to `path`: one process "gspmd-onnx <target>", one thread (track) per device named "device k",
/// and per device one complete event ("ph": "X") per program node at cost.node_start_s for cost.node_time_s (both in
/// microseconds). Without overlap the spans are back to back and sum to cost.step_time_s; with cost.overlap the
/// collectives go on a second track per device, "device k collectives" (tid devices + k). Categories "compute"
/// (args: op, flops) and "collective" (args: op, kind, mesh axes, bytes). Every device runs the same program, so
/// the tracks are equal. The file has devices x nodes events. Throws InputError("PATH: cannot write").
void write_trace(const std::string& path, const SpmdProgram& p, const CostReport& cost, const std::string& target);

}  // namespace gspmd::cli
