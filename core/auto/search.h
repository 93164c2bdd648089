// core/auto (private to the module): the sharding search behind --auto (docs/auto.md), its variables, groups and
// instances. auto.cc runs the search (costing, descent, layered costing); seeds.cc builds the classical plans it
// starts from.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/auto/auto.h"
#include "core/autodiff/step_shardings.h"
#include "core/rules/rule.h"

namespace gspmd::auto_internal {

using Clock = std::chrono::steady_clock;

/// What a variable is: the search chooses each kind's candidates and seeds differently.
enum class VarKind {
  kWeight,      // an initializer or graph input (a variable of the step) that a factor rule contracts over
  kInput,       // another graph input (the batch)
  kActivation,  // the activation operand of a contraction over a weight (pass-through dims only)
  kStream,      // a residual-stream value between and inside layer blocks (layered costing): any dim, d_model too
                // (the paper's [data, -, model]; a LayerNorm over a split d_model is the partitioner's to reshard)
};

/// A variable of one graph: a value the search annotates, and the key that ties it to its group.
struct Var {
  int value = -1;
  std::string key;   // group key: kind, layer key, shape, dtype
  std::string name;  // display: the layer key, or "input of <weight's layer key>"
  VarKind kind = VarKind::kWeight;
  int weight = -1;  // activations: the weight of its first contracting consumer
};

/// A graph the search costs plans on: the whole model, or the model cut down to its first layers (layered costing).
struct Instance {
  std::unique_ptr<Graph> own_graph;
  const Graph* g = nullptr;
  Annotations cons;  // the constraints, on this graph's values
  std::unique_ptr<MemoryRoles> own_roles;
  const MemoryRoles* roles = nullptr;
  std::unique_ptr<RuleTable> own_rules;
  const RuleTable* rules = nullptr;
  std::vector<std::vector<int>> members;  // per group: this graph's values (graph order)
  /// A training step's trained weights and the values that take their shardings (annotate_step), under
  /// weight-update sharding over this mesh axis (or -1).
  std::vector<WeightFollowers> followers;
  std::vector<int> batch_inputs;  // with accumulation: the data inputs split into microbatches (step_batch_inputs)
  int update_axis = -1;
};

/// A group of tied variables and its candidate shardings (index 0 = free, no annotation).
struct Group {
  std::string key;           // display
  std::string tie;           // Var::key of its members
  std::vector<int> members;  // the base instance's values
  VarKind kind = VarKind::kWeight;
  int act_group = -1;  // weight groups: the group of their contraction's activation operand, if any
  std::vector<std::optional<TensorSharding>> candidates;
};

/// a is a better plan than b: valid first, then fitting, then (fitting) shorter step and less memory, (not fitting)
/// less memory.
bool better(const AutoPlanCost& a, const AutoPlanCost& b);

class Search {
 public:
  Search(const Graph& g, const Annotations& constraints, const AutoOptions& o, const RuleTable& rules)
      : o_(o), mesh_(constraints.mesh) {
    limit_ = o.memory_limit_bytes > 0 ? o.memory_limit_bytes : static_cast<int64_t>(o.target.hbm_bytes);
    full_.g = &g;
    full_.cons = constraints;
    full_.roles = o.memory_roles;
    full_.rules = &rules;
    if (o.training) {
      full_.followers = step_followers(g, *o.training);
      full_.batch_inputs = step_batch_inputs(g, *o.training);
    }
    full_.update_axis = o.step.update_axis;
    model_axis_ = mesh_.axis_index("model");
    if (model_axis_ >= 0 && mesh_.shape[model_axis_] <= 1) model_axis_ = -1;
    for (int a = mesh_.rank() - 1; a >= 0 && model_axis_ < 0; --a)
      if (mesh_.shape[a] > 1) model_axis_ = a;
    for (int a = 0; a < mesh_.rank(); ++a)
      if (a != model_axis_) data_axes_.push_back(a);
  }

  AutoResult run();
  /// The classical plan `name` (a seed of run(): "data-parallel", "fsdp", "megatron+data", "2d", ...; not "hybrid",
  /// which is costed), uncosted; empty when the mesh or the model does not give that plan.
  std::vector<AutoChoice> classical(const std::string& name);

 private:
  /// A plan a descent starts from (a seed under its best step choice), or the best it reached.
  struct Start {
    AutoPlanCost cost;
    std::vector<int> assign;
    size_t step_index = 0;  // in steps_
    std::string seed;       // the seed the plan was searched from
  };
  /// The seeds (classical_seeds), each costed under every step choice: its best is its baseline (res.baselines).
  /// Returns the distinct seeds, best first.
  std::vector<Start> cost_seeds(AutoResult& res);
  /// Coordinate descent over the groups from the best start, under its step choice; repeated from the next best
  /// distinct start while no plan fits (three at most, within half the time budget). Counts sweeps and starts in res.
  Start descend(const std::vector<Start>& starts, AutoResult& res);
  /// Layered costing: the descent's plan, and while it does not fit the best fitting starts, costed on the whole
  /// graph; `best` becomes the better. Returns the instance the plan is for (full_ without layered costing).
  const Instance* decide_on_whole(Start& best, const std::vector<Start>& starts);
  /// Seconds since run() started.
  double elapsed() const;
  /// setup_layers(), find_groups() and every instance's members: what run() and classical() start from. Costs the
  /// cut models once (with nothing annotated) to check that they are like the model.
  void prepare();
  /// The seeds, named: every classical plan the mesh gives (with `hybrid`, the costed hybrid one too).
  std::vector<std::pair<std::string, std::vector<int>>> classical_seeds(bool hybrid);
  /// One AutoChoice per group: its members in `in` and its candidate under `assign`.
  std::vector<AutoChoice> choices_of(const Instance& in, const std::vector<int>& assign) const;
  /// Layered costing (docs/auto.md, "Scale"): when o_.forward has at least three alike layer blocks, plans are costed
  /// on the model cut to its first two blocks and to its first one (per step choice), and extrapolated to all of
  /// them. Sets up steps_, layers_, blocks_ and stream_names_; leaves the search on the whole graph (steps_ =
  /// {o_.step}) otherwise.
  void setup_layers();
  /// The variables of one graph (graph inputs, contracted weights, their contractions' activation operands), in
  /// order of first use.
  std::vector<Var> find_variables(const Instance& in) const;
  void find_groups();
  /// in.members from the group keys of in's variables.
  void assign_members(Instance& in, const std::vector<Var>& vars) const;
  /// The constraints and the choices of `assign` on in's values.
  Annotations choices(const Instance& in, const std::vector<int>& assign) const;
  /// choices(), and a training step's values that follow the weights (annotate_step under in.update_axis).
  Annotations annotations(const Instance& in, const std::vector<int>& assign) const;
  /// The pipeline on one graph (throws what it throws). `resident` (optional): the bytes live together when the
  /// forward pass ends: weights, optimizer state, saved activations (one microbatch's, with accumulation) and inputs,
  /// in all (MemoryBreakdown::total).
  AutoPlanCost cost_on(const Instance& in, const std::vector<int>& assign, int64_t* resident = nullptr) const;
  /// Dims of value v that every consuming rule lets be split (and that have at least 2 elements). For activations
  /// (`pass_through_only`), only dims whose factors are pass-through everywhere: the batch-like dims that decide
  /// where a contraction runs (contracted and windowed dims follow from the weights and propagation).
  std::vector<int> allowed_dims(int v, const std::vector<std::vector<int>>& consumers, bool pass_through_only) const;
  void add_candidates(Group& gr, const std::vector<int>& dims) const;
  int candidate_index(const Group& gr, const TensorSharding& s) const;
  /// One counted evaluation under step_: `cost()`, or its error as an invalid plan (rethrown when `rethrow`); the
  /// progress is told.
  AutoPlanCost counted(const std::function<AutoPlanCost()>& cost, bool rethrow = false);
  /// Layered costing: the plan's cost under step_, extrapolated from the two cut models to all blocks_ blocks.
  AutoPlanCost extrapolated(const std::vector<int>& assign) const;
  /// The plan's cost (remembered): the pipeline on the whole graph, or extrapolated from the layered instances.
  AutoPlanCost evaluate(const std::vector<int>& assign, bool rethrow = false);
  std::vector<int> data_parallel_seed(const std::vector<int>& axes) const;
  std::optional<std::vector<int>> megatron_seed();
  /// Weight-update sharding's axis (AutoOptions::update_choice): the first axis of more than one device that is not
  /// the model axis, else the model axis (a one-axis mesh); -1 for a mesh of one device.
  int data_axis() const;
  /// From the Megatron seed: every weight it splits over the model axis gets the other mesh axes on its other dim
  /// (the GSPMD paper's 2D weight sharding, section 5.1); inputs are left free. The plan with the least weight memory.
  std::vector<int> two_d_seed(const std::vector<int>& megatron) const;
  /// The GSPMD paper's 2D plan (section 5.1) from the 2D-weights seed `two_d`: the batch over data_axes_, embedding
  /// tables over the vocabulary on the model axis, the residual stream [data, -, model].
  std::vector<int> paper_2d_seed(const std::vector<int>& two_d) const;
  /// Data parallel over every axis where the weights fit, Megatron where they do not: starting from the data-parallel
  /// seed, weight groups take their Megatron split, largest first, until the plan fits; a column-parallel group's
  /// activation operand is pinned to the batch over the data axes only (it is all-gathered over the model axis
  /// there). The activations between these Megatron islands stay split over every axis.
  std::vector<int> hybrid_seed(const std::vector<int>& dp, const std::vector<int>& megatron);
  /// `assign` with every residual-stream group split on its batch dim over `batch_axes` and, when `model_dim` is not
  /// 0, on that dim (negative: from the end) over the model axis: the GSPMD paper's 2D activations `[data, -, model]`
  /// (model_dim -1) and Megatron's sequence parallelism `[data, model, -]` (model_dim 1).
  std::vector<int> with_stream(std::vector<int> assign, const std::vector<int>& batch_axes, int model_dim) const;
  /// FSDP (ZeRO-3): the batch over `axes`, every weight split over `axes` on its largest dim (gathered where used).
  std::vector<int> fsdp_seed(const std::vector<int>& axes) const;
  /// Axes (mesh order, size > 1) assigned greedily to a dim of size `dim` while the shard count still fits in it.
  std::vector<int> fitting_axes(const std::vector<int>& axes, int64_t dim) const;

  const AutoOptions& o_;
  const DeviceMesh& mesh_;
  Instance full_;  // the graph the plan is for
  /// The step choices searched (o_.step alone, or each remat choice, then each with weight-update sharding).
  std::vector<StepChoice> steps_;
  size_t step_ = 0;  // the one evaluate() costs under
  /// Layered costing: per step choice p and microbatch count c (copies_[c]), the model cut to two blocks
  /// (layers_[2 (p |copies_| + c)]) and to one (the next); else empty.
  std::vector<Instance> layers_;
  /// Layered costing: the microbatches each cut model is built with (StepChoice::microbatches): {0} (the step's own),
  /// or {2, 3} to extrapolate to AutoOptions::accumulate.
  std::vector<int64_t> copies_ = {0};
  struct Rebuilt {  // the whole step under a choice other than o_.step
    Instance in;
    std::optional<TrainingStep> training;
  };
  std::map<size_t, Rebuilt> rebuilt_;
  /// The whole graph under step choice p: full_, or the step rebuilt by o_.build (kept in rebuilt_). May throw.
  const Instance& whole(size_t p);
  /// A search instance that takes `m`'s graph and roles (leaving `m.training`), with full_'s constraints carried
  /// over by value name and the followers of `m.training`'s weights.
  Instance instance(AutoModel&& m, int update_axis) const;
  int64_t blocks_ = 0;                     // layered costing: the whole model's layer blocks
  std::vector<std::string> stream_names_;  // layered costing: the residual stream's values (cut points in the blocks)
  /// The instance groups and candidates are found on: the first layered one, else the whole graph.
  const Instance& base() const { return layers_.empty() ? full_ : layers_[0]; }
  int64_t limit_ = 0;
  std::vector<Group> groups_;
  std::map<std::pair<size_t, std::vector<int>>, AutoPlanCost> memo_;  // by (step choice, assignment)
  /// The Megatron seed's model axis: one named "model" if it has more than one device, else the last axis that has;
  /// -1 for a mesh of one device.
  int model_axis_ = -1;
  std::vector<int> data_axes_;         // the other axes (every axis when model_axis_ is -1)
  std::vector<bool> megatron_column_;  // per group: the Megatron seed splits it column-parallel
  int evaluations_ = 0;
  Clock::time_point start_ = Clock::now();
  AutoProgress progress_;  // what o_.progress is told (descent, sweep, group are set by run())
  /// Calls o_.progress (when set) with progress_, updated with the evaluation count and the elapsed time.
  void report_progress();
};

}  // namespace gspmd::auto_internal
