// Reductions, Softmax/LogSoftmax, LayerNormalization, ArgMax/ArgMin.
#include "core/rules/rule.h"

namespace gspmd::rules_internal {
namespace {

// Softmax, LogSoftmax, Hardmax. Opset >= 13: only the axis must stay whole (basic rule; the two-pass split
// decomposition is the partitioner's business). Opset < 13 coerces the input to 2-D at `axis`: every dim from the
// axis on is normalised over together.
std::optional<OpShardingRule> softmax_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || n.outputs.size() != 1 || n.inputs[0] < 0 || n.outputs[0] < 0) return std::nullopt;
  const Shape& in = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(in.size());
  const bool v13 = g.opset >= 13;
  auto axis = norm_axis(n.i("axis", v13 ? -1 : 1), rk);
  if (!axis) return std::nullopt;
  OpShardingRule r;
  DimFactors df(rk);
  for (int d = 0; d < rk; ++d) {
    bool whole = v13 ? d == *axis : d >= *axis;
    df[d] = {add_factor(r, in[d], whole ? FactorKind::kNeedReplication : FactorKind::kPassThrough)};
  }
  r.operands = {df};
  r.results = {df};
  r.linear_operands = {false};
  return r;
}

std::optional<OpShardingRule> layernorm_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || n.inputs[0] < 0 || n.outputs.empty() || n.outputs[0] < 0) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(x.size());
  auto axis = norm_axis(n.i("axis", -1), rk);
  if (!axis) return std::nullopt;
  OpShardingRule r;
  std::vector<int> xf(rk);
  DimFactors dx(rk);
  for (int d = 0; d < rk; ++d)
    dx[d] = {xf[d] = add_factor(r, x[d], d >= *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough)};
  r.operands.push_back(dx);
  for (size_t i = 1; i < n.inputs.size(); ++i) {  // Scale, B: broadcast onto the normalised dims
    int v = n.inputs[i];
    if (v < 0) {
      r.operands.push_back({});
      continue;
    }
    const Shape& s = shape_of(g, v);
    if (static_cast<int>(s.size()) > rk) return std::nullopt;
    r.operands.push_back(broadcast_dims(s, x, xf));
  }
  r.results.push_back(dx);
  for (size_t k = 1; k < n.outputs.size(); ++k) {  // Mean, InvStdDev: X.shape[:axis] + [1] * (rank - axis)
    int v = n.outputs[k];
    if (v < 0) {
      r.results.push_back({});
      continue;
    }
    const Shape& s = shape_of(g, v);
    if (static_cast<int>(s.size()) != rk) return std::nullopt;
    DimFactors dm(rk);
    for (int d = 0; d < *axis; ++d) dm[d] = {xf[d]};
    r.results.push_back(std::move(dm));
  }
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

// kind: the factor kind of reduced axes; red: how partial results combine.
RuleBuilder reduce_rule(FactorKind kind, ReductionKind red, bool linear, bool mean = false) {
  return [=](const Graph& g, const Node& n) -> std::optional<OpShardingRule> {
    if (n.inputs.empty() || n.inputs[0] < 0 || n.outputs.size() != 1 || n.outputs[0] < 0) return std::nullopt;
    const Shape& in = shape_of(g, n.inputs[0]);
    const Shape& out = shape_of(g, n.outputs[0]);
    const int rk = static_cast<int>(in.size());
    std::vector<int64_t> axes;
    if (n.inputs.size() > 1 && n.inputs[1] >= 0) {  // axes as an input (ReduceSum >= 13, the others >= 18)
      const Tensor* t = constant_input(g, n, 1);
      if (!t && num_elements(shape_of(g, n.inputs[1])) != 0) return std::nullopt;  // a runtime [0] input is empty
      if (t) axes = t->as_int64s();
    } else {
      axes = n.ints("axes");
    }
    const bool keep = n.i("keepdims", 1) != 0;
    std::vector<char> red_dim(rk, 0);
    if (axes.empty()) {
      if (!n.i("noop_with_empty_axes", 0)) std::fill(red_dim.begin(), red_dim.end(), 1);
    } else {
      for (int64_t a : axes) {
        auto d = norm_axis(a, rk);
        if (!d) return std::nullopt;
        red_dim[*d] = 1;
      }
    }
    OpShardingRule r;
    DimFactors din(rk), dout;
    for (int d = 0; d < rk; ++d) {
      int f = add_factor(r, in[d], red_dim[d] ? kind : FactorKind::kPassThrough);
      din[d] = {f};
      if (!red_dim[d])
        dout.push_back({f});
      else if (keep)
        dout.push_back({});  // keepdims: a size-1 dim without factor
    }
    if (dout.size() != out.size()) return std::nullopt;
    r.operands.push_back(std::move(din));
    for (size_t i = 1; i < n.inputs.size(); ++i)
      r.operands.push_back(n.inputs[i] < 0 ? DimFactors{} : DimFactors(shape_of(g, n.inputs[i]).size()));
    r.results = {std::move(dout)};
    r.reduction = red;
    r.mean = mean;
    r.linear_operands.assign(n.inputs.size(), false);
    r.linear_operands[0] = linear;
    return r;
  };
}

std::optional<OpShardingRule> argmax_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || n.inputs[0] < 0 || n.outputs.size() != 1 || n.outputs[0] < 0) return std::nullopt;
  const Shape& in = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(in.size());
  auto axis = norm_axis(n.i("axis", 0), rk);
  if (!axis) return std::nullopt;
  const bool keep = n.i("keepdims", 1) != 0;
  OpShardingRule r;
  DimFactors din(rk), dout;
  for (int d = 0; d < rk; ++d) {
    int f = add_factor(r, in[d], d == *axis ? FactorKind::kNeedReplication : FactorKind::kPassThrough);
    din[d] = {f};
    if (d != *axis)
      dout.push_back({f});
    else if (keep)
      dout.push_back({});
  }
  r.operands = {din};
  r.results = {dout};
  r.linear_operands = {false};
  return r;
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

}  // namespace gspmd::rules_internal
