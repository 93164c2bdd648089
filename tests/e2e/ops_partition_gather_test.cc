// Partitioning Gather (the masked lookup of a split table, core/partition/gather.cc).
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {
namespace {

TEST(OpsPartition, Gather) {
  std::vector<Case> cs;
  {
    Builder B("Gather axis 0 table[7,6] ids[3,4]");
    int T = B.fin("table", {7, 6});
    int I = B.in("ids", I64, {3, 4}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {T, I}, "Y", {3, 4, 6}, {{"axis", int64_t{0}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 0 weight table[9,5] ids[5]");
    int T = B.weight("table", {9, 5});
    int I = B.in("ids", I64, {5}, {Gen::kIds, 9});
    B.out(B.opf("Gather", {T, I}, "Y", {5, 5}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 0 negative ids table[7,4] ids[2,5]");
    int T = B.fin("table", {7, 4});
    int I = B.in("ids", I64, {2, 5}, {Gen::kIdsSigned, 7});
    B.out(B.opf("Gather", {T, I}, "Y", {2, 5, 4}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 0 int32 ids table[7,4] ids[6]");
    int T = B.fin("table", {7, 4});
    int I = B.in("ids", DType::kInt32, {6}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {T, I}, "Y", {6, 4}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 1 X[5,7,3] ids[4]");
    int X = B.fin("X", {5, 7, 3});
    int I = B.in("ids", I64, {4}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {X, I}, "Y", {5, 4, 3}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 1 X[5,7] ids[2,3]");
    int X = B.fin("X", {5, 7});
    int I = B.in("ids", I64, {2, 3}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {X, I}, "Y", {5, 2, 3}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 1 scalar id X[5,7,3]");
    int X = B.fin("X", {5, 7, 3});
    int I = B.init("idx", Tensor::from_int64s({4}, true));
    B.out(B.opf("Gather", {X, I}, "Y", {5, 3}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  run_all("Gather", cs);
}

TEST(OpsPartitionRepro, GatherNegativeIdsVocabSplit) {
  // Vocab-parallel Gather with negative ids (valid in ONNX: -1 = last row): the lowering subtracts the offset without
  // normalising negative ids first, so their rows come out as zeros.
  Builder B("Gather table[4,2] ids[3]");
  int T = B.fin("table", {4, 2});
  int I = B.in("ids", I64, {3}, {Gen::kIdsSigned, 4});
  B.out(B.opf("Gather", {T, I}, "Y", {3, 2}));
  Case c = B.done();
  Tensor ids = Tensor::from_int64s({-1, 1, -4});
  Tensor table = Tensor::from_floats({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  expect_exact(c, mesh_of({2}), {{"table", spec(2, {{0}, {}})}}, {table, ids});
}

}  // namespace
}  // namespace gspmd::ops_partition
