// Shape functions of ops_misc.cc's kernels: Resize (opset 10-17), Upsample (opset 7-9), Einsum.
#include <fmt/format.h>

#include "backend/kernels/shape_rules_data.h"
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {
namespace {

// Elements of optional input i per its type (0 when absent): an empty roi / scales / sizes counts as absent.
int64_t numel_of(const ShapeCtx& c, size_t i) { return c.has(i) ? num_elements(c.shape(i)) : 0; }

// Resize / Upsample: the input's dtype; sizes, or floor(dim * scale).
std::vector<TensorType> resize_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  if (c.node.op_type == "Upsample" || c.opset < 11) {
    if (c.node.op_type == "Upsample" && c.opset < 9)
      for (float f : c.node.floats("scales")) scales.push_back(f);
    else
      scales = float_values(c, c.needs_value(1, "the scales"));
  } else {
    reject_resize18_attrs(c);
    if (numel_of(c, 2) > 0) scales = float_values(c, c.needs_value(2, "the scales"));
    if (numel_of(c, 3) > 0) sizes = c.needs_value(3, "the sizes").as_int64s();
    if (scales.empty() == sizes.empty()) c.fail("exactly one of scales and sizes must be given");
    if (numel_of(c, 1) > 0 && numel_of(c, 1) != 2 * r)
      c.fail(fmt::format("roi has {} entries for rank {}", numel_of(c, 1), r));
  }
  return one_type(c.dtype(0), resize_shape(c, c.shape(0), scales, sizes));
}

std::vector<TensorType> einsum_types(const ShapeCtx& c) {
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < c.n_in(); ++i) {
    if (c.dtype(i) != c.dtype(0)) c.fail("inputs have different dtypes");
    shapes.push_back(&c.shape(i));
  }
  return one_type(c.dtype(0), einsum_labels(c, shapes).out_shape);
}

}  // namespace

void register_misc_shapes(ShapeTable& t) {
  t["Resize"] = t["Upsample"] = resize_types;
  t["Einsum"] = einsum_types;
}

}  // namespace gspmd::kern
