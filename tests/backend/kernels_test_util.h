// The kernels tests' helpers (tests/backend/kernels_*_test.cc): tensors by dtype, one node run, naive references.
#pragma once

#include "backend/kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <omp.h>

#include "tests/test_util/graph_builder.h"

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// Helpers.

using testing::make_node;

template <class T>
inline Tensor make(DType t, const Shape& s, const std::vector<T>& v) {
  Tensor r(t, s);
  EXPECT_EQ(static_cast<int64_t>(v.size()), r.numel());
  if (!v.empty()) std::memcpy(r.bytes.data(), v.data(), v.size() * sizeof(T));
  return r;
}
inline Tensor F(const Shape& s, const std::vector<float>& v) { return make<float>(DType::kFloat32, s, v); }
inline Tensor D(const Shape& s, const std::vector<double>& v) { return make<double>(DType::kFloat64, s, v); }
inline Tensor I(const Shape& s, const std::vector<int64_t>& v) { return make<int64_t>(DType::kInt64, s, v); }
inline Tensor I32(const Shape& s, const std::vector<int32_t>& v) { return make<int32_t>(DType::kInt32, s, v); }
inline Tensor B(const Shape& s, const std::vector<uint8_t>& v) { return make<uint8_t>(DType::kBool, s, v); }
inline Tensor I1(std::vector<int64_t> v) { return Tensor::from_int64s(v); }

using testing::rand_f;

template <class T>
inline std::vector<T> vals(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

inline std::vector<Tensor> run(const Node& n, const std::vector<const Tensor*>& in, int64_t opset = 17) {
  return run_kernel(n, in, opset);
}
inline Tensor run1(const Node& n, const std::vector<const Tensor*>& in, int64_t opset = 17) {
  auto o = run_kernel(n, in, opset);
  EXPECT_EQ(o.size(), 1u);
  return std::move(o.at(0));
}

inline void expect_near(const Tensor& got, const Tensor& want, double tol = 1e-5) {
  ASSERT_EQ(got.dtype, want.dtype);
  ASSERT_EQ(got.shape, want.shape);
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.dtype == DType::kFloat64 ? got.data<double>()[i] : got.data<float>()[i];
    const double w = want.dtype == DType::kFloat64 ? want.data<double>()[i] : want.data<float>()[i];
    ASSERT_NEAR(g, w, tol * std::max(1.0, std::abs(w))) << "at flat index " << i;
  }
}

/// Offset of output multi-index `idx` (of shape `out`) in a row-major tensor of shape `in` broadcast to `out`.
inline int64_t bcast_offset(const std::vector<int64_t>& idx, const Shape& in, const Shape& out) {
  int64_t off = 0;
  const size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) off = off * in[i] + (in[i] == 1 ? 0 : idx[lead + i]);
  return off;
}

using testing::unravel;

/// Naive broadcast binary reference over float32.
inline Tensor ref_binary(const Tensor& a, const Tensor& b, const Shape& out,
                         const std::function<float(float, float)>& f) {
  Tensor r(DType::kFloat32, out);
  for (int64_t i = 0; i < r.numel(); ++i) {
    const auto idx = unravel(i, out);
    r.data<float>()[i] =
        f(a.data<float>()[bcast_offset(idx, a.shape, out)], b.data<float>()[bcast_offset(idx, b.shape, out)]);
  }
  return r;
}

/// Naive batched matmul with broadcasting of batch dims (2-D+ operands).
inline Tensor ref_matmul(const Tensor& a, const Tensor& b, const Shape& out) {
  Tensor r(DType::kFloat32, out);
  const int64_t M = a.shape[a.shape.size() - 2], K = a.shape.back(), N = b.shape.back();
  const Shape bo(out.begin(), out.end() - 2);
  const Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  for (int64_t bi = 0; bi < num_elements(bo); ++bi) {
    const auto idx = unravel(bi, bo);
    const float* A = a.data<float>() + bcast_offset(idx, ba, bo) * M * K;
    const float* Bm = b.data<float>() + bcast_offset(idx, bb, bo) * K * N;
    float* C = r.data<float>() + bi * M * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[i * K + k]) * Bm[k * N + j];
        C[i * N + j] = static_cast<float>(s);
      }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// MatMul / Gemm.

struct MatMulCase {
  Shape a, b, out;
};

inline Tensor ref_softmax(const Tensor& x, int64_t outer, int64_t len, int64_t inner, bool log) {
  Tensor r(DType::kFloat32, x.shape);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      double mx = -1e30, sum = 0;
      for (int64_t i = 0; i < len; ++i) mx = std::max<double>(mx, x.data<float>()[(o * len + i) * inner + j]);
      for (int64_t i = 0; i < len; ++i) sum += std::exp(x.data<float>()[(o * len + i) * inner + j] - mx);
      for (int64_t i = 0; i < len; ++i) {
        const double v = x.data<float>()[(o * len + i) * inner + j] - mx;
        r.data<float>()[(o * len + i) * inner + j] = static_cast<float>(log ? v - std::log(sum) : std::exp(v) / sum);
      }
    }
  return r;
}

}  // namespace gspmd
