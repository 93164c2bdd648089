// Symbolic shape rules of the shape ops (symbolic.h: Shape, Gather, Reshape, Slice, Concat, Transpose, Split...),
// MatMul, Gemm, the reductions and TopK, following the ONNX operator specs at the node's opset, on DimExpr dims.
#include <algorithm>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include "core/ir/control_flow.h"
#include "core/shapes/shapes.h"
#include "core/shapes/symbolic_ctx.h"

namespace gspmd::symbolic_internal {
namespace {

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

}  // namespace

void add_shape_op_rules(RuleMap& t) {
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"})
    t[op] = reduce_rule;
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
  t["TopK"] = topk_rule;
}

}  // namespace gspmd::symbolic_internal
