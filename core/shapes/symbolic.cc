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

namespace gspmd {
namespace {

using Exprs = std::vector<DimExpr>;

DimExpr product(const Exprs& e, size_t from = 0, size_t to = std::numeric_limits<size_t>::max()) {
  DimExpr p = 1;
  for (size_t i = from; i < std::min(to, e.size()); ++i) p = p * e[i];
  return p;
}

// Everything a rule sees: the node, its inputs and the numeric output types at the hints.
struct Ctx {
  const Node& node;
  const std::vector<SymbolicInput>& in;
  const std::vector<TensorType>& out;
  int64_t opset;
  const DimBindings& hints;
  std::vector<std::pair<DimExpr, DimExpr>>& guards;

  bool has(size_t i) const { return i < in.size() && in[i].type != nullptr; }
  int64_t rank(size_t i) const { return static_cast<int64_t>(in.at(i).type->shape.size()); }

  // The symbols the inputs read, for the error message.
  std::vector<std::string> symbols() const {
    std::set<std::string> s;
    for (const SymbolicInput& x : in) {
      if (!x.sym) continue;
      for (const DimExpr& d : x.sym->dims)
        for (auto& n : d.symbols()) s.insert(n);
      if (x.sym->elems)
        for (const DimExpr& d : *x.sym->elems)
          for (auto& n : d.symbols()) s.insert(n);
    }
    return {s.begin(), s.end()};
  }
  [[noreturn]] void unsupported(std::string_view why) const {
    throw UnsupportedError(fmt::format("node '{}' ({}): {} for symbolic dims [{}]: bind them with --dim", node.name,
                                       node.op_type, why, fmt::join(symbols(), ", ")));
  }

  // Input i's dims: its expressions, or its static shape.
  Exprs dims(size_t i) const {
    if (!has(i)) unsupported(fmt::format("input {} is absent", i));
    if (in[i].sym) return in[i].sym->dims;
    return Exprs(in[i].type->shape.begin(), in[i].type->shape.end());
  }
  // Input i's elements as expressions: its symbolic elements, or a small constant's values when they are integers
  // (a float Range's delta of 1.0); nullopt otherwise (a computed value, a fraction).
  std::optional<Exprs> elems(size_t i) const {
    if (!has(i)) return std::nullopt;
    if (in[i].sym) return in[i].sym->elems;
    const Tensor* t = in[i].value;
    if (!t || t->numel() > 4096) return std::nullopt;
    const DType dt = t->dtype;
    if (dt != DType::kInt64 && dt != DType::kInt32 && dt != DType::kFloat32 && dt != DType::kBool &&
        dt != DType::kUInt8 && dt != DType::kInt8)
      return std::nullopt;
    if (dt == DType::kFloat32) {
      for (int64_t k = 0; k < t->numel(); ++k) {
        const float x = t->data<float>()[k];
        if (!(std::abs(x) < 1e15f) || x != std::floor(x)) return std::nullopt;
      }
    }
    const std::vector<int64_t> v = t->as_int64s();
    return Exprs(v.begin(), v.end());
  }
  // Input i's elements, required (a shape operand): UnsupportedError when they are not expressions.
  Exprs needs_elems(size_t i, std::string_view what) const {
    if (auto e = elems(i)) return *e;
    unsupported(fmt::format("{} (input {}) is computed from values, not from dims,", what, i));
  }
  // Input i's elements, required to be constants (axes, steps, repeats).
  std::vector<int64_t> needs_ints(size_t i, std::string_view what) const {
    std::vector<int64_t> r;
    for (const DimExpr& e : needs_elems(i, what)) {
      auto c = e.constant();
      if (!c) unsupported(fmt::format("{} depend on the symbols ({})", what, e.str()));
      r.push_back(*c);
    }
    return r;
  }
  int64_t axis(int64_t a, int64_t r) const {
    const int64_t x = a < 0 ? a + r : a;
    if (x < 0 || x >= r) unsupported(fmt::format("axis {} out of range for rank {}", a, r));
    return x;
  }
  // The broadcast of two dims: equal, or one of them 1. When that holds at the hints only, it is assumed (a guard):
  // equal dims give the shorter expression, and a dim that is 1 at its hint is assumed to be 1.
  DimExpr broadcast(const DimExpr& a, const DimExpr& b) const {
    if (a == b || b == DimExpr(1)) return a;
    if (a == DimExpr(1)) return b;
    if (known_eq(a, b) == std::optional<bool>(true)) return a;
    const int64_t ha = a.eval(hints), hb = b.eval(hints);
    if (ha == hb) {
      guards.emplace_back(a, b);
      return a.str().size() <= b.str().size() ? a : b;
    }
    if (ha == 1 || hb == 1) {
      guards.emplace_back(ha == 1 ? a : b, DimExpr(1));
      return ha == 1 ? b : a;
    }
    unsupported(fmt::format("dims {} and {} do not broadcast", a.str(), b.str()));
  }
  Exprs broadcast(const Exprs& a, const Exprs& b) const {
    const size_t r = std::max(a.size(), b.size());
    Exprs o(r);
    for (size_t i = 0; i < r; ++i) {
      const DimExpr da = i + a.size() >= r ? a[i + a.size() - r] : DimExpr(1);
      const DimExpr db = i + b.size() >= r ? b[i + b.size() - r] : DimExpr(1);
      o[i] = broadcast(da, db);
    }
    return o;
  }
  // Attribute `attr` (opset < the one that made it input `i`) or input i's constant values.
  std::vector<int64_t> ints_attr_or_input(const char* attr, size_t i, std::string_view what) const {
    if (node.has(attr)) return node.ints(attr);
    if (has(i)) return needs_ints(i, what);
    return {};
  }
};

SymbolicValue dims_only(Exprs d) { return SymbolicValue{std::move(d), std::nullopt}; }
SymbolicValue with_elems(Exprs d, std::optional<Exprs> e) { return SymbolicValue{std::move(d), std::move(e)}; }

using Rule = std::function<std::vector<SymbolicValue>(const Ctx&)>;

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

// ---- shape ops --------------------------------------------------------------------------------------------------

std::vector<SymbolicValue> shape_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  const int64_t r = static_cast<int64_t>(d.size());
  auto clampi = [&](int64_t x) { return std::clamp(x < 0 ? x + r : x, int64_t{0}, r); };
  const int64_t start = clampi(c.node.i("start", 0)), end = clampi(c.node.i("end", r));
  Exprs e(d.begin() + start, d.begin() + std::max(start, end));
  return {with_elems({DimExpr(static_cast<int64_t>(e.size()))}, e)};
}

std::vector<SymbolicValue> size_rule(const Ctx& c) { return {with_elems({}, Exprs{product(c.dims(0))})}; }

std::vector<SymbolicValue> gather_rule(const Ctx& c) {
  const Exprs d = c.dims(0), id = c.dims(1);
  const int64_t ax = c.axis(c.node.i("axis", 0), c.rank(0));
  Exprs o(d.begin(), d.begin() + ax);
  o.insert(o.end(), id.begin(), id.end());
  o.insert(o.end(), d.begin() + ax + 1, d.end());
  std::optional<Exprs> e;
  auto data = c.elems(0);
  auto idx = c.elems(1);
  auto n_ax = d[static_cast<size_t>(ax)].constant();
  if (data && idx && n_ax && c.rank(0) == 1) {  // a shape vector's entries
    e.emplace();
    for (const DimExpr& i : *idx) {
      auto k = i.constant();
      if (!k || *k < -*n_ax || *k >= *n_ax) {
        e.reset();
        break;
      }
      e->push_back((*data)[static_cast<size_t>(*k < 0 ? *k + *n_ax : *k)]);
    }
  }
  return {with_elems(std::move(o), std::move(e))};
}

// GatherND: indices' dims but the last, then data's dims past batch_dims + the index length (static).
std::vector<SymbolicValue> gather_nd_rule(const Ctx& c) {
  const Exprs d = c.dims(0), id = c.dims(1);
  const int64_t b = c.node.i("batch_dims", 0);
  if (id.empty()) c.unsupported("indices of rank 0");
  const std::optional<int64_t> k = id.back().constant();
  if (!k || b < 0 || b + *k > static_cast<int64_t>(d.size())) c.unsupported("an index length that is not static");
  Exprs o(id.begin(), id.end() - 1);
  o.insert(o.end(), d.begin() + b + *k, d.end());
  return {dims_only(std::move(o))};
}

std::vector<SymbolicValue> unsqueeze_rule(const Ctx& c) {
  Exprs d = c.dims(0);
  std::vector<int64_t> axes = c.ints_attr_or_input("axes", 1, "the axes");
  const int64_t r = static_cast<int64_t>(d.size() + axes.size());
  for (int64_t& a : axes) a = c.axis(a, r);
  std::sort(axes.begin(), axes.end());
  for (int64_t a : axes) d.insert(d.begin() + a, DimExpr(1));
  return {with_elems(std::move(d), c.elems(0))};
}

std::vector<SymbolicValue> squeeze_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  std::vector<int64_t> axes = c.ints_attr_or_input("axes", 1, "the axes");
  std::vector<char> drop(d.size(), 0);
  if (axes.empty()) {
    for (size_t i = 0; i < d.size(); ++i) {
      if (!d[i].is_constant() && c.in[0].type->shape[i] == 1)
        c.unsupported(fmt::format("Squeeze without axes of dim {} ({}, 1 at its hint)", i, d[i].str()));
      drop[i] = d[i] == DimExpr(1);
    }
  } else {
    for (int64_t a : axes) {
      const int64_t x = c.axis(a, static_cast<int64_t>(d.size()));
      if (!(d[static_cast<size_t>(x)] == DimExpr(1)))
        c.unsupported(
            fmt::format("Squeeze of dim {} ({}), which is 1 only for some values", x, d[static_cast<size_t>(x)].str()));
      drop[static_cast<size_t>(x)] = 1;
    }
  }
  Exprs o;
  for (size_t i = 0; i < d.size(); ++i)
    if (!drop[i]) o.push_back(d[i]);
  return {with_elems(std::move(o), c.elems(0))};
}

std::vector<SymbolicValue> reshape_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  const Exprs spec = c.needs_elems(1, "the target shape");
  const bool allowzero = c.node.i("allowzero", 0) != 0;
  Exprs o(spec.size());
  int infer = -1;
  DimExpr known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    auto k = spec[i].constant();
    if (k && *k == -1) {
      infer = static_cast<int>(i);
      continue;
    }
    if (k && *k == 0 && !allowzero) {
      if (i >= d.size()) c.unsupported("shape entry 0 past the input's rank");
      o[i] = d[i];
    } else {
      if (!k && known_ge(spec[i], 0) != std::optional<bool>(true))
        c.unsupported(fmt::format("shape entry {} may be -1 or 0", spec[i].str()));
      o[i] = spec[i];
    }
    known = known * o[i];
  }
  if (infer >= 0) {
    auto q = exact_div(product(d), known);
    if (!q)
      c.unsupported(fmt::format("the -1 of shape {} is {} / ({}), which does not divide for every value",
                                dims_str(spec), product(d).str(), known.str()));
    o[static_cast<size_t>(infer)] = *q;
  }
  return {with_elems(std::move(o), c.elems(0))};
}

std::vector<SymbolicValue> flatten_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  const int64_t r = static_cast<int64_t>(d.size());
  int64_t ax = c.node.i("axis", 1);
  if (ax < 0) ax += r;
  ax = std::clamp<int64_t>(ax, 0, r);
  return {with_elems({product(d, 0, static_cast<size_t>(ax)), product(d, static_cast<size_t>(ax))}, c.elems(0))};
}

// Scan (opset 9+; ONNX spec): the states keep their dims and each scan output is the body's per-iteration output
// with the scan length inserted at its axis. The body must see static values (the states, the captured values and
// the scan inputs off their scan axis hold no symbol), so its per-iteration outputs are the static ones typed at the
// hints. The scan length is the first scan input's dim on its axis, a symbol when that input's length is known only
// at run time (a NonZero count); the other scan inputs' lengths must equal it (a guard when not provably so).
std::vector<SymbolicValue> scan_rule(const Ctx& c) {
  const ScanLayout s = scan_layout(c.node, c.node.outputs.size(), c.opset);
  if (s.batched) c.unsupported("a batched Scan (opset 8)");
  const size_t first_scan = static_cast<size_t>(s.first_state + s.num_state);
  auto is_static = [](const Exprs& d, int64_t except) {
    for (size_t k = 0; k < d.size(); ++k)
      if (static_cast<int64_t>(k) != except && !d[k].is_constant()) return false;
    return true;
  };
  std::vector<SymbolicValue> out;
  for (size_t k = 0; k < c.in.size(); ++k) {
    if (!c.has(k) || (k >= first_scan && k < first_scan + static_cast<size_t>(s.num_scan_in))) continue;
    if (!is_static(c.dims(k), -1)) c.unsupported("a state or captured value over the symbols");
  }
  for (int k = 0; k < s.num_state; ++k) out.push_back(dims_only(c.dims(static_cast<size_t>(s.first_state + k))));
  DimExpr length;
  for (int k = 0; k < s.num_scan_in; ++k) {
    const Exprs d = c.dims(first_scan + static_cast<size_t>(k));
    const int64_t axis = c.axis(s.in_axes[static_cast<size_t>(k)], static_cast<int64_t>(d.size()));
    if (!is_static(d, axis)) c.unsupported("a scan input over the symbols off its scan axis");
    const DimExpr& len = d[static_cast<size_t>(axis)];
    if (k == 0)
      length = len;
    else if (!(len == length))
      c.guards.emplace_back(length, len);
  }
  for (size_t k = static_cast<size_t>(s.num_state); k < c.out.size(); ++k) {
    const Shape& shape = c.out[k].shape;
    Exprs d(shape.begin(), shape.end());
    const int64_t axis = c.axis(s.out_axes[k - static_cast<size_t>(s.num_state)], static_cast<int64_t>(d.size()));
    d[static_cast<size_t>(axis)] = length;
    out.push_back(dims_only(std::move(d)));
  }
  return out;
}

std::vector<SymbolicValue> concat_rule(const Ctx& c) {
  Exprs o = c.dims(0);
  const int64_t ax = c.axis(c.node.i("axis", 0), static_cast<int64_t>(o.size()));
  DimExpr total = 0;
  std::optional<Exprs> e = Exprs{};
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (!c.has(i)) continue;
    total = total + c.dims(i).at(static_cast<size_t>(ax));
    auto ei = c.elems(i);
    if (!ei || o.size() != 1)
      e.reset();
    else if (e)
      e->insert(e->end(), ei->begin(), ei->end());
  }
  o[static_cast<size_t>(ax)] = total;
  return {with_elems(std::move(o), std::move(e))};
}

// One axis of Slice: the length of d[start:end:step] (ONNX's clamping), and the kept elements' positions when d and
// the bounds are constants.
DimExpr slice_length(const Ctx& c, const DimExpr& d, const DimExpr& start, const DimExpr& end, int64_t step) {
  if (step == 0) c.unsupported("a step of 0");
  constexpr int64_t kBig = int64_t{1} << 60;
  // A bound: negative constants count from the end; a symbolic bound is a non-negative expression.
  auto bound = [&](const DimExpr& b, bool is_end) -> DimExpr {
    auto k = b.constant();
    if (k) {
      if (*k >= kBig) return step > 0 ? d : d - 1;
      if (*k <= -kBig) return step > 0 ? DimExpr(0) : DimExpr(-1);
      if (*k < 0) return max(d + *k, step > 0 || !is_end ? DimExpr(0) : DimExpr(-1));
      return min(b, step > 0 || is_end ? d : d - 1);
    }
    if (known_ge(b, 0) != std::optional<bool>(true)) c.unsupported(fmt::format("a bound {} of unknown sign", b.str()));
    return min(b, d);
  };
  const DimExpr s = bound(start, false), e = bound(end, true);
  if (step > 0) return max(ceil_div(e - s, step), 0);
  return max(ceil_div(s - e, -step), 0);
}

std::vector<SymbolicValue> slice_rule(const Ctx& c) {
  Exprs d = c.dims(0);
  Exprs starts, ends;
  std::vector<int64_t> axes, steps;
  if (c.opset < 10 && c.node.has("starts")) {
    for (int64_t v : c.node.ints("starts")) starts.push_back(v);
    for (int64_t v : c.node.ints("ends")) ends.push_back(v);
    axes = c.node.ints("axes");
  } else {
    starts = c.needs_elems(1, "the starts");
    ends = c.needs_elems(2, "the ends");
    if (c.has(3)) axes = c.needs_ints(3, "the axes");
    if (c.has(4)) steps = c.needs_ints(4, "the steps");
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.unsupported("starts, ends, axes and steps of different lengths");
  std::optional<Exprs> e;
  auto in_e = c.elems(0);
  if (in_e && d.size() == 1 && d[0].is_constant() && starts.size() == 1) {
    auto s0 = starts[0].constant(), e0 = ends[0].constant();
    if (s0 && e0) {  // a shape vector's entries: slice them as the kernel does
      const int64_t n = *d[0].constant(), st = steps[0];
      auto clampi = [&](int64_t x, int64_t lo, int64_t hi) { return std::clamp(x < 0 ? x + n : x, lo, hi); };
      int64_t b = st > 0 ? clampi(*s0, 0, n) : clampi(*s0, -1, n - 1);
      const int64_t en = st > 0 ? clampi(*e0, 0, n) : clampi(*e0, -1, n - 1);
      e.emplace();
      for (; st > 0 ? b < en : b > en; b += st) e->push_back((*in_e)[static_cast<size_t>(b)]);
    }
  }
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t a = static_cast<size_t>(c.axis(axes[i], static_cast<int64_t>(d.size())));
    d[a] = slice_length(c, d[a], starts[i], ends[i], steps[i]);
  }
  return {with_elems(std::move(d), std::move(e))};
}

std::vector<SymbolicValue> transpose_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  std::vector<int64_t> perm = c.node.ints("perm");
  if (perm.empty())
    for (int64_t i = static_cast<int64_t>(d.size()) - 1; i >= 0; --i) perm.push_back(i);
  Exprs o;
  for (int64_t p : perm) o.push_back(d.at(static_cast<size_t>(c.axis(p, static_cast<int64_t>(d.size())))));
  return {dims_only(std::move(o))};
}

std::vector<SymbolicValue> split_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  const size_t ax = static_cast<size_t>(c.axis(c.node.i("axis", 0), static_cast<int64_t>(d.size())));
  std::vector<int64_t> sizes = c.ints_attr_or_input("split", 1, "the split sizes");
  std::vector<SymbolicValue> r;
  for (size_t k = 0; k < c.out.size(); ++k) {
    Exprs o = d;
    if (!sizes.empty()) {
      o[ax] = sizes.at(k);
    } else {
      auto q = exact_div(d[ax], static_cast<int64_t>(c.out.size()));
      if (!q) c.unsupported(fmt::format("an equal split of {} in {}", d[ax].str(), c.out.size()));
      o[ax] = *q;
    }
    r.push_back(dims_only(std::move(o)));
  }
  return r;
}

std::vector<SymbolicValue> matmul_rule(const Ctx& c) {
  Exprs a = c.dims(0), b = c.dims(1);
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), DimExpr(1));
  if (b1) b.push_back(DimExpr(1));
  if (a.size() < 2 || b.size() < 2) c.unsupported("operands of rank 0");
  c.broadcast(a.back(), b[b.size() - 2]);  // the contracted dims must be equal
  Exprs o = c.broadcast(Exprs(a.begin(), a.end() - 2), Exprs(b.begin(), b.end() - 2));
  if (!a1) o.push_back(a[a.size() - 2]);
  if (!b1) o.push_back(b.back());
  return {dims_only(std::move(o))};
}

std::vector<SymbolicValue> gemm_rule(const Ctx& c) {
  const Exprs a = c.dims(0), b = c.dims(1);
  const bool ta = c.node.i("transA", 0) != 0, tb = c.node.i("transB", 0) != 0;
  return {dims_only({ta ? a.at(1) : a.at(0), tb ? b.at(0) : b.at(1)})};
}

std::vector<SymbolicValue> reduce_rule(const Ctx& c) {
  const Exprs d = c.dims(0);
  const std::string& op = c.node.op_type;
  std::vector<int64_t> axes;
  if (op == "ArgMax" || op == "ArgMin")
    axes = {c.node.i("axis", 0)};
  else
    axes = c.ints_attr_or_input("axes", 1, "the axes");
  const bool keep = c.node.i("keepdims", 1) != 0;
  std::vector<char> reduced(d.size(), 0);
  if (axes.empty() && !(c.node.i("noop_with_empty_axes", 0) != 0)) std::fill(reduced.begin(), reduced.end(), 1);
  for (int64_t a : axes) reduced[static_cast<size_t>(c.axis(a, static_cast<int64_t>(d.size())))] = 1;
  Exprs o;
  for (size_t i = 0; i < d.size(); ++i) {
    if (!reduced[i])
      o.push_back(d[i]);
    else if (keep)
      o.push_back(DimExpr(1));
  }
  return {dims_only(std::move(o))};
}

// TopK: input 0's dims with the axis' dim k (its elements: a constant, or an expression torch computes from a count).
std::vector<SymbolicValue> topk_rule(const Ctx& c) {
  Exprs d = c.dims(0);
  const int64_t ax = c.axis(c.node.i("axis", -1), c.rank(0));
  if (c.opset < 10) {
    d[static_cast<size_t>(ax)] = c.node.i("k", 0);
  } else {
    const Exprs k = c.needs_elems(1, "k");
    if (k.size() != 1) c.unsupported("a k that is not one element");
    d[static_cast<size_t>(ax)] = k[0];
  }
  return {dims_only(d), dims_only(d)};
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

const std::unordered_map<std::string, Rule>& rules() {
  static const std::unordered_map<std::string, Rule> table = [] {
    std::unordered_map<std::string, Rule> t;
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
    t["Shape"] = shape_rule;
    t["Size"] = size_rule;
    t["Gather"] = gather_rule;
    t["GatherND"] = gather_nd_rule;
    t["Unsqueeze"] = unsqueeze_rule;
    t["Squeeze"] = squeeze_rule;
    t["Reshape"] = reshape_rule;
    t["Flatten"] = flatten_rule;
    t["Concat"] = concat_rule;
    t["Scan"] = scan_rule;
    t["Slice"] = slice_rule;
    t["Transpose"] = transpose_rule;
    t["Split"] = split_rule;
    t["MatMul"] = matmul_rule;
    t["Gemm"] = gemm_rule;
    for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"})
      t[op] = reduce_rule;
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
    t["TopK"] = topk_rule;
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

// ---- data-dependent outputs --------------------------------------------------------------------------------------

// The outputs of a node whose output size depends on its values, the count being the symbol u (ONNX operator specs).
std::optional<DataDependentOutputs> data_dependent_rule(const Ctx& c, const DimExpr& u) {
  const std::string& op = c.node.op_type;
  if (!c.has(0)) return std::nullopt;
  const DType x = c.in[0].type->dtype;
  DataDependentOutputs r;
  r.input = 0;
  auto out = [&](DType t, Exprs d) {
    r.dtypes.push_back(t);
    r.outputs.push_back(dims_only(std::move(d)));
  };
  const Exprs d = c.dims(0);
  if (op == "NonZero") {
    r.counts = "the count of non-zeros";
    r.bound = product(d);
    out(DType::kInt64, {DimExpr(static_cast<int64_t>(d.size())), u});
  } else if (op == "Compress" && c.has(1)) {
    r.counts = "the count of true values";
    r.input = 1;
    const DimExpr cond = product(c.dims(1));
    if (c.node.has("axis")) {
      Exprs o = d;
      const size_t ax = static_cast<size_t>(c.axis(c.node.i("axis", 0), c.rank(0)));
      r.bound = min(o[ax], cond);
      o[ax] = u;
      out(x, std::move(o));
    } else {
      r.bound = min(product(d), cond);
      out(x, {u});
    }
  } else if (op == "TopK" && c.opset >= 10) {
    r.counts = "the value";
    r.input = 1;
    Exprs o = d;
    const size_t ax = static_cast<size_t>(c.axis(c.node.i("axis", -1), c.rank(0)));
    r.bound = o[ax];
    o[ax] = u;
    out(x, o);
    out(DType::kInt64, o);
  } else if (op == "Unique") {
    r.counts = "the count of unique values";
    if (c.node.has("axis")) {
      Exprs o = d;
      const size_t ax = static_cast<size_t>(c.axis(c.node.i("axis", 0), c.rank(0)));
      r.bound = o[ax];
      const DimExpr n = o[ax];
      o[ax] = u;
      out(x, std::move(o));
      out(DType::kInt64, {u});
      out(DType::kInt64, {n});
    } else {
      r.bound = product(d);
      out(x, {u});
      out(DType::kInt64, {u});
      out(DType::kInt64, {*r.bound});
    }
    out(DType::kInt64, {u});
  } else if (op == "Range") {
    r.counts = "the length";
    r.input = 1;
    out(x, {u});
  } else if (op == "NonMaxSuppression" && c.has(1) && c.rank(0) == 3 && c.rank(1) == 3) {
    r.counts = "the count of selected boxes";
    const Exprs s = c.dims(1);  // [batch, classes, boxes]
    DimExpr per_class = s[2];
    if (const std::optional<Exprs> m = c.elems(2); m && m->size() == 1)
      if (auto k = (*m)[0].constant()) per_class = min(per_class, std::max<int64_t>(*k, 0));
    r.bound = s[0] * s[1] * per_class;
    out(DType::kInt64, {u, DimExpr(3)});
  } else {
    return std::nullopt;
  }
  return r;
}

}  // namespace

std::optional<DataDependentOutputs> infer_data_dependent(const Node& node, const std::vector<SymbolicInput>& inputs,
                                                         int64_t opset, const DimBindings& hints,
                                                         const std::string& symbol) {
  if (!node.domain.empty() && node.domain != "ai.onnx") return std::nullopt;
  const std::vector<TensorType> none;
  std::vector<std::pair<DimExpr, DimExpr>> guards;
  const Ctx c{node, inputs, none, opset, hints, guards};
  try {
    return data_dependent_rule(c, DimExpr::symbol(symbol));
  } catch (const UnsupportedError&) {
    return std::nullopt;
  }
}

std::optional<Tensor> constant_at(const Value& v, const DimBindings& at) {
  const std::vector<DimExpr>& elems = *v.sym->elems;
  Tensor t(v.dtype, v.shape);
  if (static_cast<int64_t>(elems.size()) != t.numel())
    throw InternalError(fmt::format("constant '{}': {} elements over the dim symbols for {}", v.name, elems.size(),
                                    type_str(v.dtype, v.shape)));
  for (size_t i = 0; i < elems.size(); ++i) {
    const int64_t x = elems[i].eval(at);
    switch (v.dtype) {
      case DType::kInt64: t.data<int64_t>()[i] = x; break;
      case DType::kInt32: t.data<int32_t>()[i] = static_cast<int32_t>(x); break;
      case DType::kFloat32: t.data<float>()[i] = static_cast<float>(x); break;
      case DType::kFloat64: t.data<double>()[i] = static_cast<double>(x); break;
      case DType::kBool: t.data<uint8_t>()[i] = x != 0; break;
      default: return std::nullopt;
    }
  }
  return t;
}

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
