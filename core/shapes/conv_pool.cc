// Shape functions of the conv/pool family's kernels (ops_conv_pool.cc, ops_conv_pool_norm.cc; rules in
// core/rules/conv_pool.cc): Conv, ConvInteger, QLinearConv, ConvTranspose, the pools, BatchNormalization,
// InstanceNormalization, LRN, MeanVarianceNormalization, DepthToSpace, SpaceToDepth. Window sizes come from
// geometry.h, which the kernels use too. Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's
// opset.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/shapes/geometry.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// X's spatial dims [2, rank); fails below rank 3.
std::vector<int64_t> spatial(const ShapeCtx& c, const Shape& x) {
  if (x.size() < 3) c.fail(fmt::format("X must have rank >= 3 (N, C, spatial...), got {}", shape_str(x)));
  return std::vector<int64_t>(x.begin() + 2, x.end());
}

// [n, ch, sp...].
Shape nc_shape(int64_t n, int64_t ch, const std::vector<int64_t>& sp) {
  Shape s{n, ch};
  s.insert(s.end(), sp.begin(), sp.end());
  return s;
}

// Fails unless the present inputs `ins` have input 0's dtype.
void same_dtypes(const ShapeCtx& c, std::initializer_list<size_t> ins) {
  for (size_t i : ins)
    if (c.has(i) && c.dtype(i) != c.dtype(0)) c.fail("input dtypes differ");
}

// Y's shape of a Conv (transpose: ConvTranspose) of X [N, C, ...] with W, B of `b_elems` elements (-1: no B).
Shape conv_shape(const ShapeCtx& c, const Shape& x, const Shape& w, int64_t b_elems, bool transpose) {
  const std::vector<int64_t> in = spatial(c, x);
  if (w.size() != x.size())
    c.fail(fmt::format("W of shape {} does not match X of shape {}", shape_str(w), shape_str(x)));
  const int64_t C = x[1], G = c.node.i("group", 1);
  const int64_t M = transpose ? (G > 0 ? w[1] * G : 0) : w[0];
  const bool ok = G > 0 && C % G == 0 && (transpose ? w[0] == C : M % G == 0 && w[1] * G == C);
  if (!ok) c.fail(fmt::format("X of shape {} and W of shape {} do not match group={}", shape_str(x), shape_str(w), G));
  if (b_elems >= 0 && b_elems != M) c.fail(fmt::format("B has {} elements, expected {}", b_elems, M));
  const std::vector<int64_t> k(w.begin() + 2, w.end());
  if (transpose) return nc_shape(x[0], M, make_deconv_window(c, in, k).out);
  if (c.node.has("kernel_shape") && c.node.ints("kernel_shape") != k)
    c.fail(fmt::format("kernel_shape [{}] does not match W of shape {}", fmt::join(c.node.ints("kernel_shape"), ","),
                       shape_str(w)));
  return nc_shape(x[0], M, make_window(c, in, k, false).out);
}

// Number of elements of input i, -1 when absent.
int64_t elems(const ShapeCtx& c, size_t i) { return c.has(i) ? num_elements(c.shape(i)) : -1; }

template <bool transpose>
std::vector<TensorType> conv_types(const ShapeCtx& c) {
  same_dtypes(c, {1, 2});
  return one_type(c.dtype(0), conv_shape(c, c.shape(0), c.shape(1), elems(c, 2), transpose));
}

// Fails unless w_zero_point (`n` elements, -1: absent) is a scalar or has one entry per output channel of `y`.
void check_per_channel(const ShapeCtx& c, int64_t n, const Shape& y, const char* what) {
  if (n >= 0 && n != 1 && n != y[1])
    c.fail(fmt::format("{} must be a scalar or have one entry per output channel", what));
}

std::vector<TensorType> conv_integer_types(const ShapeCtx& c) {
  const Shape y = conv_shape(c, c.shape(0), c.shape(1), -1, false);
  check_per_channel(c, elems(c, 3), y, "w_zero_point");
  return one_type(DType::kInt32, y);
}

// QLinearConv: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B.
std::vector<TensorType> qlinear_conv_types(const ShapeCtx& c) {
  const Shape y = conv_shape(c, c.shape(0), c.shape(3), -1, false);
  check_per_channel(c, elems(c, 5), y, "w_zero_point");
  if (c.has(8) && (c.dtype(8) != DType::kInt32 || elems(c, 8) != y[1]))
    c.fail("B must be int32 with one entry per output channel");
  check_per_channel(c, elems(c, 4), y, "w_scale");
  return one_type(c.dtype(7), y);
}

enum class Pool { kMax, kAvg, kLp };

template <Pool op>
std::vector<TensorType> pool_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  const std::vector<int64_t> in = spatial(c, x);
  const std::vector<int64_t> k = c.node.ints("kernel_shape");
  if (k.empty()) c.fail("missing attribute 'kernel_shape'");
  const Window w = make_window(c, in, k, c.node.i("ceil_mode", 0) != 0, op != Pool::kLp || c.opset >= 18);
  std::vector<TensorType> out = one_type(c.dtype(0), nc_shape(x[0], x[1], w.out));
  if (op == Pool::kMax && c.n_out() > 1) out.push_back({DType::kInt64, out[0].shape});  // Indices
  return out;
}

std::vector<TensorType> global_pool_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  return one_type(c.dtype(0), nc_shape(x[0], x[1], std::vector<int64_t>(spatial(c, x).size(), 1)));
}

// Fails below rank `r` (the normalizations' "X must have rank >= r").
void min_rank(const ShapeCtx& c, int64_t r) {
  if (c.rank(0) < r) c.fail(fmt::format("X must have rank >= {}, got {}", r, shape_str(c.shape(0))));
}

// Per-channel parameters [first, last] of X [N, C, ...]: X's dtype and C elements (or C * inner when inner > 1).
void check_params(const ShapeCtx& c, size_t first, size_t last, int64_t inner) {
  const int64_t C = c.shape(0)[1];
  for (size_t i = first; i <= last; ++i) {
    if (c.dtype(i) != c.dtype(0))
      c.fail(fmt::format("input {} has dtype {}, X has {}", i, dtype_name(c.dtype(i)), dtype_name(c.dtype(0))));
    const int64_t n = num_elements(c.shape(i));
    if (n != C && !(n == C * inner && inner > 1))
      c.fail(fmt::format("input {} of shape {} does not match {} channels", i, shape_str(c.shape(i)), C));
  }
}

// BatchNormalization: Y; in training mode (opset >= 14: running mean and variance; before: also the saved ones)
// [C] statistics.
std::vector<TensorType> batch_norm_types(const ShapeCtx& c) {
  min_rank(c, 2);
  const Shape& x = c.shape(0);
  const bool training = c.node.i("training_mode", 0) != 0 || c.n_out() > 1;
  if (!training) {
    const int64_t nc = x[0] * x[1];
    check_params(c, 1, 4, nc == 0 ? 0 : num_elements(x) / nc);
    return {c.type(0)};
  }
  if (c.opset >= 14) {
    for (size_t i = 1; i <= 4; ++i)
      if (c.dtype(i) != c.dtype(0) || num_elements(c.shape(i)) != x[1])
        c.fail(fmt::format("input {} of shape {} does not match {} channels", i, shape_str(c.shape(i)), x[1]));
  }
  std::vector<TensorType> out{c.type(0)};
  for (size_t i = 1; i < std::min<size_t>(c.n_out(), c.opset >= 14 ? 3 : 5); ++i) out.push_back({c.dtype(0), {x[1]}});
  return out;
}

std::vector<TensorType> instance_norm_types(const ShapeCtx& c) {
  min_rank(c, 3);
  check_params(c, 1, 2, 1);
  return {c.type(0)};
}

std::vector<TensorType> lrn_types(const ShapeCtx& c) {
  min_rank(c, 2);
  if (!c.node.has("size")) c.fail("missing attribute 'size'");
  return {c.type(0)};
}

std::vector<TensorType> mvn_types(const ShapeCtx& c) {
  for (int64_t a : c.node.ints("axes", {0, 2, 3})) c.axis(a, c.rank(0));
  return {c.type(0)};
}

// DepthToSpace [N, C, H, W] -> [N, C / b^2, H * b, W * b]; SpaceToDepth the reverse.
std::vector<TensorType> depth_space_types(const ShapeCtx& c) {
  if (c.rank(0) != 4) c.fail("input must be 4-D");
  const int64_t b = c.node.i("blocksize", 0);
  const Shape& x = c.shape(0);
  if (c.node.op_type == "DepthToSpace") {
    if (b <= 0 || x[1] % (b * b) != 0) c.fail(fmt::format("channels {} not divisible by blocksize^2 ({})", x[1], b));
    return one_type(c.dtype(0), {x[0], x[1] / (b * b), x[2] * b, x[3] * b});
  }
  if (b <= 0 || x[2] % b != 0 || x[3] % b != 0) c.fail(fmt::format("spatial dims not divisible by blocksize {}", b));
  return one_type(c.dtype(0), {x[0], x[1] * b * b, x[2] / b, x[3] / b});
}

}  // namespace

void register_conv_pool_shapes(ShapeTable& t) {
  t["Conv"] = conv_types<false>;
  t["ConvTranspose"] = conv_types<true>;
  t["ConvInteger"] = conv_integer_types;
  t["QLinearConv"] = qlinear_conv_types;
  t["MaxPool"] = pool_types<Pool::kMax>;
  t["AveragePool"] = pool_types<Pool::kAvg>;
  t["LpPool"] = pool_types<Pool::kLp>;
  t["GlobalMaxPool"] = t["GlobalAveragePool"] = t["GlobalLpPool"] = global_pool_types;
  t["BatchNormalization"] = batch_norm_types;
  t["InstanceNormalization"] = instance_norm_types;
  t["LRN"] = lrn_types;
  t["MeanVarianceNormalization"] = mvn_types;
  t["DepthToSpace"] = t["SpaceToDepth"] = depth_space_types;
}

}  // namespace gspmd::shapes
