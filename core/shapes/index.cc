// Shape functions of the index family's kernels (ops_index.cc, ops_index_resize.cc; rules in core/rules/index_ops.cc):
// GatherElements, GatherND, ScatterElements (and legacy Scatter), ScatterND, OneHot, NonZero, Compress, TopK, CumSum,
// Tile, Pad, Range, Resize (opset 10-17), Upsample (opset 7-9). Reference: the ONNX operator specs
// (onnx/docs/Operators.md) at the node's opset.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/shapes/geometry_data.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// Fails unless input i (indices) is int32 or int64.
void check_indices(const ShapeCtx& c, size_t i) {
  if (c.dtype(i) != DType::kInt64 && c.dtype(i) != DType::kInt32)
    c.fail(fmt::format("indices must be int32 or int64, got {}", dtype_name(c.dtype(i))));
}

std::vector<TensorType> gather_elements_types(const ShapeCtx& c) {
  if (c.rank(0) == 0 || c.rank(1) != c.rank(0)) c.fail("data and indices must have the same rank >= 1");
  c.axis(c.node.i("axis", 0), c.rank(0));
  check_indices(c, 1);
  return one_type(c.dtype(0), c.shape(1));
}

// Fails unless attribute reduction names a reduction the scatter kernels know.
void check_reduction(const ShapeCtx& c) {
  const std::string r = c.node.s("reduction", "none");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min")
    c.fail(fmt::format("unknown reduction '{}'", r));
}

// ScatterElements / Scatter: data's type; updates match indices.
std::vector<TensorType> scatter_elements_types(const ShapeCtx& c) {
  if (c.rank(0) == 0 || c.rank(1) != c.rank(0)) c.fail("data and indices must have the same rank >= 1");
  if (c.shape(2) != c.shape(1) || c.dtype(2) != c.dtype(0))
    c.fail("updates must match indices in shape and data in dtype");
  c.axis(c.node.i("axis", 0), c.rank(0));
  check_reduction(c);
  check_indices(c, 1);
  return {c.type(0)};
}

std::vector<TensorType> gather_nd_types(const ShapeCtx& c) {
  const Shape os = gather_nd_shape(c, c.shape(0), c.shape(1), c.node.i("batch_dims", 0));
  check_indices(c, 1);
  return one_type(c.dtype(0), os);
}

// ScatterND: data's type; updates are indices.shape[:-1] + data.shape[indices.shape[-1]:].
std::vector<TensorType> scatter_nd_types(const ShapeCtx& c) {
  const Shape &x = c.shape(0), &it = c.shape(1);
  if (x.empty() || it.empty()) c.fail("data and indices must have rank >= 1");
  const int64_t last = it.back();
  if (last < 1 || last > c.rank(0)) c.fail(fmt::format("indices last dim {} out of range", last));
  Shape us(it.begin(), it.end() - 1);
  us.insert(us.end(), x.begin() + last, x.end());
  if (c.shape(2) != us || c.dtype(2) != c.dtype(0))
    c.fail(fmt::format("updates of shape {} do not match expected {}", shape_str(c.shape(2)), shape_str(us)));
  check_reduction(c);
  check_indices(c, 1);
  return {c.type(0)};
}

// OneHot: indices' shape with `depth` inserted at axis; the values' dtype.
std::vector<TensorType> one_hot_types(const ShapeCtx& c) {
  const auto depth = saturate_cast<int64_t>(first_element(c, c.needs_value(1, "the depth"), "depth"));
  if (num_elements(c.shape(2)) != 2) c.fail("values must have two elements [off, on]");
  if (depth < 0) c.fail("depth must be non-negative");
  Shape os = c.shape(0);
  os.insert(os.begin() + c.axis(c.node.i("axis", -1), c.rank(0) + 1), depth);
  return one_type(c.dtype(2), std::move(os));
}

// NonZero: int64 [max(rank, 1), number of non-zeros].
std::vector<TensorType> non_zero_types(const ShapeCtx& c) { return evaluated_types(c, {"the non-zero count"}); }

// Compress: the kept count is the number of true entries of the condition (within the axis' length).
std::vector<TensorType> compress_types(const ShapeCtx& c) {
  if (c.dtype(1) != DType::kBool) c.fail("condition must be bool");
  Shape os = c.shape(0);
  int64_t ax = 0;
  if (c.node.has("axis"))
    ax = c.axis(c.node.i("axis"), c.rank(0));
  else
    os = {num_elements(os)};
  const std::vector<int64_t> cond = c.needs_value(1, "the condition").as_int64s();
  const auto end = cond.begin() + std::min<int64_t>(os[ax], static_cast<int64_t>(cond.size()));
  os[ax] = std::count_if(cond.begin(), end, [](int64_t v) { return v != 0; });
  return one_type(c.dtype(0), std::move(os));
}

// TopK: values and int64 indices, K along axis.
std::vector<TensorType> top_k_types(const ShapeCtx& c) {
  if (c.rank(0) == 0) c.fail("input must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", -1), c.rank(0));
  int64_t k = c.node.i("k", -1);
  if (c.opset >= 10) {
    const std::vector<int64_t> kv = c.needs_value(1, "K").as_int64s();
    if (kv.size() != 1) c.fail("K must have one element");
    k = kv[0];
  }
  Shape os = c.shape(0);
  if (k < 0 || k > os[ax]) c.fail(fmt::format("K={} out of range for an axis of size {}", k, os[ax]));
  os[ax] = k;
  return {{c.dtype(0), os}, {DType::kInt64, os}};
}

std::vector<TensorType> tile_types(const ShapeCtx& c) {
  const std::vector<int64_t> reps = c.needs_value(1, "the repeats").as_int64s();
  Shape os = c.shape(0);
  if (reps.size() != os.size()) c.fail(fmt::format("repeats has {} entries for rank {}", reps.size(), os.size()));
  for (size_t i = 0; i < os.size(); ++i) {
    if (reps[i] < 0) c.fail("negative repeat");
    os[i] *= reps[i];
  }
  return one_type(c.dtype(0), std::move(os));
}

std::vector<TensorType> pad_types(const ShapeCtx& c) {
  const std::vector<int64_t> pads = c.opset < 11 ? c.node.ints("pads") : c.needs_value(1, "the pads").as_int64s();
  std::vector<int64_t> axes;
  if (c.has(3))
    axes = c.needs_value(3, "the axes").as_int64s();
  else
    for (int64_t i = 0; i < c.rank(0); ++i) axes.push_back(i);
  const PadDims pd = pad_dims(c, c.shape(0), pads, axes);
  if (c.node.s("mode", "constant") == "constant" && c.has(2) && num_elements(c.shape(2)) > 0 &&
      c.dtype(2) != c.dtype(0))
    c.fail("constant_value has a different dtype");
  return one_type(c.dtype(0), pd.out);
}

// Range: max(ceil((limit - start) / delta), 0) elements.
std::vector<TensorType> range_types(const ShapeCtx& c) {
  if (c.dtype(0) != c.dtype(1) || c.dtype(0) != c.dtype(2)) c.fail("start, limit and delta differ in dtype");
  for (size_t i = 0; i < 3; ++i)
    if (num_elements(c.shape(i)) != 1) c.fail("start, limit and delta must be scalars");
  const double s = first_element(c, c.needs_value(0, "the start"), "start"),
               l = first_element(c, c.needs_value(1, "the limit"), "limit"),
               d = first_element(c, c.needs_value(2, "the delta"), "delta");
  if (d == 0) c.fail("delta is 0");
  const double n = std::ceil((l - s) / d);
  return one_type(c.dtype(0), {n > 0 ? saturate_cast<int64_t>(n) : 0});
}

// Elements of optional input i per its type (0 when absent): an empty roi / scales / sizes counts as absent.
int64_t numel_of(const ShapeCtx& c, size_t i) { return c.has(i) ? num_elements(c.shape(i)) : 0; }

// Resize / Upsample: the input's dtype; sizes, or floor(dim * scale).
std::vector<TensorType> resize_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  if (c.node.op_type == "Upsample" || c.opset < 11) {
    if (c.node.op_type == "Upsample" && c.opset < 9)
      for (float f : c.node.floats("scales")) scales.push_back(f);
    else
      scales = float_values(c, c.needs_value(1, "the scales"));
  } else {
    reject_resize18_attrs(c);
    if (numel_of(c, 2) > 0) scales = float_values(c, c.needs_value(2, "the scales"));
    if (numel_of(c, 3) > 0) sizes = c.needs_value(3, "the sizes").as_int64s();
    if (scales.empty() == sizes.empty()) c.fail("exactly one of scales and sizes must be given");
    if (numel_of(c, 1) > 0 && numel_of(c, 1) != 2 * r)
      c.fail(fmt::format("roi has {} entries for rank {}", numel_of(c, 1), r));
  }
  return one_type(c.dtype(0), resize_shape(c, c.shape(0), scales, sizes));
}

}  // namespace

void register_index_shapes(ShapeTable& t) {
  t["GatherElements"] = gather_elements_types;
  t["ScatterElements"] = t["Scatter"] = scatter_elements_types;
  t["GatherND"] = gather_nd_types;
  t["ScatterND"] = scatter_nd_types;
  t["OneHot"] = one_hot_types;
  t["NonZero"] = non_zero_types;
  t["Compress"] = compress_types;
  t["TopK"] = top_k_types;
  t["CumSum"] = same_as_input0;
  t["Tile"] = tile_types;
  t["Pad"] = pad_types;
  t["Range"] = range_types;
  t["Resize"] = t["Upsample"] = resize_types;
}

}  // namespace gspmd::shapes
