// Elementwise ops with numpy broadcasting: one pass-through factor per output dim; a size-1 operand dim broadcast to
// a larger output dim has no factor.
#include <set>

#include "core/rules/rule.h"

namespace gspmd::rules_internal {
namespace {

enum class Operands { kAll, kFirstOnly };
constexpr int kAllOperands = -1;  // in a linear list: every operand

// linear: indices of operands the result is linear in.
RuleBuilder elementwise(Operands which, std::vector<int> linear) {
  return [which, linear](const Graph& g, const Node& n) -> std::optional<OpShardingRule> {
    if (n.outputs.empty() || n.outputs[0] < 0) return std::nullopt;
    const Shape& out = g.values.at(n.outputs[0]).shape;
    OpShardingRule r;
    std::vector<int> of(out.size());
    for (size_t d = 0; d < out.size(); ++d) of[d] = add_factor(r, out[d], FactorKind::kPassThrough);
    r.operands.resize(n.inputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      if (v < 0) continue;
      const Shape& s = g.values.at(v).shape;
      if (which == Operands::kFirstOnly && i > 0) {
        r.operands[i] = DimFactors(s.size());
        continue;
      }
      if (s.size() > out.size()) return std::nullopt;
      r.operands[i] = broadcast_dims(s, out, of);
    }
    r.results.resize(n.outputs.size());
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      int v = n.outputs[k];
      if (v < 0) continue;
      const Shape& s = g.values.at(v).shape;
      if (s.size() > out.size()) return std::nullopt;
      r.results[k] = broadcast_dims(s, out, of);  // e.g. Dropout's mask: same shape as the output
    }
    r.linear_operands.assign(n.inputs.size(), false);
    for (int i : linear) {
      if (i == kAllOperands) r.linear_operands.assign(n.inputs.size(), true);
      if (i >= 0 && i < static_cast<int>(n.inputs.size())) r.linear_operands[i] = true;
    }
    return r;
  };
}

// PRelu: elementwise, except a per-channel slope [C] (opset < 7, or a [C] that cannot broadcast numpy-style), which
// indexes the channel factor (dim 1 of X), as the kernel (backend/kernels/ops_elementwise.cc) reads it.
RuleBuilder prelu() {
  RuleBuilder base = elementwise(Operands::kAll, {});
  return [base](const Graph& g, const Node& n) -> std::optional<OpShardingRule> {
    if (n.inputs.size() == 2 && n.inputs[0] >= 0 && n.inputs[1] >= 0 && !n.outputs.empty()) {
      const Shape& x = g.values.at(n.inputs[0]).shape;
      const Shape& s = g.values.at(n.inputs[1]).shape;
      const bool legacy = s.size() == 1 && x.size() >= 2 && s[0] == x[1] &&
                          ((g.opset < 7 && s[0] > 1) || (x.size() > 2 && x.back() != s[0]));
      if (legacy) {
        OpShardingRule r;
        DimFactors xd(x.size());
        for (size_t d = 0; d < x.size(); ++d) xd[d] = {add_factor(r, x[d], FactorKind::kPassThrough)};
        r.operands = {xd, DimFactors{xd[1]}};
        r.results = {xd};
        r.linear_operands = {false, false};
        return r;
      }
    }
    return base(g, n);
  };
}

}  // namespace

void register_elementwise_rules() {
  add_builtin("PRelu", prelu());
  // Linear in both operands: Add/Sub (a sum of partials is the partial of the sum); Mul too (the partitioner allows
  // only one partial operand of a product).
  for (const char* op : {"Add", "Sub", "Mul"}) add_builtin(op, elementwise(Operands::kAll, {0, 1}));
  add_builtin("Div", elementwise(Operands::kAll, {0}));
  for (const char* op : {"Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
                         "Xor", "Max", "Min", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})
    add_builtin(op, elementwise(Operands::kAll, {}));
  // Sum is linear in every operand (like Add). Mean is too when *all* operands are partial, but the partitioner
  // treats only Add/Sub/Sum/Concat as additive (else it allows one partial operand), so Mean says false.
  add_builtin("Sum", elementwise(Operands::kAll, {kAllOperands}));
  add_builtin("Mean", elementwise(Operands::kAll, {}));
  for (const char* op : {"Sqrt", "Erf", "Tanh", "Relu", "Exp", "Log", "Abs", "Reciprocal", "Sigmoid", "Not", "Cast",
                         "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "IsNaN", "IsInf", "Softplus", "Gelu",
                         "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Softsign", "Celu", "Mish",
                         "ThresholdedRelu", "CastLike", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
                         "Acosh", "Atanh", "Shrink", "BitwiseNot"})
    add_builtin(op, elementwise(Operands::kFirstOnly, {}));
  for (const char* op : {"Neg", "Identity"}) add_builtin(op, elementwise(Operands::kAll, {0}));
  // Data input only: ratio/training_mode and min/max operands are factorless (kept replicated).
  add_builtin("Dropout", elementwise(Operands::kFirstOnly, {0}));
  add_builtin("Clip", elementwise(Operands::kFirstOnly, {}));
}

}  // namespace gspmd::rules_internal
