// Propagation through convolutional networks: spatial, channel and grouped splits, ResNet blocks.
#include "tests/core/propagation_test_util.h"

namespace gspmd {
namespace {

TEST(Propagation, ConvSpatialSplitForwardAndBackward) {
  Model m;
  int x = m.input("x", {2, 3, 8, 8});
  int w = m.weight("w", {4, 3, 3, 3});
  int y = m.op("Conv", {x, w}, "y", {2, 4, 8, 8}, {{"pads", Ints{1, 1, 1, 1}}});
  int z = m.op("Conv", {y, m.weight("w2", {4, 4, 3, 3})}, "z", {2, 4, 4, 4},
               {{"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}});
  m.g.outputs = {z};
  m.annotate(x, {"", "", "data", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"([null, null, "data", null])");
  EXPECT_EQ(m.spec(p, z), R"([null, null, "data", null])");
  EXPECT_TRUE(p.shardings[w].is_replicated());  // kernel dims have no factor
  EXPECT_EQ(origin_chain(m.g, p, z), "annotation x -> Conv_y -> y -> Conv_z -> z");

  Model b;  // backward: the output's W split reaches the input through both windows
  int bx = b.input("x", {2, 3, 8, 8});
  int by = b.op("Conv", {bx, b.weight("w", {4, 3, 3, 3})}, "y", {2, 4, 6, 6});
  int bz = b.op("MaxPool", {by}, "z", {2, 4, 3, 3}, {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}});
  b.g.outputs = {bz};
  b.annotate(bz, {"", "", "", "model"});
  auto q = b.run();
  EXPECT_EQ(b.spec(q, by), R"([null, null, null, "model"])");
  EXPECT_EQ(b.spec(q, bx), R"([null, null, null, "model"])");
  EXPECT_FALSE(q.origins[bx].forward);
}

TEST(Propagation, ConvOutputChannelsFromWeight) {
  Model m;
  int x = m.input("x", {2, 3, 8, 8});
  int w = m.weight("w", {4, 3, 3, 3}), bias = m.weight("b", {4});
  int y = m.op("Conv", {x, w, bias}, "y", {2, 4, 6, 6});
  int r = m.op("Relu", {y}, "r", {2, 4, 6, 6});
  m.g.outputs = {r};
  m.annotate(w, {"model", "", "", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"([null, "model", null, null])");
  EXPECT_EQ(m.spec(p, r), R"([null, "model", null, null])");
  EXPECT_EQ(m.spec(p, bias), R"(["model"])");
  EXPECT_TRUE(p.shardings[x].is_replicated());

  // Input channels split on W: a reduction factor, so it reaches X (operand to operand) but not Y.
  Model c;
  int cx = c.input("x", {2, 4, 8, 8});
  int cw = c.weight("w", {4, 4, 3, 3});
  int cy = c.op("Conv", {cx, cw}, "y", {2, 4, 6, 6});
  c.g.outputs = {cy};
  c.annotate(cw, {"", "model", "", ""});
  auto q = c.run();
  EXPECT_EQ(c.spec(q, cx), R"([null, "model", null, null])");
  EXPECT_EQ(c.spec(q, cy), "[null, null, null, null]");
}

TEST(Propagation, GroupedConvChannels) {
  // Depthwise conv: the channel split goes through the group factor to the output and the weight.
  Model m;
  int x = m.input("x", {2, 4, 8, 8});
  int w = m.weight("w", {4, 1, 3, 3});
  int y = m.op("Conv", {x, w}, "y", {2, 4, 8, 8}, {{"group", int64_t{4}}, {"pads", Ints{1, 1, 1, 1}}});
  m.g.outputs = {y};
  m.annotate(x, {"data", "model", "", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"(["data", "model", null, null])");
  EXPECT_EQ(m.spec(p, w), R"(["model", null, null, null])");
}

// Conv -> BatchNorm -> Relu -> MaxPool -> Conv -> BatchNorm -> Add(residual) -> Relu -> GlobalAveragePool -> Flatten.
struct ResNetBlock {
  Model m;
  int x, w1, w2, c1, bn1, r1, p1, c2, bn2, a, r2, gap, flat;
  std::vector<int> params;
  ResNetBlock() {
    x = m.input("x", {4, 3, 16, 16});
    w1 = m.weight("w1", {8, 3, 3, 3});
    w2 = m.weight("w2", {8, 8, 3, 3});
    std::map<std::string, AttrValue> same{{"pads", Ints{1, 1, 1, 1}}};
    c1 = m.op("Conv", {x, w1}, "c1", {4, 8, 16, 16}, same);
    bn1 = m.op("BatchNormalization", bn_inputs(c1, "bn1"), "bn1", {4, 8, 16, 16});
    r1 = m.op("Relu", {bn1}, "r1", {4, 8, 16, 16});
    p1 = m.op("MaxPool", {r1}, "p1", {4, 8, 8, 8}, {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}});
    c2 = m.op("Conv", {p1, w2}, "c2", {4, 8, 8, 8}, same);
    bn2 = m.op("BatchNormalization", bn_inputs(c2, "bn2"), "bn2", {4, 8, 8, 8});
    a = m.op("Add", {bn2, p1}, "a", {4, 8, 8, 8});
    r2 = m.op("Relu", {a}, "r2", {4, 8, 8, 8});
    gap = m.op("GlobalAveragePool", {r2}, "gap", {4, 8, 1, 1});
    flat = m.op("Flatten", {gap}, "flat", {4, 8});
    m.g.outputs = {flat};
  }
  std::vector<int> bn_inputs(int v, const std::string& name) {
    std::vector<int> in{v};
    for (const char* p : {".scale", ".bias", ".mean", ".var"}) {
      in.push_back(m.weight(name + p, {8}));
      params.push_back(in.back());
    }
    return in;
  }
  std::vector<int> activations() const { return {c1, bn1, r1, p1, c2, bn2, a, r2}; }
};

TEST(Propagation, ResNetBlockBatchSplit) {
  ResNetBlock b;
  b.m.annotate(b.x, {"data", "", "", ""});
  auto p = b.m.run();
  for (int v : b.activations()) EXPECT_EQ(b.m.spec(p, v), R"(["data", null, null, null])") << b.m.g.values[v].name;
  EXPECT_EQ(b.m.spec(p, b.gap), R"(["data", null, null, null])");
  EXPECT_EQ(b.m.spec(p, b.flat), R"(["data", null])");
  for (int v : b.params) EXPECT_TRUE(p.shardings[v].is_replicated()) << b.m.g.values[v].name;
  EXPECT_TRUE(p.shardings[b.w1].is_replicated());
  EXPECT_TRUE(p.shardings[b.w2].is_replicated());
  EXPECT_TRUE(p.nodes_without_rule.empty());
}

TEST(Propagation, ResNetBlockSpatialSplit) {
  ResNetBlock b;
  b.m.annotate(b.x, {"", "", "data", ""});
  auto p = b.m.run();
  for (int v : b.activations()) EXPECT_EQ(b.m.spec(p, v), R"([null, null, "data", null])") << b.m.g.values[v].name;
  // The global pool reduces H: the split does not reach its result.
  EXPECT_TRUE(p.shardings[b.gap].is_replicated());
  EXPECT_TRUE(p.shardings[b.flat].is_replicated());
  for (int v : b.params) EXPECT_TRUE(p.shardings[v].is_replicated()) << b.m.g.values[v].name;
  EXPECT_TRUE(p.shardings[b.w1].is_replicated());
  EXPECT_TRUE(p.shardings[b.w2].is_replicated());
}

TEST(Propagation, ResNetBlockBatchAndSpatial) {
  ResNetBlock b;
  b.m.annotate(b.x, {"data", "", "model", ""});
  auto p = b.m.run();
  for (int v : b.activations()) EXPECT_EQ(b.m.spec(p, v), R"(["data", null, "model", null])") << b.m.g.values[v].name;
  EXPECT_EQ(b.m.spec(p, b.flat), R"(["data", null])");
}

TEST(Propagation, ResNetBlockChannelSplitFollowsResidual) {
  // w1's output channels split: the residual Add ties c2's output channels to p1's, so w2 is split on its OUTPUT
  // channels (pass-through ops and factors first), not on its input channels (a reduction factor, last).
  ResNetBlock b;
  b.m.annotate(b.w1, {"model", "", "", ""});
  auto p = b.m.run();
  for (int v : b.activations()) EXPECT_EQ(b.m.spec(p, v), R"([null, "model", null, null])") << b.m.g.values[v].name;
  EXPECT_EQ(b.m.spec(p, b.w2), R"(["model", null, null, null])");
  for (int v : b.params) EXPECT_EQ(b.m.spec(p, v), R"(["model"])") << b.m.g.values[v].name;
  EXPECT_EQ(b.m.spec(p, b.flat), R"([null, "model"])");
  EXPECT_TRUE(p.shardings[b.x].is_replicated());
}

}  // namespace
}  // namespace gspmd
