#include "core/propagation/propagation.h"

#include <algorithm>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/rules/rule.h"

namespace gspmd {
namespace {

class Propagator {
 public:
  Propagator(const Graph& g, const Annotations& ann) : g_(g), ann_(ann), mesh_(ann.mesh) {}

  ShardingPlan run() {
    const size_t nv = g_.values.size();
    plan_.shardings.resize(nv);
    plan_.origins.assign(nv, Origin{});
    for (size_t v = 0; v < nv; ++v)
      plan_.shardings[v] = TensorSharding::replicated(static_cast<int>(g_.values[v].shape.size()));
    state_.assign(nv, kOpen);

    for (const auto& [v, a] : ann_.by_value) {
      if (v < 0 || v >= static_cast<int>(nv))
        throw InputError(fmt::format("annotation for value id {} which is not in the graph", v));
      const Value& val = g_.values[v];
      try {
        a.sharding.verify(mesh_, static_cast<int>(val.shape.size()));
      } catch (const std::invalid_argument& e) {
        throw InputError(fmt::format("{}: sharding of '{}': {}", a.source.empty() ? "annotation" : a.source,
                                     val.name, e.what()));
      }
    }

    rules_.resize(g_.nodes.size());
    first_group_.assign(g_.nodes.size(), 0);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      rules_[n] = get_rule(g_, g_.nodes[n]);
      if (!rules_[n]) {
        plan_.nodes_without_rule.push_back(static_cast<int>(n));
        continue;
      }
      bool simple = true;  // elementwise / data movement: only pass-through and permutation factors
      for (FactorKind k : rules_[n]->factor_kinds)
        if (k == FactorKind::kReduction || k == FactorKind::kNeedReplication) simple = false;
      first_group_[n] = simple;
    }

    std::set<int> prios;
    for (const auto& [v, a] : ann_.by_value) prios.insert(a.priority);
    for (const auto& [v, a] : ann_.by_value) state_[v] = kFrozen;  // not visible until its priority's round
    for (int p : prios) {
      for (const auto& [v, a] : ann_.by_value) {
        if (a.priority != p) continue;
        state_[v] = kFixed;
        plan_.shardings[v] = a.sharding;
        plan_.origins[v] = Origin{Origin::kAnnotation, -1, -1, true};
      }
      while (true) {
        while (sweep(true)) {
        }
        if (!sweep(false)) break;
      }
    }
    return std::move(plan_);
  }

 private:
  enum State : char { kOpen, kFixed, kFrozen };

  // One forward and one backward pass over the nodes (only the first group when `first_only`).
  bool sweep(bool first_only) {
    bool changed = false;
    const int nn = static_cast<int>(g_.nodes.size());
    for (int n = 0; n < nn; ++n)
      if (rules_[n] && (!first_only || first_group_[n])) changed |= process(n);
    for (int n = nn - 1; n >= 0; --n)
      if (rules_[n] && (!first_only || first_group_[n])) changed |= process(n);
    return changed;
  }

  struct Ref {
    int v;
    bool result;
    const DimFactors* df;
    int64_t numel;
  };

  bool process(int n) {
    const Node& node = g_.nodes[n];
    const OpShardingRule& rule = *rules_[n];
    const int nf = rule.num_factors();
    std::vector<Ref> refs;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = node.inputs[i];
      if (v >= 0 && state_[v] != kFrozen) refs.push_back({v, false, &rule.operands[i], num_elements(g_.values[v].shape)});
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      int v = node.outputs[i];
      if (v >= 0 && state_[v] != kFrozen) refs.push_back({v, true, &rule.results[i], num_elements(g_.values[v].shape)});
    }

    // 1. Merge: project each tiled tensor onto the factors, larger tensors first (ties: earlier operand).
    std::vector<Ref> order = refs;
    std::stable_sort(order.begin(), order.end(), [](const Ref& a, const Ref& b) { return a.numel > b.numel; });
    FactorSharding fs(nf);
    std::vector<int> src(nf, -1);
    std::vector<int> owner(mesh_.rank(), -1);
    bool any = false;
    for (const Ref& r : order) {
      const TensorSharding& s = plan_.shardings[r.v];
      if (!s.is_tiled()) continue;
      FactorSharding tmp(nf);
      project_to_factors(s, *r.df, rule, mesh_, tmp);  // dims that cannot be expressed are skipped
      for (const auto& dim : *r.df) {
        for (int f : dim) {
          const auto& axes = tmp[f];
          if (axes.empty()) continue;
          FactorKind k = rule.factor_kinds[f];
          if (k == FactorKind::kNeedReplication || k == FactorKind::kPermutation) continue;
          if (r.result && k == FactorKind::kReduction) continue;
          // Existing assignment wins unless this one extends it.
          size_t have = fs[f].size();
          if (have > 0 && (axes.size() <= have || !std::equal(fs[f].begin(), fs[f].end(), axes.begin()))) continue;
          int64_t prod = mesh_.axes_size(fs[f]);
          for (size_t j = have; j < axes.size(); ++j) {
            int a = axes[j];
            if (owner[a] != -1 && owner[a] != f) break;
            if (prod * mesh_.shape[a] > rule.factor_sizes[f]) break;  // more shards than elements
            prod *= mesh_.shape[a];
            fs[f].push_back(a);
            owner[a] = f;
            if (src[f] < 0) src[f] = r.v;
            any = true;
          }
        }
      }
    }
    if (!any) return false;

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
      for (int d = 0; d < cur.rank() && d < want.rank(); ++d) {
        if (!cur.dims[d].empty() || want.dims[d].empty()) continue;
        std::vector<int> take;
        for (int a : want.dims[d]) {
          if (used[a]) break;
          take.push_back(a);
        }
        if (take.empty()) continue;
        for (int a : take) used[a] = 1;
        cur.dims[d] = std::move(take);
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
  std::vector<std::optional<OpShardingRule>> rules_;
  std::vector<char> first_group_;
};

std::string node_label(const Graph& g, int n) {
  const Node& node = g.nodes.at(n);
  return node.name.empty() ? fmt::format("{}#{}", node.op_type, n) : node.name;
}

}  // namespace

ShardingPlan propagate(const Graph& g, const Annotations& ann) { return Propagator(g, ann).run(); }

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

}  // namespace gspmd
