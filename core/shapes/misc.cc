// Shape functions of ops_misc.cc's kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, Det, Trilu,
// EyeLike, Unique, ReverseSequence, NonMaxSuppression, TfIdfVectorizer. Reference: the ONNX operator specs
// (onnx/docs/Operators.md) at the node's opset.
#include <algorithm>

#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// Fails unless scale (input 1) is per tensor (one element, rank <= 1) or 1-D along `axis` of x (input 0), and the
// zero point (input 2) has as many elements.
void check_quant_params(const ShapeCtx& c) {
  const Shape &x = c.shape(0), &scale = c.shape(1);
  if (num_elements(scale) != 1 || scale.size() > 1) {
    if (scale.size() != 1) c.fail(fmt::format("scale must be a scalar or 1-D, got {}", shape_str(scale)));
    const int64_t axis = c.axis(c.node.i("axis", 1), static_cast<int64_t>(x.size()));
    if (scale[0] != x[static_cast<size_t>(axis)])
      c.fail(fmt::format("scale has {} elements but axis {} of {} has {}", scale[0], axis, shape_str(x),
                         x[static_cast<size_t>(axis)]));
  }
}

// QuantizeLinear: x's shape in the zero point's dtype (uint8 without one).
std::vector<TensorType> quantize_types(const ShapeCtx& c) {
  check_quant_params(c);
  if (c.has(2) && num_elements(c.shape(2)) != num_elements(c.shape(1))) c.fail("zero point and scale differ in size");
  return one_type(c.has(2) ? c.dtype(2) : DType::kUInt8, c.shape(0));
}

std::vector<TensorType> dequantize_types(const ShapeCtx& c) {
  check_quant_params(c);
  if (c.has(2) && (c.dtype(2) != c.dtype(0) || num_elements(c.shape(2)) != num_elements(c.shape(1))))
    c.fail("zero point must have the input's type and the scale's size");
  return one_type(DType::kFloat32, c.shape(0));
}

// DynamicQuantizeLinear: y (uint8, x's shape), y_scale (float32 scalar), y_zero_point (uint8 scalar).
std::vector<TensorType> dynamic_quantize_types(const ShapeCtx& c) {
  return {{DType::kUInt8, c.shape(0)}, {DType::kFloat32, {}}, {DType::kUInt8, {}}};
}

std::vector<TensorType> det_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  const size_t r = x.size();
  if (r < 2 || x[r - 1] != x[r - 2]) c.fail(fmt::format("input must be [*, M, M], got {}", shape_str(x)));
  return one_type(c.dtype(0), Shape(x.begin(), x.end() - 2));
}

std::vector<TensorType> trilu_types(const ShapeCtx& c) {
  if (c.rank(0) < 2) c.fail("input must have rank >= 2");
  return {c.type(0)};
}

std::vector<TensorType> eye_like_types(const ShapeCtx& c) {
  if (c.rank(0) != 2) c.fail("input must be 2-D");
  return one_type(c.node.has("dtype") ? c.dtype_attr("dtype", 0) : c.dtype(0), c.shape(0));
}

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
  return evaluated_types(
      c, {"the boxes", "the scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold"}, 2);
}

// TfIdfVectorizer: float32 [rows, width] (1-D input: [width]), width = max(ngram_indexes) + 1.
std::vector<TensorType> tfidf_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  if (x.empty() || x.size() > 2) c.fail(fmt::format("input must be 1-D or 2-D, got {}", shape_str(x)));
  const std::string mode = c.node.s("mode");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") c.fail(fmt::format("unknown mode '{}'", mode));
  const std::vector<int64_t> counts = c.node.ints("ngram_counts"), indexes = c.node.ints("ngram_indexes");
  const int64_t min_n = c.node.i("min_gram_length"), max_n = c.node.i("max_gram_length");
  if (min_n < 1 || max_n < min_n || static_cast<int64_t>(counts.size()) < max_n)
    c.fail("bad gram lengths / ngram_counts");
  const auto* strings =
      c.node.has("pool_strings") ? std::get_if<std::vector<std::string>>(&c.node.attrs.at("pool_strings")) : nullptr;
  const int64_t pool = static_cast<int64_t>(strings ? strings->size() : c.node.ints("pool_int64s").size());
  int64_t grams = 0;  // n-grams in the pool: ngram_counts[g] is where the (g+1)-grams start
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t end = g + 1 < counts.size() ? counts[g + 1] : pool, n = static_cast<int64_t>(g) + 1;
    if (end > counts[g]) grams += (end - counts[g]) / n;
  }
  if (static_cast<int64_t>(indexes.size()) < grams) c.fail("ngram_indexes has fewer entries than the pool has n-grams");
  const int64_t width = indexes.empty() ? 0 : *std::max_element(indexes.begin(), indexes.end()) + 1;
  return one_type(DType::kFloat32, x.size() == 2 ? Shape{x[0], width} : Shape{width});
}

}  // namespace

void register_misc_shapes(ShapeTable& t) {
  t["QuantizeLinear"] = quantize_types;
  t["DequantizeLinear"] = dequantize_types;
  t["DynamicQuantizeLinear"] = dynamic_quantize_types;
  t["Det"] = det_types;
  t["Trilu"] = trilu_types;
  t["EyeLike"] = eye_like_types;
  t["Unique"] = unique_types;
  t["ReverseSequence"] = reverse_sequence_types;
  t["NonMaxSuppression"] = nms_types;
  t["TfIdfVectorizer"] = tfidf_types;
}

}  // namespace gspmd::shapes
