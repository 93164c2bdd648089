// Shape functions of ops_signal.cc's kernels: HannWindow, HammingWindow, BlackmanWindow, DFT, STFT, MelWeightMatrix.
// Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// HannWindow, HammingWindow, BlackmanWindow: [size] of output_datatype, size the value of input 0.
std::vector<TensorType> window_types(const ShapeCtx& c) {
  const std::vector<int64_t> sz = c.needs_value(0, "window size").as_int64s();
  if (sz.size() != 1 || sz[0] < 0) c.fail("size must be a non-negative scalar");
  return one_type(c.dtype_attr("output_datatype", 1), {sz[0]});
}

// Input i's only (first) value when it is present with elements, else `def` (an empty dft_length / frame_length
// means the default); needs the value otherwise.
int64_t optional_scalar(const ShapeCtx& c, size_t i, int64_t def, std::string_view what) {
  if (!c.has(i) || num_elements(c.shape(i)) == 0) return def;
  return c.needs_value(i, what).as_int64s()[0];
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
  if (mel <= 0 || dft <= 0) c.fail("num_mel_bins, dft_length and sample_rate must be positive");
  return one_type(c.dtype_attr("output_datatype", 1), {dft / 2 + 1, mel});
}

}  // namespace

void register_signal_shapes(ShapeTable& t) {
  t["HannWindow"] = t["HammingWindow"] = t["BlackmanWindow"] = window_types;
  t["DFT"] = dft_types;
  t["STFT"] = stft_types;
  t["MelWeightMatrix"] = mel_weight_matrix_types;
}

}  // namespace gspmd::shapes
