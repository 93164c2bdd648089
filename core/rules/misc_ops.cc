// Rules for ops whose kernels came with the ONNX backend conformance work (docs/conformance.md):
// - Trilu, Det: batch dims pass-through; the matrix dims need replication (the diagonal is global).
// - ReverseSequence: batch (and trailing) dims pass-through, the time dim needs replication; sequence_lens on batch.
// - RNN / GRU / LSTM: the batch dim is pass-through (X, sequence_lens, initial states, Y, Y_h, Y_c); sequence,
//   direction, input and hidden dims need replication; weights are replicated.
// - QuantizeLinear / DequantizeLinear: elementwise; a per-axis scale / zero point indexes the axis' factor.
// - GridSample, RoiAlign, TfIdfVectorizer: batch / roi / row and channel dims pass-through; what a sample or an
//   n-gram may read (image H and W, the sequence) needs replication.
// - NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss: N and the trailing dims are pass-through with
//   reduction "none", sum-reduction factors with "sum", a mean ("mean" without weights nor ignore_index: the loss is
//   then a plain mean); the class dim and, for a weighted or ignore_index mean, everything needs replication.
#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

constexpr FactorKind kPass = FactorKind::kPassThrough;
constexpr FactorKind kRep = FactorKind::kNeedReplication;

/// Batch dims pass-through, the last `tail` dims need replication; result keeps the batch dims (+ the tail when
/// `keep_tail`). Other inputs (Trilu's k) are factorless.
RuleBuilder matrix_rule(int tail, bool keep_tail) {
  return [=](const Graph& g, const Node& n) -> RuleResult {
    if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return reject("expects X and one output");
    RuleMaker m(g, n);
    const Shape& x = m.in(0);
    const int rk = static_cast<int>(x.size());
    if (rk < tail) return reject("rank {} < {}", rk, tail);
    const int out_rank = keep_tail ? rk : rk - tail;
    if (static_cast<int>(m.out(0).size()) != out_rank)
      return reject("result rank {}, not {}", m.out(0).size(), out_rank);
    const std::vector<int> xf = m.factors(x, [&](int d) { return d >= rk - tail ? kRep : kPass; });
    const std::vector<int> yf(xf.begin(), xf.begin() + out_rank);
    m.operand(0, one_factor_each(xf)).factorless_operands(1).result(0, one_factor_each(yf));
    return m.build();
  };
}

RuleResult reverse_sequence_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects input, sequence_lens and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const int rk = static_cast<int>(x.size());
  const auto ta = norm_axis(n.i("time_axis", 0), rk), ba = norm_axis(n.i("batch_axis", 1), rk);
  if (!ta || !ba || *ta == *ba) return reject("time_axis and batch_axis are not two dims of rank {}", rk);
  const DimFactors dx = one_factor_each(m.factors(x, [&](int d) { return d == *ta ? kRep : kPass; }));
  m.operand(0, dx).operand(1, DimFactors{dx[*ba]}).result(0, dx).linear(0);
  return m.build();
}

/// Why RNN / GRU / LSTM node `n` (X, W, R and optional B, sequence_lens, initial_h, initial_c, P) cannot be expressed.
std::optional<NotExpressible> recurrent_mismatch(const Graph& g, const Node& n) {
  if (n.inputs.size() < 3 || !present(n, 0) || !present(n, 1) || !present(n, 2)) return reject("expects X, W and R");
  const Shape& x = shape_of(g, n.inputs[0]);
  if (x.size() != 3 || shape_of(g, n.inputs[1]).size() != 3 || shape_of(g, n.inputs[2]).size() != 3)
    return reject("X, W and R are not 3-D");
  const int64_t B = n.i("layout", 0) != 0 ? x[0] : x[1];
  for (size_t i = 4; i < n.inputs.size() && i <= 6; ++i) {
    if (!present(n, i)) continue;
    const Shape& s = shape_of(g, n.inputs[i]);
    if (i == 4 ? s != Shape{B} : s.size() != 3) return reject("input {} has shape {}", i, shape_str(s));
  }
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (present(n, o, true) && shape_of(g, n.outputs[o]).size() != (o == 0 ? 4u : 3u))
      return reject("output {} has rank {}", o, shape_of(g, n.outputs[o]).size());
  return std::nullopt;
}

/// RNN (G=1), GRU (G=3), LSTM (G=4).
RuleResult recurrent_rule(const Graph& g, const Node& n) {
  if (auto e = recurrent_mismatch(g, n)) return *e;
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const bool layout = n.i("layout", 0) != 0;
  const int64_t S = layout ? x[1] : x[0], B = layout ? x[0] : x[1], I = x[2], D = m.in(1)[0], H = m.in(2)[2];
  const int fs = m.factor(S, kRep), fb = m.factor(B, kPass), fi = m.factor(I, kRep), fd = m.factor(D, kRep),
            fh = m.factor(H, kRep);
  const DimFactors dx = layout ? DimFactors{{fb}, {fs}, {fi}} : DimFactors{{fs}, {fb}, {fi}};
  const DimFactors dstate = layout ? DimFactors{{fb}, {fd}, {fh}} : DimFactors{{fd}, {fb}, {fh}};
  const DimFactors dy = layout ? DimFactors{{fb}, {fs}, {fd}, {fh}} : DimFactors{{fs}, {fd}, {fb}, {fh}};
  m.operand(0, dx);
  if (m.has_input(4)) m.operand(4, {{fb}});  // sequence_lens [B]
  for (size_t i : {5, 6})                    // initial_h, initial_c
    if (m.has_input(i)) m.operand(i, dstate);
  m.factorless_operands(1);  // W, R, B, P: replicated
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (m.has_output(o)) m.result(o, o == 0 ? dy : dstate);
  return m.build();
}

RuleResult quantize_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects x, a scale and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const int rk = static_cast<int>(x.size());
  const auto axis = norm_axis(n.i("axis", 1), rk);
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    if (!m.has_input(i)) continue;
    const Shape& s = m.in(i);
    const bool scalar = s.empty() || (s.size() == 1 && s[0] == 1);
    if (!scalar && (s.size() != 1 || !axis || s[0] != x[*axis]))
      return reject("operand {} {} is neither a scalar nor per-axis over axis {}", i, shape_str(s), n.i("axis", 1));
  }
  const DimFactors dx = one_factor_each(m.factors(x, kPass));
  m.operand(0, dx);
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    if (!m.has_input(i)) continue;
    const Shape& s = m.in(i);
    const bool scalar = s.empty() || (s.size() == 1 && s[0] == 1);
    m.operand(i, scalar ? DimFactors(s.size()) : DimFactors{dx[*axis]});
  }
  m.result(0, dx);
  return m.build();
}

RuleResult loss_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || !present(n, 0) || !present(n, 1) || !present(n, 0, true))
    return reject("expects scores, labels and an output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const int rk = static_cast<int>(x.size());
  if (rk < 2 || m.in(1).size() != static_cast<size_t>(rk - 1))
    return reject("scores {} and labels {} do not fit", shape_str(x), shape_str(m.in(1)));
  const std::string red = n.s("reduction", "mean");
  const bool weighted = present(n, 2) || n.has("ignore_index");
  const bool log_prob = present(n, 1, true);
  FactorKind batch = kPass;
  bool mean = false;
  if (red == "sum" || red == "mean") batch = FactorKind::kReduction;
  if (red == "mean") mean = true;
  // Not a plain sum / mean: a weighted mean; the log_prob result; SoftmaxCrossEntropyLoss, whose zero padding
  // (the partitioner masks split reduction dims with 0) would still give a non-zero loss (log C).
  if ((red == "mean" && weighted) || (red != "none" && log_prob) ||
      (red != "none" && n.op_type == "SoftmaxCrossEntropyLoss"))
    batch = kRep;
  DimFactors dx(rk), dt;
  for (int d = 0; d < rk; ++d) {
    dx[d] = {m.factor(x[d], d == 1 ? kRep : batch)};
    if (d != 1) dt.push_back(dx[d]);
  }
  m.operand(0, dx).operand(1, dt).factorless_operands(2);  // weights: replicated
  m.result(0, red == "none" ? dt : DimFactors{});
  if (log_prob) m.result(1, dx);
  m.mean(mean && batch == FactorKind::kReduction);
  return m.build();
}

/// GridSample (4-D): N and C pass-through, the grid's output positions (grid dims 1, 2 = Y dims 2, 3) pass-through;
/// X's H and W need replication (a sample may read anywhere).
RuleResult grid_sample_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects X, grid and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& grid = m.in(1);
  if (x.size() != 4 || grid.size() != 4 || grid[0] != x[0] || grid[3] != 2)
    return reject("X {} and grid {} are not [N,C,H,W] and [N,H',W',2]", shape_str(x), shape_str(grid));
  const int fn = m.factor(x[0], kPass), fc = m.factor(x[1], kPass), fh = m.factor(x[2], kRep),
            fw = m.factor(x[3], kRep), fo = m.factor(grid[1], kPass), fp = m.factor(grid[2], kPass);
  m.operand(0, {{fn}, {fc}, {fh}, {fw}}).operand(1, {{fn}, {fo}, {fp}, {}}).result(0, {{fn}, {fc}, {fo}, {fp}});
  m.linear(0);
  return m.build();
}

/// RoiAlign: the rois (rois dim 0, batch_indices, Y dim 0) and the channels are pass-through; X's N, H, W need
/// replication (a roi may read any image and position).
RuleResult roi_align_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || !present(n, 1) || !present(n, 2) || n.outputs.size() != 1 ||
      !present(n, 0, true))
    return reject("expects X, rois, batch_indices and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& rois = m.in(1);
  const Shape& y = m.out(0);
  if (x.size() != 4 || rois.size() != 2 || y.size() != 4)
    return reject("X {}, rois {} and Y {} are not 4-D, 2-D, 4-D", shape_str(x), shape_str(rois), shape_str(y));
  const int fn = m.factor(x[0], kRep), fc = m.factor(x[1], kPass), fh = m.factor(x[2], kRep), fw = m.factor(x[3], kRep),
            fr = m.factor(rois[0], kPass), fy = m.factor(y[2], kRep), fx = m.factor(y[3], kRep);
  m.operand(0, {{fn}, {fc}, {fh}, {fw}}).operand(1, {{fr}, {}}).operand(2, {{fr}}).result(0, {{fr}, {fc}, {fy}, {fx}});
  return m.build();
}

/// TfIdfVectorizer on [N, C]: rows pass-through; the sequence and the output slots need replication.
RuleResult tfidf_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects one input and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& y = m.out(0);
  if (x.size() != 2 || y.size() != 2 || y[0] != x[0])
    return reject("X {} and Y {} are not [N, C] and [N, slots]", shape_str(x), shape_str(y));
  const int fn = m.factor(x[0], kPass), fs = m.factor(x[1], kRep), fo = m.factor(y[1], kRep);
  m.operand(0, {{fn}, {fs}}).result(0, {{fn}, {fo}});
  return m.build();
}

}  // namespace

void register_misc_rules() {
  add_builtin("GridSample", grid_sample_rule);
  add_builtin("RoiAlign", roi_align_rule);
  add_builtin("TfIdfVectorizer", tfidf_rule);
  add_builtin("Trilu", matrix_rule(2, true));
  add_builtin("Det", matrix_rule(2, false));
  add_builtin("ReverseSequence", reverse_sequence_rule);
  for (const char* op : {"RNN", "GRU", "LSTM"}) add_builtin(op, recurrent_rule);
  add_builtin("QuantizeLinear", quantize_rule);
  add_builtin("DequantizeLinear", quantize_rule);
  add_builtin("NegativeLogLikelihoodLoss", loss_rule);
  add_builtin("SoftmaxCrossEntropyLoss", loss_rule);
}

void register_misc_gradients() {
  // Trilu keeps one triangle and zeroes the rest: the gradient is the same triangle of dy (the same k and upper).
  add_builtin_gradient("Trilu", [](GradContext& c) {
    if (!c.wants(0) || c.dy(0) < 0) return;
    std::vector<int> in{c.dy(0)};
    if (c.x(1) >= 0) in.push_back(c.x(1));
    c.set_dx(0, c.op("Trilu", in, {{"upper", c.node().i("upper", 1)}}));
  });
}

}  // namespace gspmd::rules_internal
