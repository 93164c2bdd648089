// Shape functions of ops_rnn.cc's kernels.
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

void register_rnn_shapes(ShapeTable& t) {}

}  // namespace gspmd::kern
