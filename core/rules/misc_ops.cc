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
#include "core/rules/rule.h"

namespace gspmd::rules_internal {
namespace {

constexpr FactorKind kPass = FactorKind::kPassThrough;
constexpr FactorKind kRep = FactorKind::kNeedReplication;

/// Batch dims pass-through, the last `tail` dims need replication; result keeps the batch dims (+ the tail when
/// `keep_tail`). Other inputs (Trilu's k) are factorless.
RuleBuilder matrix_rule(int tail, bool keep_tail) {
  return [=](const Graph& g, const Node& n) -> std::optional<OpShardingRule> {
    if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return std::nullopt;
    const Shape& x = shape_of(g, n.inputs[0]);
    const int rk = static_cast<int>(x.size());
    if (rk < tail) return std::nullopt;
    OpShardingRule r;
    DimFactors dx(rk), dy;
    for (int d = 0; d < rk; ++d) {
      dx[d] = {add_factor(r, x[d], d >= rk - tail ? kRep : kPass)};
      if (d < rk - tail || keep_tail) dy.push_back(dx[d]);
    }
    if (shape_of(g, n.outputs[0]).size() != dy.size()) return std::nullopt;
    r.operands.push_back(dx);
    for (size_t i = 1; i < n.inputs.size(); ++i)
      r.operands.push_back(DimFactors(present(n, i) ? shape_of(g, n.inputs[i]).size() : 0));
    r.results = {dy};
    r.linear_operands.assign(n.inputs.size(), false);
    return r;
  };
}

std::optional<OpShardingRule> reverse_sequence_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(x.size());
  const auto ta = norm_axis(n.i("time_axis", 0), rk), ba = norm_axis(n.i("batch_axis", 1), rk);
  if (!ta || !ba || *ta == *ba) return std::nullopt;
  OpShardingRule r;
  DimFactors dx(rk);
  for (int d = 0; d < rk; ++d) dx[d] = {add_factor(r, x[d], d == *ta ? kRep : kPass)};
  r.operands = {dx, DimFactors{dx[*ba]}};
  r.results = {dx};
  r.linear_operands = {true, false};
  return r;
}

/// RNN (G=1), GRU (G=3), LSTM (G=4).
std::optional<OpShardingRule> recurrent_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 3 || !present(n, 0) || !present(n, 1) || !present(n, 2)) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& w = shape_of(g, n.inputs[1]);
  if (x.size() != 3 || w.size() != 3) return std::nullopt;
  const bool layout = n.i("layout", 0) != 0;
  const int64_t S = layout ? x[1] : x[0], B = layout ? x[0] : x[1], I = x[2], D = w[0];
  const Shape& rsh = shape_of(g, n.inputs[2]);
  if (rsh.size() != 3) return std::nullopt;
  const int64_t H = rsh[2];
  OpShardingRule r;
  const int fs = add_factor(r, S, kRep), fb = add_factor(r, B, kPass), fi = add_factor(r, I, kRep),
            fd = add_factor(r, D, kRep), fh = add_factor(r, H, kRep);
  const DimFactors dx = layout ? DimFactors{{fb}, {fs}, {fi}} : DimFactors{{fs}, {fb}, {fi}};
  const DimFactors dstate = layout ? DimFactors{{fb}, {fd}, {fh}} : DimFactors{{fd}, {fb}, {fh}};
  const DimFactors dy = layout ? DimFactors{{fb}, {fs}, {fd}, {fh}} : DimFactors{{fs}, {fd}, {fb}, {fh}};
  r.operands.push_back(dx);
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    if (!present(n, i)) {
      r.operands.push_back({});
      continue;
    }
    const Shape& s = shape_of(g, n.inputs[i]);
    if (i == 4) {  // sequence_lens [B]
      if (s != Shape{B}) return std::nullopt;
      r.operands.push_back({{fb}});
    } else if (i == 5 || i == 6) {  // initial_h, initial_c
      if (s.size() != 3) return std::nullopt;
      r.operands.push_back(dstate);
    } else {  // W, R, B, P: replicated
      r.operands.push_back(DimFactors(s.size()));
    }
  }
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    if (!present(n, o, true)) {
      r.results.push_back({});
      continue;
    }
    const size_t rank = shape_of(g, n.outputs[o]).size();
    if ((o == 0 && rank != 4) || (o > 0 && rank != 3)) return std::nullopt;
    r.results.push_back(o == 0 ? dy : dstate);
  }
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

std::optional<OpShardingRule> quantize_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(x.size());
  OpShardingRule r;
  DimFactors dx(rk);
  for (int d = 0; d < rk; ++d) dx[d] = {add_factor(r, x[d], kPass)};
  r.operands.push_back(dx);
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    if (!present(n, i)) {
      r.operands.push_back({});
      continue;
    }
    const Shape& s = shape_of(g, n.inputs[i]);
    if (s.empty() || (s.size() == 1 && s[0] == 1)) {
      r.operands.push_back(DimFactors(s.size()));
    } else {
      const auto axis = norm_axis(n.i("axis", 1), rk);
      if (s.size() != 1 || !axis || s[0] != x[*axis]) return std::nullopt;
      r.operands.push_back({dx[*axis]});
    }
  }
  r.results = {dx};
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

std::optional<OpShardingRule> loss_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 2 || !present(n, 0) || !present(n, 1) || n.outputs.empty() || !present(n, 0, true))
    return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const int rk = static_cast<int>(x.size());
  if (rk < 2 || shape_of(g, n.inputs[1]).size() != static_cast<size_t>(rk - 1)) return std::nullopt;
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
  OpShardingRule r;
  DimFactors dx(rk), dt, dy;
  for (int d = 0; d < rk; ++d) {
    dx[d] = {add_factor(r, x[d], d == 1 ? kRep : batch)};
    if (d != 1) dt.push_back(dx[d]);
  }
  r.operands = {dx, dt};
  if (n.inputs.size() > 2) r.operands.push_back(present(n, 2) ? DimFactors(1) : DimFactors{});
  if (red == "none") dy = dt;
  r.results = {dy};
  if (n.outputs.size() > 1) r.results.push_back(log_prob ? dx : DimFactors{});
  r.mean = mean && batch == FactorKind::kReduction;
  r.linear_operands.assign(n.inputs.size(), false);
  return r;
}

/// GridSample (4-D): N and C pass-through, the grid's output positions (grid dims 1, 2 = Y dims 2, 3) pass-through;
/// X's H and W need replication (a sample may read anywhere).
std::optional<OpShardingRule> grid_sample_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2 || !present(n, 0) || !present(n, 1) || n.outputs.size() != 1) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& grid = shape_of(g, n.inputs[1]);
  if (x.size() != 4 || grid.size() != 4 || grid[0] != x[0] || grid[3] != 2) return std::nullopt;
  OpShardingRule r;
  const int fn = add_factor(r, x[0], kPass), fc = add_factor(r, x[1], kPass), fh = add_factor(r, x[2], kRep),
            fw = add_factor(r, x[3], kRep), fo = add_factor(r, grid[1], kPass), fp = add_factor(r, grid[2], kPass);
  r.operands = {DimFactors{{fn}, {fc}, {fh}, {fw}}, DimFactors{{fn}, {fo}, {fp}, {}}};
  r.results = {DimFactors{{fn}, {fc}, {fo}, {fp}}};
  r.linear_operands = {true, false};
  return r;
}

/// RoiAlign: the rois (rois dim 0, batch_indices, Y dim 0) and the channels are pass-through; X's N, H, W need
/// replication (a roi may read any image and position).
std::optional<OpShardingRule> roi_align_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !present(n, 0) || !present(n, 1) || !present(n, 2) || n.outputs.size() != 1)
    return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& rois = shape_of(g, n.inputs[1]);
  const Shape& y = shape_of(g, n.outputs[0]);
  if (x.size() != 4 || rois.size() != 2 || y.size() != 4) return std::nullopt;
  OpShardingRule r;
  const int fn = add_factor(r, x[0], kRep), fc = add_factor(r, x[1], kPass), fh = add_factor(r, x[2], kRep),
            fw = add_factor(r, x[3], kRep), fr = add_factor(r, rois[0], kPass), fy = add_factor(r, y[2], kRep),
            fx = add_factor(r, y[3], kRep);
  r.operands = {DimFactors{{fn}, {fc}, {fh}, {fw}}, DimFactors{{fr}, {}}, DimFactors{{fr}}};
  r.results = {DimFactors{{fr}, {fc}, {fy}, {fx}}};
  r.linear_operands = {false, false, false};
  return r;
}

/// TfIdfVectorizer on [N, C]: rows pass-through; the sequence and the output slots need replication.
std::optional<OpShardingRule> tfidf_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || !present(n, 0) || n.outputs.size() != 1) return std::nullopt;
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& y = shape_of(g, n.outputs[0]);
  if (x.size() != 2 || y.size() != 2 || y[0] != x[0]) return std::nullopt;
  OpShardingRule r;
  const int fn = add_factor(r, x[0], kPass), fs = add_factor(r, x[1], kRep), fo = add_factor(r, y[1], kRep);
  r.operands = {DimFactors{{fn}, {fs}}};
  r.results = {DimFactors{{fn}, {fo}}};
  r.linear_operands = {false};
  return r;
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

}  // namespace gspmd::rules_internal
