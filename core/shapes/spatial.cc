// Shape functions of ops_spatial.cc's kernels: MaxUnpool, RoiAlign, GridSample. Reference: the ONNX operator specs
// (onnx/docs/Operators.md) at the node's opset.
#include <algorithm>

#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// MaxUnpool: X [N, C, ...] and indices of X's size; Y of the default size (in - 1) * stride - pads + kernel per
// spatial dim, or of the output_shape input's value (at least the default).
std::vector<TensorType> max_unpool_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  if (num_elements(c.shape(1)) != num_elements(x)) c.fail("indices must have X's shape");
  if (x.size() < 3) c.fail(fmt::format("X must have rank >= 3, got {}", shape_str(x)));
  const size_t sp = x.size() - 2;
  const std::vector<int64_t> k = c.node.ints("kernel_shape");
  if (k.size() != sp) c.fail("kernel_shape must have one entry per spatial dim");
  const std::vector<int64_t> st = c.node.ints("strides", std::vector<int64_t>(sp, 1)),
                             pads = c.node.ints("pads", std::vector<int64_t>(2 * sp, 0));
  if (st.size() != sp || pads.size() != 2 * sp) c.fail("strides and pads must have one entry per spatial dim");
  Shape def{x[0], x[1]};
  for (size_t i = 0; i < sp; ++i) def.push_back((x[2 + i] - 1) * st[i] - pads[i] - pads[sp + i] + k[i]);
  if (!c.has(2)) return one_type(c.dtype(0), def);
  const Shape out = c.needs_value(2, "output_shape").as_int64s();
  if (out.size() != def.size()) c.fail("output_shape must have X's rank");
  for (size_t d = 0; d < def.size(); ++d)
    if (out[d] < def[d]) c.fail(fmt::format("output_shape {} is smaller than {}", shape_str(out), shape_str(def)));
  return one_type(c.dtype(0), out);
}

// RoiAlign: X [N, C, H, W], rois [R, 4], batch_indices [R] -> [R, C, output_height, output_width].
std::vector<TensorType> roi_align_types(const ShapeCtx& c) {
  const Shape &x = c.shape(0), &rois = c.shape(1);
  if (x.size() != 4 || rois.size() != 2 || rois[1] != 4 || num_elements(c.shape(2)) != rois[0])
    c.fail(fmt::format("X {} / rois {} / batch_indices [{}] do not match", shape_str(x), shape_str(rois),
                       num_elements(c.shape(2))));
  return one_type(c.dtype(0), {rois[0], x[1], c.node.i("output_height", 1), c.node.i("output_width", 1)});
}

// GridSample: X [N, C, D1..Dr], grid [N, D1_out..Dr_out, r] -> [N, C, D1_out..Dr_out].
std::vector<TensorType> grid_sample_types(const ShapeCtx& c) {
  const Shape &x = c.shape(0), &grid = c.shape(1);
  if (x.size() < 3 || grid.size() != x.size() || grid.back() != static_cast<int64_t>(x.size()) - 2 || grid[0] != x[0])
    c.fail(fmt::format("X {} and grid {} do not match", shape_str(x), shape_str(grid)));
  Shape out{x[0], x[1]};
  out.insert(out.end(), grid.begin() + 1, grid.end() - 1);
  return one_type(c.dtype(0), out);
}

}  // namespace

void register_spatial_shapes(ShapeTable& t) {
  t["MaxUnpool"] = max_unpool_types;
  t["RoiAlign"] = roi_align_types;
  t["GridSample"] = grid_sample_types;
}

}  // namespace gspmd::shapes
