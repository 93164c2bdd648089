// The --auto search's variables and groups (core/auto/search.h): which values it annotates, how they are tied into
// groups across layers, and each group's candidate shardings (docs/auto.md, "What is searched").
#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/auto/search.h"
#include "core/autodiff/accumulate.h"
#include "core/ir/cuts.h"
#include "core/pipeline/blocks.h"

namespace gspmd::auto_internal {

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

}  // namespace gspmd::auto_internal
