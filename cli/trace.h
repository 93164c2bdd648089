// Chrome trace / Perfetto JSON timeline of the simulated step (run --trace, simulate --trace).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <optional>

#include "backend/pod/pod.h"
#include "cli/commands.h"
#include "core/cost/cost.h"
#include "core/partition/spmd.h"
#include "core/pipeline/schedule.h"

namespace gspmd::cli {

/// Writes the simulated step of `p` as Chrome trace JSON ({"traceEvents": [...]}, loadable by Perfetto and
/// chrome://tracing) to `path`: one process "gspmd-onnx <target>" and, since every device runs the same program
/// with the same simulated timeline, one thread (track, tid 0) for all of them, named by its devices ("devices
/// 0..15", "device 0" on one), with one complete event ("ph": "X") per program node at cost.node_start_s for
/// cost.node_time_s (both in microseconds). Without overlap the spans are back to back and sum to
/// cost.step_time_s; with cost.overlap the collectives go on a second track, "devices 0..15 collectives" (tid 1).
/// Categories "compute" (args: op, flops) and "collective" (args: op, kind, mesh axes, bytes). The file has nodes
/// events, whatever the device count.
/// `measured` (run --backend mpi): per rank, its measured steps (MpiRun::timelines), written beside the simulated
/// step as a second process "measured: MPI ranks (wall time)" (pid 1) with one track per rank named "rank r" and one
/// span per step at its measured start and duration (microseconds from the barrier that started the execution, on
/// that rank's clock), category "measured", named by its node (a fused group: the nodes' names joined by " + "),
/// args: op (op types joined by "+") and nodes (the names). Throws InputError("PATH: cannot write").
/// `pipeline` (--pipeline): adds one track per stage, "stage s: devices 0,1" (tid after the others; a stage's devices
/// have the same timeline), with one span per iteration and pass, category "pipeline", from the first to the last node
/// of that iteration ("t3: microbatch 1, layers 2, 3", "t0: bubble", "t5: the last results leave" for the shift after
/// the last iteration; "backward t3:
/// ..." for a training step's reverse pass). A node's iteration is read
/// from the name of its global node (the pipelined graph's "@t3" and "pipeline/t3/" names).
struct PipelineTrack {
  const Graph* graph = nullptr;  // the global (pipelined) graph p was partitioned from
  const PipelineLayout* layout = nullptr;
  int axis = -1;  // the pipeline's mesh axis
};
void write_trace(const std::string& path, const SpmdProgram& p, const CostReport& cost, const std::string& target,
                 const std::vector<std::vector<ExecutedStep>>& measured = {},
                 const std::optional<PipelineTrack>& pipeline = std::nullopt);
/// write_trace's JSON, to a stream (explain --html embeds it).
void trace_json(std::ostream& f, const SpmdProgram& p, const CostReport& cost, const std::string& target,
                const std::vector<std::vector<ExecutedStep>>& measured = {},
                const std::optional<PipelineTrack>& pipeline = std::nullopt);

/// The pipeline track of `p`: its global graph, layout and axis (in the program's mesh) with --pipeline, else nullopt.
std::optional<PipelineTrack> pipeline_track(const Compiled& p);

}  // namespace gspmd::cli
