// Shape function of the gather family's kernel (ops_gather.cc; rule in core/rules/gather.cc): Gather. Reference: the
// ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

std::vector<TensorType> gather_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  const Shape& idx = c.shape(1);
  if (c.dtype(1) != DType::kInt64 && c.dtype(1) != DType::kInt32)
    c.fail(fmt::format("indices must be int32 or int64, got {}", dtype_name(c.dtype(1))));
  if (x.empty()) c.fail("data must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", 0), c.rank(0));
  Shape os(x.begin(), x.begin() + ax);
  os.insert(os.end(), idx.begin(), idx.end());
  os.insert(os.end(), x.begin() + ax + 1, x.end());
  return one_type(c.dtype(0), std::move(os));
}

}  // namespace

void register_gather_shapes(ShapeTable& t) { t["Gather"] = gather_types; }

}  // namespace gspmd::shapes
