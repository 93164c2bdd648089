// Tests of the other kernels: extra reductions, Einsum, activations, small integer and half types, losses, RoiAlign.
#include "tests/backend/kernels_misc_test_util.h"

namespace gspmd {
namespace {

TEST(KernelsReduceExtra, HandComputed) {
  const Tensor x = F({2, 2}, {1, -2, 3, -4});
  const Node l1 = make_node("ReduceL1", {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}});
  expect_vals(run1(l1, {&x}, 13), {3, 7});
  const Tensor y = run1(make_node("ReduceL2", {{"axes", std::vector<int64_t>{0}}}), {&x}, 13);
  EXPECT_EQ(y.shape, (Shape{1, 2}));
  expect_vals(y, {std::sqrt(10.f), std::sqrt(20.f)});
  expect_vals(run1(make_node("ReduceSumSquare"), {&x}, 13), {30});
  const Tensor p = F({2, 2}, {1, 2, 3, 4});
  expect_vals(run1(make_node("ReduceLogSum", {{"axes", std::vector<int64_t>{1}}}), {&p}, 13),
              {std::log(3.f), std::log(7.f)});
  expect_vals(run1(make_node("ReduceLogSumExp", {{"axes", std::vector<int64_t>{1}}}), {&p}, 13),
              {std::log(std::exp(1.f) + std::exp(2.f)), std::log(std::exp(3.f) + std::exp(4.f))});
  // Large values do not overflow (max subtraction).
  const Tensor big = F({2}, {1000, 1000});
  expect_vals(run1(make_node("ReduceLogSumExp"), {&big}, 13), {1000 + std::log(2.f)});
  // Opset 18: axes as an input.
  const Tensor ax = I1({0});
  expect_vals(run1(make_node("ReduceL1"), {&x, &ax}, 18), {4, 6});
  // Reducing only size-1 dims still applies the element transform.
  const Tensor col = F({2, 1}, {-3, 4});
  expect_vals(run1(make_node("ReduceSumSquare", {{"axes", std::vector<int64_t>{1}}}), {&col}, 13), {9, 16});
  expect_vals(run1(make_node("ReduceL1", {{"axes", std::vector<int64_t>{1}}}), {&col}, 13), {3, 4});
}

TEST(KernelsReduceExtra, LargeMatchesNaive) {
  const Shape s{6, 7, 40};
  const Tensor x = rand_f(s, 3, 0.1f, 2.f);
  for (const std::string op : {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}) {
    for (const std::vector<int64_t>& axes : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}}) {
      SCOPED_TRACE(op + " " + std::to_string(axes.size()));
      const Tensor y = run1(make_node(op, {{"axes", axes}}), {&x}, 13);
      std::vector<double> acc(static_cast<size_t>(y.numel()), 0.0);
      for (int64_t i = 0; i < x.numel(); ++i) {
        auto idx = unravel(i, s);
        for (int64_t a : axes) idx[a] = 0;
        const int64_t o = (idx[0] * (y.shape[1])) * y.shape[2] + idx[1] * y.shape[2] + idx[2];
        const double v = x.data<float>()[i];
        acc[o] += op == "ReduceL1" || op == "ReduceLogSum" ? std::abs(v)
                  : op == "ReduceLogSumExp"                ? std::exp(v)
                                                           : v * v;
      }
      for (size_t o = 0; o < acc.size(); ++o) {
        double want = acc[o];
        if (op == "ReduceL2") want = std::sqrt(want);
        if (op == "ReduceLogSum" || op == "ReduceLogSumExp") want = std::log(want);
        ASSERT_NEAR(y.data<float>()[o], want, 1e-4 * std::max(1.0, std::abs(want))) << o;
      }
    }
  }
  // Integer and double paths.
  Tensor xi(DType::kInt64, {3});
  const int64_t iv[3] = {-1, 2, -3};
  std::memcpy(xi.bytes.data(), iv, sizeof iv);
  EXPECT_EQ(run1(make_node("ReduceL1"), {&xi}, 13).data<int64_t>()[0], 6);
  EXPECT_EQ(run1(make_node("ReduceSumSquare"), {&xi}, 13).data<int64_t>()[0], 14);
}

// ---------------------------------------------------------------------------------------------------------------
// Einsum.

/// Naive einsum for letter-only equations with explicit output.
Tensor ref_einsum(const std::string& eq, const std::vector<const Tensor*>& in) {
  const size_t arrow = eq.find("->");
  std::vector<std::string> terms;
  std::string lhs = eq.substr(0, arrow), cur;
  for (char ch : lhs) {
    if (ch == ',') {
      terms.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(ch);
    }
  }
  terms.push_back(cur);
  const std::string out = eq.substr(arrow + 2);
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t d = 0; d < terms[i].size(); ++d) size[terms[i][d]] = in[i]->shape[d];
  std::string all = out;
  for (auto& [l, s] : size)
    if (out.find(l) == std::string::npos) all.push_back(l);
  Shape dims, os;
  for (char l : all) dims.push_back(size[l]);
  for (char l : out) os.push_back(size[l]);
  Tensor r(DType::kFloat32, os);
  for (int64_t it = 0; it < num_elements(dims); ++it) {
    const auto idx = unravel(it, dims);
    auto at = [&](char l) { return idx[all.find(l)]; };
    double p = 1;
    for (size_t i = 0; i < terms.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < terms[i].size(); ++d) off = off * in[i]->shape[d] + at(terms[i][d]);
      p *= in[i]->data<float>()[off];
    }
    int64_t oo = 0;
    for (size_t d = 0; d < out.size(); ++d) oo = oo * os[d] + at(out[d]);
    r.data<float>()[oo] += static_cast<float>(p);
  }
  return r;
}

TEST(KernelsEinsum, MatchesNaive) {
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"ij,jk->ik", {{3, 4}, {4, 5}}},
      {"bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}},
      {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}},
      {"ij,kj->ki", {{3, 4}, {5, 4}}},
      {"i,j->ij", {{3}, {4}}},
      {"ij,ij->", {{3, 4}, {3, 4}}},
      {"ijk->kj", {{2, 3, 4}}},
      {"ii->i", {{3, 3}}},
      {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}},
      {"abc,cd->abd", {{2, 3, 4}, {4, 5}}},
      {"ij,j->i", {{3, 4}, {4}}},
      {"bn,anm,bm->ba", {{2, 3}, {4, 3, 5}, {2, 5}}},
  };
  uint32_t seed = 200;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.eq);
    std::vector<Tensor> ts;
    for (const auto& s : c.shapes) ts.push_back(rand_f(s, seed++));
    std::vector<const Tensor*> in;
    for (auto& t : ts) in.push_back(&t);
    const Tensor want = ref_einsum(c.eq, in);
    const Tensor got = run1(make_node("Einsum", {{"equation", c.eq}}), in, 12);
    ASSERT_EQ(got.shape, want.shape);
    expect_vals(got, vals(want), 1e-4);
  }
}

TEST(KernelsEinsum, ImplicitOutputEllipsisAndSpaces) {
  const Tensor a = rand_f({2, 3, 4}, 1), b = rand_f({2, 4, 5}, 2);
  // "...ij,...jk" (implicit output ...ik) == batched matmul.
  const Tensor got = run1(make_node("Einsum", {{"equation", std::string("...ij, ...jk")}}), {&a, &b}, 12);
  const Tensor want = ref_einsum("bij,bjk->bik", {&a, &b});
  ASSERT_EQ(got.shape, want.shape);
  expect_vals(got, vals(want), 1e-4);
  // Implicit output sorts the once-only letters: "ji" -> "ij" is a transpose.
  const Tensor m = F({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor t = run1(make_node("Einsum", {{"equation", std::string("ji")}}), {&m}, 12);
  EXPECT_EQ(t.shape, (Shape{3, 2}));
  expect_vals(t, {1, 4, 2, 5, 3, 6});
  // Ellipsis broadcasting: [3,4] x [2,1,4,5] over the batch dims.
  const Tensor c = rand_f({1, 4, 5}, 3), d = rand_f({2, 3, 4}, 4);
  const Tensor e = run1(make_node("Einsum", {{"equation", std::string("...ij,...jk->...ik")}}), {&d, &c}, 12);
  EXPECT_EQ(e.shape, (Shape{2, 3, 5}));
  Tensor c2(DType::kFloat32, {2, 4, 5});
  std::memcpy(c2.bytes.data(), c.bytes.data(), c.nbytes());
  std::memcpy(c2.bytes.data() + c.nbytes(), c.bytes.data(), c.nbytes());
  expect_vals(e, vals(ref_einsum("bij,bjk->bik", {&d, &c2})), 1e-4);
  // Double via the naive batched path.
  Tensor ad(DType::kFloat64, {2, 2}), bd(DType::kFloat64, {2, 2});
  const double av[4] = {1, 2, 3, 4}, bv[4] = {5, 6, 7, 8};
  std::memcpy(ad.bytes.data(), av, 32);
  std::memcpy(bd.bytes.data(), bv, 32);
  const Tensor r = run1(make_node("Einsum", {{"equation", std::string("ij,jk->ik")}}), {&ad, &bd}, 12);
  EXPECT_EQ(std::vector<double>(r.data<double>(), r.data<double>() + 4), (std::vector<double>{19, 22, 43, 50}));
  EXPECT_THROW(run1(make_node("Einsum", {{"equation", std::string("ij,jk->ik")}}), {&m, &m}, 12), std::runtime_error);
}

// ---------------------------------------------------------------------------------------------------------------
// Activations and elementwise extras.

TEST(KernelsActivation, MatchFormulas) {
  const std::vector<float> xs{-3.f, -0.5f, 0.f, 0.7f, 2.5f};
  const Tensor x = F({5}, xs);
  struct Case {
    std::string op;
    std::map<std::string, AttrValue> attrs;
    std::function<double(double)> f;
  };
  const double selu_a = 1.67326319217681884765625, selu_g = 1.05070102214813232421875;
  const std::vector<Case> cases = {
      {"Elu", {{"alpha", 0.5f}}, [](double v) { return v < 0 ? 0.5 * (std::exp(v) - 1) : v; }},
      {"Selu", {}, [&](double v) { return selu_g * (v <= 0 ? selu_a * (std::exp(v) - 1) : v); }},
      {"Celu", {{"alpha", 2.f}}, [](double v) { return std::max(0.0, v) + std::min(0.0, 2 * (std::exp(v / 2) - 1)); }},
      {"Softplus", {}, [](double v) { return std::log(1 + std::exp(v)); }},
      {"Softsign", {}, [](double v) { return v / (1 + std::abs(v)); }},
      {"ThresholdedRelu", {{"alpha", 0.6f}}, [](double v) { return v > 0.6 ? v : 0; }},
      {"LeakyRelu", {}, [](double v) { return v < 0 ? 0.01 * v : v; }},
      {"HardSigmoid", {}, [](double v) { return std::clamp(0.2 * v + 0.5, 0.0, 1.0); }},
      {"HardSwish", {}, [](double v) { return v * std::clamp(v / 6 + 0.5, 0.0, 1.0); }},
      {"Mish", {}, [](double v) { return v * std::tanh(std::log(1 + std::exp(v))); }},
      {"Sin", {}, [](double v) { return std::sin(v); }},
      {"Cos", {}, [](double v) { return std::cos(v); }},
      {"Atan", {}, [](double v) { return std::atan(v); }},
      {"Shrink",
       {{"lambd", 0.6f}, {"bias", 0.1f}},
       [](double v) { return v < -0.6  ? v + 0.1
                             : v > 0.6 ? v - 0.1
                                       : 0; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.op);
    const Tensor y = run1(make_node(c.op, c.attrs), {&x});
    std::vector<float> want;
    for (float v : xs) want.push_back(static_cast<float>(c.f(v)));
    expect_vals(y, want, 1e-5);
  }
  const Tensor r = F({6}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.4f});
  expect_vals(run1(make_node("Round"), {&r}), {0, 2, 2, -0, -2, 2});  // half to even
}

TEST(KernelsActivation, PReluIsNaNIsInfMod) {
  const Tensor x = F({2, 3}, {-1, 2, -3, 4, -5, 6});
  const Tensor slope = F({3}, {0.1f, 0.2f, 0.3f});
  expect_vals(run1(make_node("PRelu"), {&x, &slope}), {-0.1f, 2, -0.9f, 4, -1, 6});
  const Tensor s1 = F({1}, {0.5f});
  expect_vals(run1(make_node("PRelu"), {&x, &s1}), {-0.5f, 2, -1.5f, 4, -2.5f, 6});
  const Tensor special = F({4}, {1, NAN, INFINITY, -INFINITY});
  const Tensor n = run1(make_node("IsNaN"), {&special});
  EXPECT_EQ(n.dtype, DType::kBool);
  EXPECT_EQ(std::vector<uint8_t>(n.data<uint8_t>(), n.data<uint8_t>() + 4), (std::vector<uint8_t>{0, 1, 0, 0}));
  const Tensor inf = run1(make_node("IsInf", {{"detect_negative", int64_t{0}}}), {&special});
  EXPECT_EQ(std::vector<uint8_t>(inf.data<uint8_t>(), inf.data<uint8_t>() + 4), (std::vector<uint8_t>{0, 0, 1, 0}));
  const Tensor a = I({4}, {7, -7, 7, -7}), b = I({4}, {3, 3, -3, -3});
  EXPECT_EQ(ivals(run1(make_node("Mod"), {&a, &b})), (std::vector<int64_t>{1, 2, -2, -1}));
  EXPECT_EQ(ivals(run1(make_node("Mod", {{"fmod", int64_t{1}}}), {&a, &b})), (std::vector<int64_t>{1, -1, 1, -1}));
  const Tensor fa = F({2}, {5.5f, -5.5f}), fb = F({2}, {2, 2});
  expect_vals(run1(make_node("Mod", {{"fmod", int64_t{1}}}), {&fa, &fb}), {1.5f, -1.5f});
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels added for the ONNX backend conformance suite (tests/conformance covers them on the suite's data).

Tensor U8(const Shape& s, const std::vector<uint8_t>& v) {
  Tensor t(DType::kUInt8, s);
  std::memcpy(t.bytes.data(), v.data(), v.size());
  return t;
}

TEST(KernelsConformance, SmallIntegerAndHalfTypes) {
  const Tensor a = U8({3}, {250, 7, 9}), b = U8({3}, {10, 3, 2});
  const Tensor sum = run1(make_node("Add"), {&a, &b});
  ASSERT_EQ(sum.dtype, DType::kUInt8);
  EXPECT_EQ(sum.data<uint8_t>()[0], 4);  // wraps modulo 256
  EXPECT_EQ(run1(make_node("Div"), {&a, &b}).data<uint8_t>()[1], 2);
  EXPECT_EQ(run1(make_node("Max"), {&a, &b}).data<uint8_t>()[2], 9);
  const Tensor sh = run1(make_node("BitShift", {{"direction", std::string("LEFT")}}), {&b, &b});
  EXPECT_EQ(sh.data<uint8_t>()[1], 24);
  EXPECT_EQ(sh.data<uint8_t>()[0], 0);  // shift of 10 >= 8 bits
  // float -> float16 rounds to nearest even; back to float is exact. 65520 overflows to infinity.
  const Tensor f = F({4}, {1.f / 3, 65504.f, 65520.f, -0.f});
  const Tensor h = run1(make_node("Cast", {{"to", int64_t{10}}}), {&f});
  ASSERT_EQ(h.dtype, DType::kFloat16);
  EXPECT_EQ(h.data<uint16_t>()[0], 0x3555);
  EXPECT_EQ(h.data<uint16_t>()[1], 0x7bff);
  EXPECT_EQ(h.data<uint16_t>()[2], 0x7c00);
  EXPECT_EQ(h.data<uint16_t>()[3], 0x8000);
  const Tensor back = run1(make_node("Cast", {{"to", int64_t{1}}}), {&h});
  EXPECT_FLOAT_EQ(back.data<float>()[0], 0.333251953125f);
  // bfloat16: a model's own Cast before opset 19 truncates (the ONNX reference then; the loader marks those Casts
  // gspmd_truncate_bf16), every other rounding is to nearest even.
  const Tensor g = F({1}, {1.005859375f});  // 1 + 0.75 * 2^-7: bfloat16 keeps 7 mantissa bits
  EXPECT_EQ(
      run1(make_node("Cast", {{"to", int64_t{16}}, {"gspmd_truncate_bf16", int64_t{1}}}), {&g}, 13).data<uint16_t>()[0],
      0x3f80);
  EXPECT_EQ(run1(make_node("Cast", {{"to", int64_t{16}}}), {&g}, 13).data<uint16_t>()[0], 0x3f81);
  EXPECT_EQ(run1(make_node("Cast", {{"to", int64_t{16}}}), {&g}, 19).data<uint16_t>()[0], 0x3f81);
}

// Found by the model fuzzer (docs/testing.md): what C++ leaves undefined has one defined answer. Integers wrap on
// overflow in two's complement (as numpy); a float cast to an integer type that cannot hold it saturates, NaN gives 0.
TEST(KernelsConformance, OverflowWrapsAndOutOfRangeCastsSaturate) {
  const int64_t big = int64_t{1} << 62;
  const Tensor a = I({3}, {big, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()});
  const Tensor four = I({1}, {4});
  EXPECT_EQ(ivals(run1(make_node("Mul"), {&a, &four})), (std::vector<int64_t>{0, -4, 0}));
  EXPECT_EQ(ivals(run1(make_node("Add"), {&a, &a})),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -2, 0}));
  EXPECT_EQ(ivals(run1(make_node("Sub"), {&four, &a})),
            (std::vector<int64_t>{4 - big, std::numeric_limits<int64_t>::min() + 5,
                                  std::numeric_limits<int64_t>::min() + 4}));
  const Tensor f = F({5}, {NAN, INFINITY, -INFINITY, 1e30f, -7.9f});
  const Tensor i64 = run1(make_node("Cast", {{"to", int64_t{7}}}), {&f});
  EXPECT_EQ(ivals(i64),
            (std::vector<int64_t>{0, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max(), -7}));
  const Tensor u16 = run1(make_node("Cast", {{"to", int64_t{4}}}), {&f});
  EXPECT_EQ(std::vector<uint16_t>(u16.data<uint16_t>(), u16.data<uint16_t>() + 5),
            (std::vector<uint16_t>{0, 65535, 0, 65535, 0}));
}

TEST(KernelsConformance, LossesUniqueReverseSequence) {
  // NLL over [N=2, C=3], targets {2, 0}: mean of -x[0,2], -x[1,0]; a weighted mean divides by the weights' sum.
  const Tensor x = F({2, 3}, {0.1f, 0.2f, 0.7f, 0.5f, 0.25f, 0.25f}), t = I({2}, {2, 0}), w = F({3}, {1, 1, 3});
  expect_vals(run1(make_node("NegativeLogLikelihoodLoss"), {&x, &t}), {-(0.7f + 0.5f) / 2});
  expect_vals(run1(make_node("NegativeLogLikelihoodLoss"), {&x, &t, &w}), {-(3 * 0.7f + 0.5f) / 4});
  expect_vals(
      run1(make_node("NegativeLogLikelihoodLoss", {{"reduction", std::string("none")}, {"ignore_index", int64_t{0}}}),
           {&x, &t}),
      {-0.7f, 0});
  // SoftmaxCrossEntropyLoss = NLL of log_softmax; log_prob is the second output.
  const auto sce =
      run_kernel(make_node("SoftmaxCrossEntropyLoss", {{"reduction", std::string("sum")}}, 2), {&x, &t}, 13);
  ASSERT_EQ(sce.size(), 2u);
  auto lse = [](float a, float b, float c) { return std::log(std::exp(a) + std::exp(b) + std::exp(c)); };
  expect_vals(sce[0], {(lse(0.1f, 0.2f, 0.7f) - 0.7f) + (lse(0.5f, 0.25f, 0.25f) - 0.5f)});
  EXPECT_NEAR(sce[1].data<float>()[0], 0.1f - lse(0.1f, 0.2f, 0.7f), 1e-6);
  // Unique, sorted and in order of first occurrence.
  const Tensor u = F({6}, {2, 1, 1, 3, 4, 3});
  const auto us = run_kernel(make_node("Unique", {}, 4), {&u}, 11);
  expect_vals(us[0], {1, 2, 3, 4});
  EXPECT_EQ(ivals(us[1]), (std::vector<int64_t>{1, 0, 3, 4}));
  EXPECT_EQ(ivals(us[2]), (std::vector<int64_t>{1, 0, 0, 2, 3, 2}));
  EXPECT_EQ(ivals(us[3]), (std::vector<int64_t>{2, 1, 2, 1}));
  const auto uu = run_kernel(make_node("Unique", {{"sorted", int64_t{0}}}, 4), {&u}, 11);
  expect_vals(uu[0], {2, 1, 3, 4});
  EXPECT_EQ(ivals(uu[2]), (std::vector<int64_t>{0, 1, 1, 2, 3, 2}));
  // ReverseSequence: [T=3, B=2], lengths {3, 2}.
  const Tensor seq = F({3, 2}, {0, 10, 1, 11, 2, 12}), lens = I({2}, {3, 2});
  expect_vals(run1(make_node("ReverseSequence"), {&seq, &lens}, 10), {2, 11, 1, 10, 0, 12});
  const Tensor bad = I({2}, {4, 2});
  EXPECT_THROW(run1(make_node("ReverseSequence"), {&seq, &bad}, 10), std::runtime_error);
}

// RoiAlign's sampling grid (ONNX spec): opset 16 defaults to half_pixel (the roi shifted by half a pixel); opsets 10
// to 15 have no such attribute and sample as output_half_pixel. On X[h][w] = w, the roi [0, 0, 2, 2] pooled to 1x1
// with one sample samples its centre: w = 1 unshifted, 0.5 shifted (torchvision exports aligned rois at opset 11 by
// shifting the boxes itself).
TEST(KernelsSpatial, RoiAlignDefaultModeFollowsTheOpset) {
  const Tensor x = F({1, 1, 4, 4}, {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
  const Tensor rois = F({1, 4}, {0, 0, 2, 2});
  const Tensor batch = I1({0});
  const Node n = make_node(
      "RoiAlign", {{"output_height", int64_t{1}}, {"output_width", int64_t{1}}, {"sampling_ratio", int64_t{1}}});
  expect_vals(run1(n, {&x, &rois, &batch}, 11), {1.0F});
  expect_vals(run1(n, {&x, &rois, &batch}, 16), {0.5F});
}

}  // namespace
}  // namespace gspmd
