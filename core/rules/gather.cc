// Gather(data[.., v, ..], indices[...]) -> data[:axis] + indices + data[axis+1:].
// Every dim is pass-through except v, which is a *reduction* factor: with v split, each device looks up only its
// range of v, masks the other rows to 0 and the result is unreduced (sum) — Megatron's vocab-parallel embedding.
#include "core/rules/rule.h"

namespace gspmd::rules_internal {
namespace {

std::optional<OpShardingRule> gather_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || n.inputs[0] < 0 || n.inputs[1] < 0 || n.outputs.size() != 1 || n.outputs[0] < 0)
    return std::nullopt;
  const Shape& data = g.values.at(n.inputs[0]).shape;
  const Shape& idx = g.values.at(n.inputs[1]).shape;
  const Shape& out = g.values.at(n.outputs[0]).shape;
  const int rd = static_cast<int>(data.size()), ri = static_cast<int>(idx.size());
  auto axis = norm_axis(n.i("axis", 0), rd);
  if (!axis || static_cast<int>(out.size()) != rd - 1 + ri) return std::nullopt;
  OpShardingRule r;
  DimFactors dd(rd), di(ri), dout;
  for (int d = 0; d < *axis; ++d) {
    dd[d] = {add_factor(r, data[d], FactorKind::kPassThrough)};
    dout.push_back(dd[d]);
  }
  dd[*axis] = {add_factor(r, data[*axis], FactorKind::kReduction)};
  for (int d = 0; d < ri; ++d) {
    di[d] = {add_factor(r, idx[d], FactorKind::kPassThrough)};
    dout.push_back(di[d]);
  }
  for (int d = *axis + 1; d < rd; ++d) {
    dd[d] = {add_factor(r, data[d], FactorKind::kPassThrough)};
    dout.push_back(dd[d]);
  }
  r.operands = {dd, di};
  r.results = {dout};
  r.reduction = ReductionKind::kSum;
  r.linear_operands = {true, false};
  return r;
}

}  // namespace

void register_gather_rules() { add_builtin("Gather", gather_rule); }

}  // namespace gspmd::rules_internal
