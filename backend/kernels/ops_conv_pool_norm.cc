// The normalizations of the conv/pool family (core/rules/conv_pool.cc; its convolutions and pools are in
// ops_conv_pool.cc): BatchNormalization (inference; training mode from opset 14), InstanceNormalization, LRN,
// MeanVarianceNormalization. Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset. Plain C++
// (memory-bound).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"

namespace gspmd::kern {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Normalizations.

/// Per-channel parameter vector of length C (or per element of [C, spatial] for opset < 9 spatial=0).
template <class T>
const T* param(const Ctx& c, size_t i, const Tensor& x, int64_t C, int64_t inner, bool& per_elem) {
  const Tensor& t = c.req(i);
  if (t.dtype != x.dtype)
    c.fail(fmt::format("input {} has dtype {}, X has {}", i, dtype_name(t.dtype), dtype_name(x.dtype)));
  if (t.numel() == C) return t.data<T>();
  if (t.numel() == C * inner && inner > 1) {
    per_elem = true;
    return t.data<T>();
  }
  c.fail(fmt::format("input {} of shape {} does not match {} channels", i, shape_str(t.shape), C));
}

/// BatchNormalization in training mode (opset >= 14): batch statistics over every dim but 1 (population variance),
/// Y normalised with them; outputs running_mean = mean * momentum + batch_mean * (1 - momentum), and the same for
/// the variance (the ONNX reference, onnx/backend/test/case/node/batchnorm.py).
std::vector<Tensor> batch_norm_training(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() < 2) c.fail(fmt::format("X must have rank >= 2, got {}", shape_str(x.shape)));
  const double eps = c.node.f("epsilon", 1e-5f), momentum = c.node.f("momentum", 0.9f);
  const int64_t N = x.shape[0], C = x.shape[1], inner = x.numel() / std::max<int64_t>(1, N * C);
  std::vector<Tensor> outs;
  outs.emplace_back(x.dtype, x.shape);
  for (size_t o = 1; o < std::min<size_t>(3, c.n_out()); ++o) outs.emplace_back(x.dtype, Shape{C});
  dispatch_float(c, x.dtype, [&]<class T>() {
    for (int i = 1; i <= 4; ++i) {
      const Tensor& p = c.req(static_cast<size_t>(i));
      if (p.dtype != x.dtype || p.numel() != C)
        c.fail(fmt::format("input {} of shape {} does not match {} channels", i, shape_str(p.shape), C));
    }
    const T* sc = c.req(1).data<T>();
    const T* bi = c.req(2).data<T>();
    const T* rm = c.req(3).data<T>();
    const T* rv = c.req(4).data<T>();
    const T* s = x.data<T>();
    T* d = outs[0].data<T>();
    const double cnt = static_cast<double>(N * inner);
    for (int64_t ch = 0; ch < C; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < N; ++n) {
        const T* row = s + (n * C + ch) * inner;
        for (int64_t j = 0; j < inner; ++j) sum += static_cast<double>(row[j]);
      }
      const double mean = cnt > 0 ? sum / cnt : 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const T* row = s + (n * C + ch) * inner;
        for (int64_t j = 0; j < inner; ++j) {
          const double v = static_cast<double>(row[j]) - mean;
          sq += v * v;
        }
      }
      const double var = cnt > 0 ? sq / cnt : 0.0;
      const double a = static_cast<double>(sc[ch]) / std::sqrt(var + eps);
      const T mul = static_cast<T>(a), add = static_cast<T>(static_cast<double>(bi[ch]) - a * mean);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t o = (n * C + ch) * inner;
        for (int64_t j = 0; j < inner; ++j) d[o + j] = s[o + j] * mul + add;
      }
      if (outs.size() > 1) outs[1].data<T>()[ch] = static_cast<T>(rm[ch] * momentum + mean * (1 - momentum));
      if (outs.size() > 2) outs[2].data<T>()[ch] = static_cast<T>(rv[ch] * momentum + var * (1 - momentum));
    }
  });
  return outs;
}

std::vector<Tensor> batch_norm_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const bool training = c.node.i("training_mode", 0) != 0 || c.n_out() > 1;
  if (training && c.opset >= 14) return batch_norm_training(c);
  if (training) c.unsupported("no kernel for training-mode outputs before opset 14 (saved statistics)");
  if (x.shape.size() < 2) c.fail(fmt::format("X must have rank >= 2, got {}", shape_str(x.shape)));
  const float eps = c.node.f("epsilon", 1e-5f);
  const int64_t N = x.shape[0], C = x.shape[1], inner = x.numel() / std::max<int64_t>(1, N * C);
  Tensor y(x.dtype, x.shape);
  if (y.numel() == 0) return one(std::move(y));
  dispatch_float(c, x.dtype, [&]<class T>() {
    bool pe[4] = {false, false, false, false};
    const T* sc = param<T>(c, 1, x, C, inner, pe[0]);
    const T* bi = param<T>(c, 2, x, C, inner, pe[1]);
    const T* mu = param<T>(c, 3, x, C, inner, pe[2]);
    const T* va = param<T>(c, 4, x, C, inner, pe[3]);
    const T* s = x.data<T>();
    T* d = y.data<T>();
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t j = 0; j < inner; ++j) {
        auto at = [&](const T* p, bool e) { return e ? p[ch * inner + j] : p[ch]; };
        const double a = static_cast<double>(at(sc, pe[0])) /
                         std::sqrt(static_cast<double>(at(va, pe[3])) + static_cast<double>(eps));
        const T mul = static_cast<T>(a), add = static_cast<T>(at(bi, pe[1]) - a * at(mu, pe[2]));
        for (int64_t n = 0; n < N; ++n) {
          const int64_t o = (n * C + ch) * inner + j;
          d[o] = s[o] * mul + add;
        }
        if (!pe[0] && !pe[1] && !pe[2] && !pe[3] && inner > 1) {
          // Per-channel params: finish the whole channel row with the same mul/add.
          for (int64_t n = 0; n < N; ++n) {
            const int64_t o = (n * C + ch) * inner;
            for (int64_t jj = 1; jj < inner; ++jj) d[o + jj] = s[o + jj] * mul + add;
          }
          break;
        }
      }
  });
  return one(std::move(y));
}

std::vector<Tensor> instance_norm_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() < 3) c.fail(fmt::format("X must have rank >= 3, got {}", shape_str(x.shape)));
  const float eps = c.node.f("epsilon", 1e-5f);
  const int64_t N = x.shape[0], C = x.shape[1], inner = x.numel() / std::max<int64_t>(1, N * C);
  Tensor y(x.dtype, x.shape);
  if (y.numel() == 0) return one(std::move(y));
  dispatch_float(c, x.dtype, [&]<class T>() {
    bool pe = false;
    const T* sc = param<T>(c, 1, x, C, 1, pe);
    const T* bi = param<T>(c, 2, x, C, 1, pe);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t ch = 0; ch < C; ++ch) {
        const T* s = x.data<T>() + (n * C + ch) * inner;
        T* d = y.data<T>() + (n * C + ch) * inner;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < inner; ++j) mean += s[j];
        mean /= static_cast<double>(inner);
        for (int64_t j = 0; j < inner; ++j) var += (s[j] - mean) * (s[j] - mean);
        var /= static_cast<double>(inner);
        const double a = static_cast<double>(sc[ch]) / std::sqrt(var + static_cast<double>(eps));
        for (int64_t j = 0; j < inner; ++j) d[j] = static_cast<T>((s[j] - mean) * a + static_cast<double>(bi[ch]));
      }
  });
  return one(std::move(y));
}

std::vector<Tensor> lrn_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() < 2) c.fail(fmt::format("X must have rank >= 2, got {}", shape_str(x.shape)));
  if (!c.node.has("size")) c.fail("missing attribute 'size'");
  const int64_t size = c.node.i("size");
  const double alpha = c.node.f("alpha", 1e-4f), beta = c.node.f("beta", 0.75f), bias = c.node.f("bias", 1.f);
  const int64_t N = x.shape[0], C = x.shape[1], inner = x.numel() / std::max<int64_t>(1, N * C);
  const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;  // floor / ceil of (size-1)/2
  Tensor y(x.dtype, x.shape);
  dispatch_float(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    T* d = y.data<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t ch = 0; ch < C; ++ch)
        for (int64_t j = 0; j < inner; ++j) {
          double sq = 0;
          for (int64_t cc = std::max<int64_t>(0, ch - lo); cc <= std::min(C - 1, ch + hi); ++cc) {
            const double v = s[(n * C + cc) * inner + j];
            sq += v * v;
          }
          const int64_t o = (n * C + ch) * inner + j;
          d[o] = static_cast<T>(s[o] / std::pow(bias + alpha / static_cast<double>(size) * sq, beta));
        }
  });
  return one(std::move(y));
}

std::vector<Tensor> mvn_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> axes = c.node.ints("axes", {0, 2, 3});
  Shape kd = x.shape;
  int64_t cnt = 1;
  std::vector<char> red(r, 0);
  for (int64_t a : axes) red[c.axis(a, r)] = 1;
  for (int64_t i = 0; i < r; ++i)
    if (red[i]) {
      cnt *= x.shape[i];
      kd[i] = 1;
    }
  Tensor y(x.dtype, x.shape);
  if (y.numel() == 0) return one(std::move(y));
  dispatch_float(c, x.dtype, [&]<class T>() {
    std::vector<double> sum(static_cast<size_t>(num_elements(kd)), 0.0), sq(sum.size(), 0.0);
    const std::vector<int64_t> so = broadcast_strides(kd, x.shape);
    const T* s = x.data<T>();
    T* d = y.data<T>();
    std::vector<int64_t> idx(r, 0);
    auto walk = [&](auto&& f) {
      std::fill(idx.begin(), idx.end(), 0);
      for (int64_t k = 0; k < x.numel(); ++k) {
        int64_t off = 0;
        for (int64_t i = 0; i < r; ++i) off += idx[i] * so[i];
        f(k, off);
        for (int64_t i = r - 1; i >= 0; --i) {
          if (++idx[i] < x.shape[i]) break;
          idx[i] = 0;
        }
      }
    };
    walk([&](int64_t k, int64_t o) {
      sum[o] += s[k];
      sq[o] += static_cast<double>(s[k]) * s[k];
    });
    for (size_t i = 0; i < sum.size(); ++i) {
      sum[i] /= static_cast<double>(cnt);
      sq[i] = std::sqrt(std::max(0.0, sq[i] / static_cast<double>(cnt) - sum[i] * sum[i])) + 1e-9;
    }
    walk([&](int64_t k, int64_t o) { d[k] = static_cast<T>((s[k] - sum[o]) / sq[o]); });
  });
  return one(std::move(y));
}

}  // namespace

void register_conv_pool_norm(KernelTable& t) {
  t["BatchNormalization"] = batch_norm_kernel;
  t["InstanceNormalization"] = instance_norm_kernel;
  t["LRN"] = lrn_kernel;
  t["MeanVarianceNormalization"] = mvn_kernel;
}

}  // namespace gspmd::kern
