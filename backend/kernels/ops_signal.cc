// Signal processing (opset 17), plain C++: window functions (HannWindow, HammingWindow, BlackmanWindow), DFT (naive
// O(n^2) per transformed row, real or complex input, inverse, onesided), STFT, MelWeightMatrix. Reference: the ONNX
// operator specs (onnx/docs/Operators.md) and the ONNX reference implementation where the spec is silent.
#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"

namespace gspmd::kern {
namespace {

enum class Window { kHann, kHamming, kBlackman };

/// w[n] for n in [0, size): periodic windows divide by size, symmetric ones by size - 1 (ONNX spec).
template <Window kind>
std::vector<Tensor> window_kernel(const Ctx& c) {
  const std::vector<int64_t> sz = c.req(0).as_int64s();
  if (sz.size() != 1 || sz[0] < 0) c.fail("size must be a non-negative scalar");
  const int64_t n = sz[0];
  const bool periodic = c.node.i("periodic", 1) != 0;
  const double denom = static_cast<double>(periodic ? n : n - 1);
  Tensor f(DType::kFloat64, {n});
  double* w = f.data<double>();
  constexpr double pi = std::numbers::pi;
  for (int64_t i = 0; i < n; ++i) {
    const double x = denom > 0 ? 2 * pi * static_cast<double>(i) / denom : 0.0;
    if constexpr (kind == Window::kHann) w[i] = 0.5 - 0.5 * std::cos(x);
    if constexpr (kind == Window::kHamming) w[i] = 25.0 / 46.0 - (1 - 25.0 / 46.0) * std::cos(x);
    if constexpr (kind == Window::kBlackman) w[i] = 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x);
  }
  return one(cast_tensor(c, f, static_cast<DType>(c.node.i("output_datatype", 1))));
}

/// DFT (opset 17): input [..., n, 1] (real) or [..., n, 2] (complex), transformed along `axis` (default 1, a signal
/// dim); dft_length pads with zeros or truncates; inverse divides by the length; onesided keeps n/2 + 1 outputs.
std::vector<Tensor> dft_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank < 2 || (x.shape.back() != 1 && x.shape.back() != 2))
    c.fail(fmt::format("input must be [..., n, 1|2], got {}", shape_str(x.shape)));
  const int64_t axis = c.axis(c.node.i("axis", 1), rank - 1);
  const bool inverse = c.node.i("inverse", 0) != 0, onesided = c.node.i("onesided", 0) != 0;
  const int64_t n_in = x.shape[axis];
  int64_t n = n_in;
  if (const Tensor* l = c.in(1); l && l->numel() > 0) n = l->as_int64s()[0];
  if (n < 1) c.fail("dft_length must be positive");
  const int64_t n_out = onesided ? n / 2 + 1 : n;
  const bool cplx = x.shape.back() == 2;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int64_t d = axis + 1; d < rank - 1; ++d) inner *= x.shape[d];
  Shape os = x.shape;
  os[axis] = n_out;
  os.back() = 2;
  Tensor out(x.dtype, os);
  dispatch_float(c, x.dtype, [&]<class T>() {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const int64_t ci = cplx ? 2 : 1;
    const double sign = inverse ? 1.0 : -1.0;
    constexpr double two_pi = 2 * std::numbers::pi;
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t b = 0; b < inner; ++b)
        for (int64_t k = 0; k < n_out; ++k) {
          double re = 0, im = 0;
          for (int64_t t = 0; t < std::min(n, n_in); ++t) {
            const T* p = in + ((a * n_in + t) * inner + b) * ci;
            const double xr = static_cast<double>(p[0]), xi = cplx ? static_cast<double>(p[1]) : 0.0;
            const double ang = sign * two_pi * static_cast<double>((k * t) % n) / static_cast<double>(n);
            const double cr = std::cos(ang), sr = std::sin(ang);
            re += xr * cr - xi * sr;
            im += xr * sr + xi * cr;
          }
          if (inverse) {
            re /= static_cast<double>(n);
            im /= static_cast<double>(n);
          }
          T* q = o + ((a * n_out + k) * inner + b) * 2;
          q[0] = static_cast<T>(re);
          q[1] = static_cast<T>(im);
        }
  });
  return one(std::move(out));
}

/// STFT (opset 17): signal [batch, length, 1|2], frame_step, optional window [frame_length] and frame_length; each
/// frame x[f*step : f*step + frame_length] (times the window) gets a forward DFT; onesided (default 1) keeps
/// frame_length/2 + 1 bins. Output [batch, frames, bins, 2].
std::vector<Tensor> stft_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() != 3 || (x.shape[2] != 1 && x.shape[2] != 2))
    c.fail(fmt::format("signal must be [batch, length, 1|2], got {}", shape_str(x.shape)));
  const int64_t step = c.req(1).as_int64s().at(0);
  const Tensor* win = c.in(2);
  int64_t fl = win ? win->numel() : 0;
  if (const Tensor* l = c.in(3); l && l->numel() > 0) fl = l->as_int64s()[0];
  if (fl <= 0 || step <= 0 || fl > x.shape[1])
    c.fail("frame_length and frame_step must be positive and fit the signal");
  if (win && win->numel() != fl) c.fail("window length differs from frame_length");
  const bool onesided = c.node.i("onesided", 1) != 0;
  const int64_t B = x.shape[0], L = x.shape[1], ci = x.shape[2], frames = 1 + (L - fl) / step,
                bins = onesided ? fl / 2 + 1 : fl;
  Tensor out(x.dtype, {B, frames, bins, 2});
  dispatch_float(c, x.dtype, [&]<class T>() {
    const Tensor wd = win ? cast_tensor(c, *win, DType::kFloat64) : Tensor();
    constexpr double two_pi = 2 * std::numbers::pi;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t f = 0; f < frames; ++f)
        for (int64_t k = 0; k < bins; ++k) {
          double re = 0, im = 0;
          for (int64_t t = 0; t < fl; ++t) {
            const T* p = x.data<T>() + (b * L + f * step + t) * ci;
            const double w = win ? wd.data<double>()[t] : 1.0;
            const double xr = static_cast<double>(p[0]) * w, xi = ci == 2 ? static_cast<double>(p[1]) * w : 0.0;
            const double ang = -two_pi * static_cast<double>((k * t) % fl) / static_cast<double>(fl);
            re += xr * std::cos(ang) - xi * std::sin(ang);
            im += xr * std::sin(ang) + xi * std::cos(ang);
          }
          T* q = out.data<T>() + ((b * frames + f) * bins + k) * 2;
          q[0] = static_cast<T>(re);
          q[1] = static_cast<T>(im);
        }
  });
  return one(std::move(out));
}

/// MelWeightMatrix (opset 17): [dft_length/2 + 1, num_mel_bins] triangular filters between mel-spaced edges, as the
/// ONNX reference computes them (edges rounded down to DFT bins).
std::vector<Tensor> mel_weight_matrix_kernel(const Ctx& c) {
  auto scalar = [&](size_t i) { return cast_tensor(c, c.req(i), DType::kFloat64).data<double>()[0]; };
  const int64_t mel = static_cast<int64_t>(scalar(0)), dft = static_cast<int64_t>(scalar(1));
  const double rate = scalar(2), lo = scalar(3), hi = scalar(4);
  if (mel <= 0 || dft <= 0 || rate <= 0) c.fail("num_mel_bins, dft_length and sample_rate must be positive");
  const int64_t spec = dft / 2 + 1;
  const double lo_mel = 2595 * std::log10(1 + lo / 700), hi_mel = 2595 * std::log10(1 + hi / 700);
  const double step = (hi_mel - lo_mel) / static_cast<double>(mel + 2);
  std::vector<int64_t> edge(static_cast<size_t>(mel + 2));
  for (int64_t i = 0; i < mel + 2; ++i) {
    const double hz = 700 * (std::pow(10.0, (static_cast<double>(i) * step + lo_mel) / 2595) - 1);
    edge[i] = static_cast<int64_t>(std::floor(static_cast<double>(dft + 1) * hz / rate));
  }
  Tensor out(DType::kFloat64, {spec, mel});
  double* o = out.data<double>();
  auto set = [&](int64_t j, int64_t i, double v) {
    if (j < 0 || j >= spec) c.fail(fmt::format("mel edge {} is outside the {} spectrogram bins", j, spec));
    o[j * mel + i] = v;
  };
  for (int64_t i = 0; i < mel; ++i) {
    const int64_t l = edge[i], m = edge[i + 1], r = edge[i + 2];
    if (m == l)
      set(m, i, 1);
    else
      for (int64_t j = l; j <= m; ++j) set(j, i, static_cast<double>(j - l) / static_cast<double>(m - l));
    if (r > m)
      for (int64_t j = m; j < r; ++j) set(j, i, static_cast<double>(r - j) / static_cast<double>(r - m));
  }
  return one(cast_tensor(c, out, static_cast<DType>(c.node.i("output_datatype", 1))));
}

}  // namespace

void register_signal(KernelTable& t) {
  t["HannWindow"] = window_kernel<Window::kHann>;
  t["HammingWindow"] = window_kernel<Window::kHamming>;
  t["BlackmanWindow"] = window_kernel<Window::kBlackman>;
  t["DFT"] = dft_kernel;
  t["STFT"] = stft_kernel;
  t["MelWeightMatrix"] = mel_weight_matrix_kernel;
}

}  // namespace gspmd::kern
