// core/rules: the shardings of one node's operands and results seen through its factor rule (Shardy's
// ShardingProjection, shardy/dialect/sdy/transforms/propagation/sharding_projection.h): each tensor's sharding
// projected onto the rule's factors, and the merge of those projections into one factor sharding. Propagation
// (core/propagation) and the partitioner (core/partition) both merge through this class, each with its own conflict
// policy; neither walks factor shardings itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/rules/rule.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// Projections of the tensors of one node onto the factors of its rule.
///
/// Example: MatMul ([i,k],[k,j])->([i,j]) on a {x=2, y=2} mesh, A = [{x},{y}] and B = [{},{}]: A projects to
/// {i: x, k: y}, B to nothing; merged, i = x and k = y, so the result is [{x},{}] unreduced over y.
///
/// A dim indexing several factors (a reshape's merged dim, f1 x f2 major to minor) gives its axes to f1 while their
/// product divides f1's size, then to f2 (project_to_factors); a split that no factor boundary matches (e.g. [6]
/// = (2 x 3) over an axis of 4) is not expressible: that dim projects to nothing and the tensor is not exact().
/// A dim with one factor projects any split, uneven ones too.
class FactorProjection {
 public:
  /// `rule` and `mesh` must outlive the projection; `expected`: how many tensors will be added (capacity).
  FactorProjection(const OpShardingRule& rule, const DeviceMesh& mesh, size_t expected = 0)
      : rule_(&rule), mesh_(mesh) {
    tensors_.reserve(expected);
  }

  /// Forgets the tensors added so far and starts over with `rule` (which must outlive the projection), on the same
  /// mesh, keeping the memory: for a caller that projects one node after another (propagation).
  void reset(const OpShardingRule& rule) {
    rule_ = &rule;
    count_ = 0;
  }

  /// Projects `s`, the sharding of a tensor whose dims index the factors `df` (one of rule.operands / rule.results,
  /// which must outlive the projection), and keeps it. A tensor with no dims of factors (df empty: absent or scalar) or
  /// whose rank differs from df's projects to nothing. `weight` ranks it for merge_largest_first (its element count
  /// there). Returns the tensor's index: 0, 1, ... in order of addition. O(rank * mesh rank).
  int add(const TensorSharding& s, const DimFactors& df, int64_t weight = 0);

  int size() const { return static_cast<int>(count_); }
  /// Tensor t's axes per factor (rule.num_factors() entries; empty for a factor t leaves unsplit or does not index).
  const FactorSharding& factors(int t) const { return tensors_.at(static_cast<size_t>(t)).factors; }
  /// The dims of factors tensor t was added with.
  const DimFactors& dims(int t) const { return *tensors_.at(static_cast<size_t>(t)).df; }
  /// False when some split dim of tensor t could not be expressed on its factors (and was left out).
  bool exact(int t) const { return tensors_.at(static_cast<size_t>(t)).exact; }
  /// Whether tensor t indexes factor f.
  bool indexes(int t, int f) const;

  /// The axes every tensor of `tensors` that indexes factor f puts on it, when at least one indexes it and all put
  /// the same non-empty axes; nullopt otherwise. (The partitioner reduces after a reduction factor that every operand
  /// splits alike, rather than moving the operands.)
  std::optional<std::vector<int>> agreed(int f, const std::vector<int>& tensors) const;

  /// Conflict policy "first come, whole factor" (the partitioner's choice of a local computation): the tensors of
  /// `order` are visited in turn; within a tensor, factors in id order. A factor not yet assigned in `merged` takes
  /// all the axes the tensor puts on it, provided none of them is marked in `used` (one entry per mesh axis); the
  /// axes taken are then marked. A factor is never extended once assigned, and a conflicting offer is dropped whole.
  /// `merged` must have rule.num_factors() entries (assignments made beforehand are kept).
  void merge_first_come(const std::vector<int>& order, FactorSharding& merged, std::vector<char>& used) const;

  /// The result of merge_largest_first.
  struct Merged {
    FactorSharding factors;   // per factor: the merged axes
    std::vector<int> source;  // per factor: the tensor that gave it its first axis, or -1
    bool any = false;         // some axis was assigned
  };
  /// Conflict policy "largest tensor first, extend a prefix" (propagation's): tensors are visited by decreasing
  /// weight, ties in order of addition; within a tensor, dims in order and the factors of a dim major to minor.
  /// A factor f of tensor t is considered only if accept(t, f). Its axes are taken one by one, after those already
  /// assigned, when the assignment so far is empty or a strict prefix of them (a tensor that disagrees with an
  /// earlier, larger one gives nothing to that factor); an axis that another factor owns stops the factor there.
  /// Every mesh axis goes to at most one factor. Axes are not capped at the factor's size (an uneven split stays a
  /// split). O(tensors * rank * mesh rank).
  /// `accept`: bool(int t, int f).
  template <class Accept>
  Merged merge_largest_first(const Accept& accept) const;

  /// The tensor sharding that factor shardings `fs` give dims `df`: each dim gets the axes of its factors, major
  /// factor first (sharding_from_factors). With `expressible_only`, a merged dim keeps only what it can really
  /// express: factors whose axes divide their size, up to and including the first one split only partly.
  TensorSharding tensor_sharding(const FactorSharding& fs, const DimFactors& df, bool expressible_only = false) const;

 private:
  struct Projected {
    const DimFactors* df;
    FactorSharding factors;
    bool exact = true;
    int64_t weight = 0;
  };
  /// Tensor indices by decreasing weight, ties in order of addition.
  std::vector<int> largest_first() const;
  /// merge_largest_first's step for factor f of tensor t: extend m's assignment by the tensor's axes.
  void extend(int t, int f, std::vector<int>& owner, Merged& m) const;

  const OpShardingRule* rule_;
  const DeviceMesh& mesh_;
  std::vector<Projected> tensors_;  // the first count_ are the tensors added (the rest: memory kept by reset)
  size_t count_ = 0;
};

template <class Accept>
FactorProjection::Merged FactorProjection::merge_largest_first(const Accept& accept) const {
  const auto nf = static_cast<size_t>(rule_->num_factors());
  Merged m{FactorSharding(nf), std::vector<int>(nf, -1), false};
  std::vector<int> owner(static_cast<size_t>(mesh_.rank()), -1);
  for (int t : largest_first())
    for (const std::vector<int>& dim : dims(t))
      for (int f : dim)
        if (!factors(t)[static_cast<size_t>(f)].empty() && accept(t, f)) extend(t, f, owner, m);
  return m;
}

}  // namespace gspmd
