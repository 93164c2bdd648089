// core/auto: automatic sharding search (`--auto`). The user's annotations are hard constraints; the search chooses
// annotations for the other weights and graph inputs so that the program that propagate -> partition ->
// simulate_cost produces has the smallest simulated step time on the target while its static per-device peak memory
// (memory_breakdown) stays within a limit. Design and its reasons: docs/auto.md.
//
// In short (OneFlow's auto-parallel and Alpa's intra-op pass choose per-op strategies; we choose annotations and let
// Shardy-style propagation and the partitioner derive every op's strategy, so what is costed is exactly what runs):
//  - variables: graph inputs, the weights a factor rule contracts over (MatMul/Gemm/Conv/Gather...) and the
//    activation operands of those contractions;
//  - per variable, candidates from the factor rules: for each mesh axis, the tensor dim (factor) it splits, or none,
//    skipping dims whose factor must stay replicated and dims smaller than the axis (activations: pass-through dims
//    only); plus "free" (no annotation: propagation decides);
//  - repeated layers: variables whose names differ only in whole numeric name components (h.3.attn.q.weight ->
//    h.#.attn.q.weight) and have the same shape and type are one group with one decision; an activation operand is
//    tied through its weight ("input of h.#.mlp.fc_in.weight"); so the number of decisions does not grow with the
//    number of layers;
//  - seeds: everything free, data parallel over all mesh axes, data parallel over the first axis, Megatron + data
//    (the model axis splits the contractions' weights, alternating column / row as the propagated activations
//    dictate, the others split the batch), 2D weights, and a hybrid (data parallel, with Megatron on the largest
//    weight groups until the plan fits);
//  - coordinate descent from the best seed: per group, every candidate is evaluated with the rest fixed and the best
//    is kept; sweeps repeat until one changes nothing (or the time budget is spent); while no plan fits, the descent
//    is repeated from the next best distinct seed (three starts at most).
// Every evaluation is the real pipeline (refine_for_reshapes, propagate, partition with the reshard planner,
// simulate_cost, memory_breakdown); O(groups * candidates * sweeps) evaluations, each linear in the graph size.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/autodiff/autodiff.h"
#include "core/cost/cost.h"
#include "core/cost/target.h"
#include "core/ir/ir.h"
#include "core/ir/name_pattern.h"
#include "core/propagation/propagation.h"
#include "core/sharding/sharding.h"

namespace gspmd {

class RuleTable;  // core/rules/rule.h

/// Where the search is, passed to AutoOptions::progress (for a progress display; the library prints nothing).
struct AutoProgress {
  int evaluations = 0;          // pipeline evaluations so far (cache hits excluded): grows by one per call, except
                                // for the last call (`done`), which repeats the final count
  int descent = 0;              // the coordinate descent under way (1-based); 0 while the seeds are costed
  int sweep = 0;                // its sweep (1-based); 0 while the seeds are costed
  int group = 0;                // groups already visited in this sweep (0 .. groups)
  int groups = 0;               // decisions (groups of tied variables) in all
  double best_step_time_s = 0;  // the best plan so far that fits in memory (s); 0 while none fits
  double elapsed_s = 0;         // wall time since the search started (s)
  bool done = false;            // the search is over: the last call
};

/// A graph --auto costs: a forward graph, or the training step built from it, with the step's memory roles.
struct AutoModel {
  Graph graph;
  std::optional<MemoryRoles> roles;      // the training step's (memory_breakdown), or none for a forward graph
  std::optional<TrainingStep> training;  // the step `graph` is (its own `graph` moved into `graph`), or none
};

/// How a training step is built and its update sharded: what --auto chooses besides the annotations.
struct StepChoice {
  RematPolicy remat = RematPolicy::kNone;  // --remat
  /// Weight-update sharding over this mesh axis (--shard-update; the step built with TrainingOptions::shard_update,
  /// its values annotated by annotate_step, core/autodiff/step_shardings.h), or -1 for none.
  int update_axis = -1;
  /// For a cut model's build (layered costing with AutoOptions::accumulate > 2): the microbatches to accumulate over
  /// (TrainingOptions::accumulate); 0: the step's own.
  int64_t microbatches = 0;
  friend bool operator==(const StepChoice&, const StepChoice&) = default;
};

/// Builds the graph that --auto costs from a forward graph: the identity without --training, else the training step
/// under `step` (build_training_step with the run's options, rematerialization policy step.remat, shard_update when
/// step.update_axis >= 0; restricted to the weights the graph has). Called on the model cut to its first layers
/// (keep_first_layers, core/pipeline/blocks.h), and on the whole forward graph when the search chooses another
/// choice than the step's. May throw: the search then costs whole graphs, under the step's own choice.
using AutoModelBuilder = std::function<AutoModel(Graph forward, const StepChoice& step)>;

/// Options of the search. Units: bytes, seconds.
struct AutoOptions {
  Target target;                              // the pod whose simulated step time is minimised (--target)
  int64_t memory_limit_bytes = 0;             // per-device peak limit; 0 = target.hbm_bytes (--memory-limit)
  bool overlap = false;                       // cost with overlapped collectives (--overlap)
  const MemoryRoles* memory_roles = nullptr;  // a training step's memory roles (memory_breakdown), or null; must
                                              // outlive the search
  /// The training step the searched graph is (its names; its `graph` may be moved out), or null. A weight the
  /// search annotates passes its sharding to its gradient, updated value and optimizer state, as the user's
  /// annotations do (docs/training.md); must outlive the search.
  const TrainingStep* training = nullptr;
  /// Layered costing (docs/auto.md, "Scale"): the model before --training's step is built (the graph searched
  /// when there is no step), and the builder of the searched graph from it. When both are set and the forward graph
  /// has at least three alike layer blocks (find_layer_blocks) and the constraints treat every layer alike, plans
  /// are costed on the model cut to two blocks and to one and extrapolated linearly to all of them; the plan chosen
  /// is costed again on the whole graph. `forward` must outlive the search.
  const Graph* forward = nullptr;
  AutoModelBuilder build;
  /// A training step's build, as the searched graph was built (--remat, --shard-update). The search annotates the
  /// step's values that follow the weights (annotate_step) under step.update_axis.
  StepChoice step;
  /// With layered costing: the rematerialization policies the search chooses among (--training without --remat:
  /// none, dots, full); empty: only step.remat. Each seed is costed under each; the descent keeps the best seed's.
  std::vector<RematPolicy> remat_choices;
  /// With layered costing (--training without --shard-update): each seed is also costed with weight-update sharding
  /// over the data axis (the first mesh axis of more than one device that is not the Megatron seed's model axis),
  /// and the rematerialization policies under the better of the two (docs/auto.md, "Training").
  bool update_choice = false;
  /// The step's microbatches (--accumulate, TrainingOptions::accumulate). With layered costing and more than 2, the
  /// cut models are built with 2 and with 3 microbatches (StepChoice::microbatches) and the times extrapolated
  /// linearly to this many (each microbatch adds the same work), so that the search's cost does not grow with it.
  int64_t accumulate = 1;
  /// Return the best plan found when none fits the memory limit (chosen.fits false) instead of the "no sharding
  /// plan fits" error: `--pipeline auto` goes on to stage counts, which hold less per device.
  bool best_if_none_fits = false;
  int max_sweeps = 4;         // coordinate-descent sweeps at most
  double time_budget_s = 50;  // stop the descent (keeping the best plan so far) once this much time is spent
  /// Called on the searching thread after every pipeline evaluation and once more at the end (done = true), also
  /// when the search then throws (so it must not throw itself). Empty: no calls.
  std::function<void(const AutoProgress&)> progress;
};

/// One evaluated plan: the real pipeline's simulated step and static peak memory.
struct AutoPlanCost {
  /// "auto", or the seed: "replicated" ("annotations only" when there are constraints: nothing else annotated),
  /// "data-parallel", "fsdp", "megatron+data", ...
  std::string name;
  std::string same_as;        // a seed the constraints make the same plan as an earlier one: that one's name, else ""
  bool valid = false;         // false: the pipeline rejected the plan (`error` says why)
  bool estimated = false;     // extrapolated from the model cut to its first layers (layered costing)
  StepChoice step;            // a training step's build the plan was costed under
  double step_time_s = 0;     // simulate_cost(...).step_time_s (s)
  double compute_time_s = 0;  // (s)
  double communication_time_s = 0;  // (s)
  int64_t peak_memory_bytes = 0;    // memory_breakdown of the program, per device (bytes)
  bool fits = false;                // peak_memory_bytes <= the limit
  std::string error;
};

/// The decision for one group of tied variables.
struct AutoChoice {
  std::string group;        // display key: the first member's name with layer numbers as '#' (plus the
                            // shape when another group has the same key)
  std::vector<int> values;  // value ids of the members (graph order)
  bool annotated = false;   // false: left to propagation ("free")
  TensorSharding sharding;  // on the user's mesh, when annotated
};

/// What the search found, plus the obvious alternatives for `explain --auto`.
struct AutoResult {
  /// The constraints plus the chosen annotations, on the user's (unrefined) mesh; a training step's values that
  /// follow the weights are not among them (annotate_step adds them, under chosen.step.update_axis).
  Annotations annotations;
  std::vector<AutoChoice> choices;      // one per group, in order of first use
  AutoPlanCost chosen;                  // the chosen plan's cost (name "auto")
  std::vector<AutoPlanCost> baselines;  // the seeds: "replicated", "data-parallel", "megatron+data" (when built)
  int64_t memory_limit_bytes = 0;       // the limit used (bytes)
  double search_time_s = 0;             // wall time of the search (s)
  int evaluations = 0;                  // pipeline evaluations run (cache hits excluded)
  int variables = 0;                    // tensors decided by the search
  int groups = 0;                       // decisions after tying repeated layers
  int sweeps = 0;                       // coordinate-descent sweeps run, over all starts
  int starts = 0;                       // descents run (more than one only while no plan fitted; at most 3)
  bool budget_exhausted = false;        // the time budget stopped the descent
  int64_t layer_blocks = 0;             // layered costing: the alike layer blocks the costs were extrapolated to
                                        // (0: every plan was costed on the whole graph)
  /// Set when the chosen step is not built as the searched graph was: the step rebuilt under chosen.step (from
  /// AutoOptions::build on the whole forward graph). `annotations` and `chosen` are then for this graph.
  std::optional<AutoModel> model;
};

/// Searches a plan for `g` over `constraints.mesh` (the user's mesh, not refined) that keeps every annotation of
/// `constraints` (hard constraints; there may be none) and minimises the simulated step time within the memory limit.
/// Throws InputError("--auto: no sharding plan fits in L bytes per device; the best plan found needs P bytes per device
/// (searched from the S plan[, remat R][, weight update sharded over 'A'])") when
/// no candidate fits, and InputError("--memory-limit: ...") for a negative limit. The returned annotations (for a
/// training step with annotate_step under chosen.step.update_axis), refined, propagated and partitioned with the same
/// target, give exactly `chosen`. `rules`: the graph's rule table
/// (RuleTable(g), shared by every evaluation); built here when null.
AutoResult auto_shard(const Graph& g, const Annotations& constraints, const AutoOptions& o,
                      const RuleTable* rules = nullptr);

/// One of the classical plans auto_shard seeds its search with (docs/auto.md, "Seeds"), built for `g` over
/// `constraints.mesh` and not costed: `name` is "data-parallel" (every axis splits the batch), "fsdp" (ZeRO-3: the
/// batch and every weight's largest dim over every axis), "megatron+data" ("megatron" on a one-axis mesh: Megatron-LM's
/// column / row-parallel weights over the model axis, the batch over the others), "megatron-sp" (with sequence
/// parallelism), "2d-weights" or "2d" (the GSPMD paper's 2D plan, section 5.1, with its [data, -, model] residual
/// stream). The stream plans need alike layer blocks (`o.forward` and `o.build` set, as for layered costing). Returns
/// one choice per group of tied variables (their annotations), or nothing when the mesh or the model does not give
/// the plan (Megatron on one device, 2D on a one-axis mesh, a stream plan without layer blocks). Throws what
/// auto_shard's setup throws.
std::vector<AutoChoice> classical_plan(const Graph& g, const Annotations& constraints, const std::string& name,
                                       const AutoOptions& o, const RuleTable* rules = nullptr);

}  // namespace gspmd
