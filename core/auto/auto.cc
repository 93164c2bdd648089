// core/auto: the sharding search behind --auto (docs/auto.md).
#include "core/auto/auto.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/autodiff/accumulate.h"
#include "core/autodiff/step_shardings.h"
#include "core/cost/cost.h"
#include "core/ir/cuts.h"
#include "core/partition/spmd.h"
#include "core/pipeline/blocks.h"
#include "core/rules/rule.h"

namespace gspmd {

namespace {

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
bool better(const AutoPlanCost& a, const AutoPlanCost& b) {
  if (a.valid != b.valid) return a.valid;
  if (!a.valid) return false;
  if (a.fits != b.fits) return a.fits;
  if (!a.fits) return a.peak_memory_bytes < b.peak_memory_bytes;
  const double tol = 1e-9 * std::max(a.step_time_s, b.step_time_s);
  if (a.step_time_s < b.step_time_s - tol) return true;
  if (a.step_time_s > b.step_time_s + tol) return false;
  return a.peak_memory_bytes < b.peak_memory_bytes;
}

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

void Search::report_progress() {
  if (!o_.progress) return;
  progress_.evaluations = evaluations_;
  progress_.elapsed_s = std::chrono::duration<double>(Clock::now() - start_).count();
  o_.progress(progress_);
}

std::vector<int> Search::allowed_dims(int v, const std::vector<std::vector<int>>& consumers,
                                      bool pass_through_only) const {
  const Graph& g = *base().g;
  const int rank = static_cast<int>(g.values[v].shape.size());
  std::vector<bool> ok(rank, true), seen(rank, false);
  const MemoryRoles* roles = base().roles;
  for (int n : consumers[v]) {
    // An activation's split is decided by the forward pass; the backward pass contracts over its batch dims (the
    // weight's gradient), which says nothing of where the forward contraction runs.
    if (pass_through_only && roles && roles->forward_pass(n) < 0) continue;
    const Node& node = g.nodes[n];
    const OpShardingRule* rule = base().rules->rule(n);
    if (!rule) continue;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (node.inputs[i] != v || i >= rule->operands.size()) continue;
      const DimFactors& df = rule->operands[i];
      for (int d = 0; d < rank && d < static_cast<int>(df.size()); ++d) {
        if (df[d].empty()) ok[d] = false;
        for (int f : df[d]) {
          if (rule->factor_kinds[f] == FactorKind::kNeedReplication) ok[d] = false;
          if (pass_through_only && rule->factor_kinds[f] != FactorKind::kPassThrough) ok[d] = false;
        }
        seen[d] = true;
      }
    }
  }
  std::vector<int> dims;
  for (int d = 0; d < rank; ++d)
    if (ok[d] && seen[d] && g.values[v].shape[d] >= 2) dims.push_back(d);
  return dims;
}

void Search::add_candidates(Group& gr, const std::vector<int>& dims) const {
  const Shape& shape = base().g->values[gr.members[0]].shape;
  const int rank = static_cast<int>(shape.size());
  std::vector<int> axes;  // mesh axes that can split something
  for (int a = 0; a < mesh_.rank(); ++a)
    if (mesh_.shape[a] > 1) axes.push_back(a);
  gr.candidates.push_back(std::nullopt);  // free
  if (axes.empty()) return;               // a mesh of one device: nothing to choose
  // Every map axis -> dim in `dims` or none: (|dims| + 1)^axes assignments.
  std::vector<int> choice(axes.size(), -1);
  std::set<std::vector<std::vector<int>>> seen;
  while (true) {
    TensorSharding s = TensorSharding::replicated(rank);
    for (size_t k = 0; k < axes.size(); ++k)
      if (choice[k] >= 0) s.dims[dims[choice[k]]].push_back(axes[k]);
    bool fits = true;
    for (int d = 0; d < rank; ++d)
      if (s.shards(d, mesh_) > shape[d]) fits = false;
    if (fits && seen.insert(s.dims).second) gr.candidates.push_back(s);
    size_t k = 0;
    for (; k < axes.size(); ++k) {
      if (++choice[k] < static_cast<int>(dims.size())) break;
      choice[k] = -1;
    }
    if (k == axes.size()) break;
  }
}

Instance Search::instance(AutoModel&& m, int update_axis) const {
  Instance in;
  in.update_axis = update_axis;
  in.own_graph = std::make_unique<Graph>(std::move(m.graph));
  in.g = in.own_graph.get();
  if (m.roles) in.own_roles = std::make_unique<MemoryRoles>(std::move(*m.roles));
  in.roles = in.own_roles.get();
  in.own_rules = std::make_unique<RuleTable>(*in.g);
  in.rules = in.own_rules.get();
  in.cons.mesh = full_.cons.mesh;
  for (const auto& [v, ann] : full_.cons.by_value)
    if (const int w = in.g->find(full_.g->values[static_cast<size_t>(v)].name); w >= 0)
      in.cons.by_value.emplace(w, ann);
  if (m.training) {
    in.followers = step_followers(*in.g, *m.training);
    in.batch_inputs = step_batch_inputs(*in.g, *m.training);
  }
  return in;
}

const Instance& Search::whole(size_t p) {
  if (steps_[p] == o_.step) return full_;
  auto it = rebuilt_.find(p);
  if (it == rebuilt_.end()) {
    AutoModel m = o_.build(*o_.forward, steps_[p]);
    Rebuilt r;
    r.in = instance(std::move(m), steps_[p].update_axis);  // takes the graph and the roles, reads the names
    r.training = std::move(m.training);
    assign_members(r.in, find_variables(r.in));
    it = rebuilt_.emplace(p, std::move(r)).first;
  }
  return it->second.in;
}

void Search::setup_layers() {
  steps_ = {o_.step};
  if (!o_.forward || !o_.build) return;
  LayerBlocks b;
  try {
    b = find_layer_blocks(*o_.forward, "", /*variables=*/true);
  } catch (const InputError&) {
    return;  // no alike layers: every plan is costed on the whole graph
  }
  if (b.blocks.size() < 3) return;
  // The constraints must treat every layer alike: the values of one layer key annotated the same way, or none of them.
  const Graph& g = *full_.g;
  std::map<std::string, const Annotation*> seen;
  for (size_t v = 0; v < g.values.size(); ++v) {
    std::string key = layer_key(g.values[v].name);
    if (key == g.values[v].name) continue;
    auto it = full_.cons.by_value.find(static_cast<int>(v));
    const Annotation* a = it == full_.cons.by_value.end() ? nullptr : &it->second;
    auto [at, fresh] = seen.emplace(std::move(key), a);
    if (!fresh && (!at->second) != (!a)) return;
    if (!fresh && a &&
        (at->second->sharding != a->sharding || at->second->priority != a->priority || at->second->open != a->open ||
         at->second->open_dims != a->open_dims))
      return;
  }
  std::vector<Instance> layers;
  for (RematPolicy r : o_.remat_choices)
    if (r != o_.step.remat) steps_.push_back({r, o_.step.update_axis});
  if (const int data = data_axis(); o_.update_choice && data >= 0 && o_.step.update_axis < 0)
    for (size_t p = 0, n = steps_.size(); p < n; ++p) steps_.push_back({steps_[p].remat, data});
  // With accumulation over more than 2 microbatches, each cut model is built with 2 and with 3 of them.
  copies_ = o_.accumulate > 2 ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{0};
  try {
    for (const StepChoice& p : steps_)
      for (int64_t c : copies_)
        for (size_t k : {size_t{2}, size_t{1}}) {
          StepChoice cut = p;
          cut.microbatches = c;
          layers.push_back(instance(o_.build(keep_first_layers(*o_.forward, b, k), cut), p.update_axis));
        }
  } catch (const std::exception&) {  // the builder failed on a cut model: cost whole graphs
    steps_ = {o_.step};
    return;
  }
  layers_ = std::move(layers);
  blocks_ = static_cast<int64_t>(b.blocks.size());
  // The residual stream: the blocks' inputs, and every cut point inside the blocks (a value that is all that crosses
  // from the nodes before it to the nodes after: a transformer's residual adds).
  const Graph& f = *o_.forward;
  std::vector<char> in_blocks(f.nodes.size(), 0);
  for (size_t i = 0; i < b.blocks.size(); ++i)
    for (int n : b.blocks[i].nodes) in_blocks[static_cast<size_t>(n)] = 1;
  const std::vector<char> cut = cut_points(
      f, f.nodes.size(),
      [&](int v) {
        const int p = f.values[static_cast<size_t>(v)].producer;
        return v == b.blocks[0].input || (p >= 0 && in_blocks[static_cast<size_t>(p)] != 0);
      },
      true);
  // Block 1's cut points, at the same place in every block (blocks are alike node by node). Not block 0's: when its
  // input is a graph input, which no node makes, nothing crosses its nodes and every one of them would be a cut.
  std::set<std::string> names;
  for (const LayerBlocks::Block& blk : b.blocks) names.insert(f.values[static_cast<size_t>(blk.input)].name);
  const std::vector<int>& second = b.blocks[1].nodes;
  for (size_t j = 0; j < second.size(); ++j)
    if (cut[static_cast<size_t>(second[j])])
      for (const LayerBlocks::Block& blk : b.blocks)
        for (int v : f.nodes[static_cast<size_t>(blk.nodes[j])].outputs)
          if (v >= 0) names.insert(f.values[static_cast<size_t>(v)].name);
  stream_names_.assign(names.begin(), names.end());
}

std::vector<Var> Search::find_variables(const Instance& in) const {
  const Graph& g = *in.g;
  const RuleTable& rules = *in.rules;
  const auto consumers = g.consumers();
  std::vector<int> first_use(g.values.size(), static_cast<int>(g.nodes.size()));
  for (int n = static_cast<int>(g.nodes.size()) - 1; n >= 0; --n)
    for (int v : g.nodes[n].inputs)
      if (v >= 0) first_use[v] = n;
  std::set<int> inputs(g.inputs.begin(), g.inputs.end());
  std::vector<int> vars;
  std::set<int> weights;
  for (int v = 0; v < static_cast<int>(g.values.size()); ++v) {
    const Value& val = g.values[v];
    if (in.cons.by_value.count(v) || val.shape.empty() || consumers[v].empty()) continue;
    // Graph inputs are variables, except the ones that follow a weight: optimizer state (a step's variables take
    // theirs as inputs) and float vectors (biases and scales), which propagation derives as it does for initializers.
    const bool input = inputs.count(v) > 0 && !(val.shape.size() < 2 && is_floating(val.dtype)) &&
                       !(in.roles && in.roles->kind[v] == MemoryKind::kOptimizerState);
    if (!input && (!(val.is_initializer || inputs.count(v)) || val.shape.size() < 2)) continue;
    // A weight: some factor rule contracts over it (a reduction factor on one of its dims).
    bool contracted = false;
    for (int n : consumers[v]) {
      const Node& node = g.nodes[n];
      const OpShardingRule* rule = rules.rule(n);
      if (!rule) continue;
      for (size_t i = 0; i < node.inputs.size() && i < rule->operands.size(); ++i)
        if (node.inputs[i] == v)
          for (const auto& fs : rule->operands[i])
            for (int f : fs) contracted |= rule->factor_kinds[f] == FactorKind::kReduction;
    }
    contracted = contracted && is_floating(val.dtype) && val.shape.size() >= 2;
    // A graph input is a weight (a variable of the step) when the step's roles say so, or, in a forward graph, when
    // every node reads it as a later operand (MatMul's B, Conv's W), not as the data (operand 0).
    if (contracted && input) {
      if (in.roles) {
        contracted = in.roles->kind[v] == MemoryKind::kWeights;
      } else {
        for (int n : consumers[v])
          for (size_t i = 0; i < g.nodes[n].inputs.size(); ++i)
            if (g.nodes[n].inputs[i] == v && i == 0) contracted = false;
      }
    }
    if (contracted) weights.insert(v);
    if (contracted || input) vars.push_back(v);
  }
  // The activation operands of contractions over those weights (the input of q/k/v, of a Megatron MLP's first
  // matmul...): activation names carry no layer number, so each is tied through its weight's layer key.
  std::map<int, int> act_weight;  // activation value -> the weight of its first contracting consumer
  for (int n = 0; n < static_cast<int>(g.nodes.size()); ++n) {
    const Node& node = g.nodes[n];
    const OpShardingRule* rule = rules.rule(n);
    int w = -1;
    for (size_t i = 0; i < node.inputs.size() && w < 0; ++i) {
      if (!weights.count(node.inputs[i])) continue;
      if (!rule || i >= rule->operands.size()) break;
      for (const auto& fs : rule->operands[i])
        for (int f : fs)
          if (rule->factor_kinds[f] == FactorKind::kReduction) w = node.inputs[i];
    }
    if (w < 0) continue;
    for (int v : node.inputs) {
      if (v < 0 || v == w || act_weight.count(v) || in.cons.by_value.count(v) || inputs.count(v)) continue;
      const Value& val = g.values[v];
      if (val.is_initializer || val.shape.empty()) continue;
      act_weight[v] = w;
      vars.push_back(v);
    }
  }
  // The residual stream (layered costing): where the GSPMD paper's 2D plan and Megatron's sequence parallelism put
  // their activation layouts.
  // Every microbatch's copy of it too, under the same key (an accumulated step, core/autodiff/accumulate.h).
  for (const std::string& name : stream_names_) {
    int v = -1;
    for (int64_t m = 0; (v = g.find(microbatch_name(name, m))) >= 0; ++m)
      if (!in.cons.by_value.count(v) && !act_weight.count(v) && !inputs.count(v) && !g.values[v].shape.empty() &&
          !consumers[v].empty())
        vars.push_back(v);
  }
  std::stable_sort(vars.begin(), vars.end(), [&](int a, int b) { return first_use[a] < first_use[b]; });
  std::vector<Var> out;
  out.reserve(vars.size());
  for (int v : vars) {
    const Value& val = g.values[v];
    Var x;
    x.value = v;
    x.kind = weights.count(v)      ? VarKind::kWeight
             : inputs.count(v)     ? VarKind::kInput
             : act_weight.count(v) ? VarKind::kActivation
                                   : VarKind::kStream;
    x.weight = x.kind == VarKind::kActivation ? act_weight[v] : -1;
    x.name = x.weight >= 0 ? "input of " + layer_key(g.values[x.weight].name) : layer_key(model_name(val.name));
    // A graph input is one value, known by its name: its key holds its rank, not its shape, which accumulation
    // scales with the microbatches (a cut model built with fewer than the step has, AutoOptions::accumulate).
    const std::string shape =
        x.kind == VarKind::kInput ? fmt::format("rank {}", val.shape.size()) : shape_str(val.shape);
    x.key = fmt::format("{}|{}|{}|{}", static_cast<int>(x.kind), x.name, shape, static_cast<int>(val.dtype));
    out.push_back(std::move(x));
  }
  return out;
}

void Search::find_groups() {
  const Instance& in = base();
  const Graph& g = *in.g;
  const std::vector<Var> vars = find_variables(in);
  std::map<std::string, size_t> index;
  std::map<int, size_t> group_of;
  for (const Var& x : vars) {
    auto [it, fresh] = index.emplace(x.key, groups_.size());
    if (fresh) {
      Group gr;
      gr.key = x.name;
      gr.tie = x.key;
      gr.kind = x.kind;
      groups_.push_back(gr);
    }
    groups_[it->second].members.push_back(x.value);
    group_of[x.value] = it->second;
  }
  // Each weight group points at the activation group of its first member's contraction.
  for (const Var& x : vars) {
    if (x.kind != VarKind::kActivation) continue;
    Group& wg = groups_[group_of[x.weight]];
    if (wg.act_group < 0) wg.act_group = static_cast<int>(group_of[x.value]);
  }
  // Groups whose display keys collide (same layer key, different shapes) show their shape too.
  std::map<std::string, int> uses;
  for (const Group& gr : groups_) ++uses[gr.key];
  for (Group& gr : groups_)
    if (uses[gr.key] > 1) gr.key += " " + shape_str(g.values[gr.members[0]].shape);
  const auto consumers = g.consumers();
  for (Group& gr : groups_) {
    // The stream on any dim (VarKind::kStream); the other kinds on the dims their consumers' rules let be split.
    std::vector<int> dims;
    if (gr.kind == VarKind::kStream) {
      for (int d = 0; d < static_cast<int>(g.values[gr.members[0]].shape.size()); ++d)
        if (g.values[gr.members[0]].shape[d] >= 2) dims.push_back(d);
    } else {
      dims = allowed_dims(gr.members[0], consumers, gr.kind == VarKind::kActivation);
    }
    add_candidates(gr, dims);
  }
}

void Search::assign_members(Instance& in, const std::vector<Var>& vars) const {
  std::map<std::string, size_t> index;
  for (size_t k = 0; k < groups_.size(); ++k) index.emplace(groups_[k].tie, k);
  in.members.assign(groups_.size(), {});
  for (const Var& x : vars)
    if (auto it = index.find(x.key); it != index.end()) in.members[it->second].push_back(x.value);
}

int Search::candidate_index(const Group& gr, const TensorSharding& s) const {
  if (s.is_replicated()) {
    // Replicated-by-annotation and free differ; the seeds mean "nothing split", which free expresses without
    // stopping propagation.
    return 0;
  }
  for (size_t i = 1; i < gr.candidates.size(); ++i)
    if (gr.candidates[i] && gr.candidates[i]->dims == s.dims) return static_cast<int>(i);
  return 0;
}

Annotations Search::choices(const Instance& in, const std::vector<int>& assign) const {
  Annotations a = in.cons;
  for (size_t k = 0; k < groups_.size(); ++k) {
    const auto& c = groups_[k].candidates[assign[k]];
    if (!c) continue;
    for (int v : in.members[k]) a.by_value[v] = Annotation{*c, 0, "--auto"};
  }
  return a;
}

Annotations Search::annotations(const Instance& in, const std::vector<int>& assign) const {
  Annotations a = choices(in, assign);
  annotate_step(*in.g, in.followers, in.update_axis, "--auto", a, in.batch_inputs);
  return a;
}

AutoPlanCost Search::cost_on(const Instance& in, const std::vector<int>& assign, int64_t* resident) const {
  Annotations refined = refine_for_reshapes(*in.g, annotations(in, assign), in.rules);
  ShardingPlan plan = propagate(*in.g, refined, in.rules);
  SpmdProgram p = partition(*in.g, plan, refined.mesh, o_.target, in.rules, in.roles);
  CostReport r = simulate_cost(*in.g, p, o_.target, o_.overlap, in.roles);
  AutoPlanCost c;
  c.valid = true;
  c.step_time_s = r.step_time_s;
  c.compute_time_s = r.compute_time_s;
  c.communication_time_s = r.communication_time_s;
  c.peak_memory_bytes = r.peak_memory_bytes;
  c.fits = c.peak_memory_bytes <= limit_;
  if (resident) {
    // With accumulation, one microbatch's saved activations are live at a time: the total over the step / the
    // forward passes.
    const int64_t passes =
        in.roles ? std::max<int64_t>(1, static_cast<int64_t>(in.roles->forward_ranges.size())) : int64_t{1};
    *resident = r.memory.total[static_cast<size_t>(MemoryKind::kSavedActivations)] / passes;
    for (MemoryKind k : {MemoryKind::kWeights, MemoryKind::kOptimizerState, MemoryKind::kInputs})
      *resident += r.memory.total[static_cast<size_t>(k)];
  }
  return c;
}

AutoPlanCost Search::counted(const std::function<AutoPlanCost()>& cost, bool rethrow) {
  AutoPlanCost c;
  ++evaluations_;
  try {
    c = cost();
  } catch (const std::exception& e) {
    if (rethrow) throw;
    c = AutoPlanCost{};
    c.error = e.what();
  }
  c.step = steps_[step_];
  if (c.valid && c.fits && (progress_.best_step_time_s == 0 || c.step_time_s < progress_.best_step_time_s))
    progress_.best_step_time_s = c.step_time_s;
  report_progress();
  return c;
}

AutoPlanCost Search::extrapolated(const std::vector<int>& assign) const {
  // Times are linear in the number of alike blocks: t(n) = t(1) + (n - 1) (t(2) - t(1)). The peak is a maximum
  // over the step of what is live, so it can grow faster than from one block to two shows (the saved activations
  // of 96 layers outgrow the logits that are the peak of one); it is taken as at least the bytes live together at
  // the end of the forward pass, which are linear.
  // The two cut models are costed at once, on two threads (each pipeline reads only its own graph and tables).
  auto over_blocks = [&](size_t at) {
    int64_t resident_one = 0, resident_two = 0;
    const Instance& cut_two = layers_[at];
    const Instance& cut_one = layers_[at + 1];
    std::future<AutoPlanCost> one_f =
        std::async(std::launch::async, [&] { return cost_on(cut_one, assign, &resident_one); });
    AutoPlanCost two;
    try {
      two = cost_on(cut_two, assign, &resident_two);
    } catch (...) {
      one_f.wait();
      throw;
    }
    const AutoPlanCost one = one_f.get();
    const double n = static_cast<double>(blocks_ - 1);
    auto extrapolate = [&](double a, double b) { return b + n * (a - b); };
    AutoPlanCost c = two;
    c.estimated = true;
    c.step_time_s = extrapolate(two.step_time_s, one.step_time_s);
    c.compute_time_s = extrapolate(two.compute_time_s, one.compute_time_s);
    c.communication_time_s = extrapolate(two.communication_time_s, one.communication_time_s);
    c.peak_memory_bytes = static_cast<int64_t>(
        std::max(extrapolate(static_cast<double>(two.peak_memory_bytes), static_cast<double>(one.peak_memory_bytes)),
                 extrapolate(static_cast<double>(resident_two), static_cast<double>(resident_one))));
    return c;
  };
  const size_t per_step = 2 * copies_.size();
  AutoPlanCost c = over_blocks(per_step * step_);
  if (copies_.size() == 2) {
    // Accumulation: each microbatch past the second adds what the third added (its forward and backward passes and
    // its accumulation). The peak is within one microbatch's passes, with the accumulators: it does not grow past
    // the third (the peak of two can be lower: the second's gradients are the last), except by the data inputs' few
    // bytes, which are not counted.
    const AutoPlanCost three = over_blocks(per_step * step_ + 2);
    const double more = static_cast<double>(o_.accumulate - 2);
    auto extrapolate = [&](double two, double three) { return two + more * (three - two); };
    c.step_time_s = extrapolate(c.step_time_s, three.step_time_s);
    c.compute_time_s = extrapolate(c.compute_time_s, three.compute_time_s);
    c.communication_time_s = extrapolate(c.communication_time_s, three.communication_time_s);
    c.peak_memory_bytes = std::max(c.peak_memory_bytes, three.peak_memory_bytes);
  }
  c.fits = c.peak_memory_bytes <= limit_;
  return c;
}

AutoPlanCost Search::evaluate(const std::vector<int>& assign, bool rethrow) {
  auto it = memo_.find({step_, assign});
  if (it != memo_.end()) return it->second;
  AutoPlanCost c = counted([&] { return layers_.empty() ? cost_on(full_, assign) : extrapolated(assign); }, rethrow);
  memo_[{step_, assign}] = c;
  return c;
}

std::vector<int> Search::fitting_axes(const std::vector<int>& axes, int64_t dim) const {
  std::vector<int> out;
  int64_t n = 1;
  for (int a : axes) {
    if (mesh_.shape[a] <= 1 || n * mesh_.shape[a] > dim) continue;
    n *= mesh_.shape[a];
    out.push_back(a);
  }
  return out;
}

std::vector<int> Search::data_parallel_seed(const std::vector<int>& axes) const {
  std::vector<int> assign(groups_.size(), 0);
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].kind != VarKind::kInput) continue;
    const Value& val = base().g->values[groups_[k].members[0]];
    if (val.shape.size() < 2 && is_floating(val.dtype)) continue;  // a bias or a scale the step takes as input
    TensorSharding s = TensorSharding::replicated(static_cast<int>(val.shape.size()));
    s.dims[0] = fitting_axes(axes, val.shape[0]);
    assign[k] = candidate_index(groups_[k], s);
  }
  return assign;
}

std::vector<int> Search::with_stream(std::vector<int> assign, const std::vector<int>& batch_axes, int model_dim) const {
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].kind != VarKind::kStream) continue;
    const Shape& shape = base().g->values[groups_[k].members[0]].shape;
    const int rank = static_cast<int>(shape.size());
    TensorSharding s = TensorSharding::replicated(rank);
    s.dims[0] = fitting_axes(batch_axes, shape[0]);
    const int d = model_dim < 0 ? rank + model_dim : model_dim;
    if (d > 0 && d < rank && model_axis_ >= 0) s.dims[d] = fitting_axes({model_axis_}, shape[d]);
    assign[k] = candidate_index(groups_[k], s);
  }
  return assign;
}

std::vector<int> Search::fsdp_seed(const std::vector<int>& axes) const {
  std::vector<int> assign = with_stream(data_parallel_seed(axes), axes, 0);
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].kind != VarKind::kWeight) continue;
    const Shape& shape = base().g->values[groups_[k].members[0]].shape;
    int largest = 0;
    for (int d = 1; d < static_cast<int>(shape.size()); ++d)
      if (shape[d] > shape[largest]) largest = d;
    TensorSharding s = TensorSharding::replicated(static_cast<int>(shape.size()));
    s.dims[largest] = fitting_axes(axes, shape[largest]);
    assign[k] = candidate_index(groups_[k], s);
  }
  return assign;
}

int Search::data_axis() const {
  for (int a : data_axes_)
    if (mesh_.shape[a] > 1) return a;
  return model_axis_;
}

std::optional<std::vector<int>> Search::megatron_seed() {
  if (model_axis_ < 0) return std::nullopt;
  megatron_column_.assign(groups_.size(), false);
  std::vector<int> assign = data_parallel_seed(data_axes_);
  const auto consumers = base().g->consumers();
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].kind != VarKind::kWeight) continue;
    const int w = groups_[k].members[0];
    const Shape& shape = base().g->values[w].shape;
    // The first consumer that contracts over the weight decides: if its other operands already arrive split over
    // the model axis on the contracted factor, split the weight there (row-parallel); otherwise split the weight's
    // own output factor (column-parallel). Embedding tables (Gather) are left to propagation.
    for (int n : consumers[w]) {
      const Node& node = base().g->nodes[n];
      const OpShardingRule* rule = base().rules->rule(n);
      if (!rule || node.op_type == "Gather") continue;
      int wi = -1;
      for (size_t i = 0; i < node.inputs.size() && i < rule->operands.size(); ++i)
        if (node.inputs[i] == w) wi = static_cast<int>(i);
      if (wi < 0) continue;
      const DimFactors& wdf = rule->operands[wi];
      int red_dim = -1, out_dim = -1, red_factor = -1;
      std::set<int> other_factors;
      for (size_t i = 0; i < rule->operands.size() && i < node.inputs.size(); ++i)  // activations, not biases
        if (static_cast<int>(i) != wi && node.inputs[i] >= 0 && !base().g->values[node.inputs[i]].is_initializer)
          for (const auto& fs : rule->operands[i]) other_factors.insert(fs.begin(), fs.end());
      for (int d = 0; d < static_cast<int>(wdf.size()); ++d) {
        if (wdf[d].size() != 1) continue;
        const int f = wdf[d][0];
        if (rule->factor_kinds[f] == FactorKind::kReduction && red_dim < 0) red_dim = d, red_factor = f;
        if (rule->factor_kinds[f] == FactorKind::kPassThrough && !other_factors.count(f)) out_dim = d;
      }
      if (red_dim < 0) break;
      bool row = false;
      Annotations refined = refine_for_reshapes(*base().g, annotations(base(), assign), base().rules);
      ShardingPlan plan = propagate(*base().g, refined, base().rules);
      for (size_t i = 0; i < node.inputs.size() && i < rule->operands.size(); ++i) {
        if (static_cast<int>(i) == wi || node.inputs[i] < 0) continue;
        const TensorSharding& s = plan.shardings[node.inputs[i]];
        for (int d = 0; d < static_cast<int>(rule->operands[i].size()) && d < s.rank(); ++d) {
          const auto& fs = rule->operands[i][d];
          if (std::find(fs.begin(), fs.end(), red_factor) == fs.end()) continue;
          for (int a : s.dims[d]) row |= refined.mesh.user_axis(a) == model_axis_;
        }
      }
      const int dim = row ? red_dim : out_dim;
      if (dim < 0 || shape[dim] < mesh_.shape[model_axis_]) break;
      TensorSharding s = TensorSharding::replicated(static_cast<int>(shape.size()));
      s.dims[dim] = {model_axis_};
      assign[k] = candidate_index(groups_[k], s);
      megatron_column_[k] = !row && assign[k] != 0;
      break;
    }
  }
  return assign;
}

std::vector<int> Search::two_d_seed(const std::vector<int>& megatron) const {
  std::vector<int> assign(groups_.size(), 0);
  for (size_t k = 0; k < groups_.size(); ++k) {
    const auto& c = groups_[k].candidates[megatron[k]];
    if (groups_[k].kind != VarKind::kWeight || !c || c->rank() != 2) continue;
    const int model_dim = c->dims[0].empty() ? 1 : 0;
    TensorSharding s = *c;
    std::vector<int> others;
    for (int a = 0; a < mesh_.rank(); ++a)
      if (std::find(c->dims[model_dim].begin(), c->dims[model_dim].end(), a) == c->dims[model_dim].end())
        others.push_back(a);
    s.dims[1 - model_dim] = fitting_axes(others, base().g->values[groups_[k].members[0]].shape[1 - model_dim]);
    assign[k] = candidate_index(groups_[k], s);
  }
  return assign;
}

std::vector<int> Search::paper_2d_seed(const std::vector<int>& two_d) const {
  std::vector<int> assign = two_d;
  const std::vector<int> batch = data_parallel_seed(data_axes_);
  const Graph& g = *base().g;
  const auto readers = g.consumers();
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].kind == VarKind::kInput) assign[k] = batch[k];
    if (groups_[k].kind != VarKind::kWeight) continue;
    // An embedding table (and the LM head tied to it) is split over the vocabulary on the model axis.
    const int w = groups_[k].members[0];
    for (int n : readers[w])
      if (g.nodes[n].op_type == "Gather" && g.nodes[n].inputs[0] == w) {
        TensorSharding s = TensorSharding::replicated(static_cast<int>(g.values[w].shape.size()));
        s.dims[0] = fitting_axes({model_axis_}, g.values[w].shape[0]);
        assign[k] = candidate_index(groups_[k], s);
      }
  }
  return with_stream(std::move(assign), data_axes_, -1);
}

std::vector<int> Search::hybrid_seed(const std::vector<int>& dp, const std::vector<int>& megatron) {
  std::vector<int> assign = dp;
  AutoPlanCost c = evaluate(assign);
  std::vector<size_t> order;
  for (size_t k = 0; k < groups_.size(); ++k)
    if (groups_[k].kind == VarKind::kWeight && megatron[k] != 0) order.push_back(k);
  auto bytes = [&](size_t k) {
    return base().g->values[groups_[k].members[0]].nbytes() * static_cast<int64_t>(full_.members[k].size());
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes(a) > bytes(b); });
  for (size_t k : order) {
    if (c.valid && c.fits) break;
    assign[k] = megatron[k];
    const int act = groups_[k].act_group;
    if (megatron_column_[k] && act >= 0) {
      const Shape& shape = base().g->values[groups_[act].members[0]].shape;
      TensorSharding s = TensorSharding::replicated(static_cast<int>(shape.size()));
      s.dims[0] = fitting_axes(data_axes_, shape[0]);
      assign[act] = candidate_index(groups_[act], s);
    }
    c = evaluate(assign);
  }
  return assign;
}

void Search::prepare() {
  setup_layers();
  find_groups();
  if (!layers_.empty()) {
    // The plan with nothing annotated must cost on the cut models; if not, they are not like the model.
    for (Instance& in : layers_) assign_members(in, find_variables(in));
    assign_members(full_, find_variables(full_));
    try {
      for (const Instance& in : layers_) cost_on(in, std::vector<int>(groups_.size(), 0));
    } catch (const std::exception&) {
      layers_.clear();
      steps_ = {o_.step};
      groups_.clear();
      find_groups();
    }
  }
  if (layers_.empty()) {
    full_.members.clear();
    for (const Group& gr : groups_) full_.members.push_back(gr.members);
  }
}

std::vector<std::pair<std::string, std::vector<int>>> Search::classical_seeds(bool hybrid) {
  std::vector<std::pair<std::string, std::vector<int>>> seeds;
  seeds.emplace_back("replicated", std::vector<int>(groups_.size(), 0));
  std::vector<int> all_axes;
  for (int a = 0; a < mesh_.rank(); ++a) all_axes.push_back(a);
  seeds.emplace_back("data-parallel", data_parallel_seed(all_axes));
  if (mesh_.rank() >= 2) seeds.emplace_back("data-parallel (first axis)", data_parallel_seed({0}));
  seeds.emplace_back("fsdp", fsdp_seed(all_axes));
  if (auto m = megatron_seed()) {
    seeds.emplace_back(mesh_.rank() >= 2 ? "megatron+data" : "megatron", *m);
    if (!stream_names_.empty()) seeds.emplace_back("megatron-sp", with_stream(*m, data_axes_, 1));
    if (mesh_.rank() >= 2) {
      seeds.emplace_back("2d-weights", two_d_seed(*m));
      if (!stream_names_.empty()) seeds.emplace_back("2d", paper_2d_seed(seeds.back().second));
    }
    if (hybrid) seeds.emplace_back("hybrid", hybrid_seed(seeds[1].second, *m));
  }
  return seeds;
}

std::vector<AutoChoice> Search::choices_of(const Instance& in, const std::vector<int>& assign) const {
  std::vector<AutoChoice> out;
  for (size_t k = 0; k < groups_.size(); ++k) {
    AutoChoice ch;
    ch.group = groups_[k].key;
    ch.values = in.members[k];
    if (const auto& c = groups_[k].candidates[assign[k]]) ch.annotated = true, ch.sharding = *c;
    out.push_back(std::move(ch));
  }
  return out;
}

std::vector<AutoChoice> Search::classical(const std::string& name) {
  prepare();
  for (const auto& [seed, assign] : classical_seeds(/*hybrid=*/false))
    if (seed == name) return choices_of(full_, assign);
  return {};
}

AutoResult Search::run() {
  start_ = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start_).count(); };
  if (o_.memory_limit_bytes < 0)
    throw InputError(fmt::format("--memory-limit: {} is not a positive number of bytes", o_.memory_limit_bytes));
  prepare();
  progress_.groups = static_cast<int>(groups_.size());
  struct Done {  // the last progress call, however the search ends
    Search& s;
    ~Done() {
      s.progress_.done = true;
      s.report_progress();
    }
  } done{*this};
  AutoResult res;
  res.memory_limit_bytes = limit_;
  for (const auto& m : full_.members) res.variables += static_cast<int>(m.size());
  res.layer_blocks = layers_.empty() ? 0 : blocks_;
  res.groups = static_cast<int>(groups_.size());

  // Seeds: the classical plans. The all-free plan is what the pipeline does without --auto: its errors are the
  // user's errors.
  std::vector<std::pair<std::string, std::vector<int>>> seeds = classical_seeds(/*hybrid=*/true);

  // Seeds are named by what they are under the constraints: the all-free seed is the annotations alone, and a seed
  // that comes out the same as an earlier one says so.
  if (!full_.cons.by_value.empty()) seeds[0].first = "annotations only";
  std::vector<std::string> same_as(seeds.size());
  for (size_t i = 1; i < seeds.size(); ++i)
    for (size_t j = 0; j < i && same_as[i].empty(); ++j)
      if (seeds[j].second == seeds[i].second) same_as[i] = seeds[j].first;

  // Each seed with and without weight-update sharding (it saves memory at the price of little time), then under each
  // rematerialization policy (which trades time for memory) with the better; a seed's baseline is its best.
  step_ = 0;
  evaluate(seeds[0].second, /*rethrow=*/true);
  struct Start {
    AutoPlanCost cost;
    std::vector<int> assign;
    size_t step_index = 0;  // in steps_
    std::string seed;       // the seed the plan was searched from
  };
  std::vector<Start> starts;  // distinct seeds, best first
  for (size_t i = 0; i < seeds.size(); ++i) {
    const auto& [name, assign] = seeds[i];
    Start s;
    for (bool remat : {false, true}) {
      const int update = steps_[s.step_index].update_axis;
      for (size_t p = 0; p < steps_.size(); ++p) {
        if ((steps_[p].remat != o_.step.remat) != remat || (remat && steps_[p].update_axis != update)) continue;
        step_ = p;
        AutoPlanCost c = evaluate(assign);
        if (p == 0 || better(c, s.cost)) s = Start{c, assign, p, name};
      }
    }
    s.cost.name = name;
    s.cost.same_as = same_as[i];
    res.baselines.push_back(s.cost);
    bool seen = false;
    for (const Start& st : starts) seen |= st.assign == assign;
    if (!seen) starts.push_back(std::move(s));
  }
  std::stable_sort(starts.begin(), starts.end(), [](const Start& a, const Start& b) { return better(a.cost, b.cost); });

  // Coordinate descent over the groups from the best seed, under its step choice. A local search is path dependent, and
  // when memory is tight the least-memory seed is not always the one whose neighbourhood holds a plan that fits:
  // while no fitting plan is found, the descent is repeated from the next best distinct seed (three starts at most,
  // and only while half the time budget is left).
  Start best = starts[0];
  const size_t max_starts = std::min<size_t>(3, starts.size());
  for (size_t st = 0; st < max_starts && !res.budget_exhausted; ++st) {
    if (st > 0 && (best.cost.fits || elapsed() > o_.time_budget_s / 2)) break;
    Start cur = starts[st];
    step_ = cur.step_index;
    progress_.descent = static_cast<int>(st) + 1;
    for (int sweep = 0; sweep < o_.max_sweeps && !res.budget_exhausted; ++sweep) {
      ++res.sweeps;
      progress_.sweep = sweep + 1;
      bool changed = false;
      for (size_t k = 0; k < groups_.size() && !res.budget_exhausted; ++k) {
        progress_.group = static_cast<int>(k);
        int best_opt = cur.assign[k];
        for (int opt = 0; opt < static_cast<int>(groups_[k].candidates.size()); ++opt) {
          if (opt == cur.assign[k]) continue;
          if (elapsed() > o_.time_budget_s) {
            res.budget_exhausted = true;
            break;
          }
          std::vector<int> a = cur.assign;
          a[k] = opt;
          AutoPlanCost c = evaluate(a);
          if (better(c, cur.cost)) cur.cost = c, best_opt = opt;
        }
        if (best_opt != cur.assign[k]) cur.assign[k] = best_opt, changed = true;
      }
      if (!changed) break;
    }
    ++res.starts;
    if (better(cur.cost, best.cost)) best = cur;
  }

  const Instance* final_graph = &full_;
  if (!layers_.empty()) {
    // The extrapolated costs chose; the whole graph decides. The descent's plan, and while it does not fit the best
    // seeds that do, are costed on it, and the better is the plan, with the numbers of the program that runs.
    std::vector<Start> finalists = {best};
    for (const Start& st : starts)
      if (st.cost.fits && st.assign != best.assign && finalists.size() < 3) finalists.push_back(st);
    std::optional<Start> final_best;
    for (const Start& f : finalists) {
      Start c = f;
      const Instance* in = nullptr;
      step_ = f.step_index;
      c.cost = counted([&] {
        in = &whole(f.step_index);
        return cost_on(*in, f.assign);
      });
      if (!final_best || better(c.cost, final_best->cost)) final_best = c, final_graph = in ? in : &full_;
      if (final_best->cost.fits) break;  // the best that fits by the estimate fits: it is the plan
    }
    best = *final_best;
  }

  best.cost.name = "auto";
  res.chosen = best.cost;
  res.annotations = choices(*final_graph, best.assign);
  res.choices = choices_of(*final_graph, best.assign);
  if (final_graph != &full_) {  // the step rebuilt under the chosen policy: the graph the annotations are for
    Rebuilt& r = rebuilt_.at(best.step_index);
    AutoModel m;
    m.graph = std::move(*r.in.own_graph);
    if (r.in.own_roles) m.roles = std::move(*r.in.own_roles);
    m.training = std::move(r.training);
    res.model = std::move(m);
  }
  res.evaluations = evaluations_;
  res.search_time_s = elapsed();
  if (!best.cost.valid)
    throw InputError(fmt::format("--auto: no sharding plan could be partitioned: {}", best.cost.error));
  if (!best.cost.fits && !o_.best_if_none_fits)
    throw InputError(fmt::format(
        "--auto: no sharding plan fits in {} bytes per device; the best plan found needs {} bytes per device (searched "
        "from the {} plan{}{})",
        limit_, best.cost.peak_memory_bytes, best.seed,
        o_.memory_roles ? fmt::format(", remat {}", remat_name(best.cost.step.remat)) : "",
        best.cost.step.update_axis >= 0
            ? fmt::format(", weight update sharded over '{}'", mesh_.axes[best.cost.step.update_axis])
            : ""));
  return res;
}

}  // namespace

AutoResult auto_shard(const Graph& g, const Annotations& constraints, const AutoOptions& o, const RuleTable* rules) {
  std::optional<RuleTable> own;
  Search s(g, constraints, o, rules_for(g, rules, own));
  return s.run();
}

std::vector<AutoChoice> classical_plan(const Graph& g, const Annotations& constraints, const std::string& name,
                                       const AutoOptions& o, const RuleTable* rules) {
  std::optional<RuleTable> own;
  Search s(g, constraints, o, rules_for(g, rules, own));
  return s.classical(name);
}

}  // namespace gspmd
