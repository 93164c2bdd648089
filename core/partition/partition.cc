// The SPMD partitioner's driver (GSPMD paper §3.4): lowers every node of the global graph to local computation on
// shards, inserting reshards (lowered to collectives) where an operand's sharding differs from what the node's factor
// assignment needs. The generic lowering of one node reads only its factor rule; what differs per op type is in the
// handlers (partitioner.h lists the files). See spmd.h for the program format, program_ops.h for its `gspmd` ops and
// docs/partitioning.md for the design.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/cost/cost.h"
#include "core/partition/partitioner.h"

namespace gspmd {
namespace partition_internal {
namespace {

/// The mesh axes of F's reduction factors: the axes a result computed with F is unreduced over.
std::vector<int> reduction_axes(const OpShardingRule& rule, const FactorSharding& F) {
  std::vector<int> axes;
  for (int f = 0; f < rule.num_factors(); ++f)
    if (rule.factor_kinds[f] == FactorKind::kReduction) axes.insert(axes.end(), F[f].begin(), F[f].end());
  return axes;
}

bool is_split_reduction(const OpShardingRule& rule, const FactorSharding& F) {
  for (int f = 0; f < rule.num_factors(); ++f)
    if (rule.factor_kinds[f] == FactorKind::kReduction && !F[f].empty()) return true;
  return false;
}

}  // namespace

float reduction_identity(ReductionKind k) {
  switch (k) {
    case ReductionKind::kSum: return 0.f;
    case ReductionKind::kProd: return 1.f;
    case ReductionKind::kMax: return -std::numeric_limits<float>::infinity();
    case ReductionKind::kMin: return std::numeric_limits<float>::infinity();
  }
  return 0.f;
}

std::string axes_str(const DeviceMesh& mesh, const std::vector<int>& axes) {
  return fmt::format("{{{}}}", fmt::join(mesh.axis_names(axes), ", "));
}

Partitioner::Partitioner(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, const Target& target,
                         const RuleTable& rules, const MemoryRoles* roles)
    : g_(g),
      plan_(plan),
      mesh_(mesh),
      rules_(rules),
      planner_(mesh, target),
      avail_(g.values.size()),
      consumers_(g.consumers()),
      is_output_(g.values.size(), 0),
      roles_(roles) {
  for (int v : g.outputs) is_output_[static_cast<size_t>(v)] = 1;
  out_.mesh = mesh;
  P().name = g.name;
  P().reserve(2 * g.values.size(), 2 * g.nodes.size());  // a program has about 1.5x the graph's values and nodes
  P().opset = g.opset;
  out_.final_shardings.resize(g.values.size());
  for (size_t v = 0; v < g.values.size(); ++v)
    out_.final_shardings[v] = TensorSharding::replicated(static_cast<int>(g.values[v].shape.size()));
}

SpmdProgram Partitioner::run() {
  for (int gv : g_.inputs) {
    TensorSharding s = plan_.shardings[gv];
    if (s.unreduced.empty()) s.reduction = ReductionKind::kSum;
    int lv = new_value(g_.values[gv].name, g_.values[gv].dtype, s.local_shape(g_.values[gv].shape, mesh_));
    P().inputs.push_back(lv);
    out_.inputs.push_back({lv, gv, s});
    bind(gv, s, lv);
  }
  for (int n = 0; n < static_cast<int>(g_.nodes.size()); ++n) {
    node_ = n;
    phase_ = roles_ ? roles_->phase(n) : -1;
    lower(n);
    constrain_results(n);
    out_.node_origin.resize(P().nodes.size(), n);
  }
  node_ = static_cast<int>(g_.nodes.size());
  phase_ = roles_ ? roles_->last_phase() : -1;  // the outputs are read where the step ends
  for (int gv : g_.outputs) {
    TensorSharding want = plan_.shardings[gv];
    want.unreduced.clear();
    want.reduction = ReductionKind::kSum;
    int lv = get(gv, want, "", "graph output");
    P().outputs.push_back(lv);
    out_.outputs.push_back({lv, gv, want});
  }
  out_.node_origin.resize(P().nodes.size(), -1);
  out_.value_origin.resize(P().values.size(), -1);
  return std::move(out_);
}

// ---- choosing factor shardings ----------------------------------------------------------------------------------

/// Drops assignments that a local computation cannot express: axes on kNeedReplication / kPermutation factors, a
/// minor factor of a merged dim split while a more major factor is not fully split, and splits of merged-dim factors
/// that do not divide evenly (a local reshape would mix shards).
void Partitioner::sanitize(const OpShardingRule& rule, FactorSharding& F) const {
  for (int f = 0; f < rule.num_factors(); ++f)
    if (rule.factor_kinds[f] == FactorKind::kNeedReplication || rule.factor_kinds[f] == FactorKind::kPermutation)
      F[f].clear();
  auto check = [&](const DimFactors& df) {
    for (const auto& dim : df) {
      if (dim.size() < 2) continue;
      bool major_full = true;
      for (int f : dim) {
        int64_t n = mesh_.axes_size(F[f]);
        if (!F[f].empty() && (!major_full || rule.factor_sizes[f] % n != 0)) F[f].clear();
        major_full = major_full && mesh_.axes_size(F[f]) == rule.factor_sizes[f];
      }
    }
  };
  for (const auto& df : rule.operands) check(df);
  for (const auto& df : rule.results) check(df);
}

Partitioner::NodeProjection Partitioner::project(const Node& node, const OpShardingRule& rule) const {
  NodeProjection p{FactorProjection(rule, mesh_, node.inputs.size() + node.outputs.size()), {}, {}};
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if (node.inputs[i] >= 0) p.operands.push_back(p.proj.add(current_dims(node.inputs[i]), rule.operands[i]));
  for (size_t r = 0; r < node.outputs.size(); ++r)
    if (node.outputs[r] >= 0) p.results.push_back(p.proj.add(plan_.shardings[node.outputs[r]], rule.results[r]));
  return p;
}

/// The mesh axes of every factor of `node`'s local computation. First a reduction factor that every operand splits
/// the same way (row-parallel MatMul: reduce the result afterwards rather than move the operands); then the results'
/// planned shardings and the operands' current ones, results first or operands first, merged "first come, whole
/// factor" (FactorProjection::merge_first_come): each factor takes the axes of the first tensor that splits it, while
/// they are free. `used` receives the mesh axes the offers took (sanitize may clear a factor, never its axes).
FactorSharding Partitioner::choose_factors(const OpShardingRule& rule, const NodeProjection& p, bool results_first,
                                           std::vector<char>& used) {
  const int nf = rule.num_factors();
  FactorSharding F(nf);
  used.assign(mesh_.rank(), 0);
  for (int f = 0; f < nf; ++f) {
    if (rule.factor_kinds[f] != FactorKind::kReduction) continue;
    std::optional<std::vector<int>> agreed = p.proj.agreed(f, p.operands);
    if (agreed && std::none_of(agreed->begin(), agreed->end(), [&](int a) { return used[a]; })) {
      F[f] = *agreed;
      for (int a : F[f]) used[a] = 1;
    }
  }
  std::vector<int> order = results_first ? p.results : p.operands;
  const std::vector<int>& then = results_first ? p.operands : p.results;
  order.insert(order.end(), then.begin(), then.end());
  p.proj.merge_first_come(order, F, used);
  sanitize(rule, F);
  // Ops whose operands carry no factor (Range, ConstantOfShape) generate their whole result: keep it whole. With a
  // shape operand (Expand of a broadcast value) the local op makes the local result itself: uniform along the
  // broadcast dims, so any shard of it is computed in place (the mean loss's gradient is one).
  if (rule.shape_operand < 0 && std::all_of(rule.operands.begin(), rule.operands.end(), [](const DimFactors& df) {
        return std::all_of(df.begin(), df.end(), [](const std::vector<int>& d) { return d.empty(); });
      }))
    for (auto& axes : F) axes.clear();
  // A grouped convolution splits its groups only evenly (the local op's `group` must be whole).
  if (const int gf = rule.group_factor; gf >= 0 && rule.factor_sizes[gf] % mesh_.axes_size(F[gf]) != 0) F[gf].clear();
  return F;
}

/// GSPMD's einsum strategies (§3.3): computing in the results' sharding moves the operands; computing in the
/// operands' sharding moves the results instead. Takes the second when its reshards are cheaper (e.g. GShard's
/// dispatch: tokens split by group in, experts split out: one all-to-all of the result, not a gather of the tokens).
/// Windowed ops keep the first (their halos are planned from it), and so do partial operands (whether they stay
/// unreduced is decided later, from the factor shardings).
FactorSharding Partitioner::choose_strategy(const Node& node, const OpShardingRule& rule, std::vector<char>& used) {
  const NodeProjection projection = project(node, rule);
  FactorSharding F = choose_factors(rule, projection, /*results_first=*/true, used);
  const bool partial = std::any_of(node.inputs.begin(), node.inputs.end(), [&](int v) {
    return v >= 0 && !avail_[v].empty() && !avail_[v].front().sharding.unreduced.empty();
  });
  if (partial) sum_partials_first(node, rule, F, used);
  if (partial || std::any_of(rule.factor_kinds.begin(), rule.factor_kinds.end(),
                             [](FactorKind k) { return k == FactorKind::kWindowed; }))
    return F;
  std::vector<char> used_g;
  FactorSharding G = choose_factors(rule, projection, /*results_first=*/false, used_g);
  if (G != F && reshard_seconds(node, rule, G) < 0.999 * reshard_seconds(node, rule, F)) {
    used = std::move(used_g);
    return G;
  }
  return F;
}

/// An additive op (Add, Sub, Sum) whose operands are all partial sums over the same axes U, each read only linearly:
/// the sum of the partials is the partial of the sum, so the op runs on the partials as they are, with U taken off
/// F's factors, and its result stays unreduced over U; one reduction later replaces one per operand (XLA's
/// reassociation of all-reduces through adds). The gradients of a value read three times (q, k and v read the
/// same LayerNorm output) are summed before they are reduce-scattered once.
void Partitioner::sum_partials_first(const Node& node, const OpShardingRule& rule, FactorSharding& F,
                                     std::vector<char>& used) const {
  if (!rule.additive) return;
  std::vector<int> U;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const int v = node.inputs[i];
    if (v < 0) continue;
    const TensorSharding s = current(v);
    if (s.unreduced.empty() || s.reduction != ReductionKind::kSum || !linear_in_all_consumers(v) ||
        (!U.empty() && s.unreduced != U) || i >= rule.linear_operands.size() || !rule.linear_operands[i])
      return;
    U = s.unreduced;
  }
  for (std::vector<int>& axes : F) std::erase_if(axes, [&](int a) { return contains(U, a); });
  for (int a : U) used[static_cast<size_t>(a)] = 0;
}

/// Estimated seconds of the reshards that computing `node` with factor shardings F needs: every operand from its
/// current sharding to F's, every result from F's to its plan (an impossible reshard counts as infinite).
double Partitioner::reshard_seconds(const Node& node, const OpShardingRule& rule, const FactorSharding& F) {
  double t = 0;
  auto add = [&](const Value& v, const TensorSharding& from, const TensorSharding& to) {
    try {
      t += planner_.plan(v.shape, static_cast<int64_t>(dtype_size(v.dtype)), from, to).seconds;
    } catch (const std::exception&) {
      t = std::numeric_limits<double>::infinity();
    }
  };
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const int gv = node.inputs[i];
    const DimFactors& df = rule.operands[i];
    if (gv < 0 || df.empty() || df.size() != g_.values[gv].shape.size()) continue;
    add(g_.values[gv], current(gv), sharding_from_factors(F, df));
  }
  const std::vector<int> red_axes = reduction_axes(rule, F);
  for (size_t r = 0; r < node.outputs.size(); ++r) {
    const Value& v = g_.values[node.outputs[r]];
    if (rule.results[r].size() != v.shape.size()) continue;
    TensorSharding s = sharding_from_factors(F, rule.results[r]);
    s.unreduced = red_axes;
    add(v, s, plan_.shardings[node.outputs[r]]);
  }
  return t;
}

// ---- lowering one node ------------------------------------------------------------------------------------------

/// The generic lowering of node n from its rule: choose the factor shardings (choose_strategy), let the windowed
/// dims plan their halos and the bias operands their masks (both may unsplit factors), decide what stays unreduced,
/// then reshard the operands and emit the local op and its results. Control flow, nodes without a rule and what a
/// handler lowers whole take other paths.
void Partitioner::lower(int n) {
  const Node& node = g_.nodes[n];
  if (node.has_body()) {  // If / Loop / Scan: no factor rule; the body runs whole on every device
    lower_replicated(n, fmt::format("node '{}' ({}): control flow ({}): its body is computed replicated", node.name,
                                    node.op_type, node.op_type));
    return;
  }
  const RuleResult& rule = rules_[n];
  if (!rule) {
    lower_replicated(n, fmt::format("node '{}' ({}) {}", node.name, node.op_type, rule.describe()));
    return;
  }
  const OpHandler* handler = find_handler(node);
  if (handler && handler->lower && (this->*handler->lower)(n)) return;
  std::vector<char> used;
  FactorSharding F = choose_strategy(node, *rule, used);
  const std::vector<Window> windows = plan_windows(node, *rule, F);
  const bool masked_lookup = handler && handler->lower_split_reduction;
  const std::vector<int> bias_ops = masked_lookup ? std::vector<int>{} : plan_bias_operands(node, *rule, F);
  const Partials partials = decide_partials(node, *rule, F, used);
  if (masked_lookup && is_split_reduction(*rule, F)) {
    (this->*handler->lower_split_reduction)(n, *rule, F);
    return;
  }
  std::vector<int> inputs = reshard_operands(node, *rule, F, partials, bias_ops);
  if (!windows.empty()) inputs[0] = exchange_halos(node, inputs[0], windows);
  emit_local(node, *rule, F, partials, std::move(inputs), windows, handler);
}

/// Partial operands stay partial when the op is linear in them, they are partial sums over the same axes, those axes
/// are not used by the node's own factors and no reduction factor is split; else they are reduced first. An
/// additive op (OpShardingRule::additive) needs every tensor operand partial, any other linear op exactly one.
Partitioner::Partials Partitioner::decide_partials(const Node& node, const OpShardingRule& rule,
                                                   const FactorSharding& F, std::vector<char>& used) const {
  Partials p;
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if (node.inputs[i] >= 0 && !current(node.inputs[i]).unreduced.empty()) p.operands.push_back(static_cast<int>(i));
  if (p.operands.empty()) return p;
  const TensorSharding first = current(node.inputs[p.operands[0]]);
  const bool same = std::all_of(p.operands.begin(), p.operands.end(), [&](int i) {
    TensorSharding s = current(node.inputs[i]);
    return s.unreduced == first.unreduced && s.reduction == ReductionKind::kSum;
  });
  const bool linear = std::all_of(p.operands.begin(), p.operands.end(), [&](int i) {
    return i < static_cast<int>(rule.linear_operands.size()) && rule.linear_operands[i];
  });
  const auto tensor_operands =
      static_cast<size_t>(std::count_if(node.inputs.begin(), node.inputs.end(), [](int v) { return v >= 0; }));
  const bool shape_ok = rule.additive ? p.operands.size() == tensor_operands : p.operands.size() == 1;
  const bool axes_free = std::none_of(first.unreduced.begin(), first.unreduced.end(), [&](int a) { return used[a]; });
  const bool sole =
      std::all_of(p.operands.begin(), p.operands.end(), [&](int i) { return linear_in_all_consumers(node.inputs[i]); });
  if (same && linear && shape_ok && axes_free && sole && !is_split_reduction(rule, F))
    p.keep_unreduced = first.unreduced;
  for (int a : p.keep_unreduced) used[a] = 1;
  return p;
}

bool Partitioner::linear_in_all_consumers(int gv) const {
  if (is_output_[static_cast<size_t>(gv)]) return false;  // needed whole
  for (int c : consumers_[static_cast<size_t>(gv)]) {
    const OpShardingRule* r = rules_.rule(c);
    if (!r) return false;
    const std::vector<int>& in = g_.nodes[static_cast<size_t>(c)].inputs;
    int reads = 0;
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k] != gv) continue;
      ++reads;
      if (k >= r->linear_operands.size() || !r->linear_operands[k]) return false;
    }
    if (reads > 1 && !r->additive) return false;
  }
  return true;
}

/// Every operand resharded to what F needs (factorless or rank-mismatched operands replicated, kept partials
/// unreduced); the padding of unevenly split reduction dims masked with the reduction's identity; bias operands kept
/// on the first tile. The shape operand is left out (-1): emit_local gives the local op the local result shape.
std::vector<int> Partitioner::reshard_operands(const Node& node, const OpShardingRule& rule, const FactorSharding& F,
                                               const Partials& partials, const std::vector<int>& bias_ops) {
  std::vector<int> inputs;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const int gv = node.inputs[i];
    if (gv < 0 || static_cast<int>(i) == rule.shape_operand) {
      inputs.push_back(-1);
      continue;
    }
    const Value& v = g_.values[gv];
    const DimFactors& df = rule.operands[i];
    TensorSharding want = df.empty() || df.size() != v.shape.size()
                              ? TensorSharding::replicated(static_cast<int>(v.shape.size()))
                              : sharding_from_factors(F, df);
    if (!partials.keep_unreduced.empty() && contains(partials.operands, static_cast<int>(i)))
      want.unreduced = partials.keep_unreduced;
    int lv = get(gv, want, node.name, [&] {
      return fmt::format("{} ({}) needs operand {} as {}", node.name, node.op_type, i, want.to_partition_spec(mesh_));
    });
    for (size_t d = 0; d < df.size(); ++d)
      for (int f : df[d])
        if (rule.factor_kinds[f] == FactorKind::kReduction && !F[f].empty() && may_pad(gv, d, F[f])) {
          lv = emit(gspmd_node(MaskPadAttrs{.axis = int64_t(d),
                                            .mesh_axes = F[f],
                                            .full_size = v.shape[d],
                                            .value = reduction_identity(rule.reduction)}),
                    {lv}, v.name, P().values[lv].dtype, P().values[lv].shape);
          symbolic_attr("full_size", global_dim(gv, d));
        }
    if (contains(bias_ops, static_cast<int>(i))) lv = keep_on_first_tile(lv, rule, F, v.name);
    inputs.push_back(lv);
  }
  return inputs;
}

/// Emits the local op on `inputs` and binds its results: sharded like F's result factors, unreduced over the kept
/// partial axes and the split reduction factors' axes (a mean rescaled so that the partials sum to the global mean).
/// The local op gets the local result shape for its shape operand, its window attributes, its local `group` and the
/// handler's rewrite.
void Partitioner::emit_local(const Node& node, const OpShardingRule& rule, const FactorSharding& F,
                             const Partials& partials, std::vector<int> inputs, const std::vector<Window>& windows,
                             const OpHandler* handler) {
  const std::vector<int> red_axes = reduction_axes(rule, F);
  Node local = node;
  local.inputs = std::move(inputs);
  local.outputs.clear();
  std::vector<TensorSharding> result_shardings;
  for (size_t r = 0; r < node.outputs.size(); ++r) {
    const Value& gvv = g_.values[node.outputs[r]];
    TensorSharding s = rule.results[r].size() == gvv.shape.size()
                           ? sharding_from_factors(F, rule.results[r])
                           : TensorSharding::replicated(static_cast<int>(gvv.shape.size()));
    s.unreduced = partials.keep_unreduced;
    s.unreduced.insert(s.unreduced.end(), red_axes.begin(), red_axes.end());
    std::sort(s.unreduced.begin(), s.unreduced.end());
    // kept partials are sums (only sums pass through linear ops); split reduction factors give the rule's kind
    s.reduction = red_axes.empty() ? ReductionKind::kSum : rule.reduction;
    local.outputs.push_back(new_value(gvv.name, gvv.dtype, s.local_shape(gvv.shape, mesh_)));
    result_shardings.push_back(s);
  }
  // The local shape is literal: the result's local shape replaces the shape operand.
  if (rule.shape_operand >= 0) {
    local.inputs[rule.shape_operand] = int64_const("shape", P().values[local.outputs[0]].shape);
    out_.shape_of.emplace_back(local.inputs[rule.shape_operand], local.outputs[0]);
  }
  if (!windows.empty()) set_window_attrs(local, node, windows);
  if (rule.group_factor >= 0)
    local.attrs["group"] = rule.factor_sizes[rule.group_factor] / mesh_.axes_size(F[rule.group_factor]);
  if (handler && handler->rewrite_local) (this->*handler->rewrite_local)(local, node);
  P().add_node(std::move(local));
  const std::vector<int> local_outs = P().nodes.back().outputs;
  // A mean over split reduction factors: each device averaged its (zero-padded) shard; rescale so that the partial
  // results sum to the global mean.
  // Over a split symbolic dim n the scale is ceil(n / k) / n, computed from the dims at run time (two int64
  // constants over the symbols, cast and divided) instead of a literal.
  double mean_scale = 1.0;
  DimExpr shard_count = 1, total_count = 1;
  bool symbolic_mean = false;
  if (rule.mean)
    for (int f = 0; f < rule.num_factors(); ++f) {
      if (rule.factor_kinds[f] != FactorKind::kReduction || F[f].empty()) continue;
      DimExpr size = rule.factor_sizes[f];
      for (size_t i = 0; i < node.inputs.size() && i < rule.operands.size(); ++i)
        for (size_t d = 0; d < rule.operands[i].size(); ++d)
          if (node.inputs[i] >= 0 && contains(rule.operands[i][d], f)) size = global_dim(node.inputs[i], d);
      symbolic_mean = symbolic_mean || !size.is_constant();
      shard_count = shard_count * ceil_div(size, mesh_.axes_size(F[f]));
      total_count = total_count * size;
      mean_scale *= static_cast<double>(ceil_div(rule.factor_sizes[f], mesh_.axes_size(F[f]))) /
                    static_cast<double>(rule.factor_sizes[f]);
    }
  for (size_t r = 0; r < node.outputs.size(); ++r) {
    int out = local_outs[r];
    if (!(shard_count == total_count)) {
      const Value& gvv = g_.values[node.outputs[r]];
      const DType dt = gvv.dtype;
      if (!is_floating(dt))
        throw UnsupportedError(
            fmt::format("{} ({}): mean of {} over a split dim", node.name, node.op_type, dtype_name(dt)));
      // 16-bit results are scaled in float32 (one rounding, as the kernels compute them), unless the scale is a
      // power of two, which scales exactly in their own type (an even split over 2^k devices)
      const bool half = dt == DType::kFloat16 || dt == DType::kBFloat16;
      const bool exact = !symbolic_mean && std::ilogb(mean_scale) != FP_ILOGBNAN &&
                         std::ldexp(1.0, std::ilogb(mean_scale)) == mean_scale;
      const DType st = half && !exact ? DType::kFloat32 : dt;  // the scale's and the product's type
      const Shape shape = P().values[out].shape;
      int scale = -1;
      if (symbolic_mean) {
        scale = emit("Div", {runtime_size("mean_shard", shard_count, st), runtime_size("mean_total", total_count, st)},
                     "mean_scale", st, {1});
        if (shape.empty()) scale = to_scalar(scale);  // a mean to a scalar: [1] would make it a [1]
      } else {
        Tensor t(st, {});
        if (st == DType::kFloat64)
          t.data<double>()[0] = mean_scale;
        else if (st == DType::kFloat32)
          t.data<float>()[0] = static_cast<float>(mean_scale);
        else  // a power of two: exact in both 16-bit types
          t.data<uint16_t>()[0] = st == DType::kFloat16 ? float_to_half(static_cast<float>(mean_scale))
                                                        : float_to_bf16(static_cast<float>(mean_scale));
        scale = new_constant("mean_scale", std::move(t));
      }
      if (st != dt) out = emit("Cast", {out}, gvv.name, st, shape, {{"to", static_cast<int64_t>(st)}});
      out = emit("Mul", {out, scale}, gvv.name, st, shape);
      if (st != dt) out = emit("Cast", {out}, gvv.name, dt, shape, {{"to", static_cast<int64_t>(dt)}});
    }
    bind(node.outputs[r], result_shardings[r], out);
  }
}

// ---- split reductions with an added operand (OpShardingRule::bias_operands) -------------------------------------

/// A split reduction factor makes every device compute a partial result; an operand that does not index the factor
/// would then be counted once per device. Bias operands (the rule's bias_operands: Gemm's C, Conv's B) are added, so
/// they are kept on the first tile of the reduction axes only and zero elsewhere; integer operands without factors
/// (reduction axes) are parameters; for any other such operand the factor is not split. Returns the bias operands to
/// mask.
std::vector<int> Partitioner::plan_bias_operands(const Node& node, const OpShardingRule& rule,
                                                 FactorSharding& F) const {
  std::vector<int> bias;
  for (int f = 0; f < rule.num_factors(); ++f) {
    if (rule.factor_kinds[f] != FactorKind::kReduction || F[f].empty()) continue;
    for (size_t i = 0; i < node.inputs.size() && !F[f].empty(); ++i) {
      const DimFactors& df = rule.operands[i];
      if (node.inputs[i] < 0 || df.empty()) continue;
      const bool indexes = std::any_of(df.begin(), df.end(), [&](const std::vector<int>& d) { return contains(d, f); });
      if (indexes) continue;
      // An integer operand without factors (ReduceSum's axes from opset 13, ReduceMean's from 18) is a parameter of
      // the op, not data that the partial results would count once per device.
      const bool parameter = std::all_of(df.begin(), df.end(), [](const std::vector<int>& d) { return d.empty(); }) &&
                             !is_floating(g_.values[static_cast<size_t>(node.inputs[i])].dtype);
      if (parameter) continue;
      const bool is_bias = contains(rule.bias_operands, static_cast<int>(i)) && rule.reduction == ReductionKind::kSum;
      if (!is_bias)
        F[f].clear();
      else if (!contains(bias, static_cast<int>(i)))
        bias.push_back(static_cast<int>(i));
    }
  }
  return bias;
}

/// Zeroes `x` on every device but the first tile of the split reduction axes (so the partial sums add it once).
int Partitioner::keep_on_first_tile(int x, const OpShardingRule& rule, const FactorSharding& F,
                                    const std::string& name) {
  std::vector<int> axes = reduction_axes(rule, F);
  if (axes.empty()) return x;
  std::sort(axes.begin(), axes.end());
  return first_tile_only(x, axes, 0.f, name);
}

// ---- no rule ----------------------------------------------------------------------------------------------------

/// No rule (or no way to split): gather every operand, compute the whole op on every device, with a warning.
void Partitioner::lower_replicated(int n, const std::string& why) {
  const Node& node = g_.nodes[n];
  out_.warnings.push_back(fmt::format("{}: computed replicated on every device (all-gather of its operands)", why));
  Node local = node;
  for (int& in : local.inputs) {
    if (in < 0) continue;
    int r = static_cast<int>(g_.values[in].shape.size());
    in = get(in, TensorSharding::replicated(r), node.name, why);
  }
  local.outputs.clear();
  for (int o : node.outputs)
    local.outputs.push_back(new_value(g_.values[o].name, g_.values[o].dtype, g_.values[o].shape));
  P().add_node(std::move(local));
  for (size_t r = 0; r < node.outputs.size(); ++r)
    bind(node.outputs[r], TensorSharding::replicated(static_cast<int>(g_.values[node.outputs[r]].shape.size())),
         P().nodes.back().outputs[r]);
}

}  // namespace partition_internal

SpmdProgram partition(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, const Target& target,
                      const RuleTable* rules, const MemoryRoles* roles) {
  if (plan.shardings.size() != g.values.size())
    throw std::invalid_argument("partition: the plan has no sharding for some values");
  std::optional<RuleTable> own;
  SpmdProgram p = partition_internal::Partitioner(g, plan, mesh, target, rules_for(g, rules, own), roles).run();
  attach_program_symbols(p, g);
  return p;
}

}  // namespace gspmd
