// MatMul (numpy semantics) and Gemm: batch, m, n pass-through; k reduction.
#include <algorithm>

#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

RuleResult matmul_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || n.outputs.size() != 1 || !present(n, 0) || !present(n, 1) || !present(n, 0, true))
    return reject("expects inputs A and B and one output");
  RuleMaker m(g, n);
  const Shape& sa = m.in(0);
  const Shape& sb = m.in(1);
  const Shape& so = m.out(0);
  if (sa.empty() || sb.empty()) return reject("a scalar operand");
  const bool a1 = sa.size() == 1, b1 = sb.size() == 1;
  const int64_t k = sa.back(), kb = b1 ? sb[0] : sb[sb.size() - 2];
  if (kb != k) return reject("contracting dims differ: A has {}, B {}", k, kb);
  Shape ba(sa.begin(), sa.end() - (a1 ? 1 : 2)), bb(sb.begin(), sb.end() - (b1 ? 1 : 2));
  const size_t nb = std::max(ba.size(), bb.size());
  if (so.size() != nb + (a1 ? 0 : 1) + (b1 ? 0 : 1))
    return reject("result rank {} does not follow from A {} and B {}", so.size(), shape_str(sa), shape_str(sb));
  Shape bo(so.begin(), so.begin() + static_cast<std::ptrdiff_t>(nb));
  const std::vector<int> bf = m.factors(bo, FactorKind::kPassThrough);
  const int fm = a1 ? -1 : m.factor(sa[sa.size() - 2], FactorKind::kPassThrough);
  const int fn = b1 ? -1 : m.factor(sb.back(), FactorKind::kPassThrough);
  const int fk = m.factor(k, FactorKind::kReduction);
  DimFactors da = broadcast_dims(ba, bo, bf), db = broadcast_dims(bb, bo, bf), dout = one_factor_each(bf);
  if (!a1) da.push_back({fm});
  da.push_back({fk});
  db.push_back({fk});
  if (!b1) db.push_back({fn});
  if (!a1) dout.push_back({fm});
  if (!b1) dout.push_back({fn});
  m.operand(0, da).operand(1, db).result(0, dout).reduction(ReductionKind::kSum).all_linear();
  return m.build();
}

RuleResult gemm_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || n.outputs.size() != 1 || !present(n, 0) || !present(n, 1))
    return reject("expects inputs A and B and one output");
  RuleMaker m(g, n);
  const Shape& sa = m.in(0);
  const Shape& sb = m.in(1);
  if (sa.size() != 2 || sb.size() != 2)
    return reject("A {} and B {} are not both matrices", shape_str(sa), shape_str(sb));
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const int64_t M = ta ? sa[1] : sa[0], k = ta ? sa[0] : sa[1];
  const int64_t N = tb ? sb[0] : sb[1], kb = tb ? sb[1] : sb[0];
  if (k != kb) return reject("contracting dims differ: A has {}, B {}", k, kb);
  const int fm = m.factor(M, FactorKind::kPassThrough);
  const int fn = m.factor(N, FactorKind::kPassThrough);
  const int fk = m.factor(k, FactorKind::kReduction);
  m.operand(0, ta ? DimFactors{{fk}, {fm}} : DimFactors{{fm}, {fk}});
  m.operand(1, tb ? DimFactors{{fn}, {fk}} : DimFactors{{fk}, {fn}});
  const bool has_c = present(n, 2);
  if (has_c) {
    const Shape& sc = m.in(2);
    if (sc.size() > 2) return reject("C {} has more than 2 dims", shape_str(sc));
    m.operand(2, broadcast_dims(sc, Shape{M, N}, {fm, fn}));
    if (!sc.empty()) m.bias(2);
  }
  m.factorless_operands(3).result(0, {{fm}, {fn}}).reduction(ReductionKind::kSum);
  // alpha*A*B is linear in A and in B; with a bias C the op is only affine, so nothing is linear then.
  if (!has_c) m.linear(0).linear(1);
  return m.build();
}

}  // namespace

void register_matmul_rules() {
  add_builtin("MatMul", matmul_rule);
  add_builtin("Gemm", gemm_rule);
}

}  // namespace gspmd::rules_internal
