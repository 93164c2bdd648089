// Chrome trace / Perfetto JSON timeline of the simulated step (run --trace, simulate --trace).
#pragma once

#include <string>
#include <vector>

#include "backend/pod/pod.h"
#include "core/cost/cost.h"
#include "core/partition/spmd.h"

namespace gspmd::cli {

/// Writes the simulated step of `p` as Chrome trace JSON ({"traceEvents": [...]}, loadable by Perfetto and
/// chrome://tracing) to `path`: one process "gspmd-onnx <target>", one thread (track) per device named "device k",
/// and per device one complete event ("ph": "X") per program node at cost.node_start_s for cost.node_time_s (both in
/// microseconds). Without overlap the spans are back to back and sum to cost.step_time_s; with cost.overlap the
/// collectives go on a second track per device, "device k collectives" (tid devices + k). Categories "compute"
/// (args: op, flops) and "collective" (args: op, kind, mesh axes, bytes). Every device runs the same program, so
/// the tracks are equal. The file has devices x nodes events.
/// `measured` (run --backend mpi): per rank, its measured steps (MpiRun::timelines), written beside the simulated
/// step as a second process "measured: MPI ranks (wall time)" (pid 1) with one track per rank named "rank r" and one
/// span per step at its measured start and duration (microseconds from the barrier that started the execution, on
/// that rank's clock), category "measured", named by its node (a fused group: the nodes' names joined by " + "),
/// args: op (op types joined by "+") and nodes (the names). Throws InputError("PATH: cannot write").
void write_trace(const std::string& path, const SpmdProgram& p, const CostReport& cost, const std::string& target,
                 const std::vector<std::vector<ExecutedStep>>& measured = {});

}  // namespace gspmd::cli
