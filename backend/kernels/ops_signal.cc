// Window functions (HannWindow, HammingWindow, BlackmanWindow, opset 17), linear quantization (QuantizeLinear,
// DequantizeLinear, opset 10/13: per-tensor or per-axis scale and zero point; DynamicQuantizeLinear), integer matmul
// (MatMulInteger, QLinearMatMul), Det and GridSample, plain C++.
#include <algorithm>
#include <cmath>
#include <limits>
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

/// Per-element index of the scale / zero point: 0 for per-tensor (scalar or [1]), else the coordinate along axis.
struct QuantIndex {
  int64_t inner = 1, count = 1;  // elements after `axis`, scale count
  int64_t at(int64_t i) const { return count == 1 ? 0 : (i / inner) % count; }
};

QuantIndex quant_index(const Ctx& c, const Shape& x, const Tensor& scale) {
  QuantIndex q;
  if (scale.numel() == 1 && scale.shape.size() <= 1) return q;
  if (scale.shape.size() != 1) c.fail(fmt::format("scale must be a scalar or 1-D, got {}", shape_str(scale.shape)));
  const int64_t axis = c.axis(c.node.i("axis", 1), static_cast<int64_t>(x.size()));
  if (scale.shape[0] != x[axis])
    c.fail(fmt::format("scale has {} elements but axis {} of {} has {}", scale.shape[0], axis, shape_str(x), x[axis]));
  for (size_t d = static_cast<size_t>(axis) + 1; d < x.size(); ++d) q.inner *= x[d];
  q.count = scale.shape[0];
  return q;
}

std::vector<Tensor> quantize_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor scale = cast_tensor(c, c.req(1), DType::kFloat32);
  const Tensor* zp = c.in(2);
  const DType out_t = zp ? zp->dtype : DType::kUInt8;
  const QuantIndex q = quant_index(c, x.shape, scale);
  if (zp && zp->numel() != scale.numel()) c.fail("zero point and scale differ in size");
  const Tensor xf = cast_tensor(c, x, DType::kFloat32);
  Tensor out(out_t, x.shape);
  const float* xs = xf.data<float>();
  const float* sc = scale.data<float>();
  auto run = [&]<class T>() {
    const T* z = zp ? zp->data<T>() : nullptr;
    T* o = out.data<T>();
    constexpr float lo = static_cast<float>(std::numeric_limits<T>::lowest());
    constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t k = q.at(i);
      float v = std::nearbyint(xs[i] / sc[k]) + (z ? static_cast<float>(z[k]) : 0.f);
      o[i] = static_cast<T>(std::min(hi, std::max(lo, v)));
    }
  };
  switch (out_t) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kInt8: run.template operator()<int8_t>(); break;
    default: c.bad_dtype(out_t);
  }
  return one(std::move(out));
}

std::vector<Tensor> dequantize_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& scale = c.req(1);
  const Tensor* zp = c.in(2);
  if (scale.dtype != DType::kFloat32) c.bad_dtype(scale.dtype);
  const QuantIndex q = quant_index(c, x.shape, scale);
  if (zp && (zp->dtype != x.dtype || zp->numel() != scale.numel()))
    c.fail("zero point must have the input's type and the scale's size");
  Tensor out(DType::kFloat32, x.shape);
  float* o = out.data<float>();
  const float* sc = scale.data<float>();
  auto run = [&]<class T>() {
    const T* xs = x.data<T>();
    const T* z = zp ? zp->data<T>() : nullptr;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t k = q.at(i);
      o[i] = static_cast<float>(static_cast<int64_t>(xs[i]) - (z ? static_cast<int64_t>(z[k]) : 0)) * sc[k];
    }
  };
  switch (x.dtype) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kInt8: run.template operator()<int8_t>(); break;
    case DType::kInt32: run.template operator()<int32_t>(); break;
    default: c.bad_dtype(x.dtype);
  }
  return one(std::move(out));
}

/// DynamicQuantizeLinear (opset 11): uint8 y, scale = (max(0, max x) - min(0, min x)) / 255, zero point =
/// saturate(round(-min(0, min x) / scale)), y = saturate(round(x / scale) + zero point); rounding half to even.
std::vector<Tensor> dynamic_quantize_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.dtype != DType::kFloat32) c.bad_dtype(x.dtype);
  const float* p = x.data<float>();
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  const float scale = (hi - lo) / 255.f;
  const float zpf = scale == 0 ? 0.f : std::min(255.f, std::max(0.f, std::nearbyint(-lo / scale)));
  Tensor y(DType::kUInt8, x.shape), ys(DType::kFloat32, {}), yz(DType::kUInt8, {});
  uint8_t* d = y.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = scale == 0 ? zpf : std::nearbyint(p[i] / scale) + zpf;
    d[i] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, v)));
  }
  ys.data<float>()[0] = scale;
  yz.data<uint8_t>()[0] = static_cast<uint8_t>(zpf);
  std::vector<Tensor> outs;
  outs.push_back(std::move(y));
  outs.push_back(std::move(ys));
  outs.push_back(std::move(yz));
  return outs;
}

/// Integer values of an int8/uint8/int32 tensor as int32.
std::vector<int32_t> int_values(const Ctx& c, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::kUInt8: for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<uint8_t>()[i]; break;
    case DType::kInt8: for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<int8_t>()[i]; break;
    case DType::kInt32: for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<int32_t>()[i]; break;
    default: c.bad_dtype(t.dtype);
  }
  return v;
}

/// (A - a_zp) @ (B - b_zp) in int32 with numpy matmul broadcasting of the batch dims; a_zp is a scalar or per row
/// of A ([M]), b_zp a scalar or per column of B ([N]). Returns the int32 result.
Tensor int_matmul(const Ctx& c, const Tensor& a, const Tensor& b, const Tensor* azp, const Tensor* bzp) {
  if (a.shape.size() < 2 || b.shape.size() < 2)
    c.unsupported("no kernel for 1-D MatMulInteger operands");
  const int64_t M = a.shape[a.shape.size() - 2], K = a.shape.back(), N = b.shape.back();
  if (b.shape[b.shape.size() - 2] != K)
    c.fail(fmt::format("shapes {} and {} cannot be multiplied", shape_str(a.shape), shape_str(b.shape)));
  const Shape ab(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape batch = broadcast_shapes(c, ab, bb);
  Shape as = batch, bs = batch, os = batch;
  as.insert(as.end(), {M, K});
  bs.insert(bs.end(), {K, N});
  os.insert(os.end(), {M, N});
  const Tensor A = broadcast_to(a, as), B = broadcast_to(b, bs);
  const std::vector<int32_t> av = int_values(c, A), bv = int_values(c, B);
  const std::vector<int32_t> az = azp ? int_values(c, *azp) : std::vector<int32_t>{0};
  const std::vector<int32_t> bz = bzp ? int_values(c, *bzp) : std::vector<int32_t>{0};
  if ((az.size() != 1 && static_cast<int64_t>(az.size()) != M) || (bz.size() != 1 && static_cast<int64_t>(bz.size()) != N))
    c.fail("zero points must be scalars, or per row of A / per column of B");
  Tensor out(DType::kInt32, os);
  int32_t* o = out.data<int32_t>();
  const int64_t nb = num_elements(batch);
  std::vector<int32_t> brow(static_cast<size_t>(N));
  for (int64_t bi = 0; bi < nb; ++bi) {
    const int32_t* pa = av.data() + bi * M * K;
    const int32_t* pb = bv.data() + bi * K * N;
    int32_t* po = o + bi * M * N;
    for (int64_t m = 0; m < M; ++m) {
      const int32_t za = az.size() == 1 ? az[0] : az[m];
      int32_t* orow = po + m * N;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t x = pa[m * K + k] - za;
        const int32_t* r = pb + k * N;
        if (bz.size() == 1)
          for (int64_t n = 0; n < N; ++n) orow[n] += x * (r[n] - bz[0]);
        else
          for (int64_t n = 0; n < N; ++n) orow[n] += x * (r[n] - bz[n]);
      }
    }
  }
  return out;
}

std::vector<Tensor> matmul_integer_kernel(const Ctx& c) {
  return one(int_matmul(c, c.req(0), c.req(1), c.in(2), c.in(3)));
}

/// QLinearMatMul (opset 10): y = saturate(round((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp), in
/// y_zp's type; per-tensor scales.
std::vector<Tensor> qlinear_matmul_kernel(const Ctx& c) {
  const Tensor acc = int_matmul(c, c.req(0), c.req(3), &c.req(2), &c.req(5));
  const Tensor& ys = c.req(6);
  const Tensor& yz = c.req(7);
  const float as = cast_tensor(c, c.req(1), DType::kFloat32).data<float>()[0];
  const float bs = cast_tensor(c, c.req(4), DType::kFloat32).data<float>()[0];
  const float s = as * bs / cast_tensor(c, ys, DType::kFloat32).data<float>()[0];
  const int32_t z = int_values(c, yz)[0];
  Tensor out(yz.dtype, acc.shape);
  auto run = [&]<class T>() {
    constexpr float lo = static_cast<float>(std::numeric_limits<T>::lowest());
    constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
    const int32_t* p = acc.data<int32_t>();
    T* o = out.data<T>();
    for (int64_t i = 0; i < acc.numel(); ++i)
      o[i] = static_cast<T>(std::min(hi, std::max(lo, std::nearbyint(static_cast<float>(p[i]) * s) + static_cast<float>(z))));
  };
  switch (yz.dtype) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kInt8: run.template operator()<int8_t>(); break;
    default: c.bad_dtype(yz.dtype);
  }
  return one(std::move(out));
}

/// Det (opset 11): determinant of each [M, M] matrix of [*, M, M], LU with partial pivoting in double.
std::vector<Tensor> det_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const size_t r = x.shape.size();
  if (r < 2 || x.shape[r - 1] != x.shape[r - 2]) c.fail(fmt::format("input must be [*, M, M], got {}", shape_str(x.shape)));
  const int64_t M = x.shape[r - 1];
  const Shape os(x.shape.begin(), x.shape.end() - 2);
  const Tensor xd = cast_tensor(c, x, DType::kFloat64);
  Tensor out(DType::kFloat64, os);
  std::vector<double> a(static_cast<size_t>(M * M));
  for (int64_t b = 0; b < num_elements(os); ++b) {
    std::copy(xd.data<double>() + b * M * M, xd.data<double>() + (b + 1) * M * M, a.begin());
    double det = 1;
    for (int64_t k = 0; k < M && det != 0; ++k) {
      int64_t piv = k;
      for (int64_t i = k + 1; i < M; ++i)
        if (std::abs(a[i * M + k]) > std::abs(a[piv * M + k])) piv = i;
      if (a[piv * M + k] == 0) {
        det = 0;
        break;
      }
      if (piv != k) {
        for (int64_t j = 0; j < M; ++j) std::swap(a[k * M + j], a[piv * M + j]);
        det = -det;
      }
      det *= a[k * M + k];
      for (int64_t i = k + 1; i < M; ++i) {
        const double f = a[i * M + k] / a[k * M + k];
        for (int64_t j = k; j < M; ++j) a[i * M + j] -= f * a[k * M + j];
      }
    }
    out.data<double>()[b] = det;
  }
  return one(cast_tensor(c, out, x.dtype));
}

}  // namespace

void register_signal(KernelTable& t) {
  t["DynamicQuantizeLinear"] = dynamic_quantize_kernel;
  t["MatMulInteger"] = matmul_integer_kernel;
  t["QLinearMatMul"] = qlinear_matmul_kernel;
  t["Det"] = det_kernel;
  t["HannWindow"] = window_kernel<Window::kHann>;
  t["HammingWindow"] = window_kernel<Window::kHamming>;
  t["BlackmanWindow"] = window_kernel<Window::kBlackman>;
  t["QuantizeLinear"] = quantize_kernel;
  t["DequantizeLinear"] = dequantize_kernel;
}

}  // namespace gspmd::kern

namespace gspmd::kern {
namespace {

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

void register_grid_sample(KernelTable& t) { t["GridSample"] = grid_sample_kernel; }

}  // namespace gspmd::kern
