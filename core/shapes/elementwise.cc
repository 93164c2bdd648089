// Shape functions of the elementwise family's kernels (ops_elementwise.cc, ops_elementwise_unary.cc; rules in
// core/rules/elementwise.cc): unary, binary with broadcasting, comparisons, Where, Cast, CastLike, Identity, Dropout,
// ... Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// Multidirectional broadcast of every present input; dtype of input 0 (or `out` when given).
template <DType kOut = DType::kUndefined>
std::vector<TensorType> broadcast_all(const ShapeCtx& c) {
  Shape s = c.shape(0);
  for (size_t i = 1; i < c.n_in(); ++i)
    if (c.has(i)) s = c.broadcast(s, c.shape(i));
  return one_type(kOut == DType::kUndefined ? c.dtype(0) : kOut, std::move(s));
}

std::vector<TensorType> where_types(const ShapeCtx& c) {
  return one_type(c.dtype(1), c.broadcast(c.broadcast(c.shape(0), c.shape(1)), c.shape(2)));
}

std::vector<TensorType> cast_types(const ShapeCtx& c) { return one_type(c.dtype_attr("to", 0), c.shape(0)); }

std::vector<TensorType> cast_like_types(const ShapeCtx& c) { return one_type(c.dtype(1), c.shape(0)); }

std::vector<TensorType> identity_types(const ShapeCtx& c) { return {c.type(0)}; }

// Dropout: the data, and the mask (bool, like the kernel) when declared.
std::vector<TensorType> dropout_types(const ShapeCtx& c) {
  std::vector<TensorType> out{c.type(0)};
  if (c.n_out() > 1) out.push_back({DType::kBool, c.shape(0)});
  return out;
}

}  // namespace

void register_elementwise_shapes(ShapeTable& t) {
  for (const char* op :
       {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Mod", "BitShift"})
    t[op] = broadcast_all<>;
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
    t[op] = broadcast_all<DType::kBool>;
  for (const char* op : {"Not",       "Relu",        "Tanh",       "Exp",     "Sqrt",     "Erf",      "Log",
                         "Neg",       "Abs",         "Reciprocal", "Sigmoid", "Floor",    "Ceil",     "Sign",
                         "Clip",      "Elu",         "Selu",       "Celu",    "Softplus", "Softsign", "ThresholdedRelu",
                         "LeakyRelu", "HardSigmoid", "HardSwish",  "Mish",    "Round",    "Sin",      "Cos",
                         "Tan",       "Asin",        "Acos",       "Atan",    "Sinh",     "Cosh",     "Asinh",
                         "Acosh",     "Atanh",       "Shrink"})
    t[op] = same_as_input0;
  // PRelu's slope broadcasts to X (unidirectionally; per channel before opset 7, as the kernel reads it): X's type.
  t["PRelu"] = same_as_input0;
  t["IsNaN"] = t["IsInf"] = [](const ShapeCtx& c) { return one_type(DType::kBool, c.shape(0)); };
  t["Where"] = where_types;
  t["Cast"] = cast_types;
  t["CastLike"] = cast_like_types;
  t["Identity"] = identity_types;
  t["Dropout"] = dropout_types;
}

}  // namespace gspmd::shapes
