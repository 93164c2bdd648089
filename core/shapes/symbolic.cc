// Symbolic shape functions (symbolic.h): one rule per op family, following the ONNX operator specs
// (onnx/docs/Operators.md) at the node's opset, on DimExpr dims.
#include "core/shapes/symbolic.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ir/control_flow.h"
#include "core/shapes/shapes.h"
#include "core/shapes/symbolic_ctx.h"

namespace gspmd {
namespace {

using namespace symbolic_internal;

// ---- elementwise ------------------------------------------------------------------------------------------------

// Elements of a broadcast elementwise op on inputs that all have elements of a static shape: f per output element.
std::optional<Exprs> elementwise_elems(const Ctx& c, const std::function<std::optional<DimExpr>(const Exprs&)>& f) {
  std::vector<Exprs> ins;
  std::vector<Shape> shapes;
  for (size_t i = 0; i < c.in.size(); ++i) {
    auto e = c.elems(i);
    if (!e) return std::nullopt;
    if (c.in[i].sym && std::any_of(c.in[i].sym->dims.begin(), c.in[i].sym->dims.end(),
                                   [](const DimExpr& d) { return !d.is_constant(); }))
      return std::nullopt;
    ins.push_back(std::move(*e));
    shapes.push_back(c.in[i].type->shape);
  }
  const Shape& os = c.out.at(0).shape;
  const int64_t n = num_elements(os);
  if (n > 4096) return std::nullopt;
  Exprs out;
  out.reserve(static_cast<size_t>(n));
  std::vector<int64_t> idx(os.size(), 0);
  Exprs args(ins.size());
  for (int64_t k = 0; k < n; ++k) {
    for (size_t i = 0; i < ins.size(); ++i) {  // the element of input i that output index idx reads
      int64_t off = 0;
      const Shape& s = shapes[i];
      for (size_t d = 0; d < s.size(); ++d) {
        const size_t od = d + os.size() - s.size();
        off = off * s[d] + (s[d] == 1 ? 0 : idx[od]);
      }
      args[i] = ins[i][static_cast<size_t>(off)];
    }
    auto r = f(args);
    if (!r) return std::nullopt;
    out.push_back(std::move(*r));
    for (size_t d = os.size(); d-- > 0;)
      if (++idx[d] < os[d])
        break;
      else
        idx[d] = 0;
  }
  return out;
}

// Integer division as ONNX's Div on int tensors (truncation) for a non-negative dividend and a positive constant
// divisor, or an exact quotient.
std::optional<DimExpr> div_elem(const DimExpr& a, const DimExpr& b, bool integer) {
  if (auto q = exact_div(a, b)) return q;
  auto d = b.constant();
  if (integer && d && *d > 0 && known_ge(a, 0) == std::optional<bool>(true)) return floor_div(a, *d);
  return std::nullopt;
}

std::optional<DimExpr> compare_elem(const std::string& op, const DimExpr& a, const DimExpr& b) {
  std::optional<bool> r;
  if (op == "Equal") r = known_eq(a, b);
  if (op == "Less") r = known_ge(b, a + 1);
  if (op == "LessOrEqual") r = known_ge(b, a);
  if (op == "Greater") r = known_ge(a, b + 1);
  if (op == "GreaterOrEqual") r = known_ge(a, b);
  if (!r) return std::nullopt;
  return DimExpr(*r ? 1 : 0);
}

std::vector<SymbolicValue> broadcast_rule(const Ctx& c) {
  Exprs d = c.dims(0);
  for (size_t i = 1; i < c.in.size(); ++i)
    if (c.has(i)) d = c.broadcast(d, c.dims(i));
  const std::string& op = c.node.op_type;
  const bool integer = !is_floating(c.out.at(0).dtype);
  std::optional<Exprs> e = elementwise_elems(c, [&](const Exprs& a) -> std::optional<DimExpr> {
    if (op == "Add" || op == "Sum") return a.size() == 2 ? a[0] + a[1] : std::optional<DimExpr>{};
    if (op == "Sub") return a[0] - a[1];
    if (op == "Mul") return a[0] * a[1];
    if (op == "Div") return div_elem(a[0], a[1], integer);
    if (op == "Max") return a.size() == 2 ? max(a[0], a[1]) : std::optional<DimExpr>{};
    if (op == "Min") return a.size() == 2 ? min(a[0], a[1]) : std::optional<DimExpr>{};
    if (op == "Where") {
      auto cond = a[0].constant();
      if (!cond) return std::nullopt;
      return *cond ? a[1] : a[2];
    }
    if (a.size() == 2) return compare_elem(op, a[0], a[1]);
    return std::nullopt;
  });
  return {with_elems(std::move(d), std::move(e))};
}

// Ops whose outputs have input 0's dims (unary elementwise, Softmax, Trilu, Cast, ...); Identity, Cast, Neg and
// Abs of a non-negative value keep elements.
std::vector<SymbolicValue> same_dims_rule(const Ctx& c) {
  Exprs d = c.dims(0);
  std::optional<Exprs> e;
  const std::string& op = c.node.op_type;
  if (op == "Identity" || op == "Cast" || op == "CastLike" || op == "Neg" || op == "Abs") {
    e = c.elems(0);
    if (e && op == "Neg")
      for (DimExpr& x : *e) x = -x;
    if (e && op == "Abs")
      for (const DimExpr& x : *e)
        if (known_ge(x, 0) != std::optional<bool>(true)) e.reset();
    if (e && op == "Cast" && c.out.at(0).dtype == DType::kBool) e.reset();
  }
  if (op == "Clip" && c.opset >= 11) {  // min(max(x, lo), hi) with constant bounds (torch's clamp of a count)
    e = c.elems(0);
    for (size_t i = 1; i < 3 && e; ++i) {
      if (!c.has(i)) continue;
      const std::optional<Exprs> b = c.elems(i);
      if (!b || b->size() != 1) {
        e.reset();
        break;
      }
      for (DimExpr& x : *e) x = i == 1 ? max(x, (*b)[0]) : min(x, (*b)[0]);
    }
  }
  std::vector<SymbolicValue> r{with_elems(d, std::move(e))};
  for (size_t k = 1; k < c.out.size(); ++k) r.push_back(dims_only(d));  // Dropout's mask
  return r;
}

// LayerNormalization: Y as X; Mean and InvStdDev keep X's dims before `axis` and 1 after.
std::vector<SymbolicValue> layer_norm_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  const int64_t ax = c.axis(c.node.i("axis", -1), c.rank(0));
  Exprs stat(d.begin(), d.begin() + ax);
  stat.resize(d.size(), DimExpr(1));
  std::vector<SymbolicValue> r{dims_only(d)};
  for (size_t k = 1; k < c.out.size(); ++k) r.push_back(dims_only(stat));
  return r;
}

// ---- shapes from values -----------------------------------------------------------------------------------------

DimExpr scalar(const Ctx& c, size_t i, std::string_view what) {
  const Exprs e = c.needs_elems(i, what);
  if (e.size() != 1) c.unsupported(fmt::format("{} is not a scalar", what));
  return e[0];
}

std::vector<SymbolicValue> range_rule(const Ctx& c) {
  const DimExpr start = scalar(c, 0, "the start"), limit = scalar(c, 1, "the limit");
  auto delta = scalar(c, 2, "the delta").constant();
  if (!delta || *delta == 0) c.unsupported("a delta that is not a non-zero constant");
  const DimExpr n = *delta > 0 ? ceil_div(limit - start, *delta) : ceil_div(start - limit, -*delta);
  return {dims_only({max(n, 0)})};
}

std::vector<SymbolicValue> constant_of_shape_rule(const Ctx& c) {
  Exprs d = c.needs_elems(0, "the shape");
  for (const DimExpr& x : d)
    if (known_ge(x, 0) != std::optional<bool>(true)) c.unsupported(fmt::format("a dim {} of unknown sign", x.str()));
  return {dims_only(std::move(d))};
}

std::vector<SymbolicValue> expand_rule(const Ctx& c) {
  return {dims_only(c.broadcast(c.dims(0), c.needs_elems(1, "the shape")))};
}

std::vector<SymbolicValue> tile_rule(const Ctx& c) {
  Exprs d = c.dims(0);
  const Exprs rep = c.needs_elems(1, "the repeats");
  if (rep.size() != d.size()) c.unsupported("repeats of another length than the rank");
  for (size_t i = 0; i < d.size(); ++i) d[i] = d[i] * rep[i];
  return {dims_only(std::move(d))};
}

// ---- windows and images: Conv, the pools, the normalizations, Resize ---------------------------------------------

// True when input i's dims after the first `from` are all static (a dynamic batch, static channels and image).
bool static_after(const Ctx& c, size_t i, size_t from) {
  const Exprs d = c.dims(i);
  return std::all_of(d.begin() + static_cast<std::ptrdiff_t>(std::min(from, d.size())), d.end(),
                     [](const DimExpr& e) { return e.is_constant(); });
}

// Output k with input 0's batch dim and the shape function's other dims: right when those other dims do not read a
// symbol (static_after(c, 0, 1) and static weights): an image op on a dynamic batch.
SymbolicValue batch_and_static(const Ctx& c, size_t k) {
  Exprs o(c.out.at(k).shape.begin(), c.out.at(k).shape.end());
  if (!o.empty()) o[0] = c.dims(0).at(0);
  return dims_only(std::move(o));
}

// The sliding window's output size over a symbolic input size `in` (auto_pad NOTSET or VALID without ceil_mode, or
// SAME_*), as geometry.h's make_window computes it for numbers.
DimExpr window_out(const Ctx& c, const DimExpr& in, size_t sd, size_t nsp, int64_t kernel) {
  const std::string ap = c.node.s("auto_pad", "NOTSET");
  auto attr = [&](const char* name, size_t i, int64_t def) {
    const std::vector<int64_t> v = c.node.ints(name);
    return i < v.size() ? v[i] : def;
  };
  const int64_t s = attr("strides", sd, 1), dil = attr("dilations", sd, 1), ext = (kernel - 1) * dil + 1;
  if (s <= 0) c.unsupported("a stride that is not positive");
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") return ceil_div(in, s);
  if (c.node.i("ceil_mode", 0) != 0) c.unsupported("a pool with ceil_mode over a symbolic image dim");
  const int64_t pads = ap == "VALID" ? 0 : attr("pads", sd, 0) + attr("pads", sd + nsp, 0);
  return floor_div(in + pads - ext, s) + 1;
}

// Conv and the pools: [N, C, spatial...] with the spatial dims from window_out (or the shape function's when static).
std::vector<SymbolicValue> window_rule(const Ctx& c) {
  const Exprs x = c.dims(0);
  const bool conv = c.node.op_type == "Conv" || c.node.op_type == "ConvInteger" || c.node.op_type == "QLinearConv";
  const size_t wi = c.node.op_type == "QLinearConv" ? 3 : 1;
  if (conv && !static_after(c, wi, 0)) c.unsupported("a weight with symbolic dims");
  std::vector<SymbolicValue> r;
  for (size_t k = 0; k < c.out.size(); ++k) {
    SymbolicValue v = batch_and_static(c, k);
    if (!conv) v.dims.at(1) = x.at(1);
    const size_t nsp = x.size() - 2;
    for (size_t sd = 0; sd < nsp; ++sd) {
      if (x[2 + sd].is_constant()) continue;
      const int64_t kernel = conv ? c.in[wi].type->shape.at(2 + sd) : c.node.ints("kernel_shape").at(sd);
      v.dims.at(2 + sd) = window_out(c, x[2 + sd], sd, nsp, kernel);
    }
    r.push_back(std::move(v));
  }
  return r;
}

// GlobalAveragePool and the like: [N, C, 1, ...].
std::vector<SymbolicValue> global_pool_rule(const Ctx& c) {
  Exprs o = c.dims(0);
  for (size_t d = 2; d < o.size(); ++d) o[d] = 1;
  return {dims_only(std::move(o))};
}

// Ops whose output 0 is input 0's shape and whose other outputs (BatchNormalization's training statistics) are
// static per-channel vectors.
std::vector<SymbolicValue> normalization_rule(const Ctx& c) {
  std::vector<SymbolicValue> r{dims_only(c.dims(0))};
  for (size_t k = 1; k < c.out.size(); ++k) {
    if (!static_after(c, 0, 1)) c.unsupported("statistics over a symbolic channel dim");
    r.push_back(dims_only(Exprs(c.out[k].shape.begin(), c.out[k].shape.end())));
  }
  return r;
}

// Ops on a dynamic batch whose other dims are static (DepthToSpace, Resize by scales or sizes, Pad, ...): the batch
// passes through; a symbolic dim elsewhere is refused.
std::vector<SymbolicValue> batch_only_rule(const Ctx& c) {
  if (!static_after(c, 0, 1)) c.unsupported(fmt::format("symbolic dims past the batch ({})", dims_str(c.dims(0))));
  for (size_t i = 1; i < c.in.size(); ++i)
    if (c.has(i) && c.in[i].sym) c.unsupported(fmt::format("input {} over the dim symbols", i));
  std::vector<SymbolicValue> r;
  for (size_t k = 0; k < c.out.size(); ++k) r.push_back(batch_and_static(c, k));
  return r;
}

// Resize: to `sizes` (their elements, which torch computes from Shape: [batch, C, H, W]), or by scales on a dynamic
// batch.
std::vector<SymbolicValue> resize_rule(const Ctx& c) {
  if (c.opset >= 11 && c.has(3) && num_elements(c.in[3].type->shape) > 0)
    return {dims_only(c.needs_elems(3, "the sizes"))};
  return batch_only_rule(c);
}

// RoiAlign and MaxRoiPool: [num_rois, C, pooled height, pooled width]: the rois' count (a detector's kept
// proposals: data-dependent), X's channels, the pooled size from the attributes.
std::vector<SymbolicValue> roi_rule(const Ctx& c) {
  Exprs o(c.out.at(0).shape.begin(), c.out.at(0).shape.end());
  o.at(0) = c.dims(1).at(0);
  o.at(1) = c.dims(0).at(1);
  return {dims_only(std::move(o))};
}

const RuleMap& rules() {
  static const RuleMap table = [] {
    RuleMap t;
    for (const char* op : {"Add",      "Sub",        "Mul",       "Div",         "Pow",
                           "Max",      "Min",        "Mod",       "Sum",         "Mean",
                           "Equal",    "Less",       "Greater",   "LessOrEqual", "GreaterOrEqual",
                           "And",      "Or",         "Xor",       "Where",       "PRelu",
                           "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})
      t[op] = broadcast_rule;
    for (const char* op : {"Identity",   "Cast",        "CastLike",
                           "Neg",        "Abs",         "Relu",
                           "Sigmoid",    "Tanh",        "Exp",
                           "Log",        "Sqrt",        "Reciprocal",
                           "Erf",        "Sin",         "Cos",
                           "Tan",        "Floor",       "Ceil",
                           "Round",      "Sign",        "Not",
                           "Softmax",    "LogSoftmax",  "Hardmax",
                           "Trilu",      "Gelu",        "Elu",
                           "Selu",       "Softplus",    "Softsign",
                           "LeakyRelu",  "HardSigmoid", "HardSwish",
                           "Mish",       "IsNaN",       "IsInf",
                           "Clip",       "CumSum",      "Dropout",
                           "BitwiseNot", "Celu",        "ThresholdedRelu",
                           "Asin",       "Acos",        "Atan",
                           "Sinh",       "Cosh",        "Asinh",
                           "Acosh",      "Atanh",       "ScatterElements",
                           "ScatterND",  "Scatter"})
      t[op] = same_dims_rule;
    t["GatherElements"] = [](const Ctx& c) { return std::vector<SymbolicValue>{dims_only(c.dims(1))}; };
    t["LayerNormalization"] = layer_norm_rule;
    add_shape_op_rules(t);
    t["Range"] = range_rule;
    t["ConstantOfShape"] = constant_of_shape_rule;
    t["Expand"] = expand_rule;
    t["Tile"] = tile_rule;
    for (const char* op : {"Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool"})
      t[op] = window_rule;
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}) t[op] = global_pool_rule;
    for (const char* op : {"BatchNormalization", "InstanceNormalization", "LRN", "MeanVarianceNormalization"})
      t[op] = normalization_rule;
    for (const char* op : {"DepthToSpace", "SpaceToDepth", "Upsample", "Pad", "ConvTranspose"}) t[op] = batch_only_rule;
    t["Resize"] = resize_rule;
    for (const char* op : {"RoiAlign", "MaxRoiPool"}) t[op] = roi_rule;
    return t;
  }();
  return table;
}

// ---- the exported collectives (domain gspmd, with group_size) ----------------------------------------------------

std::vector<SymbolicValue> collective_rule(const Ctx& c) {
  Exprs d = c.dims(0);
  if (!c.node.has("group_size")) c.unsupported("a collective without group_size");
  const int64_t n = c.node.i("group_size", 1);
  auto dim = [&](const char* attr) -> DimExpr& { return d[static_cast<size_t>(c.axis(c.node.i(attr, 0), c.rank(0)))]; };
  auto divided = [&](DimExpr& x) {
    auto q = exact_div(x, n);
    if (!q) c.unsupported(fmt::format("dim {} split over a group of {}", x.str(), n));
    x = *q;
  };
  const std::string& op = c.node.op_type;
  if (op == "AllGather") dim("axis") = dim("axis") * n;
  if (op == "ReduceScatter") divided(dim("axis"));
  if (op == "AllToAll") {
    divided(dim("split_axis"));
    dim("concat_axis") = dim("concat_axis") * n;
  }
  return {dims_only(std::move(d))};
}

bool is_collective(const std::string& domain, const std::string& op) {
  return domain == "gspmd" && (op == "AllReduce" || op == "CollectivePermute" || op == "AllGather" ||
                               op == "ReduceScatter" || op == "AllToAll");
}

}  // namespace

bool has_symbolic_rule(const std::string& domain, const std::string& op_type) {
  return ((domain.empty() || domain == "ai.onnx") && rules().count(op_type) != 0) || is_collective(domain, op_type);
}

SymbolicResult infer_symbolic(const Node& node, const std::vector<SymbolicInput>& inputs,
                              const std::vector<TensorType>& outputs, int64_t opset, const DimBindings& hints) {
  SymbolicResult r;
  const Ctx c{node, inputs, outputs, opset, hints, r.assumed_equal};
  if (!has_symbolic_rule(node.domain, node.op_type)) c.unsupported("no symbolic shape rule");
  r.outputs = is_collective(node.domain, node.op_type) ? collective_rule(c) : rules().at(node.op_type)(c);
  r.outputs.resize(std::min(r.outputs.size(), outputs.size()));
  return r;
}

}  // namespace gspmd
