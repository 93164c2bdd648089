// export_device: the SPMD program specialised for one device, as a standalone ONNX model (docs/collectives.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/partition/reshard.h"
#include "onnx_frontend/frontend.h"
#include "onnx_frontend/gspmd_schemas.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd {
namespace {

/// The domain of ONNX Runtime's contrib ops, its collectives among them (docs/collectives.md, "ONNX Runtime").
constexpr const char* kOrtDomain = "com.microsoft";

template <class T>
T clamp_to(double v) {
  if (std::isnan(v)) return T{};
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

// A tensor of `shape` (usually a scalar) of dtype `t` filled with `v` (saturated for integer types).
Tensor filled(DType t, const Shape& shape, double v) {
  Tensor out(t, shape);
  const int64_t n = out.numel();
  auto fill = [&](auto x) {
    using X = decltype(x);
    X* d = out.data<X>();
    for (int64_t i = 0; i < n; ++i) d[i] = x;
  };
  switch (t) {
    case DType::kFloat32: fill(static_cast<float>(v)); break;
    case DType::kFloat64: fill(v); break;
    case DType::kInt64: fill(clamp_to<int64_t>(v)); break;
    case DType::kInt32: fill(clamp_to<int32_t>(v)); break;
    case DType::kInt16: fill(clamp_to<int16_t>(v)); break;
    case DType::kInt8: fill(clamp_to<int8_t>(v)); break;
    case DType::kUInt64: fill(clamp_to<uint64_t>(v)); break;
    case DType::kUInt32: fill(clamp_to<uint32_t>(v)); break;
    case DType::kUInt16: fill(clamp_to<uint16_t>(v)); break;
    case DType::kUInt8: fill(clamp_to<uint8_t>(v)); break;
    case DType::kBool: fill(static_cast<uint8_t>(v != 0)); break;
    case DType::kFloat16: fill(float_to_half(static_cast<float>(v))); break;
    case DType::kBFloat16: {
      float f = static_cast<float>(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      if (!std::isnan(f)) x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
      fill(static_cast<uint16_t>(x >> 16));
      break;
    }
    default: throw InternalError(fmt::format("export: cannot make a {} constant", dtype_name(t)));
  }
  return out;
}

// A value's type; a dim over the dim symbols is its expression as a dim_param (docs/shapes.md).
void set_value_info(onnx::ValueInfoProto* vi, const Value& v) {
  vi->set_name(v.name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(v.dtype));
  auto* s = tt->mutable_shape();
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.sym && !v.sym->dims[d].is_constant())
      s->add_dim()->set_dim_param(v.sym->dims[d].str());
    else
      s->add_dim()->set_dim_value(v.shape[d]);
  }
}

void write_body(const Graph& b, onnx::GraphProto* gp, const std::vector<std::string>& captured);

// `captured`: for a graph attribute, the outer names of the node's captured inputs (ir.h).
void set_attr(onnx::AttributeProto* a, const std::string& name, const AttrValue& v,
              const std::vector<std::string>& captured = {}) {
  using AP = onnx::AttributeProto;
  a->set_name(name);
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, int64_t>) {
          a->set_type(AP::INT);
          a->set_i(x);
        } else if constexpr (std::is_same_v<X, float>) {
          a->set_type(AP::FLOAT);
          a->set_f(x);
        } else if constexpr (std::is_same_v<X, std::string>) {
          a->set_type(AP::STRING);
          a->set_s(x);
        } else if constexpr (std::is_same_v<X, std::vector<int64_t>>) {
          a->set_type(AP::INTS);
          for (auto e : x) a->add_ints(e);
        } else if constexpr (std::is_same_v<X, std::vector<float>>) {
          a->set_type(AP::FLOATS);
          for (auto e : x) a->add_floats(e);
        } else if constexpr (std::is_same_v<X, std::vector<std::string>>) {
          a->set_type(AP::STRINGS);
          for (const auto& e : x) a->add_strings(e);
        } else if constexpr (std::is_same_v<X, Tensor>) {
          a->set_type(AP::TENSOR);
          frontend::tensor_to_proto(x, a->mutable_t());
        } else {
          a->set_type(AP::GRAPH);
          write_body(*x, a->mutable_g(), captured);
        }
      },
      v);
}

// Writes node `n` whose values are named by `name`: its captured inputs (ir.h) are dropped, as its bodies read them
// from the enclosing scope again.
void write_node(const Node& n, onnx::NodeProto* pn, const std::vector<std::string>& name) {
  pn->set_name(n.name);
  pn->set_op_type(n.op_type);
  if (!n.domain.empty()) pn->set_domain(n.domain);
  const size_t own = n.inputs.size() - static_cast<size_t>(n.captures());
  std::vector<std::string> captured;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const std::string in = n.inputs[k] >= 0 ? name.at(static_cast<size_t>(n.inputs[k])) : "";
    if (k < own)
      pn->add_input(in);
    else
      captured.push_back(in);
  }
  for (int o : n.outputs) pn->add_output(name.at(static_cast<size_t>(o)));
  for (const auto& [k, v] : n.attrs)
    if (k != "gspmd_captures" && k != "gspmd_truncate_bf16") set_attr(pn->add_attribute(), k, v, captured);
}

std::vector<std::string> value_names(const Graph& g) {
  std::vector<std::string> name;
  for (const Value& v : g.values) name.push_back(v.name);
  return name;
}

// A body as a GraphProto: formal inputs, constants as initializers, nodes; its captured inputs named `captured`.
void write_body(const Graph& b, onnx::GraphProto* gp, const std::vector<std::string>& captured) {
  const size_t formal = b.inputs.size() - captured.size();
  std::vector<std::string> name = value_names(b);
  for (size_t j = 0; j < captured.size(); ++j) name[static_cast<size_t>(b.inputs[formal + j])] = captured[j];
  auto info = [&](onnx::ValueInfoProto* vi, int v) {
    if (b.values[v].dtype == DType::kUndefined)
      vi->set_name(name[static_cast<size_t>(v)]);
    else
      set_value_info(vi, b.values[v]);
  };
  gp->set_name(b.name);
  for (size_t k = 0; k < formal; ++k) info(gp->add_input(), b.inputs[k]);
  for (int v : b.outputs) info(gp->add_output(), v);
  for (const Value& v : b.values)
    if (v.producer < 0 && v.is_initializer && v.data) {
      auto* init = gp->add_initializer();
      init->set_name(v.name);
      frontend::tensor_to_proto(*v.data, init);
    }
  for (const Node& n : b.nodes) write_node(n, gp->add_node(), name);
}

struct Exporter {
  const SpmdProgram& p;
  const Graph& G;  // the program
  const Graph& global;
  int64_t device;
  int64_t opset;
  ExportOptions options;
  onnx::ModelProto m;
  onnx::GraphProto* pg = nullptr;
  std::unordered_set<std::string> names;  // value and node names in use
  std::set<std::string> domains;
  std::vector<std::string> value_names_;  // G's value names by id

  std::string fresh(const std::string& hint) {
    std::string n = hint;
    for (int k = 1; names.count(n); ++k) n = fmt::format("{}_{}", hint, k);
    names.insert(n);
    return n;
  }

  std::string add_const(const std::string& hint, const Tensor& t) {
    std::string name = fresh(hint);
    auto* init = pg->add_initializer();
    init->set_name(name);
    frontend::tensor_to_proto(t, init);
    return name;
  }

  onnx::NodeProto* add_node(const std::string& name, const std::string& op, std::vector<std::string> ins,
                            std::vector<std::string> outs) {
    auto* n = pg->add_node();
    n->set_name(name);
    n->set_op_type(op);
    for (auto& i : ins) n->add_input(i);
    for (auto& o : outs) n->add_output(o);
    return n;
  }

  // ---- values over the dim symbols (docs/shapes.md, "Device files") ----
  // A constant whose elements are expressions over the dim symbols is computed from the symbols' sizes, which the
  // device reads off its inputs' shapes: `Gather(Shape(input), [d])` of an input whose dim d is the symbol.
  std::map<std::string, std::string> sym_source_;  // symbol -> the [1] int64 value holding its size
  std::map<std::string, std::string> expr_value_;  // expression text -> the [1] int64 value computing it

  std::string symbol_size(const std::string& sym) {
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
  std::string dims_input_;  // the gspmd_dims input's name, once a symbol needs it
  // Data-dependent symbols (Graph::runtime_dims): the output and dim where the node that computes each put it, once
  // that node is written; and the constants that read them, written right after the last of those nodes.
  std::map<std::string, std::pair<int, size_t>> runtime_at_ = {};
  std::vector<int> pending_constants_ = {};

  // A [1] int64 value holding dim d of value `v`: Gather(Shape(v), [d]).
  std::string dim_of(const Value& v, size_t d, const std::string& sym) {
    const std::string shape = add_temp(v.name + "/shape", DType::kInt64, {static_cast<int64_t>(v.shape.size())});
    add_node(fresh(v.name + "/Shape"), "Shape", {v.name}, {shape});
    const std::string size = add_temp(sym + "/size", DType::kInt64, {1});
    const std::string idx = add_const(sym + "/dim", Tensor::from_int64s({static_cast<int64_t>(d)}));
    add_node(fresh(sym + "/Gather"), "Gather", {shape, idx}, {size});
    return size;
  }

  // After node `n` is written: the data-dependent symbols its outputs compute, and the pending constants that can
  // now be computed from them.
  void after_node(const Node& n) {
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

  std::string binary(const char* op, const std::string& a, const std::string& b) {
    const std::string y = add_temp(std::string("dims/") + op, DType::kInt64, {1});
    add_node(fresh(std::string("dims/") + op), op, {a, b}, {y});
    return y;
  }
  std::string int_const(int64_t c) { return add_const("dims/c", Tensor::from_int64s({c})); }
  // floor(e / d) for any sign of e: (e - mod(e, d)) / d, ONNX's integer Mod taking the divisor's sign.
  std::string floor_div_of(const std::string& e, int64_t d) {
    const std::string dc = int_const(d);
    const std::string m = add_temp("dims/Mod", DType::kInt64, {1});
    add_node(fresh("dims/Mod"), "Mod", {e, dc}, {m});
    return binary("Div", binary("Sub", e, m), dc);
  }

  // A [1] int64 value computing `e` from the symbols' sizes.
  std::string expr_value(const DimExpr& e) {
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

  // Value `v` (a constant whose elements are expressions) computed into its own name.
  void emit_symbolic_constant(const Value& v) {
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

  // A value made by the exporter between two of its nodes (gets a value_info entry), of type t[s], or with `like`'s
  // dims over the symbols (all but those where s differs from like's shape, which are s's).
  std::string add_temp(const std::string& hint, DType t, const Shape& s, const Value* like = nullptr) {
    Dims d(s.begin(), s.end());
    if (like && like->sym && like->shape.size() == s.size())
      for (size_t k = 0; k < s.size(); ++k)
        if (s[k] == like->shape[k]) d[k] = like->sym->dims[k];
    return add_dims_temp(hint, t, d);
  }

  void emit_slice(const std::string& node, const std::string& x, const std::string& y, int64_t axis, int64_t start,
                  int64_t end) {
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

  void emit_pad(const std::string& node, const std::string& x, const std::string& y, DType dt, size_t rank,
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

  // y = a tensor of y's shape filled with `value`.
  void emit_fill(const std::string& node, const Value& y, double value) {
    if (opset >= 9) {
      auto shape = add_const(node + "/shape", Tensor::from_int64s(y.shape));
      auto* n = add_node(fresh(node + "/ConstantOfShape"), "ConstantOfShape", {shape}, {y.name});
      set_attr(n->add_attribute(), "value", filled(y.dtype, {1}, value));
    } else {
      auto* n = add_node(fresh(node + "/Constant"), "Constant", {}, {y.name});
      set_attr(n->add_attribute(), "value", filled(y.dtype, y.shape, value));
    }
  }

  /// `axes` (an attribute of `n`) checked against the mesh.
  const std::vector<int>& checked(const Node& n, const std::vector<int>& axes) {
    for (int a : axes)
      if (a >= p.mesh.rank())
        throw InternalError(fmt::format("export: node '{}' ({}): mesh axis {} out of range", n.name, n.op_type, a));
    return axes;
  }

  int64_t norm_axis(const Node& n, int64_t axis, size_t rank) {
    int64_t r = static_cast<int64_t>(rank);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r)
      throw InternalError(fmt::format("export: node '{}' ({}): axis out of range", n.name, n.op_type));
    return axis;
  }

  /// Writes the standard ONNX that computes the per-device op `n` (ShardSlice, MaskPad, PartitionOffset) on this
  /// device.
  // The id of program node `n` (a reference into G.nodes).
  int node_index(const Node& n) const { return static_cast<int>(&n - G.nodes.data()); }
  // x's dim `axis` over the symbols.
  static DimExpr dim_of(const Value& x, int64_t axis) {
    return x.sym ? x.sym->dims[static_cast<size_t>(axis)] : DimExpr(x.shape[static_cast<size_t>(axis)]);
  }
  // True when per-device op `ni` on x's `axis` involves the dim symbols (its input dim there, or an attribute).
  bool symbolic_window(const Value& x, int64_t axis, int ni) const {
    return !dim_of(x, axis).is_constant() || has_symbolic_attrs(ni);
  }
  // True when an attribute of program node `ni` is an expression over the symbols (SpmdProgram::sym_attrs).
  bool has_symbolic_attrs(int ni) const {
    return std::any_of(p.sym_attrs.begin(), p.sym_attrs.end(),
                       [&](const SpmdProgram::SymbolicAttr& a) { return a.node == ni; });
  }

  void specialise(const Node& n, GspmdOp op) {
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

  /// window() over the dim symbols: the same, its bounds computed on the device from the symbols' sizes (a Slice of
  /// the kept elements, then a Pad to `len`).
  void window_symbolic(const Node& n, const Value& x, const Value& y, int64_t axis, const DimExpr& lo,
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

  /// y[i] = x[lo + i] along `axis` for lo + i inside [keep_lo, keep_hi), `value` elsewhere (len elements): Identity,
  /// a Slice, a Slice + Pad, or a fill, whichever is the device's case. Both ShardSlice and MaskPad become this.
  void window(const Node& n, const Value& x, const Value& y, int64_t axis, int64_t lo, int64_t len, int64_t keep_lo,
              int64_t keep_hi, double value) {
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

  // ---- --collectives ort: ONNX Runtime's com.microsoft collectives (docs/collectives.md, "ONNX Runtime") ----
  // They run over all ranks of one world communicator (rank r = device r) and have no group, reduction or split-axis
  // attribute: AllReduce sums float tensors, AllGather concatenates along `axis` (group_size = all devices), AllToAll
  // exchanges the N contiguous chunks of its input. Other collectives are lowered onto them and standard ONNX ops;
  // every device's lowering of one collective is the same sequence of com.microsoft calls, so the ranks stay matched.

  bool ort_used = false;

  [[noreturn]] void ort_refuse(const Node& n, const std::string& why) const {
    throw InputError(fmt::format("--collectives ort: node '{}' ({}): {}", n.name, n.op_type, why));
  }

  /// The type ORT's AllGather and AllToAll carry a `t` tensor as: their type constraint is float16, float, double,
  /// int64 and bool; bfloat16 travels as float and narrower integers as int64 (both exact); kUndefined otherwise.
  static DType ort_wire_type(DType t) {
    switch (t) {
      case DType::kFloat16:
      case DType::kFloat32:
      case DType::kFloat64:
      case DType::kInt64:
      case DType::kBool: return t;
      case DType::kBFloat16: return DType::kFloat32;
      case DType::kInt8:
      case DType::kInt16:
      case DType::kInt32:
      case DType::kUInt8:
      case DType::kUInt16:
      case DType::kUInt32: return DType::kInt64;
      default: return DType::kUndefined;
    }
  }

  onnx::NodeProto* add_ms_node(const std::string& node, const std::string& op, const std::string& x,
                               const std::string& y) {
    ort_used = true;
    auto* n = add_node(fresh(node + "/" + op), op, {x}, {y});
    n->set_domain(kOrtDomain);
    return n;
  }

  // The lowering's shapes are dims over the symbols (a static dim is a constant expression): its temps declare them
  // as dim_params and its Reshape targets are computed from the run's sizes (expr_value), so that a device file over
  // the symbols stays one (docs/shapes.md).
  using Dims = std::vector<DimExpr>;
  static Dims dims_of_value(const Value& v) { return v.sym ? v.sym->dims : Dims(v.shape.begin(), v.shape.end()); }

  /// A temp of type t with the dims `d`.
  std::string add_dims_temp(const std::string& hint, DType t, const Dims& d) {
    Value v;
    v.name = fresh(hint);
    v.dtype = t;
    bool symbolic = false;
    for (const DimExpr& e : d) {
      v.shape.push_back(e.eval(G.dim_hints));
      symbolic = symbolic || !e.is_constant();
    }
    if (symbolic) v.sym = std::make_shared<const SymbolicValue>(SymbolicValue{d, std::nullopt});
    set_value_info(pg->add_value_info(), v);
    return v.name;
  }

  /// The int64 [rank] shape operand holding `d`: a constant, or the dims computed from the run's sizes.
  std::string shape_operand(const Node& n, const Dims& d) {
    if (std::all_of(d.begin(), d.end(), [](const DimExpr& e) { return e.is_constant(); })) {
      std::vector<int64_t> v;
      for (const DimExpr& e : d) v.push_back(e.constant_part());
      return add_const(n.name + "/shape", Tensor::from_int64s(v));
    }
    std::vector<std::string> parts;
    for (const DimExpr& e : d) parts.push_back(expr_value(e));
    const std::string y = add_temp(n.name + "/shape", DType::kInt64, {static_cast<int64_t>(d.size())});
    set_attr(add_node(fresh(n.name + "/Concat"), "Concat", parts, {y})->add_attribute(), "axis", int64_t{0});
    return y;
  }

  /// `x` (of type `from`) as type `to`: x itself or a Cast to a temp of dims `d`, or to `out` when given.
  std::string cast(const Node& n, const std::string& x, DType from, DType to, const Dims& d,
                   const std::string& out = "") {
    if (from == to) return x;
    if (opset < 6) ort_refuse(n, fmt::format("casting {} needs ai.onnx opset >= 6", dtype_name(from)));
    std::string y = out.empty() ? add_dims_temp(n.name + "/cast", to, d) : out;
    auto* c = add_node(fresh(n.name + "/Cast"), "Cast", {x}, {y});
    set_attr(c->add_attribute(), "to", static_cast<int64_t>(to));
    return y;
  }

  /// `x` reshaped to the dims `to` (a temp, or `out`).
  std::string reshape(const Node& n, const std::string& x, DType t, const Dims& to, const std::string& out = "") {
    std::string y = out.empty() ? add_dims_temp(n.name + "/reshaped", t, to) : out;
    if (opset >= 5) {
      add_node(fresh(n.name + "/Reshape"), "Reshape", {x, shape_operand(n, to)}, {y});
      return y;
    }
    std::vector<int64_t> shape;
    for (const DimExpr& e : to) {
      if (!e.is_constant()) ort_refuse(n, "a Reshape to dims over the symbols needs ai.onnx opset >= 5");
      shape.push_back(e.constant_part());
    }
    auto* r = add_node(fresh(n.name + "/Reshape"), "Reshape", {x}, {y});
    set_attr(r->add_attribute(), "shape", shape);
    return y;
  }

  /// `x` of dims `d` transposed by `perm` (a temp).
  std::string transpose(const Node& n, const std::string& x, DType t, const Dims& d, const std::vector<int64_t>& perm) {
    Dims to;
    for (int64_t a : perm) to.push_back(d[static_cast<size_t>(a)]);
    std::string y = add_dims_temp(n.name + "/transposed", t, to);
    auto* tr = add_node(fresh(n.name + "/Transpose"), "Transpose", {x}, {y});
    set_attr(tr->add_attribute(), "perm", perm);
    return y;
  }

  /// [members.size(), ...x] of type `wire`: the x of the devices `members` (global ids, in order), gathered from all
  /// devices: x as [1, ...x], com.microsoft.AllGather along axis 0, then a Gather of the members' rows (none when
  /// the members are all devices in order).
  std::string gather_rows(const Node& n, const Value& x, DType wire, const std::vector<int64_t>& members) {
    const int64_t N = p.mesh.num_devices();
    const Dims d = dims_of_value(x);
    Dims one = d, all = d, sel = d;
    one.insert(one.begin(), 1);
    all.insert(all.begin(), N);
    sel.insert(sel.begin(), static_cast<int64_t>(members.size()));
    const std::string x1 = reshape(n, cast(n, x.name, x.dtype, wire, d), wire, one);
    const std::string g = add_dims_temp(n.name + "/all", wire, all);
    auto* ag = add_ms_node(n.name, "AllGather", x1, g);
    set_attr(ag->add_attribute(), "axis", int64_t{0});
    set_attr(ag->add_attribute(), "group_size", N);
    bool identity = static_cast<int64_t>(members.size()) == N;
    for (size_t k = 0; identity && k < members.size(); ++k) identity = members[k] == static_cast<int64_t>(k);
    if (identity) return g;
    const std::string rows = add_dims_temp(n.name + "/members_x", wire, sel);
    auto* ga = add_node(fresh(n.name + "/Gather"), "Gather",
                        {g, add_const(n.name + "/members", Tensor::from_int64s(members))}, {rows});
    set_attr(ga->add_attribute(), "axis", int64_t{0});
    return rows;
  }

  /// The reduction of `rows` ([n, ...d], type `wire`) over axis 0, into a temp of dims `d` (or `out`).
  std::string reduce_rows(const Node& n, const std::string& rows, DType wire, const Dims& d, ReductionKind r,
                          const std::string& out = "") {
    if (wire == DType::kBool) ort_refuse(n, "ONNX Runtime's collectives cannot reduce bool tensors");
    static const char* const kOps[] = {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"};
    const std::string op = kOps[static_cast<int>(r)];
    const std::string y = out.empty() ? add_dims_temp(n.name + "/reduced", wire, d) : out;
    onnx::NodeProto* red = nullptr;
    if (opset >= (r == ReductionKind::kSum ? 13 : 18)) {  // axes became an input (ReduceSum-13, the others 18)
      red = add_node(fresh(n.name + "/" + op), op, {rows, add_const(n.name + "/axes", Tensor::from_int64s({0}))}, {y});
    } else {
      red = add_node(fresh(n.name + "/" + op), op, {rows}, {y});
      set_attr(red->add_attribute(), "axes", std::vector<int64_t>{0});
    }
    set_attr(red->add_attribute(), "keepdims", int64_t{0});
    return y;
  }

  /// `rows` ([count, ...d]: count members' tensors in order) concatenated along `axis` of `d` into `out`: the leading
  /// axis moved in front of `axis` (Transpose), then merged with it (Reshape).
  void merge_rows(const Node& n, const std::string& rows, int64_t count, DType wire, const Dims& d, int64_t axis,
                  const std::string& out) {
    std::string x = rows;
    if (axis > 0) {
      Dims in = d;
      in.insert(in.begin(), count);
      std::vector<int64_t> perm;
      for (int64_t k = 1; k <= axis; ++k) perm.push_back(k);
      perm.push_back(0);
      for (int64_t k = axis + 1; k <= static_cast<int64_t>(d.size()); ++k) perm.push_back(k);
      x = transpose(n, rows, wire, in, perm);
    }
    Dims merged = d;
    merged[static_cast<size_t>(axis)] = merged[static_cast<size_t>(axis)] * count;
    reshape(n, x, wire, merged, out);
  }

  /// Writes collective `n` as ONNX Runtime's com.microsoft collectives and standard ops (ExportOptions). Over the dim
  /// symbols every shape is dims over them; the axes a collective splits (reduce-scatter, all-to-all) are static, as
  /// the reshard planner never splits a symbolic dim by a collective (ReshardPlanner::plan's ragged dims).
  void lower_ort(const Node& n) {
    const CollectiveAttrs a = collective_attrs(n);
    const std::vector<int>& axes = checked(n, a.mesh_axes);
    const Value& x = G.values.at(n.inputs.at(0));
    const Value& y = G.values.at(n.outputs.at(0));
    const Dims X = dims_of_value(x), Y = dims_of_value(y);
    const int64_t N = p.mesh.num_devices();
    std::vector<int64_t> members;
    for (auto& grp : p.mesh.replica_groups(axes))
      if (std::find(grp.begin(), grp.end(), device) != grp.end()) members = grp;
    const int64_t ng = static_cast<int64_t>(members.size()), tile = p.mesh.tile_index(device, axes);
    // ORT's world: every device (enough for the sums), in device order (for what concatenates in rank order)
    const bool world = ng == N;
    bool in_order = world;
    for (int64_t k = 0; in_order && k < ng; ++k) in_order = members[static_cast<size_t>(k)] == k;
    const DType wire = ort_wire_type(x.dtype);
    if (wire == DType::kUndefined)
      ort_refuse(n, fmt::format("ONNX Runtime's AllGather and AllToAll carry float16, float, double, int64 or bool "
                                "tensors, not {}",
                                dtype_name(x.dtype)));
    const bool floating = x.dtype == DType::kFloat16 || x.dtype == DType::kFloat32 || x.dtype == DType::kFloat64;
    const bool ort_sum = a.kind == Collective::kAllReduce && world && a.reduction == ReductionKind::kSum && floating;
    const size_t rank = x.shape.size();
    // One member's part of static dim `axis` of dims `d` (what a reduce-scatter or an all-to-all splits).
    auto part = [&](const Dims& d, int64_t axis) {
      const DimExpr& e = d[static_cast<size_t>(axis)];
      if (!e.is_constant())
        throw InternalError(
            fmt::format("export: node '{}' ({}) splits the symbolic dim {} ({})", n.name, n.op_type, axis, e.str()));
      return e.constant_part() / ng;
    };
    // The result in the wire type: y itself, or a temp cast to y at the end.
    const std::string out = wire == y.dtype ? y.name : add_dims_temp(n.name + "/result", wire, Y);
    switch (a.kind) {
      case Collective::kAllReduce:
        if (ort_sum) {
          add_ms_node(n.name, "AllReduce", x.name, y.name);
          return;
        }
        reduce_rows(n, gather_rows(n, x, wire, members), wire, X, a.reduction, out);
        break;
      case Collective::kAllGather: {
        const int64_t axis = norm_axis(n, a.axis, rank);
        if (in_order) {
          auto* ag = add_ms_node(n.name, "AllGather", cast(n, x.name, x.dtype, wire, X), out);
          set_attr(ag->add_attribute(), "axis", axis);
          set_attr(ag->add_attribute(), "group_size", N);
          break;
        }
        merge_rows(n, gather_rows(n, x, wire, members), ng, wire, X, axis, out);
        break;
      }
      case Collective::kReduceScatter: {
        const int64_t axis = norm_axis(n, a.axis, rank);
        std::string full;
        if (world && a.reduction == ReductionKind::kSum && floating) {
          full = add_dims_temp(n.name + "/reduced", x.dtype, X);
          add_ms_node(n.name, "AllReduce", x.name, full);
        } else {
          full = reduce_rows(n, gather_rows(n, x, wire, members), wire, X, a.reduction);
        }
        const int64_t c = part(X, axis);
        emit_slice(n.name, full, out, axis, tile * c, (tile + 1) * c);
        break;
      }
      case Collective::kAllToAll: {
        const int64_t sa = norm_axis(n, a.split_axis, rank), ca = norm_axis(n, a.concat_axis, rank);
        const int64_t c = part(X, sa);
        Dims chunk = X;  // one member's chunk
        chunk[static_cast<size_t>(sa)] = c;
        Dims rows_dims = chunk;
        rows_dims.insert(rows_dims.begin(), ng);
        std::string rows;
        if (in_order) {
          std::string xi = cast(n, x.name, x.dtype, wire, X);
          if (sa == 0 && ca == 0) {
            auto* aa = add_ms_node(n.name, "AllToAll", xi, out);
            set_attr(aa->add_attribute(), "group_size", N);
            break;
          }
          // x as [N, ...chunk]: split_axis cut into [N, c] and N moved to the front; AllToAll swaps the N chunks.
          Dims cut = X;
          cut[static_cast<size_t>(sa)] = c;
          cut.insert(cut.begin() + sa, N);
          std::string front = reshape(n, xi, wire, cut);
          if (sa > 0) {
            std::vector<int64_t> perm{sa};
            for (int64_t k = 0; k <= static_cast<int64_t>(rank); ++k)
              if (k != sa) perm.push_back(k);
            front = transpose(n, front, wire, cut, perm);
          }
          rows = add_dims_temp(n.name + "/exchanged", wire, rows_dims);
          auto* aa = add_ms_node(n.name, "AllToAll", front, rows);
          set_attr(aa->add_attribute(), "group_size", N);
        } else {
          // every member's x, then each one's chunk `tile` along split_axis
          rows = add_dims_temp(n.name + "/chunks", wire, rows_dims);
          emit_slice(n.name, gather_rows(n, x, wire, members), rows, sa + 1, tile * c, (tile + 1) * c);
        }
        merge_rows(n, rows, ng, wire, chunk, ca, out);
        break;
      }
      case Collective::kCollectivePermute: {
        const int64_t src = permute_sources(p.mesh, axes, a.shift, a.target_axes, a.wrap).at(static_cast<size_t>(tile));
        Dims one = X;
        one.insert(one.begin(), 1);
        if (src >= 0) {
          reshape(n, gather_rows(n, x, wire, {members[static_cast<size_t>(src)]}), wire, X, out);
          break;
        }
        // No source: zeros, computed from the gathered rows so that this device still takes part in the AllGather.
        const std::string own = gather_rows(n, x, wire, {device});
        Dims none = one;
        none[0] = 0;
        const std::string empty = add_dims_temp(n.name + "/empty", wire, none);
        emit_slice(n.name, own, empty, 0, 0, 0);
        const std::string zeros = add_dims_temp(n.name + "/zeros", wire, one);
        emit_pad(n.name, empty, zeros, wire, one.size(), 0, 0, 1, 0.0);
        reshape(n, zeros, wire, X, out);
        break;
      }
    }
    if (out != y.name) cast(n, out, wire, y.dtype, Y, y.name);
  }

  /// The partitioner writes the ops it adds (Slice, Unsqueeze, ReduceSum, ...) in their newest form, operands such as
  /// `axes` as constant inputs; a model at an older opset takes them as attributes. Rewrites `pn` (node `n`) into the
  /// form of this model's opset so that the file is valid ONNX (docs/collectives.md).
  void opset_form(const Node& n, onnx::NodeProto* pn) {
    if (!n.domain.empty() && n.domain != "ai.onnx") return;
    struct Form {
      const char* op;
      int64_t since;                        // the opset from which the operands are inputs
      std::vector<const char*> attributes;  // per input from 1: the attribute it was before (nullptr: must be ones)
    };
    static const Form kForms[] = {
        {"Slice", 10, {"starts", "ends", "axes", nullptr}},
        {"Unsqueeze", 13, {"axes"}},
        {"Squeeze", 13, {"axes"}},
        {"Split", 13, {"split"}},
        {"ReduceSum", 13, {"axes"}},
        {"ReduceMax", 18, {"axes"}},
        {"ReduceMin", 18, {"axes"}},
        {"ReduceMean", 18, {"axes"}},
        {"ReduceProd", 18, {"axes"}},
        {"ReduceSumSquare", 18, {"axes"}},
        {"ReduceL1", 18, {"axes"}},
        {"ReduceL2", 18, {"axes"}},
        {"ReduceLogSum", 18, {"axes"}},
        {"ReduceLogSumExp", 18, {"axes"}},
    };
    const Form* f = nullptr;
    for (const Form& x : kForms)
      if (n.op_type == x.op) f = &x;
    if (!f || opset >= f->since || pn->input_size() < 2) return;
    for (int k = 1; k < pn->input_size(); ++k) {
      const int v = n.inputs.at(static_cast<size_t>(k));
      if (v < 0) continue;  // an absent optional input
      const Value& c = G.values.at(static_cast<size_t>(v));
      if (!c.data || static_cast<size_t>(k - 1) >= f->attributes.size())
        throw InternalError(
            fmt::format("export: node '{}' ({}) at opset {}: input {} is not a constant it can "
                        "take as an attribute",
                        n.name, n.op_type, opset, k));
      const std::vector<int64_t> values = c.data->as_int64s();
      if (const char* name = f->attributes[static_cast<size_t>(k - 1)]) {
        set_attr(pn->add_attribute(), name, values);
      } else if (std::any_of(values.begin(), values.end(), [](int64_t x) { return x != 1; })) {
        throw InternalError(fmt::format("export: node '{}' (Slice) at opset {} has steps other than 1", n.name, opset));
      }
    }
    pn->mutable_input()->DeleteSubrange(1, pn->input_size() - 1);
  }

  void copy_node(const Node& n) {
    auto* pn = pg->add_node();
    write_node(n, pn, value_names_);
    opset_form(n, pn);
    if (!n.domain.empty()) domains.insert(n.domain);
    if (is_collective(n)) {
      const CollectiveAttrs a = collective_attrs(n);
      const std::vector<int>& axes = checked(n, a.mesh_axes);
      const auto groups = p.mesh.replica_groups(axes);
      std::vector<int64_t> flat;
      for (const auto& grp : groups) flat.insert(flat.end(), grp.begin(), grp.end());
      set_attr(pn->add_attribute(), "replica_groups", flat);
      set_attr(pn->add_attribute(), "group_size", p.mesh.axes_size(axes));
      if (a.kind == Collective::kCollectivePermute) {
        const std::vector<int64_t> src = permute_sources(p.mesh, axes, a.shift, a.target_axes, a.wrap);
        std::vector<int64_t> pairs;
        for (const auto& grp : groups) {
          for (size_t t = 0; t < grp.size(); ++t) {
            if (src[t] < 0) continue;
            pairs.push_back(grp[static_cast<size_t>(src[t])]);
            pairs.push_back(grp[t]);
          }
        }
        set_attr(pn->add_attribute(), "source_target_pairs", pairs);
      }
    }
  }

  void run(const std::string& path) {
    if (device < 0 || device >= p.mesh.num_devices())
      throw std::invalid_argument(
          fmt::format("export_device: device {} out of range (mesh has {})", device, p.mesh.num_devices()));
    m.set_ir_version(8);
    m.set_producer_name("gspmd-onnx");
    m.set_model_version(1);
    pg = m.mutable_graph();
    pg->set_name(fmt::format("{}_device_{}", G.name.empty() ? global.name : G.name, device));
    auto meta = [&](const std::string& k, const std::string& v) {
      auto* e = m.add_metadata_props();
      e->set_key(k);
      e->set_value(v);
    };
    meta("gspmd.device", std::to_string(device));
    meta("gspmd.num_devices", std::to_string(p.mesh.num_devices()));
    frontend::set_mesh_metadata(m, p.mesh);
    meta("gspmd.program_fingerprint", fmt::format("{:016x}", program_fingerprint(p)));
    if (!G.dim_hints.empty()) {  // a device file over the dim symbols (docs/shapes.md): the hints it was made at
      meta("gspmd.dim_hints", bindings_str(G.dim_hints, ","));
      std::string guards;  // what the model assumes of the dims (Graph::dim_guards): its ops check them at run time
      for (const auto& [a, b] : G.dim_guards)
        guards += fmt::format("{}{} == {}", guards.empty() ? "" : "; ", a.str(), b.str());
      if (!guards.empty()) meta("gspmd.dim_guards", guards);
    }
    {
      auto coords = p.mesh.coords(device);
      std::string c;
      for (size_t i = 0; i < coords.size(); ++i) c += (i ? "," : "") + std::to_string(coords[i]);
      meta("gspmd.device_coords", c);
    }

    for (const Value& v : G.values) names.insert(v.name);
    for (const Node& n : G.nodes) names.insert(n.name);
    value_names_ = value_names(G);

    std::unordered_map<int, const ProgramBinding*> params;
    for (const auto& b : p.params) params[b.local] = &b;

    std::unordered_set<int> io;
    for (int v : G.inputs) {
      set_value_info(pg->add_input(), G.values.at(v));
      io.insert(v);
    }
    // A training step's donated params (its weights and optimizer state) are inputs too, after the data inputs;
    // their initializers are the default values (ONNX IR >= 4). The updated values are outputs.
    for (const ProgramBinding& b : p.params)
      if (b.donated) set_value_info(pg->add_input(), G.values.at(b.local));
    for (int v : G.outputs) {
      set_value_info(pg->add_output(), G.values.at(v));
      io.insert(v);
    }
    for (int v = 0; v < static_cast<int>(G.values.size()); ++v) {
      const Value& val = G.values[v];
      if (val.producer >= 0 || !val.is_initializer) continue;
      if (val.sym && val.sym->elems && val.sym->has_symbols()) {
        if (std::any_of(val.sym->elems->begin(), val.sym->elems->end(),
                        [&](const DimExpr& e) { return reads_runtime_dim(G, e); })) {
          pending_constants_.push_back(v);  // after the node that computes its size (after_node)
          continue;
        }
        emit_symbolic_constant(val);
        set_value_info(pg->add_value_info(), val);
        continue;
      }
      auto* init = pg->add_initializer();
      init->set_name(val.name);
      auto it = params.find(v);
      if (it != params.end()) {
        const ProgramBinding& b = *it->second;
        const Value& gv = global.values.at(b.global);
        if (!gv.data)
          throw InternalError(
              fmt::format("export: initializer '{}' has no data (the model was loaded without its weights)", gv.name));
        Tensor t = shard_tensor(*gv.data, b.sharding, p.mesh, device);
        if (t.shape != val.shape || t.dtype != val.dtype)
          throw InternalError(fmt::format("export: slice of '{}' for device {} is {} {} but the program expects {} {}",
                                          gv.name, device, dtype_name(t.dtype), shape_str(t.shape),
                                          dtype_name(val.dtype), shape_str(val.shape)));
        frontend::tensor_to_proto(t, init);
      } else {
        if (!val.data) throw InternalError(fmt::format("export: initializer '{}' has no data", val.name));
        frontend::tensor_to_proto(*val.data, init);
      }
    }
    for (const Node& n : G.nodes) {
      const std::optional<GspmdOp> op = gspmd_op(n);
      if (!op && n.domain == kGspmdDomain)
        throw InternalError(fmt::format("export: node '{}': unknown gspmd op '{}'", n.name, n.op_type));
      if (op && !is_collective(*op))
        specialise(n, *op);
      else if (op && options.collectives == CollectiveFormat::kOrt)
        lower_ort(n);
      else
        copy_node(n);
      for (int o : n.outputs)
        if (!io.count(o)) set_value_info(pg->add_value_info(), G.values.at(o));
      after_node(n);
    }
    if (!pending_constants_.empty())
      throw InternalError(fmt::format("export: constant '{}' reads a data-dependent dim no node computes",
                                      G.values[static_cast<size_t>(pending_constants_[0])].name));
    auto* os = m.add_opset_import();
    os->set_domain("");
    os->set_version(opset);
    if (options.collectives == CollectiveFormat::kGspmd || domains.count(kGspmdDomain)) {
      auto* og = m.add_opset_import();
      og->set_domain(kGspmdDomain);
      og->set_version(1);
    }
    if (ort_used) domains.insert(kOrtDomain);
    for (const auto& d : domains) {
      if (d == kGspmdDomain || d == "ai.onnx") continue;
      auto* o = m.add_opset_import();
      o->set_domain(d);
      o->set_version(1);
    }
    // What another ONNX tool would check: the checker and strict shape inference, the collectives by their gspmd
    // schemas (gspmd_schemas.h). A failure is a bug of the exporter or the partitioner, not bad input.
    try {
      frontend::validate_model(m, path);
    } catch (const InputError& e) {
      throw InternalError(fmt::format("export: the device model fails ONNX validation: {}", e.what()));
    }
    const size_t size = m.ByteSizeLong();
    if (size > static_cast<size_t>(std::numeric_limits<int>::max()))
      throw UnsupportedError(fmt::format("{}: the device model is {} bytes, over protobuf's 2 GiB limit", path, size));
    std::string bytes;
    if (!m.SerializeToString(&bytes)) throw InternalError(fmt::format("{}: cannot serialize the model", path));
    m.Clear();
    frontend::write_file_atomic(path, bytes);
  }
};

}  // namespace

void export_device(const SpmdProgram& p, const Graph& global, int64_t device, const std::string& path,
                   const ExportOptions& options) {
  Exporter e{p,       p.program, global,  device, global.opset > 0 ? global.opset : p.program.opset,
             options, {},        nullptr, {},     {},
             {},      {},        {},      {}};
  e.run(path);
}

}  // namespace gspmd
