// core/shapes (private to the module): what a symbolic shape rule sees (symbolic.h): the node, its inputs' dims and
// elements as DimExprs, and the checks every rule shares. symbolic.cc holds the rules per op family,
// symbolic_data.cc the rules of data-dependent outputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/shapes/symbolic.h"

namespace gspmd::symbolic_internal {

using Exprs = std::vector<DimExpr>;

inline DimExpr product(const Exprs& e, size_t from = 0, size_t to = std::numeric_limits<size_t>::max()) {
  DimExpr p = 1;
  for (size_t i = from; i < std::min(to, e.size()); ++i) p = p * e[i];
  return p;
}

/// Everything a rule sees: the node, its inputs and the numeric output types at the hints; the guards (dims assumed
/// equal) it adds.
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

inline SymbolicValue dims_only(Exprs d) { return SymbolicValue{std::move(d), std::nullopt}; }
inline SymbolicValue with_elems(Exprs d, std::optional<Exprs> e) { return SymbolicValue{std::move(d), std::move(e)}; }

/// A symbolic shape rule: the node's outputs' dims (and elements, when known) over the dim symbols.
using Rule = std::function<std::vector<SymbolicValue>(const Ctx&)>;
using RuleMap = std::unordered_map<std::string, Rule>;

/// The shape ops' rules (symbolic_shape_ops.cc), added to `t` by op type.
void add_shape_op_rules(RuleMap& t);

}  // namespace gspmd::symbolic_internal
