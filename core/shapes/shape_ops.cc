// Shape functions of the shape-ops family's kernels (ops_shape_ops.cc; rules in core/rules/shape_ops.cc): Transpose,
// Reshape, Flatten, Squeeze, Unsqueeze, Concat, Slice, Split, Expand, Constant, ConstantOfShape, Shape, Size.
// Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/shapes/geometry_data.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// Input i's values as integers when present (needs_value: a shape operand), else attribute `attr` (empty if absent).
std::vector<int64_t> ints_input_or_attr(const ShapeCtx& c, size_t i, const char* attr, std::string_view what) {
  if (c.has(i)) return c.needs_value(i, what).as_int64s();
  return c.node.ints(attr);
}

std::vector<TensorType> transpose_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  std::vector<int64_t> perm = c.node.ints("perm");
  if (perm.empty())
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != r) c.fail(fmt::format("perm has {} entries for rank {}", perm.size(), r));
  std::vector<char> seen(r, 0);
  Shape os;
  for (int64_t p : perm) {
    const int64_t a = c.axis(p, r);
    if (seen[a]++) c.fail(fmt::format("perm [{}] is not a permutation", fmt::join(perm, ",")));
    os.push_back(c.shape(0)[a]);
  }
  return one_type(c.dtype(0), std::move(os));
}

std::vector<TensorType> reshape_types(const ShapeCtx& c) {
  const std::vector<int64_t> spec = c.needs_value(1, "the target shape").as_int64s();
  return one_type(c.dtype(0), reshape_target(c, c.shape(0), spec, c.node.i("allowzero", 0) != 0));
}

std::vector<TensorType> flatten_types(const ShapeCtx& c) { return one_type(c.dtype(0), flatten_shape(c, c.shape(0))); }

std::vector<TensorType> squeeze_types(const ShapeCtx& c) {
  return one_type(c.dtype(0), squeeze_shape(c, c.shape(0), ints_input_or_attr(c, 1, "axes", "the axes")));
}

std::vector<TensorType> unsqueeze_types(const ShapeCtx& c) {
  return one_type(c.dtype(0), unsqueeze_shape(c, c.shape(0), ints_input_or_attr(c, 1, "axes", "the axes")));
}

std::vector<TensorType> concat_types(const ShapeCtx& c) {
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < c.n_in(); ++i) {
    if (c.dtype(i) != c.dtype(0)) c.fail("inputs have different dtypes");
    shapes.push_back(&c.shape(i));
  }
  Shape os = concat_shape(c, shapes).first;
  return one_type(c.dtype(0), std::move(os));
}

std::vector<TensorType> slice_types(const ShapeCtx& c) {
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset < 10 && c.node.has("starts")) {
    starts = c.node.ints("starts");
    ends = c.node.ints("ends");
    axes = c.node.ints("axes");
  } else {
    starts = c.needs_value(1, "the starts").as_int64s();
    ends = c.needs_value(2, "the ends").as_int64s();
    if (c.has(3)) axes = c.needs_value(3, "the axes").as_int64s();
    if (c.has(4)) steps = c.needs_value(4, "the steps").as_int64s();
  }
  return one_type(c.dtype(0), slice_dims(c, c.shape(0), starts, ends, axes, steps).out);
}

std::vector<TensorType> split_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  const int64_t ax = c.axis(c.node.i("axis", 0), c.rank(0));
  std::vector<TensorType> out;
  for (int64_t s : split_sizes(c, x[ax], ints_input_or_attr(c, 1, "split", "the split sizes"))) {
    out.push_back({c.dtype(0), x});
    out.back().shape[ax] = s;
  }
  return out;
}

std::vector<TensorType> expand_types(const ShapeCtx& c) {
  const std::vector<int64_t> s = c.needs_value(1, "the target shape").as_int64s();
  return one_type(c.dtype(0), c.broadcast(c.shape(0), Shape(s.begin(), s.end())));
}

std::vector<TensorType> constant_types(const ShapeCtx& c) {
  const Node& n = c.node;
  if (const Tensor* t = n.t("value")) return one_type(t->dtype, t->shape);
  if (n.has("value_float")) return one_type(DType::kFloat32, {});
  if (n.has("value_floats")) return one_type(DType::kFloat32, {static_cast<int64_t>(n.floats("value_floats").size())});
  if (n.has("value_int")) return one_type(DType::kInt64, {});
  if (n.has("value_ints")) return one_type(DType::kInt64, {static_cast<int64_t>(n.ints("value_ints").size())});
  throw UnsupportedError(c.prefix() + "no kernel for this Constant (needs value, value_float(s) or value_int(s))");
}

// Shape (opset 15: start / end, clamped): int64 [end - start].
std::vector<TensorType> shape_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  int64_t s = c.node.i("start", 0), e = c.node.i("end", r);
  s = std::clamp<int64_t>(s < 0 ? s + r : s, 0, r);
  e = std::clamp<int64_t>(e < 0 ? e + r : e, 0, r);
  return one_type(DType::kInt64, {std::max<int64_t>(0, e - s)});
}

std::vector<TensorType> size_types(const ShapeCtx& c) {
  c.type(0);  // required
  return one_type(DType::kInt64, {});
}

std::vector<TensorType> constant_of_shape_types(const ShapeCtx& c) {
  const std::vector<int64_t> s = c.needs_value(0, "the output shape").as_int64s();
  for (int64_t d : s)
    if (d < 0) c.fail("negative dim");
  const Tensor* v = c.node.t("value");
  if (v && v->numel() != 1) c.fail("value must have one element");
  return one_type(v ? v->dtype : DType::kFloat32, Shape(s.begin(), s.end()));
}

}  // namespace

void register_shape_ops_shapes(ShapeTable& t) {
  t["Transpose"] = transpose_types;
  t["Reshape"] = reshape_types;
  t["Flatten"] = flatten_types;
  t["Squeeze"] = squeeze_types;
  t["Unsqueeze"] = unsqueeze_types;
  t["Concat"] = concat_types;
  t["Slice"] = slice_types;
  t["Split"] = split_types;
  t["Expand"] = expand_types;
  t["Constant"] = constant_types;
  t["Shape"] = shape_types;
  t["Size"] = size_types;
  t["ConstantOfShape"] = constant_of_shape_types;
}

}  // namespace gspmd::shapes
