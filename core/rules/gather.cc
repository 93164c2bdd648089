// Gather(data[.., v, ..], indices[...]) -> data[:axis] + indices + data[axis+1:].
// Every dim is pass-through except v, which is a *reduction* factor: with v split, each device looks up only its
// range of v, masks the other rows to 0 and the result is unreduced (sum) — Megatron's vocab-parallel embedding.
#include <algorithm>

#include <fmt/format.h>

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

// ---- gradients ----
namespace {

/// Gather(data, indices, axis): dData[.., v, ..] = the sum of dy over the index positions that read row v. Written
/// as a one-hot matmul (what TPUs do for embeddings, and what GSPMD's vocab-parallel embedding partitions): dy's
/// index dims moved to the front and flattened to N, OneHot(indices) [N, V] transposed times dy [N, rest], then
/// moved back to data's layout. Negative indices count from the end, as OneHot reads them.
void gather_grad(GradContext& c) {
  if (!c.wants(0) || c.dy(0) < 0) return;
  const Value data = c.value(c.x(0));
  const Shape ds = data.shape;
  const Shape is = c.value(c.x(1)).shape;
  const int64_t r = static_cast<int64_t>(ds.size()), q = static_cast<int64_t>(is.size());
  const auto ax = norm_axis(c.node().i("axis", 0), static_cast<int>(r));
  if (!ax) throw InputError(fmt::format("--training: node '{}' (Gather): axis out of range", c.node().name));
  const int64_t a = *ax, V = ds[static_cast<size_t>(a)], N = num_elements(is);
  // dy: [pre (a dims), idx (q dims), post] -> [idx, pre, post]
  std::vector<int64_t> perm;
  for (int64_t k = 0; k < q; ++k) perm.push_back(a + k);
  for (int64_t k = 0; k < a; ++k) perm.push_back(k);
  for (int64_t k = a + q; k < r - 1 + q; ++k) perm.push_back(k);
  const int64_t rest = num_elements(ds) / std::max<int64_t>(1, V);
  const int dy2 = c.reshape(c.transpose(c.dy(0), perm), {N, rest});
  const int idx = c.reshape(c.x(1), {N});
  const int onehot = c.one_hot(idx, V, -1, data.dtype);
  const int d = c.op("MatMul", {c.transpose(onehot, {1, 0}), dy2});  // [V, rest]
  // [V, pre, post] -> data's [pre, V, post]
  Shape vpp{V};
  for (int64_t k = 0; k < r; ++k)
    if (k != a) vpp.push_back(ds[static_cast<size_t>(k)]);
  std::vector<int64_t> back;
  for (int64_t k = 1; k <= a; ++k) back.push_back(k);
  back.push_back(0);
  for (int64_t k = a + 1; k < r; ++k) back.push_back(k);
  c.set_dx(0, c.transpose(c.reshape(d, vpp), back));
}

}  // namespace

void register_gather_gradients() { add_builtin_gradient("Gather", gather_grad); }

}  // namespace gspmd::rules_internal
