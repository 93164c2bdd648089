// Partitioning the pipeline's stage shift (the handler in core/partition/pipeline_shift.cc).
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {
namespace {

// The pipeline's stage shift (core/ir/shift_op.h) under every sharding of its state: the stage dim split one row
// per device (a collective-permute, cyclic with wrap; the leaving row a partial sum, here added to another value),
// split otherwise or not at all (gathered, shifted locally); both directions, with and without an entering row.
TEST(OpsPartition, PipelineShift) {
  std::vector<Case> cases;
  for (int64_t S : {2, 3, 4})
    for (int64_t shift : {1, -1})
      for (int64_t wrap : {0, 1})
        for (bool with_in : {true, false}) {
          Builder b("shift_S" + std::to_string(S) + (shift > 0 ? "_fwd" : "_back") + (wrap ? "_wrap" : "") +
                    (with_in ? "_in" : ""));
          const int x = b.fin("x", {S, 3, 2});
          std::vector<int> ins{x};
          if (with_in) ins.push_back(b.fin("in", {1, 3, 2}));
          const std::vector<int> r =
              b.op("Shift", ins, {{"y", F32, {S, 3, 2}}, {"out", F32, {1, 3, 2}}}, {{"shift", shift}, {"wrap", wrap}});
          b.c.g.nodes.back().domain = kPipelineDomain;
          b.out(b.opf("Relu", {r[0]}, "y_relu", {S, 3, 2}));
          b.out(b.opf("Add", {r[1], b.weight("w", {1, 3, 2}, false)}, "out_plus", {1, 3, 2}));
          cases.push_back(b.done(12));
        }
  run_all("pipeline shift", cases);
}

}  // namespace
}  // namespace gspmd::ops_partition
