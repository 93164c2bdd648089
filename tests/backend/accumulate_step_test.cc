// Gradient accumulation in the step builder (core/autodiff/accumulate.h), on a tiny MLP: the step over K microbatches
// of the model's batch computes the loss and the updated weights of the plain step on a model of K times the batch
// fed the same rows (run unpartitioned); its graph takes the whole batch, runs one forward range per microbatch, and
// names the microbatches' copies; a loss that is not a sum or mean over the batch is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/kernels/kernels.h"
#include "backend/pod/pod.h"
#include "core/autodiff/autodiff.h"
#include "core/shapes/shapes.h"

namespace gspmd {
namespace {

const ShapeFunction kShapes = [](const Node& n, const std::vector<const TensorType*>& types,
                                 const std::vector<const Tensor*>& values,
                                 int64_t opset) { return infer_types(n, types, values, opset, &kernel_evaluator()); };

/// Tensor of `s` with element i = f(i).
Tensor filled(const Shape& s, double (*f)(int64_t)) {
  Tensor t(DType::kFloat32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(f(i));
  return t;
}

/// x [batch, 3] -> Tanh(x W1) W2 -> y [batch, 2]; W1 [3, 4], W2 [4, 2] initializers.
Graph mlp(int64_t batch) {
  Graph g;
  auto value = [&](const std::string& name, const Shape& s) { return g.add_value_unique(name, DType::kFloat32, s); };
  auto weight = [&](const std::string& name, Tensor t) {
    const int v = value(name, t.shape);
    g.values[static_cast<size_t>(v)].is_initializer = true;
    g.values[static_cast<size_t>(v)].data = std::make_shared<const Tensor>(std::move(t));
    return v;
  };
  auto node = [&](const std::string& op, std::vector<int> in, int out) {
    Node n;
    n.name = op + std::to_string(g.nodes.size());
    n.op_type = op;
    n.inputs = std::move(in);
    n.outputs = {out};
    g.add_node(std::move(n));
  };
  const int x = value("x", {batch, 3});
  g.inputs = {x};
  const int w1 = weight("w1", filled({3, 4}, [](int64_t i) { return 0.1 * static_cast<double>(i % 7) - 0.3; }));
  const int w2 = weight("w2", filled({4, 2}, [](int64_t i) { return 0.2 * static_cast<double>(i % 5) - 0.4; }));
  const int h = value("h", {batch, 4}), a = value("a", {batch, 4}), y = value("y", {batch, 2});
  node("MatMul", {x, w1}, h);
  node("Tanh", {h}, a);
  node("MatMul", {a, w2}, y);
  g.outputs = {y};
  return g;
}

TrainingOptions options(LossKind loss, int64_t accumulate) {
  TrainingOptions o;
  o.loss = loss;
  o.optimizer = OptimizerKind::kAdam;
  o.trainable = {"w1", "w2"};
  o.accumulate = accumulate;
  return o;
}

TEST(AccumulateStep, EqualsThePlainStepOnTheWholeBatch) {
  const Tensor x = filled({8, 3}, [](int64_t i) { return 0.05 * static_cast<double>((i * 5) % 11) - 0.25; });
  for (const LossKind loss : {LossKind::kMean, LossKind::kSum}) {
    const TrainingStep whole = build_training_step(mlp(8), options(loss, 1), kShapes);
    const TrainingStep acc = build_training_step(mlp(2), options(loss, 4), kShapes);
    EXPECT_EQ(acc.accumulate, 4);
    ASSERT_EQ(acc.forward_ranges.size(), 4u);
    for (size_t m = 1; m < 4; ++m) EXPECT_LT(acc.forward_ranges[m - 1].second, acc.forward_ranges[m].first);
    EXPECT_EQ(acc.graph.values[static_cast<size_t>(acc.graph.at("x"))].shape, (Shape{8, 3}));
    EXPECT_GE(acc.graph.find("x@mb3"), 0);  // microbatch 3's rows
    EXPECT_GE(acc.graph.find("a@mb3"), 0);  // its copy of the model's value 'a'
    ASSERT_EQ(acc.weights.size(), 2u);
    for (const TrainingStep::Weight& w : acc.weights)  // per microbatch 1..3: the running sum before, and its own
      EXPECT_EQ(w.partial_grads.size(), 2u * 3u) << w.name;
    EXPECT_EQ(acc.batch_inputs, std::vector<std::string>{"x"});
    const PodRun a = run_single(acc.graph, {x}), b = run_single(whole.graph, {x});
    ASSERT_EQ(a.outputs.size(), b.outputs.size());
    for (size_t i = 0; i < a.outputs.size(); ++i)
      for (int64_t k = 0; k < a.outputs[i].numel(); ++k)
        EXPECT_NEAR(a.outputs[i].data<float>()[k], b.outputs[i].data<float>()[k], 1e-6)
            << acc.graph.values[static_cast<size_t>(acc.graph.outputs[i])].name << "[" << k << "]";
  }
}

TEST(AccumulateStep, RefusesALossThatIsNotOverTheBatch) {
  Graph g = mlp(2);
  try {
    TrainingOptions o = options(LossKind::kOutput, 2);
    // A scalar output 0: the model's own loss.
    Graph s = g;
    const int total = s.add_value_unique("total", DType::kFloat32, {});
    Node n;
    n.name = "ReduceSum_total";
    n.op_type = "ReduceSum";
    n.attrs["keepdims"] = AttrValue(int64_t{0});
    n.inputs = {s.outputs[0]};
    n.outputs = {total};
    s.add_node(std::move(n));
    s.outputs = {total};
    build_training_step(s, o, kShapes);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "--accumulate: needs --loss mean, sum or cross-entropy:LABELS (a scalar output 0 is the model's own "
                 "loss, which may not sum or average over its batch)");
  }
}

}  // namespace
}  // namespace gspmd
