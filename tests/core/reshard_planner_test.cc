// ReshardPlanner (core/partition/reshard.h): the shortest-path choice between step sequences, its cache, its
// independence of the device count, and permute_sources. Exactness of every plan is tested by running them
// (tests/e2e/reshard_test.cc).
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/cost/cost.h"
#include "core/partition/reshard.h"

using namespace gspmd;

namespace {

/// Sharding from per-dim axis names; `unreduced` by name.
TensorSharding S(const DeviceMesh& mesh, const std::vector<std::vector<std::string>>& dims,
                 const std::vector<std::string>& unreduced = {}) {
  TensorSharding s = TensorSharding::replicated(static_cast<int>(dims.size()));
  for (size_t d = 0; d < dims.size(); ++d)
    for (const auto& a : dims[d]) s.dims[d].push_back(mesh.axis_index(a));
  for (const auto& a : unreduced) s.unreduced.push_back(mesh.axis_index(a));
  std::sort(s.unreduced.begin(), s.unreduced.end());
  return s;
}

/// "all-to-all{x} 128B; slice{y}" for a plan.
std::string steps_str(const DeviceMesh& mesh, const ReshardPlan& p) {
  std::vector<std::string> out;
  for (const ReshardStep& st : p.steps) {
    std::vector<std::string> names;
    for (int a : st.axes) names.push_back(mesh.axes[a]);
    std::string s = fmt::format("{}{{{}}}", step_name(st.kind), fmt::join(names, ","));
    if (st.kind != ReshardStep::Kind::kSlice) s += fmt::format(" {}B", st.bytes);
    out.push_back(s);
  }
  return fmt::format("{}", fmt::join(out, "; "));
}

struct Fixture {
  DeviceMesh mesh;
  Target target = Target::load("tpu-v3");
  ReshardPlanner planner;
  explicit Fixture(const char* m) : mesh(DeviceMesh::parse(m)), planner(mesh, target) {}
  std::string plan(const Shape& shape, const TensorSharding& from, const TensorSharding& to) {
    return steps_str(mesh, planner.plan(shape, 4, from, to));
  }
};

// A ragged dim (a symbol's size: the shape holds its hint, which may divide where other sizes do not) takes no
// reduce-scatter and no all-to-all, and is trimmed when gathered whole, though it divides at the hint.
TEST(ReshardPlanner, RaggedDimsDivideByNoSplit) {
  Fixture f("2x2");
  const DeviceMesh& m = f.mesh;
  const Shape sh = {1024, 1024};
  const std::vector<char> ragged = {1, 0};
  auto plan = [&](const TensorSharding& from, const TensorSharding& to, const std::vector<char>& r) {
    return f.planner.plan(sh, 4, from, to, r);
  };
  EXPECT_EQ(steps_str(m, plan(S(m, {{}, {}}, {"x"}), S(m, {{"x"}, {}}), {})), "reduce-scatter{x} 4194304B");
  EXPECT_EQ(steps_str(m, plan(S(m, {{}, {}}, {"x"}), S(m, {{"x"}, {}}), ragged)), "all-reduce{x} 4194304B; slice{x}");
  EXPECT_EQ(steps_str(m, plan(S(m, {{"x"}, {}}), S(m, {{}, {"x"}}), {})), "all-to-all{x} 2097152B");
  EXPECT_EQ(steps_str(m, plan(S(m, {{"x"}, {}}), S(m, {{}, {"x"}}), ragged)), "all-gather{x} 4194304B; slice{x}");
  const ReshardPlan& gather = plan(S(m, {{"x"}, {}}), S(m, {{}, {}}), ragged);
  ASSERT_EQ(gather.steps.size(), 1u);
  EXPECT_TRUE(gather.steps[0].trim);
  EXPECT_FALSE(plan(S(m, {{"x"}, {}}), S(m, {{}, {}}), {}).steps[0].trim);
}

TEST(ReshardPlanner, PicksTheCheapestCollective) {
  Fixture f("2x2");
  const DeviceMesh& m = f.mesh;
  // [1024,1024] f32: a [512,1024] shard is 2 MiB.
  const Shape sh = {1024, 1024};
  // moving a split between dims: an all-to-all beats all-gather + slice
  EXPECT_EQ(f.plan(sh, S(m, {{"x"}, {}}), S(m, {{}, {"x"}})), "all-to-all{x} 2097152B");
  // axis order within a dim, and axes swapped between dims: one collective-permute of the shard
  EXPECT_EQ(f.plan(sh, S(m, {{"x", "y"}, {}}), S(m, {{"y", "x"}, {}})), "collective-permute{x,y} 1048576B");
  EXPECT_EQ(f.plan(sh, S(m, {{"x"}, {"y"}}), S(m, {{"y"}, {"x"}})), "collective-permute{x,y} 1048576B");
  // a partial sum that ends split: reduce-scatter, not all-reduce + slice
  EXPECT_EQ(f.plan(sh, S(m, {{}, {}}, {"x"}), S(m, {{"x"}, {}})), "reduce-scatter{x} 4194304B");
  EXPECT_EQ(f.plan(sh, S(m, {{}, {}}, {"x", "y"}), S(m, {{"y"}, {"x"}})),
            "reduce-scatter{y} 4194304B; reduce-scatter{x} 2097152B");
  // adding a split is local
  EXPECT_EQ(f.plan(sh, S(m, {{"x"}, {}}), S(m, {{"x"}, {"y"}})), "slice{y}");
  // dropping the minor axis of a dim: one all-gather of that axis only
  EXPECT_EQ(f.plan(sh, S(m, {{"x", "y"}, {}}), S(m, {{"x"}, {}})), "all-gather{y} 2097152B");
}

TEST(ReshardPlanner, CostIsNoWorseThanGatherThenSlice) {
  // For every pair of tiled shardings of an even [64,96] on 2x4, the plan costs at most the naive plan (all-gather
  // every split dim, then slice), priced with the same cost model.
  Fixture f("2x4");
  const DeviceMesh& m = f.mesh;
  const Shape sh = {64, 96};
  std::vector<TensorSharding> all;
  for (int x = -1; x < 2; ++x)
    for (int y = -1; y < 2; ++y)
      for (bool yx : {false, true}) {
        TensorSharding s = TensorSharding::replicated(2);
        std::vector<std::pair<int, int>> order = {{0, x}, {1, y}};
        if (yx) std::swap(order[0], order[1]);
        for (auto [axis, dim] : order)
          if (dim >= 0) s.dims[dim].push_back(axis);
        if (std::find_if(all.begin(), all.end(), [&](const TensorSharding& o) { return o == s; }) == all.end())
          all.push_back(s);
      }
  ASSERT_EQ(all.size(), 11u);
  int pairs = 0;
  for (const auto& from : all)
    for (const auto& to : all) {
      const ReshardPlan& p = f.planner.plan(sh, 4, from, to);
      double naive = 0;
      Shape local = from.local_shape(sh, m);
      for (int d = 0; d < 2; ++d) {
        if (from.dims[d].empty()) continue;
        Shape after = local;
        after[d] = sh[d];
        naive += collective_time(Collective::kAllGather, static_cast<double>(num_elements(after) * 4), from.dims[d], m,
                                 f.target);
        local = after;
      }
      for (int d = 0; d < 2; ++d) {  // then one local slice per split dim of the target
        if (to.dims[d].empty()) continue;
        naive += static_cast<double>(num_elements(local) * 4) / f.target.hbm_bandwidth;
        local[d] = (local[d] + m.axes_size(to.dims[d]) - 1) / m.axes_size(to.dims[d]);
      }
      EXPECT_LE(p.seconds, naive * (1 + 1e-9))
          << from.to_partition_spec(m) << " -> " << to.to_partition_spec(m) << ": " << steps_str(m, p);
      if (from == to) {
        EXPECT_TRUE(p.steps.empty());
      }
      ++pairs;
    }
  EXPECT_EQ(pairs, 121);
}

TEST(ReshardPlanner, UnevenDimsAvoidStepsThatNeedDivisibility) {
  Fixture f("2x2");
  const DeviceMesh& m = f.mesh;
  // dim 0 of [5,8] is uneven over x: no all-to-all out of it (its shards do not concatenate to a prefix), so the
  // split is gathered (and the padding trimmed) and the new split sliced.
  const ReshardPlan& p = f.planner.plan({5, 8}, 4, S(m, {{"x"}, {}}), S(m, {{}, {"x"}}));
  ASSERT_EQ(p.steps.size(), 2u) << steps_str(m, p);
  EXPECT_EQ(p.steps[0].kind, ReshardStep::Kind::kAllGather);
  EXPECT_TRUE(p.steps[0].trim);
  EXPECT_EQ(p.steps[1].kind, ReshardStep::Kind::kSlice);
  // a permute needs only equal shard counts per dim, so uneven swaps stay one collective-permute
  EXPECT_EQ(f.plan({5, 7}, S(m, {{"x"}, {"y"}}), S(m, {{"y"}, {"x"}})), "collective-permute{x,y} 48B");
  // reduce-scatter needs the local dim divisible: 5 rows over x are not, so all-reduce then slice
  EXPECT_EQ(f.plan({5, 8}, S(m, {{}, {}}, {"x"}), S(m, {{"x"}, {}})), "all-reduce{x} 160B; slice{x}");
}

TEST(ReshardPlanner, CachedByShapeAndShardings) {
  Fixture f("2x2");
  const DeviceMesh& m = f.mesh;
  const TensorSharding a = S(m, {{"x"}, {}}), b = S(m, {{}, {"x"}});
  const ReshardPlan* p1 = &f.planner.plan({8, 8}, 4, a, b);
  const ReshardPlan* p2 = &f.planner.plan({8, 8}, 4, a, b);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(f.planner.searches(), 1);
  EXPECT_EQ(f.planner.hits(), 1);
  f.planner.plan({8, 16}, 4, a, b);  // another shape: another search
  f.planner.plan({8, 8}, 2, a, b);   // another element size: another search
  EXPECT_EQ(f.planner.searches(), 3);
}

TEST(ReshardPlanner, SearchSpaceIndependentOfDeviceCount) {
  // The search visits shardings, not devices: the same number of states on 2x2 and on 64x32 (2048 devices).
  Fixture small("2x2"), big("64x32");
  const Shape sh = {4096, 4096};
  auto states = [&](Fixture& f) {
    const DeviceMesh& m = f.mesh;
    return f.planner.plan(sh, 4, S(m, {{"x"}, {"y"}}, {}), S(m, {{"y"}, {"x"}})).states;
  };
  EXPECT_EQ(states(small), states(big));
  EXPECT_GT(states(small), 1);
}

TEST(ReshardPlanner, RejectsCreatingUnreducedAxes) {
  Fixture f("2x2");
  const DeviceMesh& m = f.mesh;
  EXPECT_THROW(f.planner.plan({4, 4}, 4, S(m, {{}, {}}), S(m, {{}, {}}, {"x"})), std::logic_error);
}

TEST(PermuteSources, ShiftAndRelayout) {
  DeviceMesh m = DeviceMesh::parse("2x3");
  // shift: t receives t - 1; the first member gets zeros
  EXPECT_EQ(permute_sources(m, {1}, 1, {}), (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_EQ(permute_sources(m, {1}, -1, {}), (std::vector<int64_t>{1, 2, -1}));
  // relayout [x,y] -> [y,x] on dim 0: member t = (i,j) (tile 3i+j over {x,y}) must hold chunk 2j+i, which
  // member (2j+i) holds under the source layout.
  EXPECT_EQ(permute_sources(m, {0, 1}, 0, {1, 0}), (std::vector<int64_t>{0, 2, 4, 1, 3, 5}));
  EXPECT_THROW(permute_sources(m, {0, 1}, 0, {1}), std::invalid_argument);
}

}  // namespace
