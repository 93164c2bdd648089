// Data movement and indexing ops with one rule each:
//   Pad: padded (or cropped) dims kPermutation, the others pass-through; unknown pads: every dim permutation.
//   Tile: dims with repeats > 1 (output dim != input dim) kPermutation, the others pass-through.
//   Resize: dims whose scale is exactly 1 (same size; not tf_crop_and_resize) pass-through, the others
//     kNeedReplication (an output element reads a neighbourhood at a fractional position: no halo support);
//     `sizes` is a shape operand (the local op gets the local sizes).
//   Range: no tensor operands, the result dim pass-through (the partitioner must offset the local range:
//     start + delta * partition offset).
//   TopK, CumSum: the axis needs replication, other dims pass-through.
//   GatherElements: dims other than `axis` pass-through where data and indices agree in size (else need
//     replication); the data's axis needs replication, the indices'/output's axis is pass-through.
//   GatherND: batch dims and the indices' leading dims pass-through; the indexed data dims and the index-tuple dim
//     need replication; the trailing (sliced) data dims pass-through.
//   ScatterElements/ScatterND: the written data dims and every dim of indices/updates that enumerates updates need
//     replication (a split would write only some updates per device); ScatterElements' other dims and ScatterND's
//     trailing slice dims are pass-through.
//   OneHot: the indices' dims pass-through, the new depth dim needs replication (its values depend on the offset).
//   NonZero: everything needs replication (data-dependent output). Compress: the axis needs replication (or all
//     dims, without an axis); the condition is kept whole.
#include <algorithm>

#include <fmt/format.h>

#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

// Input 0 and output 0 present, exactly one output.
std::optional<NotExpressible> unary_arity(const Node& n) {
  if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return reject("expects input 0 and one output");
  return std::nullopt;
}

// Operand 0 = `dx`, operands 1.. factorless, result 0 = `dy`, linear in operand 0 if `linear`.
RuleResult unary(RuleMaker& m, DimFactors dx, DimFactors dy, bool linear) {
  m.operand(0, std::move(dx)).factorless_operands(1).result(0, std::move(dy)).linear(0, linear);
  return m.build();
}

std::optional<std::vector<double>> const_floats(const Graph& g, const Node& n, int i) {
  const Tensor* t = constant_input(g, n, i);
  if (!t) return std::nullopt;
  std::vector<double> v(t->numel());
  switch (t->dtype) {
    case DType::kFloat32:
      for (size_t k = 0; k < v.size(); ++k) v[k] = t->data<float>()[k];
      return v;
    case DType::kFloat64:
      for (size_t k = 0; k < v.size(); ++k) v[k] = t->data<double>()[k];
      return v;
    default: return std::nullopt;
  }
}

// Pad's dims that move data (padded or cropped); every dim when the pads are not constant. Nullopt for a bad axis.
std::optional<std::vector<char>> pad_moved_dims(const Graph& g, const Node& n, int rk) {
  std::vector<char> moved(rk, 1);  // unknown pads: every dim may be shifted
  std::optional<std::vector<int64_t>> pads;
  if (present(n, 1)) {
    if (const Tensor* t = constant_input(g, n, 1)) pads = t->as_int64s();
  } else if (n.inputs.size() < 2 && n.has("pads")) {
    pads = n.ints("pads");
  }
  std::optional<std::vector<int64_t>> axes;
  if (present(n, 3)) {
    if (const Tensor* t = constant_input(g, n, 3)) axes = t->as_int64s();
  } else {
    std::vector<int64_t> all(rk);
    for (int d = 0; d < rk; ++d) all[d] = d;
    axes = all;
  }
  if (!pads || !axes || pads->size() != 2 * axes->size()) return moved;
  std::fill(moved.begin(), moved.end(), 0);
  const size_t na = axes->size();
  for (size_t i = 0; i < na; ++i) {
    auto d = norm_axis((*axes)[i], rk);
    if (!d) return std::nullopt;
    if ((*pads)[i] != 0 || (*pads)[i + na] != 0) moved[*d] = 1;
  }
  return moved;
}

RuleResult pad_rule(const Graph& g, const Node& n) {
  if (auto e = unary_arity(n)) return *e;
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& y = m.out(0);
  const int rk = static_cast<int>(x.size());
  if (static_cast<int>(y.size()) != rk) return reject("result rank {} differs from the input's {}", y.size(), rk);
  const std::optional<std::vector<char>> moved = pad_moved_dims(g, n, rk);
  if (!moved) return reject("an axis is out of range for rank {}", rk);
  for (int d = 0; d < rk; ++d)
    if (!(*moved)[d] && x[d] != y[d]) return reject("dim {} is not padded but changes size ({} -> {})", d, x[d], y[d]);
  const DimFactors dx = one_factor_each(
      m.factors(x, [&](int d) { return (*moved)[d] ? FactorKind::kPermutation : FactorKind::kPassThrough; }));
  // Linear in the data unless a non-zero constant is padded in.
  bool linear = true;
  if (n.s("mode", "constant") == "constant") {
    if (present(n, 2)) {
      auto c = const_floats(g, n, 2);
      linear = c && std::all_of(c->begin(), c->end(), [](double v) { return v == 0; });
    } else if (n.f("value", 0.f) != 0.f) {
      linear = false;
    }
  }
  return unary(m, dx, dx, linear);
}

RuleResult tile_rule(const Graph& g, const Node& n) {
  if (auto e = unary_arity(n)) return *e;
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& y = m.out(0);
  if (x.size() != y.size()) return reject("result rank {} differs from the input's {}", y.size(), x.size());
  // The output shape says the repeats: y = x * repeats.
  const DimFactors dx = one_factor_each(
      m.factors(x, [&](int d) { return x[d] == y[d] ? FactorKind::kPassThrough : FactorKind::kPermutation; }));
  return unary(m, dx, dx, true);
}

RuleResult resize_rule(const Graph& g, const Node& n) {
  if (auto e = unary_arity(n)) return *e;
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& y = m.out(0);
  const int rk = static_cast<int>(x.size());
  if (static_cast<int>(y.size()) != rk) return reject("result rank {} differs from the input's {}", y.size(), rk);
  const bool crop = n.s("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize";
  // Scales: input 2 (opset >= 11: X, roi, scales, sizes) or input 1 (opset 10: X, scales); maybe only for `axes`.
  const int si = n.inputs.size() == 2 && g.opset < 11 ? 1 : 2;
  std::vector<char> identity(rk, 1);
  for (int d = 0; d < rk; ++d) identity[d] = !crop && x[d] == y[d];
  if (present(n, si) && !shape_of(g, n.inputs[si]).empty() && num_elements(shape_of(g, n.inputs[si])) > 0) {
    auto scales = const_floats(g, n, si);
    std::vector<int64_t> axes = n.ints("axes");
    if (axes.empty())
      for (int d = 0; d < rk; ++d) axes.push_back(d);
    if (!scales || scales->size() != axes.size()) {
      std::fill(identity.begin(), identity.end(), 0);  // unknown scales: a scale near 1 may keep the size
    } else {
      for (size_t i = 0; i < axes.size(); ++i)
        if ((*scales)[i] != 1.0)
          if (auto d = norm_axis(axes[i], rk)) identity[*d] = 0;
    }
  }
  const DimFactors dx = one_factor_each(
      m.factors(x, [&](int d) { return identity[d] ? FactorKind::kPassThrough : FactorKind::kNeedReplication; }));
  // `sizes` (input 3) lists the result's global dims: the local op needs its local ones.
  if (si == 2 && present(n, 3) && num_elements(shape_of(g, n.inputs[3])) > 0) {
    if (n.has("axes")) return reject("sizes for the dims of `axes` (opset 18) are not supported");
    m.shape_operand(3);
  }
  return unary(m, dx, dx, !crop);  // interpolation weights do not depend on X
}

RuleResult range_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || !present(n, 0, true)) return reject("expects one output");
  RuleMaker m(g, n);
  if (m.out(0).size() != 1) return reject("the result has rank {}, not 1", m.out(0).size());
  m.factorless_operands().result(0, {{m.factor(m.out(0)[0], FactorKind::kPassThrough)}});
  return m.build();
}

// Axis ops: TopK (axis attr, two results) and CumSum (axis input 1).
RuleResult topk_rule(const Graph& g, const Node& n) {
  if (!present(n, 0) || n.outputs.empty()) return reject("expects X and outputs");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", -1), rk);
  if (!axis) return reject("axis {} out of range for rank {}", n.i("axis", -1), rk);
  int64_t k = -1;
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (m.has_output(o)) {
      if (static_cast<int>(m.out(o).size()) != rk) return reject("result {} has rank {}", o, m.out(o).size());
      k = m.out(o)[*axis];
    }
  const DimFactors dx = one_factor_each(
      m.factors(x, [&](int d) { return d == *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough; }));
  DimFactors dy = dx;
  if (k >= 0 && k != x[*axis]) dy[*axis] = {m.factor(k, FactorKind::kNeedReplication)};
  m.operand(0, dx).factorless_operands(1);
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (m.has_output(o)) m.result(o, dy);
  return m.build();
}

RuleResult cumsum_rule(const Graph& g, const Node& n) {
  if (auto e = unary_arity(n)) return *e;
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const int rk = static_cast<int>(x.size());
  std::optional<int> axis;
  if (const Tensor* t = constant_input(g, n, 1)) {
    auto a = t->as_int64s();
    if (a.size() == 1) axis = norm_axis(a[0], rk);
  }
  const DimFactors dx = one_factor_each(m.factors(x, [&](int d) {  // unknown axis: every dim may be the scanned one
    return !axis || d == *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough;
  }));
  return unary(m, dx, dx, true);
}

// GatherElements/ScatterElements factors: a dim other than `axis` where data and indices agree is one pass-through
// factor; otherwise each gets its own kNeedReplication factor, except the indices' `axis` dim gets `idx_axis_kind`.
void elements_factors(RuleMaker& m, const Shape& x, const Shape& idx, int axis, FactorKind idx_axis_kind,
                      DimFactors& dx, DimFactors& di) {
  for (int d = 0; d < static_cast<int>(x.size()); ++d) {
    if (d != axis && x[d] == idx[d]) {
      dx[d] = di[d] = {m.factor(x[d], FactorKind::kPassThrough)};
    } else {
      dx[d] = {m.factor(x[d], FactorKind::kNeedReplication)};
      di[d] = {m.factor(idx[d], d == axis ? idx_axis_kind : FactorKind::kNeedReplication)};
    }
  }
}

RuleResult gather_elements_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects data, indices and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& idx = m.in(1);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis || static_cast<int>(idx.size()) != rk || m.out(0) != idx)
    return reject("data {}, indices {} and result {} do not fit axis {}", shape_str(x), shape_str(idx),
                  shape_str(m.out(0)), n.i("axis", 0));
  DimFactors dx(rk), di(rk);
  elements_factors(m, x, idx, *axis, FactorKind::kPassThrough, dx, di);
  m.operand(0, dx).operand(1, di).result(0, di).linear(0);
  return m.build();
}

RuleResult gather_nd_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects data, indices and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& idx = m.in(1);
  const int r_ = static_cast<int>(x.size()), q = static_cast<int>(idx.size());
  const int b = static_cast<int>(n.i("batch_dims", 0));
  if (q < 1 || b < 0 || b >= q || b > r_) return reject("batch_dims {} does not fit ranks {} and {}", b, r_, q);
  const int k = static_cast<int>(idx.back());
  if (b + k > r_ || static_cast<int>(m.out(0).size()) != q - 1 + r_ - b - k)
    return reject("index tuples of {} do not fit data {} and result {}", k, shape_str(x), shape_str(m.out(0)));
  for (int d = 0; d < b; ++d)
    if (x[d] != idx[d]) return reject("batch dim {} differs: data {}, indices {}", d, x[d], idx[d]);
  DimFactors dx(r_), di(q), dy;
  for (int d = 0; d < b; ++d) {
    dx[d] = di[d] = {m.factor(x[d], FactorKind::kPassThrough)};
    dy.push_back(dx[d]);
  }
  for (int d = b; d < q - 1; ++d) {
    di[d] = {m.factor(idx[d], FactorKind::kPassThrough)};
    dy.push_back(di[d]);
  }
  di[q - 1] = {m.factor(idx[q - 1], FactorKind::kNeedReplication)};
  for (int d = b; d < b + k; ++d) dx[d] = {m.factor(x[d], FactorKind::kNeedReplication)};
  for (int d = b + k; d < r_; ++d) {
    dx[d] = {m.factor(x[d], FactorKind::kPassThrough)};
    dy.push_back(dx[d]);
  }
  m.operand(0, dx).operand(1, di).result(0, dy).linear(0);
  return m.build();
}

RuleResult scatter_elements_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || !present(n, 1) || !present(n, 2) || n.outputs.size() != 1 ||
      !present(n, 0, true))
    return reject("expects data, indices, updates and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& idx = m.in(1);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis || static_cast<int>(idx.size()) != rk || m.in(2) != idx)
    return reject("data {}, indices {} and updates {} do not fit axis {}", shape_str(x), shape_str(idx),
                  shape_str(m.in(2)), n.i("axis", 0));
  DimFactors dx(rk), di(rk);
  elements_factors(m, x, idx, *axis, FactorKind::kNeedReplication, dx, di);
  m.operand(0, dx).operand(1, di).operand(2, di).result(0, dx);
  return m.build();
}

RuleResult scatter_nd_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || !present(n, 1) || !present(n, 2) || n.outputs.size() != 1 ||
      !present(n, 0, true))
    return reject("expects data, indices, updates and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& idx = m.in(1);
  const Shape& upd = m.in(2);
  const int r_ = static_cast<int>(x.size()), q = static_cast<int>(idx.size());
  if (q < 1) return reject("indices are a scalar");
  const int k = static_cast<int>(idx.back());
  if (k > r_ || static_cast<int>(upd.size()) != q - 1 + r_ - k)
    return reject("index tuples of {} do not fit data {} and updates {}", k, shape_str(x), shape_str(upd));
  for (int d = 0; d < q - 1; ++d)
    if (upd[d] != idx[d]) return reject("updates dim {} is {}, indices {}", d, upd[d], idx[d]);
  for (int d = k; d < r_; ++d)
    if (upd[q - 1 + d - k] != x[d])
      return reject("updates dim {} is {}, data {}", q - 1 + d - k, upd[q - 1 + d - k], x[d]);
  DimFactors dx(r_), di(q), du(upd.size());
  for (int d = 0; d < q; ++d) di[d] = {m.factor(idx[d], FactorKind::kNeedReplication)};
  for (int d = 0; d < q - 1; ++d) du[d] = di[d];
  for (int d = 0; d < k; ++d) dx[d] = {m.factor(x[d], FactorKind::kNeedReplication)};
  for (int d = k; d < r_; ++d) dx[d] = du[q - 1 + d - k] = {m.factor(x[d], FactorKind::kPassThrough)};
  m.operand(0, dx).operand(1, di).operand(2, du).result(0, dx);
  return m.build();
}

RuleResult onehot_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects indices, depth, values and one output");
  RuleMaker m(g, n);
  const Shape& idx = m.in(0);
  const Shape& y = m.out(0);
  const int rk = static_cast<int>(y.size());
  if (rk != static_cast<int>(idx.size()) + 1)
    return reject("result rank {} is not indices rank {} + 1", rk, idx.size());
  auto axis = norm_axis(n.i("axis", -1), rk);
  if (!axis) return reject("axis {} out of range for rank {}", n.i("axis", -1), rk);
  for (int d = 0, j = 0; d < rk; ++d)
    if (d != *axis && y[d] != idx[j++]) return reject("result dim {} ({}) differs from its indices dim", d, y[d]);
  DimFactors di(idx.size()), dy(rk);
  for (int d = 0, j = 0; d < rk; ++d) {
    if (d == *axis) {
      dy[d] = {m.factor(y[d], FactorKind::kNeedReplication)};
      continue;
    }
    dy[d] = di[j++] = {m.factor(y[d], FactorKind::kPassThrough)};
  }
  return unary(m, di, dy, false);
}

// Every dim of every operand and result needs replication (data-dependent output shapes).
RuleResult whole_rule(const Graph& g, const Node& n) {
  RuleMaker m(g, n);
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (m.has_input(i)) m.operand(i, one_factor_each(m.factors(m.in(i), FactorKind::kNeedReplication)));
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (m.has_output(o)) m.result(o, one_factor_each(m.factors(m.out(o), FactorKind::kNeedReplication)));
  return m.build();
}

RuleResult compress_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects input, condition and one output");
  if (!n.has("axis")) return whole_rule(g, n);  // the input is flattened
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& y = m.out(0);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis || static_cast<int>(y.size()) != rk)
    return reject("axis {} or result rank {} does not fit the input's rank {}", n.i("axis", 0), y.size(), rk);
  for (int d = 0; d < rk; ++d)
    if (d != *axis && x[d] != y[d]) return reject("dim {} changes size ({} -> {})", d, x[d], y[d]);
  DimFactors dx(rk), dy(rk);
  for (int d = 0; d < rk; ++d) {
    if (d == *axis) {
      dx[d] = {m.factor(x[d], FactorKind::kNeedReplication)};
      dy[d] = {m.factor(y[d], FactorKind::kNeedReplication)};
    } else {
      dx[d] = dy[d] = {m.factor(x[d], FactorKind::kPassThrough)};
    }
  }
  return unary(m, dx, dy, true);
}

}  // namespace

void register_index_rules() {
  add_builtin("Pad", pad_rule);
  add_builtin("Tile", tile_rule);
  add_builtin("Resize", resize_rule);
  add_builtin("Range", range_rule);
  add_builtin("TopK", topk_rule);
  add_builtin("CumSum", cumsum_rule);
  add_builtin("GatherElements", gather_elements_rule);
  add_builtin("GatherND", gather_nd_rule);
  add_builtin("ScatterElements", scatter_elements_rule);
  add_builtin("Scatter", scatter_elements_rule);  // opset < 11 name of ScatterElements
  add_builtin("ScatterND", scatter_nd_rule);
  add_builtin("OneHot", onehot_rule);
  add_builtin("NonZero", whole_rule);
  add_builtin("Compress", compress_rule);
}

// ---- gradients ----
namespace {

/// Resize / Upsample in "nearest" mode by whole-number factors s, where output i reads input floor(i / s): Upsample,
/// Resize with asymmetric coordinates and nearest_mode floor, and Resize with half_pixel / pytorch_half_pixel
/// coordinates and a rounding nearest_mode (i / s + (1/s - 1) / 2 then lies within 1/2 of floor(i / s)). Each
/// input element is copied to an s0 x s1 x ... block, so dX is dy reshaped to [d0, s0, d1, s1, ...] and summed over
/// the s axes. Other modes and fractional factors have no rule yet (one-line error).
void nearest_resize_grad(GradContext& c) {
  if (!c.wants(0) || c.dy(0) < 0) return;
  const Node& n = c.node();
  const Shape in = c.value(c.x(0)).shape, out = c.value(c.y(0)).shape;
  auto refuse = [&](const std::string& why) {
    throw InputError(
        fmt::format("--training: node '{}' ({}): no gradient rule for {} {}", n.name, n.op_type, n.op_type, why));
  };
  if (n.s("mode", "nearest") != "nearest") refuse("in mode '" + n.s("mode") + "'");
  if (n.op_type == "Resize") {
    const std::string coords = n.s("coordinate_transformation_mode", "half_pixel");
    const std::string rounding = n.s("nearest_mode", "round_prefer_floor");
    const bool blocks =
        ((coords == "half_pixel" || coords == "pytorch_half_pixel") && rounding.rfind("round", 0) == 0) ||
        (coords == "asymmetric" && rounding == "floor");
    if (!blocks) refuse("with coordinate_transformation_mode '" + coords + "' and nearest_mode '" + rounding + "'");
  }
  if (in.size() != out.size()) refuse("that changes the rank");
  Shape split;
  std::vector<int64_t> block_axes;
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] == 0 || out[d] % in[d] != 0) refuse("by a fractional factor");
    split.push_back(in[d]);
    split.push_back(out[d] / in[d]);
    block_axes.push_back(static_cast<int64_t>(2 * d + 1));
  }
  c.set_dx(0, c.reduce_sum(c.reshape(c.dy(0), split), block_axes, false));
}

/// CumSum: each input element reaches the outputs after it (before it with `reverse`), itself excluded with
/// `exclusive`, so dX is the cumulative sum of dy the other way round, with the same `exclusive` and axis input.
void cumsum_grad(GradContext& c) {
  if (!c.wants(0) || c.dy(0) < 0) return;
  const Node& n = c.node();
  c.set_dx(0, c.op("CumSum", {c.dy(0), c.x(1)},
                   {{"exclusive", n.i("exclusive", 0)}, {"reverse", int64_t{n.i("reverse", 0) == 0}}}));
}

/// TopK: the values are X's elements at the indices (output 1, distinct within each slice), so dX is dy sent back
/// to them: OneHot(indices, n) inserts X's axis after the k axis, dy is broadcast over it, and the k axis is
/// summed (the one-hot form of Gather's gradient; no scatter op is needed). The indices carry no gradient. When
/// loading dropped the unused indices output, the rule runs the TopK again for them.
void topk_grad(GradContext& c) {
  if (!c.wants(0) || c.dy(0) < 0) return;
  const Node& n = c.node();
  const Value x = c.value(c.x(0));
  const int indices =
      n.outputs.size() > 1 && n.outputs[1] >= 0 ? n.outputs[1] : c.emit("TopK", n.inputs, n.attrs, 2)[1];
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const int64_t axis = n.i("axis", -1) < 0 ? n.i("axis", -1) + rank : n.i("axis", -1);
  const int onehot = c.one_hot(indices, x.shape[static_cast<size_t>(axis)], axis + 1, x.dtype);  // [..., k, n, ...]
  Shape dy_shape = c.value(c.dy(0)).shape;
  dy_shape.insert(dy_shape.begin() + axis + 1, 1);
  c.set_dx(0, c.reduce_sum(c.op("Mul", {onehot, c.reshape(c.dy(0), dy_shape)}), {axis}, false));
}

}  // namespace

void register_index_gradients() {
  add_builtin_gradient("Resize", nearest_resize_grad);
  add_builtin_gradient("Upsample", nearest_resize_grad);
  add_builtin_gradient("CumSum", cumsum_grad);
  add_builtin_gradient("TopK", topk_grad);
}

}  // namespace gspmd::rules_internal
