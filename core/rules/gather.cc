// Gather(data[.., v, ..], indices[...]) -> data[:axis] + indices + data[axis+1:].
// Every dim is pass-through except v, which is a *reduction* factor: with v split, each device looks up only its
// range of v, masks the other rows to 0 and the result is unreduced (sum) — Megatron's vocab-parallel embedding.
#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

RuleResult gather_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects inputs data and indices and one output");
  RuleMaker m(g, n);
  const Shape& data = m.in(0);
  const Shape& idx = m.in(1);
  const int rd = static_cast<int>(data.size()), ri = static_cast<int>(idx.size());
  const auto axis = norm_axis(n.i("axis", 0), rd);
  if (!axis) return reject("axis {} out of range for rank {}", n.i("axis", 0), rd);
  if (static_cast<int>(m.out(0).size()) != rd - 1 + ri)
    return reject("result rank {} is not data rank {} - 1 + indices rank {}", m.out(0).size(), rd, ri);
  DimFactors dd(rd), di(ri), dout;
  for (int d = 0; d < *axis; ++d) {
    dd[d] = {m.factor(data[d], FactorKind::kPassThrough)};
    dout.push_back(dd[d]);
  }
  dd[*axis] = {m.factor(data[*axis], FactorKind::kReduction)};
  for (int d = 0; d < ri; ++d) {
    di[d] = {m.factor(idx[d], FactorKind::kPassThrough)};
    dout.push_back(di[d]);
  }
  for (int d = *axis + 1; d < rd; ++d) {
    dd[d] = {m.factor(data[d], FactorKind::kPassThrough)};
    dout.push_back(dd[d]);
  }
  m.operand(0, dd).operand(1, di).result(0, dout).reduction(ReductionKind::kSum).linear(0);
  return m.build();
}

}  // namespace

void register_gather_rules() { add_builtin("Gather", gather_rule); }

void register_gather_gradients() {}

}  // namespace gspmd::rules_internal
