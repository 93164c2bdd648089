// backend/kernels internal helpers: kernel context, error helpers, dtype dispatch, broadcasting and strided loops.
// Not part of the public interface (kernels.h); included only by backend/kernels/*.cc.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ir/ir.h"
#include "core/shapes/geometry.h"

namespace gspmd::kern {

/// A spec violation inside a kernel; its message already names the node ("node 'n' (Op): ...").
struct KernelError : SpecError {
  using SpecError::SpecError;
};

/// Everything a kernel sees: the node, its inputs (nullptr = absent optional input) and the graph opset.
struct Ctx {
  const Node& node;
  const std::vector<const Tensor*>& ins;
  int64_t opset;
  const std::vector<Tensor*>* donated_ins = nullptr;  // run_kernel's `donated` (may be null or empty)
  const std::vector<const std::shared_ptr<const Tensor>*>* owners = nullptr;  // run_kernel's `owners` (may be empty)

  const Tensor* in(size_t i) const { return i < ins.size() ? ins[i] : nullptr; }
  /// Input i as a mutable tensor when the caller donated it (see run_kernel), else nullptr. A kernel that moves from
  /// it or overwrites it must have read everything it needs from that input first.
  Tensor* donated(size_t i) const { return donated_ins && i < donated_ins->size() ? (*donated_ins)[i] : nullptr; }
  /// The owner of input i when the caller gave one (see run_kernel), else nullptr.
  const std::shared_ptr<const Tensor>* owner(size_t i) const {
    return owners && i < owners->size() ? (*owners)[i] : nullptr;
  }
  /// Input i (required) by value: its buffer moved out when donated, a copy otherwise.
  Tensor take(size_t i) const {
    if (Tensor* t = donated(i)) return std::move(*t);
    return req(i);
  }
  /// Input i, which must be present.
  const Tensor& req(size_t i) const;
  /// Number of outputs to produce (at least 1).
  size_t n_out() const { return node.outputs.empty() ? 1 : node.outputs.size(); }
  /// "node 'n' (Op): "
  std::string prefix() const;
  [[noreturn]] void fail(std::string_view msg) const;  // KernelError
  /// InputError(prefix() + msg): the input *values* break the op's spec (an index out of range, a K past the axis):
  /// the data's fault, reported as bad input (exit 2) and passed through the executor unchanged, so the message is
  /// the same on one device and under every plan (docs/errors.md).
  [[noreturn]] void bad_data(std::string_view msg) const;
  [[noreturn]] void unsupported(std::string_view msg) const;  // UnsupportedError
  [[noreturn]] void bad_dtype(DType t) const;                 // UnsupportedError "no kernel for dtype X"
  /// Normalises axis `a` into [0, rank) (negative counts from the end); fails if out of range.
  int64_t axis(int64_t a, int64_t rank) const;
};

using KernelFn = std::vector<Tensor> (*)(const Ctx&);
using KernelTable = std::unordered_map<std::string, KernelFn>;

// One registration function per kernel file ops_<family>[_<part>].cc. The families are those of the sharding rules
// (core/rules/<family>.cc) wherever an op has a rule, so an op's rule, kernel and shape function
// (core/shapes/<family>.cc) are found by one name; ops without a rule family of their own are in rnn, loss, signal,
// spatial, training, control and misc (docs/architecture.md, "One op's story").

/// ops_elementwise.cc: Add, Sub, Mul, Div, Pow, Mod, BitShift, PRelu, Max, Min, Sum, Mean, Equal, Less, Greater,
/// LessOrEqual, GreaterOrEqual, And, Or, Xor, Where.
void register_elementwise(KernelTable& t);
/// ops_elementwise_unary.cc: Relu, Tanh, Exp, Sqrt, Erf, Log, Neg, Abs, Reciprocal, Sigmoid, Floor, Ceil, Sign, Elu,
/// Selu, Celu, Softplus, Softsign, ThresholdedRelu, LeakyRelu, HardSigmoid, HardSwish, Mish, Shrink, Round, Sin, Cos,
/// Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh, IsNaN, IsInf, Not, Cast, CastLike, Clip, Identity, Dropout.
void register_elementwise_unary(KernelTable& t);
/// ops_matmul.cc: MatMul, Gemm, MatMulInteger, QLinearMatMul.
void register_matmul(KernelTable& t);
/// ops_reduce_norm.cc: Softmax, LogSoftmax, Hardmax, LayerNormalization, ReduceSum, ReduceMean, ReduceMax, ReduceMin,
/// ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp, ArgMax, ArgMin.
void register_reduce_norm(KernelTable& t);
/// ops_gather.cc: Gather.
void register_gather(KernelTable& t);
/// ops_conv_pool.cc: Conv, ConvTranspose, ConvInteger, QLinearConv, MaxPool, AveragePool, LpPool, GlobalMaxPool,
/// GlobalAveragePool, GlobalLpPool, DepthToSpace, SpaceToDepth.
void register_conv_pool(KernelTable& t);
/// ops_conv_pool_norm.cc: BatchNormalization, InstanceNormalization, LRN, MeanVarianceNormalization.
void register_conv_pool_norm(KernelTable& t);
/// ops_einsum.cc: Einsum.
void register_einsum(KernelTable& t);
/// ops_shape_ops.cc: Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Concat, Slice, Split, Expand, Constant,
/// ConstantOfShape, Shape, Size.
void register_shape_ops(KernelTable& t);
/// ops_index.cc: GatherElements, GatherND, ScatterElements, Scatter, ScatterND, OneHot, NonZero, Compress, TopK,
/// CumSum, Tile, Pad, Range.
void register_index(KernelTable& t);
/// ops_index_resize.cc: Resize, Upsample.
void register_index_resize(KernelTable& t);
/// ops_rnn.cc: RNN, GRU, LSTM.
void register_rnn(KernelTable& t);
/// ops_loss.cc: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
void register_loss(KernelTable& t);
/// ops_signal.cc: HannWindow, HammingWindow, BlackmanWindow, DFT, STFT, MelWeightMatrix.
void register_signal(KernelTable& t);
/// ops_spatial.cc: MaxUnpool, RoiAlign, GridSample.
void register_spatial(KernelTable& t);
/// ops_misc.cc: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, Det, Trilu, EyeLike, Unique,
/// ReverseSequence, NonMaxSuppression, TfIdfVectorizer.
void register_misc(KernelTable& t);
/// ops_training.cc: the "ai.onnx.preview.training:<Op>" optimizers Adagrad, Adam, Momentum.
void register_training(KernelTable& t);
/// ops_control.cc: If, Loop, Scan (their bodies run with these kernels).
void register_control(KernelTable& t);
/// ops_pipeline.cc: "gspmd.pipeline:Shift", the pipeline's stage shift (core/ir/shift_op.h).
void register_pipeline(KernelTable& t);

/// Elementwise kernels (ops_elementwise.cc, ops_elementwise_unary.cc) call oneDNN from this many elements on: below it,
/// oneDNN's per-call overhead (primitive lookup, memory objects) exceeds the work.
constexpr int64_t kDnnlMinElems = 4096;

// ---------------------------------------------------------------------------------------------------------------
// dtype dispatch. `f` is a lambda templated on the element type: [&]<class T>() { ... }. Bool is stored as uint8_t
// (0/1); dispatchers that accept bool call f with uint8_t.

template <class F>
decltype(auto) dispatch_float(const Ctx& c, DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    default: c.bad_dtype(t);
  }
}

template <class F>
decltype(auto) dispatch_numeric(const Ctx& c, DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    case DType::kInt64: return f.template operator()<int64_t>();
    case DType::kInt32: return f.template operator()<int32_t>();
    default: c.bad_dtype(t);
  }
}

/// Every real number type: float32/64, int8..int64, uint8..uint64 (no bool, no 16-bit floats).
template <class F>
decltype(auto) dispatch_arith(const Ctx& c, DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    case DType::kInt64: return f.template operator()<int64_t>();
    case DType::kInt32: return f.template operator()<int32_t>();
    case DType::kInt16: return f.template operator()<int16_t>();
    case DType::kInt8: return f.template operator()<int8_t>();
    case DType::kUInt8: return f.template operator()<uint8_t>();
    case DType::kUInt16: return f.template operator()<uint16_t>();
    case DType::kUInt32: return f.template operator()<uint32_t>();
    case DType::kUInt64: return f.template operator()<uint64_t>();
    default: c.bad_dtype(t);
  }
}

/// dispatch_arith + bool (as uint8_t).
template <class F>
decltype(auto) dispatch_all(const Ctx& c, DType t, F&& f) {
  if (t == DType::kBool) return f.template operator()<uint8_t>();
  return dispatch_arith(c, t, std::forward<F>(f));
}

/// True for the 16-bit float types (float16, bfloat16), which kernels compute in float32 (see cast_tensor).
inline bool is_half(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// ---------------------------------------------------------------------------------------------------------------
// Shapes and broadcasting.

/// Row-major element strides of a shape.
std::vector<int64_t> contiguous_strides(const Shape& s);

// Axis normalisation and numpy broadcasting, shared with the shape functions (core/shapes/geometry.h).
using shapes::broadcast_shapes;
using shapes::normalize_axis;

/// Element strides of a tensor of shape `in` viewed in the broadcast shape `out` (0 on broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out);

/// A loop nest over `dims` for K operands, after dropping size-1 dims and merging contiguous ones.
template <int K>
struct Plan {
  std::vector<int64_t> dims;               // outer..inner; empty when some dim is 0 (nothing to do)
  std::vector<std::array<int64_t, K>> st;  // per dim, per operand element stride
  bool empty = false;
};

template <int K>
Plan<K> make_plan(const Shape& shape, const std::array<const int64_t*, K>& strides) {
  Plan<K> p;
  for (int64_t d : shape)
    if (d == 0) {
      p.empty = true;
      return p;
    }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    std::array<int64_t, K> s;
    for (int k = 0; k < K; ++k) s[k] = strides[k][i];
    if (!p.dims.empty()) {
      bool merge = true;
      for (int k = 0; k < K; ++k) merge = merge && p.st.back()[k] == s[k] * shape[i];
      if (merge) {
        p.dims.back() *= shape[i];
        p.st.back() = s;
        continue;
      }
    }
    p.dims.push_back(shape[i]);
    p.st.push_back(s);
  }
  if (p.dims.empty()) {
    p.dims.push_back(1);
    p.st.push_back({});
  }
  return p;
}

/// Calls f(offsets, n, inner_strides) once per innermost row of the plan.
template <int K, class F>
void for_each_row(const Plan<K>& p, F&& f) {
  if (p.empty) return;
  const size_t r = p.dims.size();
  const int64_t n = p.dims[r - 1];
  const std::array<int64_t, K> inner = p.st[r - 1];
  std::array<int64_t, K> off{};
  if (r == 1) {
    f(off, n, inner);
    return;
  }
  std::vector<int64_t> idx(r - 1, 0);
  while (true) {
    f(off, n, inner);
    int64_t d = static_cast<int64_t>(r) - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < p.dims[d]) {
        for (int k = 0; k < K; ++k) off[k] += p.st[d][k];
        break;
      }
      for (int k = 0; k < K; ++k) off[k] -= p.st[d][k] * (p.dims[d] - 1);
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

/// As for_each_row, with the rows split across OpenMP threads when the plan has at least `min_elems` elements (below
/// that, threads cost more than they save). `f` may only write what its own row owns: elementwise kernels and copies
/// (one output row per call), never accumulations into shared outputs.
template <int K, class F>
void for_each_row_parallel(const Plan<K>& p, F&& f, int64_t min_elems = int64_t{1} << 16) {
  if (p.empty) return;
  const int64_t r = static_cast<int64_t>(p.dims.size());
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < r; ++d) rows *= p.dims[static_cast<size_t>(d)];
  const int64_t n = p.dims[static_cast<size_t>(r - 1)];
  if (r == 1 || rows < 2 || rows * n < min_elems) {
    for_each_row(p, f);
    return;
  }
  const std::array<int64_t, K> inner = p.st[static_cast<size_t>(r - 1)];
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    std::array<int64_t, K> off{};
    int64_t rest = row;
    for (int64_t d = r - 2; d >= 0; --d) {
      const int64_t i = rest % p.dims[static_cast<size_t>(d)];
      rest /= p.dims[static_cast<size_t>(d)];
      for (int k = 0; k < K; ++k) off[k] += i * p.st[static_cast<size_t>(d)][k];
    }
    f(off, n, inner);
  }
}

/// Copies a strided view of `src` into a strided view of `dst` (strides in elements, may be 0 or negative; both
/// pointers point at the view's first element). Works for element sizes 1, 2, 4, 8 and multiples thereof.
void strided_copy(std::byte* dst, const int64_t* dst_strides, const std::byte* src, const int64_t* src_strides,
                  const Shape& shape, size_t elem);

/// Materialises `t` broadcast to `out` (same dtype).
Tensor broadcast_to(const Tensor& t, const Shape& out);

/// Copy of `t` with dtype converted to `to` (same shape). Supports float16/bfloat16/float32/64, int8..int64,
/// uint8..uint64 and bool (ONNX Cast semantics: to bool is != 0; 16-bit floats round to nearest even through float32,
/// but bfloat16 truncates for a node marked `gspmd_truncate_bf16`: a model's own Cast before opset 19, as ONNX's
/// reference computes it).
Tensor cast_tensor(const Ctx& c, const Tensor& t, DType to);

/// Single-output helper.
inline std::vector<Tensor> one(Tensor t) {
  std::vector<Tensor> v;
  v.push_back(std::move(t));
  return v;
}

}  // namespace gspmd::kern
