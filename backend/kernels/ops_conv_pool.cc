// The conv/pool family (core/rules/conv_pool.cc): Conv, ConvTranspose, ConvInteger and QLinearConv (through the float64
// Conv path), MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, GlobalLpPool, DepthToSpace and
// SpaceToDepth (as a 6-D transpose). The family's normalizations are in ops_conv_pool_norm.cc. Reference: the ONNX
// operator specs (onnx/docs/Operators.md) at the node's opset.
// float32 Conv / ConvTranspose (1-3 spatial dims; 1-D runs as 2-D with a unit dim) and MaxPool / AveragePool use oneDNN
// (onednn.h); float64, integer pools, Indices outputs, >3 spatial dims and geometries oneDNN rejects run on the naive
// loops here.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"
#include "core/shapes/geometry.h"

namespace gspmd::kern {
namespace {

// Shape rules shared with the shape functions (core/shapes/geometry.h).
using shapes::make_deconv_window;
using shapes::make_window;
using shapes::Window;

// ---------------------------------------------------------------------------------------------------------------
// Sliding-window geometry shared by Conv and the pools (Window, make_window: core/shapes/geometry.h).

/// Right padding oneDNN needs so that its output-size formula gives w.out (may exceed pr with ceil_mode, or be
/// negative when the last input rows are not covered).
std::vector<int64_t> dnnl_pad_r(const Window& w) {
  std::vector<int64_t> r(w.n());
  for (size_t i = 0; i < w.n(); ++i) r[i] = (w.out[i] - 1) * w.s[i] + w.ext(i) - w.in[i] - w.pl[i];
  return r;
}

/// Spatial dims padded to 3 (leading unit dims) so the naive loops have one shape.
struct W3 {
  int64_t in[3], k[3], s[3], d[3], pl[3], out[3];
};
W3 to3(const Window& w) {
  W3 r;
  const size_t off = 3 - w.n();
  for (size_t i = 0; i < 3; ++i) {
    const bool real = i >= off;
    const size_t j = i - off;
    r.in[i] = real ? w.in[j] : 1;
    r.k[i] = real ? w.k[j] : 1;
    r.s[i] = real ? w.s[j] : 1;
    r.d[i] = real ? w.d[j] : 1;
    r.pl[i] = real ? w.pl[j] : 0;
    r.out[i] = real ? w.out[j] : 1;
  }
  return r;
}

// Calls f(flat offset in `lim`, flat kernel offset) for every kernel tap of window position (p0, p1, p2): position
// p*s - pl + k*d per dim, skipping taps outside [0, lim). Conv walks output positions over the input (lim = in),
// ConvTranspose input positions over the output (lim = out).
template <class F>
inline void for_each_tap(const W3& w, int64_t p0, int64_t p1, int64_t p2, const int64_t (&lim)[3], F&& f) {
  for (int64_t k0 = 0; k0 < w.k[0]; ++k0) {
    const int64_t q0 = p0 * w.s[0] - w.pl[0] + k0 * w.d[0];
    if (q0 < 0 || q0 >= lim[0]) continue;
    for (int64_t k1 = 0; k1 < w.k[1]; ++k1) {
      const int64_t q1 = p1 * w.s[1] - w.pl[1] + k1 * w.d[1];
      if (q1 < 0 || q1 >= lim[1]) continue;
      for (int64_t k2 = 0; k2 < w.k[2]; ++k2) {
        const int64_t q2 = p2 * w.s[2] - w.pl[2] + k2 * w.d[2];
        if (q2 < 0 || q2 >= lim[2]) continue;
        f((q0 * lim[1] + q1) * lim[2] + q2, (k0 * w.k[1] + k1) * w.k[2] + k2);
      }
    }
  }
}

/// Input spatial dims [2, rank) of x; fails below rank 3 (no spatial dims).
std::vector<int64_t> spatial(const Ctx& c, const Tensor& x, const char* what = "X") {
  if (x.shape.size() < 3)
    c.fail(fmt::format("{} must have rank >= 3 (N, C, spatial...), got {}", what, shape_str(x.shape)));
  return std::vector<int64_t>(x.shape.begin() + 2, x.shape.end());
}

Shape out_shape(int64_t n, int64_t ch, const std::vector<int64_t>& sp) {
  Shape s{n, ch};
  s.insert(s.end(), sp.begin(), sp.end());
  return s;
}

/// oneDNN geometry for window w (1-D becomes 2-D with a unit leading spatial dim).
void fill_geom(dnn::ConvGeom& g, const Window& w, bool one_d) {
  g.strides = w.s;
  g.dilations.clear();
  for (int64_t d : w.d) g.dilations.push_back(d - 1);
  g.pad_l = w.pl;
  g.pad_r = dnnl_pad_r(w);
  if (one_d) {
    g.strides.insert(g.strides.begin(), 1);
    g.dilations.insert(g.dilations.begin(), 0);
    g.pad_l.insert(g.pad_l.begin(), 0);
    g.pad_r.insert(g.pad_r.begin(), 0);
  }
}

/// Shape helpers for the 1-D -> 2-D view: inserts a unit dim at position 2.
std::vector<int64_t> with_unit(std::vector<int64_t> v, bool one_d, size_t pos = 2) {
  if (one_d) v.insert(v.begin() + static_cast<std::ptrdiff_t>(pos), 1);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Conv.

template <class T>
void naive_conv(const T* x, const T* wt, const T* b, T* y, int64_t N, int64_t C, int64_t M, int64_t G, const W3& w) {
  const int64_t Cg = C / G, Mg = M / G;
  const int64_t isz = w.in[0] * w.in[1] * w.in[2], osz = w.out[0] * w.out[1] * w.out[2];
  const int64_t ksz = w.k[0] * w.k[1] * w.k[2];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t g = m / Mg;
      T* yo = y + (n * M + m) * osz;
      for (int64_t o0 = 0; o0 < w.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < w.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < w.out[2]; ++o2) {
            T acc = b ? b[m] : T(0);
            for (int64_t ci = 0; ci < Cg; ++ci) {
              const T* xi = x + (n * C + g * Cg + ci) * isz;
              const T* wi = wt + (m * Cg + ci) * ksz;
              for_each_tap(w, o0, o1, o2, w.in, [&](int64_t at, int64_t kat) { acc += xi[at] * wi[kat]; });
            }
            yo[(o0 * w.out[1] + o1) * w.out[2] + o2] = acc;
          }
    }
}

/// The checks Conv and ConvTranspose share: X, W (and B) of one dtype, W of X's rank; returns X's spatial dims.
std::vector<int64_t> conv_operands(const Ctx& c, const Tensor& x, const Tensor& wt, const Tensor* b) {
  if (wt.dtype != x.dtype || (b && b->dtype != x.dtype)) c.fail("input dtypes differ");
  std::vector<int64_t> in = spatial(c, x);
  if (wt.shape.size() != in.size() + 2)
    c.fail(fmt::format("W of shape {} does not match X of shape {}", shape_str(wt.shape), shape_str(x.shape)));
  return in;
}

/// Fails unless the group checks (`ok`) hold and B has M elements.
void check_groups(const Ctx& c, bool ok, const Tensor& x, const Tensor& wt, const Tensor* b, int64_t G, int64_t M) {
  if (!ok)
    c.fail(fmt::format("X of shape {} and W of shape {} do not match group={}", shape_str(x.shape), shape_str(wt.shape),
                       G));
  if (b && b->numel() != M) c.fail(fmt::format("B has {} elements, expected {}", b->numel(), M));
}

std::vector<Tensor> conv_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& wt = c.req(1);
  const Tensor* b = c.in(2);
  const std::vector<int64_t> in = conv_operands(c, x, wt, b);
  const size_t nsp = in.size();
  const int64_t N = x.shape[0], C = x.shape[1], M = wt.shape[0], G = c.node.i("group", 1);
  check_groups(c, G > 0 && C % G == 0 && M % G == 0 && wt.shape[1] * G == C, x, wt, b, G, M);
  std::vector<int64_t> k(wt.shape.begin() + 2, wt.shape.end());
  if (c.node.has("kernel_shape") && c.node.ints("kernel_shape") != k)
    c.fail(fmt::format("kernel_shape [{}] does not match W of shape {}", fmt::join(c.node.ints("kernel_shape"), ","),
                       shape_str(wt.shape)));
  const Window w = make_window(c, in, k, false);
  Tensor y(x.dtype, out_shape(N, M, w.out));
  if (y.numel() == 0) return one(std::move(y));
  dispatch_float(c, x.dtype, [&]<class T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (nsp <= 3 && x.numel() > 0 && wt.numel() > 0) {
        const bool one_d = nsp == 1;
        dnn::ConvGeom g;
        g.src = with_unit(x.shape, one_d);
        g.dst = with_unit(y.shape, one_d);
        const std::vector<int64_t> ws = with_unit(wt.shape, one_d);
        std::vector<int64_t> plain = contiguous_strides(ws);
        if (G == 1) {
          g.wei = ws;
          g.wei_strides = plain;
        } else {
          g.wei = {G, M / G, C / G};
          g.wei.insert(g.wei.end(), ws.begin() + 2, ws.end());
          g.wei_strides = {plain[0] * (M / G), plain[0], plain[1]};
          g.wei_strides.insert(g.wei_strides.end(), plain.begin() + 2, plain.end());
        }
        fill_geom(g, w, one_d);
        if (dnn::conv(g, x.data<float>(), wt.data<float>(), b ? b->data<float>() : nullptr, y.data<float>(),
                      c.owner(1) ? *c.owner(1) : nullptr))
          return;
      }
    }
    if (nsp > 3) c.unsupported(fmt::format("no kernel for {} spatial dims", nsp));
    naive_conv<T>(x.data<T>(), wt.data<T>(), b ? b->data<T>() : nullptr, y.data<T>(), N, C, M, G, to3(w));
  });
  return one(std::move(y));
}

// ---------------------------------------------------------------------------------------------------------------
// ConvTranspose.

template <class T>
void naive_deconv(const T* x, const T* wt, const T* b, T* y, int64_t N, int64_t C, int64_t M, int64_t G, const W3& w) {
  // Here w.in is the input (X) spatial size and w.out the output (Y) one; W is [C, M/G, k...].
  const int64_t Cg = C / G, Mg = M / G;
  const int64_t isz = w.in[0] * w.in[1] * w.in[2], osz = w.out[0] * w.out[1] * w.out[2];
  const int64_t ksz = w.k[0] * w.k[1] * w.k[2];
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t m = 0; m < M; ++m) std::fill_n(y + (n * M + m) * osz, osz, b ? b[m] : T(0));
    for (int64_t ci = 0; ci < C; ++ci) {
      const int64_t g = ci / Cg;
      const T* xi = x + (n * C + ci) * isz;
      for (int64_t mo = 0; mo < Mg; ++mo) {
        const T* wi = wt + (ci * Mg + mo) * ksz;
        T* yo = y + (n * M + g * Mg + mo) * osz;
        for (int64_t i0 = 0; i0 < w.in[0]; ++i0)
          for (int64_t i1 = 0; i1 < w.in[1]; ++i1)
            for (int64_t i2 = 0; i2 < w.in[2]; ++i2) {
              const T xv = xi[(i0 * w.in[1] + i1) * w.in[2] + i2];
              for_each_tap(w, i0, i1, i2, w.out, [&](int64_t at, int64_t kat) { yo[at] += xv * wi[kat]; });
            }
      }
    }
  }
}

/// (x - x_zero_point) conv (w - w_zero_point) with Conv's attributes, computed in float64 (exact while the sums stay
/// below 2^53) and returned as int32 [N, M, ...]. w_zero_point is a scalar or per output channel [M].
Tensor integer_conv(const Ctx& c, const Tensor& x, const Tensor* xzp, const Tensor& w, const Tensor* wzp) {
  Tensor xd = cast_tensor(c, x, DType::kFloat64), wd = cast_tensor(c, w, DType::kFloat64);
  if (xzp) {
    const double z = cast_tensor(c, *xzp, DType::kFloat64).data<double>()[0];
    for (int64_t i = 0; i < xd.numel(); ++i) xd.data<double>()[i] -= z;
  }
  if (wzp) {
    const Tensor z = cast_tensor(c, *wzp, DType::kFloat64);
    const int64_t M = w.shape.empty() ? 1 : w.shape[0], per = M ? wd.numel() / M : 0;
    if (z.numel() != 1 && z.numel() != M) c.fail("w_zero_point must be a scalar or have one entry per output channel");
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < per; ++i) wd.data<double>()[m * per + i] -= z.data<double>()[z.numel() == 1 ? 0 : m];
  }
  Node n = c.node;
  n.op_type = "Conv";
  const std::vector<const Tensor*> ins{&xd, &wd};
  const Ctx cc{n, ins, c.opset};
  Tensor y = conv_kernel(cc)[0];
  Tensor out(DType::kInt32, y.shape);
  for (int64_t i = 0; i < y.numel(); ++i)
    out.data<int32_t>()[i] = static_cast<int32_t>(std::llround(y.data<double>()[i]));
  return out;
}

/// ConvInteger (opset 10): int32 result of the zero-point-shifted convolution.
std::vector<Tensor> conv_integer_kernel(const Ctx& c) {
  return one(integer_conv(c, c.req(0), c.in(2), c.req(1), c.in(3)));
}

/// QLinearConv (opset 10): y = saturate(round((conv + B) * x_scale * w_scale / y_scale) + y_zero_point), w_scale
/// per tensor or per output channel; y has y_zero_point's type (uint8 / int8).
std::vector<Tensor> qlinear_conv_kernel(const Ctx& c) {
  const Tensor acc = integer_conv(c, c.req(0), &c.req(2), c.req(3), &c.req(5));
  const float xs = cast_tensor(c, c.req(1), DType::kFloat32).data<float>()[0];
  const Tensor ws = cast_tensor(c, c.req(4), DType::kFloat32);
  const float ys = cast_tensor(c, c.req(6), DType::kFloat32).data<float>()[0];
  const Tensor& yz = c.req(7);
  const Tensor* bias = c.in(8);
  const int64_t N = acc.shape[0], M = acc.shape[1], inner = acc.numel() / std::max<int64_t>(1, N * M);
  const int32_t z = static_cast<int32_t>(cast_tensor(c, yz, DType::kInt64).data<int64_t>()[0]);
  if (bias && (bias->dtype != DType::kInt32 || bias->numel() != M))
    c.fail("B must be int32 with one entry per output channel");
  if (ws.numel() != 1 && ws.numel() != M) c.fail("w_scale must be a scalar or have one entry per output channel");
  Tensor out(yz.dtype, acc.shape);
  auto run = [&]<class T>() {
    constexpr float lo = static_cast<float>(std::numeric_limits<T>::lowest());
    constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) {
        const float scale = xs * ws.data<float>()[ws.numel() == 1 ? 0 : m] / ys;
        const int32_t bv = bias ? bias->data<int32_t>()[m] : 0;
        const int32_t* a = acc.data<int32_t>() + (n * M + m) * inner;
        T* o = out.data<T>() + (n * M + m) * inner;
        for (int64_t i = 0; i < inner; ++i)
          o[i] = static_cast<T>(std::min(
              hi, std::max(lo, std::nearbyint(static_cast<float>(a[i] + bv) * scale) + static_cast<float>(z))));
      }
  };
  switch (yz.dtype) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kInt8: run.template operator()<int8_t>(); break;
    default: c.bad_dtype(yz.dtype);
  }
  return one(std::move(out));
}

std::vector<Tensor> conv_transpose_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& wt = c.req(1);
  const Tensor* b = c.in(2);
  const std::vector<int64_t> in = conv_operands(c, x, wt, b);
  const size_t nsp = in.size();
  const int64_t N = x.shape[0], C = x.shape[1], G = c.node.i("group", 1);
  const int64_t M = G > 0 ? wt.shape[1] * G : 0;
  check_groups(c, G > 0 && C % G == 0 && wt.shape[0] == C, x, wt, b, G, M);
  const Window w = make_deconv_window(c, in, std::vector<int64_t>(wt.shape.begin() + 2, wt.shape.end()));
  Tensor y(x.dtype, out_shape(N, M, w.out));
  if (y.numel() == 0) return one(std::move(y));
  dispatch_float(c, x.dtype, [&]<class T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (nsp <= 3 && x.numel() > 0 && wt.numel() > 0) {
        const bool one_d = nsp == 1;
        dnn::ConvGeom g;
        g.deconv = true;
        g.src = with_unit(x.shape, one_d);
        g.dst = with_unit(y.shape, one_d);
        const std::vector<int64_t> ws = with_unit(wt.shape, one_d);  // [C, M/G, k...]
        const std::vector<int64_t> plain = contiguous_strides(ws);
        const int64_t Cg = C / G, Mg = M / G;
        g.wei = {G, Mg, Cg};
        g.wei_strides = {plain[0] * Cg, plain[1], plain[0]};
        g.wei.insert(g.wei.end(), ws.begin() + 2, ws.end());
        g.wei_strides.insert(g.wei_strides.end(), plain.begin() + 2, plain.end());
        if (G == 1) {
          g.wei.erase(g.wei.begin());
          g.wei_strides.erase(g.wei_strides.begin());
        }
        g.strides = w.s;
        for (int64_t d : w.d) g.dilations.push_back(d - 1);
        g.pad_l = w.pl;
        // oneDNN: out = (in-1)*s + ext - pl - pr; output_padding / output_shape show up as a smaller pr.
        for (size_t i = 0; i < nsp; ++i) g.pad_r.push_back((in[i] - 1) * w.s[i] + w.ext(i) - w.pl[i] - w.out[i]);
        if (one_d) {
          g.strides.insert(g.strides.begin(), 1);
          g.dilations.insert(g.dilations.begin(), 0);
          g.pad_l.insert(g.pad_l.begin(), 0);
          g.pad_r.insert(g.pad_r.begin(), 0);
        }
        if (dnn::conv(g, x.data<float>(), wt.data<float>(), b ? b->data<float>() : nullptr, y.data<float>(),
                      c.owner(1) ? *c.owner(1) : nullptr))
          return;
      }
    }
    if (nsp > 3) c.unsupported(fmt::format("no kernel for {} spatial dims", nsp));
    naive_deconv<T>(x.data<T>(), wt.data<T>(), b ? b->data<T>() : nullptr, y.data<T>(), N, C, M, G, to3(w));
  });
  return one(std::move(y));
}

// ---------------------------------------------------------------------------------------------------------------
// Pools.

enum class PoolOp { kMax, kAvg, kLp };

/// Naive pooling over [NC, spatial] planes. Avg divides by the kernel positions inside [-pl, in+pr) when
/// include_pad, else by those inside [0, in). idx (may be null) receives MaxPool indices (row-major or, with
/// col_major, column-major over the spatial dims, plus the plane offset).
template <PoolOp op, class T>
void naive_pool(const T* x, T* y, int64_t* idx, int64_t planes, const Window& win, bool include_pad, double p,
                bool col_major) {
  const W3 w = to3(win);
  int64_t pr3[3] = {0, 0, 0};
  for (size_t i = 0; i < win.n(); ++i) pr3[3 - win.n() + i] = win.pr[i];
  const int64_t isz = w.in[0] * w.in[1] * w.in[2], osz = w.out[0] * w.out[1] * w.out[2];
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xi = x + pl * isz;
    for (int64_t o0 = 0; o0 < w.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < w.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < w.out[2]; ++o2) {
          double acc = op == PoolOp::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
          T best = std::numeric_limits<T>::lowest();
          int64_t best_i = -1, cnt_valid = 0, cnt_pad = 0;
          for (int64_t k0 = 0; k0 < w.k[0]; ++k0) {
            const int64_t i0 = o0 * w.s[0] - w.pl[0] + k0 * w.d[0];
            if (i0 < -w.pl[0] || i0 >= w.in[0] + pr3[0]) continue;
            const bool v0 = i0 >= 0 && i0 < w.in[0];
            for (int64_t k1 = 0; k1 < w.k[1]; ++k1) {
              const int64_t i1 = o1 * w.s[1] - w.pl[1] + k1 * w.d[1];
              if (i1 < -w.pl[1] || i1 >= w.in[1] + pr3[1]) continue;
              const bool v1 = v0 && i1 >= 0 && i1 < w.in[1];
              for (int64_t k2 = 0; k2 < w.k[2]; ++k2) {
                const int64_t i2 = o2 * w.s[2] - w.pl[2] + k2 * w.d[2];
                if (i2 < -w.pl[2] || i2 >= w.in[2] + pr3[2]) continue;
                ++cnt_pad;
                if (!(v1 && i2 >= 0 && i2 < w.in[2])) continue;
                ++cnt_valid;
                const int64_t off = (i0 * w.in[1] + i1) * w.in[2] + i2;
                const T v = xi[off];
                if constexpr (op == PoolOp::kMax) {
                  if (best_i < 0 || v > best) {
                    best = v;
                    best_i = col_major ? (i2 * w.in[1] + i1) * w.in[0] + i0 : off;
                  }
                } else if constexpr (op == PoolOp::kAvg) {
                  acc += static_cast<double>(v);
                } else {
                  acc += std::pow(std::abs(static_cast<double>(v)), p);
                }
              }
            }
          }
          const int64_t oo = pl * osz + (o0 * w.out[1] + o1) * w.out[2] + o2;
          if constexpr (op == PoolOp::kMax) {
            y[oo] = best;
            if (idx) idx[oo] = pl * isz + best_i;
          } else if constexpr (op == PoolOp::kAvg) {
            const int64_t cnt = include_pad ? cnt_pad : cnt_valid;
            y[oo] = static_cast<T>(cnt > 0 ? acc / static_cast<double>(cnt) : 0.0);
          } else {
            y[oo] = static_cast<T>(std::pow(acc, 1.0 / p));
          }
        }
  }
}

template <PoolOp op>
std::vector<Tensor> pool_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> in = spatial(c, x);
  const size_t nsp = in.size();
  const std::vector<int64_t> k = c.node.ints("kernel_shape");
  if (k.empty()) c.fail("missing attribute 'kernel_shape'");
  const bool ceil_mode = c.node.i("ceil_mode", 0) != 0;
  const Window w = make_window(c, in, k, ceil_mode, op != PoolOp::kLp || c.opset >= 18);
  const int64_t N = x.shape[0], C = x.shape[1];
  std::vector<Tensor> outs;
  outs.reserve(2);
  outs.emplace_back(x.dtype, out_shape(N, C, w.out));
  Tensor& y = outs[0];
  const bool want_idx = op == PoolOp::kMax && c.n_out() > 1;
  if (want_idx) outs.emplace_back(DType::kInt64, y.shape);
  const bool include_pad = c.node.i("count_include_pad", 0) != 0;
  const bool col_major = c.node.i("storage_order", 0) != 0;
  const double p = static_cast<double>(c.node.i("p", 2));
  if (y.numel() == 0) return outs;
  auto run = [&]<class T>() {
    if constexpr (std::is_same_v<T, float>) {
      const std::vector<int64_t> pr = dnnl_pad_r(w);
      // oneDNN's include-padding average counts the ceil_mode overhang too; ONNX does not.
      bool fits = op != PoolOp::kLp && !want_idx && nsp <= 3;
      if (op == PoolOp::kAvg && include_pad)
        for (size_t i = 0; i < nsp; ++i) fits = fits && pr[i] == w.pr[i];
      for (size_t i = 0; i < nsp; ++i) fits = fits && pr[i] >= 0 && w.pl[i] < w.ext(i) && pr[i] < w.ext(i);
      if (fits) {
        const bool one_d = nsp == 1;
        std::vector<int64_t> dl, plv = w.pl, prv = pr, kv = w.k, sv = w.s;
        for (int64_t d : w.d) dl.push_back(d - 1);
        if (one_d) {
          dl.insert(dl.begin(), 0);
          plv.insert(plv.begin(), 0);
          prv.insert(prv.begin(), 0);
          kv.insert(kv.begin(), 1);
          sv.insert(sv.begin(), 1);
        }
        const dnn::Pool alg = op == PoolOp::kMax ? dnn::Pool::kMax
                              : include_pad      ? dnn::Pool::kAvgInclPad
                                                 : dnn::Pool::kAvgExclPad;
        if (dnn::pool(alg, x.data<float>(), y.data<float>(), with_unit(x.shape, one_d), with_unit(y.shape, one_d), kv,
                      sv, dl, plv, prv))
          return;
      }
    }
    if (nsp > 3) c.unsupported(fmt::format("no kernel for {} spatial dims", nsp));
    naive_pool<op, T>(x.data<T>(), y.data<T>(), want_idx ? outs[1].data<int64_t>() : nullptr, N * C, w, include_pad, p,
                      col_major);
  };
  if constexpr (op == PoolOp::kMax) {
    switch (x.dtype) {
      case DType::kInt8: run.template operator()<int8_t>(); break;
      case DType::kUInt8: run.template operator()<uint8_t>(); break;
      default: dispatch_float(c, x.dtype, run);
    }
  } else {
    dispatch_float(c, x.dtype, run);
  }
  return outs;
}

template <PoolOp op>
std::vector<Tensor> global_pool_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> in = spatial(c, x);
  const int64_t planes = x.shape[0] * x.shape[1], sz = num_elements(in);
  Tensor y(x.dtype, out_shape(x.shape[0], x.shape[1], std::vector<int64_t>(in.size(), 1)));
  const double p = static_cast<double>(c.node.i("p", 2));
  dispatch_float(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    T* d = y.data<T>();
    for (int64_t i = 0; i < planes; ++i) {
      const T* r = s + i * sz;
      if constexpr (op == PoolOp::kMax) {
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < sz; ++j) m = std::max(m, r[j]);
        d[i] = m;
      } else if constexpr (op == PoolOp::kAvg) {
        double acc = 0;
        for (int64_t j = 0; j < sz; ++j) acc += r[j];
        d[i] = static_cast<T>(acc / static_cast<double>(sz));
      } else {
        double acc = 0;
        for (int64_t j = 0; j < sz; ++j) acc += std::pow(std::abs(static_cast<double>(r[j])), p);
        d[i] = static_cast<T>(std::pow(acc, 1.0 / p));
      }
    }
  });
  return one(std::move(y));
}

// ---------------------------------------------------------------------------------------------------------------
// DepthToSpace / SpaceToDepth (as a 6-D transpose).

Tensor permute(const Tensor& x, const Shape& view, const std::vector<int64_t>& perm, const Shape& os) {
  const std::vector<int64_t> vs = contiguous_strides(view);
  Shape pshape(perm.size());
  std::vector<int64_t> st(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    pshape[i] = view[perm[i]];
    st[i] = vs[perm[i]];
  }
  Tensor out(x.dtype, os);
  const std::vector<int64_t> ds = contiguous_strides(pshape);
  strided_copy(out.bytes.data(), ds.data(), x.bytes.data(), st.data(), pshape, dtype_size(x.dtype));
  return out;
}

std::vector<Tensor> depth_to_space_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() != 4) c.fail("input must be 4-D");
  const int64_t b = c.node.i("blocksize", 0);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (b <= 0 || C % (b * b) != 0) c.fail(fmt::format("channels {} not divisible by blocksize^2 ({})", C, b));
  const Shape os{N, C / (b * b), H * b, W * b};
  if (c.node.s("mode", "DCR") == "DCR") return one(permute(x, {N, b, b, C / (b * b), H, W}, {0, 3, 4, 1, 5, 2}, os));
  return one(permute(x, {N, C / (b * b), b, b, H, W}, {0, 1, 4, 2, 5, 3}, os));
}

std::vector<Tensor> space_to_depth_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() != 4) c.fail("input must be 4-D");
  const int64_t b = c.node.i("blocksize", 0);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (b <= 0 || H % b != 0 || W % b != 0) c.fail(fmt::format("spatial dims not divisible by blocksize {}", b));
  return one(permute(x, {N, C, H / b, b, W / b, b}, {0, 3, 5, 1, 2, 4}, {N, C * b * b, H / b, W / b}));
}

}  // namespace

void register_conv_pool(KernelTable& t) {
  t["Conv"] = conv_kernel;
  t["ConvInteger"] = conv_integer_kernel;
  t["QLinearConv"] = qlinear_conv_kernel;
  t["ConvTranspose"] = conv_transpose_kernel;
  t["MaxPool"] = pool_kernel<PoolOp::kMax>;
  t["AveragePool"] = pool_kernel<PoolOp::kAvg>;
  t["LpPool"] = pool_kernel<PoolOp::kLp>;
  t["GlobalMaxPool"] = global_pool_kernel<PoolOp::kMax>;
  t["GlobalAveragePool"] = global_pool_kernel<PoolOp::kAvg>;
  t["GlobalLpPool"] = global_pool_kernel<PoolOp::kLp>;
  t["DepthToSpace"] = depth_to_space_kernel;
  t["SpaceToDepth"] = space_to_depth_kernel;
}

}  // namespace gspmd::kern
