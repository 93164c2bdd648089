// Shape functions of ops_index.cc's kernels.
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

void register_index_shapes(ShapeTable& t) {}

}  // namespace gspmd::kern
