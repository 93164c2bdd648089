// Known-optimal collective plans (issue 3): the partitioner must find exactly the collectives Megatron-LM and
// sequence parallelism use, and the result must equal the unpartitioned run.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/pod/pod.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"

namespace gspmd {
namespace {

/// A tiny graph builder: float32 inputs, random weights, nodes with one output.
struct Builder {
  Graph g;
  std::mt19937 rng{7};
  int input(const std::string& n, Shape s) {
    int v = g.add_value_unique(n, DType::kFloat32, s);
    g.inputs.push_back(v);
    return v;
  }
  int weight(const std::string& n, Shape s) {
    int v = g.add_value_unique(n, DType::kFloat32, s);
    Tensor t(DType::kFloat32, s);
    std::normal_distribution<float> d(0.f, 0.3f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    g.values[v].is_initializer = true;
    g.values[v].data = std::make_shared<Tensor>(std::move(t));
    return v;
  }
  int node(const std::string& op, std::vector<int> in, Shape out, std::map<std::string, AttrValue> attrs = {}) {
    Node n;
    n.op_type = op;
    n.name = op + "_" + std::to_string(g.nodes.size());
    n.inputs = std::move(in);
    n.outputs = {g.add_value_unique(n.name + "_out", DType::kFloat32, out)};
    n.attrs = std::move(attrs);
    g.add_node(n);
    return n.outputs[0];
  }
};

TensorSharding spec(std::vector<std::vector<int>> dims) {
  TensorSharding s;
  s.dims = std::move(dims);
  return s;
}

/// Propagates, partitions, runs on the pod and checks against the single-device run.
SpmdProgram partition_and_check(Builder& b, const DeviceMesh& mesh, const std::map<int, TensorSharding>& ann) {
  Annotations a;
  a.mesh = mesh;
  for (const auto& [v, s] : ann) a.by_value[v] = Annotation{s, 0, "test"};
  ShardingPlan plan = propagate(b.g, a);
  SpmdProgram p = partition(b.g, plan, mesh);
  std::vector<Tensor> inputs;
  std::normal_distribution<float> d(0.f, 1.f);
  for (int v : b.g.inputs) {
    Tensor t(DType::kFloat32, b.g.values[v].shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(b.rng);
    inputs.push_back(std::move(t));
  }
  PodRun got = run_spmd(p, b.g, inputs);
  PodRun want = run_single(b.g, inputs);
  for (size_t o = 0; o < want.outputs.size(); ++o)
    for (int64_t i = 0; i < want.outputs[o].numel(); ++i) {
      float x = got.outputs[o].data<float>()[i], y = want.outputs[o].data<float>()[i];
      EXPECT_LE(std::fabs(x - y), 1e-4 + 1e-4 * std::fabs(y)) << "output " << o << " element " << i;
    }
  return p;
}

std::vector<std::string> kinds(const SpmdProgram& p) {
  std::vector<std::string> k;
  for (const auto& c : p.collectives) k.push_back(c.kind + "{" + p.mesh.axes[c.mesh_axes.at(0)] + "}");
  return k;
}

constexpr int B = 4, S = 8, D = 16, F = 32;
const DeviceMesh kMesh{{2, 2}, {"data", "model"}};
constexpr int kData = 0, kModel = 1;

TEST(CollectivePlans, MegatronMlpHasOneAllReduce) {
  Builder b;
  int x = b.input("x", {B, S, D});
  int w1 = b.weight("w1", {D, F}), w2 = b.weight("w2", {F, D}), b2 = b.weight("b2", {D});
  int h = b.node("MatMul", {x, w1}, {B, S, F});
  int a = b.node("Relu", {h}, {B, S, F});
  int y = b.node("MatMul", {a, w2}, {B, S, D});
  int out = b.node("Add", {y, b2}, {B, S, D});
  b.g.outputs = {out};
  SpmdProgram p = partition_and_check(
      b, kMesh, {{x, spec({{kData}, {}, {}})}, {w1, spec({{}, {kModel}})}, {w2, spec({{kModel}, {}})}});
  ASSERT_EQ(kinds(p), std::vector<std::string>{"all-reduce{model}"});
  EXPECT_EQ(p.collectives[0].bytes, (B / 2) * S * D * 4);
  EXPECT_EQ(p.collectives[0].for_node, "Add_3");  // reduced where the replicated bias is added, not earlier
}

TEST(CollectivePlans, SequenceParallelLayerNormUsesReduceScatterAndAllGather) {
  // Row-parallel MatMul -> LayerNorm on a sequence-split activation -> column-parallel MatMul (Megatron-SP):
  // the all-reduce becomes a reduce-scatter onto the sequence dim, and an all-gather before the next MatMul.
  Builder b;
  int x = b.input("x", {B, S, F});
  int w2 = b.weight("w2", {F, D}), w3 = b.weight("w3", {D, F});
  int gamma = b.weight("gamma", {D}), beta = b.weight("beta", {D});
  int y = b.node("MatMul", {x, w2}, {B, S, D});
  int ln = b.node("LayerNormalization", {y, gamma, beta}, {B, S, D}, {{"axis", int64_t{-1}}});
  int z = b.node("MatMul", {ln, w3}, {B, S, F});
  b.g.outputs = {z};
  SpmdProgram p = partition_and_check(b, kMesh,
                                      {{x, spec({{kData}, {}, {kModel}})},
                                       {w2, spec({{kModel}, {}})},
                                       {y, spec({{kData}, {kModel}, {}})},
                                       {w3, spec({{}, {kModel}})},
                                       {z, spec({{kData}, {}, {kModel}})}});
  ASSERT_EQ(kinds(p), (std::vector<std::string>{"reduce-scatter{model}", "all-gather{model}"}));
  EXPECT_EQ(p.collectives[0].bytes, (B / 2) * S * D * 4);  // the partial [B/2, S, D] before scattering
  EXPECT_EQ(p.collectives[1].bytes, (B / 2) * S * D * 4);  // the gathered [B/2, S, D]
}

TEST(CollectivePlans, PartialSumsStayUnreducedThroughLinearOps) {
  // Two row-parallel products added together, then transposed, then scaled: one all-reduce at the end, not two.
  Builder b;
  int x1 = b.input("x1", {S, F}), x2 = b.input("x2", {S, F});
  int wa = b.weight("wa", {F, D}), wb = b.weight("wb", {F, D});
  int ya = b.node("MatMul", {x1, wa}, {S, D});
  int yb = b.node("MatMul", {x2, wb}, {S, D});
  int sum = b.node("Add", {ya, yb}, {S, D});
  int t = b.node("Transpose", {sum}, {D, S}, {{"perm", std::vector<int64_t>{1, 0}}});
  int act = b.node("Tanh", {t}, {D, S});
  b.g.outputs = {act};
  SpmdProgram p = partition_and_check(
      b, kMesh, {{x1, spec({{}, {kModel}})}, {x2, spec({{}, {kModel}})}, {wa, spec({{kModel}, {}})},
                 {wb, spec({{kModel}, {}})}});
  ASSERT_EQ(kinds(p), std::vector<std::string>{"all-reduce{model}"});
  EXPECT_EQ(p.collectives[0].for_node, "Tanh_4");
}

TEST(CollectivePlans, SoftmaxOverASplitAxisIsTwoSmallAllReduces) {
  // Softmax over a dim split unevenly (7 over 2): local max, all-reduce max, exp, local sum, all-reduce sum; the
  // padding is masked. No all-gather of the [5, 7] input: only two [5, 1] statistics move.
  for (int64_t cols : {8, 7}) {
    Builder b;
    int x = b.input("x", {5, cols});
    int y = b.node("Softmax", {x}, {5, cols}, {{"axis", int64_t{-1}}});
    b.g.opset = 13;
    b.g.outputs = {y};
    SpmdProgram p = partition_and_check(b, kMesh, {{x, spec({{}, {kModel}})}, {y, spec({{}, {kModel}})}});
    ASSERT_EQ(kinds(p), (std::vector<std::string>{"all-reduce{model}", "all-reduce{model}"})) << cols;
    EXPECT_EQ(p.collectives[0].bytes, 5 * 4);
    EXPECT_EQ(p.collectives[1].bytes, 5 * 4);
  }
}

TEST(CollectivePlans, LayerNormOverASplitAxisIsTwoSmallAllReduces) {
  // Mean and variance over a hidden dim split over model (even and uneven): two [rows, 1] all-reduces, no gather.
  for (int64_t hidden : {16, 15}) {
    Builder b;
    int x = b.input("x", {6, hidden});
    int gamma = b.weight("gamma", {hidden}), beta = b.weight("beta", {hidden});
    int y = b.node("LayerNormalization", {x, gamma, beta}, {6, hidden}, {{"axis", int64_t{-1}}});
    b.g.outputs = {y};
    SpmdProgram p = partition_and_check(b, kMesh, {{x, spec({{kData}, {kModel}})}, {y, spec({{kData}, {kModel}})}});
    ASSERT_EQ(kinds(p), (std::vector<std::string>{"all-reduce{model}", "all-reduce{model}"})) << hidden;
    EXPECT_EQ(p.collectives[0].bytes, 3 * 4);
  }
}

}  // namespace
}  // namespace gspmd
