#include "core/propagation/propagation.h"

#include <algorithm>
#include <array>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/rules/factor_projection.h"
#include "core/rules/rule.h"

namespace gspmd {
namespace {

class Propagator {
 public:
  Propagator(const Graph& g, const Annotations& ann, const RuleTable& rules)
      : g_(g), ann_(ann), mesh_(ann.mesh), rules_(rules) {}

  ShardingPlan run() {
    const size_t nv = g_.values.size();
    plan_.shardings.resize(nv);
    plan_.origins.assign(nv, Origin{});
    plan_.axis_origins.assign(nv, std::vector<int>(static_cast<size_t>(mesh_.rank()), -1));
    for (size_t v = 0; v < nv; ++v)
      plan_.shardings[v] = TensorSharding::replicated(static_cast<int>(g_.values[v].shape.size()));
    state_.assign(nv, kOpen);
    numel_.resize(nv);
    for (size_t v = 0; v < nv; ++v) numel_[v] = num_elements(g_.values[v].shape);
    touched_at_.assign(g_.nodes.size(), 0);
    users_start_.assign(nv + 1, 0);  // the nodes that read or write each value, flattened
    for (const Node& node : g_.nodes) {
      for (int v : node.inputs)
        if (v >= 0) ++users_start_[static_cast<size_t>(v) + 1];
      for (int v : node.outputs)
        if (v >= 0) ++users_start_[static_cast<size_t>(v) + 1];
    }
    for (size_t v = 0; v < nv; ++v) users_start_[v + 1] += users_start_[v];
    users_.resize(users_start_[nv]);
    std::vector<int> fill(users_start_.begin(), users_start_.end() - 1);
    for (int n = 0; n < static_cast<int>(g_.nodes.size()); ++n) {
      for (int v : g_.nodes[static_cast<size_t>(n)].inputs)
        if (v >= 0) users_[static_cast<size_t>(fill[static_cast<size_t>(v)]++)] = n;
      for (int v : g_.nodes[static_cast<size_t>(n)].outputs)
        if (v >= 0) users_[static_cast<size_t>(fill[static_cast<size_t>(v)]++)] = n;
    }
    for (auto& at : visited_at_) at.assign(g_.nodes.size(), 0);

    for (const auto& [v, a] : ann_.by_value) {
      if (v < 0 || v >= static_cast<int>(nv))
        throw InputError(fmt::format("annotation for value id {} which is not in the graph", v));
      const Value& val = g_.values[v];
      try {
        a.sharding.verify(mesh_, static_cast<int>(val.shape.size()));
      } catch (const std::invalid_argument& e) {
        throw InputError(
            fmt::format("{}: sharding of '{}': {}", a.source.empty() ? "annotation" : a.source, val.name, e.what()));
      }
      const std::vector<char> runtime = runtime_dims_of(g_, v);
      for (size_t d = 0; d < runtime.size() && d < a.sharding.dims.size(); ++d)
        if (runtime[d] && !a.sharding.dims[d].empty()) {
          std::string node;
          for (const std::string& sym : val.sym->dims[d].symbols())
            if (auto rt = g_.runtime_dims.find(sym); rt != g_.runtime_dims.end() && node.empty())
              node = rt->second.node;
          throw InputError(fmt::format(
              "{}: sharding of '{}': dim {} ({}) is data-dependent, known only when node '{}' runs: it cannot be "
              "split",
              a.source.empty() ? "annotation" : a.source, val.name, d, val.sym->dims[d].str(), node));
        }
    }

    pass_through_op_.assign(g_.nodes.size(), 0);
    broadcast_.assign(g_.nodes.size(), {});
    same_as_.assign(g_.nodes.size(), {0, 1, 2});
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      if (!rules_.rule(static_cast<int>(n))) {
        plan_.nodes_without_rule.push_back(static_cast<int>(n));
        continue;
      }
      classify(static_cast<int>(n));
      classify_stages(static_cast<int>(n));
    }

    std::set<int> prios;
    for (const auto& [v, a] : ann_.by_value) prios.insert(a.priority);
    for (const auto& [v, a] : ann_.by_value) state_[v] = kFrozen;  // not visible until its priority's round
    for (int p : prios) {
      for (const auto& [v, a] : ann_.by_value) {
        if (a.priority != p) continue;
        // A closed annotation is fixed; an open one (any open dim) takes more axes on its open dims only.
        const bool any_open = a.open || std::any_of(a.open_dims.begin(), a.open_dims.end(), [](char c) { return c; });
        state_[v] = any_open ? kOpen : kFixed;
        if (any_open) open_ann_[v] = &a;
        plan_.shardings[v] = a.sharding;
        touch(v);
        plan_.origins[v] = Origin{Origin::kAnnotation, -1, -1, true, a.source, a.open};
        for (int ax : a.sharding.tiled_axes()) plan_.axis_origins[v][ax] = v;
        for (int ax : a.sharding.unreduced) plan_.axis_origins[v][ax] = v;
      }
      // Op priorities (Shardy's op-priority strategy): a stage runs only when every earlier stage is at its
      // fixpoint, and any change sends propagation back to stage 0.
      int stage = 0;
      while (stage < kStages) stage = sweep(stage) ? 0 : stage + 1;
    }
    return std::move(plan_);
  }

 private:
  enum State : char { kOpen, kFixed, kFrozen };

  // Propagation stages, run in order for every user priority:
  //   0: pass-through ops (every factor pass-through/permutation: elementwise, shape and data-movement ops), both
  //      directions, except forward from a broadcast operand;
  //   1: the pass-through and windowed factors of every op, both directions, except forward from a broadcast
  //      operand;
  //   2: everything: broadcast operands forward, and reduction factors between operands.
  static constexpr int kStages = 3;

  // Pass-through op and broadcast operands of node n. An operand of a pass-through op is a broadcast operand when
  // all its factors are factors of result 0 and it has fewer elements (a bias, a Where condition, Expand's input):
  // propagating forward from it would split a large tensor after a small one (Shardy: broadcasts forward last).
  void classify(int n) {
    const Node& node = g_.nodes[n];
    const OpShardingRule& rule = *rules_.rule(n);
    bool simple = true;
    for (FactorKind k : rule.factor_kinds)
      if (k != FactorKind::kPassThrough && k != FactorKind::kPermutation) simple = false;
    pass_through_op_[n] = simple;
    broadcast_[n].assign(node.inputs.size(), 0);
    if (!simple || node.outputs.empty() || node.outputs[0] < 0 || rule.results.empty()) return;
    std::vector<char> in_result(rule.num_factors(), 0);
    for (const auto& dim : rule.results[0])
      for (int f : dim) in_result[f] = 1;
    const int64_t out_numel = num_elements(g_.values[node.outputs[0]].shape);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = node.inputs[i];
      if (v < 0 || num_elements(g_.values[v].shape) >= out_numel) continue;
      bool subset = true;
      for (const auto& dim : rule.operands[i])
        for (int f : dim) subset = subset && in_result[f];
      broadcast_[n][i] = subset;
    }
  }

  // The stages in which process(n, stage) does the same thing, given the same shardings: stage 0 and 1 differ only
  // on windowed factors, 1 and 2 only on reduction factors and broadcast operands. same_as_[n][stage] is the first
  // such stage; a node settled there is settled in `stage` too.
  void classify_stages(int n) {
    const OpShardingRule& rule = *rules_.rule(n);
    const auto has = [&](FactorKind k) {
      return std::find(rule.factor_kinds.begin(), rule.factor_kinds.end(), k) != rule.factor_kinds.end();
    };
    const bool broadcast = std::any_of(broadcast_[n].begin(), broadcast_[n].end(), [](char c) { return c != 0; });
    std::array<char, kStages>& same = same_as_[static_cast<size_t>(n)];
    same[0] = 0;
    same[1] = has(FactorKind::kWindowed) ? 1 : same[0];
    same[2] = has(FactorKind::kReduction) || broadcast ? 2 : same[1];
  }

  // One forward and one backward pass over the nodes taking part in `stage`. A node is skipped when none of its
  // values changed since process() last looked at it in this stage and found nothing to do: process() reads only
  // its values' shardings and states, so it would again change nothing (the fixpoint and the order of changes are
  // those of processing every node).
  bool sweep(int stage) {
    bool changed = false;
    const int nn = static_cast<int>(g_.nodes.size());
    for (int n = 0; n < nn; ++n)
      if (rules_.rule(n) && (stage > 0 || pass_through_op_[n]) && !settled(n, stage)) changed |= process(n, stage);
    for (int n = nn - 1; n >= 0; --n)
      if (rules_.rule(n) && (stage > 0 || pass_through_op_[n]) && !settled(n, stage)) changed |= process(n, stage);
    return changed;
  }

  // True when process(n, stage) (or process(n, s) of a stage s that does the same) ran and no value of node n
  // changed since it started.
  bool settled(int n, int stage) const {
    const int same = same_as_[static_cast<size_t>(n)][static_cast<size_t>(stage)];
    const uint64_t at = visited_at_[static_cast<size_t>(same)][static_cast<size_t>(n)];
    return at != 0 && touched_at_[static_cast<size_t>(n)] < at;
  }

  // Records a change of value v's sharding (or state) for the nodes that read or write it.
  void touch(int v) {
    const uint64_t now = ++clock_;
    for (int i = users_start_[static_cast<size_t>(v)]; i < users_start_[static_cast<size_t>(v) + 1]; ++i)
      touched_at_[static_cast<size_t>(users_[static_cast<size_t>(i)])] = now;
  }

  struct Ref {
    int v;
    bool result;
    const DimFactors* df;
    int64_t numel;
    bool target_only;  // a broadcast operand before the last stage: receives shardings, gives none
  };

  bool process(int n, int stage) {
    visited_at_[static_cast<size_t>(same_as_[static_cast<size_t>(n)][static_cast<size_t>(stage)])]
               [static_cast<size_t>(n)] = ++clock_;
    const Node& node = g_.nodes[n];
    const OpShardingRule& rule = *rules_.rule(n);
    const int nf = rule.num_factors();
    std::vector<Ref>& refs = refs_;
    refs.clear();
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = node.inputs[i];
      if (v >= 0 && state_[v] != kFrozen)
        refs.push_back({v, false, &rule.operands[i], numel_[v], stage < 2 && broadcast_[n][i] != 0});
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      int v = node.outputs[i];
      if (v >= 0 && state_[v] != kFrozen) refs.push_back({v, true, &rule.results[i], numel_[v], false});
    }

    // 1. Merge: project each tensor onto the factors, larger tensors first (ties: earlier operand); dims that cannot
    //    be expressed are skipped. No cap at the factor size: a source split into more shards than elements (uneven,
    //    some shards all padding) is still a valid split, and copying it lets the op run locally without collectives.
    std::vector<const Ref*>& projected = projected_;  // per tensor of proj: its Ref (tiled givers only)
    projected.clear();
    for (const Ref& r : refs)
      if (plan_.shardings[r.v].is_tiled() && !r.target_only) projected.push_back(&r);
    if (projected.empty()) return false;  // nothing to give
    if (proj_)
      proj_->reset(rule);
    else
      proj_.emplace(rule, mesh_);
    FactorProjection& proj = *proj_;
    for (const Ref* r : projected) proj.add(plan_.shardings[r->v], *r->df, r->numel);
    const FactorProjection::Merged merged = proj.merge_largest_first([&](int t, int f) {
      const FactorKind k = rule.factor_kinds[f];
      if (k == FactorKind::kNeedReplication || k == FactorKind::kPermutation) return false;
      if (k == FactorKind::kWindowed && stage < 1) return false;  // (pass-through ops have none anyway)
      return k != FactorKind::kReduction || (!projected[static_cast<size_t>(t)]->result && stage >= 2);
    });
    if (!merged.any) return false;
    const FactorSharding& fs = merged.factors;
    std::vector<int>& src = src_;  // per factor: the value it came from
    src.assign(nf, -1);
    for (int f = 0; f < nf; ++f)
      if (merged.source[f] >= 0) src[f] = projected[static_cast<size_t>(merged.source[f])]->v;

    // 2. Project back onto open tensors, filling only dims that are not split yet.
    FactorSharding fs_res = fs;  // results never see reduction factors
    for (int f = 0; f < nf; ++f)
      if (rule.factor_kinds[f] == FactorKind::kReduction) fs_res[f].clear();
    bool changed = false;
    for (const Ref& r : refs) {
      if (state_[r.v] != kOpen) continue;
      TensorSharding want = sharding_from_factors(r.result ? fs_res : fs, *r.df, rule, mesh_);
      TensorSharding& cur = plan_.shardings[r.v];
      std::vector<char> used(mesh_.rank(), 0);
      for (int a : cur.tiled_axes()) used[a] = 1;
      for (int a : cur.unreduced) used[a] = 1;
      int from = -1;
      const auto open_it = open_ann_.find(r.v);
      const Annotation* open = open_it == open_ann_.end() ? nullptr : open_it->second;
      for (int d = 0; d < cur.rank() && d < want.rank(); ++d) {
        // An empty dim takes the axes it is offered; an open annotated dim also takes the axes offered after its
        // own (Shardy's open dims), a closed annotated dim none.
        const size_t have = cur.dims[d].size();
        if (open && !open->dim_open(d)) continue;
        if (have > 0 && !(open && want.dims[d].size() > have &&
                          std::equal(cur.dims[d].begin(), cur.dims[d].end(), want.dims[d].begin())))
          continue;
        if (want.dims[d].empty()) continue;
        std::vector<int> take;
        for (size_t k = have; k < want.dims[d].size(); ++k) {
          const int a = want.dims[d][k];
          if (used[a]) break;
          take.push_back(a);
        }
        if (take.empty()) continue;
        for (int a : take) {
          used[a] = 1;
          for (int f : (*r.df)[d])  // the annotation behind the factor's source gave this axis
            if (src[f] >= 0 && std::find(fs[f].begin(), fs[f].end(), a) != fs[f].end())
              plan_.axis_origins[r.v][a] = plan_.axis_origins[src[f]][a];
        }
        cur.dims[d].insert(cur.dims[d].end(), take.begin(), take.end());
        touch(r.v);
        if (from < 0)
          for (int f : (*r.df)[d])
            if (src[f] >= 0) {
              from = src[f];
              break;
            }
      }
      if (from >= 0) {  // some dim was filled (every assigned factor has a source)
        changed = true;
        if (plan_.origins[r.v].kind == Origin::kDefault)
          plan_.origins[r.v] = Origin{Origin::kPropagated, n, from, r.result};
      }
    }
    return changed;
  }

  const Graph& g_;
  const Annotations& ann_;
  const DeviceMesh& mesh_;
  ShardingPlan plan_;
  std::vector<State> state_;
  const RuleTable& rules_;
  std::vector<Ref> refs_;                 // process()'s scratch (no allocation per call)
  std::vector<const Ref*> projected_;     // process()'s scratch
  std::vector<int> src_;                  // process()'s scratch
  std::optional<FactorProjection> proj_;  // process()'s, reset per node (keeps its memory)
  std::vector<int64_t> numel_;            // per value: its element count
  uint64_t clock_ = 0;                    // counts process() calls and sharding changes
  std::vector<uint64_t> touched_at_;      // per node: clock_ at the last change of one of its values (0: never)
  std::vector<int> users_start_, users_;  // users_[users_start_[v] ..): the nodes that read or write value v
  std::array<std::vector<uint64_t>, kStages> visited_at_;  // per stage, per node: clock_ at its last process()
  std::map<int, const Annotation*> open_ann_;              // annotated values with an open dim: their annotation
  std::vector<char> pass_through_op_;                      // per node: stage-0 op
  std::vector<std::vector<char>> broadcast_;
  std::vector<std::array<char, kStages>> same_as_;  // per node, per stage: the first stage that does the same // per
                                                    // node, per operand: a broadcast operand
};

std::string node_label(const Graph& g, int n) {
  const Node& node = g.nodes.at(n);
  return node.name.empty() ? fmt::format("{}#{}", node.op_type, n) : node.name;
}

}  // namespace

ShardingPlan propagate(const Graph& g, const Annotations& ann, const RuleTable* rules) {
  std::optional<RuleTable> own;
  return Propagator(g, ann, rules_for(g, rules, own)).run();
}

std::string origin_chain(const Graph& g, const ShardingPlan& plan, int v) {
  struct Hop {
    int node;
    int value;
    bool forward;
  };
  std::vector<Hop> hops;
  std::vector<char> seen(g.values.size(), 0);
  int cur = v;
  while (cur >= 0 && cur < static_cast<int>(plan.origins.size()) && !seen[cur] &&
         plan.origins[cur].kind == Origin::kPropagated) {
    seen[cur] = 1;
    hops.push_back({plan.origins[cur].node, cur, plan.origins[cur].forward});
    cur = plan.origins[cur].from_value;
  }
  std::string s;
  if (cur >= 0 && cur < static_cast<int>(plan.origins.size()) && plan.origins[cur].kind == Origin::kAnnotation)
    s = fmt::format("annotation {}", g.values.at(cur).name);
  else if (hops.empty())
    return fmt::format("{}: replicated (no annotation reached it)", g.values.at(v).name);
  else
    s = cur >= 0 ? g.values.at(cur).name : std::string("?");
  for (auto it = hops.rbegin(); it != hops.rend(); ++it) {
    s += fmt::format(" -> {}{} -> {}", node_label(g, it->node), it->forward ? "" : " (backward)",
                     g.values.at(it->value).name);
  }
  return s;
}

std::string axis_origins_str(const Graph& g, const ShardingPlan& plan, const std::map<int, Annotation>& annotations,
                             const DeviceMesh& mesh, int v) {
  std::string s;
  if (static_cast<size_t>(v) >= plan.axis_origins.size()) return s;
  for (int a = 0; a < static_cast<int>(plan.axis_origins[v].size()); ++a) {
    const int from = plan.axis_origins[v][a];
    if (from < 0) continue;
    const auto it = annotations.find(from);
    s += fmt::format("{}{} from annotation {}{}", s.empty() ? "" : ", ", mesh.axis_names({a})[0],
                     g.values.at(from).name, it == annotations.end() ? "" : " (" + it->second.source + ")");
  }
  return s;
}

std::vector<std::vector<int64_t>> reshape_cuts(const Graph& g, const DeviceMesh& mesh, const RuleTable* rules) {
  const DeviceMesh user = mesh.user();
  std::vector<std::vector<int64_t>> cuts(user.shape.size());
  if (rules) rules->check_graph(g);
  for (int n = 0; n < static_cast<int>(g.nodes.size()); ++n) {
    const Node& node = g.nodes[static_cast<size_t>(n)];
    if (!node.domain.empty() || (node.op_type != "Reshape" && node.op_type != "Flatten")) continue;
    const RuleResult own = rules ? RuleResult() : get_rule(g, node);  // only these nodes' rules, without a table
    const OpShardingRule* rule = rules ? rules->rule(n) : own ? &*own : nullptr;
    if (!rule) continue;
    auto scan = [&](const DimFactors& df) {
      for (const std::vector<int>& dim : df) {
        if (dim.size() < 2) continue;
        int64_t size = 1;
        for (int f : dim) size *= rule->factor_sizes[static_cast<size_t>(f)];
        for (int u = 0; u < user.rank(); ++u) {
          const int64_t n = user.shape[u];
          if (n < 2 || size % n != 0) continue;
          int64_t prefix = 1;
          for (size_t k = 0; k + 1 < dim.size(); ++k) {
            prefix *= rule->factor_sizes[static_cast<size_t>(dim[k])];
            if (prefix > 1 && prefix < n && n % prefix == 0) cuts[static_cast<size_t>(u)].push_back(prefix);
          }
        }
      }
    };
    for (const auto& df : rule->operands) scan(df);
    for (const auto& df : rule->results) scan(df);
  }
  for (auto& c : cuts) {  // keep cuts that nest (each divides the next): a chain of divisors of n
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    std::vector<int64_t> chain;
    for (int64_t x : c)
      if (chain.empty() || x % chain.back() == 0) chain.push_back(x);
    c = chain;
  }
  return cuts;
}

Annotations refine_for_reshapes(const Graph& g, const Annotations& ann, const RuleTable* rules) {
  const std::vector<std::vector<int64_t>> cuts = reshape_cuts(g, ann.mesh, rules);
  if (std::all_of(cuts.begin(), cuts.end(), [](const auto& c) { return c.empty(); })) return ann;
  std::vector<std::vector<int64_t>> all = ann.mesh.cuts();
  for (size_t u = 0; u < cuts.size(); ++u) {  // merge with existing cuts, keeping a chain
    std::vector<int64_t> c = all[u];
    for (int64_t x : cuts[u])
      if (std::all_of(c.begin(), c.end(), [&](int64_t y) { return x % y == 0 || y % x == 0; })) c.push_back(x);
    all[u] = c;
  }
  Annotations out;
  out.mesh = ann.mesh.refine(all);
  for (const auto& [v, a] : ann.by_value) {
    Annotation b = a;
    b.sharding = remap(a.sharding, ann.mesh, out.mesh);
    out.by_value.emplace(v, std::move(b));
  }
  return out;
}

}  // namespace gspmd
