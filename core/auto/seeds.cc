// The classical plans the --auto search starts from (core/auto/search.h): data parallel, FSDP, Megatron, the GSPMD
// paper's 2D plans, the hybrid of data parallel and Megatron (docs/auto.md, "The algorithm").
#include <algorithm>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "core/auto/search.h"

namespace gspmd::auto_internal {

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

std::vector<AutoChoice> Search::classical(const std::string& name) {
  prepare();
  for (const auto& [seed, assign] : classical_seeds(/*hybrid=*/false))
    if (seed == name) return choices_of(full_, assign);
  return {};
}

}  // namespace gspmd::auto_internal
