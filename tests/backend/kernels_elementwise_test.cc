// Tests of the elementwise kernels (backend/kernels/ops_elementwise*.cc), their threading, and kernel lookup errors.
#include "tests/backend/kernels_test_util.h"

namespace gspmd {
namespace {

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
