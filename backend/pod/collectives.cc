// backend/pod: the gspmd ops on plain tensors (see collectives.h).
#include "backend/pod/collectives.h"
#include "core/ir/ir.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

namespace gspmd::pod {

int64_t norm_axis(int64_t axis, size_t rank, const char* what) {
  int64_t r = static_cast<int64_t>(rank);
  int64_t a = axis < 0 ? axis + r : axis;
  if (a < 0 || a >= r) throw InternalError(fmt::format("{} {} out of range for rank {}", what, axis, r));
  return a;
}

namespace {

struct Blocks {
  int64_t outer = 1;  // product of dims before axis
  size_t inner = 1;   // bytes of one slice along axis (product of dims after axis * element size)
};
Blocks blocks(const Shape& s, int64_t axis, size_t esize) {
  Blocks b;
  for (int64_t i = 0; i < axis; ++i) b.outer *= s[i];
  b.inner = esize;
  for (size_t i = static_cast<size_t>(axis) + 1; i < s.size(); ++i) b.inner *= static_cast<size_t>(s[i]);
  return b;
}

void check_same(const std::vector<const Tensor*>& ins) {
  if (ins.empty()) throw InternalError("collective over an empty group");
  for (const Tensor* t : ins) {
    if (!t) throw InternalError("collective operand missing");
    if (t->dtype != ins[0]->dtype || t->shape != ins[0]->shape)
      throw InternalError(fmt::format("collective operands differ: {}{} vs {}{}", dtype_name(ins[0]->dtype),
                                      shape_str(ins[0]->shape), dtype_name(t->dtype), shape_str(t->shape)));
  }
}

template <class T>
void reduce_typed(T* acc, const T* x, size_t n, ReductionKind k) {
  switch (k) {
    case ReductionKind::kSum:
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + x[i]);
      break;
    case ReductionKind::kProd:
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] * x[i]);
      break;
    case ReductionKind::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
      break;
    case ReductionKind::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], x[i]);
      break;
  }
}

void reduce_bool(uint8_t* acc, const uint8_t* x, size_t n, ReductionKind k) {
  bool any = k == ReductionKind::kSum || k == ReductionKind::kMax;  // or; min/prod = and
  for (size_t i = 0; i < n; ++i) acc[i] = any ? (acc[i] || x[i]) : (acc[i] && x[i]);
}

// 16-bit floats: each step in float32, rounded once (as a bf16 all-reduce on TPU accumulates pairwise).
void reduce_half(uint16_t* acc, const uint16_t* x, size_t n, ReductionKind k, float (*widen)(uint16_t),
                 uint16_t (*narrow)(float)) {
  for (size_t i = 0; i < n; ++i) {
    float a = widen(acc[i]);
    const float b = widen(x[i]);
    reduce_typed(&a, &b, 1, k);
    acc[i] = narrow(a);
  }
}

// acc op= x, elementwise (same dtype and shape).
void reduce_into(Tensor& acc, const Tensor& x, ReductionKind k) {
  size_t n = static_cast<size_t>(acc.numel());
  switch (acc.dtype) {
    case DType::kFloat32: reduce_typed(acc.data<float>(), x.data<float>(), n, k); break;
    case DType::kFloat64: reduce_typed(acc.data<double>(), x.data<double>(), n, k); break;
    case DType::kInt64: reduce_typed(acc.data<int64_t>(), x.data<int64_t>(), n, k); break;
    case DType::kInt32: reduce_typed(acc.data<int32_t>(), x.data<int32_t>(), n, k); break;
    case DType::kInt16: reduce_typed(acc.data<int16_t>(), x.data<int16_t>(), n, k); break;
    case DType::kInt8: reduce_typed(acc.data<int8_t>(), x.data<int8_t>(), n, k); break;
    case DType::kUInt64: reduce_typed(acc.data<uint64_t>(), x.data<uint64_t>(), n, k); break;
    case DType::kUInt32: reduce_typed(acc.data<uint32_t>(), x.data<uint32_t>(), n, k); break;
    case DType::kUInt16: reduce_typed(acc.data<uint16_t>(), x.data<uint16_t>(), n, k); break;
    case DType::kUInt8: reduce_typed(acc.data<uint8_t>(), x.data<uint8_t>(), n, k); break;
    case DType::kBool: reduce_bool(acc.data<uint8_t>(), x.data<uint8_t>(), n, k); break;
    case DType::kFloat16:
      reduce_half(acc.data<uint16_t>(), x.data<uint16_t>(), n, k, half_to_float, float_to_half);
      break;
    case DType::kBFloat16:
      reduce_half(acc.data<uint16_t>(), x.data<uint16_t>(), n, k, bf16_to_float, float_to_bf16);
      break;
    default:
      throw UnsupportedError(
          fmt::format("{} reduction of {} is not supported by the pod", reduction_name(k), dtype_name(acc.dtype)));
  }
}

Tensor reduce_all(const std::vector<const Tensor*>& ins, ReductionKind k, Tensor* reuse) {
  check_same(ins);
  if (reuse && reuse != ins[0]) throw InternalError("reduction accumulator is not operand 0");
  Tensor acc = reuse ? std::move(*reuse) : *ins[0];
  for (size_t j = 1; j < ins.size(); ++j) reduce_into(acc, *ins[j], k);
  return acc;
}

// n results: n-1 copies of `t` and `t` itself last.
std::vector<Tensor> replicate(Tensor t, size_t n) {
  std::vector<Tensor> out;
  out.reserve(n);
  for (size_t j = 0; j + 1 < n; ++j) out.push_back(t);
  out.push_back(std::move(t));
  return out;
}

// v cast to T; for integer types NaN -> 0 and out-of-range values (e.g. -inf, the identity of max) saturate.
template <class T>
void fill_value(std::vector<std::byte>& pat, float v) {
  T x{};
  if constexpr (std::is_integral_v<T>) {
    if (std::isnan(v))
      x = 0;
    else if (v <= static_cast<float>(std::numeric_limits<T>::lowest()))
      x = std::numeric_limits<T>::lowest();
    else if (v >= static_cast<float>(std::numeric_limits<T>::max()))
      x = std::numeric_limits<T>::max();
    else
      x = static_cast<T>(v);
  } else {
    x = static_cast<T>(v);
  }
  pat.resize(sizeof(T));
  std::memcpy(pat.data(), &x, sizeof(T));
}

}  // namespace

void copy_along_axis(const Tensor& src, int64_t axis, int64_t src_start, Tensor& dst, int64_t dst_start, int64_t len) {
  if (len <= 0) return;
  size_t es = dtype_size(src.dtype);
  Blocks bs = blocks(src.shape, axis, es);
  Blocks bd = blocks(dst.shape, axis, es);
  int64_t sa = src.shape[axis], da = dst.shape[axis];
  if (bs.outer != bd.outer || bs.inner != bd.inner || src.dtype != dst.dtype || src_start < 0 || dst_start < 0 ||
      src_start + len > sa || dst_start + len > da)
    throw InternalError(fmt::format("copy_along_axis: bad block {}{}[{}:+{}] -> {}{}[{}] along axis {}",
                                    dtype_name(src.dtype), shape_str(src.shape), src_start, len, dtype_name(dst.dtype),
                                    shape_str(dst.shape), dst_start, axis));
  const std::byte* s = src.bytes.data();
  std::byte* d = dst.bytes.data();
  size_t chunk = static_cast<size_t>(len) * bs.inner;
  if (chunk == 0) return;
  for (int64_t o = 0; o < bs.outer; ++o)
    std::memcpy(d + (static_cast<size_t>(o * da + dst_start)) * bd.inner,
                s + (static_cast<size_t>(o * sa + src_start)) * bs.inner, chunk);
}

std::vector<std::byte> pack_chunks(const Tensor& x, int64_t axis, int64_t n) {
  const Blocks b = blocks(x.shape, axis, dtype_size(x.dtype));
  const int64_t full = x.shape[axis], len = full / n;
  const size_t row = static_cast<size_t>(len) * b.inner, chunk = row * static_cast<size_t>(b.outer);
  std::vector<std::byte> out(x.nbytes());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t o = 0; o < b.outer; ++o)
      std::memcpy(out.data() + static_cast<size_t>(j) * chunk + static_cast<size_t>(o) * row,
                  x.bytes.data() + static_cast<size_t>(o * full + j * len) * b.inner, row);
  return out;
}

void unpack_chunks(const std::vector<std::byte>& buf, Tensor& y, int64_t axis, int64_t n) {
  const Blocks b = blocks(y.shape, axis, dtype_size(y.dtype));
  const int64_t full = y.shape[axis], len = full / n;
  const size_t row = static_cast<size_t>(len) * b.inner, chunk = row * static_cast<size_t>(b.outer);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t o = 0; o < b.outer; ++o)
      std::memcpy(y.bytes.data() + static_cast<size_t>(o * full + j * len) * b.inner,
                  buf.data() + static_cast<size_t>(j) * chunk + static_cast<size_t>(o) * row, row);
}

std::vector<Tensor> all_reduce(const std::vector<const Tensor*>& ins, ReductionKind k, Tensor* acc) {
  std::vector<Tensor> out = replicate(reduce_all(ins, k, acc), ins.size());
  std::rotate(out.begin(), out.end() - 1, out.end());  // the accumulator itself goes to member 0
  return out;
}

std::vector<Tensor> all_gather(const std::vector<const Tensor*>& ins, int64_t axis) {
  check_same(ins);
  const Tensor& x = *ins[0];
  int64_t a = norm_axis(axis, x.shape.size(), "all-gather axis");
  int64_t n = static_cast<int64_t>(ins.size());
  Shape s = x.shape;
  s[a] *= n;
  Tensor out(x.dtype, s);
  for (int64_t j = 0; j < n; ++j) copy_along_axis(*ins[j], a, 0, out, j * x.shape[a], x.shape[a]);
  return replicate(std::move(out), ins.size());
}

std::vector<Tensor> reduce_scatter(const std::vector<const Tensor*>& ins, int64_t axis, ReductionKind k, Tensor* acc) {
  check_same(ins);
  int64_t a = norm_axis(axis, ins[0]->shape.size(), "reduce-scatter axis");
  int64_t n = static_cast<int64_t>(ins.size());
  int64_t d = ins[0]->shape[a];
  if (d % n != 0)
    throw InternalError(fmt::format("reduce-scatter: dim {} of {} is not divisible by the group size {}", a,
                                    shape_str(ins[0]->shape), n));
  Tensor full = reduce_all(ins, k, acc);
  int64_t len = d / n;
  Shape s = full.shape;
  s[a] = len;
  std::vector<Tensor> out;
  out.reserve(ins.size());
  for (int64_t j = 0; j < n; ++j) {
    Tensor y(full.dtype, s);
    copy_along_axis(full, a, j * len, y, 0, len);
    out.push_back(std::move(y));
  }
  return out;
}

std::vector<Tensor> all_to_all(const std::vector<const Tensor*>& ins, int64_t split_axis, int64_t concat_axis) {
  check_same(ins);
  const Tensor& x = *ins[0];
  int64_t sa = norm_axis(split_axis, x.shape.size(), "all-to-all split_axis");
  int64_t ca = norm_axis(concat_axis, x.shape.size(), "all-to-all concat_axis");
  int64_t n = static_cast<int64_t>(ins.size());
  if (x.shape[sa] % n != 0)
    throw InternalError(
        fmt::format("all-to-all: dim {} of {} is not divisible by the group size {}", sa, shape_str(x.shape), n));
  int64_t len = x.shape[sa] / n;
  Shape cs = x.shape;  // chunk shape
  cs[sa] = len;
  Shape os = cs;
  os[ca] *= n;
  std::vector<Tensor> out;
  out.reserve(ins.size());
  Tensor chunk(x.dtype, cs);
  for (int64_t j = 0; j < n; ++j) {
    Tensor y(x.dtype, os);
    for (int64_t i = 0; i < n; ++i) {
      if (sa == ca) {
        copy_along_axis(*ins[i], sa, j * len, y, i * len, len);
      } else {
        copy_along_axis(*ins[i], sa, j * len, chunk, 0, len);
        copy_along_axis(chunk, ca, 0, y, i * cs[ca], cs[ca]);
      }
    }
    out.push_back(std::move(y));
  }
  return out;
}

std::vector<Tensor> collective_permute(const std::vector<const Tensor*>& ins, const std::vector<int64_t>& sources) {
  check_same(ins);
  if (sources.size() != ins.size())
    throw InternalError(fmt::format("collective-permute: {} sources for a group of {}", sources.size(), ins.size()));
  std::vector<Tensor> out;
  out.reserve(ins.size());
  for (int64_t src : sources) {
    if (src >= 0 && src < static_cast<int64_t>(ins.size()))
      out.push_back(*ins[static_cast<size_t>(src)]);
    else
      out.emplace_back(ins[0]->dtype, ins[0]->shape);
  }
  return out;
}

Tensor shard_slice(const Tensor& x, int64_t axis, int64_t start, int64_t size) {
  int64_t a = norm_axis(axis, x.shape.size(), "ShardSlice axis");
  if (size < 0) throw InternalError(fmt::format("ShardSlice: negative size {}", size));
  Shape s = x.shape;
  s[a] = size;
  Tensor y(x.dtype, s);
  // the part of [start, start + size) inside [0, x.shape[a]) is copied, the rest stays zero
  int64_t lo = std::clamp<int64_t>(start, 0, x.shape[a]), hi = std::clamp<int64_t>(start + size, 0, x.shape[a]);
  if (hi > lo) copy_along_axis(x, a, lo, y, lo - start, hi - lo);
  return y;
}

void mask_pad(Tensor& x, int64_t axis, int64_t first_global, int64_t full_size, float value) {
  int64_t a = norm_axis(axis, x.shape.size(), "MaskPad axis");
  int64_t L = x.shape[a];
  // local indices [keep_lo, keep_hi) have global indices inside [0, full_size)
  int64_t keep_lo = std::clamp<int64_t>(-first_global, 0, L);
  int64_t keep_hi = std::clamp<int64_t>(full_size - first_global, keep_lo, L);
  if ((keep_lo == 0 && keep_hi == L) || x.numel() == 0) return;
  std::vector<std::byte> pat;
  switch (x.dtype) {
    case DType::kFloat32: fill_value<float>(pat, value); break;
    case DType::kFloat64: fill_value<double>(pat, value); break;
    case DType::kInt64: fill_value<int64_t>(pat, value); break;
    case DType::kInt32: fill_value<int32_t>(pat, value); break;
    case DType::kInt16: fill_value<int16_t>(pat, value); break;
    case DType::kInt8: fill_value<int8_t>(pat, value); break;
    case DType::kUInt64: fill_value<uint64_t>(pat, value); break;
    case DType::kUInt32: fill_value<uint32_t>(pat, value); break;
    case DType::kUInt16: fill_value<uint16_t>(pat, value); break;
    case DType::kUInt8: fill_value<uint8_t>(pat, value); break;
    case DType::kBool: {
      uint8_t b = value != 0.f;
      pat.assign(1, static_cast<std::byte>(b));
      break;
    }
    case DType::kFloat16:  // the 16-bit pattern of the value (0, or -inf / +inf for max / min)
    case DType::kBFloat16: {
      const uint16_t h = x.dtype == DType::kFloat16 ? float_to_half(value) : float_to_bf16(value);
      pat.resize(sizeof h);
      std::memcpy(pat.data(), &h, sizeof h);
      break;
    }
    default: throw UnsupportedError(fmt::format("MaskPad of {} is not supported by the pod", dtype_name(x.dtype)));
  }
  size_t es = pat.size();
  Blocks b = blocks(x.shape, a, es);
  size_t inner_elems = b.inner / es;
  // one padded row (inner elements), then copy it over every padded slice
  std::vector<std::byte> row(b.inner);
  for (size_t i = 0; i < inner_elems; ++i) std::memcpy(row.data() + i * es, pat.data(), es);
  std::byte* d = x.bytes.data();
  for (int64_t o = 0; o < b.outer; ++o)
    for (int64_t i = 0; i < L; ++i)
      if (i < keep_lo || i >= keep_hi) std::memcpy(d + static_cast<size_t>(o * L + i) * b.inner, row.data(), b.inner);
}

}  // namespace gspmd::pod
