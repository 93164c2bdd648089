#include "core/sharding/sharding.h"

#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "tests/core/sharding_test_util.h"

namespace gspmd {
namespace {

using testing::mesh2x2;
using testing::ts;

TEST(DeviceMesh, Parse) {
  auto m = DeviceMesh::parse("4x4");
  EXPECT_EQ(m.shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(m.axes, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(DeviceMesh::parse("16").shape, (std::vector<int64_t>{16}));
  m = DeviceMesh::parse("2x2x4");
  EXPECT_EQ(m.axes, (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(m.num_devices(), 16);
  EXPECT_EQ(DeviceMesh::parse("1x1x1x1x2").axes, (std::vector<std::string>{"x", "y", "z", "w", "a4"}));
  EXPECT_EQ(m.str(), "{x=2, y=2, z=4}");
  for (const char* bad : {"abc", "", "4x", "x4", "0x4", "4x-1", "4 x4", "4x4x"}) {
    try {
      DeviceMesh::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--mesh: '") + bad + "' is not a mesh shape like 4x4");
    }
  }
}

TEST(DeviceMesh, CoordsAndTileIndex) {
  auto m = mesh2x2();
  EXPECT_EQ(m.coords(2), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(m.coords(1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m.axis_index("model"), 1);
  EXPECT_EQ(m.axis_index("nope"), -1);
  EXPECT_EQ(m.tile_index(3, {0, 1}), 3);
  EXPECT_EQ(m.tile_index(1, {0, 1}), 1);
  EXPECT_EQ(m.tile_index(1, {1, 0}), 2);  // model major: 1*2 + 0
  EXPECT_EQ(m.tile_index(2, {1, 0}), 1);
  EXPECT_EQ(m.tile_index(3, {}), 0);
  EXPECT_EQ(m.axes_size({0, 1}), 4);
  EXPECT_EQ(m.axes_size({}), 1);
}

TEST(DeviceMesh, ReplicaGroups) {
  auto m = mesh2x2();
  using G = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(m.replica_groups({0}), (G{{0, 2}, {1, 3}}));
  EXPECT_EQ(m.replica_groups({1}), (G{{0, 1}, {2, 3}}));
  EXPECT_EQ(m.replica_groups({0, 1}), (G{{0, 1, 2, 3}}));
  EXPECT_EQ(m.replica_groups({1, 0}), (G{{0, 2, 1, 3}}));
  EXPECT_EQ(m.replica_groups({}), (G{{0}, {1}, {2}, {3}}));
  DeviceMesh m3{{2, 2, 2}, {"x", "y", "z"}};
  EXPECT_EQ(m3.replica_groups({0, 2}), (G{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m3.replica_groups({2, 0}), (G{{0, 4, 1, 5}, {2, 6, 3, 7}}));
  // Every group member agrees with tile_index.
  DeviceMesh big{{4, 3, 2}, {"a", "b", "c"}};
  auto groups = big.replica_groups({2, 0});
  ASSERT_EQ(groups.size(), 3u);
  for (const auto& gr : groups)
    for (size_t t = 0; t < gr.size(); ++t) EXPECT_EQ(big.tile_index(gr[t], {2, 0}), static_cast<int64_t>(t));
}

TEST(DeviceMesh, SubAxes) {
  const DeviceMesh m = DeviceMesh::parse("4x8");
  const DeviceMesh r = m.refine({{2}, {2, 4}});  // x -> (1)2,(2)2; y -> (1)2,(2)2,(4)2
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 2, 2, 2, 2}));
  EXPECT_EQ(r.axes, (std::vector<std::string>{"x:(1)2", "x:(2)2", "y:(1)2", "y:(2)2", "y:(4)2"}));
  EXPECT_EQ(r.num_devices(), 32);
  EXPECT_EQ(r.str(), "{x=4, y=8}");
  EXPECT_EQ(r.cuts(), (std::vector<std::vector<int64_t>>{{2}, {2, 4}}));
  EXPECT_EQ(r.user().axes, m.axes);
  // devices keep their numbers: the parts of an axis, major to minor, index as the axis did
  for (int64_t d = 0; d < 32; ++d) {
    EXPECT_EQ(r.tile_index(d, r.parts_of(0)), m.tile_index(d, {0}));
    EXPECT_EQ(r.tile_index(d, r.parts_of(1)), m.tile_index(d, {1}));
  }
  EXPECT_EQ(r.replica_groups({2, 3, 4}), m.replica_groups({1}));
  EXPECT_EQ(r.parts_between(1, 2, 8), (std::vector<int>{3, 4}));
  EXPECT_THROW(r.parts_between(1, 3, 6), std::invalid_argument);
  // names: a complete run of an axis' parts prints as the axis
  EXPECT_EQ(r.axis_names({0, 1, 3}), (std::vector<std::string>{"x", "y:(2)2"}));
  EXPECT_EQ(r.axis_names({1, 0}), (std::vector<std::string>{"x:(2)2", "x:(1)2"}));
  // remap both ways; refining again merges cuts
  TensorSharding s = TensorSharding::replicated(2);
  s.dims = {{1}, {0}};
  TensorSharding t = remap(s, m, r);
  EXPECT_EQ(t.dims, (std::vector<std::vector<int>>{{2, 3, 4}, {0, 1}}));
  EXPECT_EQ(t.to_partition_spec(r), R"(["y", "x"])");
  EXPECT_EQ(t.local_shape({16, 16}, r), s.local_shape({16, 16}, m));
  EXPECT_EQ(remap(t, r, r.refine({{}, {}})), t);
  EXPECT_THROW(remap(t, r, m), std::invalid_argument);  // y:(1)2 etc. have no axis of their own on m
  EXPECT_THROW(m.refine({{3}, {}}), std::invalid_argument);
  EXPECT_THROW(m.refine({{}, {2, 3}}), std::invalid_argument);
}

TEST(TensorSharding, ShapesAndOffsets) {
  auto m = mesh2x2();
  auto s = ts({{0}, {}});
  EXPECT_TRUE(s.is_tiled());
  EXPECT_FALSE(s.is_replicated());
  EXPECT_EQ(s.local_shape({5, 7}, m), (Shape{3, 7}));
  EXPECT_EQ(s.offset(0, {5, 7}, m, 2), 3);
  EXPECT_EQ(s.valid(0, {5, 7}, m, 2), 2);
  EXPECT_EQ(s.valid(0, {5, 7}, m, 1), 3);
  EXPECT_TRUE(s.is_uneven({5, 7}, m));
  EXPECT_FALSE(s.is_uneven({6, 7}, m));
  auto s2 = ts({{1, 0}});
  EXPECT_EQ(s2.local_shape({3}, m), (Shape{1}));
  EXPECT_EQ(s2.offset(0, {3}, m, 3), 3);
  EXPECT_EQ(s2.valid(0, {3}, m, 3), 0);  // empty shard
  EXPECT_EQ(s2.tiled_axes(), (std::vector<int>{1, 0}));
  EXPECT_TRUE(TensorSharding::replicated(3).is_replicated());
  EXPECT_TRUE(ts({{}}, {0}).is_tiled() == false);
}

TEST(TensorSharding, Verify) {
  auto m = mesh2x2();
  ts({{0}, {1}}).verify(m, 2);
  try {
    ts({{0}, {0}}).verify(m, 2);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "axis 'data' is used twice");
  }
  try {
    ts({{1}, {}}, {1}).verify(m, 2);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "axis 'model' is used twice");
  }
  EXPECT_THROW(ts({{0}}).verify(m, 2), std::invalid_argument);
  EXPECT_THROW(ts({{5}}).verify(m, 1), std::invalid_argument);
  EXPECT_THROW(ts({{}}, {1, 0}).verify(m, 1), std::invalid_argument);
}

TEST(TensorSharding, Printers) {
  auto m = mesh2x2();
  auto s = ts({{0}, {}, {}});
  EXPECT_EQ(s.to_partition_spec(m), R"(["data", null, null])");
  EXPECT_EQ(s.to_hlo(m), "{devices=[2,1,1,2]0,1,2,3 last_tile_dim_replicate}");
  EXPECT_EQ(s.to_sbp(m), "(S(0), B)");

  // Split over model only: XLA's device order is transposed (JAX: P('model', None) on mesh (data, model)).
  s = ts({{1}, {}});
  EXPECT_EQ(s.to_partition_spec(m), R"(["model", null])");
  EXPECT_EQ(s.to_hlo(m), "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}");
  EXPECT_EQ(s.to_sbp(m), "(B, S(0))");

  s = ts({{0}, {1}});
  EXPECT_EQ(s.to_hlo(m), "{devices=[2,2]0,1,2,3}");
  EXPECT_EQ(s.to_sbp(m), "(S(0), S(1))");
  s = ts({{1}, {0}});
  EXPECT_EQ(s.to_hlo(m), "{devices=[2,2]0,2,1,3}");

  s = ts({{}, {1, 0}});
  EXPECT_EQ(s.to_partition_spec(m), R"([null, ["model", "data"]])");
  EXPECT_EQ(s.to_hlo(m), "{devices=[1,4]0,2,1,3}");
  EXPECT_EQ(s.to_sbp(m), "(S(1), S(1))");

  s = ts({{}, {}});
  EXPECT_EQ(s.to_partition_spec(m), "[null, null]");
  EXPECT_EQ(s.to_hlo(m), "{replicated}");
  EXPECT_EQ(s.to_sbp(m), "(B, B)");
  EXPECT_EQ(ts({}).to_partition_spec(m), "[]");

  // Unreduced: own trailing tile dim (header example).
  s = ts({{1}, {}}, {0});
  EXPECT_EQ(s.to_partition_spec(m), R"(["model", null] unreduced={data})");
  EXPECT_EQ(s.to_hlo(m), "{devices=[2,1,2]0,2,1,3 last_tile_dims={unreduced}}");
  EXPECT_EQ(s.to_sbp(m), "(P, S(0))");
  s = ts({{}}, {0}, ReductionKind::kMax);
  EXPECT_EQ(s.to_partition_spec(m), R"([null] unreduced(max)={data})");
  EXPECT_EQ(s.to_hlo(m), "{devices=[1,2,2]0,1,2,3 last_tile_dims={unreduced, replicated}}");
  EXPECT_EQ(s.to_sbp(m), "(P(max), B)");
  s = ts({{}}, {0, 1});
  EXPECT_EQ(s.to_partition_spec(m), R"([null] unreduced={data, model})");
  EXPECT_EQ(s.to_hlo(m), "{devices=[1,4]0,1,2,3 last_tile_dims={unreduced}}");

  DeviceMesh m3{{2, 2, 2}, {"x", "y", "z"}};
  s = ts({{0}, {}}, {1});
  EXPECT_EQ(s.to_hlo(m3), "{devices=[2,1,2,2]0,1,2,3,4,5,6,7 last_tile_dims={unreduced, replicated}}");
  s = ts({{2}, {0}});
  EXPECT_EQ(s.to_hlo(m3), "{devices=[2,2,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
  EXPECT_EQ(s.to_sbp(m3), "(S(1), B, S(0))");
}

Tensor iota_f32(Shape shape) {
  Tensor t(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i + 1);
  return t;
}

std::vector<Tensor> shard_all(const Tensor& full, const TensorSharding& s, const DeviceMesh& m) {
  std::vector<Tensor> out;
  for (int64_t k = 0; k < m.num_devices(); ++k) out.push_back(shard_tensor(full, s, m, k));
  return out;
}

Tensor assemble(const std::vector<Tensor>& shards, const TensorSharding& s, const DeviceMesh& m, const Shape& g) {
  std::vector<const Tensor*> p;
  for (const auto& t : shards) p.push_back(&t);
  return assemble_tensor(p, s, m, g);
}

TEST(ShardTensor, UnevenRoundTrip) {
  auto m = mesh2x2();
  Tensor full = iota_f32({5, 3});
  auto s = ts({{0}, {1}});
  auto shards = shard_all(full, s, m);
  ASSERT_EQ(shards[3].shape, (Shape{3, 2}));
  // device 3 = tile (1,1): rows 3..4, cols 2..2; padding zero.
  const float* d3 = shards[3].data<float>();
  EXPECT_EQ(d3[0], 3 * 3 + 2 + 1);
  EXPECT_EQ(d3[1], 0.f);
  EXPECT_EQ(d3[2], 4 * 3 + 2 + 1);
  EXPECT_EQ(d3[4], 0.f);
  EXPECT_EQ(d3[5], 0.f);
  Tensor back = assemble(shards, s, m, full.shape);
  EXPECT_EQ(back.bytes, full.bytes);

  // int64, compound split, empty shard on the last device.
  Tensor ints = Tensor::from_int64s({10, 11, 12});
  auto s2 = ts({{1, 0}});
  auto sh2 = shard_all(ints, s2, m);
  EXPECT_EQ(sh2[2].as_int64s(), (std::vector<int64_t>{11}));  // device 2 = tile 1
  EXPECT_EQ(sh2[3].as_int64s(), (std::vector<int64_t>{0}));   // tile 3: padding only
  EXPECT_EQ(assemble(sh2, s2, m, ints.shape).bytes, ints.bytes);

  // Scalars and replicated tensors.
  Tensor sc = Tensor::from_floats({}, {4.5f});
  auto rs = TensorSharding::replicated(0);
  EXPECT_EQ(assemble(shard_all(sc, rs, m), rs, m, {}).bytes, sc.bytes);

  // Bool, 3-D.
  Tensor b(DType::kBool, {3, 2, 5});
  for (size_t i = 0; i < b.bytes.size(); ++i) b.bytes[i] = std::byte(i % 3 == 0);
  auto s3 = ts({{}, {0}, {1}});
  EXPECT_EQ(assemble(shard_all(b, s3, m), s3, m, b.shape).bytes, b.bytes);
}

TEST(ShardTensor, Unreduced) {
  auto m = mesh2x2();
  Tensor full = iota_f32({5, 3});
  auto s = ts({{0}, {}}, {1});
  auto shards = shard_all(full, s, m);
  // device 1 = (data 0, model 1): unreduced tile 1 holds zeros.
  for (int64_t i = 0; i < shards[1].numel(); ++i) EXPECT_EQ(shards[1].data<float>()[i], 0.f);
  EXPECT_EQ(shards[0].data<float>()[0], 1.f);
  EXPECT_EQ(assemble(shards, s, m, full.shape).bytes, full.bytes);

  auto smax = ts({{0}, {}}, {1}, ReductionKind::kMax);
  auto shm = shard_all(full, smax, m);
  EXPECT_EQ(shm[1].data<float>()[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(shm[3].data<float>()[3 * 3 - 1], 0.f);  // padding row stays zero
  EXPECT_EQ(assemble(shm, smax, m, full.shape).bytes, full.bytes);

  // Real partial sums over both axes combine.
  auto sp = ts({{}}, {0, 1});
  std::vector<Tensor> parts;
  for (int k = 0; k < 4; ++k) parts.push_back(Tensor::from_floats({2}, {float(k + 1), float(10 * (k + 1))}));
  Tensor sum = assemble(parts, sp, m, {2});
  EXPECT_EQ(sum.data<float>()[0], 10.f);
  EXPECT_EQ(sum.data<float>()[1], 100.f);
  auto spm = ts({{}}, {0, 1}, ReductionKind::kMin);
  Tensor mn = assemble(parts, spm, m, {2});
  EXPECT_EQ(mn.data<float>()[0], 1.f);

  // int32 prod
  Tensor i32(DType::kInt32, {2});
  i32.data<int32_t>()[0] = 3;
  i32.data<int32_t>()[1] = -2;
  auto sprod = ts({{0}}, {1}, ReductionKind::kProd);
  auto shp = shard_all(i32, sprod, m);
  EXPECT_EQ(shp[1].data<int32_t>()[0], 1);
  EXPECT_EQ(assemble(shp, sprod, m, i32.shape).bytes, i32.bytes);
}

TEST(ShardTensor, HalfUnreduced) {
  auto m = mesh2x2();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    Tensor h(dt, {3});
    const uint16_t vals16[3] = {0x3C00, 0xC000, 0x4200};  // f16: 1, -2, 3
    const uint16_t valsbf[3] = {0x3F80, 0xC000, 0x4040};  // bf16: 1, -2, 3
    std::memcpy(h.bytes.data(), dt == DType::kFloat16 ? vals16 : valsbf, 6);
    auto s = ts({{1}}, {0}, ReductionKind::kMax);
    auto shards = shard_all(h, s, m);
    uint16_t first;
    std::memcpy(&first, shards[2].bytes.data(), 2);  // device 2: data tile 1 holds -inf
    EXPECT_EQ(first, dt == DType::kFloat16 ? 0xFC00 : 0xFF80);
    EXPECT_EQ(assemble(shards, s, m, h.shape).bytes, h.bytes);
    auto ssum = ts({{}}, {0, 1});
    EXPECT_EQ(assemble(shard_all(h, ssum, m), ssum, m, h.shape).bytes, h.bytes);
  }
}

TEST(ShardTensor, AssembleChecks) {
  auto m = mesh2x2();
  Tensor full = iota_f32({4, 4});
  auto s = ts({{0}, {}});
  auto shards = shard_all(full, s, m);
  shards[2] = Tensor(DType::kFloat32, {3, 4});
  EXPECT_THROW(assemble(shards, s, m, full.shape), std::invalid_argument);
  shards.pop_back();
  EXPECT_THROW(assemble(shards, s, m, full.shape), std::invalid_argument);
}

}  // namespace
}  // namespace gspmd
