// Shape function of ops_pipeline.cc's kernel: the pipeline's stage shift (core/ir/shift_op.h).
#include <fmt/format.h>

#include "core/ir/shift_op.h"
#include "core/shapes/geometry.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

/// x [S, ...] and optional in [1, ...] of x's dtype -> y [S, ...], out [1, ...] (both, whatever the node declares:
/// an output may be omitted).
std::vector<TensorType> shift_types(const ShapeCtx& c) {
  const TensorType& x = c.type(0);
  if (x.shape.empty() || x.shape[0] < 1) c.fail("x must have a leading stage dim");
  const int64_t shift = c.node.i("shift", 1), wrap = c.node.i("wrap", 0);
  if (shift != 1 && shift != -1) c.fail(fmt::format("shift must be 1 or -1, not {}", shift));
  if (wrap != 0 && wrap != 1) c.fail(fmt::format("wrap must be 0 or 1, not {}", wrap));
  TensorType row = x;
  row.shape[0] = 1;
  if (c.has(1) && (c.type(1).shape != row.shape || c.dtype(1) != x.dtype))
    c.fail(fmt::format("in must be {} {}, not {} {}", dtype_name(x.dtype), shape_str(row.shape), dtype_name(c.dtype(1)),
                       shape_str(c.shape(1))));
  return {x, row};
}

}  // namespace

void register_pipeline_shapes(ShapeTable& t) { t[std::string(kPipelineDomain) + ":" + kShiftOp] = shift_types; }

}  // namespace gspmd::shapes
