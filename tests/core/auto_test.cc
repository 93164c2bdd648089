// core/auto: layer keys, tied decisions, constraints kept, the chosen cost equal to the real pipeline's, and the
// no-fit error.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "core/auto/auto.h"
#include "core/cost/cost.h"
#include "core/partition/spmd.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using testing::GraphBuilder;
using testing::mesh_of;

TEST(AutoLayerKey, WholeNumericComponentsOnly) {
  EXPECT_EQ(layer_key("h.12.mlp.fc_in.weight"), "h.#.mlp.fc_in.weight");
  EXPECT_EQ(layer_key("/h.3/attn/MatMul_output_0"), "/h.#/attn/MatMul_output_#");
  EXPECT_EQ(layer_key("layer1.0.conv2.weight"), "layer1.#.conv2.weight");
  EXPECT_EQ(layer_key("blk_7_w"), "blk_#_w");
  EXPECT_EQ(layer_key("wte.weight"), "wte.weight");
  EXPECT_EQ(layer_key("12"), "#");
}

/// An L-layer residual MLP x[B, D] -> (x + relu(x @ w1) @ w2) per layer, weights named "h.<i>.w1" / "h.<i>.w2".
Graph mlp(int layers, int64_t B, int64_t D, int64_t F) {
  GraphBuilder b;
  int x = b.input("x", {B, D});
  for (int i = 0; i < layers; ++i) {
    int w1 = b.weight("h." + std::to_string(i) + ".w1", {D, F});
    int w2 = b.weight("h." + std::to_string(i) + ".w2", {F, D});
    int h = b.g.nodes[b.node("MatMul", {x, w1}, {B, F})].outputs[0];
    h = b.g.nodes[b.node("Relu", {h}, {B, F})].outputs[0];
    h = b.g.nodes[b.node("MatMul", {h, w2}, {B, D})].outputs[0];
    x = b.g.nodes[b.node("Add", {x, h}, {B, D})].outputs[0];
  }
  b.g.outputs.push_back(x);
  b.g.verify();
  return b.g;
}

/// No constraints but the 2x2 mesh.
Annotations on_2x2() {
  Annotations cons;
  cons.mesh = mesh_of({2, 2});
  return cons;
}

/// Search options on tpu-v3.
AutoOptions on_v3() {
  AutoOptions o;
  o.target = Target::load("tpu-v3");
  return o;
}

TEST(AutoShard, RepeatedLayersAreOneDecisionAndTheCostIsThePipelines) {
  Graph g = mlp(6, 64, 256, 1024);
  Annotations cons = on_2x2();
  AutoOptions o = on_v3();
  AutoResult r = auto_shard(g, cons, o);
  // x, 12 weights, and the activation operands of the 12 matmuls but the first (x): 5 residual sums, 6 relus.
  EXPECT_EQ(r.variables, 24);
  EXPECT_EQ(r.groups, 5);  // x, h.#.w1, h.#.w2, input of h.#.w1, input of h.#.w2
  std::set<std::string> keys;
  for (const AutoChoice& c : r.choices) keys.insert(c.group);
  EXPECT_EQ(keys, (std::set<std::string>{"x", "h.#.w1", "h.#.w2", "input of h.#.w1", "input of h.#.w2"}));
  ASSERT_TRUE(r.chosen.valid);
  EXPECT_TRUE(r.chosen.fits);
  // Members of a group share the decision.
  for (const AutoChoice& c : r.choices) {
    for (int v : c.values) {
      auto it = r.annotations.by_value.find(v);
      EXPECT_EQ(it != r.annotations.by_value.end(), c.annotated) << g.values[v].name;
      if (c.annotated && it != r.annotations.by_value.end()) {
        EXPECT_EQ(it->second.sharding, c.sharding);
      }
    }
  }
  // What the search reports is what the pipeline produces from its annotations.
  Annotations refined = refine_for_reshapes(g, r.annotations);
  SpmdProgram p = partition(g, propagate(g, refined), refined.mesh, o.target);
  CostReport c = simulate_cost(g, p, o.target);
  EXPECT_DOUBLE_EQ(c.step_time_s, r.chosen.step_time_s);
  EXPECT_EQ(c.peak_memory_bytes, r.chosen.peak_memory_bytes);
  // Forward only, batch 64 over 4 devices: data parallelism needs no communication and is the optimum here.
  for (const AutoPlanCost& b : r.baselines) EXPECT_LE(r.chosen.step_time_s, b.step_time_s * (1 + 1e-9)) << b.name;
}

TEST(AutoShard, ProgressCountsEveryEvaluationInOrder) {
  Graph g = mlp(2, 64, 256, 1024);
  AutoOptions o = on_v3();
  std::vector<AutoProgress> calls;
  o.progress = [&](const AutoProgress& p) { calls.push_back(p); };
  AutoResult r = auto_shard(g, on_2x2(), o);
  // One call per evaluation, then the last one (done) with the final count.
  ASSERT_EQ(calls.size(), static_cast<size_t>(r.evaluations) + 1);
  for (size_t i = 0; i + 1 < calls.size(); ++i) {
    EXPECT_EQ(calls[i].evaluations, static_cast<int>(i) + 1);
    EXPECT_FALSE(calls[i].done);
    EXPECT_EQ(calls[i].groups, r.groups);
    EXPECT_LE(calls[i].group, calls[i].groups);
    if (i > 0) {  // where the search is only moves forward: (descent, sweep, group), and the elapsed time
      const AutoProgress& a = calls[i - 1];
      const AutoProgress& b = calls[i];
      EXPECT_LE(std::make_tuple(a.descent, a.sweep, a.group), std::make_tuple(b.descent, b.sweep, b.group)) << i;
      EXPECT_LE(a.elapsed_s, b.elapsed_s);
      // the best fitting step only improves once a plan fits
      if (a.best_step_time_s > 0) {
        EXPECT_LE(b.best_step_time_s, a.best_step_time_s);
      }
    }
  }
  EXPECT_EQ(calls.front().descent, 0);  // the seeds come first
  EXPECT_EQ(calls.back().evaluations, r.evaluations);
  EXPECT_TRUE(calls.back().done);
  EXPECT_GT(calls.back().best_step_time_s, 0);
  EXPECT_LE(calls.back().best_step_time_s, r.chosen.step_time_s);  // the chosen plan was evaluated
  EXPECT_EQ(calls.back().descent, r.starts);
  ASSERT_EQ(r.starts, 1);                   // the first descent's plan fits: no other descent
  EXPECT_EQ(calls.back().sweep, r.sweeps);  // so its sweeps are all the sweeps
}

TEST(AutoShard, ConstraintsAreKept) {
  Graph g = mlp(2, 64, 256, 1024);
  Annotations cons = on_2x2();
  TensorSharding w;
  w.dims = {{1}, {}};  // h.0.w1 rows over y
  cons.by_value[g.at("h.0.w1")] = Annotation{w, 0, "test"};
  AutoOptions o = on_v3();
  AutoResult r = auto_shard(g, cons, o);
  ASSERT_TRUE(r.annotations.by_value.count(g.at("h.0.w1")));
  EXPECT_EQ(r.annotations.by_value.at(g.at("h.0.w1")).sharding, w);
  EXPECT_EQ(r.annotations.by_value.at(g.at("h.0.w1")).source, "test");
  for (const AutoChoice& c : r.choices)
    for (int v : c.values) EXPECT_NE(g.values[v].name, "h.0.w1");
}

TEST(AutoShard, NothingFitsIsAnInputErrorWithTheBestPeak) {
  Graph g = mlp(2, 64, 256, 1024);
  Annotations cons = on_2x2();
  AutoOptions o = on_v3();
  o.memory_limit_bytes = 1000;
  try {
    auto_shard(g, cons, o);
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("--auto: no sharding plan fits in 1000 bytes per device; the best plan found needs ", 0), 0u)
        << m;
  }
}

}  // namespace
}  // namespace gspmd
