// Shape functions of the matmul family's kernels (ops_matmul.cc; rules in core/rules/matmul.cc): MatMul, Gemm,
// MatMulInteger, QLinearMatMul. Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

/// numpy matmul of shapes a and b: 1-D operands promoted (their unit dim dropped from the result), batch dims
/// broadcast; fails unless both have rank >= 1 and the contracted dims agree. MatMul, MatMulInteger, QLinearMatMul.
Shape matmul_shape(const ShapeCtx& c, const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) c.fail("inputs must have rank >= 1");
  Shape as = a, bs = b;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  if (bs[bs.size() - 2] != as.back())
    c.fail(fmt::format("shapes {} and {} are not aligned for matmul", shape_str(a), shape_str(b)));
  Shape out = c.broadcast(Shape(as.begin(), as.end() - 2), Shape(bs.begin(), bs.end() - 2));
  if (a.size() > 1) out.push_back(as[as.size() - 2]);
  if (b.size() > 1) out.push_back(bs.back());
  return out;
}

// Fails unless inputs i and j have the same dtype.
void same_dtype(const ShapeCtx& c, size_t i, size_t j) {
  if (c.dtype(i) != c.dtype(j))
    c.fail(fmt::format("input dtypes differ ({} vs {})", dtype_name(c.dtype(i)), dtype_name(c.dtype(j))));
}

std::vector<TensorType> matmul_types(const ShapeCtx& c) {
  same_dtype(c, 0, 1);
  return one_type(c.dtype(0), matmul_shape(c, c.shape(0), c.shape(1)));
}

std::vector<TensorType> gemm_types(const ShapeCtx& c) {
  same_dtype(c, 0, 1);
  if (c.has(2)) same_dtype(c, 0, 2);
  const Shape &a = c.shape(0), &b = c.shape(1);
  if (a.size() != 2 || b.size() != 2) c.fail("A and B must be 2-D");
  const bool ta = c.node.i("transA", 0) != 0, tb = c.node.i("transB", 0) != 0;
  if ((ta ? a[0] : a[1]) != (tb ? b[1] : b[0]))
    c.fail(fmt::format("shapes {} and {} are not aligned (transA={}, transB={})", shape_str(a), shape_str(b), ta, tb));
  const Shape os{ta ? a[1] : a[0], tb ? b[0] : b[1]};
  if (c.has(2) && c.node.f("beta", 1.f) != 0.f && c.broadcast(c.shape(2), os) != os)
    c.fail(fmt::format("C of shape {} does not broadcast to {}", shape_str(c.shape(2)), shape_str(os)));
  return one_type(c.dtype(0), os);
}

std::vector<TensorType> matmul_integer_types(const ShapeCtx& c) {
  return one_type(DType::kInt32, matmul_shape(c, c.shape(0), c.shape(1)));
}

// QLinearMatMul: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point; y in y_zero_point's type.
std::vector<TensorType> qlinear_matmul_types(const ShapeCtx& c) {
  return one_type(c.dtype(7), matmul_shape(c, c.shape(0), c.shape(3)));
}

}  // namespace

void register_matmul_shapes(ShapeTable& t) {
  t["MatMul"] = matmul_types;
  t["Gemm"] = gemm_types;
  t["MatMulInteger"] = matmul_integer_types;
  t["QLinearMatMul"] = qlinear_matmul_types;
}

}  // namespace gspmd::shapes
