// The index family (core/rules/index_ops.cc), plain C++: GatherElements, GatherND, ScatterElements (and legacy
// Scatter), ScatterND, OneHot, NonZero, Compress, TopK, CumSum, Tile, Pad, Range. Resize and Upsample, of the same
// family, are in ops_index_resize.cc. Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
// Data movement is dtype-agnostic (elements moved by size); reductions dispatch on the element type.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "core/shapes/geometry_data.h"

namespace gspmd::kern {
namespace {

// Shape rules shared with the shape functions (core/shapes/geometry_data.h).
using shapes::gather_nd_shape;
using shapes::pad_dims;
using shapes::PadDims;

const std::vector<int64_t> index_values(const Ctx& c, const Tensor& t, const char* what) {
  if (t.dtype != DType::kInt64 && t.dtype != DType::kInt32)
    c.fail(fmt::format("{} must be int32 or int64, got {}", what, dtype_name(t.dtype)));
  return t.as_int64s();
}

int64_t norm_index(const Ctx& c, int64_t i, int64_t dim) {
  const int64_t k = i < 0 ? i + dim : i;
  if (k < 0 || k >= dim) c.bad_data(fmt::format("index {} out of range for a dim of size {}", i, dim));
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
  const int64_t depth = saturate_cast<int64_t>(scalar_value(c, c.req(1), "depth"));
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
    for (size_t i = 0; i < v.size(); ++i) v[i] = saturate_cast<int64_t>(it.data<T>()[i]);
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
  if (k < 0 || k > len) c.bad_data(fmt::format("K={} out of range for an axis of size {}", k, len));
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
// Tile, Pad, Range.

std::vector<Tensor> tile_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> reps = c.req(1).as_int64s();
  const size_t r = x.shape.size();
  if (reps.size() != r) c.fail(fmt::format("repeats has {} entries for rank {}", reps.size(), r));
  // View the output as [reps0, d0, reps1, d1, ...] and copy x with stride 0 over the repeat dims.
  Shape view, os;
  std::vector<int64_t> src_st;
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  for (size_t i = 0; i < r; ++i) {
    if (reps[i] < 0) c.fail("negative repeat");
    view.push_back(reps[i]);
    view.push_back(x.shape[i]);
    src_st.push_back(0);
    src_st.push_back(xs[i]);
    os.push_back(reps[i] * x.shape[i]);
  }
  Tensor out(x.dtype, os);
  const std::vector<int64_t> ds = contiguous_strides(view);
  strided_copy(out.bytes.data(), ds.data(), x.bytes.data(), src_st.data(), view, dtype_size(x.dtype));
  return one(std::move(out));
}

std::vector<Tensor> pad_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  const std::string mode = c.node.s("mode", "constant");
  std::vector<int64_t> pads = c.opset < 11 ? c.node.ints("pads") : c.req(1).as_int64s();
  std::vector<int64_t> axes;
  if (const Tensor* t = c.in(3)) {
    axes = t->as_int64s();
  } else {
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  }
  const PadDims pd = pad_dims(c, x.shape, pads, axes);
  const std::vector<int64_t>& lo = pd.lo;
  const Shape& os = pd.out;
  Tensor out(x.dtype, os);
  const size_t es = dtype_size(x.dtype);
  if (mode == "constant") {
    // Fill with the value, then copy the (possibly cropped) input into the interior.
    if (const Tensor* v = c.in(2); v && v->numel() > 0) {
      if (v->dtype != x.dtype) c.fail("constant_value has a different dtype");
      for (size_t i = 0; i < out.bytes.size(); i += es) std::memcpy(out.bytes.data() + i, v->bytes.data(), es);
    } else if (c.opset < 11 && c.node.has("value")) {
      const float f = c.node.f("value");
      dispatch_all(c, x.dtype, [&]<class T>() { std::fill_n(out.data<T>(), out.numel(), static_cast<T>(f)); });
    }
    Shape region(r);
    int64_t src_off = 0, dst_off = 0;
    const std::vector<int64_t> xs = contiguous_strides(x.shape), ds = contiguous_strides(os);
    for (int64_t d = 0; d < r; ++d) {
      const int64_t s0 = std::max<int64_t>(0, -lo[d]);
      const int64_t d0 = std::max<int64_t>(0, lo[d]);
      region[d] = std::max<int64_t>(0, std::min(x.shape[d] - s0, os[d] - d0));
      src_off += s0 * xs[d];
      dst_off += d0 * ds[d];
    }
    if (num_elements(region) > 0)
      strided_copy(out.bytes.data() + dst_off * static_cast<int64_t>(es), ds.data(),
                   x.bytes.data() + src_off * static_cast<int64_t>(es), xs.data(), region, es);
    return one(std::move(out));
  }
  if (mode != "reflect" && mode != "edge") c.unsupported(fmt::format("no kernel for mode '{}'", mode));
  // reflect / edge: per-dim source index tables, then a gather over all dims.
  std::vector<std::vector<int64_t>> src(r);
  for (int64_t d = 0; d < r; ++d) {
    const int64_t n = x.shape[d];
    if (n == 0 && os[d] > 0) c.fail("cannot pad an empty axis in reflect/edge mode");
    if (mode == "reflect" && n == 1) {
      src[d].assign(os[d], 0);
      continue;
    }
    for (int64_t o = 0; o < os[d]; ++o) {
      int64_t i = o - lo[d];
      if (mode == "edge") {
        i = std::clamp<int64_t>(i, 0, n - 1);
      } else {
        const int64_t period = 2 * (n - 1);
        i = ((i % period) + period) % period;
        if (i >= n) i = period - i;
      }
      src[d].push_back(i);
    }
  }
  if (out.numel() == 0) return one(std::move(out));
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  std::vector<int64_t> idx(r, 0);
  std::byte* dst = out.bytes.data();
  for (int64_t k = 0; k < out.numel(); ++k, dst += es) {
    int64_t off = 0;
    for (int64_t d = 0; d < r; ++d) off += src[d][idx[d]] * xs[d];
    std::memcpy(dst, x.bytes.data() + off * static_cast<int64_t>(es), es);
    for (int64_t d = r - 1; d >= 0; --d) {
      if (++idx[d] < os[d]) break;
      idx[d] = 0;
    }
  }
  return one(std::move(out));
}

std::vector<Tensor> range_kernel(const Ctx& c) {
  const Tensor& st = c.req(0);
  const Tensor& li = c.req(1);
  const Tensor& de = c.req(2);
  if (st.dtype != li.dtype || st.dtype != de.dtype) c.fail("start, limit and delta differ in dtype");
  if (st.numel() != 1 || li.numel() != 1 || de.numel() != 1) c.fail("start, limit and delta must be scalars");
  return one(dispatch_numeric(c, st.dtype, [&]<class T>() {
    const T s = st.data<T>()[0], l = li.data<T>()[0], d = de.data<T>()[0];
    if (d == T(0)) c.fail("delta is 0");
    const double cnt = std::ceil((static_cast<double>(l) - static_cast<double>(s)) / static_cast<double>(d));
    const int64_t n = cnt > 0 ? static_cast<int64_t>(cnt) : 0;
    Tensor out(st.dtype, {n});
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(s + static_cast<T>(i) * d);
    return out;
  }));
}

}  // namespace

void register_index(KernelTable& t) {
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
  t["Tile"] = tile_kernel;
  t["Pad"] = pad_kernel;
  t["Range"] = range_kernel;
}

}  // namespace gspmd::kern
