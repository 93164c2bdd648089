// Shape functions of ops_shape.cc's kernels.
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

void register_shape_op_shapes(ShapeTable& t) {}

}  // namespace gspmd::kern
