// shard_tensor / assemble_tensor (sharding.h): a global tensor cut into one device's shard (padded with zeros where
// the shard passes the end of an uneven dim) and the shards assembled back, with unreduced values combined by their
// reduction.
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "core/sharding/sharding.h"

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// shard_tensor / assemble_tensor

namespace {

// Runs f(DType-tag as a value of C++ type T) for the dtype; halves go through float.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: f(float{}); break;
    case DType::kFloat64: f(double{}); break;
    case DType::kInt8: f(int8_t{}); break;
    case DType::kUInt8: f(uint8_t{}); break;
    case DType::kInt16: f(int16_t{}); break;
    case DType::kUInt16: f(uint16_t{}); break;
    case DType::kInt32: f(int32_t{}); break;
    case DType::kUInt32: f(uint32_t{}); break;
    case DType::kInt64: f(int64_t{}); break;
    case DType::kUInt64: f(uint64_t{}); break;
    case DType::kBool: f(bool{}); break;
    default: throw std::invalid_argument(fmt::format("unreduced {} tensors are not supported", dtype_name(t)));
  }
}

template <class T>
T identity_of(ReductionKind k) {
  switch (k) {
    case ReductionKind::kSum: return T(0);
    case ReductionKind::kProd: return T(1);
    case ReductionKind::kMax:
      if constexpr (std::is_floating_point_v<T>)
        return -std::numeric_limits<T>::infinity();
      else
        return std::numeric_limits<T>::lowest();
    case ReductionKind::kMin:
      if constexpr (std::is_floating_point_v<T>)
        return std::numeric_limits<T>::infinity();
      else
        return std::numeric_limits<T>::max();
  }
  return T(0);
}

template <class T>
T combine(ReductionKind k, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    switch (k) {
      case ReductionKind::kSum:
      case ReductionKind::kMax: return a || b;
      default: return a && b;
    }
  } else {
    switch (k) {
      case ReductionKind::kSum: return static_cast<T>(a + b);
      case ReductionKind::kProd: return static_cast<T>(a * b);
      case ReductionKind::kMax: return std::max(a, b);
      case ReductionKind::kMin: return std::min(a, b);
    }
    return a;
  }
}

// The element pattern of the reduction identity for `dt`, as bytes.
std::vector<std::byte> identity_bytes(DType dt, ReductionKind k) {
  std::vector<std::byte> out(dtype_size(dt));
  if (dt == DType::kFloat16 || dt == DType::kBFloat16) {
    float f = identity_of<float>(k);
    uint16_t h = dt == DType::kFloat16 ? float_to_half(f) : float_to_bf16(f);
    std::memcpy(out.data(), &h, 2);
    return out;
  }
  with_type(dt, [&](auto tag) {
    using T = decltype(tag);
    T v = identity_of<T>(k);
    std::memcpy(out.data(), &v, sizeof(T));
  });
  return out;
}

// dst[i] = dst[i] (op) src[i] for n elements of dtype dt.
void combine_row(DType dt, ReductionKind k, std::byte* dst, const std::byte* src, int64_t n) {
  if (dt == DType::kFloat16 || dt == DType::kBFloat16) {
    const bool h = dt == DType::kFloat16;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t a, b;
      std::memcpy(&a, dst + 2 * i, 2);
      std::memcpy(&b, src + 2 * i, 2);
      float r = combine<float>(k, h ? half_to_float(a) : bf16_to_float(a), h ? half_to_float(b) : bf16_to_float(b));
      uint16_t o = h ? float_to_half(r) : float_to_bf16(r);
      std::memcpy(dst + 2 * i, &o, 2);
    }
    return;
  }
  with_type(dt, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      T a, b;
      std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
      std::memcpy(&b, src + i * sizeof(T), sizeof(T));
      a = combine<T>(k, a, b);
      std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
    }
  });
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// Calls row(global_elem_offset, local_elem_offset, n_elems) for each innermost row of the region of `valid` extents
// at global offset `off` in a tensor of shape `global`, local tensor of shape `local`.
template <class F>
void for_each_row(const Shape& global, const Shape& local, const std::vector<int64_t>& off,
                  const std::vector<int64_t>& valid, F&& row) {
  const int r = static_cast<int>(global.size());
  if (r == 0) {
    row(0, 0, 1);
    return;
  }
  for (int64_t v : valid)
    if (v <= 0) return;
  auto gs = strides_of(global), ls = strides_of(local);
  std::vector<int64_t> idx(r - 1, 0);
  while (true) {
    int64_t g = off[r - 1], l = 0;
    for (int i = 0; i < r - 1; ++i) {
      g += (off[i] + idx[i]) * gs[i];
      l += idx[i] * ls[i];
    }
    row(g, l, valid[r - 1]);
    int i = r - 2;
    for (; i >= 0; --i) {
      if (++idx[i] < valid[i]) break;
      idx[i] = 0;
    }
    if (i < 0) break;
  }
}

}  // namespace

Tensor shard_tensor(const Tensor& full, const TensorSharding& sharding, const DeviceMesh& mesh, int64_t device) {
  if (static_cast<int>(full.shape.size()) != sharding.rank())
    throw std::invalid_argument(fmt::format("shard_tensor: tensor of shape {} but sharding of rank {}",
                                            shape_str(full.shape), sharding.rank()));
  const int r = sharding.rank();
  Shape local = sharding.local_shape(full.shape, mesh);
  Tensor out(full.dtype, local);
  const size_t es = dtype_size(full.dtype);
  std::vector<int64_t> off(r), val(r);
  for (int i = 0; i < r; ++i) {
    off[i] = sharding.offset(i, full.shape, mesh, device);
    val[i] = sharding.valid(i, full.shape, mesh, device);
  }
  if (!sharding.unreduced.empty() && mesh.tile_index(device, sharding.unreduced) != 0) {
    auto id = identity_bytes(full.dtype, sharding.reduction);
    bool zero = std::all_of(id.begin(), id.end(), [](std::byte b) { return b == std::byte{0}; });
    if (zero) return out;
    for_each_row(full.shape, local, off, val, [&](int64_t, int64_t l, int64_t n) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(out.bytes.data() + (l + i) * es, id.data(), es);
    });
    return out;
  }
  for_each_row(full.shape, local, off, val, [&](int64_t g, int64_t l, int64_t n) {
    std::memcpy(out.bytes.data() + l * es, full.bytes.data() + g * es, n * es);
  });
  return out;
}

Tensor assemble_tensor(const std::vector<const Tensor*>& shards, const TensorSharding& sharding, const DeviceMesh& mesh,
                       const Shape& global_shape) {
  const int64_t n = mesh.num_devices();
  if (static_cast<int64_t>(shards.size()) != n)
    throw std::invalid_argument(fmt::format("assemble_tensor: {} shards for {} devices", shards.size(), n));
  if (static_cast<int>(global_shape.size()) != sharding.rank())
    throw std::invalid_argument(
        fmt::format("assemble_tensor: shape {} but sharding of rank {}", shape_str(global_shape), sharding.rank()));
  const Shape local = sharding.local_shape(global_shape, mesh);
  if (!shards[0]) throw std::invalid_argument("assemble_tensor: shard of device 0 is missing");
  const DType dt = shards[0]->dtype;
  for (int64_t k = 0; k < n; ++k) {
    const Tensor* t = shards[k];
    if (!t) throw std::invalid_argument(fmt::format("assemble_tensor: shard of device {} is missing", k));
    if (t->dtype != dt || t->shape != local)
      throw std::invalid_argument(fmt::format("assemble_tensor: device {} holds a {} {} shard, expected {} {}", k,
                                              dtype_name(t->dtype), shape_str(t->shape), dtype_name(dt),
                                              shape_str(local)));
    if (t->bytes.size() != static_cast<size_t>(num_elements(local)) * dtype_size(dt))
      throw std::invalid_argument(fmt::format("assemble_tensor: device {} shard has {} bytes", k, t->bytes.size()));
  }
  Tensor out(dt, global_shape);
  const int r = sharding.rank();
  const size_t es = dtype_size(dt);
  std::vector<char> role(mesh.shape.size(), 0);
  for (const auto& d : sharding.dims)
    for (int a : d) role.at(a) = 1;
  for (int a : sharding.unreduced) role.at(a) = 2;
  std::vector<int64_t> off(r), val(r);
  // pass 0: the representative (replica 0, unreduced tile 0) of every tile copies; pass 1: unreduced others combine.
  for (int pass = 0; pass < (sharding.unreduced.empty() ? 1 : 2); ++pass) {
    for (int64_t k = 0; k < n; ++k) {
      auto c = mesh.coords(k);
      bool rep0 = true, u0 = true;
      for (int a = 0; a < mesh.rank(); ++a) {
        if (role[a] == 0 && c[a] != 0) rep0 = false;
        if (role[a] == 2 && c[a] != 0) u0 = false;
      }
      if (!rep0 || u0 != (pass == 0)) continue;
      for (int i = 0; i < r; ++i) {
        off[i] = sharding.offset(i, global_shape, mesh, k);
        val[i] = sharding.valid(i, global_shape, mesh, k);
      }
      const std::byte* src = shards[k]->bytes.data();
      for_each_row(global_shape, local, off, val, [&](int64_t g, int64_t l, int64_t m) {
        if (pass == 0)
          std::memcpy(out.bytes.data() + g * es, src + l * es, m * es);
        else
          combine_row(dt, sharding.reduction, out.bytes.data() + g * es, src + l * es, m);
      });
    }
  }
  return out;
}

}  // namespace gspmd
