// The device order of a mesh (DeviceMesh::devices) and reading the HLO and SBP notations (core/sharding/notation.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "core/sharding/sharding.h"
#include "tests/core/sharding_test_util.h"

namespace gspmd {
namespace {

using testing::mesh2x2;
using testing::ts;
using Groups = std::vector<std::vector<int64_t>>;

std::string hlo_error(std::string_view text, const DeviceMesh& mesh) {
  try {
    sharding_from_hlo(text, mesh);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

std::string sbp_error(const std::vector<std::string>& sbp, const DeviceMesh& mesh) {
  try {
    sharding_from_sbp(sbp, mesh);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(DeviceOrder, CoordinatesFollowTheOrder) {
  const DeviceMesh m = mesh2x2({0, 2, 1, 3});  // device 1 at position 2 = (1, 0), device 2 at (0, 1)
  EXPECT_TRUE(m.has_device_order());
  EXPECT_FALSE(mesh2x2({0, 1, 2, 3}).has_device_order());
  EXPECT_EQ(m.coords(1), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(m.coords(2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m.position_of(1), 2);
  EXPECT_EQ(m.device_at(1), 2);
  EXPECT_EQ(m.tile_index(1, {0}), 1);
  EXPECT_EQ(m.tile_index(2, {0}), 0);
  EXPECT_EQ(m.replica_groups({0}), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(m.replica_groups({1}), (Groups{{0, 2}, {1, 3}}));
  // Groups are ordered by their smallest device, members by tile index.
  const DeviceMesh r{{2, 3}, {"x", "y"}, {5, 4, 3, 2, 1, 0}};
  EXPECT_EQ(r.replica_groups({1}), (Groups{{2, 1, 0}, {5, 4, 3}}));
  EXPECT_EQ(r.replica_groups({0}), (Groups{{3, 0}, {4, 1}, {5, 2}}));
  for (const auto& grp : r.replica_groups({1, 0}))
    for (size_t t = 0; t < grp.size(); ++t) EXPECT_EQ(r.tile_index(grp[t], {1, 0}), static_cast<int64_t>(t));
  // Refining splits axes row-major: positions, and so the order, stay.
  const DeviceMesh big{{4, 2}, {"x", "y"}, {7, 6, 5, 4, 3, 2, 1, 0}};
  const DeviceMesh refined = big.refine({{2}, {}});
  EXPECT_EQ(refined.devices, big.devices);
  EXPECT_EQ(refined.user().devices, big.devices);
  for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(refined.tile_index(d, refined.parts_of(0)), big.tile_index(d, {0}));
  EXPECT_EQ(refined.replica_groups(refined.parts_of(0)), big.replica_groups({0}));
}

TEST(DeviceOrder, CheckDevices) {
  auto problem = [](std::vector<int64_t> d) {
    try {
      mesh2x2(std::move(d)).check_devices();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("ok");
  };
  EXPECT_EQ(problem({}), "ok");
  EXPECT_EQ(problem({3, 2, 1, 0}), "ok");
  EXPECT_EQ(problem({0, 1, 2}), "has 3 entries but the mesh {data=2, model=2} has 4 devices");
  EXPECT_EQ(problem({0, 1, 2, 4}), "entry 3 is 4, not a device id 0..3");
  EXPECT_EQ(problem({0, -1, 2, 3}), "entry 1 is -1, not a device id 0..3");
  EXPECT_EQ(problem({0, 1, 1, 3}), "device 1 appears twice");
}

TEST(DeviceOrder, ShardsAndHloFollowTheOrder) {
  const DeviceMesh m = mesh2x2({3, 1, 2, 0});
  EXPECT_EQ(ts({{0}, {}}).to_hlo(m), "{devices=[2,1,2]3,1,2,0 last_tile_dim_replicate}");
  EXPECT_EQ(ts({{0}, {}}).to_hlo(m, /*iota=*/true), "{devices=[2,1,2]3,1,2,0 last_tile_dim_replicate}");
  EXPECT_EQ(ts({{1, 0}}).to_hlo(m), "{devices=[4]3,2,1,0}");
  // a [4] tensor split over data x model: device 3 holds tile 0, device 0 tile 3
  Tensor full = Tensor::from_int64s({10, 11, 12, 13});
  const TensorSharding s = ts({{0, 1}});
  EXPECT_EQ(shard_tensor(full, s, m, 3).data<int64_t>()[0], 10);
  EXPECT_EQ(shard_tensor(full, s, m, 0).data<int64_t>()[0], 13);
  std::vector<Tensor> shards;
  for (int64_t d = 0; d < 4; ++d) shards.push_back(shard_tensor(full, s, m, d));
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : shards) ptrs.push_back(&t);
  EXPECT_EQ(assemble_tensor(ptrs, s, m, {4}).bytes, full.bytes);
  // unreduced over data: the devices at data tile 0 (3 and 1) hold the value, the others zeros
  const TensorSharding u = ts({{}}, {0});
  EXPECT_EQ(shard_tensor(full, u, m, 1).bytes, full.bytes);
  EXPECT_EQ(shard_tensor(full, u, m, 2).data<int64_t>()[0], 0);
}

TEST(HloNotation, Reads) {
  const DeviceMesh m = mesh2x2();
  ParsedSharding p = sharding_from_hlo("{replicated}", m);
  EXPECT_TRUE(p.any_rank);
  p = sharding_from_hlo("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", m);
  EXPECT_FALSE(p.any_rank);
  EXPECT_EQ(p.sharding, ts({{0}, {}}));
  EXPECT_FALSE(p.mesh.is_refined());
  EXPECT_EQ(sharding_from_hlo("{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}", m).sharding, ts({{}, {1}}));
  EXPECT_EQ(sharding_from_hlo(" { devices=[1,2,2]<=[2,2]T(1,0) last_tile_dims={replicated} } ", m).sharding,
            ts({{}, {1}}));
  EXPECT_EQ(sharding_from_hlo("{devices=[2,2]0,2,1,3}", m).sharding, ts({{1}, {0}}));
  EXPECT_EQ(sharding_from_hlo("{devices=[4]0,2,1,3}", m).sharding, ts({{1, 0}}));
  EXPECT_EQ(sharding_from_hlo("{devices=[1,2,2]0,1,2,3 last_tile_dims={unreduced}}", m).sharding, ts({{}, {0}}, {1}));
  EXPECT_EQ(sharding_from_hlo("{devices=[2,2]0,1,2,3 last_tile_dims={partial, replicated}}", m).sharding, ts({}, {0}));
  EXPECT_EQ(
      sharding_from_hlo("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate metadata={op_name=\"a/b\"}}", m).sharding,
      ts({{0}, {}}));
  // XLA's iota forms
  const DeviceMesh m42{{4, 2}, {"x", "y"}};
  EXPECT_EQ(sharding_from_hlo("{devices=[4,2]<=[8]}", m42).sharding, ts({{0}, {1}}));
  EXPECT_EQ(sharding_from_hlo("{devices=[2,4]<=[4,2]T(1,0)}", m42).sharding, ts({{1}, {0}}));
}

TEST(HloNotation, SubAxes) {
  // <=[2,4]T(1,0) on {x=2, y=4}: 0,4,1,5 / 2,6,3,7. Dim 0 steps y by 2 (its major half), dim 1 steps x, then y by 1.
  const DeviceMesh m{{2, 4}, {"x", "y"}};
  ParsedSharding p = sharding_from_hlo("{devices=[2,4]<=[2,4]T(1,0)}", m);
  EXPECT_EQ(p.mesh.axes, (std::vector<std::string>{"x", "y:(1)2", "y:(2)2"}));
  EXPECT_EQ(p.sharding, ts({{1}, {2, 0}}));
  EXPECT_EQ(p.sharding.to_partition_spec(p.mesh), R"(["y:(1)2", ["y:(2)2", "x"]])");
  EXPECT_EQ(p.sharding.to_hlo(p.mesh), "{devices=[2,4]0,4,1,5,2,6,3,7}");
  // part of an axis tiles a dim, the rest replicates: the major half, or the minor half
  const DeviceMesh x4{{4}, {"x"}};
  p = sharding_from_hlo("{devices=[2,2]0,1,2,3 last_tile_dim_replicate}", x4);
  EXPECT_EQ(p.mesh.axes, (std::vector<std::string>{"x:(1)2", "x:(2)2"}));
  EXPECT_EQ(p.sharding, ts({{0}}));
  EXPECT_EQ(sharding_from_hlo("{devices=[2,2]0,2,1,3 last_tile_dim_replicate}", x4).sharding, ts({{1}}));
  // two dims take the two halves of one axis, the minor half major
  EXPECT_EQ(sharding_from_hlo("{devices=[2,2]0,2,1,3}", x4).sharding, ts({{1}, {0}}));
}

// Every sharding to_hlo writes reads back to itself: every role and order of the axes of a 2x3x2 mesh, with and
// without a device order, on the mesh and on a refinement of it, in both the explicit and the iota form.
TEST(HloNotation, RoundTripsEverySharding) {
  const DeviceMesh plain{{2, 3, 2}, {"a", "b", "c"}};
  DeviceMesh ordered = plain;
  ordered.devices = {7, 3, 11, 0, 5, 9, 1, 2, 10, 4, 6, 8};
  const DeviceMesh refined = DeviceMesh{{4, 3}, {"x", "y"}, {}}.refine({{2}, {}});
  int checked = 0;
  for (const DeviceMesh* m : std::vector<const DeviceMesh*>{&plain, &ordered, &refined}) {
    const int n = m->rank();
    std::vector<int> role(n, 0);  // 0 replicated, 1 dim 0, 2 dim 1, 3 unreduced
    std::function<void(int)> each = [&](int a) {
      if (a < n) {
        for (role[a] = 0; role[a] < 4; ++role[a]) each(a + 1);
        return;
      }
      std::vector<int> d0, d1, u;
      for (int x = 0; x < n; ++x) {
        if (role[x] == 1) d0.push_back(x);
        if (role[x] == 2) d1.push_back(x);
        if (role[x] == 3) u.push_back(x);
      }
      do {  // every order of the axes of dim 0
        const TensorSharding s = ts({d0, d1}, u);
        for (bool iota : {false, true}) {
          const std::string text = s.to_hlo(*m, iota);
          const ParsedSharding p = sharding_from_hlo(text, *m);
          const TensorSharding back = p.any_rank ? TensorSharding::replicated(2) : remap(p.sharding, p.mesh, *m);
          EXPECT_EQ(back, s) << text << " on " << m->str();
          ++checked;
        }
      } while (std::next_permutation(d0.begin(), d0.end()));
    };
    each(0);
  }
  EXPECT_EQ(checked, 3 * 2 * 78);  // per mesh: 78 shardings (3 axes in 4 roles, dim 0's axes in every order)
}

TEST(HloNotation, Errors) {
  const DeviceMesh m = mesh2x2();
  EXPECT_EQ(hlo_error("{maximal device=1}", m),
            "{maximal device=N} is not supported (one device holding the whole tensor): use {replicated} or a tiled "
            "sharding");
  EXPECT_EQ(hlo_error("{manual}", m), "{manual} is not supported: every value is partitioned by this tool");
  EXPECT_EQ(hlo_error("{devices=[2,2]0,1,2,3 last_tile_dims={manual}}", m),
            "last_tile_dims={manual} is not supported: every value is partitioned by this tool");
  EXPECT_EQ(hlo_error("{devices=[2,2]0,1,2,3 last_tile_dims={bogus}}", m),
            "unknown last_tile_dims kind 'bogus' (expected replicated or unreduced)");
  EXPECT_EQ(hlo_error("{{replicated}, {replicated}}", m),
            "tuple shardings are not supported: give each tensor its own sharding");
  EXPECT_EQ(hlo_error("{devices=[2,2]0,1,2,3 foo}", m),
            "malformed sharding \"{devices=[2,2]0,1,2,3 foo}\": expected last_tile_dim_replicate, "
            "last_tile_dims={...}, metadata={...} or '}' at column 23");
  EXPECT_EQ(hlo_error("devices=[4]0,1,2,3", m), "malformed sharding \"devices=[4]0,1,2,3\": expected '{' at column 1");
  EXPECT_EQ(hlo_error("{devices=[2,2]0,1,2,3}}", m),
            "malformed sharding \"{devices=[2,2]0,1,2,3}}\": expected the end of the text at column 23");
  EXPECT_EQ(hlo_error("{devices=[2,2]0,1,2}", m), "devices=[2,2] has 4 tiles but 3 device ids");
  EXPECT_EQ(hlo_error("{devices=[2,0]<=[0]}", m), "devices=[2,0] is not a list of positive sizes");
  EXPECT_EQ(hlo_error("{devices=[2,2]<=[2,2]T(0,0)}", m), "T(0,0) is not a permutation of 0..1");
  EXPECT_EQ(hlo_error("{devices=[2,4]<=[8]}", m),
            "the tile assignment has 8 devices but the mesh {data=2, model=2} has 4");
  EXPECT_EQ(hlo_error("{devices=[4]0,1,1,3}", m), "device 1 appears twice in the tile assignment");
  EXPECT_EQ(hlo_error("{devices=[4]0,1,2,4}", m), "device 4 is not on the mesh {data=2, model=2} (devices 0..3)");
  EXPECT_EQ(hlo_error("{devices=[2,2]0,1,2,3 last_tile_dims={unreduced, replicated, replicated}}", m),
            "3 trailing tile dims but devices=[2,2] has 2 dims");
  EXPECT_EQ(hlo_error("{devices=[4]1,0,2,3}", m),
            "{devices=[4]1,0,2,3} cannot be expressed on mesh {data=2, model=2}: its first tile is device 1, but a "
            "named-axis sharding starts with device 0");
  EXPECT_EQ(hlo_error("{devices=[4]0,3,1,2}", m),
            "{devices=[4]0,3,1,2} cannot be expressed on mesh {data=2, model=2}: along tile dim 0, device 3 follows "
            "device 0 but they differ on more than one mesh axis");
  EXPECT_EQ(hlo_error("{devices=[4]0,3,1,2}", mesh2x2({0, 2, 1, 3})),
            "{devices=[4]0,3,1,2} cannot be expressed on mesh {data=2, model=2} (devices [0,2,1,3]): along tile dim "
            "0, device 3 follows device 0 but they differ on more than one mesh axis");
  EXPECT_EQ(hlo_error("{devices=[2,4]0,1,2,3,4,5,7,6}", DeviceMesh{{2, 4}, {"x", "y"}}),
            "{devices=[2,4]0,1,2,3,4,5,7,6} cannot be expressed on mesh {x=2, y=4}: device 7 at tile 6 is not where "
            "the devices of the first tiles place it");
  const DeviceMesh m3{{3}, {"x"}};
  EXPECT_EQ(hlo_error("{devices=[3]0,2,1}", m3),
            "{devices=[3]0,2,1} cannot be expressed on mesh {x=3}: along tile dim 0, the devices do not step through "
            "mesh axis 'x' evenly");
}

TEST(SbpNotation, ReadsAndErrors) {
  const DeviceMesh m = mesh2x2();
  EXPECT_EQ(sharding_from_sbp({"S(0)", "B"}, m), ts({{0}}));
  EXPECT_EQ(sharding_from_sbp({"B", "S(1)"}, m), ts({{}, {1}}));
  EXPECT_EQ(sharding_from_sbp({"B", "B"}, m), ts({}));
  EXPECT_EQ(sharding_from_sbp({"S(0)", "S(0)"}, m), ts({{0, 1}}));  // mesh-axis order: data major
  EXPECT_EQ(sharding_from_sbp({"P", " S( 1 ) "}, m), ts({{}, {1}}, {0}));
  EXPECT_EQ(sharding_from_sbp({"P(max)", "P(max)"}, m), ts({}, {0, 1}, ReductionKind::kMax));
  EXPECT_EQ(sharding_from_sbp({"P(sum)", "B"}, m), ts({}, {0}));
  // a refined mesh: an SBP entry stands for all parts of its axis
  const DeviceMesh r = DeviceMesh{{4, 2}, {"x", "y"}}.refine({{2}, {}});
  EXPECT_EQ(sharding_from_sbp({"S(1)", "S(1)"}, r), ts({{}, {0, 1, 2}}));
  EXPECT_EQ(sbp_error({"S(0)"}, m), "has 1 entries but the mesh has 2 axes (data, model)");
  EXPECT_EQ(sbp_error({"Q", "B"}, m), "entry 0 is \"Q\"; expected S(dim), B, P or P(max), P(min), P(prod)");
  EXPECT_EQ(sbp_error({"B", "S(x)"}, m), "entry 1 is \"S(x)\"; expected S(dim), B, P or P(max), P(min), P(prod)");
  EXPECT_EQ(sbp_error({"P", "P(max)"}, m), "entries 0 and 1 are partial with different reductions (sum and max)");
}

}  // namespace
}  // namespace gspmd
