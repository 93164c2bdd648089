// Tests of the index kernels (backend/kernels/ops_index*.cc): Gather/Scatter Elements and ND, OneHot, NonZero,
// Compress, TopK, CumSum, DepthToSpace, Resize.
#include "tests/backend/kernels_misc_test_util.h"

namespace gspmd {
namespace {

TEST(KernelsArg, ArgMaxArgMin) {
  const Tensor x = F({2, 3}, {1, 5, 5, 7, 2, 7});
  Tensor y = run1(make_node("ArgMax", {{"axis", int64_t{1}}}), {&x});
  EXPECT_EQ(y.dtype, DType::kInt64);
  EXPECT_EQ(y.shape, (Shape{2, 1}));
  EXPECT_EQ(ivals(y), (std::vector<int64_t>{1, 0}));
  y = run1(make_node("ArgMax", {{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}}), {&x});
  EXPECT_EQ(ivals(y), (std::vector<int64_t>{2, 2}));
  y = run1(make_node("ArgMin", {{"axis", int64_t{0}}, {"keepdims", int64_t{0}}}), {&x});
  EXPECT_EQ(y.shape, (Shape{3}));
  EXPECT_EQ(ivals(y), (std::vector<int64_t>{0, 1, 0}));
  y = run1(make_node("ArgMin", {{"axis", int64_t{-1}}, {"select_last_index", int64_t{1}}}), {&x});
  EXPECT_EQ(ivals(y), (std::vector<int64_t>{0, 1}));
  const Tensor xi = I({4}, {3, -1, 9, 9});
  EXPECT_EQ(ivals(run1(make_node("ArgMax"), {&xi})), (std::vector<int64_t>{2}));
}

// ---------------------------------------------------------------------------------------------------------------
// Indexing.

TEST(KernelsIndex, GatherScatterElements) {
  const Tensor x = F({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor idx = I({2, 2}, {2, 0, -1, 1});
  expect_vals(run1(make_node("GatherElements", {{"axis", int64_t{1}}}), {&x, &idx}), {3, 1, 6, 5});
  const Tensor idx0 = I({1, 3}, {1, 0, 1});
  expect_vals(run1(make_node("GatherElements"), {&x, &idx0}), {4, 2, 6});
  const Tensor upd = F({2, 2}, {10, 20, 30, 40});
  expect_vals(run1(make_node("ScatterElements", {{"axis", int64_t{1}}}), {&x, &idx, &upd}), {20, 2, 10, 4, 40, 30});
  const Tensor idx2 = I({1, 2}, {1, 1});
  const Tensor upd2 = F({1, 2}, {10, 20});
  expect_vals(
      run1(make_node("ScatterElements", {{"axis", int64_t{1}}, {"reduction", std::string("add")}}), {&x, &idx2, &upd2}),
      {1, 32, 3, 4, 5, 6});
  expect_vals(
      run1(make_node("ScatterElements", {{"axis", int64_t{1}}, {"reduction", std::string("mul")}}), {&x, &idx2, &upd2}),
      {1, 400, 3, 4, 5, 6});
  const Tensor bad = I({1, 1}, {3});
  const Tensor u1 = F({1, 1}, {0});
  EXPECT_THROW(run1(make_node("GatherElements", {{"axis", int64_t{1}}}), {&x, &bad}), std::runtime_error);
  EXPECT_THROW(run1(make_node("ScatterElements", {{"axis", int64_t{1}}}), {&x, &bad, &u1}), std::runtime_error);
}

TEST(KernelsIndex, GatherScatterND) {
  const Tensor x = F({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  const Tensor i1 = I({2, 2}, {0, 1, 1, 0});
  Tensor y = run1(make_node("GatherND"), {&x, &i1});
  EXPECT_EQ(y.shape, (Shape{2, 2}));
  expect_vals(y, {2, 3, 4, 5});
  const Tensor i3 = I({1, 3}, {1, 1, 1});
  expect_vals(run1(make_node("GatherND"), {&x, &i3}), {7});
  // batch_dims 1: per batch, indices [[1], [0]] pick rows.
  const Tensor ib = I({2, 1}, {1, 0});
  y = run1(make_node("GatherND", {{"batch_dims", int64_t{1}}}), {&x, &ib});
  EXPECT_EQ(y.shape, (Shape{2, 2}));
  expect_vals(y, {2, 3, 4, 5});
  const Tensor upd = F({2, 2}, {10, 11, 12, 13});
  expect_vals(run1(make_node("ScatterND"), {&x, &i1, &upd}), {0, 1, 10, 11, 12, 13, 6, 7});
  const Tensor idup = I({2, 1}, {0, 0});
  const Tensor upd4 = F({2, 2, 2}, {1, 1, 1, 1, 2, 2, 2, 2});
  expect_vals(run1(make_node("ScatterND", {{"reduction", std::string("add")}}), {&x, &idup, &upd4}),
              {3, 4, 5, 6, 4, 5, 6, 7});
}

TEST(KernelsIndex, OneHotNonZeroCompress) {
  const Tensor idx = I({3}, {0, -1, 5});
  const Tensor depth = S(3);
  const Tensor v = F({2}, {0, 9});
  Tensor y = run1(make_node("OneHot"), {&idx, &depth, &v});
  EXPECT_EQ(y.shape, (Shape{3, 3}));
  expect_vals(y, {9, 0, 0, 0, 0, 9, 0, 0, 0});
  y = run1(make_node("OneHot", {{"axis", int64_t{0}}}), {&idx, &depth, &v});
  expect_vals(y, {9, 0, 0, 0, 0, 0, 0, 9, 0});
  const Tensor x = F({2, 3}, {0, 1, 0, 2, 0, 3});
  y = run1(make_node("NonZero"), {&x});
  EXPECT_EQ(y.shape, (Shape{2, 3}));
  EXPECT_EQ(ivals(y), (std::vector<int64_t>{0, 1, 1, 1, 0, 2}));
  const Tensor cond = B({3}, {1, 0, 1});
  y = run1(make_node("Compress", {{"axis", int64_t{1}}}), {&x, &cond});
  EXPECT_EQ(y.shape, (Shape{2, 2}));
  expect_vals(y, {0, 0, 2, 3});
  y = run1(make_node("Compress"), {&x, &cond});
  expect_vals(y, {0, 0});
}

TEST(KernelsIndex, TopK) {
  const Tensor x = F({2, 4}, {1, 4, 2, 4, 0, -1, 3, 2});
  const Tensor k = I1({2});
  auto o = run_kernel(make_node("TopK", {}, 2), {&x, &k}, 11);
  ASSERT_EQ(o.size(), 2u);
  expect_vals(o[0], {4, 4, 3, 2});
  EXPECT_EQ(ivals(o[1]), (std::vector<int64_t>{1, 3, 2, 3}));
  o = run_kernel(make_node("TopK", {{"largest", int64_t{0}}, {"axis", int64_t{0}}}, 2), {&x, &k}, 11);
  EXPECT_EQ(o[0].shape, (Shape{2, 4}));
  expect_vals(o[0], {0, -1, 2, 2, 1, 4, 3, 4});
  EXPECT_EQ(ivals(o[1]), (std::vector<int64_t>{1, 1, 0, 1, 0, 0, 1, 0}));
  o = run_kernel(make_node("TopK", {{"k", int64_t{1}}}, 2), {&x}, 1);
  expect_vals(o[0], {4, 3});
  const Tensor k9 = I1({9});
  EXPECT_THROW(run_kernel(make_node("TopK", {}, 2), {&x, &k9}, 11), std::runtime_error);
}

TEST(KernelsIndex, CumSum) {
  const Tensor x = F({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor a1 = S(1), a0 = S(0);
  expect_vals(run1(make_node("CumSum"), {&x, &a1}), {1, 3, 6, 4, 9, 15});
  expect_vals(run1(make_node("CumSum"), {&x, &a0}), {1, 2, 3, 5, 7, 9});
  expect_vals(run1(make_node("CumSum", {{"exclusive", int64_t{1}}}), {&x, &a1}), {0, 1, 3, 0, 4, 9});
  expect_vals(run1(make_node("CumSum", {{"reverse", int64_t{1}}}), {&x, &a1}), {6, 5, 3, 15, 11, 6});
  expect_vals(run1(make_node("CumSum", {{"reverse", int64_t{1}}, {"exclusive", int64_t{1}}}), {&x, &a1}),
              {5, 3, 0, 11, 6, 0});
}

TEST(KernelsIndex, DepthSpaceHardmax) {
  Tensor x(DType::kFloat32, {1, 8, 1, 1});
  for (int i = 0; i < 8; ++i) x.data<float>()[i] = static_cast<float>(i);
  // DCR: out[0, c, h*b+i, w*b+j] = in[0, (i*b + j)*C' + c, h, w] with C' = 2.
  Tensor y = run1(make_node("DepthToSpace", {{"blocksize", int64_t{2}}}), {&x});
  EXPECT_EQ(y.shape, (Shape{1, 2, 2, 2}));
  expect_vals(y, {0, 2, 4, 6, 1, 3, 5, 7});
  // CRD: in[0, c*b*b + i*b + j, h, w].
  y = run1(make_node("DepthToSpace", {{"blocksize", int64_t{2}}, {"mode", std::string("CRD")}}), {&x});
  expect_vals(y, {0, 1, 2, 3, 4, 5, 6, 7});
  const Tensor s = run1(make_node("SpaceToDepth", {{"blocksize", int64_t{2}}}),
                        {&(y = run1(make_node("DepthToSpace", {{"blocksize", int64_t{2}}}), {&x}))});
  EXPECT_EQ(s.shape, (Shape{1, 8, 1, 1}));
  expect_vals(s, {0, 1, 2, 3, 4, 5, 6, 7});  // SpaceToDepth inverts DCR DepthToSpace
  const Tensor h = F({2, 3}, {1, 3, 3, 0, -1, -2});
  expect_vals(run1(make_node("Hardmax"), {&h}), {0, 1, 0, 1, 0, 0});
  expect_vals(run1(make_node("Hardmax", {{"axis", int64_t{0}}}), {&h}), {1, 1, 1, 0, 0, 0});
  expect_vals(run1(make_node("Hardmax", {{"axis", int64_t{0}}}), {&h}, 11), {0, 1, 0, 0, 0, 0});  // 2-D coerced
}

// ---------------------------------------------------------------------------------------------------------------
// Resize / Upsample.

TEST(KernelsResize, NearestModes) {
  const Tensor x = F({1, 1, 1, 4}, {1, 2, 3, 4});
  const Tensor roi = F({0}, {});
  const Tensor sc = F({4}, {1, 1, 1, 0.6f});
  // Downsample 4 -> 2 (half_pixel): x_orig = (o + .5)/0.6 - .5 = 0.33, 2.0 -> round_prefer_floor 0, 2.
  expect_vals(run1(make_node("Resize"), {&x, &roi, &sc}, 13), {1, 3});
  const Tensor sizes = I1({1, 1, 1, 8});
  // Upsample 4 -> 8, asymmetric + floor: o/2.
  expect_vals(run1(make_node("Resize", {{"coordinate_transformation_mode", std::string("asymmetric")},
                                        {"nearest_mode", std::string("floor")}}),
                   {&x, &roi, nullptr, &sizes}, 13),
              {1, 1, 2, 2, 3, 3, 4, 4});
  // half_pixel + round_prefer_ceil: (o+.5)/2-.5 = -.25,.25,.75,1.25,... -> 0,0,1,1,2,2,3,3 after rounding/clamp.
  expect_vals(
      run1(make_node("Resize", {{"nearest_mode", std::string("round_prefer_ceil")}}), {&x, &roi, nullptr, &sizes}, 13),
      {1, 1, 2, 2, 3, 3, 4, 4});
  // Upsample opset 9 (scales input) and 7 (scales attribute).
  const Tensor up = F({4}, {1, 1, 2, 2});
  const Tensor x2 = F({1, 1, 1, 2}, {1, 2});
  Tensor y = run1(make_node("Upsample"), {&x2, &up}, 9);
  EXPECT_EQ(y.shape, (Shape{1, 1, 2, 4}));
  expect_vals(y, {1, 1, 2, 2, 1, 1, 2, 2});
  y = run1(make_node("Upsample", {{"scales", std::vector<float>{1, 1, 1, 3}}}), {&x2}, 7);
  expect_vals(y, {1, 1, 1, 2, 2, 2});
}

TEST(KernelsResize, LinearModes) {
  const Tensor x = F({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor roi = F({0}, {});
  const Tensor sizes = I1({1, 1, 4, 4});
  // align_corners: x_orig = o * 1/3 -> bilinear on the corners.
  Tensor y = run1(make_node("Resize", {{"mode", std::string("linear")},
                                       {"coordinate_transformation_mode", std::string("align_corners")}}),
                  {&x, &roi, nullptr, &sizes}, 13);
  std::vector<float> want;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) want.push_back(1 + 2 * (i / 3.f) + (j / 3.f));
  expect_vals(y, want);
  // half_pixel: x_orig = (o+.5)/2-.5 = -.25 (clamped to 0), .25, .75, 1.25 (clamped to 1).
  y = run1(make_node("Resize", {{"mode", std::string("linear")}}), {&x, &roi, nullptr, &sizes}, 13);
  const float c[4] = {0, 0.25f, 0.75f, 1};
  want.clear();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) want.push_back(1 + 2 * c[i] + c[j]);
  expect_vals(y, want);
  // pytorch_half_pixel with an output length of 1 samples coordinate 0.
  const Tensor s1 = I1({1, 1, 1, 2});
  y = run1(make_node("Resize", {{"mode", std::string("linear")},
                                {"coordinate_transformation_mode", std::string("pytorch_half_pixel")}}),
           {&x, &roi, nullptr, &s1}, 13);
  expect_vals(y, {1, 2});
  // asymmetric upsample by 2 with scales.
  const Tensor sc = F({4}, {1, 1, 1, 2});
  y = run1(make_node("Resize",
                     {{"mode", std::string("linear")}, {"coordinate_transformation_mode", std::string("asymmetric")}}),
           {&x, &roi, &sc}, 13);
  expect_vals(y, {1, 1.5f, 2, 2, 3, 3.5f, 4, 4});
}

TEST(KernelsResize, CubicAndErrors) {
  // Cubic on a linear ramp reproduces the ramp inside (cubic convolution is exact for linear data away from
  // the clamped borders).
  Tensor x(DType::kFloat32, {1, 8});
  for (int i = 0; i < 8; ++i) x.data<float>()[i] = static_cast<float>(i);
  const Tensor roi = F({0}, {});
  const Tensor sizes = I1({1, 15});
  const Tensor y = run1(make_node("Resize", {{"mode", std::string("cubic")},
                                             {"coordinate_transformation_mode", std::string("align_corners")}}),
                        {&x, &roi, nullptr, &sizes}, 13);
  for (int o = 2; o < 13; ++o) EXPECT_NEAR(y.data<float>()[o], o * 7.f / 14.f, 1e-5) << o;
  const Tensor sc = F({2}, {1, 2});
  EXPECT_THROW(run1(make_node("Resize"), {&x, &roi, &sc, &sizes}, 13), std::runtime_error);
}

TEST(KernelsIndex, TriluEyeLikeCastLike) {
  const Tensor x = F({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_vals(run1(make_node("Trilu"), {&x}), {1, 2, 3, 0, 5, 6});
  expect_vals(run1(make_node("Trilu", {{"upper", int64_t{0}}}), {&x}), {1, 0, 0, 4, 5, 0});
  const Tensor k = S(1), km = S(-1);
  expect_vals(run1(make_node("Trilu"), {&x, &k}), {0, 2, 3, 0, 0, 6});
  expect_vals(run1(make_node("Trilu", {{"upper", int64_t{0}}}), {&x, &km}), {0, 0, 0, 4, 0, 0});
  const Tensor e = run1(make_node("EyeLike", {{"k", int64_t{1}}, {"dtype", int64_t{7}}}), {&x});
  EXPECT_EQ(e.dtype, DType::kInt64);
  EXPECT_EQ(ivals(e), (std::vector<int64_t>{0, 1, 0, 0, 0, 1}));
  const Tensor like = I({1}, {0});
  const Tensor cl = run1(make_node("CastLike"), {&x, &like});
  EXPECT_EQ(cl.dtype, DType::kInt64);
  EXPECT_EQ(ivals(cl), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace gspmd
