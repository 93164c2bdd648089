// Shape functions of ops_spatial.cc's kernels: MaxUnpool, RoiAlign, DFT, STFT, MelWeightMatrix, TfIdfVectorizer.
#include <algorithm>

#include <fmt/format.h>

#include "backend/kernels/shape_util.h"

namespace gspmd::kern {
namespace {

// Input i's only (first) value when it is present with elements, else `def` (an empty dft_length / frame_length
// means the default); needs the value otherwise.
int64_t optional_scalar(const ShapeCtx& c, size_t i, int64_t def, std::string_view what) {
  if (!c.has(i) || num_elements(c.shape(i)) == 0) return def;
  return c.needs_value(i, what).as_int64s()[0];
}

// MaxUnpool: X [N, C, ...] and indices of X's size; Y of the default size (in - 1) * stride - pads + kernel per
// spatial dim, or of the output_shape input's value (at least the default).
std::vector<TensorType> max_unpool_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  if (num_elements(c.shape(1)) != num_elements(x)) c.fail("indices must have X's shape");
  if (x.size() < 3) c.fail(fmt::format("X must have rank >= 3, got {}", shape_str(x)));
  const size_t sp = x.size() - 2;
  const std::vector<int64_t> k = c.node.ints("kernel_shape");
  if (k.size() != sp) c.fail("kernel_shape must have one entry per spatial dim");
  const std::vector<int64_t> st = c.node.ints("strides", std::vector<int64_t>(sp, 1)),
                             pads = c.node.ints("pads", std::vector<int64_t>(2 * sp, 0));
  if (st.size() != sp || pads.size() != 2 * sp) c.fail("strides and pads must have one entry per spatial dim");
  Shape def{x[0], x[1]};
  for (size_t i = 0; i < sp; ++i) def.push_back((x[2 + i] - 1) * st[i] - pads[i] - pads[sp + i] + k[i]);
  if (!c.has(2)) return one_type(c.dtype(0), def);
  const Shape out = c.needs_value(2, "output_shape").as_int64s();
  if (out.size() != def.size()) c.fail("output_shape must have X's rank");
  for (size_t d = 0; d < def.size(); ++d)
    if (out[d] < def[d]) c.fail(fmt::format("output_shape {} is smaller than {}", shape_str(out), shape_str(def)));
  return one_type(c.dtype(0), out);
}

// RoiAlign: X [N, C, H, W], rois [R, 4], batch_indices [R] -> [R, C, output_height, output_width].
std::vector<TensorType> roi_align_types(const ShapeCtx& c) {
  const Shape &x = c.shape(0), &rois = c.shape(1);
  if (x.size() != 4 || rois.size() != 2 || rois[1] != 4 || num_elements(c.shape(2)) != rois[0])
    c.fail(fmt::format("X {} / rois {} / batch_indices [{}] do not match", shape_str(x), shape_str(rois),
                       num_elements(c.shape(2))));
  return one_type(c.dtype(0), {rois[0], x[1], c.node.i("output_height", 1), c.node.i("output_width", 1)});
}

// DFT (opset 17): [..., n, 1|2] -> [..., n_out, 2] along `axis` (of the rank - 1 signal dims), n_out the
// dft_length (default n), halved + 1 when onesided.
std::vector<TensorType> dft_types(const ShapeCtx& c) {
  Shape s = c.shape(0);
  const int64_t rank = c.rank(0);
  if (rank < 2 || (s.back() != 1 && s.back() != 2))
    c.fail(fmt::format("input must be [..., n, 1|2], got {}", shape_str(s)));
  const size_t axis = static_cast<size_t>(c.axis(c.node.i("axis", 1), rank - 1));
  const int64_t n = optional_scalar(c, 1, s[axis], "dft_length");
  if (n < 1) c.fail("dft_length must be positive");
  s[axis] = c.node.i("onesided", 0) != 0 ? n / 2 + 1 : n;
  s.back() = 2;
  return one_type(c.dtype(0), s);
}

// STFT (opset 17): signal [batch, length, 1|2], frame_step (value), window [frame_length], frame_length (value)
// -> [batch, frames, bins, 2].
std::vector<TensorType> stft_types(const ShapeCtx& c) {
  const Shape& x = c.shape(0);
  if (x.size() != 3 || (x[2] != 1 && x[2] != 2))
    c.fail(fmt::format("signal must be [batch, length, 1|2], got {}", shape_str(x)));
  const int64_t win = c.has(2) ? num_elements(c.shape(2)) : 0;
  const int64_t fl = optional_scalar(c, 3, win, "frame_length");
  const int64_t step = c.needs_value(1, "frame_step").as_int64s().at(0);
  if (fl <= 0 || step <= 0 || fl > x[1]) c.fail("frame_length and frame_step must be positive and fit the signal");
  if (c.has(2) && win != fl) c.fail("window length differs from frame_length");
  const int64_t bins = c.node.i("onesided", 1) != 0 ? fl / 2 + 1 : fl;
  return one_type(c.dtype(0), {x[0], 1 + (x[1] - fl) / step, bins, 2});
}

// MelWeightMatrix: [dft_length / 2 + 1, num_mel_bins] of output_datatype, from the values of inputs 0 and 1.
std::vector<TensorType> mel_weight_matrix_types(const ShapeCtx& c) {
  const int64_t mel = c.needs_value(0, "num_mel_bins").as_int64s().at(0);
  const int64_t dft = c.needs_value(1, "dft_length").as_int64s().at(0);
  if (mel <= 0 || dft <= 0)
    c.fail("num_mel_bins, dft_length and sample_rate must be positive");
  return one_type(static_cast<DType>(c.node.i("output_datatype", 1)), {dft / 2 + 1, mel});
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
  const auto* strings = c.node.has("pool_strings")
                            ? std::get_if<std::vector<std::string>>(&c.node.attrs.at("pool_strings"))
                            : nullptr;
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

void register_spatial_shapes(ShapeTable& t) {
  t["MaxUnpool"] = max_unpool_types;
  t["RoiAlign"] = roi_align_types;
  t["DFT"] = dft_types;
  t["STFT"] = stft_types;
  t["MelWeightMatrix"] = mel_weight_matrix_types;
  t["TfIdfVectorizer"] = tfidf_types;
}

}  // namespace gspmd::kern
