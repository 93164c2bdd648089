// The reduce/normalize family (core/rules/reduce_norm.cc): Softmax, LogSoftmax, Hardmax, LayerNormalization (opset 17),
// ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp, ArgMax, ArgMin. Reference: the ONNX operator specs
// (onnx/docs/Operators.md) at the node's opset.
// float32 Softmax / LogSoftmax, LayerNormalization and the reductions other than LogSum/LogSumExp run on oneDNN
// (onednn.h); float64 / integer types, Hardmax and ArgMax / ArgMin run on plain C++ loops.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"

namespace gspmd::kern {
namespace {

constexpr size_t kDnnlMaxRank = 12;

// ---------------------------------------------------------------------------------------------------------------
// Softmax / LogSoftmax.

template <class T>
void naive_softmax(const T* in, T* out, int64_t outer, int64_t len, int64_t inner, bool log) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      const T* x = in + o * len * inner + j;
      T* y = out + o * len * inner + j;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < len; ++i) mx = std::max(mx, x[i * inner]);
      T sum = 0;
      for (int64_t i = 0; i < len; ++i) sum += std::exp(x[i * inner] - mx);
      for (int64_t i = 0; i < len; ++i)
        y[i * inner] = log ? x[i * inner] - mx - std::log(sum) : std::exp(x[i * inner] - mx) / sum;
    }
}

template <bool log>
std::vector<Tensor> softmax_kernel(const Ctx& c) {
  // in place when the input was donated: oneDNN's softmax and the loop below (max and sum first, then writes) both
  // allow dst == src
  Tensor* reuse = c.donated(0);
  Tensor out = reuse ? std::move(*reuse) : Tensor(c.req(0).dtype, c.req(0).shape);
  const Tensor& x = reuse ? out : c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  Shape dims;
  int64_t ax;
  if (c.opset < 13) {
    // Coerce to 2-D [prod(dims[:axis]), prod(dims[axis:])] and normalise each row.
    int64_t a = c.node.i("axis", 1);
    if (a < 0) a += r;
    if (a < 0 || a > r) c.fail(fmt::format("axis {} out of range for rank {}", c.node.i("axis", 1), r));
    int64_t outer = 1;
    for (int64_t i = 0; i < a; ++i) outer *= x.shape[i];
    dims = {outer, x.numel() / std::max<int64_t>(outer, 1)};
    if (outer == 0) dims[1] = 0;
    ax = 1;
  } else if (r == 0) {
    dims = {1};
    ax = 0;
  } else {
    dims = x.shape;
    ax = c.axis(c.node.i("axis", -1), r);
  }
  if (out.numel() == 0) return one(std::move(out));
  dispatch_float(c, x.dtype, [&]<class T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (dims.size() <= kDnnlMaxRank) {
        dnn::softmax(x.data<float>(), out.data<float>(), dims, static_cast<int>(ax), log);
        return;
      }
    }
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < ax; ++i) outer *= dims[i];
    for (size_t i = ax + 1; i < dims.size(); ++i) inner *= dims[i];
    naive_softmax<T>(x.data<T>(), out.data<T>(), outer, dims[ax], inner, log);
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Hardmax.

std::vector<Tensor> hardmax_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  int64_t outer = 1, len = 1, inner = 1;
  if (c.opset < 13) {
    int64_t a = c.node.i("axis", 1);
    if (a < 0) a += r;
    if (a < 0 || a > r) c.fail(fmt::format("axis {} out of range for rank {}", c.node.i("axis", 1), r));
    for (int64_t i = 0; i < a; ++i) outer *= x.shape[i];
    for (int64_t i = a; i < r; ++i) len *= x.shape[i];
  } else {
    if (r == 0) c.fail("input must have rank >= 1");
    const int64_t a = c.axis(c.node.i("axis", -1), r);
    for (int64_t i = 0; i < a; ++i) outer *= x.shape[i];
    len = x.shape[a];
    for (int64_t i = a + 1; i < r; ++i) inner *= x.shape[i];
  }
  Tensor out(x.dtype, x.shape);
  if (len == 0) return one(std::move(out));
  dispatch_float(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    T* d = out.data<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        int64_t best = 0;
        for (int64_t i = 1; i < len; ++i)
          if (s[(o * len + i) * inner + j] > s[(o * len + best) * inner + j]) best = i;
        d[(o * len + best) * inner + j] = T(1);
      }
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// LayerNormalization (opset 17).

template <class T>
void naive_layer_norm(const T* x, T* y, int64_t outer, int64_t inner, const T* scale, const T* bias, T eps, T* mean,
                      T* inv_std) {
  for (int64_t o = 0; o < outer; ++o) {
    const T* xr = x + o * inner;
    T* yr = y + o * inner;
    T mu = 0;
    for (int64_t i = 0; i < inner; ++i) mu += xr[i];
    mu /= static_cast<T>(inner);
    T var = 0;
    for (int64_t i = 0; i < inner; ++i) var += (xr[i] - mu) * (xr[i] - mu);
    var /= static_cast<T>(inner);
    const T is = T(1) / std::sqrt(var + eps);
    for (int64_t i = 0; i < inner; ++i) {
      T v = (xr[i] - mu) * is;
      if (scale) v *= scale[i];
      if (bias) v += bias[i];
      yr[i] = v;
    }
    if (mean) mean[o] = mu;
    if (inv_std) inv_std[o] = is;
  }
}

std::vector<Tensor> layer_norm_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r == 0) c.fail("input must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", -1), r);
  const float eps = c.node.f("epsilon", 1e-5f);
  const Shape norm_shape(x.shape.begin() + ax, x.shape.end());
  int64_t outer = 1;
  for (int64_t i = 0; i < ax; ++i) outer *= x.shape[i];
  const int64_t inner = num_elements(norm_shape);
  // Scale / bias as flat vectors of length `inner`.
  auto param = [&](size_t i, Tensor& holder) -> const Tensor* {
    const Tensor* t = c.in(i);
    if (!t) return nullptr;
    if (t->dtype != x.dtype)
      c.fail(fmt::format("input {} has dtype {}, X has {}", i, dtype_name(t->dtype), dtype_name(x.dtype)));
    if (t->numel() == inner) return t;
    if (t->shape.size() > norm_shape.size() || broadcast_shapes(c, t->shape, norm_shape) != norm_shape)
      c.fail(
          fmt::format("input {} of shape {} does not broadcast to {}", i, shape_str(t->shape), shape_str(norm_shape)));
    holder = broadcast_to(*t, norm_shape);
    return &holder;
  };
  Tensor sh, bh;
  const Tensor* scale = param(1, sh);
  const Tensor* bias = param(2, bh);
  Shape stat_shape(x.shape.begin(), x.shape.begin() + ax);
  stat_shape.resize(r, 1);
  std::vector<Tensor> outs;
  outs.emplace_back(x.dtype, x.shape);
  const size_t nout = std::min<size_t>(c.n_out(), 3);
  for (size_t i = 1; i < nout; ++i) outs.emplace_back(x.dtype, stat_shape);
  if (x.numel() == 0) return outs;
  dispatch_float(c, x.dtype, [&]<class T>() {
    T* mean = nout > 1 ? outs[1].data<T>() : nullptr;
    T* inv = nout > 2 ? outs[2].data<T>() : nullptr;
    const T* sp = scale ? scale->data<T>() : nullptr;
    const T* bp = bias ? bias->data<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      std::vector<float> var;
      if (inv) var.resize(static_cast<size_t>(outer));
      dnn::layer_norm(x.data<float>(), outs[0].data<float>(), outer, inner, sp, bp, eps, mean,
                      inv ? var.data() : nullptr);
      if (inv)
        for (int64_t o = 0; o < outer; ++o) inv[o] = 1.f / std::sqrt(var[o] + eps);
    } else {
      naive_layer_norm<T>(x.data<T>(), outs[0].data<T>(), outer, inner, sp, bp, static_cast<T>(eps), mean, inv);
    }
  });
  return outs;
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions.

enum class Red { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

template <Red op>
std::vector<Tensor> reduce_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> axes;
  if (const Tensor* t = c.in(1))
    axes = t->as_int64s();
  else
    axes = c.node.ints("axes");
  const bool keep = c.node.i("keepdims", 1) != 0;
  if (axes.empty() && c.node.i("noop_with_empty_axes", 0) != 0) return one(x);
  std::vector<char> red(r, axes.empty() ? 1 : 0);
  for (int64_t a : axes) red[c.axis(a, r)] = 1;
  Shape kd = x.shape, os;
  int64_t count = 1;
  for (int64_t i = 0; i < r; ++i)
    if (red[i]) {
      count *= x.shape[i];
      kd[i] = 1;
    } else {
      os.push_back(x.shape[i]);
    }
  constexpr bool identity_when_unreduced =
      op == Red::kSum || op == Red::kMean || op == Red::kMax || op == Red::kMin || op == Red::kProd;
  Tensor out(x.dtype, kd);
  if (identity_when_unreduced && kd == x.shape) {
    out = x;
  } else {
    dispatch_numeric(c, x.dtype, [&]<class T>() {
      if constexpr (std::is_same_v<T, float> && op != Red::kLogSum && op != Red::kLogSumExp) {
        if (x.numel() > 0 && kd.size() <= kDnnlMaxRank && kd != x.shape) {
          constexpr dnn::Reduce alg = op == Red::kSum    ? dnn::Reduce::kSum
                                      : op == Red::kMean ? dnn::Reduce::kMean
                                      : op == Red::kMax  ? dnn::Reduce::kMax
                                      : op == Red::kMin  ? dnn::Reduce::kMin
                                      : op == Red::kProd ? dnn::Reduce::kProd
                                      : op == Red::kL1   ? dnn::Reduce::kL1
                                      : op == Red::kL2   ? dnn::Reduce::kL2
                                                         : dnn::Reduce::kSumSquare;
          dnn::reduce(alg, x.data<float>(), out.data<float>(), x.shape, kd);
          return;
        }
      }
      T* o = out.data<T>();
      const T* in = x.data<T>();
      const std::vector<int64_t> si = contiguous_strides(x.shape), so = broadcast_strides(kd, x.shape);
      const Plan<2> p = make_plan<2>(x.shape, {si.data(), so.data()});
      // acc(out_ref, value, out_index) over every input element.
      auto loop = [&](T init, auto&& acc) {
        std::fill_n(o, out.numel(), init);
        for_each_row(p, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
          const T* s = in + off[0];
          for (int64_t i = 0; i < n; ++i) acc(o[off[1] + i * st[1]], s[i]);
        });
      };
      constexpr T lowest =
          std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
      constexpr T highest =
          std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
      if constexpr (op == Red::kSum || op == Red::kMean || op == Red::kLogSum) loop(T(0), [](T& a, T v) { a += v; });
      if constexpr (op == Red::kProd) loop(T(1), [](T& a, T v) { a *= v; });
      if constexpr (op == Red::kMax || op == Red::kLogSumExp) loop(lowest, [](T& a, T v) { a = v > a ? v : a; });
      if constexpr (op == Red::kMin) loop(highest, [](T& a, T v) { a = v < a ? v : a; });
      if constexpr (op == Red::kL1) loop(T(0), [](T& a, T v) { a += v < T(0) ? static_cast<T>(-v) : v; });
      if constexpr (op == Red::kL2 || op == Red::kSumSquare) loop(T(0), [](T& a, T v) { a += v * v; });
      if constexpr (op == Red::kLogSumExp) {
        const std::vector<T> mx(o, o + out.numel());
        std::vector<double> sum(mx.size(), 0.0);
        for_each_row(p, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
          const T* s = in + off[0];
          for (int64_t i = 0; i < n; ++i) {
            const int64_t k = off[1] + i * st[1];
            if (std::isfinite(static_cast<double>(mx[k])))
              sum[k] += std::exp(static_cast<double>(s[i]) - static_cast<double>(mx[k]));
          }
        });
        for (size_t i = 0; i < mx.size(); ++i)
          o[i] = std::isfinite(static_cast<double>(mx[i]))
                     ? static_cast<T>(static_cast<double>(mx[i]) + std::log(sum[i]))
                     : mx[i];
      }
      if constexpr (op == Red::kL2)
        for (int64_t i = 0; i < out.numel(); ++i) o[i] = static_cast<T>(std::sqrt(static_cast<double>(o[i])));
      if constexpr (op == Red::kLogSum)
        for (int64_t i = 0; i < out.numel(); ++i) o[i] = static_cast<T>(std::log(static_cast<double>(o[i])));
      if constexpr (op == Red::kMean) {
        for (int64_t i = 0; i < out.numel(); ++i) {
          if constexpr (std::is_floating_point_v<T>)
            o[i] = o[i] / static_cast<T>(count);
          else
            o[i] = count == 0 ? T(0) : static_cast<T>(o[i] / count);
        }
      }
    });
  }
  if (!keep) out.shape = os;
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// ArgMax / ArgMin.

template <bool is_max>
std::vector<Tensor> arg_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r == 0) c.fail("input must have rank >= 1");
  const int64_t ax = c.axis(c.node.i("axis", 0), r);
  const bool keep = c.node.i("keepdims", 1) != 0, last = c.node.i("select_last_index", 0) != 0;
  const int64_t len = x.shape[ax];
  if (len == 0) c.fail("cannot take ArgMax/ArgMin over an empty axis");
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < ax; ++i) outer *= x.shape[i];
  for (int64_t i = ax + 1; i < r; ++i) inner *= x.shape[i];
  Shape os = x.shape;
  if (keep)
    os[ax] = 1;
  else
    os.erase(os.begin() + ax);
  Tensor out(DType::kInt64, os);
  dispatch_all(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    int64_t* d = out.data<int64_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        const T* p = s + o * len * inner + j;
        int64_t best = 0;
        for (int64_t i = 1; i < len; ++i) {
          const T v = p[i * inner], b = p[best * inner];
          const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
          if (better) best = i;
        }
        d[o * inner + j] = best;
      }
  });
  return one(std::move(out));
}

}  // namespace

void register_reduce_norm(KernelTable& t) {
  t["Softmax"] = softmax_kernel<false>;
  t["LogSoftmax"] = softmax_kernel<true>;
  t["Hardmax"] = hardmax_kernel;
  t["LayerNormalization"] = layer_norm_kernel;
  t["ReduceSum"] = reduce_kernel<Red::kSum>;
  t["ReduceMean"] = reduce_kernel<Red::kMean>;
  t["ReduceMax"] = reduce_kernel<Red::kMax>;
  t["ReduceMin"] = reduce_kernel<Red::kMin>;
  t["ReduceProd"] = reduce_kernel<Red::kProd>;
  t["ReduceL1"] = reduce_kernel<Red::kL1>;
  t["ReduceL2"] = reduce_kernel<Red::kL2>;
  t["ReduceSumSquare"] = reduce_kernel<Red::kSumSquare>;
  t["ReduceLogSum"] = reduce_kernel<Red::kLogSum>;
  t["ReduceLogSumExp"] = reduce_kernel<Red::kLogSumExp>;
  t["ArgMax"] = arg_kernel<true>;
  t["ArgMin"] = arg_kernel<false>;
}

}  // namespace gspmd::kern
