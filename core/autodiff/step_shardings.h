// core/autodiff/step_shardings: how a training step's values take their weights' shardings (docs/training.md,
// "Annotated weights" and "Weight-update sharding"). One rule for both callers: the CLI applies it to the sharding
// file's annotations, --auto (core/auto) to the annotations it chooses.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/autodiff/autodiff.h"
#include "core/ir/ir.h"
#include "core/propagation/propagation.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// One trained weight of a step and the values that take its sharding.
struct WeightFollowers {
  /// A value that follows the weight.
  struct Follower {
    int value = -1;
    int reduced_dim = -1;  // the weight dim it lacks (Adafactor's factored state: a mean over that dim), or -1
    bool update = false;   // the gradient, the update or optimizer state (sharded further under weight-update
                           // sharding); false: the updated weight, which always keeps the weight's sharding
    /// With accumulation: a buffer of the gradient before its last sum (TrainingStep::Weight::partial_grads), which
    /// follows the weight only where the batch splits over an axis the weight is split over (annotate_step).
    bool partial = false;
  };
  int weight = -1;   // value id
  std::string name;  // the weight's name
  std::vector<Follower> values;
};

/// The followers of every weight of `step` that is a value of `g` (the step's graph, or one with the same value
/// names), looked up by name: the gradient, the update (TrainingStep::Weight::update_shard), every optimizer state
/// tensor before and after, the updated weight, and with accumulation the gradient's partial buffers. Names not in
/// `g` are skipped. O(weights) lookups.
std::vector<WeightFollowers> step_followers(const Graph& g, const TrainingStep& step);

/// The value ids in `g` of the step's data inputs that accumulation splits into microbatches
/// (TrainingStep::batch_inputs; empty without accumulation).
std::vector<int> step_batch_inputs(const Graph& g, const TrainingStep& step);

/// The sharding of a weight's gradient, update and optimizer state under weight-update sharding over mesh axis
/// `axis` (Xu et al. 2020, ZeRO stages 1 and 2): the weight's sharding `w` (over a tensor of `shape`) with `axis` added
/// (minor) to its largest dim whose shard still holds at least size(axis) elements; `w` itself when it already uses
/// `axis` or no dim is long enough.
TensorSharding update_sharding(const TensorSharding& w, const Shape& shape, const DeviceMesh& mesh, int axis);

/// Adds to `a` the annotations of the step's followers from their weights' annotations in `a` (annotations `a`
/// already holds are kept):
///  - an annotated weight's followers take its sharding (a state tensor that lacks a dim: without that dim), with the
///    source `<weight's source> (--training: follows '<w>')`;
///  - `update_axis` >= 0 (weight-update sharding): the gradient, the update and the state take update_sharding of it
///    (source `... (--training: the update of '<w>')`), the updated weight the weight's own sharding, and an
///    unannotated weight of rank 2 or more is first held replicated (source `<held>: '<w>' is not annotated, held
///    replicated`), since otherwise propagation would carry the update's sharding back into the weight (ZeRO-3, not
///    update sharding). An unannotated vector (a bias, a LayerNorm scale) is left to propagation with its update:
///    holding it replicated would fight the sharding its consumers give it (the 2D plan splits a bias over the model
///    axis), for a saving of a few bytes.
///  - with accumulation, a gradient's partial buffers take the weight's sharding only when the weight is split over a
///    mesh axis that also splits dim 0 of one of `batch_inputs` (annotated in `a`): each microbatch's gradient, a
///    partial sum over that axis, is then reduce-scattered into the weight's shards and accumulated there (FSDP's
///    and the 2D plan's way: a full-size partial accumulator would hold the whole weight's gradient); otherwise
///    they are left to propagation, which accumulates partial sums and reduces them once per step (data parallelism,
///    Megatron).
/// `update_axis` must be an axis of a.mesh. O(followers).
void annotate_step(const Graph& g, const std::vector<WeightFollowers>& weights, int update_axis, std::string_view held,
                   Annotations& a, const std::vector<int>& batch_inputs = {});

/// A step accumulated over `k` microbatches (TrainingOptions::accumulate): every annotation in `a` of a value that
/// microbatch 0 computes goes to its copies in the other microbatches too ("<name>@mb<m>", microbatch_name), unless
/// they have their own; the source says so (`<source> (--accumulate: microbatch m)`). O(annotations * k) lookups.
void annotate_microbatches(const Graph& g, int64_t k, Annotations& a);

}  // namespace gspmd
