// Control-flow kernels and shape functions (If, Loop, Scan) on hand-built bodies: zero iterations, a while loop
// whose trip count is data, Scan at opset 8 (batched).
#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "core/shapes/shapes.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using testing::F;
using testing::make_node;
using testing::V;

// Adds node `op` over `in` to `b`, its one output `out` typed float32 `s`.
int body_node(Graph& b, const std::string& op, std::vector<int> in, const std::string& out, Shape s,
              DType t = DType::kFloat32) {
  Node n;
  n.name = op + "_" + out;
  n.op_type = op;
  n.inputs = std::move(in);
  n.outputs = {b.add_value(V(out, t, std::move(s)))};
  b.add_node(std::move(n));
  return b.nodes.back().outputs[0];
}

// Loop body (i, c, acc[2]) -> (c or acc_sum < 10, acc + acc, (acc + acc)^2).
std::shared_ptr<const Graph> doubling_body(bool while_small) {
  auto b = std::make_shared<Graph>();
  b->inputs = {b->add_value(V("i", DType::kInt64, {})), b->add_value(V("c", DType::kBool, {})),
               b->add_value(V("acc", DType::kFloat32, {2}))};
  const int twice = body_node(*b, "Add", {b->inputs[2], b->inputs[2]}, "twice", {2});
  const int sq = body_node(*b, "Mul", {twice, twice}, "sq", {2});
  int cond = b->inputs[1];
  if (while_small) {
    const int sum = body_node(*b, "ReduceSum", {twice}, "sum", {}, DType::kFloat32);
    b->nodes.back().attrs["keepdims"] = int64_t{0};
    const int ten = b->add_value(V("ten", DType::kFloat32, {}));
    b->values[ten].is_initializer = true;
    b->values[ten].data = std::make_shared<Tensor>(F({}, {10}));
    cond = body_node(*b, "Less", {sum, ten}, "small", {}, DType::kBool);
  }
  b->outputs = {cond, twice, sq};
  return b;
}

Node loop_node(bool while_small) {
  Node n = make_node("Loop", {{"body", doubling_body(while_small)}}, 2);
  n.inputs = {0, 1, 2};
  return n;
}

TEST(KernelsControl, LoopWithZeroIterationsGivesEmptyScanOutputs) {
  const Node n = loop_node(false);
  const Tensor m = Tensor::from_int64s({0}, /*scalar=*/true), acc = F({2}, {1, 2});
  const std::vector<Tensor> out = run_kernel(n, {&m, nullptr, &acc}, 17);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(testing::compare_tensors(out[0], acc), "");
  EXPECT_EQ(out[1].shape, (Shape{0, 2}));
  const TensorType mt{DType::kInt64, {}}, at{DType::kFloat32, {2}};
  const std::vector<TensorType> types = infer_types(n, {&mt, nullptr, &at}, {&m, nullptr, nullptr}, 17);
  EXPECT_EQ(types[1].shape, (Shape{0, 2}));
}

// A model from strangers cannot make a run endless: a trip count of 2^40 stops at kMaxLoopIterations, in one line.
TEST(KernelsControl, LoopStopsAtItsIterationLimit) {
  const Node n = loop_node(false);
  const Tensor m = Tensor::from_int64s({int64_t{1} << 40}, /*scalar=*/true), acc = F({2}, {1, 2});
  try {
    run_kernel(n, {&m, nullptr, &acc}, 17);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "node 'n1' (Loop): more than the 1048576 iterations a Loop may run (its trip count is "
              "1099511627776)");
  }
}

TEST(KernelsControl, WhileLoopRunsUntilItsConditionAndItsShapeIsData) {
  const Node n = loop_node(true);
  const Tensor m = Tensor::from_int64s({100}, /*scalar=*/true), acc = F({2}, {1, 1});
  // 4 -> go on, 8 -> go on, 16 -> stop: three iterations.
  const std::vector<Tensor> out = run_kernel(n, {&m, nullptr, &acc}, 17);
  EXPECT_EQ(testing::compare_tensors(out[0], F({2}, {8, 8})), "");
  EXPECT_EQ(testing::compare_tensors(out[1], F({3, 2}, {4, 4, 16, 16, 64, 64})), "");
  const TensorType mt{DType::kInt64, {}}, at{DType::kFloat32, {2}};
  EXPECT_THROW(infer_types(n, {&mt, nullptr, &at}, {&m, nullptr, nullptr}, 17), DataDependentError);
}

TEST(KernelsControl, ScanOpset8RunsEachBatchEntry) {
  auto b = std::make_shared<Graph>();
  b->inputs = {b->add_value(V("s", DType::kFloat32, {1})), b->add_value(V("x", DType::kFloat32, {1}))};
  const int s_out = body_node(*b, "Add", {b->inputs[0], b->inputs[1]}, "s_out", {1});
  b->outputs = {s_out, body_node(*b, "Neg", {s_out}, "neg", {1})};
  Node n = make_node("Scan", {{"body", std::shared_ptr<const Graph>(b)}, {"num_scan_inputs", int64_t{1}}}, 2);
  n.inputs = {-1, 0, 1};
  const Tensor s0 = F({2, 1}, {0, 10}), x = F({2, 3, 1}, {1, 2, 3, 4, 5, 6});
  const std::vector<Tensor> out = run_kernel(n, {nullptr, &s0, &x}, 8);
  EXPECT_EQ(testing::compare_tensors(out[0], F({2, 1}, {6, 25})), "");
  EXPECT_EQ(testing::compare_tensors(out[1], F({2, 3, 1}, {-1, -3, -6, -14, -19, -25})), "");
  const TensorType st{DType::kFloat32, {2, 1}}, xt{DType::kFloat32, {2, 3, 1}};
  const std::vector<TensorType> types = infer_types(n, {nullptr, &st, &xt}, {nullptr, nullptr, nullptr}, 8);
  EXPECT_EQ(types[0].shape, (Shape{2, 1}));
  EXPECT_EQ(types[1].shape, (Shape{2, 3, 1}));
}

}  // namespace
}  // namespace gspmd
