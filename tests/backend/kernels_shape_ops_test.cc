// Tests of the shape-op kernels (backend/kernels/ops_shape_ops.cc): Transpose, Reshape, Concat, Slice, Split, Gather,
// Pad...
#include "tests/backend/kernels_test_util.h"

namespace gspmd {
namespace {

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

}  // namespace
}  // namespace gspmd
