// Reductions, Softmax/LogSoftmax, LayerNormalization, ArgMax/ArgMin.
#include <algorithm>
#include <variant>

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

void register_reduce_norm_gradients() {}

}  // namespace gspmd::rules_internal
