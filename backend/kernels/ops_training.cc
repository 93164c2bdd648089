// Optimizer kernels of the ai.onnx.preview.training domain (opset 1): Adagrad, Adam, Momentum, float32/float64,
// any number of (X, G, state) groups; formulas and attribute defaults of the ONNX schemas (onnx/defs/training/defs.cc).
// Registered as "ai.onnx.preview.training:<Op>" (run_kernel looks the domain up by that key).
#include <cmath>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "core/shapes/geometry.h"

namespace gspmd::kern {
namespace {

// Shape rules shared with the shape functions (core/shapes/geometry.h).
using shapes::optimizer_arity;

/// Inputs R (scalar learning rate), T (scalar int64 step), then `groups` lists of n tensors each. Returns n.
size_t optimizer_arity(const Ctx& c, size_t groups) {
  return optimizer_arity(c, c.ins.size(), groups, [&](size_t i) {
    const Tensor& t = c.req(i);
    return TensorType{t.dtype, t.shape};
  });
}

double scalar_of(const Ctx& c, size_t i) {
  const Tensor d = cast_tensor(c, c.req(i), DType::kFloat64);
  if (d.numel() != 1) c.fail(fmt::format("input {} must be a scalar", i));
  return d.data<double>()[0];
}

enum class Opt { kAdagrad, kAdam, kMomentum };

template <Opt opt>
std::vector<Tensor> optimizer_kernel(const Ctx& c) {
  constexpr size_t groups = opt == Opt::kMomentum ? 3 : opt == Opt::kAdagrad ? 3 : 4;
  const size_t n = optimizer_arity(c, groups);
  const double R = scalar_of(c, 0), T = scalar_of(c, 1);
  const double norm = c.node.f("norm_coefficient", 0.f);
  std::vector<Tensor> outs(n * (groups - 1));  // X_new..., then the states
  for (size_t k = 0; k < n; ++k) {
    const Tensor& X = c.req(2 + k);
    for (size_t g = 0; g + 1 < groups; ++g) outs[g * n + k] = Tensor(X.dtype, X.shape);
    dispatch_float(c, X.dtype, [&]<class F>() {
      const F* x = X.data<F>();
      const F* gr = c.req(2 + n + k).data<F>();
      F* xo = outs[k].data<F>();
      const int64_t m = X.numel();
      if constexpr (opt == Opt::kAdagrad) {
        const double decay = c.node.f("decay_factor", 0.f), eps = c.node.f("epsilon", 1e-6f);
        const double r = R / (1 + T * decay);
        const F* h = c.req(2 + 2 * n + k).data<F>();
        F* ho = outs[n + k].data<F>();
        for (int64_t i = 0; i < m; ++i) {
          const double gg = norm * static_cast<double>(x[i]) + static_cast<double>(gr[i]);
          const double hn = static_cast<double>(h[i]) + gg * gg;
          ho[i] = static_cast<F>(hn);
          xo[i] = static_cast<F>(static_cast<double>(x[i]) - r * gg / (std::sqrt(hn) + eps));
        }
      } else if constexpr (opt == Opt::kAdam) {
        const double alpha = c.node.f("alpha", 0.9f), beta = c.node.f("beta", 0.999f), eps = c.node.f("epsilon", 1e-6f),
                     post = c.node.f("norm_coefficient_post", 0.f);
        const double r = T > 0 ? R * std::sqrt(1 - std::pow(beta, T)) / (1 - std::pow(alpha, T)) : R;
        const F* v = c.req(2 + 2 * n + k).data<F>();
        const F* h = c.req(2 + 3 * n + k).data<F>();
        F* vo = outs[n + k].data<F>();
        F* ho = outs[2 * n + k].data<F>();
        for (int64_t i = 0; i < m; ++i) {
          const double gg = norm * static_cast<double>(x[i]) + static_cast<double>(gr[i]);
          const double vn = alpha * static_cast<double>(v[i]) + (1 - alpha) * gg;
          const double hn = beta * static_cast<double>(h[i]) + (1 - beta) * gg * gg;
          vo[i] = static_cast<F>(vn);
          ho[i] = static_cast<F>(hn);
          xo[i] = static_cast<F>((1 - post) * (static_cast<double>(x[i]) - r * vn / (std::sqrt(hn) + eps)));
        }
      } else {
        const double alpha = c.node.f("alpha"), beta = c.node.f("beta");
        const std::string mode = c.node.s("mode", "standard");
        if (mode != "standard" && mode != "nesterov") c.fail(fmt::format("unknown mode '{}'", mode));
        const bool nesterov = mode == "nesterov";
        const double b = T > 0 ? beta : 1.0;
        const F* v = c.req(2 + 2 * n + k).data<F>();
        F* vo = outs[n + k].data<F>();
        for (int64_t i = 0; i < m; ++i) {
          const double gg = norm * static_cast<double>(x[i]) + static_cast<double>(gr[i]);
          const double vn = alpha * static_cast<double>(v[i]) + b * gg;
          vo[i] = static_cast<F>(vn);
          xo[i] = static_cast<F>(static_cast<double>(x[i]) - R * (nesterov ? gg + alpha * vn : vn));
        }
      }
    });
  }
  return outs;
}

}  // namespace

void register_training(KernelTable& t) {
  t["ai.onnx.preview.training:Adagrad"] = optimizer_kernel<Opt::kAdagrad>;
  t["ai.onnx.preview.training:Adam"] = optimizer_kernel<Opt::kAdam>;
  t["ai.onnx.preview.training:Momentum"] = optimizer_kernel<Opt::kMomentum>;
}

}  // namespace gspmd::kern
