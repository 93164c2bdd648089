// FactorProjection (core/rules/factor_projection.h), in the manner of Shardy's sharding_projection_test: project
// tensor shardings onto a rule's factors, merge them under both conflict policies, and build tensor shardings back.
// Rules are written by hand (no graph needed); dims read major to minor.
#include "core/rules/factor_projection.h"

#include <gtest/gtest.h>

#include "tests/test_util/rule_literal.h"

namespace gspmd {
namespace {

using testing::make_rule;
using Axes = std::vector<int>;
using Dims = std::vector<std::vector<int>>;
constexpr FactorKind kPass = FactorKind::kPassThrough;
constexpr FactorKind kRed = FactorKind::kReduction;

TensorSharding sharded(Dims dims) {
  TensorSharding s = TensorSharding::replicated(static_cast<int>(dims.size()));
  s.dims = std::move(dims);
  return s;
}

// MatMul [8,16] x [16,32] -> [8,32]: i=8, j=32, k=16 (reduction).
OpShardingRule matmul() { return make_rule({8, 32, 16}, {kPass, kPass, kRed}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}}); }

const DeviceMesh kMesh{{2, 2, 4}, {"x", "y", "z"}};

TEST(FactorProjection, ProjectsEachTensorOntoItsFactors) {
  const OpShardingRule r = matmul();
  FactorProjection p(r, kMesh);
  const int a = p.add(sharded({{0}, {1}}), r.operands[0]);
  const int b = p.add(sharded({{}, {2}}), r.operands[1]);
  const int c = p.add(sharded({{}, {}}), r.results[0]);
  EXPECT_EQ(p.size(), 3);
  EXPECT_EQ(p.factors(a), (FactorSharding{{0}, {}, {1}}));
  EXPECT_EQ(p.factors(b), (FactorSharding{{}, {2}, {}}));
  EXPECT_EQ(p.factors(c), (FactorSharding{{}, {}, {}}));
  EXPECT_TRUE(p.exact(a) && p.exact(b) && p.exact(c));
  EXPECT_TRUE(p.indexes(a, 2));
  EXPECT_FALSE(p.indexes(c, 2));
  // An absent tensor (no dims) projects to nothing.
  const DimFactors none;
  const int d = p.add(TensorSharding::replicated(0), none);
  EXPECT_EQ(p.factors(d), (FactorSharding{{}, {}, {}}));
}

TEST(FactorProjection, MergedDimSplitOverSeveralFactors) {
  // Reshape [4,12] -> [4,3,4]: i=4, j=3, k=4; operand dim 1 = (j,k).
  const OpShardingRule r = make_rule({4, 3, 4}, {kPass, kPass, kPass}, {{{0}, {1, 2}}}, {{{0}, {1}, {2}}});
  const DeviceMesh mesh{{3, 2, 2}, {"a", "b", "c"}};
  FactorProjection p(r, mesh);
  // 12 over a(3) then b(2): a fills j (3), b goes on to k.
  const int t = p.add(sharded({{}, {0, 1}}), r.operands[0]);
  EXPECT_TRUE(p.exact(t));
  EXPECT_EQ(p.factors(t), (FactorSharding{{}, {0}, {1}}));
  // Over b then a: b (2) does not divide the major factor j=3, so the dim is not expressible.
  const int u = p.add(sharded({{}, {1, 0}}), r.operands[0]);
  EXPECT_FALSE(p.exact(u));
  EXPECT_EQ(p.factors(u), (FactorSharding{{}, {}, {}}));
  // Back onto the result: one factor per dim.
  EXPECT_EQ(p.tensor_sharding(p.factors(t), r.results[0]).dims, (Dims{{}, {0}, {1}}));
  // And onto the merged dim: j fully split by a, so k's axes follow.
  EXPECT_EQ(p.tensor_sharding(p.factors(t), r.operands[0], /*expressible_only=*/true).dims, (Dims{{}, {0, 1}}));
}

TEST(FactorProjection, NonDivisibleSplit) {
  // A single-factor dim takes any split, uneven too: [6] over z(4) is a split into 4 uneven shards.
  const OpShardingRule ew = make_rule({6}, {kPass}, {{{0}}}, {{{0}}});
  FactorProjection p(ew, kMesh);
  const int t = p.add(sharded({{2}}), ew.operands[0]);
  EXPECT_TRUE(p.exact(t));
  EXPECT_EQ(p.factors(t), (FactorSharding{{2}}));
  // A merged dim (2 x 3) over z(4): no factor boundary matches 4 -> not expressible, nothing projected.
  const OpShardingRule rs = make_rule({2, 3}, {kPass, kPass}, {{{0, 1}}}, {{{0}, {1}}});
  FactorProjection q(rs, kMesh);
  const int u = q.add(sharded({{2}}), rs.operands[0]);
  EXPECT_FALSE(q.exact(u));
  EXPECT_EQ(q.factors(u), (FactorSharding{{}, {}}));
  // x(2) then y(2) over (2 x 3): x fills the major factor, y does not divide 3.
  const int v = q.add(sharded({{0, 1}}), rs.operands[0]);
  EXPECT_FALSE(q.exact(v));
}

TEST(FactorProjection, BuildsTensorShardingsBackFromFactors) {
  // [B,S,H*D] -> [B,S,H,D], H=4, D=4: factors b=2, s=8, h=4, d=4.
  const OpShardingRule r =
      make_rule({2, 8, 4, 4}, {kPass, kPass, kPass, kPass}, {{{0}, {1}, {2, 3}}}, {{{0}, {1}, {2}, {3}}});
  const DeviceMesh mesh{{2, 2}, {"data", "model"}};
  FactorProjection p(r, mesh);
  // h partly split (model, 2 of 4) and d split: the merged dim can express only h's axes.
  const FactorSharding partly{{}, {}, {1}, {0}};
  EXPECT_EQ(p.tensor_sharding(partly, r.operands[0]).dims, (Dims{{}, {}, {1, 0}}));
  EXPECT_EQ(p.tensor_sharding(partly, r.operands[0], true).dims, (Dims{{}, {}, {1}}));
  EXPECT_EQ(p.tensor_sharding(partly, r.results[0]).dims, (Dims{{}, {}, {1}, {0}}));
  // h fully split (data x model = 4) then nothing more: the merged dim takes both.
  const FactorSharding full{{}, {}, {0, 1}, {}};
  EXPECT_EQ(p.tensor_sharding(full, r.operands[0], true).dims, (Dims{{}, {}, {0, 1}}));
  // A projection round-trips: project the result's sharding, build the operand's.
  const int t = p.add(sharded({{0}, {}, {1}, {}}), r.results[0]);
  EXPECT_EQ(p.tensor_sharding(p.factors(t), r.operands[0], true).dims, (Dims{{0}, {}, {1}}));
}

TEST(FactorProjection, AgreedAxesOfAReductionFactor) {
  const OpShardingRule r = matmul();
  FactorProjection p(r, kMesh);
  const int a = p.add(sharded({{0}, {1}}), r.operands[0]);
  const int b = p.add(sharded({{1}, {}}), r.operands[1]);
  const int c = p.add(sharded({{}, {}}), r.results[0]);
  EXPECT_EQ(p.agreed(2, {a, b}), (std::optional<Axes>{{1}}));     // both split k over y
  EXPECT_EQ(p.agreed(2, {a, b, c}), (std::optional<Axes>{{1}}));  // the result does not index k
  EXPECT_EQ(p.agreed(0, {a, b}), (std::optional<Axes>{{0}}));
  EXPECT_EQ(p.agreed(1, {a, c}), std::nullopt);  // c indexes j but leaves it whole
  EXPECT_EQ(p.agreed(1, {a}), std::nullopt);     // nobody indexes j
  const int d = p.add(sharded({{2}, {}}), r.operands[1]);
  EXPECT_EQ(p.agreed(2, {a, d}), std::nullopt);  // y vs z
}

TEST(FactorProjection, MergeFirstComeTakesWholeFactorsWhileAxesAreFree) {
  const OpShardingRule r = matmul();
  FactorProjection p(r, kMesh);
  const int a = p.add(sharded({{0}, {1}}), r.operands[0]);    // i=x, k=y
  const int b = p.add(sharded({{1}, {0}}), r.operands[1]);    // k=y, j=x: j conflicts with i over x
  const int c = p.add(sharded({{2}, {0, 1}}), r.results[0]);  // i=z, j={x,y}
  FactorSharding F(3);
  std::vector<char> used(3, 0);
  p.merge_first_come({a, b, c}, F, used);
  EXPECT_EQ(F, (FactorSharding{{0}, {}, {1}}));  // j: x taken by i; c's {x,y} also blocked
  EXPECT_EQ(used, (std::vector<char>{1, 1, 0}));
  // Results first: the result decides i and j, the operands have nothing left to give k.
  FactorSharding G(3);
  used.assign(3, 0);
  p.merge_first_come({c, a, b}, G, used);
  EXPECT_EQ(G, (FactorSharding{{2}, {0, 1}, {}}));
  // Assignments made beforehand stay (an agreed reduction factor k over y): the result's j = {x, y} is then
  // blocked, and j falls to b's x.
  FactorSharding H(3);
  H[2] = {1};
  used.assign(3, 0);
  used[1] = 1;
  p.merge_first_come({c, a, b}, H, used);
  EXPECT_EQ(H, (FactorSharding{{2}, {0}, {1}}));
}

TEST(FactorProjection, MergeLargestFirstResolvesConflictsByTensorSize) {
  const OpShardingRule r = matmul();
  FactorProjection p(r, kMesh);
  const auto all = [](int, int) { return true; };
  // The larger B (16x32) wins j over x; A's i over x then conflicts (x owned by j) and stays empty.
  p.add(sharded({{0}, {}}), r.operands[0], 8 * 16);
  const int b = p.add(sharded({{}, {0}}), r.operands[1], 16 * 32);
  FactorProjection::Merged m = p.merge_largest_first(all);
  EXPECT_TRUE(m.any);
  EXPECT_EQ(m.factors, (FactorSharding{{}, {0}, {}}));
  EXPECT_EQ(m.source, (std::vector<int>{-1, b, -1}));
  // Equal sizes: the earlier tensor wins.
  FactorProjection q(r, kMesh);
  q.add(sharded({{0}, {}}), r.operands[0], 100);
  q.add(sharded({{}, {0}}), r.operands[1], 100);
  EXPECT_EQ(q.merge_largest_first(all).factors, (FactorSharding{{0}, {}, {}}));
  // accept() filters factors: without the reduction factor, k stays unassigned.
  FactorProjection k(r, kMesh);
  k.add(sharded({{}, {1}}), r.operands[0], 1);
  FactorProjection::Merged none = k.merge_largest_first([&](int, int f) { return f != 2; });
  EXPECT_FALSE(none.any);
  EXPECT_EQ(none.source, (std::vector<int>{-1, -1, -1}));
}

TEST(FactorProjection, MergeLargestFirstExtendsAPrefixAndStopsAtOwnedAxes) {
  const OpShardingRule ew = make_rule({16, 16}, {kPass, kPass}, {{{0}, {1}}, {{0}, {1}}}, {{{0}, {1}}});
  const auto all = [](int, int) { return true; };
  {
    // The largest tensor splits i over x; a smaller one over {x, z} extends it (x is a prefix).
    FactorProjection p(ew, kMesh);
    p.add(sharded({{0}, {}}), ew.operands[0], 10);
    p.add(sharded({{0, 2}, {}}), ew.operands[1], 5);
    FactorProjection::Merged m = p.merge_largest_first(all);
    EXPECT_EQ(m.factors, (FactorSharding{{0, 2}, {}}));
    EXPECT_EQ(m.source[0], 0);  // the first axis came from the larger tensor
  }
  {
    // A disagreeing smaller tensor ({z} is not an extension of {x}) gives nothing to i.
    FactorProjection p(ew, kMesh);
    p.add(sharded({{0}, {}}), ew.operands[0], 10);
    p.add(sharded({{2}, {}}), ew.operands[1], 5);
    EXPECT_EQ(p.merge_largest_first(all).factors, (FactorSharding{{0}, {}}));
  }
  {
    // Axis ownership: j takes y first; i's extension {x, y, z} stops at y (owned by j).
    FactorProjection p(ew, kMesh);
    p.add(sharded({{0}, {1}}), ew.operands[0], 10);
    p.add(sharded({{0, 1, 2}, {}}), ew.operands[1], 5);
    EXPECT_EQ(p.merge_largest_first(all).factors, (FactorSharding{{0}, {1}}));
  }
  {
    // Not capped at the factor size: i (size 16) may take x, y, z (16 shards) and a 2-element dim may be split in 4.
    const OpShardingRule small = make_rule({2}, {kPass}, {{{0}}}, {{{0}}});
    FactorProjection p(small, kMesh);
    p.add(sharded({{2}}), small.operands[0], 2);
    EXPECT_EQ(p.merge_largest_first(all).factors, (FactorSharding{{2}}));
  }
}

}  // namespace
}  // namespace gspmd
