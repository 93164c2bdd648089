// core/auto: the sharding search behind --auto (docs/auto.md).
#include "core/auto/auto.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/cost/cost.h"
#include "core/partition/spmd.h"
#include "core/rules/rule.h"

namespace gspmd {

std::string layer_key(const std::string& name) {
  // A component is a maximal run between separators; a component made only of digits becomes '#'.
  auto is_sep = [](char c) { return c == '.' || c == '/' || c == '_' || c == ':' || c == '-'; };
  std::string out;
  size_t i = 0;
  while (i < name.size()) {
    if (is_sep(name[i])) {
      out += name[i++];
      continue;
    }
    size_t j = i;
    while (j < name.size() && !is_sep(name[j])) ++j;
    const bool digits = std::all_of(name.begin() + static_cast<long>(i), name.begin() + static_cast<long>(j),
                                    [](char c) { return c >= '0' && c <= '9'; });
    out += digits ? std::string("#") : name.substr(i, j - i);
    i = j;
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

/// A group of tied variables and its candidate shardings (index 0 = free, no annotation).
struct Group {
  std::string key;
  std::vector<int> members;
  bool is_input = false;
  bool is_activation = false;  // the activation operand of a contraction over a weight group
  int act_group = -1;          // weight groups: the group of their contraction's activation operand, if any
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
      : g_(g), cons_(constraints), o_(o), mesh_(constraints.mesh), rules_(rules) {
    limit_ = o.memory_limit_bytes > 0 ? o.memory_limit_bytes : static_cast<int64_t>(o.target.hbm_bytes);
  }

  AutoResult run();

 private:
  void find_groups();
  /// Dims of value v that every consuming rule lets be split (and that have at least 2 elements). For activations
  /// (`pass_through_only`), only dims whose factors are pass-through everywhere: the batch-like dims that decide
  /// where a contraction runs (contracted and windowed dims follow from the weights and propagation).
  std::vector<int> allowed_dims(int v, const std::vector<std::vector<int>>& consumers, bool pass_through_only) const;
  void add_candidates(Group& gr, const std::vector<int>& dims) const;
  int candidate_index(const Group& gr, const TensorSharding& s) const;
  Annotations annotations(const std::vector<int>& assign) const;
  AutoPlanCost evaluate(const std::vector<int>& assign, bool rethrow = false);
  std::vector<int> data_parallel_seed(const std::vector<int>& axes) const;
  std::optional<std::vector<int>> megatron_seed();
  /// From the Megatron seed: every weight it splits over the model axis gets the other mesh axes on its other dim
  /// (the GSPMD paper's 2D weight sharding, section 5.1); inputs are left free. The plan with the least weight memory.
  std::vector<int> two_d_seed(const std::vector<int>& megatron) const;
  /// Data parallel over every axis where the weights fit, Megatron where they do not: starting from the data-parallel
  /// seed, weight groups take their Megatron split, largest first, until the plan fits; a column-parallel group's
  /// activation operand is pinned to the batch over the data axes only (it is all-gathered over the model axis
  /// there). The activations between these Megatron islands stay split over every axis.
  std::vector<int> hybrid_seed(const std::vector<int>& dp, const std::vector<int>& megatron);
  /// Axes (mesh order, size > 1) assigned greedily to a dim of size `dim` while the shard count still fits in it.
  std::vector<int> fitting_axes(const std::vector<int>& axes, int64_t dim) const;

  const Graph& g_;
  const Annotations& cons_;
  const AutoOptions& o_;
  const DeviceMesh& mesh_;
  const RuleTable& rules_;  // one per graph, shared by every evaluation
  int64_t limit_ = 0;
  std::vector<Group> groups_;
  std::map<std::vector<int>, AutoPlanCost> memo_;
  int model_axis_ = -1;                // the Megatron seed's model axis
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
  const int rank = static_cast<int>(g_.values[v].shape.size());
  std::vector<bool> ok(rank, true), seen(rank, false);
  for (int n : consumers[v]) {
    const Node& node = g_.nodes[n];
    const OpShardingRule* rule = rules_.rule(n);
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
    if (ok[d] && seen[d] && g_.values[v].shape[d] >= 2) dims.push_back(d);
  return dims;
}

void Search::add_candidates(Group& gr, const std::vector<int>& dims) const {
  const Shape& shape = g_.values[gr.members[0]].shape;
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

void Search::find_groups() {
  const auto consumers = g_.consumers();
  std::vector<int> first_use(g_.values.size(), static_cast<int>(g_.nodes.size()));
  for (int n = static_cast<int>(g_.nodes.size()) - 1; n >= 0; --n)
    for (int v : g_.nodes[n].inputs)
      if (v >= 0) first_use[v] = n;
  std::set<int> inputs(g_.inputs.begin(), g_.inputs.end());
  std::vector<int> vars;
  for (int v = 0; v < static_cast<int>(g_.values.size()); ++v) {
    const Value& val = g_.values[v];
    if (cons_.by_value.count(v) || val.shape.empty() || consumers[v].empty()) continue;
    if (inputs.count(v)) {
      vars.push_back(v);
      continue;
    }
    if (!val.is_initializer || val.shape.size() < 2) continue;
    // A weight that some factor rule contracts over (a reduction factor on one of its dims).
    bool contracted = false;
    for (int n : consumers[v]) {
      const Node& node = g_.nodes[n];
      const OpShardingRule* rule = rules_.rule(n);
      if (!rule) continue;
      for (size_t i = 0; i < node.inputs.size() && i < rule->operands.size(); ++i)
        if (node.inputs[i] == v)
          for (const auto& fs : rule->operands[i])
            for (int f : fs) contracted |= rule->factor_kinds[f] == FactorKind::kReduction;
    }
    if (contracted) vars.push_back(v);
  }
  // The activation operands of contractions over those weights (the input of q/k/v, of a Megatron MLP's first
  // matmul...): activation names carry no layer number, so each is tied through its weight's layer key.
  std::set<int> weights;
  for (int v : vars)
    if (!inputs.count(v)) weights.insert(v);
  std::map<int, int> act_weight;  // activation value -> the weight of its first contracting consumer
  for (int n = 0; n < static_cast<int>(g_.nodes.size()); ++n) {
    const Node& node = g_.nodes[n];
    const OpShardingRule* rule = rules_.rule(n);
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
      if (v < 0 || v == w || act_weight.count(v) || cons_.by_value.count(v) || inputs.count(v)) continue;
      const Value& val = g_.values[v];
      if (val.is_initializer || val.shape.empty()) continue;
      act_weight[v] = w;
      vars.push_back(v);
    }
  }
  std::stable_sort(vars.begin(), vars.end(), [&](int a, int b) { return first_use[a] < first_use[b]; });
  std::map<std::string, size_t> index;
  for (int v : vars) {
    const Value& val = g_.values[v];
    const bool is_input = inputs.count(v) > 0;
    const bool is_act = act_weight.count(v) > 0;
    const std::string name = is_act ? "input of " + layer_key(g_.values[act_weight[v]].name) : layer_key(val.name);
    std::string key =
        fmt::format("{}|{}|{}|{}|{}", is_input, is_act, name, shape_str(val.shape), static_cast<int>(val.dtype));
    auto [it, fresh] = index.emplace(key, groups_.size());
    if (fresh) {
      Group gr;
      gr.key = name;
      gr.is_input = is_input;
      gr.is_activation = is_act;
      groups_.push_back(gr);
    }
    groups_[it->second].members.push_back(v);
  }
  // Each weight group points at the activation group of its first member's contraction.
  std::map<int, size_t> group_of;
  for (size_t k = 0; k < groups_.size(); ++k)
    for (int v : groups_[k].members) group_of[v] = k;
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (!groups_[k].is_activation) continue;
    Group& wg = groups_[group_of[act_weight[groups_[k].members[0]]]];
    if (wg.act_group < 0) wg.act_group = static_cast<int>(k);
  }
  // Groups whose display keys collide (same layer key, different shapes) show their shape too.
  std::map<std::string, int> uses;
  for (const Group& gr : groups_) ++uses[gr.key];
  for (Group& gr : groups_)
    if (uses[gr.key] > 1) gr.key += " " + shape_str(g_.values[gr.members[0]].shape);
  for (Group& gr : groups_) add_candidates(gr, allowed_dims(gr.members[0], consumers, gr.is_activation));
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

Annotations Search::annotations(const std::vector<int>& assign) const {
  Annotations a = cons_;
  for (size_t k = 0; k < groups_.size(); ++k) {
    const auto& c = groups_[k].candidates[assign[k]];
    if (!c) continue;
    for (int v : groups_[k].members) a.by_value[v] = Annotation{*c, 0, "--auto"};
  }
  return a;
}

AutoPlanCost Search::evaluate(const std::vector<int>& assign, bool rethrow) {
  auto it = memo_.find(assign);
  if (it != memo_.end()) return it->second;
  AutoPlanCost c;
  ++evaluations_;
  try {
    Annotations refined = refine_for_reshapes(g_, annotations(assign), &rules_);
    ShardingPlan plan = propagate(g_, refined, &rules_);
    SpmdProgram p = partition(g_, plan, refined.mesh, o_.target, &rules_, o_.memory_roles);
    CostReport r = simulate_cost(g_, p, o_.target, o_.overlap, o_.memory_roles);
    c.valid = true;
    c.step_time_s = r.step_time_s;
    c.compute_time_s = r.compute_time_s;
    c.communication_time_s = r.communication_time_s;
    c.peak_memory_bytes = r.peak_memory_bytes;
    c.fits = c.peak_memory_bytes <= limit_;
  } catch (const std::exception& e) {
    if (rethrow) throw;
    c.valid = false;
    c.error = e.what();
  }
  memo_[assign] = c;
  if (c.valid && c.fits && (progress_.best_step_time_s == 0 || c.step_time_s < progress_.best_step_time_s))
    progress_.best_step_time_s = c.step_time_s;
  report_progress();
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
    if (!groups_[k].is_input) continue;
    const Shape& shape = g_.values[groups_[k].members[0]].shape;
    TensorSharding s = TensorSharding::replicated(static_cast<int>(shape.size()));
    s.dims[0] = fitting_axes(axes, shape[0]);
    assign[k] = candidate_index(groups_[k], s);
  }
  return assign;
}

std::optional<std::vector<int>> Search::megatron_seed() {
  // The model axis: one named "model" if the mesh has it, else the last axis with more than one device.
  int model = mesh_.axis_index("model");
  if (model >= 0 && mesh_.shape[model] <= 1) model = -1;
  for (int a = mesh_.rank() - 1; a >= 0 && model < 0; --a)
    if (mesh_.shape[a] > 1) model = a;
  if (model < 0) return std::nullopt;
  model_axis_ = model;
  megatron_column_.assign(groups_.size(), false);
  std::vector<int> data_axes;
  for (int a = 0; a < mesh_.rank(); ++a)
    if (a != model) data_axes.push_back(a);
  std::vector<int> assign = data_parallel_seed(data_axes);
  const auto consumers = g_.consumers();
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].is_input || groups_[k].is_activation) continue;
    const int w = groups_[k].members[0];
    const Shape& shape = g_.values[w].shape;
    // The first consumer that contracts over the weight decides: if its other operands already arrive split over
    // the model axis on the contracted factor, split the weight there (row-parallel); otherwise split the weight's
    // own output factor (column-parallel). Embedding tables (Gather) are left to propagation.
    for (int n : consumers[w]) {
      const Node& node = g_.nodes[n];
      const OpShardingRule* rule = rules_.rule(n);
      if (!rule || node.op_type == "Gather") continue;
      int wi = -1;
      for (size_t i = 0; i < node.inputs.size() && i < rule->operands.size(); ++i)
        if (node.inputs[i] == w) wi = static_cast<int>(i);
      if (wi < 0) continue;
      const DimFactors& wdf = rule->operands[wi];
      int red_dim = -1, out_dim = -1, red_factor = -1;
      std::set<int> other_factors;
      for (size_t i = 0; i < rule->operands.size() && i < node.inputs.size(); ++i)  // activations, not biases
        if (static_cast<int>(i) != wi && node.inputs[i] >= 0 && !g_.values[node.inputs[i]].is_initializer)
          for (const auto& fs : rule->operands[i]) other_factors.insert(fs.begin(), fs.end());
      for (int d = 0; d < static_cast<int>(wdf.size()); ++d) {
        if (wdf[d].size() != 1) continue;
        const int f = wdf[d][0];
        if (rule->factor_kinds[f] == FactorKind::kReduction && red_dim < 0) red_dim = d, red_factor = f;
        if (rule->factor_kinds[f] == FactorKind::kPassThrough && !other_factors.count(f)) out_dim = d;
      }
      if (red_dim < 0) break;
      bool row = false;
      Annotations refined = refine_for_reshapes(g_, annotations(assign), &rules_);
      ShardingPlan plan = propagate(g_, refined, &rules_);
      for (size_t i = 0; i < node.inputs.size() && i < rule->operands.size(); ++i) {
        if (static_cast<int>(i) == wi || node.inputs[i] < 0) continue;
        const TensorSharding& s = plan.shardings[node.inputs[i]];
        for (int d = 0; d < static_cast<int>(rule->operands[i].size()) && d < s.rank(); ++d) {
          const auto& fs = rule->operands[i][d];
          if (std::find(fs.begin(), fs.end(), red_factor) == fs.end()) continue;
          for (int a : s.dims[d]) row |= refined.mesh.user_axis(a) == model;
        }
      }
      const int dim = row ? red_dim : out_dim;
      if (dim < 0 || shape[dim] < mesh_.shape[model]) break;
      TensorSharding s = TensorSharding::replicated(static_cast<int>(shape.size()));
      s.dims[dim] = {model};
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
    if (groups_[k].is_input || groups_[k].is_activation || !c || c->rank() != 2) continue;
    const int model_dim = c->dims[0].empty() ? 1 : 0;
    TensorSharding s = *c;
    std::vector<int> others;
    for (int a = 0; a < mesh_.rank(); ++a)
      if (std::find(c->dims[model_dim].begin(), c->dims[model_dim].end(), a) == c->dims[model_dim].end())
        others.push_back(a);
    s.dims[1 - model_dim] = fitting_axes(others, g_.values[groups_[k].members[0]].shape[1 - model_dim]);
    assign[k] = candidate_index(groups_[k], s);
  }
  return assign;
}

std::vector<int> Search::hybrid_seed(const std::vector<int>& dp, const std::vector<int>& megatron) {
  std::vector<int> assign = dp;
  AutoPlanCost c = evaluate(assign);
  std::vector<size_t> order;
  for (size_t k = 0; k < groups_.size(); ++k)
    if (!groups_[k].is_input && !groups_[k].is_activation && megatron[k] != 0) order.push_back(k);
  auto bytes = [&](size_t k) {
    return g_.values[groups_[k].members[0]].nbytes() * static_cast<int64_t>(groups_[k].members.size());
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes(a) > bytes(b); });
  std::vector<int> data_axes;
  for (int a = 0; a < mesh_.rank(); ++a)
    if (a != model_axis_) data_axes.push_back(a);
  for (size_t k : order) {
    if (c.valid && c.fits) break;
    assign[k] = megatron[k];
    const int act = groups_[k].act_group;
    if (megatron_column_[k] && act >= 0) {
      const Shape& shape = g_.values[groups_[act].members[0]].shape;
      TensorSharding s = TensorSharding::replicated(static_cast<int>(shape.size()));
      s.dims[0] = fitting_axes(data_axes, shape[0]);
      assign[act] = candidate_index(groups_[act], s);
    }
    c = evaluate(assign);
  }
  return assign;
}

AutoResult Search::run() {
  start_ = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start_).count(); };
  if (o_.memory_limit_bytes < 0)
    throw InputError(fmt::format("--memory-limit: {} is not a positive number of bytes", o_.memory_limit_bytes));
  find_groups();
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
  for (const Group& gr : groups_) res.variables += static_cast<int>(gr.members.size());
  res.groups = static_cast<int>(groups_.size());

  // Seeds. The all-free plan is what the pipeline does without --auto: its errors are the user's errors.
  std::vector<std::pair<std::string, std::vector<int>>> seeds;
  seeds.emplace_back("replicated", std::vector<int>(groups_.size(), 0));
  std::vector<int> all_axes;
  for (int a = 0; a < mesh_.rank(); ++a) all_axes.push_back(a);
  seeds.emplace_back("data-parallel", data_parallel_seed(all_axes));
  if (mesh_.rank() >= 2) seeds.emplace_back("data-parallel (first axis)", data_parallel_seed({0}));
  if (auto m = megatron_seed()) {
    seeds.emplace_back(mesh_.rank() >= 2 ? "megatron+data" : "megatron", *m);
    if (mesh_.rank() >= 2) seeds.emplace_back("2d-weights", two_d_seed(*m));
    seeds.emplace_back("hybrid", hybrid_seed(seeds[1].second, *m));
  }

  evaluate(seeds[0].second, /*rethrow=*/true);
  std::vector<std::pair<AutoPlanCost, std::vector<int>>> starts;  // distinct seeds, best first
  for (size_t i = 0; i < seeds.size(); ++i) {
    AutoPlanCost c = evaluate(seeds[i].second);
    c.name = seeds[i].first;
    if (seeds[i].first == "replicated" || seeds[i].first == "data-parallel" || seeds[i].first.rfind("megatron", 0) == 0)
      res.baselines.push_back(c);
    bool seen = false;
    for (const auto& st : starts) seen |= st.second == seeds[i].second;
    if (!seen) starts.emplace_back(c, seeds[i].second);
  }
  std::stable_sort(starts.begin(), starts.end(), [](const auto& a, const auto& b) { return better(a.first, b.first); });

  // Coordinate descent over the groups from the best seed. A local search is path dependent, and when memory is
  // tight the least-memory seed is not always the one whose neighbourhood holds a plan that fits: while no fitting
  // plan is found, the descent is repeated from the next best distinct seed (three starts at most, and only while
  // half the time budget is left).
  std::vector<int> best_assign = starts[0].second;
  AutoPlanCost best = starts[0].first;
  const size_t max_starts = std::min<size_t>(3, starts.size());
  for (size_t st = 0; st < max_starts && !res.budget_exhausted; ++st) {
    if (st > 0 && (best.fits || elapsed() > o_.time_budget_s / 2)) break;
    std::vector<int> cur = starts[st].second;
    AutoPlanCost cur_cost = starts[st].first;
    progress_.descent = static_cast<int>(st) + 1;
    for (int sweep = 0; sweep < o_.max_sweeps && !res.budget_exhausted; ++sweep) {
      ++res.sweeps;
      progress_.sweep = sweep + 1;
      bool changed = false;
      for (size_t k = 0; k < groups_.size() && !res.budget_exhausted; ++k) {
        progress_.group = static_cast<int>(k);
        int best_opt = cur[k];
        for (int opt = 0; opt < static_cast<int>(groups_[k].candidates.size()); ++opt) {
          if (opt == cur[k]) continue;
          if (elapsed() > o_.time_budget_s) {
            res.budget_exhausted = true;
            break;
          }
          std::vector<int> a = cur;
          a[k] = opt;
          AutoPlanCost c = evaluate(a);
          if (better(c, cur_cost)) cur_cost = c, best_opt = opt;
        }
        if (best_opt != cur[k]) cur[k] = best_opt, changed = true;
      }
      if (!changed) break;
    }
    ++res.starts;
    if (better(cur_cost, best)) best = cur_cost, best_assign = cur;
  }
  const std::vector<int>& cur = best_assign;

  best.name = "auto";
  res.chosen = best;
  res.annotations = annotations(cur);
  for (size_t k = 0; k < groups_.size(); ++k) {
    AutoChoice ch;
    ch.group = groups_[k].key;
    ch.values = groups_[k].members;
    if (const auto& c = groups_[k].candidates[cur[k]]) ch.annotated = true, ch.sharding = *c;
    res.choices.push_back(ch);
  }
  res.evaluations = evaluations_;
  res.search_time_s = elapsed();
  if (!best.valid) throw InputError(fmt::format("--auto: no sharding plan could be partitioned: {}", best.error));
  if (!best.fits)
    throw InputError(fmt::format(
        "--auto: no sharding plan fits in {} bytes per device; the best plan found needs {} bytes per device", limit_,
        best.peak_memory_bytes));
  return res;
}

}  // namespace

AutoResult auto_shard(const Graph& g, const Annotations& constraints, const AutoOptions& o, const RuleTable* rules) {
  std::optional<RuleTable> own;
  Search s(g, constraints, o, rules_for(g, rules, own));
  return s.run();
}

}  // namespace gspmd
