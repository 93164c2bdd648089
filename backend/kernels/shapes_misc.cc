// Shape functions of ops_misc.cc's kernels.
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

void register_misc_shapes(ShapeTable& t) {}

}  // namespace gspmd::kern
