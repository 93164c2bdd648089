// Data-movement ops: Transpose, Reshape/Unsqueeze/Squeeze/Flatten (factor decomposition), Expand, Concat, Slice,
// Split, Constant/ConstantOfShape, Shape.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

// Input 0 and output 0 present, exactly one output (the data-movement ops with one data input).
std::optional<NotExpressible> unary_arity(const Node& n) {
  if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return reject("expects input 0 and one output");
  return std::nullopt;
}

// Operand 0 = `d0`, the other operands factorless (shape operands), result 0 = `dout`, linear in operand 0.
RuleResult unary_data(RuleMaker& m, DimFactors d0, DimFactors dout) {
  m.operand(0, std::move(d0)).factorless_operands(1).result(0, std::move(dout)).linear(0);
  return m.build();
}

// Reshape, Unsqueeze, Squeeze, Flatten; `shape_input`: input 1 is the result's shape (Reshape, opset 5+).
RuleBuilder reshape_like(bool shape_input) {
  return [shape_input](const Graph& g, const Node& n) -> RuleResult {
    if (auto e = unary_arity(n)) return *e;
    RuleMaker m(g, n);
    auto [din, dout] = reshape_factors(m, m.in(0), m.out(0));
    if (shape_input && m.has_input(1)) m.shape_operand(1);
    return unary_data(m, std::move(din), std::move(dout));
  };
}

RuleResult transpose_rule(const Graph& g, const Node& n) {
  if (auto e = unary_arity(n)) return *e;
  RuleMaker m(g, n);
  const Shape& in = m.in(0);
  const int rk = static_cast<int>(in.size());
  std::vector<int64_t> perm = n.ints("perm");
  if (perm.empty())
    for (int i = rk - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int>(perm.size()) != rk) return reject("perm has {} entries for rank {}", perm.size(), rk);
  const DimFactors din = one_factor_each(m.factors(in, FactorKind::kPassThrough));
  DimFactors dout(rk);
  std::vector<char> seen(rk, 0);
  for (int i = 0; i < rk; ++i) {
    auto p = norm_axis(perm[i], rk);
    if (!p || seen[*p]) return reject("perm is not a permutation of 0..{}", rk - 1);
    seen[*p] = 1;
    dout[i] = din[*p];
  }
  return unary_data(m, din, std::move(dout));
}

RuleResult expand_rule(const Graph& g, const Node& n) {
  if (auto e = unary_arity(n)) return *e;
  RuleMaker m(g, n);
  const Shape& in = m.in(0);
  const Shape& out = m.out(0);
  if (in.size() > out.size()) return reject("input rank {} > result rank {}", in.size(), out.size());
  const std::vector<int> of = m.factors(out, FactorKind::kPassThrough);
  if (m.has_input(1)) m.shape_operand(1);
  return unary_data(m, broadcast_dims(in, out, of), one_factor_each(of));
}

RuleResult concat_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0] < 0 || n.inputs.empty()) return reject("expects inputs and one output");
  RuleMaker m(g, n);
  const Shape& out = m.out(0);
  const int rk = static_cast<int>(out.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis) return reject("axis {} out of range for rank {}", n.i("axis", 0), rk);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (!m.has_input(i)) continue;
    const Shape& s = m.in(i);
    if (static_cast<int>(s.size()) != rk) return reject("operand {} has rank {}, the result {}", i, s.size(), rk);
    for (int d = 0; d < rk; ++d)
      if (d != *axis && s[d] != out[d]) return reject("operand {} dim {} is {}, the result's {}", i, d, s[d], out[d]);
  }
  const DimFactors df = one_factor_each(
      m.factors(out, [&](int d) { return d == *axis ? FactorKind::kPermutation : FactorKind::kPassThrough; }));
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (m.has_input(i)) m.operand(i, df);
  m.result(0, df).all_linear().additive();
  return m.build();
}

// Slice dims that may move data: those whose size changes, and those with a constant step other than 1 (reversed or
// strided). Unknown steps: every dim.
std::vector<char> slice_cut_dims(const Graph& g, const Node& n, const Shape& in, const Shape& out) {
  const int rk = static_cast<int>(in.size());
  std::vector<char> cut(rk, 0);
  for (int d = 0; d < rk; ++d) cut[d] = in[d] != out[d];
  if (n.inputs.size() < 2) return cut;              // opset < 10: attributes, steps of 1
  std::optional<std::vector<int64_t>> axes, steps;  // opset >= 10: starts, ends, axes, steps inputs
  if (present(n, 3)) {
    if (const Tensor* t = constant_input(g, n, 3)) axes = t->as_int64s();
  } else if (const Tensor* t = constant_input(g, n, 1)) {
    std::vector<int64_t> a(t->numel());
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int64_t>(i);
    axes = a;
  }
  if (!present(n, 4)) return cut;
  if (const Tensor* t = constant_input(g, n, 4)) steps = t->as_int64s();
  if (!steps || !axes) {
    std::fill(cut.begin(), cut.end(), 1);  // unknown steps: every dim may be permuted
    return cut;
  }
  for (size_t i = 0; i < steps->size() && i < axes->size(); ++i)
    if ((*steps)[i] != 1)
      if (auto a = norm_axis((*axes)[i], rk)) cut[*a] = 1;
  return cut;
}

RuleResult slice_rule(const Graph& g, const Node& n) {
  if (auto e = unary_arity(n)) return *e;
  RuleMaker m(g, n);
  const Shape& in = m.in(0);
  const Shape& out = m.out(0);
  if (out.size() != in.size()) return reject("result rank {} differs from the input's {}", out.size(), in.size());
  const std::vector<char> cut = slice_cut_dims(g, n, in, out);
  const DimFactors df = one_factor_each(
      m.factors(in, [&](int d) { return cut[d] ? FactorKind::kPermutation : FactorKind::kPassThrough; }));
  return unary_data(m, df, df);
}

RuleResult split_rule(const Graph& g, const Node& n) {
  if (!present(n, 0) || !present(n, 0, true)) return reject("expects input 0 and output 0");
  RuleMaker m(g, n);
  const Shape& in = m.in(0);
  const int rk = static_cast<int>(in.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis) return reject("axis {} out of range for rank {}", n.i("axis", 0), rk);
  for (size_t k = 0; k < n.outputs.size(); ++k)
    if (m.has_output(k) && static_cast<int>(m.out(k).size()) != rk)
      return reject("result {} has rank {}, the input {}", k, m.out(k).size(), rk);
  const DimFactors din = one_factor_each(
      m.factors(in, [&](int d) { return d == *axis ? FactorKind::kPermutation : FactorKind::kPassThrough; }));
  for (size_t k = 0; k < n.outputs.size(); ++k)
    if (m.has_output(k)) m.result(k, din);
  m.operand(0, din).factorless_operands(1).linear(0);
  return m.build();
}

// Constant / ConstantOfShape: no tensor operands; every result dim gets its own pass-through factor.
RuleResult constant_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0] < 0) return reject("expects one output");
  RuleMaker m(g, n);
  m.result(0, one_factor_each(m.factors(m.out(0), FactorKind::kPassThrough))).factorless_operands();
  return m.build();
}

RuleResult shape_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0] < 0) return reject("expects one output");
  RuleMaker m(g, n);
  m.factorless_operands().result(0, DimFactors(m.out(0).size()));
  return m.build();
}

}  // namespace

void register_shape_rules() {
  add_builtin("Reshape", reshape_like(/*shape_input=*/true));
  for (const char* op : {"Unsqueeze", "Squeeze", "Flatten"}) add_builtin(op, reshape_like(/*shape_input=*/false));
  add_builtin("Transpose", transpose_rule);
  add_builtin("Expand", expand_rule);
  add_builtin("Concat", concat_rule);
  add_builtin("Slice", slice_rule);
  add_builtin("Split", split_rule);
  add_builtin("Constant", constant_rule);
  add_builtin("ConstantOfShape", constant_rule);
  add_builtin("Shape", shape_rule);
  add_builtin("Size", shape_rule);
}

// ---- gradients ----
namespace {

/// Slice(data, starts, ends, axes, steps) (attributes before opset 10): dy zero-padded back to data's shape. Only
/// steps of 1 (the slices the models here use).
void slice_grad(GradContext& c) {
  if (!c.wants(0) || c.dy(0) < 0) return;
  const Node& n = c.node();
  const Shape xs = c.value(c.x(0)).shape;
  const int r = static_cast<int>(xs.size());
  auto list = [&](int input, const char* attr, std::vector<int64_t> def) -> std::vector<int64_t> {
    if (c.opset() < 10) return n.has(attr) ? n.ints(attr) : def;
    if (!present(n, static_cast<size_t>(input))) return def;
    const Tensor* t = constant_input(c.graph(), n, input);
    if (!t) throw InputError(fmt::format("--training: node '{}' (Slice): input {} is not a constant", n.name, input));
    return t->as_int64s();
  };
  const std::vector<int64_t> starts = list(1, "starts", {}), ends = list(2, "ends", {});
  std::vector<int64_t> all(starts.size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int64_t>(k);
  const std::vector<int64_t> axes = list(3, "axes", all),
                             steps = list(4, "steps", std::vector<int64_t>(starts.size(), 1));
  std::vector<int64_t> before(static_cast<size_t>(r), 0), after(static_cast<size_t>(r), 0);
  for (size_t k = 0; k < starts.size(); ++k) {
    if (steps.at(k) != 1)
      throw InputError(fmt::format("--training: node '{}' (Slice): no gradient for steps other than 1", n.name));
    const auto a = norm_axis(axes.at(k), r);
    if (!a) throw InputError(fmt::format("--training: node '{}' (Slice): axis out of range", n.name));
    const int64_t dim = xs[static_cast<size_t>(*a)];
    auto clamp = [dim](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
    const int64_t b = clamp(starts[k]), e = std::max(b, clamp(ends.at(k)));
    before[static_cast<size_t>(*a)] = b;
    after[static_cast<size_t>(*a)] = dim - e;
  }
  before.insert(before.end(), after.begin(), after.end());
  c.set_dx(0, c.pad(c.dy(0), before));
}

}  // namespace

void register_shape_gradients() {
  for (const char* op : {"Reshape", "Unsqueeze", "Squeeze", "Flatten"})
    add_builtin_gradient(op, [](GradContext& c) {
      if (c.wants(0) && c.dy(0) >= 0) c.set_dx(0, c.reshape(c.dy(0), c.value(c.x(0)).shape));
    });
  add_builtin_gradient("Transpose", [](GradContext& c) {
    if (!c.wants(0) || c.dy(0) < 0) return;
    const size_t r = c.value(c.x(0)).shape.size();
    std::vector<int64_t> perm = c.node().ints("perm");
    if (perm.empty())
      for (size_t d = 0; d < r; ++d) perm.push_back(static_cast<int64_t>(r - 1 - d));
    std::vector<int64_t> inverse(r);
    for (size_t d = 0; d < r; ++d) inverse[static_cast<size_t>(perm[d])] = static_cast<int64_t>(d);
    c.set_dx(0, c.transpose(c.dy(0), inverse));
  });
  add_builtin_gradient("Expand", [](GradContext& c) {
    if (c.wants(0) && c.dy(0) >= 0) c.set_dx(0, c.sum_to(c.dy(0), c.value(c.x(0)).shape));
  });
  add_builtin_gradient("Concat", [](GradContext& c) {
    if (c.dy(0) < 0) return;
    const int r = static_cast<int>(c.value(c.y(0)).shape.size());
    const int64_t axis = norm_axis(c.node().i("axis", 0), r).value_or(0);
    int64_t at = 0;
    for (size_t i = 0; i < c.node().inputs.size(); ++i) {
      if (c.x(i) < 0) continue;
      const int64_t len = c.value(c.x(i)).shape[static_cast<size_t>(axis)];
      if (c.wants(i)) c.set_dx(i, c.slice(c.dy(0), {at}, {at + len}, {axis}));
      at += len;
    }
  });
  add_builtin_gradient("Split", [](GradContext& c) {
    if (!c.wants(0)) return;
    const int r = static_cast<int>(c.value(c.x(0)).shape.size());
    std::vector<int> parts;
    for (size_t k = 0; k < c.node().outputs.size(); ++k) parts.push_back(c.dy_or_zeros(k));
    c.set_dx(0, parts.size() == 1
                    ? parts[0]
                    : c.op("Concat", parts, {{"axis", int64_t{norm_axis(c.node().i("axis", 0), r).value_or(0)}}}));
  });
  add_builtin_gradient("Slice", slice_grad);
}

}  // namespace gspmd::rules_internal
