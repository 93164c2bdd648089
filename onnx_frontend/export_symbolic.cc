// The exporter's sizes over the dim symbols (export_impl.h, docs/shapes.md): symbol sizes, computed constants,
// padded slices and fills, windows.
#include "onnx_frontend/export_impl.h"

namespace gspmd::export_internal {

std::string Exporter::symbol_size(const std::string& sym) {
  if (auto it = sym_source_.find(sym); it != sym_source_.end()) return it->second;
  if (auto rt = runtime_at_.find(sym); rt != runtime_at_.end()) {  // read off the output that has it
    const Value& out = G.values[static_cast<size_t>(rt->second.first)];
    return sym_source_[sym] = dim_of(out, rt->second.second, sym);
  }
  if (G.runtime_dims.count(sym))
    throw InternalError(fmt::format("export: dim '{}' is read before the node that computes it", sym));
  for (int v : G.inputs) {
    const Value& in = G.values[static_cast<size_t>(v)];
    if (!in.sym) continue;
    for (size_t d = 0; d < in.sym->dims.size(); ++d) {
      const std::string* whole = in.sym->dims[d].as_symbol();
      if (whole && *whole == sym) return sym_source_[sym] = dim_of(in, d, sym);
    }
  }
  // No input holds it whole (a split dim is padded): the device reads it from its gspmd_dims input.
  const std::vector<std::string> symbols = input_dim_symbols(G);
  if (dims_input_.empty()) {
    dims_input_ = fresh(kDimsInput);
    auto* in = pg->add_input();
    set_value_info(in, Value{dims_input_, ValueKind::kTensor, DType::kInt64,
                             Shape{static_cast<int64_t>(symbols.size())}, -1, false, nullptr, nullptr});
    in->set_doc_string("the global sizes of the dim symbols " + fmt::format("{}", fmt::join(symbols, ",")) +
                       ", in this order (docs/shapes.md)");
  }
  const auto k = std::distance(symbols.begin(), std::find(symbols.begin(), symbols.end(), sym));
  if (k >= static_cast<std::ptrdiff_t>(symbols.size()))
    throw InternalError(fmt::format("export: dim '{}' is not one of the program's symbols", sym));
  const std::string size = add_temp(sym + "/size", DType::kInt64, {1});
  add_node(fresh(sym + "/Gather"), "Gather", {dims_input_, add_const(sym + "/index", Tensor::from_int64s({k}))},
           {size});
  return sym_source_[sym] = size;
}

std::string Exporter::dim_of(const Value& v, size_t d, const std::string& sym) {
  const std::string shape = add_temp(v.name + "/shape", DType::kInt64, {static_cast<int64_t>(v.shape.size())});
  add_node(fresh(v.name + "/Shape"), "Shape", {v.name}, {shape});
  const std::string size = add_temp(sym + "/size", DType::kInt64, {1});
  const std::string idx = add_const(sym + "/dim", Tensor::from_int64s({static_cast<int64_t>(d)}));
  add_node(fresh(sym + "/Gather"), "Gather", {shape, idx}, {size});
  return size;
}

void Exporter::after_node(const Node& n) {
  if (G.runtime_dims.empty()) return;
  for (int o : n.outputs) {
    const std::vector<char> rt = runtime_dims_of(G, o);
    for (size_t d = 0; d < rt.size(); ++d) {
      const std::string* whole = G.values[static_cast<size_t>(o)].sym->dims[d].as_symbol();
      if (rt[d] && whole) runtime_at_.emplace(*whole, std::make_pair(o, d));
    }
  }
  auto ready = [&](int v) {
    for (const DimExpr& e : *G.values[static_cast<size_t>(v)].sym->elems)
      for (const std::string& s : e.symbols())
        if (G.runtime_dims.count(s) && !runtime_at_.count(s)) return false;
    return true;
  };
  for (auto it = pending_constants_.begin(); it != pending_constants_.end();) {
    if (!ready(*it)) {
      ++it;
      continue;
    }
    emit_symbolic_constant(G.values[static_cast<size_t>(*it)]);
    set_value_info(pg->add_value_info(), G.values[static_cast<size_t>(*it)]);
    it = pending_constants_.erase(it);
  }
}

std::string Exporter::binary(const char* op, const std::string& a, const std::string& b) {
  const std::string y = add_temp(std::string("dims/") + op, DType::kInt64, {1});
  add_node(fresh(std::string("dims/") + op), op, {a, b}, {y});
  return y;
}

std::string Exporter::floor_div_of(const std::string& e, int64_t d) {
  const std::string dc = int_const(d);
  const std::string m = add_temp("dims/Mod", DType::kInt64, {1});
  add_node(fresh("dims/Mod"), "Mod", {e, dc}, {m});
  return binary("Div", binary("Sub", e, m), dc);
}

std::string Exporter::expr_value(const DimExpr& e) {
  const std::string key = e.str();
  if (auto it = expr_value_.find(key); it != expr_value_.end()) return it->second;
  std::string sum;
  auto add = [&](const std::string& x) { sum = sum.empty() ? x : binary("Add", sum, x); };
  for (const DimExpr::Term& t : e.terms()) {
    std::string prod;
    for (const auto& a : t.atoms) {
      std::string x;
      using K = DimExpr::Atom::Kind;
      switch (a->kind) {
        case K::kSymbol: x = symbol_size(a->name); break;
        case K::kFloor: x = floor_div_of(expr_value(a->args[0]), a->divisor); break;
        case K::kCeil: {  // ceil(e / d) = -floor(-e / d)
          const std::string neg = binary("Sub", int_const(0), expr_value(a->args[0]));
          x = binary("Sub", int_const(0), floor_div_of(neg, a->divisor));
          break;
        }
        case K::kMin:
        case K::kMax: {
          const std::string p = expr_value(a->args[0]), q = expr_value(a->args[1]);
          if (opset >= 12) {
            x = binary(a->kind == K::kMin ? "Min" : "Max", p, q);
            break;
          }
          // int64 Min / Max are opset 12+: Where(p < q, ...) (opsets 9-11)
          if (opset < 9) throw UnsupportedError(fmt::format("export: dim {} needs Where, from opset 9", key));
          const std::string less = add_temp("dims/Less", DType::kBool, {1});
          add_node(fresh("dims/Less"), "Less", {p, q}, {less});
          x = add_temp("dims/Where", DType::kInt64, {1});
          add_node(fresh("dims/Where"), "Where", {less, a->kind == K::kMin ? p : q, a->kind == K::kMin ? q : p}, {x});
          break;
        }
      }
      prod = prod.empty() ? x : binary("Mul", prod, x);
    }
    add(t.coef == 1 ? prod : binary("Mul", int_const(t.coef), prod));
  }
  if (e.constant_part() != 0 || sum.empty()) add(int_const(e.constant_part()));
  return expr_value_[key] = sum;
}

void Exporter::emit_symbolic_constant(const Value& v) {
  std::vector<std::string> parts;
  for (const DimExpr& e : *v.sym->elems) parts.push_back(expr_value(e));
  std::string flat = parts.empty() ? add_const(v.name + "/empty", Tensor::from_int64s({})) : parts[0];
  if (parts.size() > 1) {
    flat = add_temp(v.name + "/flat", DType::kInt64, {static_cast<int64_t>(parts.size())});
    set_attr(add_node(fresh(v.name + "/Concat"), "Concat", parts, {flat})->add_attribute(), "axis", int64_t{0});
  }
  std::string as_int = flat;
  if (v.dtype != DType::kInt64) {
    as_int = add_temp(v.name + "/int64", v.dtype, {static_cast<int64_t>(parts.size())});
    set_attr(add_node(fresh(v.name + "/Cast"), "Cast", {flat}, {as_int})->add_attribute(), "to",
             static_cast<int64_t>(v.dtype));
  }
  const std::string shape = add_const(v.name + "/shape", Tensor::from_int64s(v.shape));
  add_node(fresh(v.name + "/Reshape"), "Reshape", {as_int, shape}, {v.name});
}

std::string Exporter::add_temp(const std::string& hint, DType t, const Shape& s, const Value* like) {
  Dims d(s.begin(), s.end());
  if (like && like->sym && like->shape.size() == s.size())
    for (size_t k = 0; k < s.size(); ++k)
      if (s[k] == like->shape[k]) d[k] = like->sym->dims[k];
  return add_dims_temp(hint, t, d);
}

void Exporter::emit_slice(const std::string& node, const std::string& x, const std::string& y, int64_t axis,
                          int64_t start, int64_t end) {
  if (opset >= 10) {
    auto s = add_const(node + "/starts", Tensor::from_int64s({start}));
    auto e = add_const(node + "/ends", Tensor::from_int64s({end}));
    auto a = add_const(node + "/axes", Tensor::from_int64s({axis}));
    add_node(fresh(node + "/Slice"), "Slice", {x, s, e, a}, {y});
  } else {
    auto* n = add_node(fresh(node + "/Slice"), "Slice", {x}, {y});
    set_attr(n->add_attribute(), "starts", std::vector<int64_t>{start});
    set_attr(n->add_attribute(), "ends", std::vector<int64_t>{end});
    set_attr(n->add_attribute(), "axes", std::vector<int64_t>{axis});
  }
}

void Exporter::emit_pad(const std::string& node, const std::string& x, const std::string& y, DType dt, size_t rank,
                        int64_t axis, int64_t pad_begin, int64_t pad_end, double value) {
  std::vector<int64_t> pads(2 * rank, 0);
  pads[static_cast<size_t>(axis)] = pad_begin;
  pads[rank + static_cast<size_t>(axis)] = pad_end;
  if (opset >= 11) {
    auto pn = add_const(node + "/pads", Tensor::from_int64s(pads));
    auto cv = add_const(node + "/pad_value", filled(dt, {}, value));
    add_node(fresh(node + "/Pad"), "Pad", {x, pn, cv}, {y});
  } else {
    auto* n = add_node(fresh(node + "/Pad"), "Pad", {x}, {y});
    set_attr(n->add_attribute(), opset >= 2 ? "pads" : "paddings", pads);
    set_attr(n->add_attribute(), "value", static_cast<float>(value));
  }
}

void Exporter::emit_fill(const std::string& node, const Value& y, double value) {
  if (opset >= 9) {
    auto shape = add_const(node + "/shape", Tensor::from_int64s(y.shape));
    auto* n = add_node(fresh(node + "/ConstantOfShape"), "ConstantOfShape", {shape}, {y.name});
    set_attr(n->add_attribute(), "value", filled(y.dtype, {1}, value));
  } else {
    auto* n = add_node(fresh(node + "/Constant"), "Constant", {}, {y.name});
    set_attr(n->add_attribute(), "value", filled(y.dtype, y.shape, value));
  }
}

const std::vector<int>& Exporter::checked(const Node& n, const std::vector<int>& axes) {
  for (int a : axes)
    if (a >= p.mesh.rank())
      throw InternalError(fmt::format("export: node '{}' ({}): mesh axis {} out of range", n.name, n.op_type, a));
  return axes;
}

int64_t Exporter::norm_axis(const Node& n, int64_t axis, size_t rank) {
  int64_t r = static_cast<int64_t>(rank);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r)
    throw InternalError(fmt::format("export: node '{}' ({}): axis out of range", n.name, n.op_type));
  return axis;
}

bool Exporter::has_symbolic_attrs(int ni) const {
  return std::any_of(p.sym_attrs.begin(), p.sym_attrs.end(),
                     [&](const SpmdProgram::SymbolicAttr& a) { return a.node == ni; });
}

void Exporter::specialise(const Node& n, GspmdOp op) {
  const Value& y = G.values.at(n.outputs.at(0));
  switch (op) {
    case GspmdOp::kPartitionOffset: {
      const PartitionOffsetAttrs a = partition_offset_attrs(n);
      const int64_t tile = p.mesh.tile_index(device, checked(n, a.mesh_axes));
      if (const int ni = node_index(n); has_symbolic_attrs(ni)) {  // a shard size over the symbols
        const std::string off = expr_value(p.attr_expr(ni, "shard_size", a.shard_size) * tile);  // [1]
        if (y.shape.empty())
          add_node(n.name, "Reshape", {off, add_const(n.name + "/scalar", Tensor::from_int64s({}))}, {y.name});
        else
          add_node(n.name, "Identity", {off}, {y.name});
        return;
      }
      auto* c = add_node(n.name, "Constant", {}, {y.name});
      Tensor t = Tensor::from_int64s({a.offset(tile)}, /*scalar=*/true);
      t.shape = y.shape;  // scalar or [1], as the program says
      set_attr(c->add_attribute(), "value", t);
      return;
    }
    case GspmdOp::kShardSlice: {
      const ShardSliceAttrs a = shard_slice_attrs(n);
      const int64_t tile = p.mesh.tile_index(device, checked(n, a.mesh_axes));
      const Value& x = G.values.at(n.inputs.at(0));
      const int64_t axis = norm_axis(n, a.axis, x.shape.size());
      if (const int ni = node_index(n); symbolic_window(x, axis, ni)) {
        const DimExpr start =
            p.attr_expr(ni, "base", a.base.value_or(0)) + p.attr_expr(ni, "shard_size", a.shard_size) * tile;
        const DimExpr len = a.size ? p.attr_expr(ni, "size", *a.size) : p.attr_expr(ni, "shard_size", a.shard_size);
        return window_symbolic(n, x, y, axis, start, len, 0, dim_of(x, axis), 0.0);
      }
      window(n, x, y, axis, a.start(tile), a.length(), 0, x.shape[static_cast<size_t>(axis)], 0.0);
      return;
    }
    case GspmdOp::kMaskPad: {
      const MaskPadAttrs a = mask_pad_attrs(n);
      const int64_t tile = p.mesh.tile_index(device, checked(n, a.mesh_axes));
      const Value& x = G.values.at(n.inputs.at(0));
      const int64_t axis = norm_axis(n, a.axis, x.shape.size());
      const int64_t dim = x.shape[static_cast<size_t>(axis)];
      if (const int ni = node_index(n); symbolic_window(x, axis, ni)) {
        const DimExpr first = p.attr_expr(ni, "base", a.base.value_or(0)) +
                              (a.step ? p.attr_expr(ni, "step", *a.step) : dim_of(x, axis)) * tile;
        return window_symbolic(n, x, y, axis, 0, dim_of(x, axis), -first,
                               p.attr_expr(ni, "full_size", a.full_size) - first, a.value);
      }
      // local i has global index first + i; keep those inside [0, full_size)
      const int64_t first = a.first(tile, dim);
      window(n, x, y, axis, 0, dim, -first, a.full_size - first, a.value);
      return;
    }
    case GspmdOp::kAllReduce:
    case GspmdOp::kAllGather:
    case GspmdOp::kReduceScatter:
    case GspmdOp::kAllToAll:
    case GspmdOp::kCollectivePermute: break;
  }
  throw InternalError(fmt::format("export: node '{}': {} is a collective, not a per-device op", n.name, n.op_type));
}

void Exporter::window_symbolic(const Node& n, const Value& x, const Value& y, int64_t axis, const DimExpr& lo,
                               const DimExpr& len, const DimExpr& keep_lo, const DimExpr& keep_hi, double value) {
  if (opset < 11)
    throw UnsupportedError(fmt::format("export: node '{}': a window over dim symbols needs opset 11", n.name));
  const DimExpr kl = max(keep_lo, lo), kh = min(keep_hi, lo + len);
  const DimExpr valid = max(kh - kl, 0), before = min(kl - lo, len), after = len - before - valid;
  const std::string kept = fresh(n.name + "/valid");
  add_node(fresh(n.name + "/Slice"), "Slice",
           {x.name, expr_value(kl), expr_value(kl + valid), add_const(n.name + "/axes", Tensor::from_int64s({axis}))},
           {kept});
  const size_t rank = x.shape.size();
  std::vector<std::string> pads;
  for (size_t k = 0; k < 2 * rank; ++k)
    pads.push_back(k == static_cast<size_t>(axis)          ? expr_value(before)
                   : k == rank + static_cast<size_t>(axis) ? expr_value(after)
                                                           : int_const(0));
  const std::string pn = add_temp(n.name + "/pads", DType::kInt64, {static_cast<int64_t>(2 * rank)});
  set_attr(add_node(fresh(n.name + "/Concat"), "Concat", pads, {pn})->add_attribute(), "axis", int64_t{0});
  add_node(fresh(n.name + "/Pad"), "Pad", {kept, pn, add_const(n.name + "/pad_value", filled(x.dtype, {}, value))},
           {y.name});
}

void Exporter::window(const Node& n, const Value& x, const Value& y, int64_t axis, int64_t lo, int64_t len,
                      int64_t keep_lo, int64_t keep_hi, double value) {
  const int64_t dim = x.shape[static_cast<size_t>(axis)];
  keep_lo = std::max(keep_lo, lo);
  keep_hi = std::min(keep_hi, lo + len);
  if (keep_hi <= keep_lo) {  // all padding: a fill of y's shape, computed when it reads a symbol
    if (y.sym && y.sym->has_symbols()) return window_symbolic(n, x, y, axis, lo, len, keep_lo, keep_hi, value);
    return emit_fill(n.name, y, value);
  }
  if (lo == 0 && len == dim && keep_lo == 0 && keep_hi == dim) {
    add_node(n.name, "Identity", {x.name}, {y.name});
    return;
  }
  const int64_t before = keep_lo - lo, after = lo + len - keep_hi;
  if (before == 0 && after == 0) return emit_slice(n.name, x.name, y.name, axis, keep_lo, keep_hi);
  Shape s = x.shape;
  s[static_cast<size_t>(axis)] = keep_hi - keep_lo;
  auto tmp = add_temp(n.name + "/valid", x.dtype, s, &x);
  emit_slice(n.name, x.name, tmp, axis, keep_lo, keep_hi);
  emit_pad(n.name, tmp, y.name, x.dtype, x.shape.size(), axis, before, after, value);
}

}  // namespace gspmd::export_internal
