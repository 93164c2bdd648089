// Tests of the MatMul and Gemm kernels (backend/kernels/ops_matmul.cc): against hand-computed values and naive
// references.
#include "tests/backend/kernels_test_util.h"

namespace gspmd {
namespace {

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

}  // namespace
}  // namespace gspmd
