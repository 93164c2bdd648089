// The shape-ops family (core/rules/shape_ops.cc): data-movement and shape kernels, dtype-agnostic (they move elements
// by size): Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Concat, Slice, Split, Expand, Constant, ConstantOfShape,
// Shape, Size. Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset. Plain C++, except
// Transpose of 1-, 2- and 4-byte elements (a oneDNN reorder).
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"
#include "core/shapes/geometry_data.h"

namespace gspmd::kern {
namespace {

// Shape rules shared with the shape functions (core/shapes/geometry_data.h).
using shapes::concat_shape;
using shapes::flatten_shape;
using shapes::reshape_target;
using shapes::slice_dims;
using shapes::SliceDims;
using shapes::split_sizes;
using shapes::squeeze_shape;
using shapes::unsqueeze_shape;

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
  if (x.numel() > 0 &&
      dnn::transpose(x.bytes.data(), out.bytes.data(), x.shape, p, static_cast<int>(dtype_size(x.dtype))))
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

std::vector<Tensor> expand_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> s = c.req(1).as_int64s();
  return one(broadcast_to(x, broadcast_shapes(c, x.shape, Shape(s.begin(), s.end()))));
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

}  // namespace

void register_shape_ops(KernelTable& t) {
  t["Transpose"] = transpose_kernel;
  t["Reshape"] = reshape_kernel;
  t["Flatten"] = flatten_kernel;
  t["Squeeze"] = squeeze_kernel;
  t["Unsqueeze"] = unsqueeze_kernel;
  t["Concat"] = concat_kernel;
  t["Slice"] = slice_kernel;
  t["Split"] = split_kernel;
  t["Expand"] = expand_kernel;
  t["Constant"] = constant_kernel;
  t["Shape"] = shape_kernel;
  t["Size"] = size_kernel;
  t["ConstantOfShape"] = constant_of_shape_kernel;
}

}  // namespace gspmd::kern
