// Data-movement ops: Transpose, Reshape/Unsqueeze/Squeeze/Flatten (factor decomposition), Expand, Concat, Slice,
// Split, Constant/ConstantOfShape, Shape.
#include <set>

#include "core/rules/rule.h"

namespace gspmd::rules_internal {
namespace {

// Operand i's DimFactors with no factors (shape operands, scalars...).
DimFactors factorless(const Graph& g, const Node& n, int i) {
  int v = n.inputs[i];
  return v < 0 ? DimFactors{} : DimFactors(shape_of(g, v).size());
}

bool basic_ok(const Node& n, size_t min_inputs) {
  return n.inputs.size() >= min_inputs && !n.outputs.empty() && n.outputs[0] >= 0 &&
         (min_inputs == 0 || n.inputs[0] >= 0);
}

// Fills operands 1.. as factorless, linear_operands = {true, false...}.
void finish_unary_data(const Graph& g, const Node& n, OpShardingRule& r, DimFactors d0) {
  r.operands.clear();
  r.operands.push_back(std::move(d0));
  for (size_t i = 1; i < n.inputs.size(); ++i) r.operands.push_back(factorless(g, n, static_cast<int>(i)));
  r.linear_operands.assign(n.inputs.size(), false);
  if (!n.inputs.empty()) r.linear_operands[0] = true;
}

std::optional<OpShardingRule> reshape_like(const Graph& g, const Node& n) {
  if (!basic_ok(n, 1) || n.outputs.size() != 1) return std::nullopt;
  OpShardingRule r;
  auto [din, dout] = reshape_factors(r, shape_of(g, n.inputs[0]), shape_of(g, n.outputs[0]));
  finish_unary_data(g, n, r, std::move(din));
  r.results = {std::move(dout)};
  return r;
}

std::optional<OpShardingRule> transpose_rule(const Graph& g, const Node& n) {
  if (!basic_ok(n, 1) || n.outputs.size() != 1) return std::nullopt;
  const Shape& in = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(in.size());
  std::vector<int64_t> perm = n.ints("perm");
  if (perm.empty())
    for (int i = rk - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int>(perm.size()) != rk) return std::nullopt;
  OpShardingRule r;
  DimFactors din(rk), dout(rk);
  for (int d = 0; d < rk; ++d) din[d] = {add_factor(r, in[d], FactorKind::kPassThrough)};
  std::vector<char> seen(rk, 0);
  for (int i = 0; i < rk; ++i) {
    auto p = norm_axis(perm[i], rk);
    if (!p || seen[*p]) return std::nullopt;
    seen[*p] = 1;
    dout[i] = din[*p];
  }
  finish_unary_data(g, n, r, std::move(din));
  r.results = {std::move(dout)};
  return r;
}

std::optional<OpShardingRule> expand_rule(const Graph& g, const Node& n) {
  if (!basic_ok(n, 1) || n.outputs.size() != 1) return std::nullopt;
  const Shape& in = shape_of(g, n.inputs[0]);
  const Shape& out = shape_of(g, n.outputs[0]);
  if (in.size() > out.size()) return std::nullopt;
  OpShardingRule r;
  std::vector<int> of(out.size());
  DimFactors dout(out.size());
  for (size_t d = 0; d < out.size(); ++d) dout[d] = {of[d] = add_factor(r, out[d], FactorKind::kPassThrough)};
  finish_unary_data(g, n, r, broadcast_dims(in, out, of));
  r.results = {std::move(dout)};
  return r;
}

std::optional<OpShardingRule> concat_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0] < 0 || n.inputs.empty()) return std::nullopt;
  const Shape& out = shape_of(g, n.outputs[0]);
  const int rk = static_cast<int>(out.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis) return std::nullopt;
  OpShardingRule r;
  std::vector<int> of(rk);
  for (int d = 0; d < rk; ++d)
    of[d] = add_factor(r, out[d], d == *axis ? FactorKind::kPermutation : FactorKind::kPassThrough);
  for (int v : n.inputs) {
    if (v < 0) {
      r.operands.push_back({});
      continue;
    }
    const Shape& s = shape_of(g, v);
    if (static_cast<int>(s.size()) != rk) return std::nullopt;
    DimFactors df(rk);
    for (int d = 0; d < rk; ++d) {
      if (d != *axis && s[d] != out[d]) return std::nullopt;
      df[d] = {of[d]};
    }
    r.operands.push_back(std::move(df));
  }
  DimFactors dout(rk);
  for (int d = 0; d < rk; ++d) dout[d] = {of[d]};
  r.results = {std::move(dout)};
  r.linear_operands.assign(n.inputs.size(), true);
  return r;
}

std::optional<OpShardingRule> slice_rule(const Graph& g, const Node& n) {
  if (!basic_ok(n, 1) || n.outputs.size() != 1) return std::nullopt;
  const Shape& in = shape_of(g, n.inputs[0]);
  const Shape& out = shape_of(g, n.outputs[0]);
  const int rk = static_cast<int>(in.size());
  if (static_cast<int>(out.size()) != rk) return std::nullopt;
  std::vector<char> cut(rk, 0);
  for (int d = 0; d < rk; ++d) cut[d] = in[d] != out[d];
  // A dim of unchanged size may still be reversed (step -1) or strided: look at the constant steps.
  std::optional<std::vector<int64_t>> axes, steps;
  if (n.inputs.size() >= 2) {  // opset >= 10: starts, ends, axes, steps inputs
    const bool has_axes = n.inputs.size() > 3 && n.inputs[3] >= 0;
    const bool has_steps = n.inputs.size() > 4 && n.inputs[4] >= 0;
    if (has_axes) {
      if (const Tensor* t = constant_input(g, n, 3)) axes = t->as_int64s();
    } else if (const Tensor* t = constant_input(g, n, 1)) {
      std::vector<int64_t> a(t->numel());
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int64_t>(i);
      axes = a;
    }
    if (has_steps) {
      if (const Tensor* t = constant_input(g, n, 4)) steps = t->as_int64s();
      if (!steps || !axes) {
        std::fill(cut.begin(), cut.end(), 1);  // unknown steps: every dim may be permuted
      } else {
        for (size_t i = 0; i < steps->size() && i < axes->size(); ++i)
          if ((*steps)[i] != 1)
            if (auto a = norm_axis((*axes)[i], rk)) cut[*a] = 1;
      }
    }
  }
  OpShardingRule r;
  DimFactors df(rk);
  for (int d = 0; d < rk; ++d)
    df[d] = {add_factor(r, in[d], cut[d] ? FactorKind::kPermutation : FactorKind::kPassThrough)};
  r.results = {df};
  finish_unary_data(g, n, r, std::move(df));
  return r;
}

std::optional<OpShardingRule> split_rule(const Graph& g, const Node& n) {
  if (!basic_ok(n, 1) || n.outputs.empty()) return std::nullopt;
  const Shape& in = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(in.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis) return std::nullopt;
  OpShardingRule r;
  DimFactors din(rk);
  for (int d = 0; d < rk; ++d)
    din[d] = {add_factor(r, in[d], d == *axis ? FactorKind::kPermutation : FactorKind::kPassThrough)};
  for (int v : n.outputs) {
    if (v < 0) {
      r.results.push_back({});
      continue;
    }
    const Shape& s = shape_of(g, v);
    if (static_cast<int>(s.size()) != rk) return std::nullopt;
    r.results.push_back(din);
  }
  finish_unary_data(g, n, r, std::move(din));
  return r;
}

// Constant / ConstantOfShape: no tensor operands; every result dim gets its own pass-through factor.
std::optional<OpShardingRule> constant_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0] < 0) return std::nullopt;
  OpShardingRule r;
  const Shape& out = shape_of(g, n.outputs[0]);
  DimFactors dout(out.size());
  for (size_t d = 0; d < out.size(); ++d) dout[d] = {add_factor(r, out[d], FactorKind::kPassThrough)};
  for (size_t i = 0; i < n.inputs.size(); ++i) r.operands.push_back(factorless(g, n, static_cast<int>(i)));
  r.results = {std::move(dout)};
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

std::optional<OpShardingRule> shape_rule(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0] < 0) return std::nullopt;
  OpShardingRule r;
  for (size_t i = 0; i < n.inputs.size(); ++i) r.operands.push_back(factorless(g, n, static_cast<int>(i)));
  r.results = {DimFactors(shape_of(g, n.outputs[0]).size())};
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

}  // namespace

void register_shape_rules() {
  for (const char* op : {"Reshape", "Unsqueeze", "Squeeze", "Flatten"}) add_builtin(op, reshape_like);
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

}  // namespace gspmd::rules_internal
