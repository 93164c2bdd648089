// Symbolic shapes of data-dependent outputs (symbolic.h, infer_data_dependent): NonZero, Unique, NonMaxSuppression,
// TopK with a computed K... their output counts as a fresh symbol (ONNX operator specs); constant_at.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "core/shapes/symbolic_ctx.h"

namespace gspmd {
namespace {

using namespace symbolic_internal;

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

}  // namespace gspmd
