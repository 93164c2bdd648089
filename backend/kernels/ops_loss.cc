// Loss kernels: NegativeLogLikelihoodLoss (opset 12/13) and SoftmaxCrossEntropyLoss (opset 12/13), plain C++.
// Both gather -input[n, target[n, d], d] over an [N, C, D] view (D = product of the trailing dims, 1 for [N, C]),
// weighted by weight[target] (1 without weights; 0 where target == ignore_index), then reduce: "none" keeps the
// [N, d1..dk] shape, "sum" sums, "mean" divides the sum by the sum of the gathered weights (by N*D without weights
// nor ignore_index), as the ONNX reference implementations do.
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "core/shapes/geometry.h"

namespace gspmd::kern {
namespace {

// Shape rules shared with the shape functions (core/shapes/geometry.h).
using shapes::check_loss_operands;

/// logp: [N, C, D] log-probabilities (or the NLL input), target [N, D]. Returns the loss tensor.
template <class T>
Tensor nll(const Ctx& c, const T* logp, const Tensor& target, const Tensor* weight, DType dt, int64_t N, int64_t C,
           int64_t D, const Shape& target_shape) {
  const std::string reduction = c.node.s("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    c.fail(fmt::format("unknown reduction '{}'", reduction));
  std::optional<int64_t> ignore;
  if (c.node.has("ignore_index")) ignore = c.node.i("ignore_index");
  const std::vector<int64_t> tgt = target.as_int64s();
  const T* w = nullptr;
  if (weight) {
    if (weight->dtype != dt || weight->shape != Shape{C})
      c.fail(fmt::format("weight must be {} [{}], got {} {}", dtype_name(dt), C, dtype_name(weight->dtype),
                         shape_str(weight->shape)));
    w = weight->data<T>();
  }
  std::vector<T> loss(static_cast<size_t>(N * D));
  double sum = 0, wsum = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* base = logp + n * C * D;
    for (int64_t d = 0; d < D; ++d) {
      const int64_t t = tgt[static_cast<size_t>(n * D + d)];
      double wt = 1;
      T v = T(0);
      if (ignore && t == *ignore) {
        wt = 0;
      } else {
        if (t < 0 || t >= C) c.bad_data(fmt::format("target {} is out of range [0, {})", t, C));
        if (w) wt = static_cast<double>(w[t]);
        v = static_cast<T>(-static_cast<double>(base[t * D + d]) * wt);
      }
      loss[static_cast<size_t>(n * D + d)] = v;
      sum += static_cast<double>(v);
      wsum += wt;
    }
  }
  if (reduction == "none") {
    Tensor out(dt, target_shape);
    std::copy(loss.begin(), loss.end(), out.data<T>());
    return out;
  }
  Tensor out(dt, {});
  if (reduction == "sum")
    out.data<T>()[0] = static_cast<T>(sum);
  else
    out.data<T>()[0] = static_cast<T>(w || ignore ? sum / wsum : sum / static_cast<double>(N * D));
  return out;
}

/// Checks input [N, C, d1..dk] against target [N, d1..dk]; returns {N, C, D}.
std::array<int64_t, 3> loss_dims(const Ctx& c, const Tensor& x, const Tensor& target) {
  check_loss_operands(c, x.shape, target.dtype, target.shape);
  int64_t D = 1;
  for (size_t i = 2; i < x.shape.size(); ++i) D *= x.shape[i];
  return {x.shape[0], x.shape[1], D};
}

std::vector<Tensor> nll_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& target = c.req(1);
  const auto [N, C, D] = loss_dims(c, x, target);
  Tensor out;
  dispatch_float(c, x.dtype, [&, N = N, C = C, D = D]<class T>() {
    out = nll<T>(c, x.data<T>(), target, c.in(2), x.dtype, N, C, D, target.shape);
  });
  return one(std::move(out));
}

std::vector<Tensor> sce_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& target = c.req(1);
  const auto [N, C, D] = loss_dims(c, x, target);
  Tensor logp(x.dtype, x.shape);
  dispatch_float(c, x.dtype, [&, N = N, C = C, D = D]<class T>() {
    // log_softmax over C with D contiguous: per n, running max / sum over rows of D elements.
    std::vector<double> mx(static_cast<size_t>(D)), s(static_cast<size_t>(D));
    for (int64_t n = 0; n < N; ++n) {
      const T* xi = x.data<T>() + n * C * D;
      T* lo = logp.data<T>() + n * C * D;
      std::fill(mx.begin(), mx.end(), -INFINITY);
      std::fill(s.begin(), s.end(), 0.0);
      for (int64_t k = 0; k < C; ++k)
        for (int64_t d = 0; d < D; ++d) mx[d] = std::max(mx[d], static_cast<double>(xi[k * D + d]));
      for (int64_t k = 0; k < C; ++k)
        for (int64_t d = 0; d < D; ++d) s[d] += std::exp(static_cast<double>(xi[k * D + d]) - mx[d]);
      for (int64_t d = 0; d < D; ++d) s[d] = mx[d] + std::log(s[d]);
      for (int64_t k = 0; k < C; ++k)
        for (int64_t d = 0; d < D; ++d) lo[k * D + d] = static_cast<T>(static_cast<double>(xi[k * D + d]) - s[d]);
    }
  });
  std::vector<Tensor> outs;
  dispatch_float(c, x.dtype, [&, N = N, C = C, D = D]<class T>() {
    outs.push_back(nll<T>(c, logp.data<T>(), target, c.in(2), x.dtype, N, C, D, target.shape));
  });
  if (c.n_out() > 1) outs.push_back(std::move(logp));
  return outs;
}

}  // namespace

void register_loss(KernelTable& t) {
  t["NegativeLogLikelihoodLoss"] = nll_kernel;
  t["SoftmaxCrossEntropyLoss"] = sce_kernel;
}

}  // namespace gspmd::kern
