// Annotations are constraints (docs/partitioning.md, "Annotations are constraints"), at the partitioner: a weight is
// held only in its annotated sharding and gathered where used; a computed value is resharded to its annotation after
// its producer; a whole value annotated partial becomes partial locally; an impossible constraint is an InputError.
#include <gtest/gtest.h>

#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using testing::GraphBuilder;

TensorSharding spec(std::vector<std::vector<int>> dims, std::vector<int> unreduced = {},
                    ReductionKind r = ReductionKind::kSum) {
  return TensorSharding{std::move(dims), std::move(unreduced), r};
}

SpmdProgram partition_with(const Graph& g, const Annotations& ann) {
  return partition(g, propagate(g, ann), ann.mesh, Target::load("tpu-v3"));
}

int count(const SpmdProgram& p, Collective kind) {
  int n = 0;
  for (const CollectiveRecord& c : p.collectives) n += c.kind == kind;
  return n;
}

// y = x[4,8] @ w[8,6]: w annotated [x, y] on a 2x2 mesh, x annotated [x, null] (the 2D pattern's data split).
TEST(Constraints, AnnotatedWeightIsHeldShardedAndGatheredWhereUsed) {
  for (bool annotated : {true, false}) {
    GraphBuilder b;
    const int x = b.input("x", {4, 8}), w = b.weight("w", {8, 6});
    const int y = b.node("MatMul", {x, w}, {4, 6});
    b.g.outputs = {b.g.nodes[y].outputs[0]};
    Annotations ann{testing::mesh_of({2, 2}), {}};
    ann.by_value[x] = Annotation{spec({{0}, {}}), 0, "t: x"};
    ann.by_value[w] = Annotation{spec({{0}, {1}}), 0, "t: w", /*open=*/!annotated};
    const SpmdProgram p = partition_with(b.g, ann);
    std::vector<TensorSharding> held;
    for (const ProgramBinding& pb : p.params)
      if (pb.global == w) held.push_back(pb.sharding);
    if (annotated) {  // held [x, y] (a quarter), all-gathered over x for the MatMul
      EXPECT_EQ(held, std::vector<TensorSharding>{spec({{0}, {1}})});
      EXPECT_EQ(p.final_shardings[w], spec({{0}, {1}}));
      ASSERT_EQ(p.collectives.size(), 1u);
      EXPECT_EQ(p.collectives[0].kind, Collective::kAllGather);
      EXPECT_EQ(p.collectives[0].mesh_axes, std::vector<int>{0});
      EXPECT_EQ(p.collectives[0].bytes, 8 * 3 * 4);
      EXPECT_NE(p.collectives[0].reason.find("'w' is held as annotated, [\"x\", \"y\"] (t: w)"), std::string::npos)
          << p.collectives[0].reason;
    } else {  // a wholly open annotation is a hint: the weight is sliced at load as the MatMul needs it
      ASSERT_EQ(held.size(), 1u);
      EXPECT_EQ(held[0], spec({{}, {1}}));
      EXPECT_EQ(count(p, Collective::kAllGather), 0);
    }
  }
}

// h = Relu(x) with x split [x, null]; h annotated replicated: one all-gather right after the Relu, and h's consumer
// (Neg) reads the replicated copy.
TEST(Constraints, ComputedValueIsReshardedAfterItsProducer) {
  GraphBuilder b;
  const int x = b.input("x", {4, 6});
  const int relu = b.node("Relu", {x}, {4, 6});
  const int h = b.g.nodes[relu].outputs[0];
  const int neg = b.node("Neg", {h}, {4, 6});
  b.g.outputs = {b.g.nodes[neg].outputs[0]};
  Annotations ann{testing::mesh_of({2}), {}};
  ann.by_value[x] = Annotation{spec({{0}, {}}), 0, "t: x"};
  ann.by_value[h] = Annotation{spec({{}, {}}), 0, "t: h"};
  const SpmdProgram p = partition_with(b.g, ann);
  ASSERT_EQ(p.collectives.size(), 1u);
  EXPECT_EQ(p.collectives[0].kind, Collective::kAllGather);
  EXPECT_EQ(p.collectives[0].for_node, b.g.nodes[relu].name);
  EXPECT_EQ(p.final_shardings[h], spec({{}, {}}));
  EXPECT_EQ(p.final_shardings[b.g.outputs[0]], spec({{}, {}}));  // Neg computed on the replicated copy
}

// A whole value annotated partial (sum) becomes partial locally: MaskPad keeps it on the first tile, no collective.
TEST(Constraints, WholeValueAnnotatedPartialBecomesPartialLocally) {
  GraphBuilder b;
  const int x = b.input("x", {4, 6});
  const int relu = b.node("Relu", {x}, {4, 6});
  const int h = b.g.nodes[relu].outputs[0];
  b.g.outputs = {h};
  Annotations ann{testing::mesh_of({2}), {}};
  ann.by_value[h] = Annotation{spec({{}, {}}, {0}), 0, "t: h"};
  const SpmdProgram p = partition_with(b.g, ann);
  EXPECT_EQ(p.final_shardings[h], spec({{}, {}}, {0}));
  int masks = 0;
  for (const Node& n : p.program.nodes) masks += n.op_type == "MaskPad";
  EXPECT_EQ(masks, 1);
  // The graph output is wanted whole: it reads the whole copy the Relu computed, no collective.
  EXPECT_TRUE(p.collectives.empty());
}

// y = A @ B with K split: y is a partial SUM; annotated partial MAX, no reshard reaches it.
TEST(Constraints, AConstraintNoReshardMeetsIsAnInputError) {
  GraphBuilder b;
  const int a = b.input("a", {4, 8}), w = b.input("b", {8, 6});
  const int mm = b.node("MatMul", {a, w}, {4, 6});
  const int y = b.g.nodes[mm].outputs[0];
  b.g.outputs = {y};
  Annotations ann{testing::mesh_of({2}), {}};
  ann.by_value[a] = Annotation{spec({{}, {0}}), 0, "t: a"};
  ann.by_value[w] = Annotation{spec({{0}, {}}), 0, "t: b"};
  ann.by_value[y] = Annotation{spec({{}, {}}, {0}, ReductionKind::kMax), 0, "s.json: tensors.\"y\""};
  try {
    partition_with(b.g, ann);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "s.json: tensors.\"y\": 'MatMul_0_out' cannot have its annotated sharding [null, null] unreduced(max)={x}: "
        "reshard: unreduced values keep their reduction kind");
  }
}

// Expand of a broadcast value (the mean loss's gradient: a scalar to the logits' shape) is computed on each device's
// shard: the local Expand makes the local shape (uniform along the broadcast dims), with no full copy sliced after.
TEST(Constraints, ExpandOfABroadcastValueIsComputedOnTheShard) {
  GraphBuilder b;
  const int x = b.input("x", {}), y = b.input("y", {4, 6});
  const int r = b.g.nodes[b.node("Reshape", {x, b.ints("one", {1, 1})}, {1, 1})].outputs[0];
  const int e = b.g.nodes[b.node("Expand", {r, b.ints("shape", {4, 6})}, {4, 6})].outputs[0];
  b.g.outputs = {b.g.nodes[b.node("Mul", {e, y}, {4, 6})].outputs[0]};
  Annotations ann{testing::mesh_of({2, 2}), {}};
  ann.by_value[y] = Annotation{spec({{0}, {1}}), 0, "t: y"};
  const SpmdProgram p = partition_with(b.g, ann);
  EXPECT_EQ(p.final_shardings[static_cast<size_t>(e)], spec({{0}, {1}}));
  for (const Node& n : p.program.nodes) {
    EXPECT_NE(n.op_type, "ShardSlice") << n.name;
    if (n.op_type == "Expand") EXPECT_EQ(p.program.values[static_cast<size_t>(n.outputs[0])].shape, (Shape{2, 3}));
  }
}

}  // namespace
}  // namespace gspmd
