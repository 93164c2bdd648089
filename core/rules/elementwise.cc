// Elementwise ops with numpy broadcasting: one pass-through factor per output dim; a size-1 operand dim broadcast to
// a larger output dim has no factor.
#include <set>

#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

enum class Operands { kAll, kFirstOnly };
constexpr int kAllOperands = -1;  // in a linear list: every operand

// linear: indices of operands the result is linear in; additive: OpShardingRule::additive.
RuleBuilder elementwise(Operands which, std::vector<int> linear, bool additive = false) {
  return [which, linear, additive](const Graph& g, const Node& n) -> RuleResult {
    if (!present(n, 0, true)) return reject("output 0 is absent");
    RuleMaker m(g, n);
    const Shape& out = m.out(0);
    const std::vector<int> of = m.factors(out, FactorKind::kPassThrough);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!m.has_input(i) || (which == Operands::kFirstOnly && i > 0)) continue;  // the others: factorless
      if (m.in(i).size() > out.size())
        return reject("operand {} has rank {}, more than the result's {}", i, m.in(i).size(), out.size());
      m.operand(i, broadcast_dims(m.in(i), out, of));
    }
    m.factorless_operands();
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (!m.has_output(k)) continue;
      if (m.out(k).size() > out.size())
        return reject("result {} has rank {}, more than result 0's {}", k, m.out(k).size(), out.size());
      m.result(k, broadcast_dims(m.out(k), out, of));  // e.g. Dropout's mask: same shape as the output
    }
    for (int i : linear) {
      if (i == kAllOperands) m.all_linear();
      if (i >= 0 && i < static_cast<int>(n.inputs.size())) m.linear(static_cast<size_t>(i));
    }
    if (additive) m.additive();
    return m.build();
  };
}

// PRelu: elementwise, except a per-channel slope [C] (opset < 7, or a [C] that cannot broadcast numpy-style), which
// indexes the channel factor (dim 1 of X), as the kernel (backend/kernels/ops_elementwise.cc) reads it.
RuleBuilder prelu() {
  RuleBuilder base = elementwise(Operands::kAll, {});
  return [base](const Graph& g, const Node& n) -> RuleResult {
    if (n.inputs.size() == 2 && n.inputs[0] >= 0 && n.inputs[1] >= 0 && !n.outputs.empty()) {
      const Shape& x = g.values.at(n.inputs[0]).shape;
      const Shape& s = g.values.at(n.inputs[1]).shape;
      const bool legacy = s.size() == 1 && x.size() >= 2 && s[0] == x[1] &&
                          ((g.opset < 7 && s[0] > 1) || (x.size() > 2 && x.back() != s[0]));
      if (legacy) {
        RuleMaker m(g, n);
        const DimFactors xd = one_factor_each(m.factors(x, FactorKind::kPassThrough));
        m.operand(0, xd).operand(1, DimFactors{xd[1]}).result(0, xd);
        return m.build();
      }
    }
    return base(g, n);
  };
}

}  // namespace

void register_elementwise_rules() {
  add_builtin("PRelu", prelu());
  // Linear in both operands: Add/Sub (a sum of partials is the partial of the sum, so they are additive); Mul too
  // (not additive: the partitioner allows only one partial operand of a product).
  for (const char* op : {"Add", "Sub"}) add_builtin(op, elementwise(Operands::kAll, {0, 1}, /*additive=*/true));
  add_builtin("Mul", elementwise(Operands::kAll, {0, 1}));
  add_builtin("Div", elementwise(Operands::kAll, {0}));
  for (const char* op : {"Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
                         "Xor", "Max", "Min", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})
    add_builtin(op, elementwise(Operands::kAll, {}));
  // Sum is additive (like Add). Mean is jointly linear too (the mean of partial sums is the partial sum of the
  // means), but it is left unmarked: no partial operand passes through it, it is reduced first.
  add_builtin("Sum", elementwise(Operands::kAll, {kAllOperands}, /*additive=*/true));
  add_builtin("Mean", elementwise(Operands::kAll, {}));
  for (const char* op : {"Sqrt",        "Erf",        "Tanh",     "Relu",      "Exp",    "Log",
                         "Abs",         "Reciprocal", "Sigmoid",  "Not",       "Cast",   "Floor",
                         "Ceil",        "Round",      "Sign",     "Sin",       "Cos",    "IsNaN",
                         "IsInf",       "Softplus",   "Gelu",     "LeakyRelu", "Elu",    "Selu",
                         "HardSigmoid", "HardSwish",  "Softsign", "Celu",      "Mish",   "ThresholdedRelu",
                         "CastLike",    "Tan",        "Asin",     "Acos",      "Atan",   "Sinh",
                         "Cosh",        "Asinh",      "Acosh",    "Atanh",     "Shrink", "BitwiseNot"})
    add_builtin(op, elementwise(Operands::kFirstOnly, {}));
  for (const char* op : {"Neg", "Identity"}) add_builtin(op, elementwise(Operands::kAll, {0}));
  // Data input only: ratio/training_mode and min/max operands are factorless (kept replicated).
  add_builtin("Dropout", elementwise(Operands::kFirstOnly, {0}));
  add_builtin("Clip", elementwise(Operands::kFirstOnly, {}));
}

// ---- gradients (vector-Jacobian products in ONNX ops; core/rules/gradient.h) ----
namespace {

using G = GradContext;

/// Gives input i the gradient `d` (a gradient of the broadcast result) summed back to input i's shape.
void give(G& c, size_t i, int d) {
  if (c.wants(i)) c.set_dx(i, c.sum_to(d, c.value(c.x(i)).shape));
}

/// Unary ops: dx = dy * f'(x, y), f' built by `deriv` from x and y.
GradRule unary(std::function<int(G&, int x, int y)> deriv) {
  return [deriv](G& c) {
    if (!c.wants(0) || c.dy(0) < 0) return;
    c.set_dx(0, c.op("Mul", {c.dy(0), deriv(c, c.x(0), c.y(0))}));
  };
}

int scalar_like(G& c, double v, int like) { return c.scalar(v, c.value(like).dtype); }

/// x > 0 (bool).
int positive(G& c, int x) { return c.op("Greater", {x, scalar_like(c, 0.0, x)}); }

/// The gradients of the arithmetic ops (Add, Sub, Sum, Mul, Div, Pow).
void register_arithmetic_gradients() {
  add_builtin_gradient("Add", [](G& c) {
    if (c.dy(0) < 0) return;
    give(c, 0, c.dy(0));
    give(c, 1, c.dy(0));
  });
  add_builtin_gradient("Sub", [](G& c) {
    if (c.dy(0) < 0) return;
    give(c, 0, c.dy(0));
    if (c.wants(1)) give(c, 1, c.op("Neg", {c.dy(0)}));
  });
  add_builtin_gradient("Sum", [](G& c) {
    if (c.dy(0) < 0) return;
    for (size_t i = 0; i < c.node().inputs.size(); ++i) give(c, i, c.dy(0));
  });
  add_builtin_gradient("Mul", [](G& c) {
    if (c.dy(0) < 0) return;
    if (c.wants(0)) give(c, 0, c.op("Mul", {c.dy(0), c.x(1)}));
    if (c.wants(1)) give(c, 1, c.op("Mul", {c.dy(0), c.x(0)}));
  });
  add_builtin_gradient("Div", [](G& c) {  // y = a / b: da = dy / b, db = -dy * y / b
    if (c.dy(0) < 0) return;
    if (c.wants(0)) give(c, 0, c.op("Div", {c.dy(0), c.x(1)}));
    if (c.wants(1)) give(c, 1, c.op("Neg", {c.op("Div", {c.op("Mul", {c.dy(0), c.y(0)}), c.x(1)})}));
  });
  add_builtin_gradient("Pow", [](G& c) {  // y = a^b: da = dy * b * a^(b-1), db = dy * y * log(a)
    if (c.dy(0) < 0) return;
    if (c.wants(0)) {
      const int b = c.cast(c.x(1), c.value(c.x(0)).dtype);
      const int bm1 = c.op("Sub", {b, scalar_like(c, 1.0, c.x(0))});
      give(c, 0, c.op("Mul", {c.dy(0), c.op("Mul", {b, c.op("Pow", {c.x(0), bm1})})}));
    }
    if (c.wants(1)) give(c, 1, c.op("Mul", {c.dy(0), c.op("Mul", {c.y(0), c.op("Log", {c.x(0)})})}));
  });
}

/// The gradients of the other elementwise ops, each a function of its input and output (Identity, Cast, Where, the
/// activations).
void register_unary_gradients() {
  for (const char* op : {"Identity", "Dropout"})  // Dropout at inference (the loaded graph's form): identity
    add_builtin_gradient(op, [](G& c) {
      if (c.wants(0) && c.dy(0) >= 0) c.set_dx(0, c.dy(0));
    });
  add_builtin_gradient("Neg", [](G& c) {
    if (c.wants(0) && c.dy(0) >= 0) c.set_dx(0, c.op("Neg", {c.dy(0)}));
  });
  add_builtin_gradient("Cast", [](G& c) {  // float to float: cast the gradient back
    if (c.wants(0) && c.dy(0) >= 0) c.set_dx(0, c.cast(c.dy(0), c.value(c.x(0)).dtype));
  });
  add_builtin_gradient("Where", [](G& c) {  // y = cond ? a : b
    if (c.dy(0) < 0) return;
    const int zero = c.scalar(0.0, c.value(c.y(0)).dtype);
    if (c.wants(1)) give(c, 1, c.op("Where", {c.x(0), c.dy(0), zero}));
    if (c.wants(2)) give(c, 2, c.op("Where", {c.x(0), zero, c.dy(0)}));
  });
  add_builtin_gradient("Relu", unary([](G& c, int x, int) {
                         return c.cast(c.op("Greater", {x, scalar_like(c, 0.0, x)}), c.value(x).dtype);
                       }));
  add_builtin_gradient("Exp", unary([](G&, int, int y) { return y; }));
  add_builtin_gradient("Log", unary([](G& c, int x, int) { return c.op("Reciprocal", {x}); }));
  add_builtin_gradient("Sqrt", unary([](G& c, int, int y) {  // 1 / (2 sqrt(x))
                         return c.op("Reciprocal", {c.op("Mul", {y, scalar_like(c, 2.0, y)})});
                       }));
  add_builtin_gradient("Reciprocal", unary([](G& c, int, int y) { return c.op("Neg", {c.op("Mul", {y, y})}); }));
  add_builtin_gradient("Tanh", unary([](G& c, int, int y) {  // 1 - y^2
                         return c.op("Sub", {scalar_like(c, 1.0, y), c.op("Mul", {y, y})});
                       }));
  add_builtin_gradient("Sigmoid", unary([](G& c, int, int y) {  // y (1 - y)
                         return c.op("Mul", {y, c.op("Sub", {scalar_like(c, 1.0, y), y})});
                       }));
  add_builtin_gradient("Erf", unary([](G& c, int x, int) {  // 2/sqrt(pi) exp(-x^2)
                         const int e = c.op("Exp", {c.op("Neg", {c.op("Mul", {x, x})})});
                         return c.op("Mul", {e, scalar_like(c, 1.1283791670955126, x)});
                       }));
  add_builtin_gradient("Sin", unary([](G& c, int x, int) { return c.op("Cos", {x}); }));
  add_builtin_gradient("Cos", unary([](G& c, int x, int) { return c.op("Neg", {c.op("Sin", {x})}); }));
  add_builtin_gradient("Abs", unary([](G& c, int x, int) { return c.op("Sign", {x}); }));  // 0 at 0 (torch sgn)
  // Piecewise constant: no gradient flows back (zero almost everywhere; torch gives zeros, at the steps too).
  for (const char* op : {"Floor", "Ceil", "Round", "Sign"}) add_builtin_gradient(op, [](G&) {});
  add_builtin_gradient("Softplus", unary([](G& c, int x, int) { return c.op("Sigmoid", {x}); }));
  add_builtin_gradient("LeakyRelu", unary([](G& c, int x, int) {  // 1 for x > 0, else alpha (torch)
                         const double alpha = c.node().f("alpha", 0.01f);
                         return c.op("Where", {positive(c, x), scalar_like(c, 1.0, x), scalar_like(c, alpha, x)});
                       }));
  add_builtin_gradient(
      "Elu", unary([](G& c, int x, int y) {  // 1 for x > 0, else y + alpha (= alpha exp(x))
        const double alpha = c.node().f("alpha", 1.f);
        return c.op("Where", {positive(c, x), scalar_like(c, 1.0, x), c.op("Add", {y, scalar_like(c, alpha, y)})});
      }));
  add_builtin_gradient("HardSigmoid",
                       unary([](G& c, int, int y) {  // alpha where 0 < alpha x + beta < 1, i.e. 0 < y < 1
                         const double alpha = c.node().f("alpha", 0.2f);
                         const int inside = c.op("And", {positive(c, y), c.op("Less", {y, scalar_like(c, 1.0, y)})});
                         return c.op("Where", {inside, scalar_like(c, alpha, y), scalar_like(c, 0.0, y)});
                       }));
  add_builtin_gradient(
      "HardSwish", unary([](G& c, int x, int) {  // torch: 0 below -3, x/3 + 1/2 up to 3, then 1
        const int mid = c.op("Add", {c.op("Mul", {x, scalar_like(c, 1.0 / 3.0, x)}), scalar_like(c, 0.5, x)});
        const int upper = c.op("Where", {c.op("Greater", {x, scalar_like(c, 3.0, x)}), scalar_like(c, 1.0, x), mid});
        return c.op("Where", {c.op("Less", {x, scalar_like(c, -3.0, x)}), scalar_like(c, 0.0, x), upper});
      }));
  add_builtin_gradient("Clip", [](G& c) {
    // torch.clamp: dx = dy where min <= x <= max; dmin = sum of dy where x < min, dmax where x > max. Bounds are
    // attributes before opset 11, optional scalar inputs after.
    if (c.dy(0) < 0) return;
    const Node& n = c.node();
    const int x = c.x(0), dy = c.dy(0);
    int lo = -1, hi = -1;
    if (c.opset() < 11) {
      if (n.has("min")) lo = scalar_like(c, n.f("min"), x);
      if (n.has("max")) hi = scalar_like(c, n.f("max"), x);
    } else {
      lo = c.x(1);
      hi = c.x(2);
    }
    const int zero = scalar_like(c, 0.0, x);
    const int below = lo >= 0 ? c.op("Less", {x, lo}) : -1, above = hi >= 0 ? c.op("Greater", {x, hi}) : -1;
    if (c.wants(0)) {
      int out = -1;  // outside [min, max]
      if (below >= 0 && above >= 0)
        out = c.op("Or", {below, above});
      else
        out = below >= 0 ? below : above;
      c.set_dx(0, out < 0 ? dy : c.op("Where", {out, zero, dy}));
    }
    if (c.opset() >= 11 && c.wants(1)) give(c, 1, c.op("Where", {below, dy, zero}));
    if (c.opset() >= 11 && c.wants(2)) give(c, 2, c.op("Where", {above, dy, zero}));
  });
  for (const char* op : {"Max", "Min"})
    add_builtin_gradient(op, [](G& c) {
      // Each input equal to the result gets an equal share of dy (ties split evenly, as torch.maximum /
      // torch.minimum do for two inputs), summed back over broadcasting.
      if (c.dy(0) < 0) return;
      const int y = c.y(0);
      const DType dt = c.value(y).dtype;
      const size_t count = c.node().inputs.size();
      std::vector<int> hits(count, -1);
      int total = -1;
      for (size_t i = 0; i < count; ++i) {
        if (c.x(i) < 0) continue;
        hits[i] = c.cast(c.op("Equal", {c.x(i), y}), dt);  // [y's shape]
        total = total < 0 ? hits[i] : c.op("Add", {total, hits[i]});
      }
      const int share = c.op("Div", {c.dy(0), total});
      for (size_t i = 0; i < count; ++i)
        if (c.wants(i)) give(c, i, c.op("Mul", {share, hits[i]}));
    });
}

}  // namespace

void register_elementwise_gradients() {
  register_arithmetic_gradients();
  register_unary_gradients();
}

}  // namespace gspmd::rules_internal
