// Data-movement and shape kernels (dtype-agnostic: they move elements by size): Transpose, Reshape, Flatten,
// Squeeze, Unsqueeze, Concat, Slice, Split, Gather, Expand, Tile, Pad, Identity, Dropout, Constant, Shape, Size,
// ConstantOfShape, Range.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"
#include "backend/kernels/shape_rules_data.h"

namespace gspmd::kern {
namespace {

/// Same bytes, new shape: input 0's buffer is moved when it was donated (no copy), copied otherwise.
Tensor reshaped(const Ctx& c, Shape s) {
  Tensor r = c.take(0);
  r.shape = std::move(s);
  return r;
}

/// Integer list from an optional input, else from an attribute; `present` tells whether either existed.
std::vector<int64_t> ints_from(const Ctx& c, size_t input, const char* attr, bool* present = nullptr) {
  if (const Tensor* t = c.in(input)) {
    if (present) *present = true;
    return t->as_int64s();
  }
  if (present) *present = c.node.has(attr);
  return c.node.ints(attr);
}

std::vector<Tensor> identity_kernel(const Ctx& c) { return one(c.take(0)); }

std::vector<Tensor> dropout_kernel(const Ctx& c) {
  // Inference semantics only: identity. Training mode with a non-zero ratio would need a random mask.
  if (const Tensor* tm = c.in(2); tm && tm->numel() > 0 && tm->as_int64s()[0] != 0) {
    double ratio = 0.5;
    if (const Tensor* r = c.in(1); r && r->numel() > 0) {
      if (r->dtype == DType::kFloat32) ratio = r->data<float>()[0];
      if (r->dtype == DType::kFloat64) ratio = r->data<double>()[0];
    }
    if (ratio != 0.0) c.unsupported("no kernel for training_mode=true (random dropout)");
  }
  std::vector<Tensor> out;
  out.push_back(c.req(0));
  if (c.n_out() > 1) {
    Tensor mask(DType::kBool, c.req(0).shape);
    std::fill(mask.bytes.begin(), mask.bytes.end(), std::byte{1});
    out.push_back(std::move(mask));
  }
  return out;
}

std::vector<Tensor> transpose_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> perm = c.node.ints("perm");
  if (perm.empty())
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != r) c.fail(fmt::format("perm has {} entries for rank {}", perm.size(), r));
  std::vector<char> seen(r, 0);
  Shape os(r);
  std::vector<int64_t> src_st(r);
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  for (int64_t i = 0; i < r; ++i) {
    const int64_t p = c.axis(perm[i], r);
    if (seen[p]++) c.fail(fmt::format("perm [{}] is not a permutation", fmt::join(perm, ",")));
    os[i] = x.shape[p];
    src_st[i] = xs[p];
  }
  Tensor out(x.dtype, os);
  std::vector<int64_t> p(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) p[static_cast<size_t>(i)] = c.axis(perm[i], r);
  // oneDNN's reorder for 1-, 2- and 4-byte elements of non-empty tensors; a strided copy otherwise (8-byte types)
  if (x.numel() > 0 && dnn::transpose(x.bytes.data(), out.bytes.data(), x.shape, p, static_cast<int>(dtype_size(x.dtype))))
    return one(std::move(out));
  const std::vector<int64_t> ds = contiguous_strides(os);
  strided_copy(out.bytes.data(), ds.data(), x.bytes.data(), src_st.data(), os, dtype_size(x.dtype));
  return one(std::move(out));
}

std::vector<Tensor> reshape_kernel(const Ctx& c) {
  return one(reshaped(c, reshape_target(c, c.req(0).shape, c.req(1).as_int64s(), c.node.i("allowzero", 0) != 0)));
}

std::vector<Tensor> flatten_kernel(const Ctx& c) { return one(reshaped(c, flatten_shape(c, c.req(0).shape))); }

std::vector<Tensor> squeeze_kernel(const Ctx& c) {
  return one(reshaped(c, squeeze_shape(c, c.req(0).shape, ints_from(c, 1, "axes"))));
}

std::vector<Tensor> unsqueeze_kernel(const Ctx& c) {
  return one(reshaped(c, unsqueeze_shape(c, c.req(0).shape, ints_from(c, 1, "axes"))));
}

std::vector<Tensor> concat_kernel(const Ctx& c) {
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < c.ins.size(); ++i) {
    if (c.req(i).dtype != c.req(0).dtype) c.fail("inputs have different dtypes");
    shapes.push_back(&c.req(i).shape);
  }
  const auto [os, ax] = concat_shape(c, shapes);
  const Tensor& first = c.req(0);
  const int64_t r = static_cast<int64_t>(os.size());
  Tensor out(first.dtype, os);
  int64_t outer = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= os[d];
  const size_t es = dtype_size(first.dtype);
  size_t inner_bytes = es;
  for (int64_t d = ax + 1; d < r; ++d) inner_bytes *= static_cast<size_t>(os[d]);
  const size_t out_row = inner_bytes * static_cast<size_t>(os[ax]);
  size_t col = 0;
  for (size_t i = 0; i < c.ins.size(); ++i) {
    const Tensor& t = c.req(i);
    const size_t row = inner_bytes * static_cast<size_t>(t.shape[ax]);
    if (row == 0) continue;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(out.bytes.data() + o * out_row + col, t.bytes.data() + o * row, row);
    col += row;
  }
  return one(std::move(out));
}

std::vector<Tensor> slice_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset < 10 && c.node.has("starts")) {
    starts = c.node.ints("starts");
    ends = c.node.ints("ends");
    axes = c.node.ints("axes");
  } else {
    starts = c.req(1).as_int64s();
    ends = c.req(2).as_int64s();
    if (const Tensor* t = c.in(3)) axes = t->as_int64s();
    if (const Tensor* t = c.in(4)) steps = t->as_int64s();
  }
  const SliceDims sd = slice_dims(c, x.shape, starts, ends, axes, steps);
  const Shape& os = sd.out;
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  std::vector<int64_t> src_st(r);
  int64_t base = 0;
  for (int64_t d = 0; d < r; ++d) {
    base += sd.start[d] * xs[d];
    src_st[d] = xs[d] * sd.step[d];
  }
  Tensor out(x.dtype, os);
  if (out.numel() == 0) return one(std::move(out));
  const size_t es = dtype_size(x.dtype);
  const std::vector<int64_t> ds = contiguous_strides(os);
  strided_copy(out.bytes.data(), ds.data(), x.bytes.data() + base * static_cast<int64_t>(es), src_st.data(), os, es);
  return one(std::move(out));
}

std::vector<Tensor> split_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  const int64_t ax = c.axis(c.node.i("axis", 0), r);
  const int64_t dim = x.shape[ax];
  const std::vector<int64_t> sizes = split_sizes(c, dim, ints_from(c, 1, "split"));
  int64_t outer = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= x.shape[d];
  const size_t es = dtype_size(x.dtype);
  size_t inner_bytes = es;
  for (int64_t d = ax + 1; d < r; ++d) inner_bytes *= static_cast<size_t>(x.shape[d]);
  const size_t in_row = inner_bytes * static_cast<size_t>(dim);
  std::vector<Tensor> outs;
  size_t col = 0;
  for (int64_t s : sizes) {
    Shape os = x.shape;
    os[ax] = s;
    Tensor o(x.dtype, os);
    const size_t row = inner_bytes * static_cast<size_t>(s);
    if (row > 0)
      for (int64_t i = 0; i < outer; ++i) std::memcpy(o.bytes.data() + i * row, x.bytes.data() + i * in_row + col, row);
    col += row;
    outs.push_back(std::move(o));
  }
  return outs;
}

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
    if (k < 0 || k >= dim) c.fail(fmt::format("index {} out of range for axis {} of size {}", ids[i], ax, dim));
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

std::vector<Tensor> expand_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> s = c.req(1).as_int64s();
  return one(broadcast_to(x, broadcast_shapes(c, x.shape, Shape(s.begin(), s.end()))));
}

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

std::vector<Tensor> constant_kernel(const Ctx& c) {
  const Node& n = c.node;
  if (const Tensor* t = n.t("value")) return one(*t);
  if (n.has("value_float")) return one(Tensor::from_floats({}, {n.f("value_float")}));
  if (n.has("value_floats")) {
    const std::vector<float> v = n.floats("value_floats");
    return one(Tensor::from_floats({static_cast<int64_t>(v.size())}, v));
  }
  if (n.has("value_int")) {
    Tensor t(DType::kInt64, {});
    t.data<int64_t>()[0] = n.i("value_int");
    return one(std::move(t));
  }
  if (n.has("value_ints")) return one(Tensor::from_int64s(n.ints("value_ints")));
  c.unsupported("no kernel for this Constant (needs value, value_float(s) or value_int(s))");
}

std::vector<Tensor> shape_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  int64_t s = c.node.i("start", 0), e = c.node.i("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  std::vector<int64_t> v;
  for (int64_t i = s; i < e; ++i) v.push_back(x.shape[i]);
  return one(Tensor::from_int64s(v));
}

std::vector<Tensor> size_kernel(const Ctx& c) {
  Tensor t(DType::kInt64, {});
  t.data<int64_t>()[0] = c.req(0).numel();
  return one(std::move(t));
}

std::vector<Tensor> constant_of_shape_kernel(const Ctx& c) {
  const std::vector<int64_t> s = c.req(0).as_int64s();
  for (int64_t d : s)
    if (d < 0) c.fail("negative dim");
  const Tensor* v = c.node.t("value");
  Tensor out(v ? v->dtype : DType::kFloat32, Shape(s.begin(), s.end()));
  if (v) {
    if (v->numel() != 1) c.fail("value must have one element");
    const size_t es = dtype_size(v->dtype);
    for (size_t i = 0; i < out.bytes.size(); i += es) std::memcpy(out.bytes.data() + i, v->bytes.data(), es);
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

void register_shape_ops(KernelTable& t) {
  t["Identity"] = identity_kernel;
  t["Dropout"] = dropout_kernel;
  t["Transpose"] = transpose_kernel;
  t["Reshape"] = reshape_kernel;
  t["Flatten"] = flatten_kernel;
  t["Squeeze"] = squeeze_kernel;
  t["Unsqueeze"] = unsqueeze_kernel;
  t["Concat"] = concat_kernel;
  t["Slice"] = slice_kernel;
  t["Split"] = split_kernel;
  t["Gather"] = gather_kernel;
  t["Expand"] = expand_kernel;
  t["Tile"] = tile_kernel;
  t["Pad"] = pad_kernel;
  t["Constant"] = constant_kernel;
  t["Shape"] = shape_kernel;
  t["Size"] = size_kernel;
  t["ConstantOfShape"] = constant_of_shape_kernel;
  t["Range"] = range_kernel;
}

}  // namespace gspmd::kern
