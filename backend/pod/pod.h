// backend/pod: an emulated pod of N devices on this host. Each device owns its tensors (memory accounted per
// device); devices execute the same SPMD program in lock step, node by node; `gspmd` collectives are carried out
// in-process over all devices' buffers (semantics in core/program/program_ops.h; implementations in collectives.h).
// The same interpreter runs a subset of the devices (run_spmd_local, run_device_graph) with the collectives handed to
// a CollectiveExecutor (collective_executor.h): backend/mpi runs one device per MPI rank that way.
//
// Memory accounting (docs/cost-model.md): params (each device's weight shard) and program constants are resident for
// the whole run (replicated ones are shared on the host but counted on every device), except donated params
// (ProgramBinding::donated: a training step's weights and optimizer state), freed after their last reader; input
// shards and intermediates
// live from their production to their last use; program outputs until the end. The peak is sampled after a node's
// outputs exist and before its dead operands are freed. The accounting uses each value's declared bytes, so it does not
// depend on how the host executes a node (in place, as a view, fused with its neighbours: docs/executor.md).
//
// Host threading (docs/executor.md): with more than one device and more than one OpenMP thread, up to
// omp_get_max_threads() devices run a node concurrently, each on one thread (ExecutorOptions::device_threads caps the
// number of concurrent devices; 1 = devices one after another, each kernel using every thread). compute_wall_s times
// run_kernel and the partition-id ops of that device, communication_wall_s the collectives.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/pod/collective_executor.h"
#include "core/ir/ir.h"
#include "core/partition/spmd.h"

namespace gspmd {

/// Per-device run statistics.
struct DeviceStats {
  int64_t device = 0;
  int64_t peak_memory_bytes = 0;    // max over the run of live tensor bytes held by the device (params included)
  double compute_wall_s = 0;        // host wall time spent in this device's kernels (seconds)
  double communication_wall_s = 0;  // host wall time of collectives, attributed to each member device
};

/// Host wall time of one kind of step, summed over the run (the executor's profile, docs/executor.md).
struct OpProfile {
  std::string op;     // op type ("MatMul"), "gspmd.<Op>" for gspmd ops, "A+B+..." for a fused group of nodes,
                      // "(load)" for slicing weights and inputs, "(assemble)" for assembling the outputs
  int64_t nodes = 0;  // program nodes (or fused groups) of that kind executed (each once for all devices)
  double wall_s = 0;  // host wall time, all devices together (seconds)
  double flops = 0;   // FLOPs of those nodes on all devices (node_flops x devices)
};

/// Result of running a program.
struct PodRun {
  std::vector<Tensor> outputs;  // full logical values of the global graph outputs, in order
  std::vector<DeviceStats> devices;
  double wall_s = 0;               // host wall time of the whole run
  double host_flops = 0;           // FLOPs executed on the host by all devices (for GFLOP/s)
  std::vector<OpProfile> profile;  // per kind of step, largest wall_s first; wall_s sums to about wall_s
};

/// The profile as a fixed-width text table (one row per OpProfile, with its share of the run and GFLOP/s), for
/// GSPMD_PROFILE=1 on `run` (docs/executor.md).
std::string format_profile(const PodRun& r);

/// How the host executes a program (docs/executor.md). These are speed knobs: the program, its outputs' values
/// (up to float rounding, which --check tolerates: a stacked or fused product may block its sums differently),
/// dtypes and shapes, the per-device memory accounting and the FLOPs never depend on them. The CLI builds them
/// (cli/executor_env.h); the library reads no environment variable.
struct ExecutorOptions {
  /// Devices that run a node concurrently, each on one OpenMP thread. 0 (default) = min(devices,
  /// omp_get_max_threads()); 1 = devices one after another, each kernel on every thread; values above the device
  /// count are capped to it; negative values act as 1.
  int device_threads = 0;
  /// Fuse a float32 MatMul and the elementwise nodes that refine its result into one oneDNN matmul with post-ops
  /// (default true).
  bool fuse = true;
  /// Run the products of devices that hold the same weights as one stacked matmul (default true; needs more than one
  /// device).
  bool stack = true;
};

/// Called after every program node with (nodes done, nodes in all), on the calling thread (for progress displays).
using RunProgress = std::function<void(size_t done, size_t total)>;

/// Runs `p` on mesh.num_devices() emulated devices. `global` is the unpartitioned graph: its initializers give the
/// weights (each device gets shard_tensor of them per p.params) and `inputs` (one per global graph input, full
/// values) are sharded per p.inputs. Outputs are assembled per p.outputs.
/// Throws UnsupportedError for a node with no kernel (unchanged from run_kernel), InternalError
/// "node 'X' (Op) on device k: <what>" on a kernel or collective failure or when a result's dtype/shape differs from
/// the program's declared value, InputError when `inputs` do not match the global graph's inputs (count, dtype,
/// shape) or a param's global initializer has no data.
PodRun run_spmd(const SpmdProgram& p, const Graph& global, const std::vector<Tensor>& inputs,
                const RunProgress& progress = {}, const ExecutorOptions& options = {});

/// One step of an execution as the host ran it (LocalRun::timeline): a program node, or a fused group of consecutive
/// nodes run as one (docs/executor.md).
struct ExecutedStep {
  std::vector<std::string> nodes;  // the nodes' names, in program order (one unless fused)
  std::vector<std::string> ops;    // their op types
  double start_s = 0, end_s = 0;   // host wall time from the start of the run_* call (seconds)
};

/// One process's share of a run: the devices it holds (an MPI rank holds one; see backend/mpi).
struct LocalRun {
  std::vector<std::vector<Tensor>> output_shards;  // [output k][local device j]: that device's shard of output k, on
                                                   // the program's local (padded) shape, not assembled
  std::vector<DeviceStats> devices;                // one per local device, in the order given
  double wall_s = 0;                               // host wall time of this process's part of the run (seconds)
  double run_s = 0;                                // of which executing the program (weight and input binding excluded)
  double host_flops = 0;                           // FLOPs executed by the local devices
  std::vector<OpProfile> profile;                  // host time per op type, as PodRun::profile
  std::vector<ExecutedStep> timeline;              // every step of the execution, in order (all local devices run
                                                   // each step together)
};

/// Runs `p` for the devices `devices` only (global device ids on p.mesh, ascending), with the same interpreter,
/// kernels and memory accounting as run_spmd; collectives go to `collectives`, which must reach the devices held
/// elsewhere (MpiCollectives). Weights are sliced from `global`'s initializers for each local device.
/// `input_shards[k][j]` is local device j's shard of program input k (p.inputs order), on the program's local shape.
/// Throws as run_spmd; InputError when a shard's dtype/shape differs from the program's input.
LocalRun run_spmd_local(const SpmdProgram& p, const Graph& global, const std::vector<std::vector<Tensor>>& input_shards,
                        const std::vector<int64_t>& devices, CollectiveExecutor& collectives,
                        const RunProgress& progress = {}, const ExecutorOptions& options = {});

/// Runs one device's exported model (`device_<k>.onnx` from export_device, loaded with load_model) as device
/// `device` of `mesh` (its gspmd.mesh_shape): its initializers are resident constants, `inputs` its local inputs in
/// graph-input order, its `gspmd` collectives (mesh_axes, reduction, axis, shift/target_axes attributes) are carried
/// out by `collectives`. output_shards[k][0] is graph output k (the device's shard). Throws as run_single.
LocalRun run_device_graph(const Graph& g, const DeviceMesh& mesh, int64_t device, const std::vector<Tensor>& inputs,
                          CollectiveExecutor& collectives, const RunProgress& progress = {},
                          const ExecutorOptions& options = {});

/// Runs every device's exported model (`device_graphs[k]` is device k's, loaded with load_model) on this host, one
/// thread per device, their collectives meeting in ThreadCollectives: `run --program` on the emulator. `inputs` are
/// one per global graph input of `global` (full values), sharded per p.inputs; outputs are assembled per p.outputs,
/// the devices' stats in device order. Throws the first device's error (InputError for an input of the wrong shape,
/// as run_device_graph).
PodRun run_device_graphs(const SpmdProgram& p, const Graph& global, const std::vector<Graph>& device_graphs,
                         const std::vector<Tensor>& inputs, const ExecutorOptions& options = {});

/// Runs the unpartitioned graph on one device (the reference for --check): the same interpreter, with the
/// initializers' data as resident constants. InputError on mismatching inputs or an initializer without data.
PodRun run_single(const Graph& g, const std::vector<Tensor>& inputs, const RunProgress& progress = {},
                  const ExecutorOptions& options = {});

}  // namespace gspmd
