// The partitioner's values (core/partition/partitioner.h): the program under construction (constants, bindings,
// emitted nodes and collectives) and each global value's local copies, resharded on demand (GSPMD paper §3.4.1;
// the reshard planner is reshard.h).
#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/cost/cost.h"
#include "core/partition/partitioner.h"

namespace gspmd::partition_internal {

// ---- values -----------------------------------------------------------------------------------------------------

int Partitioner::new_constant(const std::string& hint, Tensor t) {
  int id = new_value(hint, t.dtype, t.shape);
  P().values[id].is_initializer = true;
  P().values[id].data = std::make_shared<Tensor>(std::move(t));
  return id;
}

int Partitioner::int64_const(const std::string& hint, const std::vector<int64_t>& v, bool scalar) {
  return new_constant(hint, Tensor::from_int64s(v, scalar));
}

int Partitioner::int64_const(const std::string& hint, const std::vector<DimExpr>& e, const std::vector<int64_t>& v) {
  const int id = int64_const(hint, v);
  if (std::any_of(e.begin(), e.end(), [](const DimExpr& x) { return !x.is_constant(); }))
    P().values[static_cast<size_t>(id)].sym =
        std::make_shared<const SymbolicValue>(SymbolicValue{{DimExpr(static_cast<int64_t>(e.size()))}, e});
  return id;
}

int Partitioner::runtime_size(const std::string& hint, const DimExpr& e, DType dt) {
  const int c = int64_const(hint, std::vector<DimExpr>{e}, {e.eval(g_.dim_hints)});
  return emit("Cast", {c}, hint + "_f", dt, {1}, {{"to", static_cast<int64_t>(dt)}});
}

int Partitioner::to_scalar(int v) {
  const Value& x = P().values[static_cast<size_t>(v)];
  return emit("Reshape", {v, int64_const("scalar_shape", std::vector<int64_t>{})}, x.name, x.dtype, {});
}

int Partitioner::int64_scalar(const std::string& hint, const DimExpr& e) {
  const int64_t at_hints = e.eval(g_.dim_hints);
  if (e.is_constant()) return int64_const(hint, {at_hints}, true);
  return to_scalar(int64_const(hint, std::vector<DimExpr>{e}, {at_hints}));
}

DimExpr Partitioner::global_dim(int gv, size_t d) const {
  const Value& v = g_.values[static_cast<size_t>(gv)];
  return v.sym ? v.sym->dims.at(d) : DimExpr(v.shape.at(d));
}

DimExpr Partitioner::local_dim(int gv, size_t d, const std::vector<int>& axes) const {
  return ceil_div(global_dim(gv, d), mesh_.axes_size(axes));
}

void Partitioner::symbolic_attr(const std::string& attr, const DimExpr& e, bool even_constant) {
  if (even_constant || !e.is_constant()) out_.sym_attrs.push_back({static_cast<int>(P().nodes.size()) - 1, attr, e});
}

void Partitioner::bind(int gv, const TensorSharding& s, int lv) {
  if (avail_[gv].empty()) out_.final_shardings[gv] = s;
  add_copy(gv, s, lv);
}

void Partitioner::add_copy(int gv, const TensorSharding& s, int lv) {
  if (out_.value_origin.size() <= static_cast<size_t>(lv)) out_.value_origin.resize(P().values.size(), -1);
  out_.value_origin[static_cast<size_t>(lv)] = gv;
  if (!g_.dim_hints.empty()) {  // a graph over dim symbols: its shards' local dims (attach_program_symbols)
    if (out_.value_tiles.size() <= static_cast<size_t>(lv)) out_.value_tiles.resize(P().values.size());
    auto& tiles = out_.value_tiles[static_cast<size_t>(lv)];
    tiles.clear();
    for (const std::vector<int>& axes : s.dims) tiles.push_back(mesh_.axes_size(axes));
  }
  // A copy larger than the primary (a gather), made for a forward node of a training step: not reused after the
  // forward pass (partition() in spmd.h).
  const bool fenced = phase_ >= 0 && !avail_[gv].empty() && !P().values[static_cast<size_t>(lv)].is_initializer &&
                      num_elements(P().values[static_cast<size_t>(lv)].shape) >
                          num_elements(P().values[static_cast<size_t>(avail_[gv].front().id)].shape);
  avail_[gv].push_back({s, lv, fenced ? phase_ : -1});
}

TensorSharding Partitioner::current(int gv) const {
  if (!avail_[gv].empty()) return avail_[gv].front().sharding;
  TensorSharding s = plan_.shardings[gv];
  s.unreduced.clear();
  return s;
}

int Partitioner::emit(Node n, std::vector<int> inputs, const std::string& out_hint, DType t, Shape s) {
  n.name = fmt::format("{}/{}_{}", out_hint, n.op_type, counter_++);
  n.inputs = std::move(inputs);
  int o = new_value(out_hint, t, s);
  n.outputs = {o};
  P().add_node(std::move(n));
  return o;
}

int Partitioner::emit(const std::string& op, std::vector<int> inputs, const std::string& out_hint, DType t, Shape s,
                      std::map<std::string, AttrValue> attrs) {
  Node n;
  n.op_type = op;
  n.attrs = std::move(attrs);
  return emit(std::move(n), std::move(inputs), out_hint, t, std::move(s));
}

int Partitioner::collective(const CollectiveAttrs& a, int x, Shape out_shape, const std::string& for_node, int gv,
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

int Partitioner::get(int gv, TensorSharding want, const std::string& for_node,
                     const std::function<std::string()>& why) {
  if (want.unreduced.empty()) want.reduction = ReductionKind::kSum;  // a full value has no reduction kind
  const Value& v = g_.values[gv];
  for (const Local& l : avail_[gv])
    if (l.sharding == want && (l.fence < 0 || l.fence == phase_)) return l.id;
  // Weights are sliced when loaded, so any sharding of an unannotated weight is free. An annotated weight is held
  // in its annotated sharding only (a constraint: the 2D and FSDP pattern); other shardings of it are resharded
  // from that one by collectives.
  auto param = [&](const TensorSharding& s) {
    int lv = new_value(v.name, v.dtype, s.local_shape(v.shape, mesh_));
    P().values[lv].is_initializer = true;
    out_.params.push_back({lv, gv, s});
    out_.params.back().donated = roles_ && roles_->donated[static_cast<size_t>(gv)];
    return lv;
  };
  if (avail_[gv].empty()) {
    if (!v.is_initializer) throw InternalError(fmt::format("value '{}' used before it is computed", v.name));
    const TensorSharding held = constrained(gv) ? constraint(gv) : want;
    bind(gv, held, param(held));
    if (held == want) return avail_[gv].front().id;
  } else if (v.is_initializer && want.unreduced.empty() && !constrained(gv)) {
    int lv = param(want);
    add_copy(gv, want, lv);
    return lv;
  }
  const Local& from = avail_[gv].front();
  std::string reason = why();
  if (constrained(gv) && from.sharding == constraint(gv))  // not when the computed value is resharded to its constraint
    reason += fmt::format("; '{}' is held as annotated, {} ({})", v.name, from.sharding.to_partition_spec(mesh_),
                          plan_.origins[gv].source);
  int lv = reshard(gv, from.id, from.sharding, want, for_node, reason);
  add_copy(gv, want, lv);
  return lv;
}

int Partitioner::reshard(int gv, int x, const TensorSharding& cur, const TensorSharding& want,
                         const std::string& for_node, const std::string& why) {
  const Value& v = g_.values[gv];
  std::vector<int> extra;  // axes `want` is unreduced over and `cur` is not
  for (int a : want.unreduced)
    if (!contains(cur.unreduced, a)) extra.push_back(a);
  if (!extra.empty()) {
    TensorSharding partial;
    x = make_partial(gv, x, cur, want, extra, for_node, why, partial);
    return reshard(gv, x, partial, want, for_node, why);
  }
  std::vector<char> ragged;  // symbolic dims that may not divide at other sizes than the hints (the planner's)
  if (v.sym)
    for (const DimExpr& e : v.sym->dims) ragged.push_back(!e.is_constant() && !exact_div(e, mesh_.num_devices()));
  const ReshardPlan& plan = planner_.plan(v.shape, static_cast<int64_t>(dtype_size(v.dtype)), cur, want, ragged);
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
          x = collective(
              {.kind = Collective::kReduceScatter, .mesh_axes = st.axes, .reduction = at.reduction, .axis = d}, x, out,
              for_node, gv, reason);
        break;
      }
      case ReshardStep::Kind::kAllToAll:
        x = collective({.kind = Collective::kAllToAll, .mesh_axes = st.axes, .split_axis = st.dim2, .concat_axis = d},
                       x, out, for_node, gv,
                       fmt::format("'{}' moves its {} split from dim {} to dim {}; {}", v.name,
                                   axes_str(mesh_, st.axes), st.dim, st.dim2, why));
        break;
      case ReshardStep::Kind::kAllGather: {
        Shape s = P().values[x].shape;
        s[st.dim] *= mesh_.axes_size(st.axes);
        x = collective(
            {.kind = Collective::kAllGather, .mesh_axes = st.axes, .axis = d}, x, s, for_node, gv,
            fmt::format("'{}' dim {} is split over {} but {}", v.name, st.dim, axes_str(mesh_, st.axes), why));
        if (st.trim)  // drop the padding of the last shard
          x = emit("Slice",
                   {x, int64_const("starts", {0}),
                    int64_const("ends", std::vector<DimExpr>{global_dim(gv, st.dim)}, {v.shape[st.dim]}),
                    int64_const("axes", {d})},
                   v.name, v.dtype, out);
        break;
      }
      case ReshardStep::Kind::kSlice:
        x = emit(gspmd_node(ShardSliceAttrs{.axis = d, .mesh_axes = st.axes, .shard_size = out[st.dim]}), {x}, v.name,
                 v.dtype, out);
        symbolic_attr("shard_size", local_dim(gv, st.dim, st.after.dims[st.dim]));
        break;
      case ReshardStep::Kind::kPermute:
        x = collective({.kind = Collective::kCollectivePermute, .mesh_axes = st.axes, .target_axes = st.target_axes}, x,
                       out, for_node, gv,
                       fmt::format("'{}' goes from {} to {} (same shard shape, other devices); {}", v.name,
                                   at.to_partition_spec(mesh_), st.after.to_partition_spec(mesh_), why));
        break;
    }
    at = st.after;
  }
  return x;
}

}  // namespace gspmd::partition_internal
