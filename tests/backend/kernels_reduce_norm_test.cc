// Tests of the Softmax, LayerNormalization and Reduce kernels (backend/kernels/ops_reduce_norm.cc).
#include "tests/backend/kernels_test_util.h"

namespace gspmd {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Softmax / LayerNorm.

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

}  // namespace
}  // namespace gspmd
