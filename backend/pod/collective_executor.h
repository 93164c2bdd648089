// backend/pod: the seam between the SPMD interpreter (pod.h) and whatever carries out its `gspmd` collectives.
//
// The interpreter runs the program for the devices held by one process: all of them in the emulator, one per rank
// under MPI (backend/mpi). At every collective node it hands each replica group that has members in this process to a
// CollectiveExecutor, with the operands of those members. InProcessCollectives (the emulator) holds every member and
// calls collectives.h; backend/mpi's MpiCollectives holds one member and calls MPI. Semantics of every op:
// core/program/program_ops.h and docs/collectives.md.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/ir.h"
#include "core/program/program_ops.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// One execution of a `gspmd` collective node for one replica group.
struct CollectiveCall {
  const Node* node = nullptr;                     // the program node (for messages)
  Collective op = Collective::kAllReduce;         // which collective (core/program/program_ops.h)
  std::vector<int> mesh_axes;                     // the mesh axes the group spans, major to minor
  const std::vector<int64_t>* group = nullptr;    // the group's global device ids in tile order
                                                  // (DeviceMesh::replica_groups(mesh_axes))
  ReductionKind reduction = ReductionKind::kSum;  // AllReduce, ReduceScatter
  int64_t axis = 0;                               // AllGather, ReduceScatter: the tensor axis
  int64_t split_axis = 0, concat_axis = 0;        // AllToAll
  std::vector<int64_t> sources;  // CollectivePermute: per tile t, the tile t receives from (-1: zeros),
                                 // from permute_sources (core/partition/reshard.h)
};

/// Carries out collectives for the members of a replica group that the calling process holds.
class CollectiveExecutor {
 public:
  virtual ~CollectiveExecutor() = default;
  /// Runs `call` for the members of *call.group held by this process: `members` are their tile indices (ascending,
  /// non-empty) and `ins[k]` is the operand of member members[k] (same dtype and local shape on every member, as
  /// the SPMD program guarantees). Returns one result per entry of `members`, in the same order.
  /// Throws InternalError when the operands violate the op's contract (shape, axis, divisibility) or the
  /// transport fails, UnsupportedError for a reduction over an unsupported dtype.
  virtual std::vector<Tensor> run(const CollectiveCall& call, const std::vector<int64_t>& members,
                                  const std::vector<const Tensor*>& ins) = 0;
};

/// The emulator's collectives: every member of the group is in this process (`members` must be every tile), and the
/// in-process implementations of collectives.h compute all results at once (reductions in tile order, so members
/// agree bitwise). Stateless.
class InProcessCollectives final : public CollectiveExecutor {
 public:
  std::vector<Tensor> run(const CollectiveCall& call, const std::vector<int64_t>& members,
                          const std::vector<const Tensor*>& ins) override;
};

/// Collectives between devices that each run in their own thread (run_device_graph on device files: `run --program`
/// on the emulator, docs/cli.md): the k-th collective call of every member of a group meets in one slot, whose last
/// arrival computes all results with InProcessCollectives (so results equal the emulator's bitwise); each call blocks
/// until its group is complete. `members` must be the caller's one tile. A device that fails calls fail(), which
/// releases every waiting device with that exception. Thread-safe; slots are kept until destruction (one per
/// collective call of a run).
class ThreadCollectives final : public CollectiveExecutor {
 public:
  /// For a mesh of `devices` devices.
  explicit ThreadCollectives(int64_t devices);
  std::vector<Tensor> run(const CollectiveCall& call, const std::vector<int64_t>& members,
                          const std::vector<const Tensor*>& ins) override;
  /// Makes every pending and later run() throw `e` (the first failure wins).
  void fail(std::exception_ptr e);

 private:
  struct Slot {
    std::vector<Tensor> ins, outs;
    size_t arrived = 0;
    bool done = false;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> calls_;                         // per device: collectives called so far
  std::map<std::pair<int64_t, int64_t>, Slot> slots_;  // (call index, group's first device)
  std::exception_ptr failed_;
};

}  // namespace gspmd
