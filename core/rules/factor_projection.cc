#include "core/rules/factor_projection.h"

#include <algorithm>
#include <numeric>

namespace gspmd {

int FactorProjection::add(const TensorSharding& s, const DimFactors& df, int64_t weight) {
  if (count_ == tensors_.size()) tensors_.emplace_back();
  Projected& p = tensors_[count_++];
  p.df = &df;
  p.weight = weight;
  p.factors.resize(static_cast<size_t>(rule_->num_factors()));
  for (std::vector<int>& f : p.factors) f.clear();
  if (!df.empty() && static_cast<int>(df.size()) == s.rank())
    p.exact = project_to_factors(s, df, *rule_, mesh_, p.factors);
  else
    p.exact = !s.is_tiled();
  return size() - 1;
}

bool FactorProjection::indexes(int t, int f) const {
  const DimFactors& df = dims(t);
  return std::any_of(df.begin(), df.end(),
                     [&](const std::vector<int>& d) { return std::find(d.begin(), d.end(), f) != d.end(); });
}

std::optional<std::vector<int>> FactorProjection::agreed(int f, const std::vector<int>& tensors) const {
  std::optional<std::vector<int>> axes;
  for (int t : tensors) {
    if (!indexes(t, f)) continue;
    const std::vector<int>& mine = factors(t)[static_cast<size_t>(f)];
    if (mine.empty() || (axes && *axes != mine)) return std::nullopt;
    if (!axes) axes = mine;
  }
  return axes;
}

void FactorProjection::merge_first_come(const std::vector<int>& order, FactorSharding& merged,
                                        std::vector<char>& used) const {
  for (int t : order) {
    const FactorSharding& offer = factors(t);
    for (size_t f = 0; f < offer.size(); ++f) {
      if (!merged[f].empty() || offer[f].empty()) continue;
      if (std::any_of(offer[f].begin(), offer[f].end(), [&](int a) { return used[static_cast<size_t>(a)]; })) continue;
      merged[f] = offer[f];
      for (int a : merged[f]) used[static_cast<size_t>(a)] = 1;
    }
  }
}

std::vector<int> FactorProjection::largest_first() const {
  std::vector<int> order(count_);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return tensors_[static_cast<size_t>(a)].weight > tensors_[static_cast<size_t>(b)].weight;
  });
  return order;
}

void FactorProjection::extend(int t, int f, std::vector<int>& owner, Merged& m) const {
  const std::vector<int>& axes = factors(t)[static_cast<size_t>(f)];
  std::vector<int>& have = m.factors[static_cast<size_t>(f)];
  const size_t n = have.size();
  if (n > 0 && (axes.size() <= n || !std::equal(have.begin(), have.end(), axes.begin()))) return;
  for (size_t j = n; j < axes.size(); ++j) {
    int& own = owner[static_cast<size_t>(axes[j])];
    if (own != -1 && own != f) break;
    have.push_back(axes[j]);
    own = f;
    if (m.source[static_cast<size_t>(f)] < 0) m.source[static_cast<size_t>(f)] = t;
    m.any = true;
  }
}

TensorSharding FactorProjection::tensor_sharding(const FactorSharding& fs, const DimFactors& df,
                                                 bool expressible_only) const {
  return expressible_only ? sharding_from_factors(fs, df, *rule_, mesh_) : sharding_from_factors(fs, df);
}

}  // namespace gspmd
