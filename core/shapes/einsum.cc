// Shape function of the einsum family's kernel (ops_einsum.cc; rule in core/rules/einsum.cc): Einsum, its output shape
// from the equation's labels (einsum_labels, geometry_data.h, which the kernel uses too). Reference: the ONNX
// operator spec (onnx/docs/Operators.md).
#include "core/shapes/geometry_data.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

std::vector<TensorType> einsum_types(const ShapeCtx& c) {
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < c.n_in(); ++i) {
    if (c.dtype(i) != c.dtype(0)) c.fail("inputs have different dtypes");
    shapes.push_back(&c.shape(i));
  }
  return one_type(c.dtype(0), einsum_labels(c, shapes).out_shape);
}

}  // namespace

void register_einsum_shapes(ShapeTable& t) { t["Einsum"] = einsum_types; }

}  // namespace gspmd::shapes
