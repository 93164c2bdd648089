// core/autodiff: one training step as one graph (docs/training.md): the forward graph, a loss, the backward pass by
// reverse-mode differentiation (each op's gradient rule, core/rules/gradient.h) and the optimizer update, all in
// standard ONNX ops, so that propagation, the partitioner, the kernels, the cost model and the exporter treat the
// step like any model (GSPMD paper §5: the training step is partitioned as one SPMD program).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cost/cost.h"
#include "core/ir/ir.h"

namespace gspmd {

/// How the loss is formed from the model's output 0 (`--loss`).
enum class LossKind {
  kOutput,        // output 0 itself; it must be a scalar (the default)
  kMean,          // the mean of all elements of output 0
  kSum,           // the sum of all elements of output 0
  kCrossEntropy,  // output 0 is logits [..., C]; labels [...] (int) in `labels`; mean over positions of
                  // -log_softmax(logits)[label] (torch.nn.functional.cross_entropy with reduction "mean")
};

/// The optimizer (`--optimizer`), one step, following torch.optim's update formulas (Adafactor: HF transformers').
enum class OptimizerKind {
  kSgd,       // w - lr * g
  kMomentum,  // v = momentum * v + g; w - lr * v (torch.optim.SGD with momentum, dampening 0)
  kAdam,      // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
  // Shazeer & Stern 2018 as HF transformers' Adafactor (scale_parameter, relative_step, warmup_init off, no first
  // moment): second moments of g^2 + eps factored over the last two dims, beta2_t = 1 - t^-0.8, the update clipped
  // to RMS 1; w - lr * update (docs/training.md gives the formula)
  kAdafactor,
};

/// Rematerialization (`--remat`): which forward values the backward pass keeps; the others it recomputes from the kept
/// ones, by copies of their producers emitted where the backward first reads them (jax.checkpoint; Chen et al.
/// 2016). Segment boundaries are the forward graph's cut values: a value computed from the weights after which
/// nothing computed from the weights before it is still read (the residual stream between and inside transformer
/// blocks, a CNN's block outputs). Values not computed from a weight, graph inputs, initializers and the outputs of
/// nondeterministic ops are always kept.
enum class RematPolicy {
  kNone,  // keep everything the backward reads (the default)
  kFull,  // keep only the cut values: each segment is recomputed once in the backward (Megatron's "full" recompute)
  kDots,  // also keep the outputs of contractions (MatMul, Gemm, Einsum, Conv...), recompute the rest
          // (jax.checkpoint_policies.dots_saveable)
};

/// "none", "full", "dots" (the --remat spelling).
std::string_view remat_name(RematPolicy p);

/// `--training` choices (docs/training.md).
struct TrainingOptions {
  LossKind loss = LossKind::kOutput;
  /// kCrossEntropy: the labels' graph input. An existing input (integer, output 0's shape minus its last dim) is
  /// used; otherwise a new int64 graph input of that name and shape is added after the model's inputs.
  std::string labels;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double lr = 0.01, momentum = 0.9, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // eps: Adam's, or Adafactor's eps1
  int64_t step = 1;  // the step number t (Adam's bias correction, Adafactor's beta2_t)
  /// Weight-update sharding (`--shard-update`): each update is computed into its own value `<w>.update_shard`,
  /// then copied (Identity) to `<w>.updated`, so the caller can shard the update and the optimizer state while the
  /// updated weight keeps the weight's sharding (Xu et al. 2020; ZeRO stage 1/2).
  bool shard_update = false;
  RematPolicy remat = RematPolicy::kNone;  // `--remat`
  /// `--accumulate K`: one step over K microbatches of the model's batch, gradients summed before one update
  /// (core/autodiff/accumulate.h). The data inputs (graph inputs, not trained, whose dim 0 is output 0's, and the
  /// labels) take K times the model's batch; needs a loss that sums or averages over it (not LossKind::kOutput).
  int64_t accumulate = 1;
  /// Under --remat: forward values always saved, never recomputed, and so never what keeps a node from being a cut
  /// point (a pipeline's microbatch rows and results, which live across its iterations: core/pipeline/schedule.h).
  std::vector<std::string> remat_keep;
  /// The weights to train: names of floating-point initializers or graph inputs of the forward graph. A graph input
  /// is a variable (JAX's params as arguments): its optimizer state becomes graph inputs too, after the others, where
  /// an initializer's is initializers of zeros. Weights that do not reach the loss are left out
  /// (TrainingStep::unused).
  std::vector<std::string> trainable;
  /// Names that matched the trainable pattern but are not floating point (integer graph inputs): not trained,
  /// reported (TrainingStep::ignored).
  std::vector<std::string> ignored;
};

/// The result of build_training_step: the step graph and the names of what it computes.
struct TrainingStep {
  /// Inputs: the forward graph's inputs (and the added labels input), then the optimizer state of the variables
  /// (trained graph inputs). Initializers: the weights, their optimizer state (zeros, or no data when the weights
  /// have none) and constants. Outputs: the loss, then per weight its
  /// updated value, then the updated optimizer state, weight by weight.
  Graph graph;
  std::string loss;
  /// One trained weight: its value, its gradient, its updated value, and the optimizer state (before, after).
  struct Weight {
    std::string name, grad, updated;
    std::string update_shard;  // with shard_update: the update before it is copied to `updated` ("" otherwise)
    std::vector<std::string> state, state_updated;
    /// Per state tensor: the weight dim it lacks (Adafactor's factored accumulators are means over the last or
    /// the second-to-last dim), or -1 when it has the weight's shape. Parallel to `state`.
    std::vector<int> state_reduced_dim;
    /// With accumulation: its gradient's buffers before the last sum (each microbatch's gradient, the running sums);
    /// memory role kGradients like `grad`.
    std::vector<std::string> partial_grads;
  };
  std::vector<Weight> weights;
  std::vector<std::string> unused;   // trainable names that do not reach the loss (no gradient, not updated)
  std::vector<std::string> ignored;  // TrainingOptions::ignored: matched, not floating point, not trained
  /// The forward passes (with the loss) as node ranges [begin, end) of `graph`: one, [0, n), after which the backward
  /// pass and the update follow; with accumulation one per microbatch, each followed by its backward pass.
  std::vector<std::pair<int, int>> forward_ranges;
  int64_t accumulate = 1;  // TrainingOptions::accumulate
  /// With accumulation: the data inputs split into microbatches (their dim 0 is the step's batch), by name.
  std::vector<std::string> batch_inputs;
  RematPolicy remat = RematPolicy::kNone;
  int recomputed_nodes = 0;     // --remat: forward nodes copied into the backward pass (named "remat/<node>")
  double recomputed_flops = 0;  // their FLOPs (node_flops, core/cost/cost.h), in the unpartitioned step
};

/// The memory roles of the step's values (core/cost/cost.h, memory_breakdown), over `g` (the step's graph, or a
/// graph with the same value names): weights and updated weights kWeights, gradients (with accumulation
/// Weight::partial_grads too) kGradients, optimizer state kOptimizerState; the weights and the state are donated
/// (their updated values replace them, as with XLA's input-output aliasing). Throws std::out_of_range when a named
/// value is not in `g`.
MemoryRoles training_memory_roles(const Graph& g, const TrainingStep& step);

/// Builds one training step of `forward` (a loaded graph: static shapes, every node typed; taken by value, so a
/// caller that no longer needs it moves it in). `shapes` types the emitted nodes (the executor's shape functions).
/// Throws InputError for: an unknown trainable name, or one that is not a floating-point initializer or graph input, a
/// non-scalar output 0 with LossKind::kOutput, labels of the wrong type or shape, no trainable weight reaching the
/// loss, and an op on a path from a weight to the loss without a gradient rule ("--training: node 'n' (Op): no gradient
/// rule for Op"); with accumulate > 1, LossKind::kOutput, a scalar output 0, or no data input that leads with output
/// 0's batch ("--accumulate: ..."). Throws InternalError when a rule emits a gradient of the wrong dtype or shape (a
/// bug). O(nodes + edges) plus the emitted nodes' shape functions.
TrainingStep build_training_step(Graph forward, const TrainingOptions& options, const ShapeFunction& shapes);

}  // namespace gspmd
