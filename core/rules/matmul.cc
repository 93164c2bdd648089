// MatMul (numpy semantics) and Gemm: batch, m, n pass-through; k reduction.
#include <algorithm>

#include "core/rules/gradient.h"
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

// ---- gradients ----
namespace {

/// The last two dims of a rank-r tensor swapped (a matrix transpose of each batch entry).
std::vector<int64_t> swap_last(size_t r) {
  std::vector<int64_t> p;
  for (size_t d = 0; d < r; ++d) p.push_back(static_cast<int64_t>(d));
  std::swap(p[r - 2], p[r - 1]);
  return p;
}

/// MatMul's two gradients as one Einsum each when the operands are matrices or batches of them whose batch dims are
/// the result's trailing batch dims, unstretched (the usual X[..., K] x W[K, N] and batched attention products):
/// dA = einsum(dY, B) and dB = einsum(A, dY) contract and sum the batch dims in one node, with no transposed copies
/// (as XLA's dot gradients: a dot_general with the contracting and batch dims named). False when they are not such.
bool matmul_grad_as_einsum(GradContext& c) {
  const Shape a = c.value(c.x(0)).shape, b = c.value(c.x(1)).shape, y = c.value(c.y(0)).shape;
  if (c.opset() < 12 || a.size() < 2 || b.size() < 2 || y.size() > 10) return false;
  const size_t batch = y.size() - 2;  // y = [batch..., M, N]
  auto fits = [&](const Shape& s) {   // s's batch dims are y's last ones, unstretched
    for (size_t d = 0; d + 2 < s.size(); ++d)
      if (s[d] != y[batch - (s.size() - 2) + d]) return false;
    return true;
  };
  if (!fits(a) || !fits(b)) return false;
  const std::string labels = "abcdefgh";  // batch labels; m, k, n are the matrix dims
  auto term = [&](size_t rank, const char* last2) { return labels.substr(batch - (rank - 2), rank - 2) + last2; };
  const std::string ta = term(a.size(), "mk"), tb = term(b.size(), "kn"), ty = term(y.size(), "mn");
  if (c.wants(0)) c.set_dx(0, c.op("Einsum", {c.dy(0), c.x(1)}, {{"equation", ty + "," + tb + "->" + ta}}));
  if (c.wants(1)) c.set_dx(1, c.op("Einsum", {c.x(0), c.dy(0)}, {{"equation", ta + "," + ty + "->" + tb}}));
  return true;
}

/// MatMul (numpy matmul semantics, onnx MatMul): Y = A B. dA = dY B^T, dB = A^T dY, each summed over the batch dims
/// that broadcasting added. 1-D operands are promoted to matrices first (a row for A, a column for B).
void matmul_grad(GradContext& c) {
  const int dy = c.dy(0);
  if (dy < 0 || matmul_grad_as_einsum(c)) return;
  const Shape a = c.value(c.x(0)).shape, b = c.value(c.x(1)).shape, y = c.value(c.y(0)).shape;
  int A = c.x(0), B = c.x(1), dY = dy;
  Shape a2 = a, b2 = b, y2 = y;
  if (a.size() == 1) {
    a2 = {1, a[0]};
    y2.insert(y2.end() - (b.size() == 1 ? 0 : 1), 1);
    A = c.reshape(A, a2);
  }
  if (b.size() == 1) {
    b2 = {b[0], 1};
    y2.push_back(1);
    B = c.reshape(B, b2);
  }
  dY = c.reshape(dY, y2);
  if (c.wants(0)) {
    const int d = c.op("MatMul", {dY, c.transpose(B, swap_last(b2.size()))});
    c.set_dx(0, c.reshape(c.sum_to(d, a2), a));
  }
  if (c.wants(1)) {
    const int d = c.op("MatMul", {c.transpose(A, swap_last(a2.size())), dY});
    c.set_dx(1, c.reshape(c.sum_to(d, b2), b));
  }
}

/// Gemm: Y = alpha op(A) op(B) + beta C (op = transpose when transA / transB).
void gemm_grad(GradContext& c) {
  const int dy = c.dy(0);
  if (dy < 0) return;
  const Node& n = c.node();
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const double alpha = n.f("alpha", 1.f), beta = n.f("beta", 1.f);
  const DType dt = c.value(c.y(0)).dtype;
  const int dY = alpha == 1.0 ? dy : c.op("Mul", {dy, c.scalar(alpha, dt)});
  const std::vector<int64_t> t{1, 0};
  if (c.wants(0)) {  // dA = dY op(B)^T, transposed back when transA
    const int d = ta ? c.op("MatMul", {tb ? c.transpose(c.x(1), t) : c.x(1), c.transpose(dY, t)})
                     : c.op("MatMul", {dY, tb ? c.x(1) : c.transpose(c.x(1), t)});
    c.set_dx(0, d);
  }
  if (c.wants(1)) {  // dB = op(A)^T dY, transposed back when transB
    const int d = tb ? c.op("MatMul", {c.transpose(dY, t), ta ? c.transpose(c.x(0), t) : c.x(0)})
                     : c.op("MatMul", {ta ? c.x(0) : c.transpose(c.x(0), t), dY});
    c.set_dx(1, d);
  }
  if (c.wants(2)) {
    const int d = beta == 1.0 ? dy : c.op("Mul", {dy, c.scalar(beta, dt)});
    c.set_dx(2, c.sum_to(d, c.value(c.x(2)).shape));
  }
}

}  // namespace

void register_matmul_gradients() {
  add_builtin_gradient("MatMul", matmul_grad);
  add_builtin_gradient("Gemm", gemm_grad);
}

}  // namespace gspmd::rules_internal
