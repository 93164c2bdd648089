#include "core/rules/rule_maker.h"

namespace gspmd {

DimFactors one_factor_each(const std::vector<int>& ids) {
  DimFactors df(ids.size());
  for (size_t d = 0; d < ids.size(); ++d)
    if (ids[d] >= 0) df[d] = {ids[d]};
  return df;
}

RuleMaker::RuleMaker(const Graph& g, const Node& node)
    : g_(g), node_(node), operand_set_(node.inputs.size(), 0), result_set_(node.outputs.size(), 0) {
  rule_.operands.resize(node.inputs.size());
  rule_.results.resize(node.outputs.size());
}

const Shape& RuleMaker::in(size_t i) const {
  if (!has_input(i)) throw RuleError(fmt::format("operand {} is absent", i));
  return g_.values.at(node_.inputs[i]).shape;
}

const Shape& RuleMaker::out(size_t i) const {
  if (!has_output(i)) throw RuleError(fmt::format("result {} is absent", i));
  return g_.values.at(node_.outputs[i]).shape;
}

int RuleMaker::factor(int64_t size, FactorKind kind) {
  if (size < 0) throw RuleError(fmt::format("factor of size {}", size));
  rule_.factor_sizes.push_back(size);
  rule_.factor_kinds.push_back(kind);
  return rule_.num_factors() - 1;
}

std::vector<int> RuleMaker::factors(const Shape& shape, const std::function<FactorKind(int d)>& kind) {
  std::vector<int> ids(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) ids[d] = factor(shape[d], kind(static_cast<int>(d)));
  return ids;
}

std::vector<int> RuleMaker::factors(const Shape& shape, FactorKind kind) {
  return factors(shape, [kind](int) { return kind; });
}

void RuleMaker::set(bool result, size_t i, DimFactors df) {
  const size_t n = result ? node_.outputs.size() : node_.inputs.size();
  const char* what = result ? "result" : "operand";
  if (i >= n) throw RuleError(fmt::format("{} {} set, but the node has {} {}s", what, i, n, what));
  std::vector<char>& done = result ? result_set_ : operand_set_;
  if (done[i]) throw RuleError(fmt::format("{} {} set twice", what, i));
  if (!(result ? has_output(i) : has_input(i))) throw RuleError(fmt::format("{} {} set, but it is absent", what, i));
  (result ? rule_.results : rule_.operands)[i] = std::move(df);
  done[i] = 1;
  rules_internal::check_tensor_dims(g_, node_, rule_, result, i);
}

RuleMaker& RuleMaker::operand(size_t i, DimFactors df) {
  set(false, i, std::move(df));
  return *this;
}

RuleMaker& RuleMaker::result(size_t i, DimFactors df) {
  set(true, i, std::move(df));
  return *this;
}

RuleMaker& RuleMaker::factorless_operands(size_t first) {
  for (size_t i = first; i < node_.inputs.size(); ++i)
    if (has_input(i) && !operand_set_[i]) set(false, i, DimFactors(in(i).size()));
  return *this;
}

RuleMaker& RuleMaker::linear(size_t i, bool is_linear) {
  if (i >= node_.inputs.size())
    throw RuleError(fmt::format("operand {} marked linear, but the node has {} inputs", i, node_.inputs.size()));
  rule_.linear_operands.resize(node_.inputs.size(), false);
  rule_.linear_operands[i] = is_linear;
  return *this;
}

RuleMaker& RuleMaker::all_linear() {
  rule_.linear_operands.assign(node_.inputs.size(), true);
  return *this;
}

RuleMaker& RuleMaker::reduction(ReductionKind k) {
  rule_.reduction = k;
  return *this;
}

RuleMaker& RuleMaker::mean(bool is_mean) {
  rule_.mean = is_mean;
  return *this;
}

RuleMaker& RuleMaker::additive() {
  rule_.additive = true;
  return *this;
}

RuleMaker& RuleMaker::bias(size_t i) {
  if (!has_input(i)) throw RuleError(fmt::format("bias operand {} is not a present input", i));
  rule_.bias_operands.push_back(static_cast<int>(i));
  return *this;
}

RuleMaker& RuleMaker::shape_operand(size_t i) {
  if (!has_input(i)) throw RuleError(fmt::format("shape operand {} is not a present input", i));
  rule_.shape_operand = static_cast<int>(i);
  return *this;
}

RuleMaker& RuleMaker::group_factor(int f) {
  if (f < 0 || f >= rule_.num_factors())
    throw RuleError(fmt::format("group factor {} out of range (the rule has {} factors)", f, rule_.num_factors()));
  rule_.group_factor = f;
  return *this;
}

OpShardingRule RuleMaker::build() {
  for (size_t i = 0; i < node_.inputs.size(); ++i)
    if (has_input(i) && !operand_set_[i]) throw RuleError(fmt::format("operand {} has no dims of factors", i));
  for (size_t i = 0; i < node_.outputs.size(); ++i)
    if (has_output(i) && !result_set_[i]) throw RuleError(fmt::format("result {} has no dims of factors", i));
  rule_.linear_operands.resize(node_.inputs.size(), false);
  check(g_, node_, rule_);
  return std::move(rule_);
}

}  // namespace gspmd
