// The pod's collectives (backend/pod/collectives.cc): all-reduce, all-gather, reduce-scatter, all-to-all and
// collective-permute over mesh axes, by hand.
#include "tests/backend/pod_test_util.h"

namespace gspmd {
namespace {

TEST(PodCollectives, AllReduceSumOverOneAxisMesh2) {
  DeviceMesh m = mesh_of({2});
  auto ins = per_device(2, {2, 3});
  auto out =
      run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0}}, {"reduction", std::string("sum")}}),
               ins, DType::kFloat32, {2, 3});
  std::vector<float> want = {100, 102, 104, 106, 108, 110};  // (0+i) + (100+i)
  EXPECT_EQ(vals(out[0]), want);
  EXPECT_EQ(vals(out[1]), want);
}

TEST(PodCollectives, AllReduceMaxMinOn2x2PerAxis) {
  DeviceMesh m = mesh_of({2, 2});
  std::vector<Tensor> ins;
  // device d: [1,2] = {d, 10 - d}
  for (int d = 0; d < 4; ++d) ins.push_back(floats({1, 2}, {float(d), float(10 - d)}));
  // max over y: groups {0,1}, {2,3}
  auto out =
      run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{1}}, {"reduction", std::string("max")}}),
               ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{1, 10}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{1, 10}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{3, 8}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{3, 8}));
  // min over x: groups {0,2}, {1,3}
  out =
      run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0}}, {"reduction", std::string("min")}}),
               ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 8}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{0, 8}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{1, 7}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{1, 7}));
  // sum over both axes
  out = run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0, 1}}}), ins, DType::kFloat32, {1, 2});
  for (int d = 0; d < 4; ++d) EXPECT_EQ(vals(out[d]), (std::vector<float>{6, 34}));
}

TEST(PodCollectives, AllReduceDTypes) {
  std::vector<const Tensor*> p;
  // int64 prod
  Tensor a = typed<int64_t>(DType::kInt64, {3}, {2, -3, 4}), b = typed<int64_t>(DType::kInt64, {3}, {5, 6, -7});
  auto r = pod::all_reduce({&a, &b}, ReductionKind::kProd);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(vals<int64_t>(r[0]), (std::vector<int64_t>{10, -18, -28}));
  EXPECT_EQ(vals<int64_t>(r[1]), (std::vector<int64_t>{10, -18, -28}));
  // int32 sum
  Tensor c = typed<int32_t>(DType::kInt32, {2}, {1, 2}), d = typed<int32_t>(DType::kInt32, {2}, {30, 40});
  EXPECT_EQ(vals<int32_t>(pod::all_reduce({&c, &d}, ReductionKind::kSum)[0]), (std::vector<int32_t>{31, 42}));
  // float64 max
  Tensor e = typed<double>(DType::kFloat64, {2}, {1.5, -2}), f = typed<double>(DType::kFloat64, {2}, {-1, 2.25});
  EXPECT_EQ(vals<double>(pod::all_reduce({&e, &f}, ReductionKind::kMax)[1]), (std::vector<double>{1.5, 2.25}));
  // bool: sum/max = or, min/prod = and
  Tensor g = typed<uint8_t>(DType::kBool, {3}, {1, 0, 0}), h = typed<uint8_t>(DType::kBool, {3}, {1, 1, 0});
  EXPECT_EQ(vals<uint8_t>(pod::all_reduce({&g, &h}, ReductionKind::kSum)[0]), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(vals<uint8_t>(pod::all_reduce({&g, &h}, ReductionKind::kMin)[0]), (std::vector<uint8_t>{1, 0, 0}));
  // 16-bit floats: each step in float32, rounded once to the type (1 + 2^-10 is a float16; in bfloat16 it rounds to 1)
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    const bool f16 = t == DType::kFloat16;
    Tensor k(t, {2}), l(t, {2});
    const float kv[2] = {1.f, -2.f}, lv[2] = {0x1p-10f, 3.f};
    for (int i = 0; i < 2; ++i) {
      k.data<uint16_t>()[i] = f16 ? float_to_half(kv[i]) : float_to_bf16(kv[i]);
      l.data<uint16_t>()[i] = f16 ? float_to_half(lv[i]) : float_to_bf16(lv[i]);
    }
    const Tensor s = pod::all_reduce({&k, &l}, ReductionKind::kSum)[0];
    auto at = [&](int i) { return f16 ? half_to_float(s.data<uint16_t>()[i]) : bf16_to_float(s.data<uint16_t>()[i]); };
    EXPECT_EQ(at(0), f16 ? 1.f + 0x1p-10f : 1.f);
    EXPECT_EQ(at(1), 1.f);
  }
  // operands must agree
  Tensor z(DType::kFloat32, {2});
  Tensor w(DType::kFloat32, {3});
  EXPECT_THROW(pod::all_reduce({&z, &w}, ReductionKind::kSum), InternalError);
}

// ------------------------------------------------------------------------------------------------ AllGather
TEST(PodCollectives, AllGatherAxis1OverEachAxisOf2x2) {
  DeviceMesh m = mesh_of({2, 2});
  std::vector<Tensor> ins;
  for (int d = 0; d < 4; ++d) ins.push_back(floats({2, 1}, {float(10 * d), float(10 * d + 1)}));
  // over x: groups {0,2}, {1,3}
  auto out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{0}}, {"axis", int64_t{1}}}), ins,
                      DType::kFloat32, {2, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 20, 1, 21}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{0, 20, 1, 21}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{10, 30, 11, 31}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{10, 30, 11, 31}));
  // over y: groups {0,1}, {2,3}
  out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{1}}, {"axis", int64_t{1}}}), ins,
                 DType::kFloat32, {2, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 10, 1, 11}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{0, 10, 1, 11}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{20, 30, 21, 31}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{20, 30, 21, 31}));
}

TEST(PodCollectives, AllGatherOverBothAxesOf2x3AndNegativeAxis) {
  DeviceMesh m = mesh_of({2, 3});
  std::vector<Tensor> ins;
  for (int d = 0; d < 6; ++d) ins.push_back(floats({1, 1}, {float(d)}));
  auto out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{0, 1}}, {"axis", int64_t{-1}}}),
                      ins, DType::kFloat32, {1, 6});
  for (int d = 0; d < 6; ++d) EXPECT_EQ(vals(out[d]), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // axes listed minor-first: tile order is y-major: tile = y*2 + x -> devices 0,3,1,4,2,5
  out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{1, 0}}, {"axis", int64_t{1}}}), ins,
                 DType::kFloat32, {1, 6});
  EXPECT_EQ(vals(out[4]), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

// ------------------------------------------------------------------------------------------------ ReduceScatter
TEST(PodCollectives, ReduceScatterOn2x2) {
  DeviceMesh m = mesh_of({2, 2});
  auto ins = per_device(4, {1, 4});  // device d: 100d + {0,1,2,3}
  // over y, axis 1: groups {0,1} -> sum {100,102,104,106}; {2,3} -> {500,502,504,506}
  auto out = run_node(
      m,
      gspmd_node("ReduceScatter",
                 {{"mesh_axes", std::vector<int64_t>{1}}, {"axis", int64_t{1}}, {"reduction", std::string("sum")}}),
      ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{100, 102}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{104, 106}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{500, 502}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{504, 506}));
  // max over x: groups {0,2}, {1,3}
  out = run_node(
      m,
      gspmd_node("ReduceScatter",
                 {{"mesh_axes", std::vector<int64_t>{0}}, {"axis", int64_t{1}}, {"reduction", std::string("max")}}),
      ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{200, 201}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{202, 203}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{300, 301}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{302, 303}));
  // indivisible dim
  Tensor a(DType::kFloat32, {3}), b(DType::kFloat32, {3});
  EXPECT_THROW(pod::reduce_scatter({&a, &b}, 0, ReductionKind::kSum), InternalError);
}

// ------------------------------------------------------------------------------------------------ AllToAll
TEST(PodCollectives, AllToAll) {
  DeviceMesh m = mesh_of({2});
  auto ins = per_device(2, {1, 4});  // d0: {0,1,2,3}, d1: {100,101,102,103}
  // split axis 1 (chunks of 2), concat axis 0: device j gets [chunk j of d0; chunk j of d1]
  auto out = run_node(
      m,
      gspmd_node("AllToAll",
                 {{"mesh_axes", std::vector<int64_t>{0}}, {"split_axis", int64_t{1}}, {"concat_axis", int64_t{0}}}),
      ins, DType::kFloat32, {2, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 1, 100, 101}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{2, 3, 102, 103}));
  // split == concat: shape unchanged, chunks swapped
  out = run_node(
      m,
      gspmd_node("AllToAll",
                 {{"mesh_axes", std::vector<int64_t>{0}}, {"split_axis", int64_t{1}}, {"concat_axis", int64_t{1}}}),
      ins, DType::kFloat32, {1, 4});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 1, 100, 101}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{2, 3, 102, 103}));
  // 2x3 over y with 3 members, split 0 -> concat 1 on int64
  Tensor a = typed<int64_t>(DType::kInt64, {3, 1}, {0, 1, 2}), b = typed<int64_t>(DType::kInt64, {3, 1}, {10, 11, 12}),
         c = typed<int64_t>(DType::kInt64, {3, 1}, {20, 21, 22});
  auto r = pod::all_to_all({&a, &b, &c}, 0, 1);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1].shape, (Shape{1, 3}));
  EXPECT_EQ(vals<int64_t>(r[1]), (std::vector<int64_t>{1, 11, 21}));
  EXPECT_EQ(vals<int64_t>(r[2]), (std::vector<int64_t>{2, 12, 22}));
}

// ------------------------------------------------------------------------------------------------ CollectivePermute
TEST(PodCollectives, CollectivePermuteShiftPlusMinusOneZeroFill) {
  DeviceMesh m = mesh_of({2, 3});
  std::vector<Tensor> ins;
  for (int d = 0; d < 6; ++d) ins.push_back(floats({1, 2}, {float(d + 1), float(-(d + 1))}));
  // over y (size 3): tile t receives from t-1; tile 0 gets zeros
  auto out =
      run_node(m, gspmd_node("CollectivePermute", {{"mesh_axes", std::vector<int64_t>{1}}, {"shift", int64_t{1}}}), ins,
               DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{1, -1}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{2, -2}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[4]), (std::vector<float>{4, -4}));
  EXPECT_EQ(vals(out[5]), (std::vector<float>{5, -5}));
  // shift -1: tile t receives from t+1; the last tile gets zeros
  out = run_node(m, gspmd_node("CollectivePermute", {{"mesh_axes", std::vector<int64_t>{1}}, {"shift", int64_t{-1}}}),
                 ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{2, -2}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{3, -3}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{5, -5}));
  EXPECT_EQ(vals(out[4]), (std::vector<float>{6, -6}));
  EXPECT_EQ(vals(out[5]), (std::vector<float>{0, 0}));
  // over x (size 2), shift 1: devices 3,4,5 receive from 0,1,2
  out = run_node(m, gspmd_node("CollectivePermute", {{"mesh_axes", std::vector<int64_t>{0}}, {"shift", int64_t{1}}}),
                 ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[4]), (std::vector<float>{2, -2}));
}

}  // namespace
}  // namespace gspmd
