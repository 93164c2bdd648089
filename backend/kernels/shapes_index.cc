// Shape functions of ops_index.cc's kernels: GatherElements, GatherND, ScatterElements (and legacy Scatter),
// ScatterND, OneHot, NonZero, Compress, TopK, CumSum, DepthToSpace, SpaceToDepth, Hardmax, Trilu, EyeLike, CastLike,
// Unique, ReverseSequence, NonMaxSuppression.
#include <algorithm>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/kernels/shape_rules_data.h"
#include "backend/kernels/shape_util.h"

namespace gspmd::kern {
namespace {

// Fails unless input i (indices) is int32 or int64.
void check_indices(const ShapeCtx& c, size_t i) {
  if (c.dtype(i) != DType::kInt64 && c.dtype(i) != DType::kInt32)
    c.fail(fmt::format("indices must be int32 or int64, got {}", dtype_name(c.dtype(i))));
}

// The kernel's output types on the constant inputs: for ops whose output sizes are the result itself (NonZero,
// Unique, NonMaxSuppression). `needed` names each input whose values decide them (the first `required` ones
// required); every one present must be constant.
std::vector<TensorType> evaluated_types(const ShapeCtx& c, const std::vector<std::string_view>& needed,
                                        size_t required = 1) {
  for (size_t i = 0; i < needed.size(); ++i)
    if (i < required || c.has(i)) c.needs_value(i, needed[i]);
  std::vector<TensorType> out;
  for (const Tensor& t : run_kernel(c.node, c.values, c.opset)) out.push_back({t.dtype, t.shape});
  return out;
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
  const auto depth = static_cast<int64_t>(first_element(c, c.needs_value(1, "the depth"), "depth"));
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

std::vector<TensorType> trilu_types(const ShapeCtx& c) {
  if (c.rank(0) < 2) c.fail("input must have rank >= 2");
  return {c.type(0)};
}

std::vector<TensorType> eye_like_types(const ShapeCtx& c) {
  if (c.rank(0) != 2) c.fail("input must be 2-D");
  return one_type(c.node.has("dtype") ? static_cast<DType>(c.node.i("dtype")) : c.dtype(0), c.shape(0));
}

std::vector<TensorType> cast_like_types(const ShapeCtx& c) { return one_type(c.dtype(1), c.shape(0)); }

// Unique: Y, indices, inverse_indices, counts; the unique count comes from the values.
std::vector<TensorType> unique_types(const ShapeCtx& c) {
  std::vector<TensorType> out = evaluated_types(c, {"the unique elements"});
  out.resize(std::min<size_t>(out.size(), c.n_out()));
  return out;
}

std::vector<TensorType> reverse_sequence_types(const ShapeCtx& c) {
  const int64_t r = c.rank(0);
  if (r < 2) c.fail(fmt::format("input must have rank >= 2, got {}", shape_str(c.shape(0))));
  const int64_t ta = c.axis(c.node.i("time_axis", 0), r), ba = c.axis(c.node.i("batch_axis", 1), r);
  if (ta == ba || std::min(ta, ba) != 0 || std::max(ta, ba) != 1) c.fail("time_axis and batch_axis must be 0 and 1");
  if (num_elements(c.shape(1)) != c.shape(0)[ba])
    c.fail(fmt::format("sequence_lens has {} entries, batch is {}", num_elements(c.shape(1)), c.shape(0)[ba]));
  return {c.type(0)};
}

// NonMaxSuppression: int64 [selected boxes, 3].
std::vector<TensorType> nms_types(const ShapeCtx& c) {
  return evaluated_types(c, {"the boxes", "the scores", "max_output_boxes_per_class", "iou_threshold",
                             "score_threshold"},
                         2);
}

}  // namespace

void register_index_shapes(ShapeTable& t) {
  t["NonMaxSuppression"] = nms_types;
  t["Unique"] = unique_types;
  t["ReverseSequence"] = reverse_sequence_types;
  t["GatherElements"] = gather_elements_types;
  t["ScatterElements"] = t["Scatter"] = scatter_elements_types;
  t["GatherND"] = gather_nd_types;
  t["ScatterND"] = scatter_nd_types;
  t["OneHot"] = one_hot_types;
  t["NonZero"] = non_zero_types;
  t["Compress"] = compress_types;
  t["TopK"] = top_k_types;
  t["CumSum"] = same_as_input0;
  t["DepthToSpace"] = t["SpaceToDepth"] = depth_space_types;
  t["Hardmax"] = hardmax_types;
  t["Trilu"] = trilu_types;
  t["EyeLike"] = eye_like_types;
  t["CastLike"] = cast_like_types;
}

}  // namespace gspmd::kern
