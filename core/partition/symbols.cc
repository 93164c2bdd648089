// The SPMD program over the dim symbols (spmd.h: attach_program_symbols, check_symbolic_program; docs/shapes.md).
#include <algorithm>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/partition/spmd.h"
#include "core/shapes/shapes.h"
#include "core/shapes/symbolic.h"

namespace gspmd {
namespace {

// The local dims of program value `lv`, a shard or copy of global value `gv` with `tiles` shards per dim: a dim
// split k ways is ceil(dim / k) (padded), a dim held whole keeps its expression.
std::shared_ptr<const SymbolicValue> local_symbols(const Value& lv, const Value& gv, const std::vector<int64_t>& tiles,
                                                   const DimBindings& hints) {
  if (!gv.sym || lv.shape.size() != gv.shape.size()) return nullptr;
  SymbolicValue s;
  for (size_t d = 0; d < lv.shape.size(); ++d) {
    const int64_t k = d < tiles.size() ? tiles[d] : 1;
    s.dims.push_back(k > 1 ? ceil_div(gv.sym->dims[d], k) : gv.sym->dims[d]);
    if (s.dims.back().eval(hints) != lv.shape[d])
      throw InternalError(
          fmt::format("value '{}' dim {}: {} is not the program's {}", lv.name, d, s.dims.back().str(), lv.shape[d]));
  }
  if (gv.sym->elems) {
    if (lv.shape != gv.shape)
      throw UnsupportedError(
          fmt::format("value '{}': a shape tensor over the dim symbols is split over the mesh: "
                      "bind them with --dim",
                      gv.name));
    s.elems = gv.sym->elems;
  }
  if (!s.has_symbols()) return nullptr;
  return std::make_shared<const SymbolicValue>(std::move(s));
}

// A gspmd op's output over the symbols (program_ops.h): its input's dims, with the axis the op works on changed as
// the op says; a ShardSlice's length is its attribute's expression.
SymbolicValue gspmd_symbols(const SpmdProgram& p, int node) {
  const Graph& P = p.program;
  const Node& n = P.nodes[static_cast<size_t>(node)];
  const GspmdOp op = *gspmd_op(n);
  if (op == GspmdOp::kPartitionOffset) return {};
  const Value& x = P.values[static_cast<size_t>(n.inputs.at(0))];
  std::vector<DimExpr> d = x.sym ? x.sym->dims : std::vector<DimExpr>(x.shape.begin(), x.shape.end());
  auto at = [&](int64_t axis) -> DimExpr& {
    return d.at(static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(d.size()) : axis));
  };
  auto divided = [&](int64_t axis, int64_t k) {
    auto q = exact_div(at(axis), k);
    if (!q)
      throw InternalError(
          fmt::format("node '{}' ({}): dim {} does not divide by {}", n.name, n.op_type, at(axis).str(), k));
    at(axis) = *q;
  };
  switch (op) {
    case GspmdOp::kAllReduce:
    case GspmdOp::kCollectivePermute:
    case GspmdOp::kMaskPad:
    case GspmdOp::kPartitionOffset: break;
    case GspmdOp::kAllGather: {
      const CollectiveAttrs a = collective_attrs(n);
      at(a.axis) = at(a.axis) * p.mesh.axes_size(a.mesh_axes);
      break;
    }
    case GspmdOp::kReduceScatter: {
      const CollectiveAttrs a = collective_attrs(n);
      divided(a.axis, p.mesh.axes_size(a.mesh_axes));
      break;
    }
    case GspmdOp::kAllToAll: {
      const CollectiveAttrs a = collective_attrs(n);
      divided(a.split_axis, p.mesh.axes_size(a.mesh_axes));
      at(a.concat_axis) = at(a.concat_axis) * p.mesh.axes_size(a.mesh_axes);
      break;
    }
    case GspmdOp::kShardSlice: {
      const ShardSliceAttrs a = shard_slice_attrs(n);
      at(a.axis) = a.size ? p.attr_expr(node, "size", *a.size) : p.attr_expr(node, "shard_size", a.shard_size);
      break;
    }
  }
  return {std::move(d), std::nullopt};
}

// The int attributes of a per-device gspmd op that are sizes along its axis: when the input's dim there reads a
// symbol, each must be an expression (SpmdProgram::sym_attrs), never a literal the hints froze.
void check_sized_attrs(const SpmdProgram& p, int node) {
  const Node& n = p.program.nodes[static_cast<size_t>(node)];
  const std::optional<GspmdOp> op = gspmd_op(n);
  if (!op || (*op != GspmdOp::kShardSlice && *op != GspmdOp::kMaskPad)) return;
  const Value& x = p.program.values[static_cast<size_t>(n.inputs.at(0))];
  const int64_t axis = *op == GspmdOp::kShardSlice ? shard_slice_attrs(n).axis : mask_pad_attrs(n).axis;
  const size_t a = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(x.shape.size()) : axis);
  if (!x.sym || x.sym->dims.at(a).is_constant()) return;
  for (const char* attr : {"shard_size", "full_size", "step"}) {
    if (!n.has(attr)) continue;
    if (std::none_of(p.sym_attrs.begin(), p.sym_attrs.end(),
                     [&](const SpmdProgram::SymbolicAttr& s) { return s.node == node && s.attr == attr; }))
      throw UnsupportedError(
          fmt::format("node '{}' ({}): its {} is a literal {} on the symbolic dim {} ({}): bind "
                      "the dims with --dim",
                      n.name, n.op_type, attr, n.i(attr), a, x.sym->dims[a].str()));
  }
}

}  // namespace

void attach_program_symbols(SpmdProgram& p, const Graph& g) {
  Graph& P = p.program;
  P.dim_hints = g.dim_hints;
  P.runtime_dims = g.runtime_dims;
  P.dim_guards = g.dim_guards;
  P.dim_guards.insert(P.dim_guards.end(), p.dim_guards.begin(), p.dim_guards.end());
  if (g.dim_hints.empty()) return;
  for (size_t lv = 0; lv < P.values.size() && lv < p.value_origin.size(); ++lv)
    if (const int gv = p.value_origin[lv]; gv >= 0)
      P.values[lv].sym =
          local_symbols(P.values[lv], g.values[static_cast<size_t>(gv)],
                        lv < p.value_tiles.size() ? p.value_tiles[lv] : std::vector<int64_t>{}, P.dim_hints);
  for (const auto& [c, v] : p.shape_of) {
    const Value& of = P.values[static_cast<size_t>(v)];
    if (!of.sym) continue;
    P.values[static_cast<size_t>(c)].sym = std::make_shared<const SymbolicValue>(
        SymbolicValue{{DimExpr(static_cast<int64_t>(of.shape.size()))}, of.sym->dims});
  }
  std::vector<SymbolicInput> in;
  std::vector<TensorType> out;
  for (size_t ni = 0; ni < P.nodes.size(); ++ni) {
    const Node& n = P.nodes[ni];
    if (std::none_of(n.inputs.begin(), n.inputs.end(),
                     [&](int v) { return v >= 0 && P.values[static_cast<size_t>(v)].sym; }))
      continue;
    std::vector<SymbolicValue> syms;
    if (n.domain == kGspmdDomain) {
      check_sized_attrs(p, static_cast<int>(ni));
      syms = {gspmd_symbols(p, static_cast<int>(ni))};
    } else if (std::all_of(n.outputs.begin(), n.outputs.end(),
                           [&](int o) { return o < 0 || P.values[static_cast<size_t>(o)].sym; })) {
      continue;  // shards of global values: their dims come from the model's (a data-dependent node's too)
    } else {
      std::vector<TensorType> in_types(n.inputs.size());
      in.assign(n.inputs.size(), {});
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (n.inputs[k] < 0) continue;
        const Value& v = P.values[static_cast<size_t>(n.inputs[k])];
        in_types[k] = {v.dtype, v.shape};
        in[k] = {&in_types[k], v.data.get(), v.sym.get()};
        // a whole weight (a param: the program holds no data) reads as the model's constant
        const int gv = static_cast<size_t>(n.inputs[k]) < p.value_origin.size() ? p.value_origin[n.inputs[k]] : -1;
        if (!v.data && gv >= 0 && g.values[static_cast<size_t>(gv)].shape == v.shape)
          in[k].value = g.values[static_cast<size_t>(gv)].data.get();
      }
      out.clear();
      for (int o : n.outputs)
        out.push_back({P.values[static_cast<size_t>(o)].dtype, P.values[static_cast<size_t>(o)].shape});
      syms = infer_symbolic(n, in, out, P.opset, P.dim_hints).outputs;
    }
    for (size_t k = 0; k < syms.size() && k < n.outputs.size(); ++k) {
      Value& v = P.values[static_cast<size_t>(n.outputs[k])];
      if (v.sym) continue;  // a shard of a global value: its dims come from the model's
      Shape at;
      for (const DimExpr& d : syms[k].dims) at.push_back(d.eval(P.dim_hints));
      if (at != v.shape)
        throw InternalError(
            fmt::format("node '{}' ({}): output '{}' over the symbols is {} ({} at the hints), but "
                        "the program's is {}",
                        n.name, n.op_type, v.name, dims_str(syms[k].dims), shape_str(at), shape_str(v.shape)));
      syms[k].elems.reset();  // computed at run time
      if (syms[k].has_symbols()) v.sym = std::make_shared<const SymbolicValue>(std::move(syms[k]));
    }
  }
}

std::map<std::string, int64_t> smallest_sizes(const SpmdProgram& p, const DimBindings& hints) {
  std::map<std::string, std::vector<const std::pair<DimExpr, DimExpr>*>> by_symbol;
  for (const auto& guard : p.dim_guards)
    if (const std::vector<std::string> syms = guard.first.symbols(); syms.size() == 1 && hints.count(syms[0]))
      by_symbol[syms[0]].push_back(&guard);
  std::map<std::string, int64_t> r;
  for (const auto& entry : by_symbol) {  // not a structured binding: clang 14 cannot capture one in a lambda
    const std::string& sym = entry.first;
    const auto& guards = entry.second;
    DimBindings at = hints;
    auto holds = [&](int64_t v) {
      at[sym] = v;
      return std::all_of(guards.begin(), guards.end(),
                         [&](const auto* g) { return g->first.eval(at) == g->second.eval(at); });
    };
    int64_t lo = 1, hi = hints.at(sym);  // the smallest in [lo, hi] that holds, hi holding
    if (!holds(hi)) continue;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (holds(mid))
        hi = mid;
      else
        lo = mid + 1;
    }
    r[sym] = hi;
  }
  return r;
}

void check_symbolic_program(const SpmdProgram& p, const Graph& g, const DimBindings& at) {
  const Graph& P = p.program;
  auto fail = [&](const std::string& what) {
    throw UnsupportedError(
        fmt::format("{} with the dims at {}: the program depends on the dims in a way it does not "
                    "express (a literal size): bind them with --dim",
                    what, bindings_str(at)));
  };
  // Every value's shape and every constant's elements at `at`.
  std::vector<TensorType> types(P.values.size());
  std::vector<std::optional<Tensor>> consts(P.values.size());
  for (size_t k = 0; k < P.values.size(); ++k) {
    const Value& v = P.values[k];
    types[k].dtype = v.dtype;
    if (v.sym)
      for (const DimExpr& d : v.sym->dims) types[k].shape.push_back(d.eval(at));
    else
      types[k].shape = v.shape;
    const int gv = k < p.value_origin.size() ? p.value_origin[k] : -1;
    const Tensor* data = v.data ? v.data.get()
                         : gv >= 0 && g.values[static_cast<size_t>(gv)].shape == v.shape
                             ? g.values[static_cast<size_t>(gv)].data.get()
                             : nullptr;
    if (v.sym && v.sym->elems) {
      consts[k] = constant_at(v, at);
    } else if (data && num_elements(data->shape) <= 4096) {
      consts[k] = *data;
    }
  }
  std::map<std::string, int64_t, std::less<>> computed;  // data-dependent symbols computed by shaped nodes
  for (int ni = 0; ni < static_cast<int>(P.nodes.size()); ++ni) {
    const Node& n = P.nodes[static_cast<size_t>(ni)];
    std::vector<TensorType> out;
    if (n.domain == kGspmdDomain) {
      const std::optional<GspmdOp> op = gspmd_op(n);
      if (!op) fail(fmt::format("node '{}': unknown gspmd op", n.name));
      if (*op == GspmdOp::kPartitionOffset) continue;  // a scalar, read off the partition id
      TensorType y = types[static_cast<size_t>(n.inputs.at(0))];
      auto dim = [&](int64_t axis) -> int64_t& {
        return y.shape.at(static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(y.shape.size()) : axis));
      };
      switch (*op) {
        case GspmdOp::kAllReduce:
        case GspmdOp::kCollectivePermute:
        case GspmdOp::kMaskPad: break;
        case GspmdOp::kAllGather: {
          const CollectiveAttrs a = collective_attrs(n);
          dim(a.axis) *= p.mesh.axes_size(a.mesh_axes);
          break;
        }
        case GspmdOp::kReduceScatter: {
          const CollectiveAttrs a = collective_attrs(n);
          dim(a.axis) /= p.mesh.axes_size(a.mesh_axes);
          break;
        }
        case GspmdOp::kAllToAll: {
          const CollectiveAttrs a = collective_attrs(n);
          const int64_t m = p.mesh.axes_size(a.mesh_axes);
          dim(a.split_axis) /= m;
          dim(a.concat_axis) *= m;
          break;
        }
        case GspmdOp::kShardSlice: {
          const ShardSliceAttrs a = shard_slice_attrs(n);
          dim(a.axis) =
              (a.size ? p.attr_expr(ni, "size", *a.size) : p.attr_expr(ni, "shard_size", a.shard_size)).eval(at);
          break;
        }
        case GspmdOp::kPartitionOffset: y = {DType::kInt64, {}}; break;
      }
      out.push_back(std::move(y));
    } else {
      std::vector<const TensorType*> in_types(n.inputs.size(), nullptr);
      std::vector<const Tensor*> in_values(n.inputs.size(), nullptr);
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (n.inputs[k] < 0) continue;
        in_types[k] = &types[static_cast<size_t>(n.inputs[k])];
        if (consts[static_cast<size_t>(n.inputs[k])]) in_values[k] = &*consts[static_cast<size_t>(n.inputs[k])];
      }
      try {
        out = infer_types(n, in_types, in_values, P.opset);
      } catch (const DataDependentError& e) {
        // a node that computes a data-dependent dim (Graph::runtime_dims): its outputs are that symbol at `at`
        if (std::all_of(n.outputs.begin(), n.outputs.end(),
                        [&](int v) { return v < 0 || !runtime_dims_of(P, v).empty(); }))
          continue;
        fail(fmt::format("node '{}' ({}): its output shape cannot be checked ({})", n.name, n.op_type, e.what()));
      } catch (const UnsupportedError&) {
        continue;  // an op without a shape function keeps the declared types
      } catch (const std::exception& e) {
        fail(fmt::format("node '{}' ({}) fails: {}", n.name, n.op_type, e.what()));
      }
    }
    // a dim that is a data-dependent symbol a shaped node computes (a Concat of many counts) is what its node gives
    // there, and what every other node that gives it must give
    auto computes = [&](const Value& v, size_t d, int64_t size) {
      const std::string* s = v.sym && d < v.sym->dims.size() ? v.sym->dims[d].as_symbol() : nullptr;
      auto rt = s ? P.runtime_dims.find(*s) : P.runtime_dims.end();
      if (rt == P.runtime_dims.end()) return false;
      if (auto it = computed.find(*s); it != computed.end()) return it->second == size;
      if (rt->second.node != n.name) return false;
      computed[*s] = size;
      return true;
    };
    for (size_t k = 0; k < out.size() && k < n.outputs.size(); ++k) {
      const TensorType& want = types[static_cast<size_t>(n.outputs[k])];
      const Value& v = P.values[static_cast<size_t>(n.outputs[k])];
      bool same = out[k].shape.size() == want.shape.size();
      for (size_t d = 0; same && d < want.shape.size(); ++d)
        same = out[k].shape[d] == want.shape[d] || computes(v, d, out[k].shape[d]);
      if (!same)
        fail(fmt::format("node '{}' ({}) computes {} for '{}', which is {} over the dims", n.name, n.op_type,
                         shape_str(out[k].shape), P.values[static_cast<size_t>(n.outputs[k])].name,
                         shape_str(want.shape)));
    }
  }
}

}  // namespace gspmd
