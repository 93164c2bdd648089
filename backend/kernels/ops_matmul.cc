// The matmul family (core/rules/matmul.cc): MatMul (numpy semantics), Gemm, and the integer and quantized matmuls
// MatMulInteger and QLinearMatMul (opset 10). Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's
// opset.
// float32 MatMul / Gemm run on oneDNN (onednn.h); float64 / integer types (and zero-sized edge cases) run on plain C++
// loops; MatMulInteger / QLinearMatMul accumulate in int32 (plain C++).
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"

namespace gspmd::kern {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// MatMul / Gemm.

/// C[batch,M,N] = A x B with A [a_batch,M,K] (row-major), B [b_batch,K,N]; a_batch, b_batch in {1, batch}.
template <class T>
void naive_matmul(const T* a, const T* b, T* c, int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n,
                  bool ta = false, bool tb = false, T alpha = T(1), T beta = T(0)) {
  const int64_t batch = std::max(a_batch, b_batch);
  std::vector<T> row(static_cast<size_t>(n));
  for (int64_t bi = 0; bi < batch; ++bi) {
    const T* A = a + (a_batch == 1 ? 0 : bi * m * k);
    const T* B = b + (b_batch == 1 ? 0 : bi * k * n);
    T* C = c + bi * m * n;
    for (int64_t i = 0; i < m; ++i) {
      std::fill(row.begin(), row.end(), T(0));
      for (int64_t p = 0; p < k; ++p) {
        const T av = ta ? A[p * m + i] : A[i * k + p];
        if (tb) {
          for (int64_t j = 0; j < n; ++j) row[j] += av * B[j * k + p];
        } else {
          const T* Br = B + p * n;
          for (int64_t j = 0; j < n; ++j) row[j] += av * Br[j];
        }
      }
      T* Cr = C + i * n;
      for (int64_t j = 0; j < n; ++j) Cr[j] = beta == T(0) ? alpha * row[j] : alpha * row[j] + beta * Cr[j];
    }
  }
}

template <class T>
void mm(const T* a, const T* b, T* c, int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    dnn::matmul(a, b, c, a_batch, b_batch, m, k, n);
  else
    naive_matmul(a, b, c, a_batch, b_batch, m, k, n);
}

std::vector<Tensor> matmul_kernel(const Ctx& c) {
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  if (a.dtype != b.dtype)
    c.fail(fmt::format("input dtypes differ ({} vs {})", dtype_name(a.dtype), dtype_name(b.dtype)));
  if (a.shape.empty() || b.shape.empty()) c.fail("inputs must have rank >= 1");
  Shape as = a.shape, bs = b.shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  if (bs[bs.size() - 2] != k)
    c.fail(fmt::format("shapes {} and {} are not aligned for matmul", shape_str(a.shape), shape_str(b.shape)));
  const Shape ba(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const Shape bo = broadcast_shapes(c, ba, bb);
  Shape os = bo;
  if (a.shape.size() > 1) os.push_back(m);
  if (b.shape.size() > 1) os.push_back(n);
  Tensor out(a.dtype, os);
  if (out.numel() == 0 || k == 0) return one(std::move(out));
  const int64_t batch = num_elements(bo), na = num_elements(ba), nb = num_elements(bb);
  dispatch_numeric(c, a.dtype, [&]<class T>() {
    const T* A = a.data<T>();
    const T* B = b.data<T>();
    T* C = out.data<T>();
    if ((na == batch || na == 1) && (nb == batch || nb == 1)) {
      mm<T>(A, B, C, na, nb, m, k, n);
      return;
    }
    // General batch broadcasting: one matrix product per output batch entry.
    std::vector<int64_t> so = contiguous_strides(bo), sa = broadcast_strides(ba, bo), sb = broadcast_strides(bb, bo);
    const Plan<3> p = make_plan<3>(bo, {so.data(), sa.data(), sb.data()});
    for_each_row(p, [&](const std::array<int64_t, 3>& off, int64_t cnt, const std::array<int64_t, 3>& st) {
      for (int64_t i = 0; i < cnt; ++i)
        mm<T>(A + (off[1] + i * st[1]) * m * k, B + (off[2] + i * st[2]) * k * n, C + (off[0] + i * st[0]) * m * n, 1,
              1, m, k, n);
    });
  });
  return one(std::move(out));
}

std::vector<Tensor> gemm_kernel(const Ctx& c) {
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  const Tensor* cin = c.in(2);
  if (a.dtype != b.dtype || (cin && cin->dtype != a.dtype)) c.fail("input dtypes differ");
  if (a.shape.size() != 2 || b.shape.size() != 2) c.fail("A and B must be 2-D");
  const bool ta = c.node.i("transA", 0) != 0, tb = c.node.i("transB", 0) != 0;
  const float alpha = c.node.f("alpha", 1.f);
  float beta = c.node.f("beta", 1.f);
  const int64_t m = ta ? a.shape[1] : a.shape[0], k = ta ? a.shape[0] : a.shape[1];
  const int64_t kb = tb ? b.shape[1] : b.shape[0], n = tb ? b.shape[0] : b.shape[1];
  if (k != kb)
    c.fail(fmt::format("shapes {} and {} are not aligned (transA={}, transB={})", shape_str(a.shape),
                       shape_str(b.shape), ta, tb));
  const Shape os{m, n};
  Tensor out;
  if (cin && beta != 0.f) {
    if (broadcast_shapes(c, cin->shape, os) != os)
      c.fail(fmt::format("C of shape {} does not broadcast to {}", shape_str(cin->shape), shape_str(os)));
    out = broadcast_to(*cin, os);
  } else {
    out = Tensor(a.dtype, os);
    beta = 0.f;
  }
  if (out.numel() == 0) return one(std::move(out));
  dispatch_numeric(c, a.dtype, [&]<class T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (k > 0) {
        dnn::matmul(a.data<float>(), b.data<float>(), out.data<float>(), 1, 1, m, k, n, ta, tb, alpha, beta);
        return;
      }
    }
    naive_matmul<T>(a.data<T>(), b.data<T>(), out.data<T>(), 1, 1, m, k, n, ta, tb, static_cast<T>(alpha),
                    static_cast<T>(beta));
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// MatMulInteger / QLinearMatMul.

/// Integer values of an int8/uint8/int32 tensor as int32.
std::vector<int32_t> int_values(const Ctx& c, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::kUInt8:
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<uint8_t>()[i];
      break;
    case DType::kInt8:
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<int8_t>()[i];
      break;
    case DType::kInt32:
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<int32_t>()[i];
      break;
    default: c.bad_dtype(t.dtype);
  }
  return v;
}

/// (A - a_zp) @ (B - b_zp) in int32 with numpy matmul broadcasting of the batch dims; a_zp is a scalar or per row
/// of A ([M]), b_zp a scalar or per column of B ([N]). Returns the int32 result.
Tensor int_matmul(const Ctx& c, const Tensor& a, const Tensor& b, const Tensor* azp, const Tensor* bzp) {
  if (a.shape.size() < 2 || b.shape.size() < 2) c.unsupported("no kernel for 1-D MatMulInteger operands");
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
  if ((az.size() != 1 && static_cast<int64_t>(az.size()) != M) ||
      (bz.size() != 1 && static_cast<int64_t>(bz.size()) != N))
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
      o[i] = static_cast<T>(
          std::min(hi, std::max(lo, std::nearbyint(static_cast<float>(p[i]) * s) + static_cast<float>(z))));
  };
  switch (yz.dtype) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kInt8: run.template operator()<int8_t>(); break;
    default: c.bad_dtype(yz.dtype);
  }
  return one(std::move(out));
}

}  // namespace

void register_matmul(KernelTable& t) {
  t["MatMul"] = matmul_kernel;
  t["Gemm"] = gemm_kernel;
  t["MatMulInteger"] = matmul_integer_kernel;
  t["QLinearMatMul"] = qlinear_matmul_kernel;
}

}  // namespace gspmd::kern
