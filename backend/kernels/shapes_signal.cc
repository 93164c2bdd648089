// Shape functions of ops_signal.cc's kernels: window functions, QuantizeLinear, DequantizeLinear,
// DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, Det, GridSample.
#include <fmt/format.h>

#include "backend/kernels/shape_util.h"

namespace gspmd::kern {
namespace {

// HannWindow, HammingWindow, BlackmanWindow: [size] of output_datatype, size the value of input 0.
std::vector<TensorType> window_types(const ShapeCtx& c) {
  const std::vector<int64_t> sz = c.needs_value(0, "window size").as_int64s();
  if (sz.size() != 1 || sz[0] < 0) c.fail("size must be a non-negative scalar");
  return one_type(static_cast<DType>(c.node.i("output_datatype", 1)), {sz[0]});
}

// Fails unless scale (input 1) is per tensor (one element, rank <= 1) or 1-D along `axis` of x (input 0), and the
// zero point (input 2) has as many elements.
void check_quant_params(const ShapeCtx& c) {
  const Shape &x = c.shape(0), &scale = c.shape(1);
  if (num_elements(scale) != 1 || scale.size() > 1) {
    if (scale.size() != 1) c.fail(fmt::format("scale must be a scalar or 1-D, got {}", shape_str(scale)));
    const int64_t axis = c.axis(c.node.i("axis", 1), static_cast<int64_t>(x.size()));
    if (scale[0] != x[static_cast<size_t>(axis)])
      c.fail(fmt::format("scale has {} elements but axis {} of {} has {}", scale[0], axis, shape_str(x),
                         x[static_cast<size_t>(axis)]));
  }
}

// QuantizeLinear: x's shape in the zero point's dtype (uint8 without one).
std::vector<TensorType> quantize_types(const ShapeCtx& c) {
  check_quant_params(c);
  if (c.has(2) && num_elements(c.shape(2)) != num_elements(c.shape(1)))
    c.fail("zero point and scale differ in size");
  return one_type(c.has(2) ? c.dtype(2) : DType::kUInt8, c.shape(0));
}

std::vector<TensorType> dequantize_types(const ShapeCtx& c) {
  check_quant_params(c);
  if (c.has(2) && (c.dtype(2) != c.dtype(0) || num_elements(c.shape(2)) != num_elements(c.shape(1))))
    c.fail("zero point must have the input's type and the scale's size");
  return one_type(DType::kFloat32, c.shape(0));
}

// DynamicQuantizeLinear: y (uint8, x's shape), y_scale (float32 scalar), y_zero_point (uint8 scalar).
std::vector<TensorType> dynamic_quantize_types(const ShapeCtx& c) {
  return {{DType::kUInt8, c.shape(0)}, {DType::kFloat32, {}}, {DType::kUInt8, {}}};
}

std::vector<TensorType> matmul_integer_types(const ShapeCtx& c) {
  return one_type(DType::kInt32, matmul_shape(c, c.shape(0), c.shape(1)));
}

// QLinearMatMul: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point; y in y_zero_point's type.
std::vector<TensorType> qlinear_matmul_types(const ShapeCtx& c) {
  return one_type(c.dtype(7), matmul_shape(c, c.shape(0), c.shape(3)));
}

std::vector<TensorType> det_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  const size_t r = x.size();
  if (r < 2 || x[r - 1] != x[r - 2]) c.fail(fmt::format("input must be [*, M, M], got {}", shape_str(x)));
  return one_type(c.dtype(0), Shape(x.begin(), x.end() - 2));
}

// GridSample: X [N, C, D1..Dr], grid [N, D1_out..Dr_out, r] -> [N, C, D1_out..Dr_out].
std::vector<TensorType> grid_sample_types(const ShapeCtx& c) {
  const Shape &x = c.shape(0), &grid = c.shape(1);
  if (x.size() < 3 || grid.size() != x.size() || grid.back() != static_cast<int64_t>(x.size()) - 2 ||
      grid[0] != x[0])
    c.fail(fmt::format("X {} and grid {} do not match", shape_str(x), shape_str(grid)));
  Shape out{x[0], x[1]};
  out.insert(out.end(), grid.begin() + 1, grid.end() - 1);
  return one_type(c.dtype(0), out);
}

}  // namespace

void register_signal_shapes(ShapeTable& t) {
  t["HannWindow"] = t["HammingWindow"] = t["BlackmanWindow"] = window_types;
  t["QuantizeLinear"] = quantize_types;
  t["DequantizeLinear"] = dequantize_types;
  t["DynamicQuantizeLinear"] = dynamic_quantize_types;
  t["MatMulInteger"] = matmul_integer_types;
  t["QLinearMatMul"] = qlinear_matmul_types;
  t["Det"] = det_types;
  t["GridSample"] = grid_sample_types;
}

}  // namespace gspmd::kern
