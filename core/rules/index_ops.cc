// Data movement and indexing ops with one rule each:
//   Pad: padded (or cropped) dims kPermutation, the others pass-through; unknown pads: every dim permutation.
//   Tile: dims with repeats > 1 (output dim != input dim) kPermutation, the others pass-through.
//   Resize: dims whose scale is exactly 1 (same size; not tf_crop_and_resize) pass-through, the others
//     kNeedReplication (an output element reads a neighbourhood at a fractional position: no halo support).
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

#include "core/rules/rule.h"

namespace gspmd::rules_internal {
namespace {

DimFactors factorless(const Graph& g, const Node& n, size_t i) {
  return present(n, i) ? DimFactors(shape_of(g, n.inputs[i]).size()) : DimFactors{};
}

// Operands 1.. factorless, result = dims of operand 0 (`dy`), linear in operand 0 if `linear`.
OpShardingRule unary(const Graph& g, const Node& n, OpShardingRule r, DimFactors dx, DimFactors dy, bool linear) {
  r.operands = {std::move(dx)};
  for (size_t i = 1; i < n.inputs.size(); ++i) r.operands.push_back(factorless(g, n, i));
  r.results = {std::move(dy)};
  r.linear_operands.assign(n.inputs.size(), false);
  r.linear_operands[0] = linear;
  return r;
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
    default:
      return std::nullopt;
  }
}

std::optional<OpShardingRule> pad_rule(const Graph& g, const Node& n) {
  if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& y = shape_of(g, n.outputs[0]);
  const int rk = static_cast<int>(x.size());
  if (static_cast<int>(y.size()) != rk) return std::nullopt;
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
  if (pads && axes && pads->size() == 2 * axes->size()) {
    std::fill(moved.begin(), moved.end(), 0);
    const size_t na = axes->size();
    for (size_t i = 0; i < na; ++i) {
      auto d = norm_axis((*axes)[i], rk);
      if (!d) return std::nullopt;
      if ((*pads)[i] != 0 || (*pads)[i + na] != 0) moved[*d] = 1;
    }
  }
  OpShardingRule r;
  DimFactors dx(rk);
  for (int d = 0; d < rk; ++d) {
    if (!moved[d] && x[d] != y[d]) return std::nullopt;
    dx[d] = {add_factor(r, x[d], moved[d] ? FactorKind::kPermutation : FactorKind::kPassThrough)};
  }
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
  return unary(g, n, std::move(r), dx, dx, linear);
}

std::optional<OpShardingRule> tile_rule(const Graph& g, const Node& n) {
  if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& y = shape_of(g, n.outputs[0]);
  if (x.size() != y.size()) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(x.size());
  for (size_t d = 0; d < x.size(); ++d)  // the output shape says the repeats: y = x * repeats
    dx[d] = {add_factor(r, x[d], x[d] == y[d] ? FactorKind::kPassThrough : FactorKind::kPermutation)};
  return unary(g, n, std::move(r), dx, dx, true);
}

std::optional<OpShardingRule> resize_rule(const Graph& g, const Node& n) {
  if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& y = shape_of(g, n.outputs[0]);
  const int rk = static_cast<int>(x.size());
  if (static_cast<int>(y.size()) != rk) return std::nullopt;
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
  OpShardingRule r;
  DimFactors dx(rk);
  for (int d = 0; d < rk; ++d)
    dx[d] = {add_factor(r, x[d], identity[d] ? FactorKind::kPassThrough : FactorKind::kNeedReplication)};
  return unary(g, n, std::move(r), dx, dx, !crop);  // interpolation weights do not depend on X
}

std::optional<OpShardingRule> range_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
  const Shape& y = shape_of(g, n.outputs[0]);
  if (y.size() != 1) return std::nullopt;
  OpShardingRule r;
  for (size_t i = 0; i < n.inputs.size(); ++i) r.operands.push_back(factorless(g, n, i));
  r.results = {{{add_factor(r, y[0], FactorKind::kPassThrough)}}};
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

// Axis ops: TopK (axis attr, two results) and CumSum (axis input 1).
std::optional<OpShardingRule> topk_rule(const Graph& g, const Node& n) {
  if (!present(n, 0) || n.outputs.empty()) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", -1), rk);
  if (!axis) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(rk);
  for (int d = 0; d < rk; ++d)
    dx[d] = {add_factor(r, x[d], d == *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough)};
  DimFactors dy = dx;
  int64_t k = -1;
  for (int o : n.outputs)
    if (o >= 0) {
      const Shape& s = shape_of(g, o);
      if (static_cast<int>(s.size()) != rk) return std::nullopt;
      k = s[*axis];
    }
  if (k >= 0 && k != x[*axis]) dy[*axis] = {add_factor(r, k, FactorKind::kNeedReplication)};
  OpShardingRule out = unary(g, n, std::move(r), dx, dy, false);
  out.results.assign(n.outputs.size(), dy);
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (n.outputs[o] < 0) out.results[o] = {};
  return out;
}

std::optional<OpShardingRule> cumsum_rule(const Graph& g, const Node& n) {
  if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(x.size());
  std::optional<int> axis;
  if (const Tensor* t = constant_input(g, n, 1)) {
    auto a = t->as_int64s();
    if (a.size() == 1) axis = norm_axis(a[0], rk);
  }
  OpShardingRule r;
  DimFactors dx(rk);
  for (int d = 0; d < rk; ++d)  // unknown axis: every dim may be the scanned one
    dx[d] = {add_factor(r, x[d], !axis || d == *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough)};
  return unary(g, n, std::move(r), dx, dx, true);
}

// GatherElements/ScatterElements factors: a dim other than `axis` where data and indices agree is one pass-through
// factor; otherwise each gets its own kNeedReplication factor, except the indices' `axis` dim gets `idx_axis_kind`.
void elements_factors(OpShardingRule& r, const Shape& x, const Shape& idx, int axis, FactorKind idx_axis_kind,
                      DimFactors& dx, DimFactors& di) {
  for (int d = 0; d < static_cast<int>(x.size()); ++d) {
    if (d != axis && x[d] == idx[d]) {
      dx[d] = di[d] = {add_factor(r, x[d], FactorKind::kPassThrough)};
    } else {
      dx[d] = {add_factor(r, x[d], FactorKind::kNeedReplication)};
      di[d] = {add_factor(r, idx[d], d == axis ? idx_axis_kind : FactorKind::kNeedReplication)};
    }
  }
}

std::optional<OpShardingRule> gather_elements_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& idx = shape_of(g, n.inputs[1]);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis || static_cast<int>(idx.size()) != rk || shape_of(g, n.outputs[0]) != idx) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(rk), di(rk);
  elements_factors(r, x, idx, *axis, FactorKind::kPassThrough, dx, di);
  r.operands = {dx, di};
  r.results = {di};
  r.linear_operands = {true, false};
  return r;
}

std::optional<OpShardingRule> gather_nd_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& idx = shape_of(g, n.inputs[1]);
  const Shape& y = shape_of(g, n.outputs[0]);
  const int r_ = static_cast<int>(x.size()), q = static_cast<int>(idx.size());
  const int b = static_cast<int>(n.i("batch_dims", 0));
  if (q < 1 || b < 0 || b >= q || b > r_) return std::nullopt;
  const int k = static_cast<int>(idx.back());
  if (b + k > r_ || static_cast<int>(y.size()) != q - 1 + r_ - b - k) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(r_), di(q), dy;
  for (int d = 0; d < b; ++d) {
    if (x[d] != idx[d]) return std::nullopt;
    dx[d] = di[d] = {add_factor(r, x[d], FactorKind::kPassThrough)};
    dy.push_back(dx[d]);
  }
  for (int d = b; d < q - 1; ++d) {
    di[d] = {add_factor(r, idx[d], FactorKind::kPassThrough)};
    dy.push_back(di[d]);
  }
  di[q - 1] = {add_factor(r, idx[q - 1], FactorKind::kNeedReplication)};
  for (int d = b; d < b + k; ++d) dx[d] = {add_factor(r, x[d], FactorKind::kNeedReplication)};
  for (int d = b + k; d < r_; ++d) {
    dx[d] = {add_factor(r, x[d], FactorKind::kPassThrough)};
    dy.push_back(dx[d]);
  }
  r.operands = {dx, di};
  r.results = {dy};
  r.linear_operands = {true, false};
  return r;
}

std::optional<OpShardingRule> scatter_elements_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || !present(n, 1) || !present(n, 2) || n.outputs.size() != 1 ||
      !present(n, 0, true))
    return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& idx = shape_of(g, n.inputs[1]);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis || static_cast<int>(idx.size()) != rk || shape_of(g, n.inputs[2]) != idx) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(rk), di(rk);
  elements_factors(r, x, idx, *axis, FactorKind::kNeedReplication, dx, di);
  r.operands = {dx, di, di};
  r.results = {dx};
  r.linear_operands = {false, false, false};
  return r;
}

std::optional<OpShardingRule> scatter_nd_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || !present(n, 1) || !present(n, 2) || n.outputs.size() != 1 ||
      !present(n, 0, true))
    return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& idx = shape_of(g, n.inputs[1]);
  const Shape& upd = shape_of(g, n.inputs[2]);
  const int r_ = static_cast<int>(x.size()), q = static_cast<int>(idx.size());
  if (q < 1) return std::nullopt;
  const int k = static_cast<int>(idx.back());
  if (k > r_ || static_cast<int>(upd.size()) != q - 1 + r_ - k) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(r_), di(q), du(upd.size());
  for (int d = 0; d < q; ++d) di[d] = {add_factor(r, idx[d], FactorKind::kNeedReplication)};
  for (int d = 0; d < q - 1; ++d) {
    if (upd[d] != idx[d]) return std::nullopt;
    du[d] = di[d];
  }
  for (int d = 0; d < k; ++d) dx[d] = {add_factor(r, x[d], FactorKind::kNeedReplication)};
  for (int d = k; d < r_; ++d) {
    if (upd[q - 1 + d - k] != x[d]) return std::nullopt;
    dx[d] = du[q - 1 + d - k] = {add_factor(r, x[d], FactorKind::kPassThrough)};
  }
  r.operands = {dx, di, du};
  r.results = {dx};
  r.linear_operands = {false, false, false};
  return r;
}

std::optional<OpShardingRule> onehot_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
  const Shape& idx = shape_of(g, n.inputs[0]);
  const Shape& y = shape_of(g, n.outputs[0]);
  const int rk = static_cast<int>(y.size());
  if (rk != static_cast<int>(idx.size()) + 1) return std::nullopt;
  auto axis = norm_axis(n.i("axis", -1), rk);
  if (!axis) return std::nullopt;
  OpShardingRule r;
  DimFactors di(idx.size()), dy(rk);
  for (int d = 0, j = 0; d < rk; ++d) {
    if (d == *axis) {
      dy[d] = {add_factor(r, y[d], FactorKind::kNeedReplication)};
      continue;
    }
    if (y[d] != idx[j]) return std::nullopt;
    dy[d] = di[j++] = {add_factor(r, y[d], FactorKind::kPassThrough)};
  }
  return unary(g, n, std::move(r), di, dy, false);
}

// Every dim of every operand and result needs replication (data-dependent output shapes).
std::optional<OpShardingRule> whole_rule(const Graph& g, const Node& n) {
  OpShardingRule r;
  auto whole = [&](int v) {
    if (v < 0) return DimFactors{};
    const Shape& s = shape_of(g, v);
    DimFactors df(s.size());
    for (size_t d = 0; d < s.size(); ++d) df[d] = {add_factor(r, s[d], FactorKind::kNeedReplication)};
    return df;
  };
  for (int v : n.inputs) r.operands.push_back(whole(v));
  for (int v : n.outputs) r.results.push_back(whole(v));
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

std::optional<OpShardingRule> compress_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
  if (!n.has("axis")) return whole_rule(g, n);  // the input is flattened
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& y = shape_of(g, n.outputs[0]);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis || static_cast<int>(y.size()) != rk) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(rk), dy(rk);
  for (int d = 0; d < rk; ++d) {
    if (d == *axis) {
      dx[d] = {add_factor(r, x[d], FactorKind::kNeedReplication)};
      dy[d] = {add_factor(r, y[d], FactorKind::kNeedReplication)};
    } else {
      if (x[d] != y[d]) return std::nullopt;
      dx[d] = dy[d] = {add_factor(r, x[d], FactorKind::kPassThrough)};
    }
  }
  return unary(g, n, std::move(r), dx, dy, true);
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

}  // namespace gspmd::rules_internal
