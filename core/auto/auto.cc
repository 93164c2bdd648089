// core/auto: the sharding search behind --auto (docs/auto.md).
#include "core/auto/auto.h"

#include "core/auto/search.h"

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

namespace auto_internal {

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

void Search::report_progress() {
  if (!o_.progress) return;
  progress_.evaluations = evaluations_;
  progress_.elapsed_s = elapsed();
  o_.progress(progress_);
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

double Search::elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

std::vector<Search::Start> Search::cost_seeds(AutoResult& res) {
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
  return starts;
}

Search::Start Search::descend(const std::vector<Start>& starts, AutoResult& res) {
  // A local search is path dependent, and when memory is tight the least-memory seed is not always the one whose
  // neighbourhood holds a plan that fits: while no fitting plan is found, the descent is repeated from the next best
  // distinct seed (three starts at most, and only while half the time budget is left).
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
  return best;
}

const Instance* Search::decide_on_whole(Start& best, const std::vector<Start>& starts) {
  if (layers_.empty()) return &full_;
  // The extrapolated costs chose; the whole graph decides. The descent's plan, and while it does not fit the best
  // seeds that do, are costed on it, and the better is the plan, with the numbers of the program that runs.
  const Instance* final_graph = &full_;
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
  return final_graph;
}

AutoResult Search::run() {
  start_ = Clock::now();
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

  // The seeds' baselines, then coordinate descent over the groups from the best seed, under its step choice.
  const std::vector<Start> starts = cost_seeds(res);
  Start best = descend(starts, res);
  const Instance* final_graph = decide_on_whole(best, starts);

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

}  // namespace auto_internal

using auto_internal::Search;

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
