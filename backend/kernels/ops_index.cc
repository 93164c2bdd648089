// Indexing and ordering kernels (plain C++): GatherElements, GatherND, ScatterElements (and legacy Scatter),
// ScatterND, OneHot, NonZero, Compress, TopK, CumSum, DepthToSpace, SpaceToDepth, Hardmax, Trilu, EyeLike, CastLike,
// Unique, ReverseSequence, NonMaxSuppression.
// Data movement is dtype-agnostic (elements moved by size); reductions dispatch on the element type.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/shape_rules_data.h"

namespace gspmd::kern {
namespace {

const std::vector<int64_t> index_values(const Ctx& c, const Tensor& t, const char* what) {
  if (t.dtype != DType::kInt64 && t.dtype != DType::kInt32)
    c.fail(fmt::format("{} must be int32 or int64, got {}", what, dtype_name(t.dtype)));
  return t.as_int64s();
}

int64_t norm_index(const Ctx& c, int64_t i, int64_t dim) {
  const int64_t k = i < 0 ? i + dim : i;
  if (k < 0 || k >= dim) c.fail(fmt::format("index {} out of range for a dim of size {}", i, dim));
  return k;
}

/// Calls f(flat index in `shape`, multi-index) for every element, row-major.
template <class F>
void for_each_index(const Shape& shape, F&& f) {
  const int64_t n = num_elements(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    f(k, idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// GatherElements / ScatterElements.

std::vector<Tensor> gather_elements_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& it = c.req(1);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r == 0 || static_cast<int64_t>(it.shape.size()) != r) c.fail("data and indices must have the same rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", 0), r);
  const std::vector<int64_t> ids = index_values(c, it, "indices");
  Tensor out(x.dtype, it.shape);
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  const size_t es = dtype_size(x.dtype);
  for_each_index(it.shape, [&](int64_t k, const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (int64_t d = 0; d < r; ++d) off += (d == ax ? norm_index(c, ids[k], x.shape[d]) : idx[d]) * xs[d];
    std::memcpy(out.bytes.data() + k * es, x.bytes.data() + off * es, es);
  });
  return one(std::move(out));
}

enum class ScatterRed { kNone, kAdd, kMul, kMax, kMin };

ScatterRed scatter_reduction(const Ctx& c) {
  const std::string r = c.node.s("reduction", "none");
  if (r == "none") return ScatterRed::kNone;
  if (r == "add") return ScatterRed::kAdd;
  if (r == "mul") return ScatterRed::kMul;
  if (r == "max") return ScatterRed::kMax;
  if (r == "min") return ScatterRed::kMin;
  c.fail(fmt::format("unknown reduction '{}'", r));
}

/// Applies update element u (at updates offset `src`) to out offset `dst` (element size es).
void scatter_apply(const Ctx& c, ScatterRed red, Tensor& out, int64_t dst, const Tensor& upd, int64_t src) {
  const size_t es = dtype_size(out.dtype);
  if (red == ScatterRed::kNone) {
    std::memcpy(out.bytes.data() + dst * es, upd.bytes.data() + src * es, es);
    return;
  }
  dispatch_numeric(c, out.dtype, [&]<class T>() {
    T& a = out.data<T>()[dst];
    const T v = upd.data<T>()[src];
    switch (red) {
      case ScatterRed::kAdd: a = static_cast<T>(a + v); break;
      case ScatterRed::kMul: a = static_cast<T>(a * v); break;
      case ScatterRed::kMax: a = std::max(a, v); break;
      case ScatterRed::kMin: a = std::min(a, v); break;
      default: break;
    }
  });
}

std::vector<Tensor> scatter_elements_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& it = c.req(1);
  const Tensor& upd = c.req(2);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r == 0 || static_cast<int64_t>(it.shape.size()) != r) c.fail("data and indices must have the same rank >= 1");
  if (upd.shape != it.shape || upd.dtype != x.dtype) c.fail("updates must match indices in shape and data in dtype");
  const int64_t ax = c.axis(c.node.i("axis", 0), r);
  const ScatterRed red = scatter_reduction(c);
  const std::vector<int64_t> ids = index_values(c, it, "indices");
  Tensor out = x;
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  for_each_index(it.shape, [&](int64_t k, const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (int64_t d = 0; d < r; ++d) off += (d == ax ? norm_index(c, ids[k], x.shape[d]) : idx[d]) * xs[d];
    scatter_apply(c, red, out, off, upd, k);
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// GatherND / ScatterND.

std::vector<Tensor> gather_nd_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& it = c.req(1);
  const int64_t b = c.node.i("batch_dims", 0);
  Tensor out(x.dtype, gather_nd_shape(c, x.shape, it.shape, b));
  const int64_t last = it.shape.back();
  const std::vector<int64_t> ids = index_values(c, it, "indices");
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  const size_t es = dtype_size(x.dtype);
  const int64_t slice = num_elements(Shape(x.shape.begin() + b + last, x.shape.end()));
  int64_t batch = 1;
  for (int64_t i = 0; i < b; ++i) batch *= it.shape[i];
  const int64_t per_batch = num_elements(Shape(it.shape.begin() + b, it.shape.end() - 1));
  const int64_t xbatch = b > 0 ? xs[b - 1] : 0;
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t j = 0; j < per_batch; ++j) {
      const int64_t row = bi * per_batch + j;
      int64_t off = bi * xbatch;
      for (int64_t k = 0; k < last; ++k) off += norm_index(c, ids[row * last + k], x.shape[b + k]) * xs[b + k];
      std::memcpy(out.bytes.data() + row * slice * es, x.bytes.data() + off * es, slice * es);
    }
  return one(std::move(out));
}

std::vector<Tensor> scatter_nd_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& it = c.req(1);
  const Tensor& upd = c.req(2);
  const int64_t r = static_cast<int64_t>(x.shape.size()), q = static_cast<int64_t>(it.shape.size());
  if (q < 1 || r < 1) c.fail("data and indices must have rank >= 1");
  const int64_t last = it.shape.back();
  if (last < 1 || last > r) c.fail(fmt::format("indices last dim {} out of range", last));
  Shape us(it.shape.begin(), it.shape.end() - 1);
  us.insert(us.end(), x.shape.begin() + last, x.shape.end());
  if (upd.shape != us || upd.dtype != x.dtype)
    c.fail(fmt::format("updates of shape {} do not match expected {}", shape_str(upd.shape), shape_str(us)));
  const ScatterRed red = scatter_reduction(c);
  Tensor out = x;
  const std::vector<int64_t> ids = index_values(c, it, "indices");
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  const int64_t slice = num_elements(Shape(x.shape.begin() + last, x.shape.end()));
  const int64_t rows = num_elements(Shape(it.shape.begin(), it.shape.end() - 1));
  for (int64_t row = 0; row < rows; ++row) {
    int64_t off = 0;
    for (int64_t k = 0; k < last; ++k) off += norm_index(c, ids[row * last + k], x.shape[k]) * xs[k];
    for (int64_t e = 0; e < slice; ++e) scatter_apply(c, red, out, off + e, upd, row * slice + e);
  }
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// OneHot, NonZero, Compress.

double scalar_value(const Ctx& c, const Tensor& t, const char* what) {
  if (t.numel() < 1) c.fail(fmt::format("{} must have one element", what));
  return dispatch_all(c, t.dtype, [&]<class T>() { return static_cast<double>(t.data<T>()[0]); });
}

std::vector<Tensor> one_hot_kernel(const Ctx& c) {
  const Tensor& it = c.req(0);
  const int64_t depth = static_cast<int64_t>(scalar_value(c, c.req(1), "depth"));
  const Tensor& vals = c.req(2);
  if (vals.numel() != 2) c.fail("values must have two elements [off, on]");
  if (depth < 0) c.fail("depth must be non-negative");
  const int64_t r = static_cast<int64_t>(it.shape.size());
  const int64_t ax = c.axis(c.node.i("axis", -1), r + 1);
  Shape os = it.shape;
  os.insert(os.begin() + ax, depth);
  Tensor out(vals.dtype, os);
  const size_t es = dtype_size(vals.dtype);
  for (size_t i = 0; i < out.bytes.size(); i += es) std::memcpy(out.bytes.data() + i, vals.bytes.data(), es);
  const std::vector<int64_t> ids = dispatch_all(c, it.dtype, [&]<class T>() {
    std::vector<int64_t> v(static_cast<size_t>(it.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(it.data<T>()[i]);
    return v;
  });
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < ax; ++i) outer *= it.shape[i];
  for (int64_t i = ax; i < r; ++i) inner *= it.shape[i];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      int64_t k = ids[o * inner + j];
      if (k < 0) k += depth;
      if (k < 0 || k >= depth) continue;
      std::memcpy(out.bytes.data() + ((o * depth + k) * inner + j) * es, vals.bytes.data() + es, es);
    }
  return one(std::move(out));
}

std::vector<Tensor> non_zero_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> hits;
  dispatch_all(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i)
      if (s[i] != T(0)) hits.push_back(i);
  });
  const int64_t n = static_cast<int64_t>(hits.size());
  Tensor out(DType::kInt64, {std::max<int64_t>(r, 1), n});
  if (r == 0) {
    // Scalar input: numpy treats it as 1-D.
    for (int64_t i = 0; i < n; ++i) out.data<int64_t>()[i] = 0;
    return one(std::move(out));
  }
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = hits[i];
    for (int64_t d = 0; d < r; ++d) {
      out.data<int64_t>()[d * n + i] = rem / xs[d];
      rem %= xs[d];
    }
  }
  return one(std::move(out));
}

std::vector<Tensor> compress_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& cond = c.req(1);
  if (cond.dtype != DType::kBool) c.fail("condition must be bool");
  Shape xs = x.shape;
  int64_t ax = 0;
  if (c.node.has("axis")) {
    ax = c.axis(c.node.i("axis"), static_cast<int64_t>(xs.size()));
  } else {
    xs = {x.numel()};
  }
  const int64_t len = xs[ax];
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < std::min(len, cond.numel()); ++i)
    if (cond.data<uint8_t>()[i]) keep.push_back(i);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < ax; ++i) outer *= xs[i];
  for (size_t i = ax + 1; i < xs.size(); ++i) inner *= xs[i];
  Shape os = xs;
  os[ax] = static_cast<int64_t>(keep.size());
  Tensor out(x.dtype, os);
  const size_t row = inner * dtype_size(x.dtype);
  std::byte* d = out.bytes.data();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k : keep) {
      std::memcpy(d, x.bytes.data() + (o * len + k) * row, row);
      d += row;
    }
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// TopK, CumSum.

std::vector<Tensor> top_k_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r == 0) c.fail("input must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", -1), r);
  int64_t k;
  if (c.opset < 10) {
    k = c.node.i("k", -1);
  } else {
    const std::vector<int64_t> kv = c.req(1).as_int64s();
    if (kv.size() != 1) c.fail("K must have one element");
    k = kv[0];
  }
  const int64_t len = x.shape[ax];
  if (k < 0 || k > len) c.fail(fmt::format("K={} out of range for an axis of size {}", k, len));
  const bool largest = c.node.i("largest", 1) != 0;
  Shape os = x.shape;
  os[ax] = k;
  std::vector<Tensor> outs;
  outs.emplace_back(x.dtype, os);
  outs.emplace_back(DType::kInt64, os);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < ax; ++i) outer *= x.shape[i];
  for (int64_t i = ax + 1; i < r; ++i) inner *= x.shape[i];
  dispatch_numeric(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    T* v = outs[0].data<T>();
    int64_t* ix = outs[1].data<int64_t>();
    std::vector<int64_t> order(static_cast<size_t>(len));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        const T* p = s + o * len * inner + j;
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the lower index first (onnxruntime / the ONNX reference).
        auto cmp = [&](int64_t a, int64_t b) {
          const T va = p[a * inner], vb = p[b * inner];
          if (va != vb) return largest ? va > vb : va < vb;
          return a < b;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), cmp);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t dst = (o * k + i) * inner + j;
          v[dst] = p[order[i] * inner];
          ix[dst] = order[i];
        }
      }
  });
  return outs;
}

std::vector<Tensor> cum_sum_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  const std::vector<int64_t> av = c.req(1).as_int64s();
  if (av.size() != 1) c.fail("axis must have one element");
  const int64_t ax = c.axis(av[0], std::max<int64_t>(r, 1));
  const bool excl = c.node.i("exclusive", 0) != 0, rev = c.node.i("reverse", 0) != 0;
  const int64_t len = r == 0 ? 1 : x.shape[ax];
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < ax; ++i) outer *= x.shape[i];
  for (int64_t i = ax + 1; i < r; ++i) inner *= x.shape[i];
  Tensor out(x.dtype, x.shape);
  dispatch_numeric(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    T* d = out.data<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        T acc = T(0);
        for (int64_t t = 0; t < len; ++t) {
          const int64_t i = rev ? len - 1 - t : t;
          const int64_t off = (o * len + i) * inner + j;
          if (excl) {
            d[off] = acc;
            acc = static_cast<T>(acc + s[off]);
          } else {
            acc = static_cast<T>(acc + s[off]);
            d[off] = acc;
          }
        }
      }
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// DepthToSpace / SpaceToDepth (as a 6-D transpose), Hardmax.

Tensor permute(const Tensor& x, const Shape& view, const std::vector<int64_t>& perm, const Shape& os) {
  const std::vector<int64_t> vs = contiguous_strides(view);
  Shape pshape(perm.size());
  std::vector<int64_t> st(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    pshape[i] = view[perm[i]];
    st[i] = vs[perm[i]];
  }
  Tensor out(x.dtype, os);
  const std::vector<int64_t> ds = contiguous_strides(pshape);
  strided_copy(out.bytes.data(), ds.data(), x.bytes.data(), st.data(), pshape, dtype_size(x.dtype));
  return out;
}

std::vector<Tensor> depth_to_space_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() != 4) c.fail("input must be 4-D");
  const int64_t b = c.node.i("blocksize", 0);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (b <= 0 || C % (b * b) != 0) c.fail(fmt::format("channels {} not divisible by blocksize^2 ({})", C, b));
  const Shape os{N, C / (b * b), H * b, W * b};
  if (c.node.s("mode", "DCR") == "DCR")
    return one(permute(x, {N, b, b, C / (b * b), H, W}, {0, 3, 4, 1, 5, 2}, os));
  return one(permute(x, {N, C / (b * b), b, b, H, W}, {0, 1, 4, 2, 5, 3}, os));
}

std::vector<Tensor> space_to_depth_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() != 4) c.fail("input must be 4-D");
  const int64_t b = c.node.i("blocksize", 0);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (b <= 0 || H % b != 0 || W % b != 0) c.fail(fmt::format("spatial dims not divisible by blocksize {}", b));
  return one(permute(x, {N, C, H / b, b, W / b, b}, {0, 3, 5, 1, 2, 4}, {N, C * b * b, H / b, W / b}));
}

std::vector<Tensor> hardmax_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  int64_t outer = 1, len = 1, inner = 1;
  if (c.opset < 13) {
    int64_t a = c.node.i("axis", 1);
    if (a < 0) a += r;
    if (a < 0 || a > r) c.fail(fmt::format("axis {} out of range for rank {}", c.node.i("axis", 1), r));
    for (int64_t i = 0; i < a; ++i) outer *= x.shape[i];
    for (int64_t i = a; i < r; ++i) len *= x.shape[i];
  } else {
    if (r == 0) c.fail("input must have rank >= 1");
    const int64_t a = c.axis(c.node.i("axis", -1), r);
    for (int64_t i = 0; i < a; ++i) outer *= x.shape[i];
    len = x.shape[a];
    for (int64_t i = a + 1; i < r; ++i) inner *= x.shape[i];
  }
  Tensor out(x.dtype, x.shape);
  if (len == 0) return one(std::move(out));
  dispatch_float(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    T* d = out.data<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        int64_t best = 0;
        for (int64_t i = 1; i < len; ++i)
          if (s[(o * len + i) * inner + j] > s[(o * len + best) * inner + j]) best = i;
        d[(o * len + best) * inner + j] = T(1);
      }
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Trilu, EyeLike, CastLike.

std::vector<Tensor> trilu_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() < 2) c.fail("input must have rank >= 2");
  int64_t k = 0;
  if (const Tensor* t = c.in(1)) {
    const std::vector<int64_t> kv = t->as_int64s();
    if (kv.size() != 1) c.fail("k must have one element");
    k = kv[0];
  }
  const bool upper = c.node.i("upper", 1) != 0;
  const int64_t n = x.shape[x.shape.size() - 2], m = x.shape.back();
  const int64_t mats = n * m == 0 ? 0 : x.numel() / (n * m);
  Tensor out(x.dtype, x.shape);
  const size_t es = dtype_size(x.dtype);
  for (int64_t b = 0; b < mats; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const bool keep = upper ? j - i >= k : j - i <= k;
        const size_t off = static_cast<size_t>((b * n + i) * m + j) * es;
        if (keep) std::memcpy(out.bytes.data() + off, x.bytes.data() + off, es);
      }
  return one(std::move(out));
}

std::vector<Tensor> eye_like_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() != 2) c.fail("input must be 2-D");
  const DType dt = c.node.has("dtype") ? static_cast<DType>(c.node.i("dtype")) : x.dtype;
  const int64_t k = c.node.i("k", 0);
  Tensor out(dt, x.shape);
  dispatch_all(c, dt, [&]<class T>() {
    for (int64_t i = 0; i < x.shape[0]; ++i)
      if (i + k >= 0 && i + k < x.shape[1]) out.data<T>()[i * x.shape[1] + i + k] = T(1);
  });
  return one(std::move(out));
}

std::vector<Tensor> cast_like_kernel(const Ctx& c) { return one(cast_tensor(c, c.req(0), c.req(1).dtype)); }

/// Unique (opset 11): unique elements (no axis: of the flattened input) or unique slices along `axis`, sorted
/// ascending (lexicographically for slices) when sorted=1, else in order of first occurrence. Outputs Y, indices
/// (first occurrence), inverse_indices, counts (int64, 1-D).
std::vector<Tensor> unique_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const bool has_axis = c.node.has("axis");
  const bool sorted = c.node.i("sorted", 1) != 0;
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const int64_t axis = has_axis ? c.axis(c.node.i("axis"), rank) : 0;
  int64_t outer = 1, A = x.numel(), inner = 1;
  if (has_axis) {
    A = x.shape[axis];
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[d];
  }
  std::vector<int64_t> order(static_cast<size_t>(A));  // slice ids, sorted or by first occurrence
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> rep;                              // per unique: its first slice
  std::vector<int64_t> inverse(static_cast<size_t>(A)), counts;
  dispatch_all(c, x.dtype, [&]<class T>() {
    const T* p = x.data<T>();
    // Slice j is p[o * A * inner + j * inner + i] for o < outer, i < inner, compared in (o, i) order.
    auto cmp = [&](int64_t a, int64_t b) -> int {
      for (int64_t o = 0; o < outer; ++o) {
        const T* pa = p + o * A * inner + a * inner;
        const T* pb = p + o * A * inner + b * inner;
        for (int64_t i = 0; i < inner; ++i) {
          if (pa[i] < pb[i]) return -1;
          if (pb[i] < pa[i]) return 1;
        }
      }
      return 0;
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
    // Groups of equal slices in sorted order; the first of each group (stable sort) is its first occurrence.
    std::vector<int64_t> group_of(static_cast<size_t>(A));
    std::vector<int64_t> firsts;
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || cmp(order[k - 1], order[k]) != 0) firsts.push_back(order[k]);
      group_of[order[k]] = static_cast<int64_t>(firsts.size()) - 1;
    }
    std::vector<int64_t> pos(firsts.size());  // group -> output position
    std::iota(pos.begin(), pos.end(), 0);
    if (!sorted) {
      std::vector<int64_t> by_first(firsts.size());
      std::iota(by_first.begin(), by_first.end(), 0);
      std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return firsts[a] < firsts[b]; });
      for (size_t k = 0; k < by_first.size(); ++k) pos[by_first[k]] = static_cast<int64_t>(k);
    }
    rep.assign(firsts.size(), 0);
    counts.assign(firsts.size(), 0);
    for (size_t gi = 0; gi < firsts.size(); ++gi) rep[pos[gi]] = firsts[gi];
    for (int64_t j = 0; j < A; ++j) {
      inverse[j] = pos[group_of[j]];
      ++counts[inverse[j]];
    }
  });
  const int64_t U = static_cast<int64_t>(rep.size());
  Shape ys = has_axis ? x.shape : Shape{U};
  if (has_axis) ys[axis] = U;
  Tensor y(x.dtype, ys);
  const size_t es = dtype_size(x.dtype), row = static_cast<size_t>(inner) * es;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t u = 0; u < U; ++u)
      std::memcpy(y.bytes.data() + (o * U + u) * row, x.bytes.data() + (o * A + rep[u]) * row, row);
  std::vector<Tensor> outs;
  outs.push_back(std::move(y));
  outs.push_back(Tensor::from_int64s(rep));
  outs.push_back(Tensor::from_int64s(inverse));
  outs.push_back(Tensor::from_int64s(counts));
  outs.resize(std::max<size_t>(1, std::min<size_t>(4, c.n_out())));
  return outs;
}

/// ReverseSequence (opset 10): for each batch entry b, reverses the first sequence_lens[b] steps along time_axis.
std::vector<Tensor> reverse_sequence_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> lens = c.req(1).as_int64s();
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank < 2) c.fail(fmt::format("input must have rank >= 2, got {}", shape_str(x.shape)));
  const int64_t ta = c.axis(c.node.i("time_axis", 0), rank), ba = c.axis(c.node.i("batch_axis", 1), rank);
  if (ta == ba || std::min(ta, ba) != 0 || std::max(ta, ba) != 1) c.fail("time_axis and batch_axis must be 0 and 1");
  const int64_t T = x.shape[ta], B = x.shape[ba];
  if (static_cast<int64_t>(lens.size()) != B) c.fail(fmt::format("sequence_lens has {} entries, batch is {}", lens.size(), B));
  const size_t row = static_cast<size_t>(x.numel() / std::max<int64_t>(1, T * B)) * dtype_size(x.dtype);
  Tensor out = x;
  auto at = [&](int64_t t, int64_t b) { return (ta == 0 ? t * B + b : b * T + t) * static_cast<int64_t>(row); };
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens[b];
    if (len < 0 || len > T) c.fail(fmt::format("sequence_lens[{}] = {} is out of range [0, {}]", b, len, T));
    for (int64_t t = 0; t < len; ++t) std::memcpy(out.bytes.data() + at(t, b), x.bytes.data() + at(len - 1 - t, b), row);
  }
  return one(std::move(out));
}

/// NonMaxSuppression (opset 11): per batch and class, boxes sorted by descending score (ties: lower index first) with
/// score > score_threshold are kept greedily unless their IoU with a kept box exceeds iou_threshold, at most
/// max_output_boxes_per_class each. Output [k, 3] int64 (batch, class, box). center_point_box=1: [x, y, w, h];
/// else corners [y1, x1, y2, x2] in any order.
std::vector<Tensor> nms_kernel(const Ctx& c) {
  const Tensor boxes = cast_tensor(c, c.req(0), DType::kFloat32);
  const Tensor scores = cast_tensor(c, c.req(1), DType::kFloat32);
  if (boxes.shape.size() != 3 || boxes.shape[2] != 4 || scores.shape.size() != 3 || scores.shape[0] != boxes.shape[0] ||
      scores.shape[2] != boxes.shape[1])
    c.fail(fmt::format("boxes {} and scores {} must be [B, n, 4] and [B, C, n]", shape_str(boxes.shape),
                       shape_str(scores.shape)));
  const int64_t B = boxes.shape[0], n = boxes.shape[1], C = scores.shape[1];
  int64_t max_out = 0;
  if (const Tensor* t = c.in(2); t && t->numel() > 0) max_out = t->as_int64s()[0];
  float iou_th = 0, score_th = -INFINITY;
  if (const Tensor* t = c.in(3); t && t->numel() > 0) iou_th = cast_tensor(c, *t, DType::kFloat32).data<float>()[0];
  const bool has_score_th = c.in(4) && c.in(4)->numel() > 0;
  if (has_score_th) score_th = cast_tensor(c, *c.in(4), DType::kFloat32).data<float>()[0];
  const bool center = c.node.i("center_point_box", 0) != 0;
  std::vector<std::array<float, 4>> corner(static_cast<size_t>(B * n));  // y1, x1, y2, x2 with y1 <= y2, x1 <= x2
  for (int64_t i = 0; i < B * n; ++i) {
    const float* b = boxes.data<float>() + i * 4;
    if (center)
      corner[i] = {b[1] - b[3] / 2, b[0] - b[2] / 2, b[1] + b[3] / 2, b[0] + b[2] / 2};
    else
      corner[i] = {std::min(b[0], b[2]), std::min(b[1], b[3]), std::max(b[0], b[2]), std::max(b[1], b[3])};
  }
  auto iou = [](const std::array<float, 4>& a, const std::array<float, 4>& b) {
    const float ih = std::min(a[2], b[2]) - std::max(a[0], b[0]), iw = std::min(a[3], b[3]) - std::max(a[1], b[1]);
    const float area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
    if (ih <= 0 || iw <= 0 || area_a <= 0 || area_b <= 0) return 0.f;
    const float inter = ih * iw;
    return inter / (area_a + area_b - inter);
  };
  std::vector<int64_t> sel;
  std::vector<int64_t> order(static_cast<size_t>(n)), kept;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < C && max_out > 0; ++k) {
      const float* sc = scores.data<float>() + (b * C + k) * n;
      order.clear();
      for (int64_t i = 0; i < n; ++i)
        if (!has_score_th || sc[i] > score_th) order.push_back(i);
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return sc[x] > sc[y]; });
      kept.clear();
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        bool keep = true;
        for (int64_t j : kept)
          if (iou(corner[b * n + i], corner[b * n + j]) > iou_th) {
            keep = false;
            break;
          }
        if (!keep) continue;
        kept.push_back(i);
        sel.insert(sel.end(), {b, k, i});
      }
    }
  Tensor out(DType::kInt64, {static_cast<int64_t>(sel.size() / 3), 3});
  std::copy(sel.begin(), sel.end(), out.data<int64_t>());
  return one(std::move(out));
}

}  // namespace

void register_index(KernelTable& t) {
  t["NonMaxSuppression"] = nms_kernel;
  t["Unique"] = unique_kernel;
  t["ReverseSequence"] = reverse_sequence_kernel;
  t["GatherElements"] = gather_elements_kernel;
  t["ScatterElements"] = scatter_elements_kernel;
  t["Scatter"] = scatter_elements_kernel;
  t["GatherND"] = gather_nd_kernel;
  t["ScatterND"] = scatter_nd_kernel;
  t["OneHot"] = one_hot_kernel;
  t["NonZero"] = non_zero_kernel;
  t["Compress"] = compress_kernel;
  t["TopK"] = top_k_kernel;
  t["CumSum"] = cum_sum_kernel;
  t["DepthToSpace"] = depth_to_space_kernel;
  t["SpaceToDepth"] = space_to_depth_kernel;
  t["Hardmax"] = hardmax_kernel;
  t["Trilu"] = trilu_kernel;
  t["EyeLike"] = eye_like_kernel;
  t["CastLike"] = cast_like_kernel;
}

}  // namespace gspmd::kern
