// Shape functions of ops_signal.cc's kernels.
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

void register_signal_shapes(ShapeTable& t) {}

}  // namespace gspmd::kern
