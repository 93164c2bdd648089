// MaxUnpool (opset 11), RoiAlign (opset 16, avg / max, half_pixel / output_half_pixel), DFT (opset 17, naive
// O(n^2) per transformed row, real or complex input, inverse, onesided), STFT, MelWeightMatrix and TfIdfVectorizer
// (integer pools), plain C++.
#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"

namespace gspmd::kern {
namespace {

/// Y is zero except at the positions of I (MaxPool's flat indices into the default output shape
/// (in - 1) * stride - pad_begin - pad_end + kernel per spatial dim), where it holds X. With the output_shape input,
/// each index is unravelled over the default shape and placed at the same coordinates of the larger output.
std::vector<Tensor> max_unpool_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> idx = c.req(1).as_int64s();
  if (static_cast<int64_t>(idx.size()) != x.numel()) c.fail("indices must have X's shape");
  if (x.shape.size() < 3) c.fail(fmt::format("X must have rank >= 3, got {}", shape_str(x.shape)));
  const size_t sp = x.shape.size() - 2;
  const std::vector<int64_t> k = c.node.ints("kernel_shape");
  if (k.size() != sp) c.fail("kernel_shape must have one entry per spatial dim");
  const std::vector<int64_t> st = c.node.ints("strides", std::vector<int64_t>(sp, 1)),
                             pads = c.node.ints("pads", std::vector<int64_t>(2 * sp, 0));
  Shape def = {x.shape[0], x.shape[1]};
  for (size_t i = 0; i < sp; ++i) def.push_back((x.shape[2 + i] - 1) * st[i] - pads[i] - pads[sp + i] + k[i]);
  Shape out_shape = def;
  if (const Tensor* os = c.in(2)) out_shape = os->as_int64s();
  if (out_shape.size() != def.size()) c.fail("output_shape must have X's rank");
  for (size_t d = 0; d < def.size(); ++d)
    if (out_shape[d] < def[d]) c.fail(fmt::format("output_shape {} is smaller than {}", shape_str(out_shape), shape_str(def)));
  Tensor y(x.dtype, out_shape);
  const size_t es = dtype_size(x.dtype);
  const int64_t n = num_elements(def);
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i] < 0 || idx[i] >= n) c.fail(fmt::format("index {} is out of range [0, {})", idx[i], n));
    int64_t rest = idx[i], flat = 0, mul = 1;
    for (size_t d = def.size(); d-- > 0;) {
      flat += (rest % def[d]) * mul;
      rest /= def[d];
      mul *= out_shape[d];
    }
    std::memcpy(y.bytes.data() + flat * static_cast<int64_t>(es), x.bytes.data() + i * es, es);
  }
  return one(std::move(y));
}

/// RoiAlign as onnxruntime computes it (the reference of the ONNX test data): per output bin, the average (or the
/// max of the weighted bilinear taps) of a sampling grid of bilinear samples.
std::vector<Tensor> roi_align_kernel(const Ctx& c) {
  const Tensor& X = c.req(0);
  const Tensor rois = cast_tensor(c, c.req(1), DType::kFloat64);
  const std::vector<int64_t> bidx = c.req(2).as_int64s();
  if (X.shape.size() != 4 || rois.shape.size() != 2 || rois.shape[1] != 4 ||
      static_cast<int64_t>(bidx.size()) != rois.shape[0])
    c.fail(fmt::format("X {} / rois {} / batch_indices [{}] do not match", shape_str(X.shape), shape_str(rois.shape),
                       bidx.size()));
  const int64_t C = X.shape[1], H = X.shape[2], W = X.shape[3], R = rois.shape[0];
  const int64_t oh = c.node.i("output_height", 1), ow = c.node.i("output_width", 1);
  const int64_t ratio = c.node.i("sampling_ratio", 0);
  const double scale = c.node.f("spatial_scale", 1.f);
  const bool max_mode = c.node.s("mode", "avg") == "max";
  const bool half_pixel = c.node.s("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  Tensor out(X.dtype, {R, C, oh, ow});
  dispatch_float(c, X.dtype, [&]<class T>() {
    for (int64_t r = 0; r < R; ++r) {
      const double* b = rois.data<double>() + r * 4;
      const double off = half_pixel ? 0.5 : 0.0;
      const double x0 = b[0] * scale - off, y0 = b[1] * scale - off, x1 = b[2] * scale - off, y1 = b[3] * scale - off;
      double rw = x1 - x0, rh = y1 - y0;
      if (!half_pixel) {
        rw = std::max(rw, 1.0);
        rh = std::max(rh, 1.0);
      }
      const double bh = rh / static_cast<double>(oh), bw = rw / static_cast<double>(ow);
      const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / static_cast<double>(oh)));
      const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / static_cast<double>(ow)));
      const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
      if (bidx[r] < 0 || bidx[r] >= X.shape[0]) c.fail(fmt::format("batch index {} is out of range", bidx[r]));
      for (int64_t ch = 0; ch < C; ++ch) {
        const T* img = X.data<T>() + (bidx[r] * C + ch) * H * W;
        for (int64_t py = 0; py < oh; ++py)
          for (int64_t px = 0; px < ow; ++px) {
            double acc = 0, mx = 0;
            bool first = true;
            for (int64_t iy = 0; iy < gh; ++iy)
              for (int64_t ix = 0; ix < gw; ++ix) {
                double y = y0 + static_cast<double>(py) * bh + (static_cast<double>(iy) + 0.5) * bh / static_cast<double>(gh);
                double x = x0 + static_cast<double>(px) * bw + (static_cast<double>(ix) + 0.5) * bw / static_cast<double>(gw);
                double v[4] = {0, 0, 0, 0};
                if (!(y < -1.0 || y > static_cast<double>(H) || x < -1.0 || x > static_cast<double>(W))) {
                  y = std::max(y, 0.0);
                  x = std::max(x, 0.0);
                  int64_t yl = static_cast<int64_t>(y), xl = static_cast<int64_t>(x), yh, xh;
                  if (yl >= H - 1) {
                    yh = yl = H - 1;
                    y = static_cast<double>(yl);
                  } else {
                    yh = yl + 1;
                  }
                  if (xl >= W - 1) {
                    xh = xl = W - 1;
                    x = static_cast<double>(xl);
                  } else {
                    xh = xl + 1;
                  }
                  const double ly = y - static_cast<double>(yl), lx = x - static_cast<double>(xl), hy = 1 - ly, hx = 1 - lx;
                  v[0] = hy * hx * static_cast<double>(img[yl * W + xl]);
                  v[1] = hy * lx * static_cast<double>(img[yl * W + xh]);
                  v[2] = ly * hx * static_cast<double>(img[yh * W + xl]);
                  v[3] = ly * lx * static_cast<double>(img[yh * W + xh]);
                }
                if (max_mode) {
                  for (double t : v) {
                    mx = first ? t : std::max(mx, t);
                    first = false;
                  }
                } else {
                  acc += v[0] + v[1] + v[2] + v[3];
                }
              }
            out.data<T>()[((r * C + ch) * oh + py) * ow + px] = static_cast<T>(max_mode ? mx : acc / count);
          }
      }
    }
  });
  return one(std::move(out));
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

/// TfIdfVectorizer (opset 9), integer pools (pool_int64s): per row, counts the n-grams of the pool (n in
/// [min_gram_length, max_gram_length]; n >= 2 grams also with skips: items start + k*d for d in
/// [1, max_skip_count + 1]) into output slot ngram_indexes[id]; mode TF (counts), IDF (weight where the count is
/// non-zero), TFIDF (count * weight), weights 1 when absent. As onnxruntime counts (the reference of the test data).
std::vector<Tensor> tfidf_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (c.node.has("pool_strings")) c.unsupported("no kernel for string pools");
  if (x.dtype != DType::kInt32 && x.dtype != DType::kInt64) c.bad_dtype(x.dtype);
  if (x.shape.empty() || x.shape.size() > 2) c.fail(fmt::format("input must be 1-D or 2-D, got {}", shape_str(x.shape)));
  const std::vector<int64_t> in = x.as_int64s();
  const int64_t rows = x.shape.size() == 2 ? x.shape[0] : 1, len = x.shape.back();
  const int64_t min_n = c.node.i("min_gram_length"), max_n = c.node.i("max_gram_length"),
                max_skip = c.node.i("max_skip_count");
  const std::string mode = c.node.s("mode");
  const std::vector<int64_t> counts = c.node.ints("ngram_counts"), indexes = c.node.ints("ngram_indexes"),
                             pool = c.node.ints("pool_int64s");
  const std::vector<float> weights = c.node.floats("weights");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") c.fail(fmt::format("unknown mode '{}'", mode));
  const bool tf = mode == "TF", idf = mode == "IDF";
  if (min_n < 1 || max_n < min_n || static_cast<int64_t>(counts.size()) < max_n) c.fail("bad gram lengths / ngram_counts");
  // pool n-grams of length n -> ngram id.
  std::map<std::vector<int64_t>, int64_t> ids;
  int64_t id = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t n = static_cast<int64_t>(g) + 1, begin = counts[g];
    const int64_t end = g + 1 < counts.size() ? counts[g + 1] : static_cast<int64_t>(pool.size());
    for (int64_t p = begin; p + n <= end; p += n, ++id)
      ids.emplace(std::vector<int64_t>(pool.begin() + p, pool.begin() + p + n), id);
  }
  if (static_cast<int64_t>(indexes.size()) < id) c.fail("ngram_indexes has fewer entries than the pool has n-grams");
  const int64_t width = indexes.empty() ? 0 : *std::max_element(indexes.begin(), indexes.end()) + 1;
  Tensor out(DType::kFloat32, x.shape.size() == 2 ? Shape{rows, width} : Shape{width});
  std::vector<int64_t> gram;
  std::vector<double> cnt(static_cast<size_t>(width));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* row = in.data() + r * len;
    std::fill(cnt.begin(), cnt.end(), 0.0);
    auto hit = [&](const std::vector<int64_t>& g) {
      auto it = ids.find(g);
      if (it != ids.end()) cnt[indexes[it->second]] += 1;
    };
    if (min_n == 1)
      for (int64_t i = 0; i < len; ++i) {
        gram.assign(1, row[i]);
        hit(gram);
      }
    for (int64_t start = 0; start < len; ++start)
      for (int64_t d = 1; d <= max_skip + 1; ++d) {
        gram.assign(1, row[start]);
        for (int64_t n = 2; n <= max_n; ++n) {
          const int64_t at = start + (n - 1) * d;
          if (at >= len) break;
          gram.push_back(row[at]);
          if (n >= min_n) hit(gram);
        }
      }
    float* o = out.data<float>() + r * width;
    for (int64_t k = 0; k < width; ++k) {
      const double w = weights.empty() ? 1.0 : weights[static_cast<size_t>(k)];
      o[k] = static_cast<float>(tf ? cnt[k] : idf ? (cnt[k] > 0 ? w : 0.0) : cnt[k] * w);
    }
  }
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
  if (fl <= 0 || step <= 0 || fl > x.shape[1]) c.fail("frame_length and frame_step must be positive and fit the signal");
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
    if (m == l) set(m, i, 1);
    else
      for (int64_t j = l; j <= m; ++j) set(j, i, static_cast<double>(j - l) / static_cast<double>(m - l));
    if (r > m)
      for (int64_t j = m; j < r; ++j) set(j, i, static_cast<double>(r - j) / static_cast<double>(r - m));
  }
  return one(cast_tensor(c, out, static_cast<DType>(c.node.i("output_datatype", 1))));
}

}  // namespace

void register_spatial(KernelTable& t) {
  t["STFT"] = stft_kernel;
  t["MelWeightMatrix"] = mel_weight_matrix_kernel;
  t["TfIdfVectorizer"] = tfidf_kernel;
  t["MaxUnpool"] = max_unpool_kernel;
  t["RoiAlign"] = roi_align_kernel;
  t["DFT"] = dft_kernel;
}

}  // namespace gspmd::kern
