// Shape functions of ops_spatial.cc's kernels.
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

void register_spatial_shapes(ShapeTable& t) {}

}  // namespace gspmd::kern
