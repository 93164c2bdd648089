// Reductions, Softmax/LogSoftmax, LayerNormalization, ArgMax/ArgMin.
#include <algorithm>
#include <variant>

#include <fmt/format.h>

#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

// Softmax, LogSoftmax, Hardmax. Opset >= 13: only the axis must stay whole (basic rule; the two-pass split
// decomposition is the partitioner's business). Opset < 13 coerces the input to 2-D at `axis`: every dim from the
// axis on is normalised over together.
RuleResult softmax_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || n.outputs.size() != 1 || !present(n, 0) || !present(n, 0, true))
    return reject("expects one input and one output");
  RuleMaker m(g, n);
  const Shape& in = m.in(0);
  const int rk = static_cast<int>(in.size());
  const bool v13 = g.opset >= 13;
  const int64_t a = n.i("axis", v13 ? -1 : 1);
  auto axis = norm_axis(a, rk);
  if (!axis) return reject("axis {} out of range for rank {}", a, rk);
  const DimFactors df = one_factor_each(m.factors(in, [&](int d) {
    const bool whole = v13 ? d == *axis : d >= *axis;
    return whole ? FactorKind::kNeedReplication : FactorKind::kPassThrough;
  }));
  m.operand(0, df).result(0, df);
  return m.build();
}

RuleResult layernorm_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || !present(n, 0) || !present(n, 0, true)) return reject("expects X, Scale and output Y");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", -1), rk);
  if (!axis) return reject("axis {} out of range for rank {}", n.i("axis", -1), rk);
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (m.has_input(i) && static_cast<int>(m.in(i).size()) > rk)
      return reject("operand {} has rank {}, more than X's {}", i, m.in(i).size(), rk);
  for (size_t k = 1; k < n.outputs.size(); ++k)
    if (m.has_output(k) && static_cast<int>(m.out(k).size()) != rk)
      return reject("result {} has rank {}, X {}", k, m.out(k).size(), rk);
  const std::vector<int> xf =
      m.factors(x, [&](int d) { return d >= *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough; });
  const DimFactors dx = one_factor_each(xf);
  m.operand(0, dx).result(0, dx);
  for (size_t i = 1; i < n.inputs.size(); ++i)  // Scale, B: broadcast onto the normalised dims
    if (m.has_input(i)) m.operand(i, broadcast_dims(m.in(i), x, xf));
  for (size_t k = 1; k < n.outputs.size(); ++k) {  // Mean, InvStdDev: X.shape[:axis] + [1] * (rank - axis)
    if (!m.has_output(k)) continue;
    DimFactors dm(rk);
    for (int d = 0; d < *axis; ++d) dm[d] = {xf[d]};
    m.result(k, std::move(dm));
  }
  return m.build();
}

// The reduced dims of a Reduce* node of rank `rk` (axes from the attribute or the constant input 1), or why not.
std::variant<std::vector<char>, NotExpressible> reduced_dims(const Graph& g, const Node& n, int rk) {
  std::vector<int64_t> axes;
  if (present(n, 1)) {  // axes as an input (ReduceSum >= 13, the others >= 18)
    const Tensor* t = constant_input(g, n, 1);
    if (!t && num_elements(shape_of(g, n.inputs[1])) != 0)  // a runtime [0] input is empty
      return reject("the axes input is not a constant");
    if (t) axes = t->as_int64s();
  } else {
    axes = n.ints("axes");
  }
  std::vector<char> red_dim(rk, 0);
  if (axes.empty()) {
    if (!n.i("noop_with_empty_axes", 0)) std::fill(red_dim.begin(), red_dim.end(), 1);
    return red_dim;
  }
  for (int64_t a : axes) {
    auto d = norm_axis(a, rk);
    if (!d) return reject("axis {} out of range for rank {}", a, rk);
    red_dim[*d] = 1;
  }
  return red_dim;
}

// kind: the factor kind of reduced axes; red: how partial results combine.
RuleBuilder reduce_rule(FactorKind kind, ReductionKind red, bool linear, bool mean = false) {
  return [=](const Graph& g, const Node& n) -> RuleResult {
    if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return reject("expects data and one output");
    RuleMaker m(g, n);
    const Shape& in = m.in(0);
    const int rk = static_cast<int>(in.size());
    auto reduced = reduced_dims(g, n, rk);
    if (auto* e = std::get_if<NotExpressible>(&reduced)) return *e;
    const std::vector<char>& red_dim = std::get<std::vector<char>>(reduced);
    const bool keep = n.i("keepdims", 1) != 0;
    DimFactors din(rk), dout;
    for (int d = 0; d < rk; ++d) {
      int f = m.factor(in[d], red_dim[d] ? kind : FactorKind::kPassThrough);
      din[d] = {f};
      if (!red_dim[d])
        dout.push_back({f});
      else if (keep)
        dout.push_back({});  // keepdims: a size-1 dim without factor
    }
    if (dout.size() != m.out(0).size())
      return reject("result rank {}, expected {} (keepdims={})", m.out(0).size(), dout.size(), keep ? 1 : 0);
    m.operand(0, std::move(din)).factorless_operands(1).result(0, std::move(dout)).reduction(red).mean(mean);
    m.linear(0, linear);
    return m.build();
  };
}

RuleResult argmax_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects one input and one output");
  RuleMaker m(g, n);
  const Shape& in = m.in(0);
  const int rk = static_cast<int>(in.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis) return reject("axis {} out of range for rank {}", n.i("axis", 0), rk);
  const bool keep = n.i("keepdims", 1) != 0;
  DimFactors din(rk), dout;
  for (int d = 0; d < rk; ++d) {
    int f = m.factor(in[d], d == *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough);
    din[d] = {f};
    if (d != *axis)
      dout.push_back({f});
    else if (keep)
      dout.push_back({});
  }
  if (dout.size() != m.out(0).size()) return reject("result rank {}, expected {}", m.out(0).size(), dout.size());
  m.operand(0, std::move(din)).result(0, std::move(dout));
  return m.build();
}

}  // namespace

void register_reduce_norm_rules() {
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax"}) add_builtin(op, softmax_rule);
  add_builtin("LayerNormalization", layernorm_rule);
  add_builtin("ReduceSum", reduce_rule(FactorKind::kReduction, ReductionKind::kSum, true));
  // Sum of |x| and of x^2 over a split axis: the local op (ReduceL1 / ReduceSumSquare on the shard, padding masked
  // to 0 = |0| = 0^2) gives partial sums, combined by a sum.
  add_builtin("ReduceL1", reduce_rule(FactorKind::kReduction, ReductionKind::kSum, false));
  add_builtin("ReduceSumSquare", reduce_rule(FactorKind::kReduction, ReductionKind::kSum, false));
  add_builtin("ReduceMax", reduce_rule(FactorKind::kReduction, ReductionKind::kMax, false));
  add_builtin("ReduceMin", reduce_rule(FactorKind::kReduction, ReductionKind::kMin, false));
  add_builtin("ReduceProd", reduce_rule(FactorKind::kReduction, ReductionKind::kProd, false));
  // ReduceMean over a split axis: a sum with `mean` (OpShardingRule::mean: the partitioner rescales the local mean
  // by local_count / global_count, making it a partial sum of the global mean). Linear in the data.
  add_builtin("ReduceMean", reduce_rule(FactorKind::kReduction, ReductionKind::kSum, true, true));
  // Not a single associative combine of the local results: ReduceL2 = sqrt(sum x^2) (the partials would have to be
  // squared back, and the sqrt applied after the all-reduce), ReduceLogSum = log(sum x) and ReduceLogSumExp =
  // log(sum exp x) (combining needs exp of the partials: a logsumexp reduction kind, with a max shift to stay
  // finite). A split reduced axis is all-gathered instead.
  add_builtin("ReduceL2", reduce_rule(FactorKind::kNeedReplication, ReductionKind::kSum, false));
  add_builtin("ReduceLogSumExp", reduce_rule(FactorKind::kNeedReplication, ReductionKind::kSum, false));
  add_builtin("ReduceLogSum", reduce_rule(FactorKind::kNeedReplication, ReductionKind::kSum, false));
  add_builtin("ArgMax", argmax_rule);
  add_builtin("ArgMin", argmax_rule);
}

// ---- gradients ----
namespace {

/// x's shape with the reduced dims of Reduce* node `c.node()` set to 1 (the keepdims shape), from its axes.
Shape kept_shape(GradContext& c) {
  const Shape x = c.value(c.x(0)).shape;
  auto dims = reduced_dims(c.graph(), c.node(), static_cast<int>(x.size()));
  if (auto* why = std::get_if<NotExpressible>(&dims))
    throw InputError(fmt::format("--training: node '{}' ({}): {}", c.node().name, c.node().op_type, why->reason));
  Shape kept = x;
  const auto& red = std::get<std::vector<char>>(dims);
  for (size_t d = 0; d < x.size(); ++d)
    if (red[d]) kept[d] = 1;
  return kept;
}

/// dy of a Reduce* node broadcast back to x's shape.
int spread(GradContext& c) { return c.expand(c.reshape(c.dy(0), kept_shape(c)), c.value(c.x(0)).shape); }

/// The axes Softmax / LogSoftmax normalise over: `axis` (opset >= 13), or every dim from `axis` on (before 13 the
/// input is coerced to 2-D at `axis`, default 1).
std::vector<int64_t> softmax_axes(GradContext& c) {
  const int r = static_cast<int>(c.value(c.x(0)).shape.size());
  const auto a = norm_axis(c.node().i("axis", c.opset() >= 13 ? -1 : 1), r);
  if (!a)
    throw InputError(fmt::format("--training: node '{}' ({}): axis out of range", c.node().name, c.node().op_type));
  std::vector<int64_t> axes{*a};
  if (c.opset() < 13)
    for (int d = *a + 1; d < r; ++d) axes.push_back(d);
  return axes;
}

/// The number of outputs LayerNormalization's gradient wants its forward node to compute: Y, Mean and InvStdDev
/// (ONNX opset 17), read instead of recomputed, when X is float32 (the stash type of the statistics, as the kernel
/// and the split lowering compute them).
size_t layernorm_saved_outputs(const Graph& g, const Node& n) {
  return g.opset >= 17 && !n.inputs.empty() && n.inputs[0] >= 0 &&
                 g.values[static_cast<size_t>(n.inputs[0])].dtype == DType::kFloat32
             ? 3
             : 0;
}

/// LayerNormalization (ONNX opset 17): Y = (X - mean) * rstd * Scale + B over the dims from `axis` on. Reads the
/// node's Mean and InvStdDev (layernorm_saved_outputs), or recomputes them when it has none, and returns dX, dScale
/// and dB as torch.nn.functional.layer_norm's backward does:
/// dX = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dY * Scale.
void layernorm_grad(GradContext& c) {
  const int dy = c.dy(0);
  if (dy < 0) return;
  const Node& n = c.node();
  const Value xv = c.value(c.x(0));
  const int r = static_cast<int>(xv.shape.size());
  const auto a = norm_axis(n.i("axis", -1), r);
  if (!a) throw InputError(fmt::format("--training: node '{}' (LayerNormalization): axis out of range", n.name));
  std::vector<int64_t> axes;
  for (int d = *a; d < r; ++d) axes.push_back(d);
  const DType dt = xv.dtype;
  const int x = c.x(0);
  int mean = -1, rstd = -1;
  if (n.outputs.size() >= 3 && n.outputs[1] >= 0 && n.outputs[2] >= 0) {
    mean = c.y(1);
    rstd = c.y(2);
  }
  const int xc = c.op("Sub", {x, mean >= 0 ? mean : c.reduce_mean(x, axes, true)});
  if (rstd < 0) {
    const int var = c.reduce_mean(c.op("Mul", {xc, xc}), axes, true);
    rstd = c.op("Reciprocal", {c.op("Sqrt", {c.op("Add", {var, c.scalar(n.f("epsilon", 1e-5f), dt)})})});
  }
  const int xhat = c.op("Mul", {xc, rstd});
  if (c.wants(1)) c.set_dx(1, c.sum_to(c.op("Mul", {dy, xhat}), c.value(c.x(1)).shape));
  if (c.wants(2)) c.set_dx(2, c.sum_to(dy, c.value(c.x(2)).shape));
  if (c.wants(0)) {
    const int g = c.x(1) >= 0 ? c.op("Mul", {dy, c.x(1)}) : dy;  // d xhat
    const int t = c.op("Sub", {c.op("Sub", {g, c.reduce_mean(g, axes, true)}),
                               c.op("Mul", {xhat, c.reduce_mean(c.op("Mul", {g, xhat}), axes, true)})});
    c.set_dx(0, c.op("Mul", {t, rstd}));
  }
}

}  // namespace

void register_reduce_norm_gradients() {
  add_builtin_gradient("ReduceSum", [](GradContext& c) {
    if (c.wants(0) && c.dy(0) >= 0) c.set_dx(0, spread(c));
  });
  add_builtin_gradient("ReduceMean", [](GradContext& c) {
    if (!c.wants(0) || c.dy(0) < 0) return;
    const double n = static_cast<double>(num_elements(c.value(c.x(0)).shape)) /
                     static_cast<double>(std::max<int64_t>(1, num_elements(c.value(c.y(0)).shape)));
    c.set_dx(0, c.op("Mul", {spread(c), c.scalar(1.0 / n, c.value(c.x(0)).dtype)}));
  });
  // ReduceMax / ReduceMin: the gradient goes to the elements equal to the result, split evenly between ties
  // (torch.amax / amin).
  for (const char* op : {"ReduceMax", "ReduceMin"})
    add_builtin_gradient(op, [](GradContext& c) {
      if (!c.wants(0) || c.dy(0) < 0) return;
      const Shape xs = c.value(c.x(0)).shape;
      const DType dt = c.value(c.x(0)).dtype;
      const Shape kept = kept_shape(c);
      const int hit = c.cast(c.op("Equal", {c.x(0), c.reshape(c.y(0), kept)}), dt);
      std::vector<int64_t> axes;
      for (size_t d = 0; d < xs.size(); ++d)
        if (kept[d] != xs[d] || (xs[d] == 1 && kept[d] == 1)) axes.push_back(static_cast<int64_t>(d));
      const int ties = c.reduce_sum(hit, axes, true);
      c.set_dx(0, c.op("Mul", {c.op("Div", {hit, ties}), spread(c)}));
    });
  add_builtin_gradient("Softmax", [](GradContext& c) {  // dx = y (dy - sum(dy y))
    if (!c.wants(0) || c.dy(0) < 0) return;
    const int dyy = c.op("Mul", {c.dy(0), c.y(0)});
    c.set_dx(0, c.op("Sub", {dyy, c.op("Mul", {c.y(0), c.reduce_sum(dyy, softmax_axes(c), true)})}));
  });
  add_builtin_gradient("LogSoftmax", [](GradContext& c) {  // dx = dy - exp(y) sum(dy)
    if (!c.wants(0) || c.dy(0) < 0) return;
    const int s = c.reduce_sum(c.dy(0), softmax_axes(c), true);
    c.set_dx(0, c.op("Sub", {c.dy(0), c.op("Mul", {c.op("Exp", {c.y(0)}), s})}));
  });
  add_builtin_gradient("LayerNormalization", layernorm_grad);
  add_builtin_saved_outputs("LayerNormalization", layernorm_saved_outputs);
}

}  // namespace gspmd::rules_internal
