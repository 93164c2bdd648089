// core/autodiff/accumulate: gradient accumulation (`--accumulate K`, docs/training.md "Gradient accumulation"): one
// training step over K microbatches of the model's batch, each running the forward pass, the loss and the backward
// pass on its own rows, their gradients summed into one accumulator per weight, then one optimizer update (DeepSpeed's
// gradient_accumulation_steps, T5X's num_microbatches, optax.MultiSteps). Unrolled in the step graph, microbatch after
// microbatch, so that one microbatch's activations are dead before the next one's forward pass: the step's peak
// holds one microbatch's saved activations, not K.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// What accumulate_microbatches builds from a one-microbatch step.
struct AccumulatedStep {
  Graph graph;
  int loss = -1;           // the step's loss: the microbatches' losses summed, times `loss_scale`
  std::vector<int> grads;  // parallel to the `grads` given: each one's accumulator (the sum over microbatches)
  /// Parallel to `grads`: each one's buffers before its last sum, the microbatches' gradients and the running sums
  /// (memory role kGradients, training_memory_roles).
  std::vector<std::vector<int>> partial_grads;
  /// Per microbatch, its forward pass (with its rows' slices and the loss) as the node range [begin, end) of `graph`
  /// (MemoryRoles::forward_ranges); its backward pass and its accumulation follow, up to the next range.
  std::vector<std::pair<int, int>> forward_ranges;
};

/// Unrolls the one-microbatch step in `g` over `k` microbatches (k >= 2). `g`'s nodes [0, differentiated) are the
/// forward pass and the loss, the rest up to the end the backward pass; nodes whose outputs reach neither `loss` nor
/// a gradient in `grads` are left out. `data` are graph inputs of `g` whose dim 0 is the microbatch batch `b`: each
/// becomes a graph input of the same name and position of shape [k*b, ...], whose rows i*k + m (microbatch-minor, so
/// that a split of dim 0 over devices holds its share of every microbatch) microbatch m reads, through a Reshape to
/// [b, k, ...] and a Gather of index m on dim 1. Microbatch 0 keeps `g`'s value and node names, microbatch m's copies
/// take the suffix "@mb<m>" (microbatch_name); a data input's slice for microbatch m is "<input>@mb<m>", m = 0 too
/// (the input's own name is the whole batch's). Values that are not computed from a data input (weights, constants,
/// their casts) are computed again per microbatch too: a cast weight copy lives for one microbatch, as in a scanned
/// step. Each gradient is summed with Add right after its microbatch's
/// backward pass (copies of the same gradient id share one accumulator); the loss is the sum of the microbatches'
/// losses times `loss_scale` (1/k for a mean: the caller seeds each backward pass with 1/k). O(k * (nodes + values)).
AccumulatedStep accumulate_microbatches(const Graph& g, int64_t k, size_t differentiated, int loss,
                                        const std::vector<int>& grads, const std::vector<int>& data, double loss_scale);

/// "<name>@mb<m>": the name of value `name`'s copy in microbatch m >= 1 of an accumulated step (m = 0 keeps `name`).
std::string microbatch_name(const std::string& name, int64_t m);
/// The model's name of a microbatch copy: `name` without a trailing "@mb<digits>" (`name` itself when it has none).
std::string model_name(const std::string& name);

}  // namespace gspmd
