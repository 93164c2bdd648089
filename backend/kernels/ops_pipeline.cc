// Kernel of the pipeline's stage shift, gspmd.pipeline Shift (core/ir/shift_op.h), on one device: the whole
// stage dim is local, so the shift is a copy of rows.
#include <cstring>

#include "backend/kernels/kernels_util.h"
#include "core/ir/shift_op.h"

namespace gspmd::kern {
namespace {

std::vector<Tensor> shift_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor* in = c.in(1);
  if (x.shape.empty() || x.shape[0] < 1) c.fail("x must have a leading stage dim");
  const int64_t S = x.shape[0], shift = c.node.i("shift", 1);
  const bool wrap = c.node.i("wrap", 0) != 0;
  if (shift != 1 && shift != -1) c.fail("shift must be 1 or -1");
  Shape row_shape = x.shape;
  row_shape[0] = 1;
  if (in && (in->shape != row_shape || in->dtype != x.dtype)) c.fail("in must be one row of x");
  const size_t row = x.bytes.size() / static_cast<size_t>(S);  // bytes per stage
  const int64_t enter = shift > 0 ? 0 : S - 1, exit = S - 1 - enter;
  Tensor y(x.dtype, x.shape), out(x.dtype, row_shape);
  for (int64_t s = 0; s < S; ++s)
    if (s != enter)
      std::memcpy(y.bytes.data() + static_cast<size_t>(s) * row, x.bytes.data() + static_cast<size_t>(s - shift) * row,
                  row);
  std::memcpy(out.bytes.data(), x.bytes.data() + static_cast<size_t>(exit) * row, row);
  std::byte* e = y.bytes.data() + static_cast<size_t>(enter) * row;
  if (in && wrap) {  // in + x[exit]
    dispatch_float(c, x.dtype, [&]<class F>() {
      const F* a = in->data<F>();
      const F* b = reinterpret_cast<const F*>(x.bytes.data() + static_cast<size_t>(exit) * row);
      F* o = reinterpret_cast<F*>(e);
      for (size_t i = 0; i < row / sizeof(F); ++i) o[i] = a[i] + b[i];
    });
  } else if (in) {
    std::memcpy(e, in->bytes.data(), row);
  } else if (wrap) {
    std::memcpy(e, x.bytes.data() + static_cast<size_t>(exit) * row, row);
  } else {
    std::memset(e, 0, row);
  }
  return {std::move(y), std::move(out)};
}

}  // namespace

void register_pipeline(KernelTable& t) { t[std::string(kPipelineDomain) + ":" + kShiftOp] = shift_kernel; }

}  // namespace gspmd::kern
