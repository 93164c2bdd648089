// Shape functions of ops_training.cc's kernels.
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

void register_training_shapes(ShapeTable& t) {}

}  // namespace gspmd::kern
