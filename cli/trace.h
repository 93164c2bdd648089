// Chrome trace / Perfetto JSON timeline of the simulated step (run --trace, simulate --trace).
#pragma once

#include <string>

#include "core/cost/cost.h"
#include "core/partition/spmd.h"

namespace gspmd::cli {

/// Writes the simulated step of `p` as Chrome trace JSON ({"traceEvents": [...]}, loadable by Perfetto and
/// chrome://tracing) to `path`: one process "gspmd-onnx <target>", one thread (track) per device named "device k",
/// and per device one complete event ("ph": "X") per program node, back to back in program order, with ts and dur
/// in microseconds from cost.node_time_s. Categories "compute" (args: op, flops) and "collective" (args: op, kind,
/// mesh axes, bytes). Every device runs the same program, so the tracks are equal; per track the durations sum to
/// cost.step_time_s. The file has devices x nodes events. Throws InputError("PATH: cannot write").
void write_trace(const std::string& path, const SpmdProgram& p, const CostReport& cost, const std::string& target);

}  // namespace gspmd::cli
