// The SPMD partitioner (GSPMD paper §3.4): lowers every node of the global graph to local computation on shards,
// inserting reshards (lowered to collectives) where an operand's sharding differs from what the node's factor
// assignment needs. See spmd.h for the program format, program_ops.h for its `gspmd` ops and docs/partitioning.md
// for the design.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/partition/reshard.h"
#include "core/partition/spmd.h"
#include "core/rules/factor_projection.h"
#include "core/rules/rule.h"

namespace gspmd {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Ops whose result is jointly linear in all their operands (a partial sum passes through only when every
/// tensor operand is partial over the same axes).
bool is_additive(const Node& n) {
  return n.domain.empty() && (n.op_type == "Add" || n.op_type == "Sub" || n.op_type == "Sum" ||
                              n.op_type == "Concat");
}

std::string axes_str(const DeviceMesh& mesh, const std::vector<int>& axes) {
  return fmt::format("{{{}}}", fmt::join(mesh.axis_names(axes), ", "));
}

float reduction_identity(ReductionKind k) {
  switch (k) {
    case ReductionKind::kSum: return 0.f;
    case ReductionKind::kProd: return 1.f;
    case ReductionKind::kMax: return -std::numeric_limits<float>::infinity();
    case ReductionKind::kMin: return std::numeric_limits<float>::infinity();
  }
  return 0.f;
}

class Partitioner {
 public:
  Partitioner(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, const Target& target,
              const RuleTable& rules)
      : g_(g), plan_(plan), mesh_(mesh), rules_(rules), planner_(mesh, target), avail_(g.values.size()) {
    out_.mesh = mesh;
    P().name = g.name;
    P().opset = g.opset;
    out_.final_shardings.resize(g.values.size());
    for (size_t v = 0; v < g.values.size(); ++v)
      out_.final_shardings[v] = TensorSharding::replicated(static_cast<int>(g.values[v].shape.size()));
  }

  SpmdProgram run() {
    for (int gv : g_.inputs) {
      TensorSharding s = plan_.shardings[gv];
      if (s.unreduced.empty()) s.reduction = ReductionKind::kSum;
      int lv = new_value(g_.values[gv].name, g_.values[gv].dtype, s.local_shape(g_.values[gv].shape, mesh_));
      P().inputs.push_back(lv);
      out_.inputs.push_back({lv, gv, s});
      bind(gv, s, lv);
    }
    for (int n = 0; n < static_cast<int>(g_.nodes.size()); ++n) lower(n);
    for (int gv : g_.outputs) {
      TensorSharding want = plan_.shardings[gv];
      want.unreduced.clear();
      want.reduction = ReductionKind::kSum;
      int lv = get(gv, want, "", "graph output");
      P().outputs.push_back(lv);
      out_.outputs.push_back({lv, gv, want});
    }
    return std::move(out_);
  }

 private:
  Graph& P() { return out_.program; }

  struct Local {
    TensorSharding sharding;
    int id;
  };

  // ---- values ---------------------------------------------------------------------------------------------
  int new_value(const std::string& hint, DType t, const Shape& s) { return P().add_value_unique(hint, t, s); }

  int new_constant(const std::string& hint, Tensor t) {
    int id = new_value(hint, t.dtype, t.shape);
    P().values[id].is_initializer = true;
    P().values[id].data = std::make_shared<Tensor>(std::move(t));
    return id;
  }

  int int64_const(const std::string& hint, const std::vector<int64_t>& v, bool scalar = false) {
    return new_constant(hint, Tensor::from_int64s(v, scalar));
  }

  void bind(int gv, const TensorSharding& s, int lv) {
    if (avail_[gv].empty()) out_.final_shardings[gv] = s;
    avail_[gv].push_back({s, lv});
  }

  /// The sharding the value has now (its first local representation), or the plan's for unmaterialised
  /// initializers.
  TensorSharding current(int gv) const {
    if (!avail_[gv].empty()) return avail_[gv].front().sharding;
    TensorSharding s = plan_.shardings[gv];
    s.unreduced.clear();
    return s;
  }

  /// Appends `n` (op type, domain and attributes set) reading `inputs`, with one new output value of type t[s].
  int emit(Node n, std::vector<int> inputs, const std::string& out_hint, DType t, Shape s) {
    n.name = fmt::format("{}/{}_{}", out_hint, n.op_type, counter_++);
    n.inputs = std::move(inputs);
    int o = new_value(out_hint, t, s);
    n.outputs = {o};
    P().add_node(std::move(n));
    return o;
  }

  /// Appends a standard ONNX node (domain "") `op` with `attrs`.
  int emit(const std::string& op, std::vector<int> inputs, const std::string& out_hint, DType t, Shape s,
           std::map<std::string, AttrValue> attrs = {}) {
    Node n;
    n.op_type = op;
    n.attrs = std::move(attrs);
    return emit(std::move(n), std::move(inputs), out_hint, t, std::move(s));
  }

  /// Appends the collective `a` on local value `x` (its result has `out_shape`) and records it, for global value
  /// `gv` needed by `for_node`, in SpmdProgram::collectives.
  int collective(const CollectiveAttrs& a, int x, Shape out_shape, const std::string& for_node, int gv,
                 const std::string& reason) {
    const DType dt = P().values[x].dtype;
    const int64_t in_elems = num_elements(P().values[x].shape);
    int o = emit(gspmd_node(a), {x}, g_.values[gv].name, dt, out_shape);
    CollectiveRecord r;
    r.node = static_cast<int>(P().nodes.size()) - 1;
    r.kind = a.kind;
    r.mesh_axes = a.mesh_axes;
    r.bytes = std::max(in_elems, num_elements(out_shape)) * static_cast<int64_t>(dtype_size(dt));
    r.for_node = for_node;
    r.value = g_.values[gv].name;
    r.reason = reason;
    out_.collectives.push_back(std::move(r));
    return o;
  }

  // ---- resharding -------------------------------------------------------------------------------------------

  /// Local id of global value gv with sharding `want`; inserts collectives / local slices as needed (memoised).
  int get(int gv, TensorSharding want, const std::string& for_node, const std::string& why) {
    if (want.unreduced.empty()) want.reduction = ReductionKind::kSum;  // a full value has no reduction kind
    for (const Local& l : avail_[gv])
      if (l.sharding == want) return l.id;
    const Value& v = g_.values[gv];
    if (avail_[gv].empty()) {
      if (!v.is_initializer) throw std::logic_error(fmt::format("value '{}' used before it is computed", v.name));
      // Weights are sliced when loaded: any sharding is free.
      int lv = new_value(v.name, v.dtype, want.local_shape(v.shape, mesh_));
      P().values[lv].is_initializer = true;
      out_.params.push_back({lv, gv, want});
      bind(gv, want, lv);
      return lv;
    }
    if (v.is_initializer && want.unreduced.empty()) {
      int lv = new_value(v.name, v.dtype, want.local_shape(v.shape, mesh_));
      P().values[lv].is_initializer = true;
      out_.params.push_back({lv, gv, want});
      avail_[gv].push_back({want, lv});
      return lv;
    }
    const Local& from = avail_[gv].front();
    int lv = reshard(gv, from.id, from.sharding, want, for_node, why);
    avail_[gv].push_back({want, lv});
    return lv;
  }

  /// Emits the planner's cheapest step sequence from `cur` to `want` (core/partition/reshard.h).
  int reshard(int gv, int x, const TensorSharding& cur, const TensorSharding& want, const std::string& for_node,
              const std::string& why) {
    const Value& v = g_.values[gv];
    for (int a : want.unreduced)
      if (std::find(cur.unreduced.begin(), cur.unreduced.end(), a) == cur.unreduced.end())
        throw std::logic_error(fmt::format("cannot make '{}' unreduced by resharding", v.name));
    const ReshardPlan& plan = planner_.plan(v.shape, static_cast<int64_t>(dtype_size(v.dtype)), cur, want);
    TensorSharding at = cur;
    for (const ReshardStep& st : plan.steps) {
      const Shape out = st.after.local_shape(v.shape, mesh_);
      const auto d = int64_t{st.dim};
      switch (st.kind) {
        case ReshardStep::Kind::kAllReduce:
        case ReshardStep::Kind::kReduceScatter: {
          std::string reason = fmt::format("'{}' is unreduced over {}; {}", v.name, axes_str(mesh_, st.axes), why);
          if (st.kind == ReshardStep::Kind::kAllReduce)
            x = collective({.kind = Collective::kAllReduce, .mesh_axes = st.axes, .reduction = at.reduction}, x, out,
                           for_node, gv, reason);
          else
            x = collective({.kind = Collective::kReduceScatter, .mesh_axes = st.axes, .reduction = at.reduction,
                            .axis = d},
                           x, out, for_node, gv, reason);
          break;
        }
        case ReshardStep::Kind::kAllToAll:
          x = collective({.kind = Collective::kAllToAll, .mesh_axes = st.axes, .split_axis = st.dim2,
                          .concat_axis = d},
                         x, out, for_node, gv,
                         fmt::format("'{}' moves its {} split from dim {} to dim {}; {}", v.name,
                                     axes_str(mesh_, st.axes), st.dim, st.dim2, why));
          break;
        case ReshardStep::Kind::kAllGather: {
          Shape s = P().values[x].shape;
          s[st.dim] *= mesh_.axes_size(st.axes);
          x = collective({.kind = Collective::kAllGather, .mesh_axes = st.axes, .axis = d}, x, s, for_node, gv,
                         fmt::format("'{}' dim {} is split over {} but {}", v.name, st.dim, axes_str(mesh_, st.axes),
                                     why));
          if (st.trim)  // drop the padding of the last shard
            x = emit("Slice", {x, int64_const("starts", {0}), int64_const("ends", {v.shape[st.dim]}),
                               int64_const("axes", {d})},
                     v.name, v.dtype, out);
          break;
        }
        case ReshardStep::Kind::kSlice:
          x = emit(gspmd_node(ShardSliceAttrs{.axis = d, .mesh_axes = st.axes, .shard_size = out[st.dim]}), {x},
                   v.name, v.dtype, out);
          break;
        case ReshardStep::Kind::kPermute:
          x = collective({.kind = Collective::kCollectivePermute, .mesh_axes = st.axes, .target_axes = st.target_axes},
                         x, out, for_node, gv,
                         fmt::format("'{}' goes from {} to {} (same shard shape, other devices); {}", v.name,
                                     at.to_partition_spec(mesh_), st.after.to_partition_spec(mesh_), why));
          break;
      }
      at = st.after;
    }
    return x;
  }

  // ---- node lowering ----------------------------------------------------------------------------------------

  /// Drops assignments that a local computation cannot express: axes on kNeedReplication / kPermutation
  /// factors, a minor factor of a merged dim split while a more major factor is not fully split, and splits
  /// of merged-dim factors that do not divide evenly (a local reshape would mix shards).
  void sanitize(const OpShardingRule& rule, FactorSharding& F) const {
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

  /// Grouped convolutions: the factor of the groups (major in X's channel dim), or -1.
  static int conv_group_factor(const Node& node, const OpShardingRule& rule) {
    const int64_t groups = node.domain.empty() ? node.i("group", 1) : 1;
    if (groups > 1 && rule.operands[0].size() > 1 && !rule.operands[0][1].empty() &&
        rule.factor_sizes[rule.operands[0][1][0]] == groups)
      return rule.operands[0][1][0];
    return -1;
  }

  /// The node's present operands (their current shardings) and results (their planned shardings) projected onto
  /// the factors of `rule`; `operands` and `results` hold their tensor indices in the projection.
  struct NodeProjection {
    FactorProjection proj;
    std::vector<int> operands, results;
  };
  NodeProjection project(const Node& node, const OpShardingRule& rule) const {
    NodeProjection p{FactorProjection(rule, mesh_, node.inputs.size() + node.outputs.size()), {}, {}};
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (node.inputs[i] >= 0) p.operands.push_back(p.proj.add(current(node.inputs[i]), rule.operands[i]));
    for (size_t r = 0; r < node.outputs.size(); ++r)
      if (node.outputs[r] >= 0) p.results.push_back(p.proj.add(plan_.shardings[node.outputs[r]], rule.results[r]));
    return p;
  }

  /// The mesh axes of every factor of `node`'s local computation. First a reduction factor that every operand splits
  /// the same way (row-parallel MatMul: reduce the result afterwards rather than move the operands); then the
  /// results' planned shardings and the operands' current ones, results first or operands first, merged "first come,
  /// whole factor" (FactorProjection::merge_first_come): each factor takes the axes of the first tensor that splits
  /// it, while they are free.
  /// `used` receives the mesh axes the offers took (sanitize may clear a factor, never its axes).
  FactorSharding choose_factors(const Node& node, const OpShardingRule& rule, const NodeProjection& p,
                                bool results_first, std::vector<char>& used) {
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
    // Ops whose operands carry no factor (Range, ConstantOfShape) generate their whole result: keep it whole.
    if (std::all_of(rule.operands.begin(), rule.operands.end(), [](const DimFactors& df) {
          return std::all_of(df.begin(), df.end(), [](const std::vector<int>& d) { return d.empty(); });
        }))
      for (auto& axes : F) axes.clear();
    if (const int gf = conv_group_factor(node, rule); gf >= 0 && node.i("group", 1) % mesh_.axes_size(F[gf]) != 0)
      F[gf].clear();
    return F;
  }

  /// The mesh axes of F's reduction factors: the axes a result computed with F is unreduced over.
  static std::vector<int> reduction_axes(const OpShardingRule& rule, const FactorSharding& F) {
    std::vector<int> axes;
    for (int f = 0; f < rule.num_factors(); ++f)
      if (rule.factor_kinds[f] == FactorKind::kReduction) axes.insert(axes.end(), F[f].begin(), F[f].end());
    return axes;
  }

  /// Estimated seconds of the reshards that computing `node` with factor shardings F needs: every operand from its
  /// current sharding to F's, every result from F's to its plan (an impossible reshard counts as infinite).
  double reshard_seconds(const Node& node, const OpShardingRule& rule, const FactorSharding& F) {
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

  void lower(int n) {
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
    if (lower_split_softmax(n) || lower_split_layer_norm(n)) return;
    const int nf = rule->num_factors();
    std::vector<char> used, used_g;
    const NodeProjection projection = project(node, *rule);
    FactorSharding F = choose_factors(node, *rule, projection, /*results_first=*/true, used);
    // GSPMD's einsum strategies (§3.3): computing in the results' sharding moves the operands; computing in the
    // operands' sharding moves the results instead. Take the second when its reshards are cheaper (e.g. GShard's
    // dispatch: tokens split by group in, experts split out: one all-to-all of the result, not a gather of the
    // tokens). Windowed ops keep the first (their halos are planned from it).
    // Partial operands keep the first too (whether they stay unreduced is decided below, from F).
    const bool partial = std::any_of(node.inputs.begin(), node.inputs.end(),
                                     [&](int v) { return v >= 0 && !current(v).unreduced.empty(); });
    if (!partial && std::none_of(rule->factor_kinds.begin(), rule->factor_kinds.end(),
                                 [](FactorKind k) { return k == FactorKind::kWindowed; })) {
      FactorSharding G = choose_factors(node, *rule, projection, /*results_first=*/false, used_g);
      if (G != F && reshard_seconds(node, *rule, G) < 0.999 * reshard_seconds(node, *rule, F)) {
        F = std::move(G);
        used = std::move(used_g);
      }
    }

    const int group_factor = conv_group_factor(node, *rule);
    const int64_t groups = group_factor >= 0 ? node.i("group", 1) : 1;
    std::vector<Window> windows = plan_windows(node, *rule, F);
    std::vector<int> bias_ops = plan_bias_operands(node, *rule, F);

    // Partial operands: keep them partial when the op is linear in them, else reduce.
    std::vector<int> partial_ops;
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (node.inputs[i] >= 0 && !current(node.inputs[i]).unreduced.empty()) partial_ops.push_back(static_cast<int>(i));
    std::vector<int> keep_unreduced;
    if (!partial_ops.empty()) {
      TensorSharding first = current(node.inputs[partial_ops[0]]);
      bool same = std::all_of(partial_ops.begin(), partial_ops.end(), [&](int i) {
        TensorSharding s = current(node.inputs[i]);
        return s.unreduced == first.unreduced && s.reduction == ReductionKind::kSum;
      });
      bool linear = std::all_of(partial_ops.begin(), partial_ops.end(), [&](int i) {
        return i < static_cast<int>(rule->linear_operands.size()) && rule->linear_operands[i];
      });
      // Additive ops (every input is data, scalars included) keep a partial sum only if every input is partial.
      size_t tensor_operands = 0;
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (node.inputs[i] >= 0) ++tensor_operands;
      bool shape_ok = is_additive(node) ? partial_ops.size() == tensor_operands : partial_ops.size() == 1;
      bool axes_free = std::none_of(first.unreduced.begin(), first.unreduced.end(), [&](int a) { return used[a]; });
      bool reduction_free = true;
      for (int f = 0; f < nf; ++f)
        if (rule->factor_kinds[f] == FactorKind::kReduction && !F[f].empty()) reduction_free = false;
      if (same && linear && shape_ok && axes_free && reduction_free) keep_unreduced = first.unreduced;
    }
    for (int a : keep_unreduced) used[a] = 1;

    if (node.domain.empty() && node.op_type == "Gather" && is_split_reduction(*rule, F)) {
      lower_gather(n, *rule, F);
      return;
    }

    // Operands.
    std::vector<int> inputs;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int gv = node.inputs[i];
      if (gv < 0) {
        inputs.push_back(-1);
        continue;
      }
      if (i == 1 && node.domain.empty() && (node.op_type == "Reshape" || node.op_type == "Expand")) {
        inputs.push_back(-1);  // replaced by the local shape in rewrite_shape_operands
        continue;
      }
      const DimFactors& df = rule->operands[i];
      TensorSharding want = df.empty() || static_cast<int>(df.size()) != static_cast<int>(g_.values[gv].shape.size())
                                ? TensorSharding::replicated(static_cast<int>(g_.values[gv].shape.size()))
                                : sharding_from_factors(F, df);
      if (!keep_unreduced.empty() && std::find(partial_ops.begin(), partial_ops.end(), static_cast<int>(i)) != partial_ops.end())
        want.unreduced = keep_unreduced;
      std::string why = fmt::format("{} ({}) needs operand {} as {}", node.name, node.op_type, i,
                                    want.to_partition_spec(mesh_));
      int lv = get(gv, want, node.name, why);
      // Uneven split reduction dims: mask the padding with the reduction's identity.
      for (size_t d = 0; d < df.size(); ++d)
        for (int f : df[d])
          if (rule->factor_kinds[f] == FactorKind::kReduction && !F[f].empty() &&
              g_.values[gv].shape[d] % mesh_.axes_size(F[f]) != 0)
            lv = emit(gspmd_node(MaskPadAttrs{.axis = int64_t(d),
                                              .mesh_axes = F[f],
                                              .full_size = g_.values[gv].shape[d],
                                              .value = reduction_identity(rule->reduction)}),
                      {lv}, g_.values[gv].name, P().values[lv].dtype, P().values[lv].shape);
      if (std::find(bias_ops.begin(), bias_ops.end(), static_cast<int>(i)) != bias_ops.end())
        lv = keep_on_first_tile(lv, *rule, F, g_.values[gv].name);
      inputs.push_back(lv);
    }
    if (!windows.empty()) inputs[0] = exchange_halos(node, inputs[0], windows);

    // Results.
    const std::vector<int> red_axes = reduction_axes(*rule, F);
    Node local = node;
    local.inputs = inputs;
    local.outputs.clear();
    std::vector<TensorSharding> result_shardings;
    for (size_t r = 0; r < node.outputs.size(); ++r) {
      const Value& gvv = g_.values[node.outputs[r]];
      TensorSharding s = rule->results[r].size() == gvv.shape.size() ? sharding_from_factors(F, rule->results[r])
                                                                      : TensorSharding::replicated(static_cast<int>(gvv.shape.size()));
      s.unreduced = keep_unreduced;
      s.unreduced.insert(s.unreduced.end(), red_axes.begin(), red_axes.end());
      std::sort(s.unreduced.begin(), s.unreduced.end());
      // kept partials are sums (only sums pass through linear ops); split reduction factors give the rule's kind
      s.reduction = red_axes.empty() ? ReductionKind::kSum : rule->reduction;
      local.outputs.push_back(new_value(gvv.name, gvv.dtype, s.local_shape(gvv.shape, mesh_)));
      result_shardings.push_back(s);
    }
    rewrite_shape_operands(local, node);
    if (!windows.empty()) set_window_attrs(local, node, windows);
    if (group_factor >= 0) local.attrs["group"] = groups / mesh_.axes_size(F[group_factor]);
    P().add_node(std::move(local));
    const std::vector<int> local_outs = P().nodes.back().outputs;
    // A mean over split reduction factors: each device averaged its (zero-padded) shard; rescale so that the
    // partial results sum to the global mean.
    double mean_scale = 1.0;
    if (rule->mean)
      for (int f = 0; f < nf; ++f)
        if (rule->factor_kinds[f] == FactorKind::kReduction && !F[f].empty())
          mean_scale *= static_cast<double>(ceil_div(rule->factor_sizes[f], mesh_.axes_size(F[f]))) /
                        static_cast<double>(rule->factor_sizes[f]);
    for (size_t r = 0; r < node.outputs.size(); ++r) {
      int out = local_outs[r];
      if (mean_scale != 1.0) {
        const Value& gvv = g_.values[node.outputs[r]];
        Tensor scale(gvv.dtype, {});
        if (gvv.dtype == DType::kFloat64) scale.data<double>()[0] = mean_scale;
        else if (gvv.dtype == DType::kFloat32) scale.data<float>()[0] = static_cast<float>(mean_scale);
        else throw UnsupportedError(fmt::format("{} ({}): mean of {} over a split dim", node.name, node.op_type,
                                                dtype_name(gvv.dtype)));
        out = emit("Mul", {out, new_constant("mean_scale", std::move(scale))}, gvv.name, gvv.dtype,
                   P().values[out].shape);
      }
      bind(node.outputs[r], result_shardings[r], out);
    }
  }

  // ---- Softmax over a split axis: two passes ------------------------------------------------------------------

  /// Softmax / LogSoftmax (opset >= 13) whose operand is split on the softmax axis: local max -> all-reduce max ->
  /// exp -> local sum -> all-reduce sum -> divide (docs/architecture.md, "Factor rules"), with the padding of uneven
  /// shards masked to -inf before the max and to 0 before the sum. The result keeps the operand's sharding.
  /// Returns false when the op is not such a case.
  bool lower_split_softmax(int n) {
    const Node& node = g_.nodes[n];
    const bool log = node.op_type == "LogSoftmax";
    if (!node.domain.empty() || (node.op_type != "Softmax" && !log) || g_.opset < 13) return false;
    const int gx = node.inputs[0];
    const Value& xv = g_.values[gx];
    const int rank = static_cast<int>(xv.shape.size());
    int64_t axis = node.i("axis", -1);
    if (axis < 0) axis += rank;
    TensorSharding s = current(gx);
    if (axis < 0 || axis >= rank || s.dims[axis].empty() || xv.dtype != DType::kFloat32) return false;
    s.unreduced.clear();
    s.reduction = ReductionKind::kSum;
    const std::vector<int> A = s.dims[axis];
    const std::string& on = g_.values[node.outputs[0]].name;
    int x = get(gx, s, node.name, fmt::format("{} ({}) needs its operand reduced", node.name, node.op_type));
    const Shape ls = P().values[x].shape;
    Shape red = ls;
    red[axis] = 1;
    const bool uneven = xv.shape[axis] % mesh_.axes_size(A) != 0;
    auto mask = [&](int v, float value) {
      if (!uneven) return v;
      return emit(gspmd_node(MaskPadAttrs{.axis = axis, .mesh_axes = A, .full_size = xv.shape[axis], .value = value}),
                  {v}, on + "/masked", DType::kFloat32, ls);
    };
    auto reduce = [&](const std::string& op, int v, ReductionKind reduction) {
      const std::string kind(reduction_name(reduction));
      std::vector<int> ins{v};
      std::map<std::string, AttrValue> attrs{{"keepdims", int64_t{1}}};
      if (op == "ReduceSum") ins.push_back(int64_const("axes", {axis}));  // opset 13+: axes is an input
      else attrs["axes"] = std::vector<int64_t>{axis};
      int local = emit(op, ins, on + "/" + kind, DType::kFloat32, red, attrs);
      return collective({.kind = Collective::kAllReduce, .mesh_axes = A, .reduction = reduction}, local, red, node.name,
                        gx,
                        fmt::format("{} ({}) over dim {} split over {}: global {}", node.name, node.op_type, axis,
                                    axes_str(mesh_, A), kind));
    };
    int m = reduce("ReduceMax", mask(x, -std::numeric_limits<float>::infinity()), ReductionKind::kMax);
    int shifted = emit("Sub", {x, m}, on + "/shifted", DType::kFloat32, ls);
    int e = emit("Exp", {shifted}, on + "/exp", DType::kFloat32, ls);
    int sum = reduce("ReduceSum", mask(e, 0.f), ReductionKind::kSum);
    int y = log ? emit("Sub", {shifted, emit("Log", {sum}, on + "/log_sum", DType::kFloat32, red)}, on, DType::kFloat32, ls)
                : emit("Div", {e, sum}, on, DType::kFloat32, ls);
    bind(node.outputs[0], s, y);
    return true;
  }

  /// LayerNormalization (opset 17) whose normalized dims [axis, rank) the operand splits (any of them, over any
  /// axes): local sum -> all-reduce -> mean; local sum of squared deviations -> all-reduce -> variance; then
  /// normalise, scale and shift with Scale/B sliced like the normalized dims. Padding of uneven split dims is masked
  /// to 0 before both sums. The Mean and InvStdDev outputs (shape [..., 1, ..., 1]) keep the leading dims' splits.
  bool lower_split_layer_norm(int n) {
    const Node& node = g_.nodes[n];
    if (!node.domain.empty() || node.op_type != "LayerNormalization" || node.outputs.size() > 3) return false;
    const int gx = node.inputs[0];
    const Value& xv = g_.values[gx];
    const int rank = static_cast<int>(xv.shape.size());
    int64_t axis = node.i("axis", -1);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || xv.dtype != DType::kFloat32) return false;
    TensorSharding s = current(gx);
    std::vector<int64_t> norm_dims;
    std::vector<int> A;  // mesh axes splitting the normalized dims
    int64_t count = 1;
    for (int64_t d = axis; d < rank; ++d) {
      norm_dims.push_back(d);
      A.insert(A.end(), s.dims[d].begin(), s.dims[d].end());
      count *= xv.shape[d];
    }
    if (A.empty()) return false;
    const Shape norm_shape(xv.shape.begin() + axis, xv.shape.end());
    for (size_t i = 1; i < node.inputs.size(); ++i)
      if (node.inputs[i] >= 0 && g_.values[node.inputs[i]].shape != norm_shape) return false;
    for (size_t i = 1; i < node.outputs.size(); ++i)
      if (node.outputs[i] >= 0 && g_.values[node.outputs[i]].dtype != DType::kFloat32) return false;
    std::sort(A.begin(), A.end());
    s.unreduced.clear();
    s.reduction = ReductionKind::kSum;
    const std::string& on = g_.values[node.outputs[0]].name;
    const std::string why = fmt::format("{} (LayerNormalization) normalizes dims {}.. split over {}", node.name, axis,
                                        axes_str(mesh_, A));
    int x = get(gx, s, node.name, why);
    const Shape ls = P().values[x].shape;
    Shape red = ls;
    for (int64_t d : norm_dims) red[d] = 1;
    auto scalar = [&](const std::string& hint, float v) { return new_constant(hint, Tensor::from_floats({}, {v})); };
    auto global_mean = [&](int v, const std::string& what) {
      for (int64_t d : norm_dims) {
        const std::vector<int>& ax = s.dims[d];
        if (ax.empty() || xv.shape[d] % mesh_.axes_size(ax) == 0) continue;
        v = emit(gspmd_node(MaskPadAttrs{.axis = d, .mesh_axes = ax, .full_size = xv.shape[d], .value = 0.f}), {v},
                 on + "/masked", DType::kFloat32, ls);
      }
      int local = emit("ReduceSum", {v, int64_const("axes", norm_dims)}, on + "/" + what, DType::kFloat32, red,
                       {{"keepdims", int64_t{1}}});
      int sum = collective({.kind = Collective::kAllReduce, .mesh_axes = A, .reduction = ReductionKind::kSum}, local,
                           red, node.name, gx, why + ": global " + what);
      return emit("Div", {sum, scalar("count", static_cast<float>(count))}, on + "/" + what, DType::kFloat32, red);
    };
    int mean = global_mean(x, "mean");
    int d = emit("Sub", {x, mean}, on + "/centered", DType::kFloat32, ls);
    int var = global_mean(emit("Mul", {d, d}, on + "/squared", DType::kFloat32, ls), "variance");
    int sd = emit("Sqrt", {emit("Add", {var, scalar("epsilon", node.f("epsilon", 1e-5f))}, on + "/var_eps",
                                DType::kFloat32, red)},
                  on + "/std", DType::kFloat32, red);
    int y = emit("Div", {d, sd}, on + "/normalized", DType::kFloat32, ls);
    TensorSharding param;
    param.dims.assign(s.dims.begin() + axis, s.dims.end());
    if (node.inputs.size() > 1 && node.inputs[1] >= 0)
      y = emit("Mul", {y, get(node.inputs[1], param, node.name, why)}, on + "/scaled", DType::kFloat32, ls);
    if (node.inputs.size() > 2 && node.inputs[2] >= 0)
      y = emit("Add", {y, get(node.inputs[2], param, node.name, why)}, on, DType::kFloat32, ls);
    bind(node.outputs[0], s, y);
    TensorSharding stat = s;  // [..., 1, ..., 1]: the normalized dims are whole
    for (int64_t nd : norm_dims) stat.dims[nd].clear();
    if (node.outputs.size() > 1 && node.outputs[1] >= 0) bind(node.outputs[1], stat, mean);
    if (node.outputs.size() > 2 && node.outputs[2] >= 0)
      bind(node.outputs[2], stat, emit("Reciprocal", {sd}, g_.values[node.outputs[2]].name, DType::kFloat32, red));
    return true;
  }

  // ---- split reductions with an added operand (Gemm's C, Conv's B) ----------------------------------------------

  /// A split reduction factor makes every device compute a partial result; an operand that does not index the
  /// factor would then be counted once per device. Biases (Gemm's C, Conv's B) are added, so they are kept on the
  /// first tile of the reduction axes only and zero elsewhere; for any other such operand the factor is not split.
  std::vector<int> plan_bias_operands(const Node& node, const OpShardingRule& rule, FactorSharding& F) const {
    std::vector<int> bias;
    if (node.domain.empty() && node.op_type == "Gather") return bias;  // masked lookup: lower_gather
    for (int f = 0; f < rule.num_factors(); ++f) {
      if (rule.factor_kinds[f] != FactorKind::kReduction || F[f].empty()) continue;
      for (size_t i = 0; i < node.inputs.size() && !F[f].empty(); ++i) {
        const DimFactors& df = rule.operands[i];
        if (node.inputs[i] < 0 || df.empty()) continue;
        bool indexes = std::any_of(df.begin(), df.end(), [&](const std::vector<int>& d) {
          return std::find(d.begin(), d.end(), f) != d.end();
        });
        if (indexes) continue;
        bool is_bias = node.domain.empty() && i == 2 && (node.op_type == "Gemm" || node.op_type == "Conv") &&
                       rule.reduction == ReductionKind::kSum && !g_.values[node.inputs[i]].shape.empty();
        if (!is_bias) {
          F[f].clear();
        } else if (std::find(bias.begin(), bias.end(), static_cast<int>(i)) == bias.end()) {
          bias.push_back(static_cast<int>(i));
        }
      }
    }
    return bias;
  }

  /// Zeroes `x` on every device but the first tile of the split reduction axes (so the partial sums add it once).
  int keep_on_first_tile(int x, const OpShardingRule& rule, const FactorSharding& F, const std::string& name) {
    std::vector<int> axes;
    for (int f = 0; f < rule.num_factors(); ++f)
      if (rule.factor_kinds[f] == FactorKind::kReduction) axes.insert(axes.end(), F[f].begin(), F[f].end());
    if (axes.empty()) return x;
    std::sort(axes.begin(), axes.end());
    const int64_t rows = P().values[x].shape[0];
    return emit(gspmd_node(MaskPadAttrs{.axis = 0, .mesh_axes = axes, .full_size = rows, .value = 0.f, .base = 0,
                                        .step = rows}),
                {x}, name + "/first_tile", P().values[x].dtype, P().values[x].shape);
  }

  // ---- windowed ops: halo exchange (GSPMD §3.4) -------------------------------------------------------------

  /// How one split spatial dim of a Conv/pool is computed. Device t (tile over `axes`, n tiles) holds input
  /// rows [t*h_loc, (t+1)*h_loc) and computes output rows [t*o_loc, (t+1)*o_loc), which read input rows
  /// [t*o_loc*stride - pad_begin, ... + window). It receives `left` rows from tile t-1 and `right` rows from
  /// tile t+1 (collective-permute), then takes its window at offset base + t*step of [left | local | right].
  struct Window {
    int dim = 0;                      // tensor dim of X and Y
    std::vector<int> axes;
    int64_t full = 0, n = 1, h_loc = 0, o_loc = 0, stride = 1, pad_begin = 0, window = 0;
    int64_t left = 0, right = 0, base = 0, step = 0;
    float pad_value = 0.f;            // what rows outside [0, full) read as: 0 (Conv, AveragePool) or -inf (MaxPool)
  };

  /// Kernel extent, stride and begin padding of spatial dim `sd` of a Conv/pool node, with auto_pad resolved
  /// against the global output size (ONNX Conv / MaxPool specs).
  struct SpatialParams {
    int64_t extent, stride, pad_begin, pad_end;
  };
  SpatialParams spatial_params(const Node& node, int sd) const {
    const Shape& xs = g_.values[node.inputs[0]].shape;
    const Shape& ys = g_.values[node.outputs[0]].shape;
    const size_t k = xs.size() - 2;
    std::vector<int64_t> kernel = node.ints("kernel_shape");
    if (kernel.empty() && node.op_type == "Conv") {
      const Shape& ws = g_.values[node.inputs[1]].shape;
      kernel.assign(ws.begin() + 2, ws.end());
    }
    std::vector<int64_t> strides = node.ints("strides", std::vector<int64_t>(k, 1));
    std::vector<int64_t> dil = node.ints("dilations", std::vector<int64_t>(k, 1));
    std::vector<int64_t> pads = node.ints("pads", std::vector<int64_t>(2 * k, 0));
    SpatialParams p{(kernel.at(sd) - 1) * dil.at(sd) + 1, strides.at(sd), pads.at(sd), pads.at(k + sd)};
    const std::string ap = node.s("auto_pad", "NOTSET");
    if (ap == "VALID") {
      p.pad_begin = p.pad_end = 0;
    } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      int64_t total = std::max<int64_t>(0, (ys[2 + sd] - 1) * p.stride + p.extent - xs[2 + sd]);
      p.pad_begin = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      p.pad_end = total - p.pad_begin;
    }
    return p;
  }

  /// Plans the halo exchange of every split windowed factor; a split it cannot do exactly (halo wider than a
  /// neighbour's shard, AveragePool excluding padding from its count) is dropped with a warning, so that dim
  /// is gathered instead.
  std::vector<Window> plan_windows(const Node& node, const OpShardingRule& rule, FactorSharding& F) {
    std::vector<Window> out;
    if (rule.operands.empty()) return out;
    const DimFactors& xf = rule.operands[0];
    for (size_t d = 0; d < xf.size(); ++d) {
      if (xf[d].size() != 1) continue;
      const int f = xf[d][0];
      if (rule.factor_kinds[f] != FactorKind::kWindowed || F[f].empty()) continue;
      Window w;
      w.dim = static_cast<int>(d);
      w.axes = F[f];
      w.full = g_.values[node.inputs[0]].shape[d];
      w.n = mesh_.axes_size(w.axes);
      w.h_loc = ceil_div(w.full, w.n);
      w.o_loc = ceil_div(g_.values[node.outputs[0]].shape[d], w.n);
      SpatialParams sp = spatial_params(node, static_cast<int>(d) - 2);
      w.stride = sp.stride;
      w.pad_begin = sp.pad_begin;
      w.window = (w.o_loc - 1) * w.stride + sp.extent;
      // Offsets are linear in t, so the extreme halos are at t = 0 or t = n - 1.
      const int64_t drift = w.o_loc * w.stride - w.h_loc;  // how much further each tile's window starts
      w.left = std::max<int64_t>({0, w.pad_begin, w.pad_begin - (w.n - 1) * drift});
      w.right = std::max<int64_t>({0, w.window - w.pad_begin - w.h_loc, (w.n - 1) * drift + w.window - w.pad_begin - w.h_loc});
      w.base = w.left - w.pad_begin;
      w.step = drift;
      w.pad_value = node.op_type == "MaxPool" ? -std::numeric_limits<float>::infinity() : 0.f;
      const int64_t lowest = -w.pad_begin, highest = (w.n - 1) * w.o_loc * w.stride - w.pad_begin + w.window - 1;
      const bool reads_outside = lowest < 0 || highest >= w.full;
      std::string problem;
      if (w.left > w.h_loc || w.right > w.h_loc)
        problem = fmt::format("its halo ({} + {} rows) is wider than a shard ({} rows)", w.left, w.right, w.h_loc);
      else if (node.op_type == "AveragePool" && node.i("count_include_pad", 0) == 0 && reads_outside)
        problem = "AveragePool with count_include_pad=0 counts only real rows";
      else if (node.op_type == "AveragePool" && (lowest < -sp.pad_begin || highest >= w.full + sp.pad_end))
        problem = "AveragePool windows run past the padding (ceil_mode)";
      if (!problem.empty()) {
        out_.warnings.push_back(fmt::format("{} ({}): dim {} of '{}' is gathered instead of split over {}: {}",
                                            node.name, node.op_type, d, g_.values[node.inputs[0]].name,
                                            axes_str(mesh_, w.axes), problem));
        F[f].clear();
        continue;
      }
      out.push_back(std::move(w));
    }
    return out;
  }

  /// Builds each device's input window: halos from both neighbours, the window at the device's offset, and
  /// rows outside the global input masked with the op's padding value.
  int exchange_halos(const Node& node, int x, const std::vector<Window>& windows) {
    const int gx = node.inputs[0];
    const std::string& name = g_.values[gx].name;
    for (const Window& w : windows) {
      const DType dt = P().values[x].dtype;
      auto rows = [&](int64_t from, int64_t to) {
        Shape s = P().values[x].shape;
        s[w.dim] = to - from;
        return emit("Slice", {x, int64_const("starts", {from}), int64_const("ends", {to}), int64_const("axes", {w.dim})},
                    name + "/halo", dt, s);
      };
      auto permute = [&](int v, int64_t shift, const std::string& side) {
        return collective({.kind = Collective::kCollectivePermute, .mesh_axes = w.axes, .shift = shift}, v,
                          P().values[v].shape, node.name, gx,
                          fmt::format("{} ({}) reads {} rows of '{}' dim {} from its {} neighbour over {} (halo)",
                                      node.name, node.op_type, P().values[v].shape[w.dim], name, w.dim, side,
                                      axes_str(mesh_, w.axes)));
      };
      std::vector<int> parts;
      if (w.left > 0) parts.push_back(permute(rows(w.h_loc - w.left, w.h_loc), 1, "left"));
      parts.push_back(x);
      if (w.right > 0) parts.push_back(permute(rows(0, w.right), -1, "right"));
      if (parts.size() > 1) {
        Shape s = P().values[x].shape;
        s[w.dim] = w.left + w.h_loc + w.right;
        x = emit("Concat", parts, name + "/window", dt, s, {{"axis", int64_t{w.dim}}});
      }
      if (w.base != 0 || w.step != 0 || w.window != w.left + w.h_loc + w.right) {
        Shape s = P().values[x].shape;
        s[w.dim] = w.window;
        x = emit(gspmd_node(ShardSliceAttrs{
                     .axis = w.dim, .mesh_axes = w.axes, .shard_size = w.step, .base = w.base, .size = w.window}),
                 {x}, name + "/window", dt, s);
      }
      const int64_t lowest = -w.pad_begin, highest = (w.n - 1) * w.o_loc * w.stride - w.pad_begin + w.window - 1;
      if (lowest < 0 || highest >= w.full)
        x = emit(gspmd_node(MaskPadAttrs{.axis = w.dim,
                                         .mesh_axes = w.axes,
                                         .full_size = w.full,
                                         .value = w.pad_value,
                                         .base = -w.pad_begin,
                                         .step = w.o_loc * w.stride}),
                 {x}, name + "/window", dt, P().values[x].shape);
    }
    return x;
  }

  /// The local op reads exactly its window: no padding on the split dims, the global pads (auto_pad resolved)
  /// on the others.
  void set_window_attrs(Node& local, const Node& global, const std::vector<Window>& windows) const {
    const size_t nsp = g_.values[global.inputs[0]].shape.size() - 2;
    std::vector<int64_t> pads(2 * nsp, 0);
    for (size_t sd = 0; sd < nsp; ++sd) {
      SpatialParams sp = spatial_params(global, static_cast<int>(sd));
      pads[sd] = sp.pad_begin;
      pads[nsp + sd] = sp.pad_end;
    }
    for (const Window& w : windows) pads[w.dim - 2] = pads[nsp + w.dim - 2] = 0;
    local.attrs["pads"] = pads;
    local.attrs.erase("auto_pad");
  }

  bool is_split_reduction(const OpShardingRule& rule, const FactorSharding& F) const {
    for (int f = 0; f < rule.num_factors(); ++f)
      if (rule.factor_kinds[f] == FactorKind::kReduction && !F[f].empty()) return true;
    return false;
  }

  /// Shape operands that describe the result (Reshape's and Expand's `shape`) become the local result shape.
  void rewrite_shape_operands(Node& local, const Node& global) {
    if (!global.domain.empty()) return;
    if ((global.op_type == "Reshape" || global.op_type == "Expand") && local.inputs.size() >= 2) {
      const Shape ls = P().values[local.outputs[0]].shape;
      local.inputs[1] = int64_const(global.op_type == "Reshape" ? "shape" : "expand_shape", ls);
      // The local shape is literal: a 0 in it means an empty dim (allowzero, opset 14+), never "copy the input's".
      if (global.op_type == "Reshape") {
        local.attrs.erase("allowzero");
        if (g_.opset >= 14 && std::find(ls.begin(), ls.end(), 0) != ls.end()) local.attrs["allowzero"] = int64_t{1};
      }
    }
    // Squeeze without axes squeezes every size-1 dim; a local shard may have more of them, so name the global ones.
    if (global.op_type == "Squeeze" && (global.inputs.size() < 2 || global.inputs[1] < 0) && !global.has("axes")) {
      std::vector<int64_t> axes;
      const Shape& gs = g_.values[global.inputs[0]].shape;
      for (size_t d = 0; d < gs.size(); ++d)
        if (gs[d] == 1) axes.push_back(static_cast<int64_t>(d));
      if (g_.opset >= 13) local.inputs = {local.inputs[0], int64_const("axes", axes)};
      else local.attrs["axes"] = axes;
    }
  }

  /// Vocab-parallel lookup (Megatron): each device looks up only the rows it holds, zeroes the rest; the
  /// result is unreduced (sum) over the table's split axes.
  void lower_gather(int n, const OpShardingRule& rule, const FactorSharding& F) {
    const Node& node = g_.nodes[n];
    const int gtable = node.inputs[0], gids = node.inputs[1];
    const Value& tv = g_.values[gtable];
    const int64_t axis_attr = node.i("axis", 0);
    const int rank = static_cast<int>(tv.shape.size());
    const int axis = static_cast<int>(axis_attr < 0 ? axis_attr + rank : axis_attr);
    int vf = -1;
    for (int f : rule.operands[0][axis]) vf = f;
    const std::vector<int>& A = F[vf];
    std::string why = fmt::format("{} (Gather) looks up a table split over {}", node.name, axes_str(mesh_, A));
    int table = get(gtable, sharding_from_factors(F, rule.operands[0]), node.name, why);
    int ids = get(gids, sharding_from_factors(F, rule.operands[1]), node.name, why);
    const std::string& on = g_.values[node.outputs[0]].name;
    const Shape ids_shape = P().values[ids].shape;
    if (P().values[ids].dtype != DType::kInt64)
      ids = emit("Cast", {ids}, on + "/ids", DType::kInt64, ids_shape, {{"to", int64_t(DType::kInt64)}});
    const int64_t shard = P().values[table].shape[axis];
    int off = emit(gspmd_node(PartitionOffsetAttrs{.mesh_axes = A, .shard_size = shard}), {}, on + "/offset",
                   DType::kInt64, {});
    // Negative ids count from the end of the table (ONNX Gather): make them positive first.
    const int64_t vocab = tv.shape[axis];
    int neg = emit("Less", {ids, int64_const("zero", {0}, true)}, on + "/negative", DType::kBool, ids_shape);
    int wrapped = emit("Add", {ids, int64_const("vocab", {vocab}, true)}, on + "/wrapped", DType::kInt64, ids_shape);
    ids = emit("Where", {neg, wrapped, ids}, on + "/ids", DType::kInt64, ids_shape);
    int li = emit("Sub", {ids, off}, on + "/local_ids", DType::kInt64, ids_shape);
    int ge = emit("GreaterOrEqual", {li, int64_const("zero", {0}, true)}, on + "/ge", DType::kBool, ids_shape);
    int lt = emit("Less", {li, int64_const("shard", {shard}, true)}, on + "/lt", DType::kBool, ids_shape);
    int valid = emit("And", {ge, lt}, on + "/valid", DType::kBool, ids_shape);
    int safe = emit("Where", {valid, li, int64_const("zero", {0}, true)}, on + "/safe_ids", DType::kInt64, ids_shape);
    TensorSharding rs = sharding_from_factors(F, rule.results[0]);
    const Value& ov = g_.values[node.outputs[0]];
    Shape ls = rs.local_shape(ov.shape, mesh_);
    Node local = node;
    local.inputs = {table, safe};
    int looked = new_value(on + "/lookup", ov.dtype, ls);
    local.outputs = {looked};
    P().add_node(std::move(local));
    // valid [ids...] -> broadcastable to [data[:axis], ids..., data[axis+1:]]
    std::vector<int64_t> unsq;
    for (int d = 0; d < axis; ++d) unsq.push_back(d);
    const int q = static_cast<int>(ids_shape.size());
    for (int d = axis + q; d < static_cast<int>(ls.size()); ++d) unsq.push_back(d);
    int mask = valid;
    if (!unsq.empty()) {
      Shape ms(ls.size(), 1);
      for (int d = 0; d < q; ++d) ms[axis + d] = ids_shape[d];
      mask = emit("Unsqueeze", {valid, int64_const("axes", unsq)}, on + "/mask", DType::kBool, ms);
    }
    Tensor zero(ov.dtype, {});
    int out = emit("Where", {mask, looked, new_constant("zero", std::move(zero))}, on, ov.dtype, ls);
    rs.unreduced = A;
    std::sort(rs.unreduced.begin(), rs.unreduced.end());
    rs.reduction = ReductionKind::kSum;
    bind(node.outputs[0], rs, out);
  }

  /// No rule (or no way to split): gather every operand, compute the whole op on every device.
  void lower_replicated(int n, const std::string& why) {
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

  const Graph& g_;
  const ShardingPlan& plan_;
  const DeviceMesh& mesh_;
  const RuleTable& rules_;
  SpmdProgram out_;
  ReshardPlanner planner_;
  std::vector<std::vector<Local>> avail_;  // per global value: its local representations, first = primary
  int counter_ = 0;
};

}  // namespace

SpmdProgram partition(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, const Target& target,
                      const RuleTable* rules) {
  if (plan.shardings.size() != g.values.size())
    throw std::invalid_argument("partition: the plan has no sharding for some values");
  std::optional<RuleTable> own;
  return Partitioner(g, plan, mesh, target, rules_for(g, rules, own)).run();
}

}  // namespace gspmd
