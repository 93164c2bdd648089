// The elementwise family (core/rules/elementwise.cc), ops with two or more operands and numpy broadcasting: Add, Sub,
// Mul, Div, Pow, Mod, BitShift, PRelu, variadic Max/Min/Sum/Mean, comparisons (Equal, Less, Greater, LessOrEqual,
// GreaterOrEqual), logic (And, Or, Xor), Where. The family's unary ops are in ops_elementwise_unary.cc. Reference: the
// ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
// float32 Add/Sub/Mul/Div/Max/Min use oneDNN for tensors of at least kDnnlMinElems elements; everything else is plain
// C++.
#include <cmath>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"

namespace gspmd::kern {
namespace {

/// o[i] = op(a[i], b[i]) over the broadcast shape of out.
template <class T, class R, class Op>
void bcast_binary(const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  const Shape& os = out.shape;
  const std::vector<int64_t> so = contiguous_strides(os), sa = broadcast_strides(a.shape, os),
                             sb = broadcast_strides(b.shape, os);
  const Plan<3> p = make_plan<3>(os, {so.data(), sa.data(), sb.data()});
  const T* A = a.data<T>();
  const T* B = b.data<T>();
  R* O = out.data<R>();
  for_each_row_parallel(p, [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
    R* o = O + off[0];
    const T* x = A + off[1];
    const T* y = B + off[2];
    if (st[1] == 1 && st[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
    } else if (st[1] == 1 && st[2] == 0) {
      const T yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], yv);
    } else if (st[1] == 0 && st[2] == 1) {
      const T xv = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = op(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = op(x[i * st[1]], y[i * st[2]]);
    }
  });
}

void same_dtype(const Ctx& c, const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype)
    c.fail(fmt::format("input dtypes differ ({} vs {})", dtype_name(a.dtype), dtype_name(b.dtype)));
}

// ---------------------------------------------------------------------------------------------------------------
// Binary arithmetic.

enum class Bin { kAdd, kSub, kMul, kDiv, kMax, kMin };

// Integers wrap around in two's complement on overflow (as numpy and ONNX Runtime compute), which C++ leaves undefined
// for signed types: the sum, difference and product are taken modulo 2^64, then cut to T.
template <Bin op, class T>
inline T bin_apply(T x, T y) {
  if constexpr (std::is_integral_v<T> && (op == Bin::kAdd || op == Bin::kSub || op == Bin::kMul)) {
    const uint64_t a = static_cast<uint64_t>(x), b = static_cast<uint64_t>(y);
    return static_cast<T>(op == Bin::kAdd ? a + b : op == Bin::kSub ? a - b : a * b);
  }
  if constexpr (op == Bin::kAdd) return x + y;
  if constexpr (op == Bin::kSub) return x - y;
  if constexpr (op == Bin::kMul) return x * y;
  if constexpr (op == Bin::kMax) return x < y ? y : x;
  if constexpr (op == Bin::kMin) return y < x ? y : x;
  if constexpr (op == Bin::kDiv) {
    if constexpr (std::is_integral_v<T>) {
      // C truncation; x/0 gives 0 and MIN/-1 wraps instead of trapping (padded shards may hold zeros).
      if (y == 0) return T(0);
      if (y == T(-1)) return static_cast<T>(T(0) - x);
      return x / y;
    } else {
      return x / y;
    }
  }
}

template <Bin op>
constexpr dnn::Binary dnn_binary() {
  return op == Bin::kAdd   ? dnn::Binary::kAdd
         : op == Bin::kSub ? dnn::Binary::kSub
         : op == Bin::kMul ? dnn::Binary::kMul
         : op == Bin::kDiv ? dnn::Binary::kDiv
         : op == Bin::kMax ? dnn::Binary::kMax
                           : dnn::Binary::kMin;
}

template <Bin op>
bool try_dnnl_binary(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  if (out.dtype != DType::kFloat32 || n < kDnnlMinElems || out.shape.size() > 12) return false;
  const size_t r = out.shape.size();
  auto pad = [r](const Shape& s) {
    Shape p(r - s.size(), 1);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const Shape pa = pad(a.shape), pb = pad(b.shape);
  constexpr dnn::Binary alg = op == Bin::kAdd   ? dnn::Binary::kAdd
                              : op == Bin::kSub ? dnn::Binary::kSub
                              : op == Bin::kMul ? dnn::Binary::kMul
                              : op == Bin::kDiv ? dnn::Binary::kDiv
                              : op == Bin::kMax ? dnn::Binary::kMax
                                                : dnn::Binary::kMin;
  if (pa == out.shape) return dnn::binary(alg, a.data<float>(), b.data<float>(), out.data<float>(), pa, pb);
  constexpr bool commutative = op == Bin::kAdd || op == Bin::kMul || op == Bin::kMax || op == Bin::kMin;
  if (commutative && pb == out.shape)
    return dnn::binary(alg, b.data<float>(), a.data<float>(), out.data<float>(), pb, pa);
  return false;
}

/// a (op) b with numpy broadcasting. `reuse_a` / `reuse_b` (may be null) are a / b themselves, donated by the caller:
/// when one has the result's shape, the result is computed in place in its buffer (elementwise, so every output element
/// only reads the operand elements at its own position) and returned without allocating.
template <Bin op>
Tensor binary_op(const Ctx& c, const Tensor& a, const Tensor& b, Tensor* reuse_a = nullptr, Tensor* reuse_b = nullptr) {
  same_dtype(c, a, b);
  if (is_half(a.dtype))  // float16 / bfloat16: compute in float32, round once
    return cast_tensor(c, binary_op<op>(c, cast_tensor(c, a, DType::kFloat32), cast_tensor(c, b, DType::kFloat32)),
                       a.dtype);
  Shape os = broadcast_shapes(c, a.shape, b.shape);
  constexpr bool commutative = op == Bin::kAdd || op == Bin::kMul || op == Bin::kMax || op == Bin::kMin;
  if (reuse_a && a.shape == os && &a != &b) {
    // a's buffer becomes the output; oneDNN's binary allows dst == src0, the loop reads o[i] before writing it
    if (a.dtype == DType::kFloat32 && a.numel() >= kDnnlMinElems && a.shape.size() <= 12) {
      Shape pb(os.size() - b.shape.size(), 1);
      pb.insert(pb.end(), b.shape.begin(), b.shape.end());
      if (dnn::binary(dnn_binary<op>(), a.data<float>(), b.data<float>(), reuse_a->data<float>(), os, pb))
        return std::move(*reuse_a);
    }
    Tensor out = std::move(*reuse_a);
    dispatch_arith(c, out.dtype, [&]<class T>() {
      bcast_binary<T, T>(out, b, out, [](T x, T y) { return bin_apply<op, T>(x, y); });
    });
    return out;
  }
  if (reuse_b && b.shape == os && &a != &b &&
      (commutative || a.dtype != DType::kFloat32 || a.numel() < kDnnlMinElems)) {
    Tensor out = std::move(*reuse_b);
    if (commutative && out.dtype == DType::kFloat32 && out.numel() >= kDnnlMinElems && os.size() <= 12) {
      Shape pa(os.size() - a.shape.size(), 1);
      pa.insert(pa.end(), a.shape.begin(), a.shape.end());
      if (dnn::binary(dnn_binary<op>(), out.data<float>(), a.data<float>(), out.data<float>(), os, pa)) return out;
    }
    dispatch_arith(c, out.dtype, [&]<class T>() {
      bcast_binary<T, T>(a, out, out, [](T x, T y) { return bin_apply<op, T>(x, y); });
    });
    return out;
  }
  Tensor out(a.dtype, std::move(os));
  if (try_dnnl_binary<op>(a, b, out)) return out;
  dispatch_arith(c, a.dtype,
                 [&]<class T>() { bcast_binary<T, T>(a, b, out, [](T x, T y) { return bin_apply<op, T>(x, y); }); });
  return out;
}

template <Bin op>
std::vector<Tensor> binary_kernel(const Ctx& c) {
  return one(binary_op<op>(c, c.req(0), c.req(1), c.donated(0), c.donated(1)));
}

/// Max/Min/Sum/Mean over 1..N inputs with broadcasting.
template <Bin op, bool mean = false>
std::vector<Tensor> variadic_kernel(const Ctx& c) {
  if (c.ins.empty()) c.fail("needs at least one input");
  Tensor acc = c.req(0);
  for (size_t i = 1; i < c.ins.size(); ++i) acc = binary_op<op>(c, acc, c.req(i));
  if constexpr (mean) {
    const size_t k = c.ins.size();
    dispatch_float(c, acc.dtype, [&]<class T>() {
      T* p = acc.data<T>();
      for (int64_t i = 0; i < acc.numel(); ++i) p[i] /= static_cast<T>(k);
    });
  }
  return one(std::move(acc));
}

std::vector<Tensor> pow_kernel(const Ctx& c) {
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  Tensor out(a.dtype, broadcast_shapes(c, a.shape, b.shape));
  if (a.dtype == b.dtype && (a.dtype == DType::kFloat32 || a.dtype == DType::kFloat64)) {
    dispatch_float(c, a.dtype, [&]<class T>() {
      bcast_binary<T, T>(a, b, out, [](T x, T y) {
        if (y == T(2)) return x * x;
        return static_cast<T>(std::pow(x, y));
      });
    });
    return one(std::move(out));
  }
  // Mixed types: compute in double, store in the base's type.
  const Tensor a64 = cast_tensor(c, a, DType::kFloat64), b64 = cast_tensor(c, b, DType::kFloat64);
  Tensor tmp(DType::kFloat64, out.shape);
  bcast_binary<double, double>(a64, b64, tmp, [](double x, double y) { return std::pow(x, y); });
  return one(cast_tensor(c, tmp, a.dtype));
}

// ---------------------------------------------------------------------------------------------------------------
// Comparisons and logic (bool results stored as uint8 0/1).

enum class Cmp { kEq, kLt, kGt, kLe, kGe };

template <Cmp op>
std::vector<Tensor> compare_kernel(const Ctx& c) {
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  same_dtype(c, a, b);
  Tensor out(DType::kBool, broadcast_shapes(c, a.shape, b.shape));
  dispatch_all(c, a.dtype, [&]<class T>() {
    bcast_binary<T, uint8_t>(a, b, out, [](T x, T y) -> uint8_t {
      if constexpr (op == Cmp::kEq) return x == y;
      if constexpr (op == Cmp::kLt) return x < y;
      if constexpr (op == Cmp::kGt) return x > y;
      if constexpr (op == Cmp::kLe) return x <= y;
      if constexpr (op == Cmp::kGe) return x >= y;
    });
  });
  return one(std::move(out));
}

enum class Logic { kAnd, kOr, kXor };

template <Logic op>
std::vector<Tensor> logic_kernel(const Ctx& c) {
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  if (a.dtype != DType::kBool) c.bad_dtype(a.dtype);
  if (b.dtype != DType::kBool) c.bad_dtype(b.dtype);
  Tensor out(DType::kBool, broadcast_shapes(c, a.shape, b.shape));
  bcast_binary<uint8_t, uint8_t>(a, b, out, [](uint8_t x, uint8_t y) -> uint8_t {
    if constexpr (op == Logic::kAnd) return (x != 0) & (y != 0);
    if constexpr (op == Logic::kOr) return (x != 0) | (y != 0);
    if constexpr (op == Logic::kXor) return (x != 0) ^ (y != 0);
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Where (dtype-agnostic: moves elements by size).

template <class T>
void where_t(const Tensor& cond, const Tensor& x, const Tensor& y, Tensor& out) {
  const Shape& os = out.shape;
  const std::vector<int64_t> so = contiguous_strides(os), sc = broadcast_strides(cond.shape, os),
                             sx = broadcast_strides(x.shape, os), sy = broadcast_strides(y.shape, os);
  const Plan<4> p = make_plan<4>(os, {so.data(), sc.data(), sx.data(), sy.data()});
  const uint8_t* C = cond.data<uint8_t>();
  const T* X = reinterpret_cast<const T*>(x.bytes.data());
  const T* Y = reinterpret_cast<const T*>(y.bytes.data());
  T* O = reinterpret_cast<T*>(out.bytes.data());
  for_each_row_parallel(p, [&](const std::array<int64_t, 4>& off, int64_t n, const std::array<int64_t, 4>& st) {
    for (int64_t i = 0; i < n; ++i)
      O[off[0] + i] = C[off[1] + i * st[1]] ? X[off[2] + i * st[2]] : Y[off[3] + i * st[3]];
  });
}

std::vector<Tensor> where_kernel(const Ctx& c) {
  const Tensor& cond = c.req(0);
  const Tensor& x = c.req(1);
  const Tensor& y = c.req(2);
  if (cond.dtype != DType::kBool) c.fail(fmt::format("condition must be bool, got {}", dtype_name(cond.dtype)));
  same_dtype(c, x, y);
  Tensor out(x.dtype, broadcast_shapes(c, broadcast_shapes(c, cond.shape, x.shape), y.shape));
  switch (dtype_size(x.dtype)) {
    case 1: where_t<uint8_t>(cond, x, y, out); break;
    case 2: where_t<uint16_t>(cond, x, y, out); break;
    case 4: where_t<uint32_t>(cond, x, y, out); break;
    case 8: where_t<uint64_t>(cond, x, y, out); break;
    default: c.bad_dtype(x.dtype);
  }
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Mod, BitShift, PRelu (plain C++).

std::vector<Tensor> mod_kernel(const Ctx& c) {
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  same_dtype(c, a, b);
  const bool fmod = c.node.i("fmod", 0) != 0;
  if (is_half(a.dtype)) {  // compute in float32: fmod of two halves is exact there
    Node n = c.node;
    const Tensor fa = cast_tensor(c, a, DType::kFloat32), fb = cast_tensor(c, b, DType::kFloat32);
    const std::vector<const Tensor*> ins{&fa, &fb};
    const Ctx fc{n, ins, c.opset};
    return one(cast_tensor(c, mod_kernel(fc)[0], a.dtype));
  }
  Tensor out(a.dtype, broadcast_shapes(c, a.shape, b.shape));
  auto run = [&]<class T>() {
    bcast_binary<T, T>(a, b, out, [fmod](T x, T y) -> T {
      if constexpr (std::is_floating_point_v<T>) {
        if (fmod) return std::fmod(x, y);
        T r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return r;
      } else if constexpr (std::is_unsigned_v<T>) {
        return y == 0 ? T(0) : static_cast<T>(x % y);
      } else {
        if (y == 0) return T(0);
        if (fmod) return static_cast<T>(x % y);
        T r = static_cast<T>(x % y);
        if (r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
        return r;
      }
    });
  };
  dispatch_arith(c, a.dtype, run);
  return one(std::move(out));
}

/// BitShift (opset 11): unsigned integers, numpy broadcasting; shifts of the type's width or more give 0.
std::vector<Tensor> bitshift_kernel(const Ctx& c) {
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  same_dtype(c, a, b);
  const std::string dir = c.node.s("direction");
  if (dir != "LEFT" && dir != "RIGHT") c.fail(fmt::format("direction must be LEFT or RIGHT, got '{}'", dir));
  const bool left = dir == "LEFT";
  Tensor out(a.dtype, broadcast_shapes(c, a.shape, b.shape));
  auto run = [&]<class T>() {
    bcast_binary<T, T>(a, b, out, [left](T x, T y) -> T {
      if (y >= sizeof(T) * 8) return T(0);
      return left ? static_cast<T>(x << y) : static_cast<T>(x >> y);
    });
  };
  switch (a.dtype) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kUInt16: run.template operator()<uint16_t>(); break;
    case DType::kUInt32: run.template operator()<uint32_t>(); break;
    case DType::kUInt64: run.template operator()<uint64_t>(); break;
    default: c.bad_dtype(a.dtype);
  }
  return one(std::move(out));
}

std::vector<Tensor> prelu_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& slope = c.req(1);
  same_dtype(c, x, slope);
  Shape ss = slope.shape;
  // Opset < 7 (no numpy broadcasting yet): a slope [C] is per channel, aligned with dim 1 of [N, C, ...]. Later
  // opsets broadcast numpy-style, but a [C] slope that cannot broadcast that way is still read per channel. The
  // PRelu sharding rule (core/rules/elementwise.cc) makes the same choice.
  const bool legacy = ss.size() == 1 && x.shape.size() >= 2 && ss[0] == x.shape[1] &&
                      ((c.opset < 7 && ss[0] > 1) || (x.shape.size() > 2 && x.shape.back() != ss[0]));
  if (legacy) {
    ss.resize(x.shape.size() - 1, 1);
  }
  Tensor sv = slope;
  sv.shape = ss;
  Tensor out(x.dtype, broadcast_shapes(c, x.shape, ss));
  if (out.shape != x.shape)
    c.fail(fmt::format("slope of shape {} does not broadcast to X of shape {}", shape_str(slope.shape),
                       shape_str(x.shape)));
  dispatch_numeric(c, x.dtype, [&]<class T>() {
    bcast_binary<T, T>(x, sv, out, [](T v, T s) { return v < T(0) ? static_cast<T>(v * s) : v; });
  });
  return one(std::move(out));
}

}  // namespace

void register_elementwise(KernelTable& t) {
  t["Add"] = binary_kernel<Bin::kAdd>;
  t["Sub"] = binary_kernel<Bin::kSub>;
  t["Mul"] = binary_kernel<Bin::kMul>;
  t["Div"] = binary_kernel<Bin::kDiv>;
  t["Pow"] = pow_kernel;
  t["Max"] = variadic_kernel<Bin::kMax>;
  t["Min"] = variadic_kernel<Bin::kMin>;
  t["Sum"] = variadic_kernel<Bin::kAdd>;
  t["Mean"] = variadic_kernel<Bin::kAdd, true>;
  t["Equal"] = compare_kernel<Cmp::kEq>;
  t["Less"] = compare_kernel<Cmp::kLt>;
  t["Greater"] = compare_kernel<Cmp::kGt>;
  t["LessOrEqual"] = compare_kernel<Cmp::kLe>;
  t["GreaterOrEqual"] = compare_kernel<Cmp::kGe>;
  t["And"] = logic_kernel<Logic::kAnd>;
  t["Or"] = logic_kernel<Logic::kOr>;
  t["Xor"] = logic_kernel<Logic::kXor>;
  t["Where"] = where_kernel;
  t["Mod"] = mod_kernel;
  t["PRelu"] = prelu_kernel;
  t["BitShift"] = bitshift_kernel;
}

}  // namespace gspmd::kern
