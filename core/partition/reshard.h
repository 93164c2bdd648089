// core/partition/reshard.h: the reshard planner. Turns one TensorSharding of a value into another on the same mesh
// with the cheapest sequence of exact steps: a shortest path over shardings (as DTensor's redistribute planner and
// OneFlow's boxing search), edges weighted by the target's cost model (core/cost: alpha-beta rings per mesh axis).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cost/target.h"
#include "core/ir/ir.h"
#include "core/program/program_ops.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// One step of a reshard. Every step is exact for uneven dims (shards ceil(d/n) long, padded at the end).
struct ReshardStep {
  enum class Kind {
    kAllReduce,      // combine the unreduced `axes` (all of the partial value)
    kReduceScatter,  // combine the unreduced `axes` and split `dim` over them (appended, minor); local dim % n == 0
    kAllToAll,       // move the trailing `axes` of dim `dim` to the end of dim `dim2` (both evenly divisible)
    kAllGather,      // drop the trailing `axes` of dim `dim`; `trim` drops the padding when the dim becomes whole
    kSlice,          // local: split dim `dim` further over the unused `axes` (appended, minor); no communication
    kPermute,        // collective-permute: same local shape, chunks move between devices (program_ops.h)
  };
  Kind kind = Kind::kAllReduce;
  std::vector<int> axes;         // mesh axes, major to minor (kPermute: the tiled axes of the source, in dim order)
  std::vector<int> target_axes;  // kPermute only: the same axes as laid out by the result, in dim order
  int dim = -1;
  int dim2 = -1;
  bool trim = false;
  TensorSharding after;  // the sharding once the step has run
  int64_t bytes = 0;     // per-device payload: the larger of the local operand and result (bytes)
  double seconds = 0;    // estimated time of the step on the target (s)
};

/// A planned reshard: steps in order and their summed estimate.
struct ReshardPlan {
  std::vector<ReshardStep> steps;
  double seconds = 0;  // sum of the steps' estimates (s)
  int64_t bytes = 0;   // sum of the collective steps' per-device payloads (bytes)
  int states = 0;      // shardings the search visited (for tests and explain)
};

/// The collective a step runs (kPermute: kCollectivePermute), or nullopt for the local kSlice.
std::optional<Collective> step_collective(ReshardStep::Kind k);
/// The step's name in messages and tests: collective_name of its collective, or "slice".
std::string_view step_name(ReshardStep::Kind k);

/// Plans and caches reshards for one mesh and target. The cache key is (global shape, element size, from, to), so a
/// Transformer's N identical layers search once. The search space depends on the mesh rank and tensor rank, never on
/// the device count.
class ReshardPlanner {
 public:
  ReshardPlanner(const DeviceMesh& mesh, const Target& target) : mesh_(mesh), target_(target) {}

  /// The cheapest plan from `from` to `to` for a value of `global` shape with `elem_bytes`-byte elements.
  /// Steps: all-reduce / reduce-scatter of unreduced axes that `to` does not keep, all-to-all, all-gather of trailing
  /// axes (where the kept prefix nests: ceil(d/T) == m*ceil(d/(T*m)), or the dim becomes whole), local slices,
  /// and collective-permutes between layouts with equal local shapes. Cost per collective: collective_time of
  /// core/cost; per slice: the bytes read / HBM bandwidth; ties go to fewer steps.
  /// `ragged` (per dim, may be empty): the dims whose size is a symbol's (docs/shapes.md), at `global` only at its
  /// hints: treated as dividing by no split (no reduce-scatter or all-to-all onto them, a trim whenever one is
  /// gathered whole), since a split that divides at the hints may not at another size.
  /// Throws InternalError when `to` keeps an unreduced axis `from` does not have (unreduced values cannot be
  /// created by a reshard) or the shardings do not fit the rank / mesh.
  const ReshardPlan& plan(const Shape& global, int64_t elem_bytes, const TensorSharding& from, const TensorSharding& to,
                          const std::vector<char>& ragged = {});

  /// Number of searches run (cache misses) and plans served from the cache.
  int64_t searches() const { return searches_; }
  int64_t hits() const { return hits_; }

 private:
  ReshardPlan search(const Shape& global, int64_t elem_bytes, const TensorSharding& from, const TensorSharding& to,
                     const std::vector<char>& ragged) const;

  DeviceMesh mesh_;
  Target target_;
  std::unordered_map<std::string, ReshardPlan> cache_;  // node-based: plan() hands out references into it
  int64_t searches_ = 0;
  int64_t hits_ = 0;
};

/// Sources of a collective-permute, per group member. The group is the devices that differ only along `mesh_axes`,
/// ordered by tile index over `mesh_axes`. Shift form (`target_axes` empty): member t receives from t - shift, or
/// gets zeros when that is outside [0, n); with `wrap`, from (t - shift) mod n (a cyclic shift: the pipeline's
/// circular schedule). Relayout form: `target_axes` is a permutation of `mesh_axes`, and member t
/// receives from the member whose tile index over `mesh_axes` equals t's tile index over `target_axes` (the chunk a
/// device must hold after a reshard that reorders axes). Returns -1 for "zeros". O(group size).
std::vector<int64_t> permute_sources(const DeviceMesh& mesh, const std::vector<int>& mesh_axes, int64_t shift,
                                     const std::vector<int>& target_axes, bool wrap = false);

}  // namespace gspmd
