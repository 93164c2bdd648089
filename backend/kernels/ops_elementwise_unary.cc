// The elementwise family's one-operand ops (core/rules/elementwise.cc; the broadcasting ops are in ops_elementwise.cc):
// Relu, Tanh, Exp, Sqrt, Erf, Log, Neg, Abs, Reciprocal, Sigmoid, Floor, Ceil, Sign; Elu, Selu, Celu, Softplus,
// Softsign, ThresholdedRelu, LeakyRelu, HardSigmoid, HardSwish, Mish, Shrink; Round, Sin, Cos, Tan, Asin, Acos, Atan,
// Sinh, Cosh, Asinh, Acosh, Atanh; IsNaN, IsInf; Not; Cast, CastLike, Clip; Identity, Dropout (inference). Reference:
// the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
// float32 Relu/Tanh/Exp/Sqrt/Log/Abs/Sigmoid/Neg/Reciprocal use oneDNN for tensors of at least kDnnlMinElems elements;
// everything else is plain C++.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"

namespace gspmd::kern {
namespace {

/// Unary loops of at least this many elements run on all OpenMP threads.
constexpr int64_t kParallelMinElems = 16384;

// ---------------------------------------------------------------------------------------------------------------
// Unary.

enum class Un { kRelu, kTanh, kExp, kSqrt, kErf, kLog, kNeg, kAbs, kReciprocal, kSigmoid, kFloor, kCeil, kSign };

template <Un op>
constexpr bool un_int_ok = op == Un::kRelu || op == Un::kNeg || op == Un::kAbs || op == Un::kSign;

template <Un op, class T>
inline T un_apply(T x) {
  if constexpr (op == Un::kRelu) return x > T(0) ? x : T(0);
  if constexpr (op == Un::kNeg) return static_cast<T>(-x);
  if constexpr (op == Un::kAbs) return x < T(0) ? static_cast<T>(-x) : x;
  if constexpr (op == Un::kSign) return static_cast<T>((T(0) < x) - (x < T(0)));
  if constexpr (op == Un::kTanh) return std::tanh(x);
  if constexpr (op == Un::kExp) return std::exp(x);
  if constexpr (op == Un::kSqrt) return std::sqrt(x);
  if constexpr (op == Un::kErf) return std::erf(x);
  if constexpr (op == Un::kLog) return std::log(x);
  if constexpr (op == Un::kReciprocal) return T(1) / x;
  if constexpr (op == Un::kSigmoid) return T(1) / (T(1) + std::exp(-x));
  if constexpr (op == Un::kFloor) return std::floor(x);
  if constexpr (op == Un::kCeil) return std::ceil(x);
}

template <Un op>
constexpr int dnnl_eltwise() {
  switch (op) {
    case Un::kRelu: return static_cast<int>(dnn::Eltwise::kRelu);
    case Un::kTanh: return static_cast<int>(dnn::Eltwise::kTanh);
    case Un::kExp: return static_cast<int>(dnn::Eltwise::kExp);
    case Un::kSqrt: return static_cast<int>(dnn::Eltwise::kSqrt);
    case Un::kLog: return static_cast<int>(dnn::Eltwise::kLog);
    case Un::kNeg: return static_cast<int>(dnn::Eltwise::kNeg);
    case Un::kAbs: return static_cast<int>(dnn::Eltwise::kAbs);
    case Un::kReciprocal: return static_cast<int>(dnn::Eltwise::kReciprocal);
    case Un::kSigmoid: return static_cast<int>(dnn::Eltwise::kSigmoid);
    default: return -1;
  }
}

template <Un op>
std::vector<Tensor> unary_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const int64_t n = x.numel();
  // in place when the input was donated (oneDNN eltwise and the loop both allow dst == src)
  Tensor* reuse = c.donated(0);
  Tensor out = reuse ? std::move(*reuse) : Tensor(x.dtype, x.shape);
  const Tensor& src = reuse ? out : x;
  if constexpr (dnnl_eltwise<op>() >= 0) {
    if (src.dtype == DType::kFloat32 && n >= kDnnlMinElems) {
      dnn::eltwise(static_cast<dnn::Eltwise>(dnnl_eltwise<op>()), src.data<float>(), out.data<float>(), n);
      return one(std::move(out));
    }
  }
  auto run = [&]<class T>() {
    const T* s = src.data<T>();
    T* d = out.data<T>();
    if (n >= kParallelMinElems) {
      // transcendental loops (erf, tanh, ...) cost far more than the memory traffic: split them over threads
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] = un_apply<op, T>(s[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = un_apply<op, T>(s[i]);
    }
  };
  if constexpr (un_int_ok<op>)
    dispatch_numeric(c, x.dtype, run);
  else
    dispatch_float(c, x.dtype, run);
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Cast, Clip.

std::vector<Tensor> cast_kernel(const Ctx& c) {
  if (!c.node.has("to")) c.fail("missing attribute 'to'");
  return one(cast_tensor(c, c.req(0), static_cast<DType>(c.node.i("to"))));
}

std::vector<Tensor> clip_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  Tensor out(x.dtype, x.shape);
  dispatch_arith(c, x.dtype, [&]<class T>() {
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    if (c.opset < 11) {
      if (c.node.has("min")) lo = static_cast<T>(c.node.f("min"));
      if (c.node.has("max")) hi = static_cast<T>(c.node.f("max"));
    }
    auto scalar = [&](size_t i, T& v) {
      const Tensor* t = c.in(i);
      if (!t) return;
      if (t->dtype != x.dtype || t->numel() != 1) c.fail(fmt::format("input {} must be a scalar of the input type", i));
      v = t->data<T>()[0];
    };
    scalar(1, lo);
    scalar(2, hi);
    const T* s = x.data<T>();
    T* d = out.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const T v = s[i] < lo ? lo : s[i];
      d[i] = hi < v ? hi : v;
    }
  });
  return one(std::move(out));
}

std::vector<Tensor> cast_like_kernel(const Ctx& c) { return one(cast_tensor(c, c.req(0), c.req(1).dtype)); }

// ---------------------------------------------------------------------------------------------------------------
// Not (bool stored as uint8 0/1).

std::vector<Tensor> not_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.dtype != DType::kBool) c.bad_dtype(x.dtype);
  Tensor out(DType::kBool, x.shape);
  const uint8_t* s = x.data<uint8_t>();
  uint8_t* d = out.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) d[i] = s[i] == 0;
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Activations with attributes, trigonometry, rounding, IsNaN / IsInf (plain C++).

enum class Pu {
  kElu,
  kSelu,
  kCelu,
  kSoftplus,
  kSoftsign,
  kThresholdedRelu,
  kLeakyRelu,
  kHardSigmoid,
  kHardSwish,
  kMish,
  kRound,
  kSin,
  kCos,
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kShrink
};

template <Pu op>
std::vector<Tensor> param_unary_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  Tensor out(x.dtype, x.shape);
  double alpha = 0, beta = 0, gamma = 0;
  if constexpr (op == Pu::kElu || op == Pu::kCelu || op == Pu::kThresholdedRelu) alpha = c.node.f("alpha", 1.f);
  if constexpr (op == Pu::kSelu) {
    alpha = c.node.f("alpha", 1.67326319217681884765625f);
    gamma = c.node.f("gamma", 1.05070102214813232421875f);
  }
  if constexpr (op == Pu::kLeakyRelu) alpha = c.node.f("alpha", 0.01f);
  if constexpr (op == Pu::kHardSigmoid) {
    alpha = c.node.f("alpha", 0.2f);
    beta = c.node.f("beta", 0.5f);
  }
  if constexpr (op == Pu::kShrink) {
    alpha = c.node.f("lambd", 0.5f);
    beta = c.node.f("bias", 0.f);
  }
  auto f = [&](double v) -> double {
    if constexpr (op == Pu::kElu) return v < 0 ? alpha * (std::exp(v) - 1) : v;
    if constexpr (op == Pu::kSelu) return gamma * (v <= 0 ? alpha * (std::exp(v) - 1) : v);
    if constexpr (op == Pu::kCelu) return std::max(0.0, v) + std::min(0.0, alpha * (std::exp(v / alpha) - 1));
    if constexpr (op == Pu::kSoftplus) return v > 30 ? v : std::log1p(std::exp(v));
    if constexpr (op == Pu::kSoftsign) return v / (1 + std::abs(v));
    if constexpr (op == Pu::kThresholdedRelu) return v > alpha ? v : 0.0;
    if constexpr (op == Pu::kLeakyRelu) return v < 0 ? alpha * v : v;
    if constexpr (op == Pu::kHardSigmoid) return std::max(0.0, std::min(1.0, alpha * v + beta));
    if constexpr (op == Pu::kHardSwish) return v * std::max(0.0, std::min(1.0, v / 6 + 0.5));
    if constexpr (op == Pu::kMish) return v * std::tanh(v > 30 ? v : std::log1p(std::exp(v)));
    if constexpr (op == Pu::kRound) return std::nearbyint(v);
    if constexpr (op == Pu::kSin) return std::sin(v);
    if constexpr (op == Pu::kCos) return std::cos(v);
    if constexpr (op == Pu::kTan) return std::tan(v);
    if constexpr (op == Pu::kAsin) return std::asin(v);
    if constexpr (op == Pu::kAcos) return std::acos(v);
    if constexpr (op == Pu::kAtan) return std::atan(v);
    if constexpr (op == Pu::kSinh) return std::sinh(v);
    if constexpr (op == Pu::kCosh) return std::cosh(v);
    if constexpr (op == Pu::kAsinh) return std::asinh(v);
    if constexpr (op == Pu::kAcosh) return std::acosh(v);
    if constexpr (op == Pu::kAtanh) return std::atanh(v);
    if constexpr (op == Pu::kShrink) return v < -alpha ? v + beta : v > alpha ? v - beta : 0.0;
  };
  auto run = [&]<class T>() {
    const T* s = x.data<T>();
    T* d = out.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) d[i] = static_cast<T>(f(static_cast<double>(s[i])));
  };
  if constexpr (op == Pu::kShrink)
    dispatch_all(c, x.dtype, run);
  else
    dispatch_float(c, x.dtype, run);
  return one(std::move(out));
}

template <bool is_nan>
std::vector<Tensor> isnan_isinf_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  Tensor out(DType::kBool, x.shape);
  const bool neg = c.node.i("detect_negative", 1) != 0, pos = c.node.i("detect_positive", 1) != 0;
  dispatch_float(c, x.dtype, [&]<class T>() {
    const T* s = x.data<T>();
    uint8_t* d = out.data<uint8_t>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if constexpr (is_nan)
        d[i] = std::isnan(s[i]);
      else
        d[i] = std::isinf(s[i]) && ((s[i] > 0 && pos) || (s[i] < 0 && neg));
    }
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Identity, Dropout.

std::vector<Tensor> identity_kernel(const Ctx& c) { return one(c.take(0)); }

std::vector<Tensor> dropout_kernel(const Ctx& c) {
  // Inference semantics only: identity. Training mode with a non-zero ratio would need a random mask.
  if (const Tensor* tm = c.in(2); tm && tm->numel() > 0 && tm->as_int64s()[0] != 0) {
    double ratio = 0.5;
    if (const Tensor* r = c.in(1); r && r->numel() > 0) {
      if (r->dtype == DType::kFloat32) ratio = r->data<float>()[0];
      if (r->dtype == DType::kFloat64) ratio = r->data<double>()[0];
    }
    if (ratio != 0.0) c.unsupported("no kernel for training_mode=true (random dropout)");
  }
  std::vector<Tensor> out;
  out.push_back(c.req(0));
  if (c.n_out() > 1) {
    Tensor mask(DType::kBool, c.req(0).shape);
    std::fill(mask.bytes.begin(), mask.bytes.end(), std::byte{1});
    out.push_back(std::move(mask));
  }
  return out;
}

}  // namespace

void register_elementwise_unary(KernelTable& t) {
  t["Relu"] = unary_kernel<Un::kRelu>;
  t["Tanh"] = unary_kernel<Un::kTanh>;
  t["Exp"] = unary_kernel<Un::kExp>;
  t["Sqrt"] = unary_kernel<Un::kSqrt>;
  t["Erf"] = unary_kernel<Un::kErf>;
  t["Log"] = unary_kernel<Un::kLog>;
  t["Neg"] = unary_kernel<Un::kNeg>;
  t["Abs"] = unary_kernel<Un::kAbs>;
  t["Reciprocal"] = unary_kernel<Un::kReciprocal>;
  t["Sigmoid"] = unary_kernel<Un::kSigmoid>;
  t["Floor"] = unary_kernel<Un::kFloor>;
  t["Ceil"] = unary_kernel<Un::kCeil>;
  t["Sign"] = unary_kernel<Un::kSign>;
  t["Not"] = not_kernel;
  t["Cast"] = cast_kernel;
  t["CastLike"] = cast_like_kernel;
  t["Clip"] = clip_kernel;
  t["Elu"] = param_unary_kernel<Pu::kElu>;
  t["Selu"] = param_unary_kernel<Pu::kSelu>;
  t["Celu"] = param_unary_kernel<Pu::kCelu>;
  t["Softplus"] = param_unary_kernel<Pu::kSoftplus>;
  t["Softsign"] = param_unary_kernel<Pu::kSoftsign>;
  t["ThresholdedRelu"] = param_unary_kernel<Pu::kThresholdedRelu>;
  t["LeakyRelu"] = param_unary_kernel<Pu::kLeakyRelu>;
  t["HardSigmoid"] = param_unary_kernel<Pu::kHardSigmoid>;
  t["HardSwish"] = param_unary_kernel<Pu::kHardSwish>;
  t["Mish"] = param_unary_kernel<Pu::kMish>;
  t["Round"] = param_unary_kernel<Pu::kRound>;
  t["Sin"] = param_unary_kernel<Pu::kSin>;
  t["Cos"] = param_unary_kernel<Pu::kCos>;
  t["Tan"] = param_unary_kernel<Pu::kTan>;
  t["Asin"] = param_unary_kernel<Pu::kAsin>;
  t["Acos"] = param_unary_kernel<Pu::kAcos>;
  t["Atan"] = param_unary_kernel<Pu::kAtan>;
  t["Sinh"] = param_unary_kernel<Pu::kSinh>;
  t["Cosh"] = param_unary_kernel<Pu::kCosh>;
  t["Asinh"] = param_unary_kernel<Pu::kAsinh>;
  t["Acosh"] = param_unary_kernel<Pu::kAcosh>;
  t["Atanh"] = param_unary_kernel<Pu::kAtanh>;
  t["Shrink"] = param_unary_kernel<Pu::kShrink>;
  t["IsNaN"] = isnan_isinf_kernel<true>;
  t["IsInf"] = isnan_isinf_kernel<false>;
  t["Identity"] = identity_kernel;
  t["Dropout"] = dropout_kernel;
}

}  // namespace gspmd::kern
