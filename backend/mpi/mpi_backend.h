// backend/mpi: the SPMD program on a real distributed engine, one MPI rank per device (docs/mpi.md).
//
// Every rank runs the pod's interpreter (backend/pod/pod.h) for the device whose id is its rank in MPI_COMM_WORLD,
// with the pod's kernels; only the collectives differ: MpiCollectives implements the `gspmd` ones with MPI on one
// communicator per set of mesh axes. Inputs are scattered from rank 0 and outputs gathered on rank 0 according to
// their shardings. Built only when CMake finds MPI (GSPMD_WITH_MPI); this is the only module with <mpi.h>.
//
// Failure handling, so that a bad setup never hangs: setup failures are agreed on by every rank (Session::agree),
// so all ranks print an error and exit with the failing rank's code; a failure once the ranks communicate aborts
// the job (Session::abort -> MPI_Abort), and a rank that mpirun terminates because another one died or aborted
// prints "error: rank K: terminated by mpirun ..." from its SIGTERM handler and exits 2.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/pod/collective_executor.h"
#include "backend/pod/pod.h"
#include "core/ir/ir.h"
#include "core/partition/spmd.h"

namespace gspmd::mpi {

/// A setup failure of one rank: the exit code it maps to (2 unusable input, 3 unsupported, 4 internal) and the
/// one-line message without the "error: " prefix.
struct Failure {
  int exit_code = 2;
  std::string message;
};

/// Thrown on every rank by Session::agree when some rank failed. what() is this rank's line without "error: "
/// ("rank 3: dir/device_3.onnx: cannot open ..." on the failing rank, "rank 0: rank 3 failed: ..." on the others).
struct RankFailure : std::runtime_error {
  int exit_code;
  RankFailure(int code, const std::string& what) : std::runtime_error(what), exit_code(code) {}
};

/// The MPI environment of this process: MPI_Init on construction, MPI_Finalize on destruction (one per process).
/// It installs SIGTERM/SIGINT handlers that print "error: rank K: terminated by mpirun (another rank failed or was
/// killed; see its message)" and exit 2, so every rank of a job that mpirun tears down says why it stopped.
class Session {
 public:
  /// Initialises MPI (MPI_Init_thread, funneled; errors on MPI_COMM_WORLD return instead of aborting, and are
  /// thrown as InternalError naming the MPI call). Throws InternalError when MPI cannot be initialised.
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Collective over MPI_COMM_WORLD: every rank passes its own failure or none. When no rank failed, returns.
  /// Otherwise throws RankFailure on every rank: a failing rank reports its own message and code; the others
  /// report the lowest failing rank's message and code, prefixed "rank R failed: ". Messages longer than 1 KiB
  /// are cut.
  void agree(const std::optional<Failure>& mine) const;

  /// This rank has printed its error and is about to exit with `code`: if mpirun terminates it meanwhile (another
  /// rank exited first), it exits with `code` without the "terminated by mpirun" line.
  void exiting_with_error(int code) const;

  /// Aborts the whole job (MPI_Abort on MPI_COMM_WORLD with `code`): for failures after the ranks started to
  /// communicate, when the other ranks may be blocked in a collective. Does not return.
  [[noreturn]] void abort(int code) const;

  /// Collective over MPI_COMM_WORLD: returns rank 0's `text` on every rank (MPI_Ibcast of the length, then of the
  /// bytes). Waiting ranks poll every 200 us with a sleep instead of spinning, so rank 0 may measure the host
  /// meanwhile. Throws InternalError naming the MPI call on failure.
  std::string broadcast(const std::string& text) const;

  /// Collective over MPI_COMM_WORLD: ranks of this job on this host (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED).
  int ranks_on_this_host() const;

 private:
  int rank_ = 0, size_ = 1;
};

/// The `gspmd` collectives over MPI, for the one device this rank holds (device id = world rank).
/// AllReduce -> MPI_Allreduce; AllGather -> MPI_Allgather; ReduceScatter -> MPI_Reduce_scatter; AllToAll ->
/// MPI_Alltoall; CollectivePermute (halo exchange and reshard) -> MPI_Sendrecv (MPI_PROC_NULL for a missing peer;
/// a device with no source receives zeros). Shards of the program are padded to equal sizes (uneven dims included),
/// so every member sends and receives equal counts. Data moves as bytes; reductions use the MPI type of the dtype
/// (float32, float64, int8..int64, uint8..uint64; bool as unsigned char with MPI_LOR/MPI_LAND, matching the pod).
class MpiCollectives final : public CollectiveExecutor {
 public:
  /// Makes, once, one communicator per distinct `mesh_axes` set used by the collectives of `program`, with
  /// MPI_Comm_split(MPI_COMM_WORLD, color = this rank's replica group, key = its tile index), so that the rank in
  /// the communicator is the tile index. Collective over MPI_COMM_WORLD: every rank must pass a program with the
  /// same collectives (check the fingerprint first). Requires world size == mesh.num_devices().
  MpiCollectives(const DeviceMesh& mesh, int rank, const Graph& program);
  ~MpiCollectives() override;
  MpiCollectives(const MpiCollectives&) = delete;
  MpiCollectives& operator=(const MpiCollectives&) = delete;

  /// `members` must be exactly this rank's tile. Throws UnsupportedError on a count above INT_MAX, InternalError on a
  /// missing communicator or an MPI error; UnsupportedError for a reduction over another dtype.
  std::vector<Tensor> run(const CollectiveCall& call, const std::vector<int64_t>& members,
                          const std::vector<const Tensor*>& ins) override;

  /// Number of communicators made (one per distinct mesh_axes set).
  size_t communicators() const { return comms_.size(); }

 private:
  struct Comm;
  const Comm& comm(const std::vector<int>& mesh_axes) const;
  DeviceMesh mesh_;
  int rank_;
  std::vector<Comm*> comms_;
};

/// Per-rank measurements of an MPI run.
struct RankStats {
  int rank = 0;
  std::string host;            // MPI_Get_processor_name of the rank's process (rank 0 knows every rank's)
  double compute_s = 0;        // wall time in this rank's kernels (and partition-id ops)
  double communication_s = 0;  // wall time in MPI collectives, waiting for slower ranks included
  double wall_s = 0;           // wall time from the barrier after the input scatter to the end of this rank's
                               // measured execution (weight slicing and input binding included)
  double run_s = 0;            // of which executing the program node by node (LocalRun::run_s): the step
  double cpu_s = 0;            // CPU time this process used over the measured execution (all its threads,
                               // CLOCK_PROCESS_CPUTIME_ID; includes spinning in MPI while waiting for peers)
  int64_t peak_memory_bytes = 0;
  double flops = 0;  // FLOPs this rank executed
};

/// Result of run_mpi.
struct MpiRun {
  std::vector<Tensor> outputs;   // rank 0: the full global outputs (graph-output order); other ranks: empty
  std::vector<RankStats> ranks;  // rank 0: every rank's stats, indexed by rank; other ranks: its own only
  std::vector<double> steps_s;   // rank 0: each measured execution's step (its slowest rank's run_s), in order
  int median_run = 0;            // rank 0: the execution `ranks` describes: the one with the median step
  double scatter_s = 0;          // this rank's wall time scattering the inputs
  double gather_s = 0;           // this rank's wall time gathering the outputs, stats and timelines
  /// rank 0: per rank, its steps of the execution `ranks` describes (LocalRun::timeline: nodes, op types, start and
  /// end), in seconds from the barrier that started that execution on the rank's own clock; other ranks: empty.
  std::vector<std::vector<ExecutedStep>> timelines;
};

/// Runs `p` on the MPI job: world rank r executes partition id r. Collective over MPI_COMM_WORLD.
/// - `inputs`: on rank 0 the full global inputs (one per global graph input, already checked against the model);
///   ignored on the other ranks. Each program input is sent to every rank as its shard (MPI_Scatter of
///   shard_tensor; MPI_Bcast for a replicated input).
/// - `device_model`: nullptr = run the SPMD program with this rank's slices of `global`'s initializers; otherwise
///   run this loaded device model (`device_<rank>.onnx`), whose inputs/outputs must have the program's local
///   shapes (`p` still gives the shardings used to scatter and assemble).
/// - Output shards are gathered on rank 0 (their shapes with MPI_Gather, then their bytes with MPI_Gatherv: a
///   data-dependent dim, docs/shapes.md step 6, has the size the run found) and assembled with assemble_tensor at
///   the run's global shape (run_shape); so are every rank's stats
///   and its timeline of the median execution (MpiRun::timelines).
/// - `warmup_runs` untimed executions come first (each rank's first execution pays oneDNN's primitive creation and
///   JIT compilation), then `measured_runs` (>= 1, else std::invalid_argument) measured ones, each after a barrier.
///   The stats are those of the measured execution whose step (its slowest rank's run_s) is the median (the upper
///   one for an even count); the outputs are the last execution's.
/// - `options`: how this rank's interpreter executes (speed only: ExecutorOptions in backend/pod/pod.h).
/// - `progress`: called after every node of the first execution (warm-up or measured) on this rank, as
///   RunProgress; a fused group reports its nodes at once.
/// Throws like run_spmd; errors thrown after the first collective leave the other ranks blocked, so the caller
/// must abort the job (Session::abort).
MpiRun run_mpi(const Session& session, const SpmdProgram& p, const Graph& global, const std::vector<Tensor>& inputs,
               const Graph* device_model, int warmup_runs = 1, int measured_runs = 1,
               const ExecutorOptions& options = {}, const RunProgress& progress = {});

/// Fingerprint of what a rank is about to run: program_fingerprint(p), combined when `with_weights` (SPMD mode) with
/// the bytes of every global initializer the program slices (params) and of the program's constants, so that ranks
/// with the same structure but other weights disagree too. O(model bytes).
uint64_t run_fingerprint(const SpmdProgram& p, const Graph& global, bool with_weights);

/// Collective: every rank passes its fingerprint; returns normally when all equal rank 0's, else every rank throws
/// RankFailure(2, "rank K: ranks were given different models: rank R has fingerprint F, rank 0 has G (every rank
/// needs the same MODEL, --shardings, --mesh, --target and weights)") naming the lowest mismatching rank.
void check_same_program(const Session& session, uint64_t fingerprint);

}  // namespace gspmd::mpi
