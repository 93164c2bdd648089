// core/rules: RuleMaker, the checked way to build an OpShardingRule (Shardy's OpShardingRuleBuilder, in our terms):
// add factors with their size and kind, then name the factors of every dim of every operand and result. Each step
// is checked against the node as it is taken, so a builder that gets a dim, an arity or a factor id wrong fails at
// the line that did it (a RuleError: get_rule reports it as RuleResult::kBuilderError, a bug) instead of producing a
// rule that silently falls back to replication. What the *model* makes impossible (contracting dims that differ, a
// diagonal Einsum) is not a bug: the builder returns reject("...") (NotExpressible) before building.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/rules/rule.h"

namespace gspmd {

/// NotExpressible with a formatted reason: `return reject("contracting dims differ: {} vs {}", k, kb);`.
template <class... Args>
NotExpressible reject(fmt::format_string<Args...> f, Args&&... args) {
  return NotExpressible{fmt::format(f, std::forward<Args>(args)...)};
}

/// {{ids[0]}, {ids[1]}, ...}: one factor per dim; a negative id gives a dim without factor.
DimFactors one_factor_each(const std::vector<int>& ids);

/// Builds the rule of one node. Usage (MatMul [m,k] x [k,n] -> [m,n]):
///   RuleMaker m(g, n);
///   int fm = m.factor(M, kPassThrough), fn = m.factor(N, kPassThrough), fk = m.factor(K, kReduction);
///   m.operand(0, {{fm}, {fk}}).operand(1, {{fk}, {fn}}).result(0, {{fm}, {fn}}).all_linear();
///   return m.build();
/// Every method throws RuleError on misuse; the checks are check()'s (core/rules/rule.h), applied per step.
class RuleMaker {
 public:
  /// `g` and `node` must outlive the maker.
  RuleMaker(const Graph& g, const Node& node);

  const Node& node() const { return node_; }
  /// Whether input (output) i exists and is not an omitted optional (-1).
  bool has_input(size_t i) const { return i < node_.inputs.size() && node_.inputs[i] >= 0; }
  bool has_output(size_t i) const { return i < node_.outputs.size() && node_.outputs[i] >= 0; }
  /// Shape of input (output) i. RuleError when it is absent.
  const Shape& in(size_t i) const;
  const Shape& out(size_t i) const;

  /// Adds a factor of `size` (>= 0) and `kind`; returns its id (0, 1, ... in order of addition).
  int factor(int64_t size, FactorKind kind);
  /// One new factor per dim of `shape`, of kind `kind(d)` (or `kind`); returns their ids in dim order.
  std::vector<int> factors(const Shape& shape, const std::function<FactorKind(int d)>& kind);
  std::vector<int> factors(const Shape& shape, FactorKind kind);

  /// Sets operand i's dims of factors: one entry per dim of its shape, major to minor within a dim. RuleError when i
  /// is not an input, the input is absent, its dims were set before, or they do not fit (check()'s rules: ranks,
  /// factor ids, a factor at most once per tensor, dim sizes).
  RuleMaker& operand(size_t i, DimFactors df);
  /// Likewise for result i.
  RuleMaker& result(size_t i, DimFactors df);
  /// Every present operand from `first` on whose dims were not set gets dims without factors (kept replicated: shape
  /// operands, scalars, parameters an op reads whole).
  RuleMaker& factorless_operands(size_t first = 0);
  /// The result is linear in operand i (OpShardingRule::linear_operands); all_linear: in every operand.
  RuleMaker& linear(size_t i, bool is_linear = true);
  RuleMaker& all_linear();
  /// How partial results combine when a reduction factor is split (default sum), and whether the result is a mean.
  RuleMaker& reduction(ReductionKind k);
  RuleMaker& mean(bool is_mean = true);
  /// OpShardingRule::additive (the result is jointly linear in all operands: Add, Sub, Sum, Concat).
  RuleMaker& additive();
  /// OpShardingRule::bias_operands: operand i is added to the result (Gemm's C, Conv's B). RuleError when i is not a
  /// present input.
  RuleMaker& bias(size_t i);
  /// OpShardingRule::shape_operand: operand i holds the result's shape (Reshape, Expand); it gets no factors.
  /// RuleError when i is not a present input.
  RuleMaker& shape_operand(size_t i);
  /// OpShardingRule::group_factor: factor f counts a grouped convolution's groups. RuleError when f is not a factor.
  RuleMaker& group_factor(int f);

  /// The rule, after check(). RuleError when a present operand or result has no dims set (absent ones get none).
  OpShardingRule build();

 private:
  void set(bool result, size_t i, DimFactors df);

  const Graph& g_;
  const Node& node_;
  OpShardingRule rule_;
  std::vector<char> operand_set_, result_set_;
};

}  // namespace gspmd
