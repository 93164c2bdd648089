// The gather family (core/rules/gather.cc): Gather, rows of data along `axis` picked by int32 / int64 indices (negative
// indices count from the end). Reference: the ONNX operator spec (onnx/docs/Operators.md). Plain C++, dtype-agnostic
// (elements moved by size). GatherElements and GatherND follow core/rules/index_ops.cc into ops_index.cc.
#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"

namespace gspmd::kern {
namespace {

std::vector<Tensor> gather_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& idx = c.req(1);
  if (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32)
    c.fail(fmt::format("indices must be int32 or int64, got {}", dtype_name(idx.dtype)));
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r == 0) c.fail("data must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", 0), r);
  const int64_t dim = x.shape[ax];
  Shape os(x.shape.begin(), x.shape.begin() + ax);
  os.insert(os.end(), idx.shape.begin(), idx.shape.end());
  os.insert(os.end(), x.shape.begin() + ax + 1, x.shape.end());
  Tensor out(x.dtype, os);
  int64_t outer = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= x.shape[d];
  const size_t es = dtype_size(x.dtype);
  size_t inner_bytes = es;
  for (int64_t d = ax + 1; d < r; ++d) inner_bytes *= static_cast<size_t>(x.shape[d]);
  const std::vector<int64_t> ids = idx.as_int64s();
  const int64_t ni = static_cast<int64_t>(ids.size());
  std::vector<int64_t> norm(ids.size());
  for (int64_t i = 0; i < ni; ++i) {
    const int64_t k = ids[i] < 0 ? ids[i] + dim : ids[i];
    if (k < 0 || k >= dim) c.bad_data(fmt::format("index {} out of range for axis {} of size {}", ids[i], ax, dim));
    norm[i] = k;
  }
  if (inner_bytes == 0) return one(std::move(out));
  std::byte* dst = out.bytes.data();
  for (int64_t o = 0; o < outer; ++o) {
    const std::byte* src = x.bytes.data() + static_cast<size_t>(o * dim) * inner_bytes;
    for (int64_t i = 0; i < ni; ++i, dst += inner_bytes) std::memcpy(dst, src + norm[i] * inner_bytes, inner_bytes);
  }
  return one(std::move(out));
}

}  // namespace

void register_gather(KernelTable& t) { t["Gather"] = gather_kernel; }

}  // namespace gspmd::kern
