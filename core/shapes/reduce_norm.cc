// Shape functions of the reduce/normalize family's kernels (ops_reduce_norm.cc; rules in core/rules/reduce_norm.cc):
// Softmax, LogSoftmax, Hardmax, LayerNormalization, Reduce*, ArgMax, ArgMin. Reference: the ONNX operator specs
// (onnx/docs/Operators.md) at the node's opset.
#include <algorithm>

#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

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

// Hardmax: same type; axis in [-r, r] before opset 13 (coerced to 2-D), a real axis from 13.
std::vector<TensorType> hardmax_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  if (c.opset < 13) {
    const int64_t a = c.node.i("axis", 1);
    if (a < -r || a > r) c.fail(fmt::format("axis {} out of range for rank {}", a, r));
  } else {
    if (r == 0) c.fail("input must have rank >= 1");
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
      c.fail(
          fmt::format("input {} of shape {} does not broadcast to {}", i, shape_str(t.shape), shape_str(norm_shape)));
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
    if (!red[i])
      out.push_back(x[i]);
    else if (keep)
      out.push_back(1);
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

void register_reduce_norm_shapes(ShapeTable& t) {
  t["Softmax"] = t["LogSoftmax"] = softmax_types;
  t["Hardmax"] = hardmax_types;
  t["LayerNormalization"] = layer_norm_types;
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"})
    t[op] = reduce_types;
  t["ArgMax"] = t["ArgMin"] = arg_types;
}

}  // namespace gspmd::shapes
