// Shape functions of ops_math.cc's kernels: MatMul, Gemm, Softmax, LogSoftmax, LayerNormalization, Reduce*, ArgMax,
// ArgMin.
#include <algorithm>

#include <fmt/format.h>

#include "backend/kernels/shape_util.h"

namespace gspmd::kern {

Shape matmul_shape(const ShapeCtx& c, const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) c.fail("inputs must have rank >= 1");
  Shape as = a, bs = b;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  if (bs[bs.size() - 2] != as.back())
    c.fail(fmt::format("shapes {} and {} are not aligned for matmul", shape_str(a), shape_str(b)));
  Shape out = c.broadcast(Shape(as.begin(), as.end() - 2), Shape(bs.begin(), bs.end() - 2));
  if (a.size() > 1) out.push_back(as[as.size() - 2]);
  if (b.size() > 1) out.push_back(bs.back());
  return out;
}

namespace {

// Fails unless inputs i and j have the same dtype.
void same_dtype(const ShapeCtx& c, size_t i, size_t j) {
  if (c.dtype(i) != c.dtype(j))
    c.fail(fmt::format("input dtypes differ ({} vs {})", dtype_name(c.dtype(i)), dtype_name(c.dtype(j))));
}

std::vector<TensorType> matmul_types(const ShapeCtx& c) {
  same_dtype(c, 0, 1);
  return one_type(c.dtype(0), matmul_shape(c, c.shape(0), c.shape(1)));
}

std::vector<TensorType> gemm_types(const ShapeCtx& c) {
  same_dtype(c, 0, 1);
  if (c.has(2)) same_dtype(c, 0, 2);
  const Shape &a = c.shape(0), &b = c.shape(1);
  if (a.size() != 2 || b.size() != 2) c.fail("A and B must be 2-D");
  const bool ta = c.node.i("transA", 0) != 0, tb = c.node.i("transB", 0) != 0;
  if ((ta ? a[0] : a[1]) != (tb ? b[1] : b[0]))
    c.fail(fmt::format("shapes {} and {} are not aligned (transA={}, transB={})", shape_str(a), shape_str(b), ta, tb));
  const Shape os{ta ? a[1] : a[0], tb ? b[0] : b[1]};
  if (c.has(2) && c.node.f("beta", 1.f) != 0.f && c.broadcast(c.shape(2), os) != os)
    c.fail(fmt::format("C of shape {} does not broadcast to {}", shape_str(c.shape(2)), shape_str(os)));
  return one_type(c.dtype(0), os);
}

std::vector<TensorType> softmax_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  if (c.opset < 13) {  // coerced to 2-D at `axis`, which may equal the rank
    const int64_t a = c.node.i("axis", 1);
    if (a < -r || a > r) c.fail(fmt::format("axis {} out of range for rank {}", a, r));
  } else if (r > 0) {
    c.axis(c.node.i("axis", -1), r);
  }
  return {c.type(0)};
}

std::vector<TensorType> layer_norm_types(const ShapeCtx& c) {
  const TensorType& x = c.type(0);
  const int64_t r = c.rank(0);
  if (r == 0) c.fail("input must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", -1), r);
  const Shape norm_shape(x.shape.begin() + ax, x.shape.end());
  for (size_t i : {1, 2}) {
    if (!c.has(i)) continue;
    const TensorType& t = c.type(i);
    if (t.dtype != x.dtype)
      c.fail(fmt::format("input {} has dtype {}, X has {}", i, dtype_name(t.dtype), dtype_name(x.dtype)));
    if (num_elements(t.shape) != num_elements(norm_shape) &&
        (t.shape.size() > norm_shape.size() || c.broadcast(t.shape, norm_shape) != norm_shape))
      c.fail(fmt::format("input {} of shape {} does not broadcast to {}", i, shape_str(t.shape),
                         shape_str(norm_shape)));
  }
  Shape stat_shape(x.shape.begin(), x.shape.begin() + ax);
  stat_shape.resize(static_cast<size_t>(r), 1);
  std::vector<TensorType> out{x};  // Y, then Mean and InvStdDev in X's dtype (as the kernel computes them)
  for (size_t i = 1; i < std::min<size_t>(c.n_out(), 3); ++i) out.push_back({x.dtype, stat_shape});
  return out;
}

// `x` reduced over `axes` (every dim when empty): unit dims kept when `keep`, dropped otherwise.
Shape reduced(const ShapeCtx& c, const Shape& x, const std::vector<int64_t>& axes, bool keep) {
  const int64_t r = static_cast<int64_t>(x.size());
  std::vector<char> red(x.size(), axes.empty() ? 1 : 0);
  for (int64_t a : axes) red[static_cast<size_t>(c.axis(a, r))] = 1;
  Shape out;
  for (size_t i = 0; i < x.size(); ++i)
    if (!red[i]) out.push_back(x[i]);
    else if (keep) out.push_back(1);
  return out;
}

// Reduce*: axes from input 1 (its values needed unless it is empty) or from the attribute.
std::vector<TensorType> reduce_types(const ShapeCtx& c) {
  std::vector<int64_t> axes;
  if (c.has(1) && num_elements(c.shape(1)) != 0)
    axes = c.needs_value(1, "axes").as_int64s();
  else if (!c.has(1))
    axes = c.node.ints("axes");
  if (axes.empty() && c.node.i("noop_with_empty_axes", 0) != 0) return {c.type(0)};
  return one_type(c.dtype(0), reduced(c, c.shape(0), axes, c.node.i("keepdims", 1) != 0));
}

std::vector<TensorType> arg_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  if (r == 0) c.fail("input must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", 0), r);
  if (c.shape(0)[static_cast<size_t>(ax)] == 0) c.fail("cannot take ArgMax/ArgMin over an empty axis");
  return one_type(DType::kInt64, reduced(c, c.shape(0), {ax}, c.node.i("keepdims", 1) != 0));
}

}  // namespace

void register_math_shapes(ShapeTable& t) {
  t["MatMul"] = matmul_types;
  t["Gemm"] = gemm_types;
  t["Softmax"] = t["LogSoftmax"] = softmax_types;
  t["LayerNormalization"] = layer_norm_types;
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"})
    t[op] = reduce_types;
  t["ArgMax"] = t["ArgMin"] = arg_types;
}

}  // namespace gspmd::kern
