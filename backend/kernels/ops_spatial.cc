// Spatial sampling and unpooling, plain C++: MaxUnpool (opset 11), RoiAlign (opsets 10 and 16, avg / max, half_pixel /
// output_half_pixel), GridSample (opset 16, 4-D). Reference: the ONNX operator specs (onnx/docs/Operators.md); where
// the spec leaves details open, the implementations the ONNX test data comes from (onnxruntime, PyTorch).
#include <algorithm>
#include <cmath>

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
    if (out_shape[d] < def[d])
      c.fail(fmt::format("output_shape {} is smaller than {}", shape_str(out_shape), shape_str(def)));
  Tensor y(x.dtype, out_shape);
  const size_t es = dtype_size(x.dtype);
  const int64_t n = num_elements(def);
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i] < 0 || idx[i] >= n) c.bad_data(fmt::format("index {} is out of range [0, {})", idx[i], n));
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
  // opsets 10-15 have no coordinate_transformation_mode and sample as output_half_pixel does (no half-pixel shift)
  const bool half_pixel =
      c.node.s("coordinate_transformation_mode", c.opset >= 16 ? "half_pixel" : "output_half_pixel") == "half_pixel";
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
      if (bidx[r] < 0 || bidx[r] >= X.shape[0]) c.bad_data(fmt::format("batch index {} is out of range", bidx[r]));
      for (int64_t ch = 0; ch < C; ++ch) {
        const T* img = X.data<T>() + (bidx[r] * C + ch) * H * W;
        for (int64_t py = 0; py < oh; ++py)
          for (int64_t px = 0; px < ow; ++px) {
            double acc = 0, mx = 0;
            bool first = true;
            for (int64_t iy = 0; iy < gh; ++iy)
              for (int64_t ix = 0; ix < gw; ++ix) {
                double y =
                    y0 + static_cast<double>(py) * bh + (static_cast<double>(iy) + 0.5) * bh / static_cast<double>(gh);
                double x =
                    x0 + static_cast<double>(px) * bw + (static_cast<double>(ix) + 0.5) * bw / static_cast<double>(gw);
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
                  const double ly = y - static_cast<double>(yl), lx = x - static_cast<double>(xl), hy = 1 - ly,
                               hx = 1 - lx;
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

// ---------------------------------------------------------------------------------------------------------------
// GridSample (opset 16, 4-D): PyTorch's grid_sampler semantics, which the ONNX test data comes from.

double gs_unnormalize(double coord, int64_t size, bool align) {
  return align ? (coord + 1) / 2 * static_cast<double>(size - 1) : ((coord + 1) * static_cast<double>(size) - 1) / 2;
}

double gs_reflect(double in, double twice_low, double twice_high) {
  if (twice_low == twice_high) return 0;
  const double lo = twice_low / 2, span = (twice_high - twice_low) / 2;
  in = std::abs(in - lo);
  const double extra = std::fmod(in, span);
  const int64_t flips = static_cast<int64_t>(std::floor(in / span));
  return flips % 2 == 0 ? extra + lo : span - extra + lo;
}

enum class Pad { kZeros, kBorder, kReflection };

/// Source coordinate after the padding mode (border: clamped; reflection: reflected then clamped).
double gs_compute(double coord, int64_t size, Pad pad, bool align) {
  if (pad == Pad::kBorder) return std::clamp(coord, 0.0, static_cast<double>(size - 1));
  if (pad == Pad::kReflection) {
    coord = align ? gs_reflect(coord, 0, 2.0 * static_cast<double>(size - 1))
                  : gs_reflect(coord, -1, 2.0 * static_cast<double>(size) - 1);
    return std::clamp(coord, 0.0, static_cast<double>(size - 1));
  }
  return coord;
}

std::vector<Tensor> grid_sample_kernel(const Ctx& c) {
  const Tensor& X = c.req(0);
  const Tensor& grid = c.req(1);
  if (X.shape.size() != 4 || grid.shape.size() != 4 || grid.shape[3] != 2 || grid.shape[0] != X.shape[0])
    c.unsupported(fmt::format("no kernel for X {} and grid {} (only 4-D)", shape_str(X.shape), shape_str(grid.shape)));
  const std::string mode = c.node.s("mode", "bilinear"), pm = c.node.s("padding_mode", "zeros");
  const bool align = c.node.i("align_corners", 0) != 0;
  const Pad pad = pm == "border" ? Pad::kBorder : pm == "reflection" ? Pad::kReflection : Pad::kZeros;
  if (pm != "zeros" && pm != "border" && pm != "reflection") c.fail(fmt::format("unknown padding_mode '{}'", pm));
  if (mode != "bilinear" && mode != "nearest" && mode != "bicubic") c.fail(fmt::format("unknown mode '{}'", mode));
  const int64_t N = X.shape[0], C = X.shape[1], H = X.shape[2], W = X.shape[3], Ho = grid.shape[1], Wo = grid.shape[2];
  Tensor out(X.dtype, {N, C, Ho, Wo});
  const bool bicubic = mode == "bicubic", nearest = mode == "nearest";
  dispatch_float(c, X.dtype, [&]<class T>() {
    const T* g = grid.dtype == X.dtype ? grid.data<T>() : nullptr;
    if (!g) c.fail("grid must have X's dtype");
    for (int64_t n = 0; n < N; ++n)
      for (int64_t oy = 0; oy < Ho; ++oy)
        for (int64_t ox = 0; ox < Wo; ++ox) {
          const T* gp = g + ((n * Ho + oy) * Wo + ox) * 2;
          const double ux = gs_unnormalize(static_cast<double>(gp[0]), W, align);
          const double uy = gs_unnormalize(static_cast<double>(gp[1]), H, align);
          for (int64_t ch = 0; ch < C; ++ch) {
            const T* img = X.data<T>() + (n * C + ch) * H * W;
            auto at = [&](int64_t y, int64_t x) -> double {  // zero outside
              return y >= 0 && y < H && x >= 0 && x < W ? static_cast<double>(img[y * W + x]) : 0.0;
            };
            double v = 0;
            if (bicubic) {
              // Taps are padded one by one (PyTorch's get_value_bounded); coefficients with A = -0.75.
              const double fx = std::floor(ux), fy = std::floor(uy), tx = ux - fx, ty = uy - fy;
              auto coeffs = [](double t, double w[4]) {
                constexpr double A = -0.75;
                auto c1 = [](double x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
                auto c2 = [](double x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
                w[0] = c2(t + 1);
                w[1] = c1(t);
                w[2] = c1(1 - t);
                w[3] = c2(2 - t);
              };
              double wx[4], wy[4];
              coeffs(tx, wx);
              coeffs(ty, wy);
              auto bounded = [&](double y, double x) {
                const double cx = gs_compute(x, W, pad, align), cy = gs_compute(y, H, pad, align);
                return at(static_cast<int64_t>(cy), static_cast<int64_t>(cx));
              };
              for (int i = 0; i < 4; ++i) {
                double row = 0;
                for (int j = 0; j < 4; ++j) row += wx[j] * bounded(fy - 1 + i, fx - 1 + j);
                v += wy[i] * row;
              }
            } else {
              const double x = gs_compute(ux, W, pad, align), y = gs_compute(uy, H, pad, align);
              if (nearest) {
                v = at(static_cast<int64_t>(std::nearbyint(y)), static_cast<int64_t>(std::nearbyint(x)));
              } else {
                const double x0 = std::floor(x), y0 = std::floor(y), tx = x - x0, ty = y - y0;
                const int64_t ix = static_cast<int64_t>(x0), iy = static_cast<int64_t>(y0);
                v = at(iy, ix) * (1 - tx) * (1 - ty) + at(iy, ix + 1) * tx * (1 - ty) + at(iy + 1, ix) * (1 - tx) * ty +
                    at(iy + 1, ix + 1) * tx * ty;
              }
            }
            out.data<T>()[((n * C + ch) * Ho + oy) * Wo + ox] = static_cast<T>(v);
          }
        }
  });
  return one(std::move(out));
}

}  // namespace

void register_spatial(KernelTable& t) {
  t["MaxUnpool"] = max_unpool_kernel;
  t["RoiAlign"] = roi_align_kernel;
  t["GridSample"] = grid_sample_kernel;
}

}  // namespace gspmd::kern
