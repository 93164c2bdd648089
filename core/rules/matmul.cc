// MatMul (numpy semantics) and Gemm: batch, m, n pass-through; k reduction.
#include "core/rules/rule.h"

namespace gspmd::rules_internal {
namespace {

std::optional<OpShardingRule> matmul_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || n.outputs.size() != 1 || n.inputs[0] < 0 || n.inputs[1] < 0) return std::nullopt;
  const Shape& sa = g.values.at(n.inputs[0]).shape;
  const Shape& sb = g.values.at(n.inputs[1]).shape;
  const Shape& so = g.values.at(n.outputs[0]).shape;
  if (sa.empty() || sb.empty()) return std::nullopt;
  const bool a1 = sa.size() == 1, b1 = sb.size() == 1;
  const int64_t k = sa.back();
  if ((b1 ? sb[0] : sb[sb.size() - 2]) != k) return std::nullopt;
  Shape ba(sa.begin(), sa.end() - (a1 ? 1 : 2)), bb(sb.begin(), sb.end() - (b1 ? 1 : 2));
  const size_t nb = std::max(ba.size(), bb.size());
  if (so.size() != nb + (a1 ? 0 : 1) + (b1 ? 0 : 1)) return std::nullopt;
  Shape bo(so.begin(), so.begin() + nb);
  OpShardingRule r;
  std::vector<int> bf(nb);
  for (size_t d = 0; d < nb; ++d) bf[d] = add_factor(r, bo[d], FactorKind::kPassThrough);
  int fm = a1 ? -1 : add_factor(r, sa[sa.size() - 2], FactorKind::kPassThrough);
  int fn = b1 ? -1 : add_factor(r, sb.back(), FactorKind::kPassThrough);
  int fk = add_factor(r, k, FactorKind::kReduction);
  DimFactors da = broadcast_dims(ba, bo, bf), db = broadcast_dims(bb, bo, bf), dout(bo.size());
  for (size_t d = 0; d < nb; ++d) dout[d] = {bf[d]};
  if (!a1) da.push_back({fm});
  da.push_back({fk});
  db.push_back({fk});
  if (!b1) db.push_back({fn});
  if (!a1) dout.push_back({fm});
  if (!b1) dout.push_back({fn});
  r.operands = {da, db};
  r.results = {dout};
  r.reduction = ReductionKind::kSum;
  r.linear_operands = {true, true};
  return r;
}

std::optional<OpShardingRule> gemm_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || n.outputs.size() != 1 || n.inputs[0] < 0 || n.inputs[1] < 0) return std::nullopt;
  const Shape& sa = g.values.at(n.inputs[0]).shape;
  const Shape& sb = g.values.at(n.inputs[1]).shape;
  if (sa.size() != 2 || sb.size() != 2) return std::nullopt;
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const int64_t m = ta ? sa[1] : sa[0], k = ta ? sa[0] : sa[1];
  const int64_t n_ = tb ? sb[0] : sb[1], kb = tb ? sb[1] : sb[0];
  if (k != kb) return std::nullopt;
  OpShardingRule r;
  int fm = add_factor(r, m, FactorKind::kPassThrough);
  int fn = add_factor(r, n_, FactorKind::kPassThrough);
  int fk = add_factor(r, k, FactorKind::kReduction);
  DimFactors da = ta ? DimFactors{{fk}, {fm}} : DimFactors{{fm}, {fk}};
  DimFactors db = tb ? DimFactors{{fn}, {fk}} : DimFactors{{fk}, {fn}};
  r.operands = {da, db};
  const bool has_c = n.inputs.size() > 2 && n.inputs[2] >= 0;
  if (n.inputs.size() > 2) {
    if (has_c) {
      const Shape& sc = g.values.at(n.inputs[2]).shape;
      if (sc.size() > 2) return std::nullopt;
      r.operands.push_back(broadcast_dims(sc, Shape{m, n_}, {fm, fn}));
    } else {
      r.operands.push_back({});
    }
  }
  r.results = {{{fm}, {fn}}};
  r.reduction = ReductionKind::kSum;
  // alpha*A*B is linear in A and in B; with a bias C the op is only affine, so nothing is linear then.
  r.linear_operands.assign(n.inputs.size(), false);
  if (!has_c) r.linear_operands[0] = r.linear_operands[1] = true;
  return r;
}

}  // namespace

void register_matmul_rules() {
  add_builtin("MatMul", matmul_rule);
  add_builtin("Gemm", gemm_rule);
}

}  // namespace gspmd::rules_internal
