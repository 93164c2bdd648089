// Smallest reproductions of failures the sweeps of ops_partition_*_test.cc once found, each exact now.
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {
namespace {

TEST(OpsPartitionRepro, ReshardMovesAxisBetweenUnevenDims) {
  // X [3,5] split on dim 1 over x, needed split on dim 0 over x (both uneven, so no all-to-all): the per-dim planner
  // slices dim 0 over x (ShardSlice) *before* all-gathering dim 1 over x, so the gather concatenates pieces of
  // different rows.
  Builder B("Identity [3,5]");
  int X = B.fin("X", {3, 5});
  B.out(B.opf("Identity", {X}, "Y", {3, 5}));
  expect_exact(B.done(), mesh_of({2}), {{"X", spec(2, {{}, {0}})}, {"Y", spec(2, {{0}, {}})}});
}

TEST(OpsPartitionRepro, ReduceMaxOverSplitDim) {
  // ReduceMax over a split dim: the result is unreduced (max); the all-reduce leaves TensorSharding::reduction = max
  // with no unreduced axes, so it never equals the target (reduction = sum): "reshard of 'Y' did not reach its target".
  Builder B("ReduceMax [4] all axes");
  int X = B.fin("X", {4});
  B.out(B.opf("ReduceMax", {X}, "Y", {}, {{"keepdims", int64_t{0}}}));
  expect_exact(B.done(), mesh_of({2}), {{"X", spec(1, {{0}})}});
}

TEST(OpsPartitionRepro, SqueezeWithoutAxesOnSplitDim) {
  // Squeeze with no axes input squeezes every size-1 dim of its *local* input: X [3,1,5] split on dim 0 over 3 has
  // local shape [1,1,5], and the local Squeeze drops dim 0 too.
  Builder B("Squeeze [3,1,5] no axes");
  int X = B.fin("X", {3, 1, 5});
  B.out(B.opf("Squeeze", {X}, "Y", {3, 5}));
  expect_exact(B.done(), mesh_of({3}), {{"X", spec(3, {{0}, {}, {}})}});
}

TEST(OpsPartitionRepro, GemmBiasWithSplitK) {
  // Gemm with C and K split: every device adds beta*C to its partial product, so the all-reduce adds C n times.
  Builder B("Gemm A[4,6] B[6,3] C[3]");
  int A = B.fin("A", {4, 6});
  int W = B.fin("B", {6, 3});
  int C = B.fin("C", {3});
  B.out(B.opf("Gemm", {A, W, C}, "Y", {4, 3}));
  expect_exact(B.done(), mesh_of({2}), {{"A", spec(2, {{}, {0}})}, {"B", spec(2, {{0}, {}})}});
}

TEST(OpsPartitionRepro, OverSplitElementwiseNeedsNoCollectives) {
  // A and C [5,7] both split on dim 0 over {x, y} of a 2x3 mesh (6 tiles for 5 rows): the Add could run locally, but
  // the factor projection keeps only x, so both operands are all-gathered over y (numerically right, 2 collectives).
  Builder B("Add [5,7]");
  int A = B.fin("A", {5, 7});
  int C = B.fin("C", {5, 7});
  B.out(B.opf("Add", {A, C}, "Y", {5, 7}));
  SpmdProgram p = expect_exact(B.done(), mesh_of({2, 3}), {{"A", spec(2, {{0, 1}, {}})}, {"C", spec(2, {{0, 1}, {}})}});
  EXPECT_EQ(p.collectives.size(), 0u) << collectives_str(p);
}

}  // namespace
}  // namespace gspmd::ops_partition
