// Tests for backend/kernels: real numbers against hand-computed values or naive references written here.
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
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Helpers.

using testing::make_node;

template <class T>
Tensor make(DType t, const Shape& s, const std::vector<T>& v) {
  Tensor r(t, s);
  EXPECT_EQ(static_cast<int64_t>(v.size()), r.numel());
  if (!v.empty()) std::memcpy(r.bytes.data(), v.data(), v.size() * sizeof(T));
  return r;
}
Tensor F(const Shape& s, const std::vector<float>& v) { return make<float>(DType::kFloat32, s, v); }
Tensor D(const Shape& s, const std::vector<double>& v) { return make<double>(DType::kFloat64, s, v); }
Tensor I(const Shape& s, const std::vector<int64_t>& v) { return make<int64_t>(DType::kInt64, s, v); }
Tensor I32(const Shape& s, const std::vector<int32_t>& v) { return make<int32_t>(DType::kInt32, s, v); }
Tensor B(const Shape& s, const std::vector<uint8_t>& v) { return make<uint8_t>(DType::kBool, s, v); }
Tensor I1(std::vector<int64_t> v) { return Tensor::from_int64s(v); }

using testing::rand_f;

template <class T>
std::vector<T> vals(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

std::vector<Tensor> run(const Node& n, const std::vector<const Tensor*>& in, int64_t opset = 17) {
  return run_kernel(n, in, opset);
}
Tensor run1(const Node& n, const std::vector<const Tensor*>& in, int64_t opset = 17) {
  auto o = run_kernel(n, in, opset);
  EXPECT_EQ(o.size(), 1u);
  return std::move(o.at(0));
}

void expect_near(const Tensor& got, const Tensor& want, double tol = 1e-5) {
  ASSERT_EQ(got.dtype, want.dtype);
  ASSERT_EQ(got.shape, want.shape);
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.dtype == DType::kFloat64 ? got.data<double>()[i] : got.data<float>()[i];
    const double w = want.dtype == DType::kFloat64 ? want.data<double>()[i] : want.data<float>()[i];
    ASSERT_NEAR(g, w, tol * std::max(1.0, std::abs(w))) << "at flat index " << i;
  }
}

/// Offset of output multi-index `idx` (of shape `out`) in a row-major tensor of shape `in` broadcast to `out`.
int64_t bcast_offset(const std::vector<int64_t>& idx, const Shape& in, const Shape& out) {
  int64_t off = 0;
  const size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) off = off * in[i] + (in[i] == 1 ? 0 : idx[lead + i]);
  return off;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t i = s.size(); i-- > 0;) {
    idx[i] = flat % s[i];
    flat /= s[i];
  }
  return idx;
}

/// Naive broadcast binary reference over float32.
Tensor ref_binary(const Tensor& a, const Tensor& b, const Shape& out, const std::function<float(float, float)>& f) {
  Tensor r(DType::kFloat32, out);
  for (int64_t i = 0; i < r.numel(); ++i) {
    const auto idx = unravel(i, out);
    r.data<float>()[i] =
        f(a.data<float>()[bcast_offset(idx, a.shape, out)], b.data<float>()[bcast_offset(idx, b.shape, out)]);
  }
  return r;
}

/// Naive batched matmul with broadcasting of batch dims (2-D+ operands).
Tensor ref_matmul(const Tensor& a, const Tensor& b, const Shape& out) {
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

TEST(KernelsParallel, LargeElementwiseAndCopiesSplitRowsAcrossThreads) {
  // Above 2^16 elements the hand-written elementwise kernels (int32 Add, Where) split rows across OpenMP threads;
  // the suite runs with OMP_NUM_THREADS=1, so this test asks for 2 threads itself and checks against plain loops.
  omp_set_num_threads(2);
  const int64_t R = 517, C = 263;  // 135,971 elements, rows of odd length
  std::vector<int32_t> a(R * C), b(R);
  for (int64_t i = 0; i < R * C; ++i) a[i] = static_cast<int32_t>(i * 7 % 1000) - 500;
  for (int64_t i = 0; i < R; ++i) b[i] = static_cast<int32_t>(i % 13);
  const Tensor ta = I32({R, C}, a), tb = I32({R, 1}, b);
  Tensor sum = run1(make_node("Add"), {&ta, &tb});
  Tensor tr = run1(make_node("Transpose", {{"perm", std::vector<int64_t>{1, 0}}}), {&sum});
  std::vector<uint8_t> cond(R * C);
  for (int64_t i = 0; i < R * C; ++i) cond[i] = (i % 3) == 0;
  const Tensor tc = B({R, C}, cond);
  Tensor w = run1(make_node("Where"), {&tc, &ta, &sum});
  omp_set_num_threads(1);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = r * C + c;
      ASSERT_EQ(sum.data<int32_t>()[i], a[i] + b[r]) << r << "," << c;
      ASSERT_EQ(tr.data<int32_t>()[c * R + r], a[i] + b[r]) << r << "," << c;
      const int32_t want = cond[i] ? a[i] : a[i] + b[r];
      ASSERT_EQ(w.data<int32_t>()[i], want) << r << "," << c;
    }
}

TEST(KernelsMatMul, BatchedWithBroadcastMatchesTripleLoop) {
  const std::vector<MatMulCase> cases = {
      {{4, 5}, {5, 6}, {4, 6}},
      {{3, 4, 5}, {5, 6}, {3, 4, 6}},           // shared weights (folded into M)
      {{3, 4, 5}, {3, 5, 6}, {3, 4, 6}},        // equal batch
      {{4, 5}, {3, 5, 6}, {3, 4, 6}},           // A broadcast over batch
      {{2, 1, 4, 5}, {3, 5, 6}, {2, 3, 4, 6}},  // general broadcast
      {{2, 3, 1, 7, 16}, {1, 3, 4, 16, 9}, {2, 3, 4, 7, 9}},
      {{1, 4, 5}, {2, 5, 6}, {2, 4, 6}},
  };
  uint32_t seed = 1;
  for (const auto& c : cases) {
    const Tensor a = rand_f(c.a, seed++), b = rand_f(c.b, seed++);
    const Tensor got = run1(make_node("MatMul"), {&a, &b});
    SCOPED_TRACE(shape_str(c.a) + " x " + shape_str(c.b));
    expect_near(got, ref_matmul(a, b, c.out), 1e-5);
  }
}

TEST(KernelsMatMul, OneDimensionalOperands) {
  const Tensor v = F({3}, {1, 2, 3});
  const Tensor m = F({2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  // [3] x [2,3,2] -> [2,2]
  expect_near(run1(make_node("MatMul"), {&v, &m}), F({2, 2}, {22, 28, 58, 64}));
  // [2,2,3] x [3] -> [2,2]
  const Tensor m2 = F({2, 2, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1});
  expect_near(run1(make_node("MatMul"), {&m2, &v}), F({2, 2}, {1, 2, 3, 6}));
  // [3] x [3] -> scalar
  const Tensor dot = run1(make_node("MatMul"), {&v, &v});
  EXPECT_EQ(dot.shape, Shape{});
  EXPECT_FLOAT_EQ(dot.data<float>()[0], 14.f);
}

TEST(KernelsMatMul, IntegerAndDouble) {
  const Tensor a = I({2, 2}, {1, 2, 3, 4}), b = I({2, 2}, {5, 6, 7, 8});
  EXPECT_EQ(vals<int64_t>(run1(make_node("MatMul"), {&a, &b})), (std::vector<int64_t>{19, 22, 43, 50}));
  const Tensor ad = D({1, 2}, {0.5, 1.5}), bd = D({2, 1}, {2, 4});
  EXPECT_EQ(vals<double>(run1(make_node("MatMul"), {&ad, &bd})), (std::vector<double>{7.0}));
}

TEST(KernelsMatMul, LargeMatchesReference) {
  const Tensor a = rand_f({2, 64, 96}, 11), b = rand_f({96, 80}, 12);
  expect_near(run1(make_node("MatMul"), {&a, &b}), ref_matmul(a, b, {2, 64, 80}), 1e-4);
}

TEST(KernelsMatMul, MisalignedFails) {
  const Tensor a = rand_f({2, 3}, 1), b = rand_f({4, 2}, 2);
  try {
    run(make_node("MatMul"), {&a, &b});
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "node 'n1' (MatMul): shapes [2,3] and [4,2] are not aligned for matmul");
  }
}

Tensor ref_gemm(const Tensor& a, const Tensor& b, const Tensor* c, bool ta, bool tb, float alpha, float beta) {
  const int64_t M = ta ? a.shape[1] : a.shape[0], K = ta ? a.shape[0] : a.shape[1];
  const int64_t N = tb ? b.shape[0] : b.shape[1];
  Tensor r(DType::kFloat32, {M, N});
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float av = ta ? a.data<float>()[k * M + i] : a.data<float>()[i * K + k];
        const float bv = tb ? b.data<float>()[j * K + k] : b.data<float>()[k * N + j];
        s += static_cast<double>(av) * bv;
      }
      double cv = 0;
      if (c) cv = c->data<float>()[bcast_offset({i, j}, c->shape, {M, N})];
      r.data<float>()[i * N + j] = static_cast<float>(alpha * s + beta * cv);
    }
  return r;
}

TEST(KernelsGemm, TransposesAlphaBetaAndBroadcastC) {
  const int64_t M = 5, K = 7, N = 3;
  uint32_t seed = 100;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (const Shape& cs : {Shape{N}, Shape{M, 1}, Shape{M, N}, Shape{}, Shape{1}}) {
        const Tensor a = rand_f(ta ? Shape{K, M} : Shape{M, K}, seed++);
        const Tensor b = rand_f(tb ? Shape{N, K} : Shape{K, N}, seed++);
        const Tensor c = rand_f(cs, seed++);
        Node n = make_node("Gemm", {{"transA", int64_t{ta}}, {"transB", int64_t{tb}}, {"alpha", 0.5f}, {"beta", 2.f}});
        SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " C=" + shape_str(cs));
        expect_near(run1(n, {&a, &b, &c}), ref_gemm(a, b, &c, ta, tb, 0.5f, 2.f));
      }
}

TEST(KernelsGemm, NoCAndDefaults) {
  const Tensor a = F({2, 2}, {1, 2, 3, 4}), b = F({2, 2}, {1, 0, 0, 1});
  expect_near(run1(make_node("Gemm"), {&a, &b, nullptr}), a);
  expect_near(run1(make_node("Gemm"), {&a, &b}), a);
  const Tensor ai = I({1, 2}, {2, 3}), bi = I({2, 1}, {4, 5}), ci = I({1}, {1});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Gemm"), {&ai, &bi, &ci})), (std::vector<int64_t>{24}));
}

// ---------------------------------------------------------------------------------------------------------------
// Elementwise binary.

TEST(KernelsBinary, BroadcastSmallHandComputed) {
  // [2,1,3] + [4,1] -> [2,4,3]
  const Tensor a = F({2, 1, 3}, {0, 1, 2, 10, 11, 12});
  const Tensor b = F({4, 1}, {100, 200, 300, 400});
  const Tensor got = run1(make_node("Add"), {&a, &b});
  ASSERT_EQ(got.shape, (Shape{2, 4, 3}));
  EXPECT_EQ(vals<float>(got), (std::vector<float>{100, 101, 102, 200, 201, 202, 300, 301, 302, 400, 401, 402,
                                                  110, 111, 112, 210, 211, 212, 310, 311, 312, 410, 411, 412}));
  const Tensor sub = run1(make_node("Sub"), {&b, &a});
  EXPECT_FLOAT_EQ(sub.data<float>()[0], 100.f);
  EXPECT_FLOAT_EQ(sub.data<float>()[23], 388.f);
}

TEST(KernelsBinary, AllOpsAllBroadcastPatternsMatchReference) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 1, 3}, {4, 1}},    {{64, 128}, {128}},     {{128}, {64, 128}},
      {{64, 128}, {64, 1}},   {{8, 1, 600}, {16, 1}}, {{32, 1, 256}, {32, 8, 1}},
      {{96, 100}, {96, 100}}, {{}, {50, 100}},        {{7, 300, 5}, {1}},
      {{3, 4}, {}},
  };
  const std::vector<std::pair<std::string, std::function<float(float, float)>>> ops = {
      {"Add", [](float x, float y) { return x + y; }},
      {"Sub", [](float x, float y) { return x - y; }},
      {"Mul", [](float x, float y) { return x * y; }},
      {"Div", [](float x, float y) { return x / y; }},
      {"Max", [](float x, float y) { return std::max(x, y); }},
      {"Min", [](float x, float y) { return std::min(x, y); }},
  };
  uint32_t seed = 7;
  for (const auto& [sa, sb] : shapes) {
    const Tensor a = rand_f(sa, seed++, 0.5f, 2.f), b = rand_f(sb, seed++, 0.5f, 2.f);
    Shape out(std::max(sa.size(), sb.size()));
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t da = i + sa.size() >= out.size() ? sa[i + sa.size() - out.size()] : 1;
      const int64_t db = i + sb.size() >= out.size() ? sb[i + sb.size() - out.size()] : 1;
      out[i] = std::max(da, db);
    }
    for (const auto& [op, f] : ops) {
      SCOPED_TRACE(op + " " + shape_str(sa) + " x " + shape_str(sb));
      expect_near(run1(make_node(op), {&a, &b}), ref_binary(a, b, out, f), 1e-6);
    }
  }
}

TEST(KernelsBinary, IntegerDivTruncatesLikeC) {
  const Tensor a = I({6}, {7, -7, 7, -7, 1, 5}), b = I({6}, {2, 2, -2, -2, 3, 0});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Div"), {&a, &b})), (std::vector<int64_t>{3, -3, -3, 3, 0, 0}));
  const Tensor a32 = I32({2, 2}, {9, -9, 10, 11}), b32 = I32({2}, {4, 4});
  EXPECT_EQ(vals<int32_t>(run1(make_node("Div"), {&a32, &b32})), (std::vector<int32_t>{2, -2, 2, 2}));
}

TEST(KernelsBinary, IntegerArithmeticBroadcast) {
  const Tensor a = I({2, 1}, {1, 2}), b = I({3}, {10, 20, 30});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Mul"), {&a, &b})), (std::vector<int64_t>{10, 20, 30, 20, 40, 60}));
  EXPECT_EQ(vals<int64_t>(run1(make_node("Sub"), {&a, &b})), (std::vector<int64_t>{-9, -19, -29, -8, -18, -28}));
}

TEST(KernelsBinary, Pow) {
  const Tensor a = F({3}, {2, 3, 4}), e = F({1}, {0.5f});
  expect_near(run1(make_node("Pow"), {&a, &e}), F({3}, {std::sqrt(2.f), std::sqrt(3.f), 2.f}));
  const Tensor ei = I({}, {3});
  expect_near(run1(make_node("Pow"), {&a, &ei}), F({3}, {8, 27, 64}));
  const Tensor ai = I({2}, {2, -3}), e2 = I({2}, {10, 3});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Pow"), {&ai, &e2})), (std::vector<int64_t>{1024, -27}));
}

TEST(KernelsBinary, VariadicMaxMinSumMean) {
  const Tensor a = F({2, 1}, {1, 5}), b = F({3}, {2, 3, 4}), c = F({}, {3});
  expect_near(run1(make_node("Max"), {&a, &b, &c}), F({2, 3}, {3, 3, 4, 5, 5, 5}));
  expect_near(run1(make_node("Min"), {&a, &b, &c}), F({2, 3}, {1, 1, 1, 2, 3, 3}));
  expect_near(run1(make_node("Sum"), {&a, &b, &c}), F({2, 3}, {6, 7, 8, 10, 11, 12}));
  expect_near(run1(make_node("Mean"), {&a, &b}), F({2, 3}, {1.5f, 2, 2.5f, 3.5f, 4, 4.5f}));
  expect_near(run1(make_node("Sum"), {&b}), b);
}

TEST(KernelsBinary, DtypeMismatchAndBroadcastErrors) {
  const Tensor a = F({2, 3}, {1, 2, 3, 4, 5, 6}), b = F({4}, {1, 2, 3, 4});
  try {
    run(make_node("Add"), {&a, &b});
    FAIL();
  } catch (const SpecError& e) {  // a spec violation, not unsupported
    EXPECT_STREQ(e.what(), "node 'n1' (Add): shapes [2,3] and [4] cannot broadcast");
  }
  const Tensor i = I({3}, {1, 2, 3});
  try {
    run(make_node("Mul"), {&a, &i});
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_STREQ(e.what(), "node 'n1' (Mul): input dtypes differ (float32 vs int64)");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Comparisons, logic, Where.

TEST(KernelsLogic, ComparisonsBroadcast) {
  const Tensor a = I({2, 1}, {1, 3}), b = I({3}, {1, 2, 3});
  EXPECT_EQ(vals<uint8_t>(run1(make_node("Equal"), {&a, &b})), (std::vector<uint8_t>{1, 0, 0, 0, 0, 1}));
  EXPECT_EQ(vals<uint8_t>(run1(make_node("Less"), {&a, &b})), (std::vector<uint8_t>{0, 1, 1, 0, 0, 0}));
  EXPECT_EQ(vals<uint8_t>(run1(make_node("Greater"), {&a, &b})), (std::vector<uint8_t>{0, 0, 0, 1, 1, 0}));
  EXPECT_EQ(vals<uint8_t>(run1(make_node("LessOrEqual"), {&a, &b})), (std::vector<uint8_t>{1, 1, 1, 0, 0, 1}));
  EXPECT_EQ(vals<uint8_t>(run1(make_node("GreaterOrEqual"), {&a, &b})), (std::vector<uint8_t>{1, 0, 0, 1, 1, 1}));
  const Tensor fa = F({2}, {0.5f, -1.f}), fb = F({}, {0.f});
  const Tensor g = run1(make_node("Greater"), {&fa, &fb});
  EXPECT_EQ(g.dtype, DType::kBool);
  EXPECT_EQ(vals<uint8_t>(g), (std::vector<uint8_t>{1, 0}));
}

TEST(KernelsLogic, AndOrNotWhere) {
  const Tensor a = B({2, 2}, {1, 1, 0, 0}), b = B({2}, {1, 0});
  EXPECT_EQ(vals<uint8_t>(run1(make_node("And"), {&a, &b})), (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(vals<uint8_t>(run1(make_node("Or"), {&a, &b})), (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(vals<uint8_t>(run1(make_node("Not"), {&a})), (std::vector<uint8_t>{0, 0, 1, 1}));
  // Where with 3-way broadcasting: cond [2,1], x [3], y scalar.
  const Tensor c = B({2, 1}, {1, 0}), x = F({3}, {1, 2, 3}), y = F({}, {-1});
  expect_near(run1(make_node("Where"), {&c, &x, &y}), F({2, 3}, {1, 2, 3, -1, -1, -1}));
  const Tensor xi = I({2, 3}, {1, 2, 3, 4, 5, 6}), yi = I({3}, {7, 8, 9}), ci = B({3}, {0, 1, 0});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Where"), {&ci, &xi, &yi})), (std::vector<int64_t>{7, 2, 9, 7, 5, 9}));
}

// ---------------------------------------------------------------------------------------------------------------
// Unary.

TEST(KernelsUnary, MatchStdSmallAndLarge) {
  struct U {
    std::string op;
    std::function<float(float)> f;
    float lo, hi;
  };
  const std::vector<U> ops = {
      {"Relu", [](float x) { return x > 0 ? x : 0.f; }, -2, 2},
      {"Tanh", [](float x) { return std::tanh(x); }, -3, 3},
      {"Exp", [](float x) { return std::exp(x); }, -5, 5},
      {"Sqrt", [](float x) { return std::sqrt(x); }, 0, 10},
      {"Erf", [](float x) { return std::erf(x); }, -3, 3},
      {"Log", [](float x) { return std::log(x); }, 0.01f, 10},
      {"Neg", [](float x) { return -x; }, -2, 2},
      {"Abs", [](float x) { return std::abs(x); }, -2, 2},
      {"Reciprocal", [](float x) { return 1.f / x; }, 0.5f, 4},
      {"Sigmoid", [](float x) { return 1.f / (1.f + std::exp(-x)); }, -6, 6},
      {"Floor", [](float x) { return std::floor(x); }, -3, 3},
      {"Ceil", [](float x) { return std::ceil(x); }, -3, 3},
  };
  uint32_t seed = 50;
  for (const auto& u : ops)
    for (const Shape& s : {Shape{7}, Shape{64, 130}}) {  // below and above the oneDNN threshold
      const Tensor x = rand_f(s, seed++, u.lo, u.hi);
      Tensor want(DType::kFloat32, s);
      for (int64_t i = 0; i < x.numel(); ++i) want.data<float>()[i] = u.f(x.data<float>()[i]);
      SCOPED_TRACE(u.op + " " + shape_str(s));
      expect_near(run1(make_node(u.op), {&x}), want, 1e-5);  // oneDNN approximations: a few ulp
    }
}

TEST(KernelsUnary, IntegerAndDouble) {
  const Tensor i = I({3}, {-2, 0, 3});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Neg"), {&i})), (std::vector<int64_t>{2, 0, -3}));
  EXPECT_EQ(vals<int64_t>(run1(make_node("Abs"), {&i})), (std::vector<int64_t>{2, 0, 3}));
  EXPECT_EQ(vals<int64_t>(run1(make_node("Relu"), {&i})), (std::vector<int64_t>{0, 0, 3}));
  const Tensor d = D({2}, {4.0, 9.0});
  EXPECT_EQ(vals<double>(run1(make_node("Sqrt"), {&d})), (std::vector<double>{2.0, 3.0}));
}

TEST(KernelsUnary, CastAllPairs) {
  const Tensor f = F({4}, {1.7f, -2.5f, 0.f, 3.f});
  auto cast = [&](const Tensor& t, DType to) {
    return run1(make_node("Cast", {{"to", static_cast<int64_t>(to)}}), {&t});
  };
  EXPECT_EQ(vals<int64_t>(cast(f, DType::kInt64)), (std::vector<int64_t>{1, -2, 0, 3}));
  EXPECT_EQ(vals<int32_t>(cast(f, DType::kInt32)), (std::vector<int32_t>{1, -2, 0, 3}));
  EXPECT_EQ(vals<uint8_t>(cast(f, DType::kBool)), (std::vector<uint8_t>{1, 1, 0, 1}));
  EXPECT_EQ(vals<double>(cast(f, DType::kFloat64)), (std::vector<double>{1.7f, -2.5f, 0.0, 3.0}));
  const Tensor b = B({3}, {1, 0, 1});
  EXPECT_EQ(vals<float>(cast(b, DType::kFloat32)), (std::vector<float>{1, 0, 1}));
  const Tensor i = I({2}, {5, 0});
  EXPECT_EQ(vals<uint8_t>(cast(i, DType::kBool)), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(vals<float>(cast(i, DType::kFloat32)), (std::vector<float>{5, 0}));
  EXPECT_EQ(cast(i, DType::kInt64).dtype, DType::kInt64);
}

TEST(KernelsUnary, Clip) {
  const Tensor x = F({5}, {-3, -1, 0, 1, 3}), lo = F({}, {-1.5f}), hi = F({}, {2});
  expect_near(run1(make_node("Clip"), {&x, &lo, &hi}), F({5}, {-1.5f, -1, 0, 1, 2}));
  expect_near(run1(make_node("Clip"), {&x, nullptr, &hi}), F({5}, {-3, -1, 0, 1, 2}));
  expect_near(run1(make_node("Clip"), {&x, &lo}), F({5}, {-1.5f, -1, 0, 1, 3}));
  expect_near(run1(make_node("Clip"), {&x}), x);
  const Tensor xi = I({3}, {-5, 5, 50}), loi = I({}, {0}), hii = I({}, {10});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Clip"), {&xi, &loi, &hii})), (std::vector<int64_t>{0, 5, 10}));
}

// ---------------------------------------------------------------------------------------------------------------
// Softmax / LayerNorm.

Tensor ref_softmax(const Tensor& x, int64_t outer, int64_t len, int64_t inner, bool log) {
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

TEST(KernelsSoftmax, Opset13SingleAxis) {
  const Tensor x = rand_f({4, 5, 6}, 3, -4, 4);
  for (int64_t axis : {0, 1, 2, -1}) {
    const int64_t a = axis < 0 ? axis + 3 : axis;
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < a; ++i) outer *= x.shape[i];
    for (int64_t i = a + 1; i < 3; ++i) inner *= x.shape[i];
    const Tensor got = run1(make_node("Softmax", {{"axis", axis}}), {&x}, 13);
    expect_near(got, ref_softmax(x, outer, x.shape[a], inner, false), 1e-5);
    expect_near(run1(make_node("LogSoftmax", {{"axis", axis}}), {&x}, 13),
                ref_softmax(x, outer, x.shape[a], inner, true), 1e-5);
  }
  // Default axis -1: rows sum to 1.
  const Tensor got = run1(make_node("Softmax"), {&x}, 17);
  for (int64_t r = 0; r < 20; ++r) {
    double s = 0;
    for (int64_t i = 0; i < 6; ++i) s += got.data<float>()[r * 6 + i];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

TEST(KernelsSoftmax, Opset11CoercesTo2D) {
  const Tensor x = rand_f({2, 3, 4}, 4, -2, 2);
  // Default axis 1 at opset < 13: each of the 2 rows of 12 elements sums to 1.
  const Tensor got = run1(make_node("Softmax"), {&x}, 11);
  expect_near(got, ref_softmax(x, 2, 12, 1, false), 1e-5);
  expect_near(run1(make_node("LogSoftmax", {{"axis", int64_t{2}}}), {&x}, 11), ref_softmax(x, 6, 4, 1, true), 1e-5);
  expect_near(run1(make_node("Softmax", {{"axis", int64_t{0}}}), {&x}, 11), ref_softmax(x, 1, 24, 1, false), 1e-5);
}

TEST(KernelsSoftmax, Double) {
  const Tensor x = D({2, 2}, {0.0, std::log(3.0), 1.0, 1.0});
  const Tensor got = run1(make_node("Softmax"), {&x}, 13);
  EXPECT_NEAR(got.data<double>()[0], 0.25, 1e-12);
  EXPECT_NEAR(got.data<double>()[1], 0.75, 1e-12);
  EXPECT_NEAR(got.data<double>()[2], 0.5, 1e-12);
}

void ref_layer_norm(const Tensor& x, int64_t outer, int64_t inner, const Tensor* scale, const Tensor* bias, float eps,
                    Tensor& y, Tensor& mean, Tensor& inv) {
  for (int64_t o = 0; o < outer; ++o) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < inner; ++i) mu += x.data<float>()[o * inner + i];
    mu /= inner;
    for (int64_t i = 0; i < inner; ++i) var += std::pow(x.data<float>()[o * inner + i] - mu, 2);
    var /= inner;
    const double is = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < inner; ++i) {
      double v = (x.data<float>()[o * inner + i] - mu) * is;
      if (scale) v *= scale->data<float>()[i];
      if (bias) v += bias->data<float>()[i];
      y.data<float>()[o * inner + i] = static_cast<float>(v);
    }
    mean.data<float>()[o] = static_cast<float>(mu);
    inv.data<float>()[o] = static_cast<float>(is);
  }
}

TEST(KernelsLayerNorm, MatchesNaiveWithStats) {
  const Tensor x = rand_f({4, 6, 8}, 21, -3, 3);
  for (int64_t axis : {-1, 1}) {
    const int64_t a = axis < 0 ? 2 : axis;
    const Shape ns(x.shape.begin() + a, x.shape.end());
    const int64_t inner = num_elements(ns), outer = x.numel() / inner;
    const Tensor scale = rand_f(ns, 22), bias = rand_f(ns, 23);
    Shape ss = {4, 1, 1};
    if (a == 2) ss = {4, 6, 1};
    Tensor y(DType::kFloat32, x.shape), mean(DType::kFloat32, ss), inv(DType::kFloat32, ss);
    ref_layer_norm(x, outer, inner, &scale, &bias, 1e-3f, y, mean, inv);
    const auto out = run(make_node("LayerNormalization", {{"axis", axis}, {"epsilon", 1e-3f}}, 3), {&x, &scale, &bias});
    ASSERT_EQ(out.size(), 3u);
    SCOPED_TRACE("axis " + std::to_string(axis));
    expect_near(out[0], y, 1e-4);
    expect_near(out[1], mean, 1e-5);
    expect_near(out[2], inv, 1e-4);
    // Scale only, one output.
    ref_layer_norm(x, outer, inner, &scale, nullptr, 1e-3f, y, mean, inv);
    const auto out1 = run(make_node("LayerNormalization", {{"axis", axis}, {"epsilon", 1e-3f}}), {&x, &scale});
    ASSERT_EQ(out1.size(), 1u);
    expect_near(out1[0], y, 1e-4);
  }
}

TEST(KernelsLayerNorm, BroadcastScaleAndDouble) {
  // Scale of shape [1] broadcast over the normalized shape.
  const Tensor x = F({2, 2}, {1, 3, 2, 2}), s = F({1}, {2});
  const Tensor y = run1(make_node("LayerNormalization", {{"epsilon", 1e-6f}}), {&x, &s});
  EXPECT_NEAR(y.data<float>()[0], -2.f, 1e-5);
  EXPECT_NEAR(y.data<float>()[1], 2.f, 1e-5);
  EXPECT_NEAR(y.data<float>()[2], 0.f, 1e-5);
  const Tensor xd = D({1, 2}, {1, 3}), sd = D({2}, {1, 1}), bd = D({2}, {10, 20});
  const auto o = run(make_node("LayerNormalization", {{"epsilon", 0.f}}, 3), {&xd, &sd, &bd});
  EXPECT_NEAR(o[0].data<double>()[0], 9.0, 1e-12);
  EXPECT_NEAR(o[0].data<double>()[1], 21.0, 1e-12);
  EXPECT_NEAR(o[1].data<double>()[0], 2.0, 1e-12);
  EXPECT_NEAR(o[2].data<double>()[0], 1.0, 1e-12);
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions.

TEST(KernelsReduce, HandComputed) {
  const Tensor x = F({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor ax1 = I1({1}), axn = I1({-2});
  Tensor s = run1(make_node("ReduceSum"), {&x, &ax1}, 13);
  EXPECT_EQ(s.shape, (Shape{2, 1}));
  EXPECT_EQ(vals<float>(s), (std::vector<float>{6, 15}));
  s = run1(make_node("ReduceSum", {{"keepdims", int64_t{0}}}), {&x, &axn}, 13);
  EXPECT_EQ(s.shape, (Shape{3}));
  EXPECT_EQ(vals<float>(s), (std::vector<float>{5, 7, 9}));
  // Opset 11: axes attribute.
  s = run1(make_node("ReduceSum", {{"axes", std::vector<int64_t>{0}}}), {&x}, 11);
  EXPECT_EQ(vals<float>(s), (std::vector<float>{5, 7, 9}));
  // Empty axes: reduce all, or noop.
  s = run1(make_node("ReduceSum", {{"keepdims", int64_t{0}}}), {&x}, 13);
  EXPECT_EQ(s.shape, Shape{});
  EXPECT_EQ(vals<float>(s), (std::vector<float>{21}));
  s = run1(make_node("ReduceSum", {{"noop_with_empty_axes", int64_t{1}}}), {&x}, 13);
  EXPECT_EQ(s.shape, x.shape);
  EXPECT_EQ(vals<float>(s), vals<float>(x));
  const Tensor none = I1({});
  s = run1(make_node("ReduceSum"), {&x, &none}, 13);
  EXPECT_EQ(s.shape, (Shape{1, 1}));
  EXPECT_EQ(vals<float>(s), (std::vector<float>{21}));

  auto r = [&](const char* op, std::vector<int64_t> axes, int64_t keep = 1) {
    return run1(make_node(op, {{"axes", axes}, {"keepdims", keep}}), {&x}, 17);
  };
  EXPECT_EQ(vals<float>(r("ReduceMean", {1})), (std::vector<float>{2, 5}));
  EXPECT_EQ(vals<float>(r("ReduceMax", {0})), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(vals<float>(r("ReduceMin", {-1})), (std::vector<float>{1, 4}));
  EXPECT_EQ(vals<float>(r("ReduceProd", {1})), (std::vector<float>{6, 120}));
  EXPECT_EQ(vals<float>(r("ReduceMean", {0, 1}, 0)), (std::vector<float>{3.5f}));
  // Opset 18: axes as input for ReduceMean too.
  EXPECT_EQ(vals<float>(run1(make_node("ReduceMax"), {&x, &ax1}, 18)), (std::vector<float>{3, 6}));
}

TEST(KernelsReduce, LargeMatchesNaiveAndIntegers) {
  const Tensor x = rand_f({6, 50, 40}, 31);
  const Tensor axes = I1({0, 2});
  const Tensor got = run1(make_node("ReduceSum", {{"keepdims", int64_t{0}}}), {&x, &axes}, 13);
  Tensor want(DType::kFloat32, {50});
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 50; ++j)
      for (int64_t k = 0; k < 40; ++k) want.data<float>()[j] += x.data<float>()[(i * 50 + j) * 40 + k];
  expect_near(got, want, 1e-4);
  const Tensor xi = I({2, 3}, {1, 2, 3, 4, 5, 6}), a1 = I1({1});
  EXPECT_EQ(vals<int64_t>(run1(make_node("ReduceSum"), {&xi, &a1}, 13)), (std::vector<int64_t>{6, 15}));
  EXPECT_EQ(vals<int64_t>(run1(make_node("ReduceMax", {{"axes", std::vector<int64_t>{0}}}), {&xi}, 13)),
            (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(vals<int64_t>(run1(make_node("ReduceProd", {{"axes", std::vector<int64_t>{1}}}), {&xi}, 13)),
            (std::vector<int64_t>{6, 120}));
}

// ---------------------------------------------------------------------------------------------------------------
// Shape and data-movement ops.

TEST(KernelsShape, Transpose) {
  const Tensor x = F({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor t = run1(make_node("Transpose"), {&x});
  EXPECT_EQ(t.shape, (Shape{3, 2}));
  EXPECT_EQ(vals<float>(t), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  const Tensor y = I({2, 3, 4}, [] {
    std::vector<int64_t> v(24);
    for (int i = 0; i < 24; ++i) v[i] = i;
    return v;
  }());
  const Tensor p = run1(make_node("Transpose", {{"perm", std::vector<int64_t>{1, 2, 0}}}), {&y});
  ASSERT_EQ(p.shape, (Shape{3, 4, 2}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 2; ++k) EXPECT_EQ(p.data<int64_t>()[(i * 4 + j) * 2 + k], k * 12 + i * 4 + j);
}

TEST(KernelsShape, TransposeRandomPermsMatchNaive) {
  const Shape s = {3, 37, 19, 5};
  std::vector<int64_t> v(num_elements(s));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i);
  const Tensor x = I(s, v);
  std::vector<int64_t> perm = {0, 1, 2, 3};
  do {
    const Tensor t = run1(make_node("Transpose", {{"perm", perm}}), {&x});
    Shape os(4);
    for (int i = 0; i < 4; ++i) os[i] = s[perm[i]];
    ASSERT_EQ(t.shape, os);
    for (int64_t f = 0; f < t.numel(); ++f) {
      const auto oi = unravel(f, os);
      std::vector<int64_t> ii(4);
      for (int i = 0; i < 4; ++i) ii[perm[i]] = oi[i];
      const int64_t src = ((ii[0] * s[1] + ii[1]) * s[2] + ii[2]) * s[3] + ii[3];
      ASSERT_EQ(t.data<int64_t>()[f], src) << "perm " << perm[0] << perm[1] << perm[2] << perm[3];
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST(KernelsShape, ReshapeZeroMinusOneAllowzero) {
  const Tensor x = F({2, 3, 4}, std::vector<float>(24, 1.f));
  const Tensor s1 = I1({0, -1});
  EXPECT_EQ(run1(make_node("Reshape"), {&x, &s1}).shape, (Shape{2, 12}));
  const Tensor s2 = I1({-1, 0, 2});
  EXPECT_EQ(run1(make_node("Reshape"), {&x, &s2}).shape, (Shape{4, 3, 2}));
  const Tensor e = F({0, 3}, {});
  const Tensor s3 = I1({3, 0});
  EXPECT_EQ(run1(make_node("Reshape", {{"allowzero", int64_t{1}}}), {&e, &s3}).shape, (Shape{3, 0}));
  // Without allowzero, 0 copies the input dim: [0,3] -> [3,3] has the wrong element count.
  EXPECT_THROW(run(make_node("Reshape"), {&e, &s3}), std::runtime_error);
  const Tensor bad = I1({5, -1});
  EXPECT_THROW(run(make_node("Reshape"), {&x, &bad}), std::runtime_error);
}

TEST(KernelsShape, SqueezeUnsqueezeFlatten) {
  const Tensor x = F({1, 3, 1, 2}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(run1(make_node("Squeeze"), {&x}).shape, (Shape{3, 2}));
  EXPECT_EQ(run1(make_node("Squeeze", {{"axes", std::vector<int64_t>{-2}}}), {&x}, 11).shape, (Shape{1, 3, 2}));
  const Tensor a0 = I1({0});
  EXPECT_EQ(run1(make_node("Squeeze"), {&x, &a0}, 13).shape, (Shape{3, 1, 2}));
  const Tensor a1 = I1({1});
  EXPECT_THROW(run(make_node("Squeeze"), {&x, &a1}, 13), std::runtime_error);
  const Tensor y = F({3, 2}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(run1(make_node("Unsqueeze", {{"axes", std::vector<int64_t>{0, -1}}}), {&y}, 11).shape, (Shape{1, 3, 2, 1}));
  const Tensor ua = I1({1, 3});
  const Tensor u = run1(make_node("Unsqueeze"), {&y, &ua}, 13);
  EXPECT_EQ(u.shape, (Shape{3, 1, 2, 1}));
  EXPECT_EQ(vals<float>(u), vals<float>(y));
  EXPECT_EQ(run1(make_node("Flatten"), {&x}).shape, (Shape{1, 6}));
  EXPECT_EQ(run1(make_node("Flatten", {{"axis", int64_t{0}}}), {&x}).shape, (Shape{1, 6}));
  EXPECT_EQ(run1(make_node("Flatten", {{"axis", int64_t{-1}}}), {&x}).shape, (Shape{3, 2}));
  EXPECT_EQ(run1(make_node("Flatten", {{"axis", int64_t{4}}}), {&x}).shape, (Shape{6, 1}));
}

TEST(KernelsShape, Concat) {
  const Tensor a = I({2, 2}, {1, 2, 3, 4}), b = I({2, 1}, {5, 6}), e = I({2, 0}, {});
  const Tensor c = run1(make_node("Concat", {{"axis", int64_t{-1}}}), {&a, &e, &b});
  EXPECT_EQ(c.shape, (Shape{2, 3}));
  EXPECT_EQ(vals<int64_t>(c), (std::vector<int64_t>{1, 2, 5, 3, 4, 6}));
  const Tensor d = I({1, 2}, {7, 8});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Concat", {{"axis", int64_t{0}}}), {&a, &d})),
            (std::vector<int64_t>{1, 2, 3, 4, 7, 8}));
  EXPECT_THROW(run(make_node("Concat", {{"axis", int64_t{0}}}), {&a, &b}), std::runtime_error);
}

TEST(KernelsShape, SliceClampAndNegativeSteps) {
  std::vector<float> v(20);
  for (int i = 0; i < 20; ++i) v[i] = static_cast<float>(i);
  const Tensor x = F({4, 5}, v);
  auto slice = [&](std::vector<int64_t> st, std::vector<int64_t> en, std::vector<int64_t> ax, std::vector<int64_t> sp) {
    const Tensor s = I1(st), e = I1(en), a = I1(ax), p = I1(sp);
    return run1(make_node("Slice"), {&x, &s, &e, ax.empty() ? nullptr : &a, sp.empty() ? nullptr : &p}, 13);
  };
  Tensor r = slice({1, 0}, {1000, 3}, {}, {});
  EXPECT_EQ(r.shape, (Shape{3, 3}));
  EXPECT_EQ(vals<float>(r), (std::vector<float>{5, 6, 7, 10, 11, 12, 15, 16, 17}));
  // Reverse all of axis 1: start -1, end INT64_MIN, step -1.
  r = slice({-1}, {std::numeric_limits<int64_t>::min()}, {1}, {-1});
  EXPECT_EQ(r.shape, (Shape{4, 5}));
  EXPECT_EQ(r.data<float>()[0], 4.f);
  EXPECT_EQ(r.data<float>()[4], 0.f);
  EXPECT_EQ(r.data<float>()[19], 15.f);
  // Negative step 2 with clamped start, negative axis.
  r = slice({100}, {0}, {-1}, {-2});
  EXPECT_EQ(r.shape, (Shape{4, 2}));
  EXPECT_EQ(vals<float>(r), (std::vector<float>{4, 2, 9, 7, 14, 12, 19, 17}));
  // Step 2 on axis 0, negative end.
  r = slice({0, 1}, {-1, -1}, {0, 1}, {2, 2});
  EXPECT_EQ(r.shape, (Shape{2, 2}));
  EXPECT_EQ(vals<float>(r), (std::vector<float>{1, 3, 11, 13}));
  // Empty result.
  r = slice({3}, {1}, {0}, {1});
  EXPECT_EQ(r.shape, (Shape{0, 5}));
  // Opset < 10 attribute form.
  const Tensor a = run1(make_node("Slice", {{"starts", std::vector<int64_t>{1}},
                                            {"ends", std::vector<int64_t>{3}},
                                            {"axes", std::vector<int64_t>{1}}}),
                        {&x}, 9);
  EXPECT_EQ(vals<float>(a), (std::vector<float>{1, 2, 6, 7, 11, 12, 16, 17}));
}

TEST(KernelsShape, Split) {
  const Tensor x = I({2, 6}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  // Opset 11: 'split' attribute.
  auto o = run(make_node("Split", {{"axis", int64_t{1}}, {"split", std::vector<int64_t>{1, 2, 3}}}, 3), {&x}, 11);
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(vals<int64_t>(o[0]), (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(vals<int64_t>(o[1]), (std::vector<int64_t>{1, 2, 7, 8}));
  EXPECT_EQ(o[2].shape, (Shape{2, 3}));
  EXPECT_EQ(vals<int64_t>(o[2]), (std::vector<int64_t>{3, 4, 5, 9, 10, 11}));
  // Opset 13: 'split' input.
  const Tensor sp = I1({4, 2});
  o = run(make_node("Split", {{"axis", int64_t{-1}}}, 2), {&x, &sp}, 13);
  EXPECT_EQ(vals<int64_t>(o[1]), (std::vector<int64_t>{4, 5, 10, 11}));
  // Even split by the number of outputs.
  o = run(make_node("Split", {}, 2), {&x}, 13);
  EXPECT_EQ(vals<int64_t>(o[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(vals<int64_t>(o[1]), (std::vector<int64_t>{6, 7, 8, 9, 10, 11}));
  // Opset 18 num_outputs, uneven: last chunk smaller.
  o = run(make_node("Split", {{"axis", int64_t{1}}, {"num_outputs", int64_t{4}}}, 4), {&x}, 18);
  ASSERT_EQ(o.size(), 4u);
  EXPECT_EQ(o[0].shape, (Shape{2, 2}));
  EXPECT_EQ(o[3].shape, (Shape{2, 0}));
  EXPECT_THROW(run(make_node("Split", {{"axis", int64_t{1}}}, 4), {&x}, 13), std::runtime_error);
}

TEST(KernelsShape, Constant) {
  const Tensor v = I({2}, {3, 4});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Constant", {{"value", v}}), {})), (std::vector<int64_t>{3, 4}));
  Tensor t = run1(make_node("Constant", {{"value_float", 2.5f}}), {});
  EXPECT_EQ(t.shape, Shape{});
  EXPECT_EQ(vals<float>(t), (std::vector<float>{2.5f}));
  t = run1(make_node("Constant", {{"value_floats", std::vector<float>{1, 2}}}), {});
  EXPECT_EQ(t.shape, (Shape{2}));
  t = run1(make_node("Constant", {{"value_int", int64_t{7}}}), {});
  EXPECT_EQ(t.dtype, DType::kInt64);
  EXPECT_EQ(t.shape, Shape{});
  EXPECT_EQ(vals<int64_t>(t), (std::vector<int64_t>{7}));
  t = run1(make_node("Constant", {{"value_ints", std::vector<int64_t>{1, 2, 3}}}), {});
  EXPECT_EQ(vals<int64_t>(t), (std::vector<int64_t>{1, 2, 3}));
}

TEST(KernelsShape, GatherAnyAxisNegativeIndices) {
  const Tensor x = F({3, 2}, {1, 2, 3, 4, 5, 6});
  const Tensor idx = I({2, 2}, {0, -1, 1, 2});
  const Tensor g = run1(make_node("Gather"), {&x, &idx});
  EXPECT_EQ(g.shape, (Shape{2, 2, 2}));
  EXPECT_EQ(vals<float>(g), (std::vector<float>{1, 2, 5, 6, 3, 4, 5, 6}));
  const Tensor i1 = I32({3}, {-1, 0, -2});
  const Tensor g1 = run1(make_node("Gather", {{"axis", int64_t{-1}}}), {&x, &i1});
  EXPECT_EQ(g1.shape, (Shape{3, 3}));
  EXPECT_EQ(vals<float>(g1), (std::vector<float>{2, 1, 1, 4, 3, 3, 6, 5, 5}));
  const Tensor sc = I({}, {-2});
  const Tensor g2 = run1(make_node("Gather"), {&x, &sc});
  EXPECT_EQ(g2.shape, (Shape{2}));
  EXPECT_EQ(vals<float>(g2), (std::vector<float>{3, 4}));
  const Tensor shp = I({3}, {8, 16, 32}), last = I({}, {-1});
  const Tensor g3 = run1(make_node("Gather"), {&shp, &last});
  EXPECT_EQ(g3.shape, Shape{});
  EXPECT_EQ(vals<int64_t>(g3), (std::vector<int64_t>{32}));
  const Tensor bad = I({1}, {3});
  try {
    run(make_node("Gather"), {&x, &bad});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "node 'n1' (Gather): index 3 out of range for axis 0 of size 3");
  }
}

TEST(KernelsShape, ShapeSizeConstantOfShapeRange) {
  const Tensor x = F({2, 3, 4}, std::vector<float>(24));
  EXPECT_EQ(vals<int64_t>(run1(make_node("Shape"), {&x})), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(vals<int64_t>(run1(make_node("Shape", {{"start", int64_t{1}}}), {&x}, 15)), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(vals<int64_t>(run1(make_node("Shape", {{"start", int64_t{-2}}, {"end", int64_t{-1}}}), {&x}, 15)),
            (std::vector<int64_t>{3}));
  EXPECT_EQ(run1(make_node("Shape", {{"start", int64_t{5}}}), {&x}, 15).shape, (Shape{0}));
  const Tensor sz = run1(make_node("Size"), {&x});
  EXPECT_EQ(sz.shape, Shape{});
  EXPECT_EQ(vals<int64_t>(sz), (std::vector<int64_t>{24}));
  const Tensor s = I1({2, 2});
  Tensor c = run1(make_node("ConstantOfShape"), {&s});
  EXPECT_EQ(c.dtype, DType::kFloat32);
  EXPECT_EQ(vals<float>(c), (std::vector<float>{0, 0, 0, 0}));
  c = run1(make_node("ConstantOfShape", {{"value", I({1}, {5})}}), {&s});
  EXPECT_EQ(vals<int64_t>(c), (std::vector<int64_t>{5, 5, 5, 5}));
  const Tensor a = I({}, {10}), b = I({}, {1}), d = I({}, {-3});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Range"), {&a, &b, &d})), (std::vector<int64_t>{10, 7, 4}));
  const Tensor fa = F({}, {0.5f}), fb = F({}, {2.f}), fd = F({}, {0.5f});
  EXPECT_EQ(vals<float>(run1(make_node("Range"), {&fa, &fb, &fd})), (std::vector<float>{0.5f, 1.f, 1.5f}));
  EXPECT_EQ(run1(make_node("Range"), {&b, &a, &d}).shape, (Shape{0}));
}

TEST(KernelsShape, ExpandTile) {
  const Tensor x = F({3, 1}, {1, 2, 3});
  const Tensor s = I1({2, 1, 2});
  const Tensor e = run1(make_node("Expand"), {&x, &s});
  EXPECT_EQ(e.shape, (Shape{2, 3, 2}));
  EXPECT_EQ(vals<float>(e), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  const Tensor s1 = I1({1});  // bidirectional: smaller target keeps the input shape
  EXPECT_EQ(run1(make_node("Expand"), {&x, &s1}).shape, (Shape{3, 1}));
  const Tensor y = I({2, 2}, {1, 2, 3, 4}), reps = I1({2, 3});
  const Tensor t = run1(make_node("Tile"), {&y, &reps});
  EXPECT_EQ(t.shape, (Shape{4, 6}));
  EXPECT_EQ(vals<int64_t>(t),
            (std::vector<int64_t>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
}

TEST(KernelsShape, IdentityDropout) {
  const Tensor x = F({2}, {1, 2});
  EXPECT_EQ(vals<float>(run1(make_node("Identity"), {&x})), vals<float>(x));
  const auto o = run(make_node("Dropout", {}, 2), {&x, nullptr, nullptr});
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(vals<float>(o[0]), vals<float>(x));
  EXPECT_EQ(o[1].dtype, DType::kBool);
  EXPECT_EQ(vals<uint8_t>(o[1]), (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(run(make_node("Dropout"), {&x}).size(), 1u);
}

TEST(KernelsShape, PadModes) {
  const Tensor x = F({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor pads = I1({1, 0, 0, 2});
  const Tensor cv = F({}, {9});
  Tensor p = run1(make_node("Pad"), {&x, &pads, &cv}, 13);
  EXPECT_EQ(p.shape, (Shape{3, 5}));
  EXPECT_EQ(vals<float>(p), (std::vector<float>{9, 9, 9, 9, 9, 1, 2, 3, 9, 9, 4, 5, 6, 9, 9}));
  p = run1(make_node("Pad"), {&x, &pads}, 13);
  EXPECT_EQ(vals<float>(p), (std::vector<float>{0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 4, 5, 6, 0, 0}));
  // Negative pads crop.
  const Tensor crop = I1({0, -1, 0, 1});
  p = run1(make_node("Pad"), {&x, &crop}, 13);
  EXPECT_EQ(p.shape, (Shape{2, 3}));
  EXPECT_EQ(vals<float>(p), (std::vector<float>{2, 3, 0, 5, 6, 0}));
  const Tensor lr = I1({0, 2, 0, 2});
  p = run1(make_node("Pad", {{"mode", std::string("reflect")}}), {&x, &lr}, 13);
  EXPECT_EQ(vals<float>(p), (std::vector<float>{3, 2, 1, 2, 3, 2, 1, 6, 5, 4, 5, 6, 5, 4}));
  p = run1(make_node("Pad", {{"mode", std::string("edge")}}), {&x, &lr}, 13);
  EXPECT_EQ(vals<float>(p), (std::vector<float>{1, 1, 1, 2, 3, 3, 3, 4, 4, 4, 5, 6, 6, 6}));
  // Opset 18 axes input.
  const Tensor p2 = I1({1, 1}), ax = I1({-1});
  const Tensor xi = I({1, 2}, {1, 2});
  const Tensor ci = I({}, {-1});
  EXPECT_EQ(vals<int64_t>(run1(make_node("Pad"), {&xi, &p2, &ci, &ax}, 18)), (std::vector<int64_t>{-1, 1, 2, -1}));
}

// ---------------------------------------------------------------------------------------------------------------
// Errors, registry, threads.

TEST(KernelsErrors, UnknownOpUnsupportedDtypeDomain) {
  const Tensor x = F({1}, {1});
  try {
    run(make_node("Foo"), {&x});
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "node 'n1' (Foo): no kernel for this operator");
  }
  const Tensor i = I({1}, {4});
  try {
    run(make_node("Sqrt"), {&i});
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "node 'n1' (Sqrt): no kernel for dtype int64");
  }
  Node ar = make_node("AllReduce");
  ar.domain = "gspmd";
  try {
    run(ar, {&x});
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "node 'n1' (AllReduce): no kernel for domain 'gspmd'");
  }
  try {
    run(make_node("Add"), {&x});
    FAIL();
  } catch (const UnsupportedError&) {
    FAIL() << "a missing input is a spec violation, not unsupported";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "node 'n1' (Add): missing required input 1");
  }
}

TEST(KernelsErrors, HasKernel) {
  for (const char* op : {"MatMul",
                         "Gemm",
                         "Add",
                         "Sub",
                         "Mul",
                         "Div",
                         "Pow",
                         "Where",
                         "Equal",
                         "Less",
                         "Greater",
                         "LessOrEqual",
                         "GreaterOrEqual",
                         "And",
                         "Or",
                         "Not",
                         "Sqrt",
                         "Erf",
                         "Tanh",
                         "Relu",
                         "Exp",
                         "Log",
                         "Neg",
                         "Abs",
                         "Reciprocal",
                         "Sigmoid",
                         "Cast",
                         "Softmax",
                         "LogSoftmax",
                         "LayerNormalization",
                         "ReduceMean",
                         "ReduceSum",
                         "ReduceMax",
                         "ReduceMin",
                         "ReduceProd",
                         "Transpose",
                         "Reshape",
                         "Unsqueeze",
                         "Squeeze",
                         "Concat",
                         "Slice",
                         "Split",
                         "Constant",
                         "Identity",
                         "Gather",
                         "Shape",
                         "ConstantOfShape",
                         "Range",
                         "Expand",
                         "Tile",
                         "Clip",
                         "Max",
                         "Min",
                         "Sum",
                         "Mean",
                         "Dropout",
                         "Pad",
                         "Flatten",
                         "Size"})
    EXPECT_TRUE(has_kernel("", op)) << op;
  EXPECT_TRUE(has_kernel("ai.onnx", "Add"));
  EXPECT_FALSE(has_kernel("", "Foo"));
  EXPECT_FALSE(has_kernel("gspmd", "AllReduce"));
}

TEST(KernelsThreads, ConcurrentRunsAgree) {
  const Tensor a = rand_f({3, 32, 48}, 41), b = rand_f({48, 40}, 42);
  const Tensor want = ref_matmul(a, b, {3, 32, 40});
  const Tensor x = rand_f({64, 100}, 43, -3, 3);
  const Tensor sm_want = ref_softmax(x, 64, 100, 1, false);
  std::vector<std::thread> ts;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      bool good = true;
      for (int it = 0; it < 20; ++it) {
        const Tensor got = run_kernel(make_node("MatMul"), {&a, &b}, 17).at(0);
        for (int64_t i = 0; i < got.numel(); ++i)
          good = good && std::abs(got.data<float>()[i] - want.data<float>()[i]) < 1e-4f;
        const Tensor sm = run_kernel(make_node("Softmax"), {&x}, 17).at(0);
        for (int64_t i = 0; i < sm.numel(); ++i)
          good = good && std::abs(sm.data<float>()[i] - sm_want.data<float>()[i]) < 1e-5f;
      }
      ok[t] = good;
    });
  for (auto& t : ts) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

}  // namespace
}  // namespace gspmd
