#include "core/propagation/propagation.h"

#include <memory>

#include <gtest/gtest.h>

namespace gspmd {
namespace {

// Builds small graphs by hand and propagates over a {data=2, model=2} mesh.
struct Model {
  Graph g;
  Annotations ann{DeviceMesh{{2, 2}, {"data", "model"}}, {}};

  int input(const std::string& name, Shape s, DType t = DType::kFloat32) {
    Value v;
    v.name = name;
    v.dtype = t;
    v.shape = std::move(s);
    int id = g.add_value(std::move(v));
    g.inputs.push_back(id);
    return id;
  }
  int weight(const std::string& name, Shape s) {
    Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = std::move(s);
    v.is_initializer = true;
    return g.add_value(std::move(v));
  }
  int ints(const std::string& name, const std::vector<int64_t>& data) {
    Value v;
    v.name = name;
    v.dtype = DType::kInt64;
    v.shape = {static_cast<int64_t>(data.size())};
    v.is_initializer = true;
    v.data = std::make_shared<Tensor>(Tensor::from_int64s(data));
    return g.add_value(std::move(v));
  }
  int op(const std::string& type, std::vector<int> in, const std::string& out, Shape shape,
         std::map<std::string, AttrValue> attrs = {}) {
    Node n;
    n.name = type + "_" + out;
    n.op_type = type;
    n.inputs = std::move(in);
    Value v;
    v.name = out;
    v.dtype = DType::kFloat32;
    v.shape = std::move(shape);
    n.outputs = {g.add_value(std::move(v))};
    n.attrs = std::move(attrs);
    g.add_node(std::move(n));
    return g.at(out);
  }
  // spec: one entry per dim, "" = null; "a,b" = several axes.
  void annotate(int v, std::vector<std::string> spec, int priority = 0) {
    Annotation a;
    a.sharding = parse(spec);
    a.priority = priority;
    a.source = "test";
    ann.by_value[v] = a;
  }
  TensorSharding parse(const std::vector<std::string>& spec) {
    TensorSharding s = TensorSharding::replicated(static_cast<int>(spec.size()));
    for (size_t d = 0; d < spec.size(); ++d) {
      std::string e = spec[d];
      size_t pos = 0;
      while (!e.empty() && pos <= e.size()) {
        size_t c = e.find(',', pos);
        std::string name = e.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
        s.dims[d].push_back(ann.mesh.axis_index(name));
        if (c == std::string::npos) break;
        pos = c + 1;
      }
    }
    return s;
  }
  ShardingPlan run() {
    g.verify();
    return propagate(g, ann);
  }
  std::string spec(const ShardingPlan& p, int v) { return p.shardings.at(v).to_partition_spec(ann.mesh); }
};

TEST(Propagation, MegatronMlp) {
  Model m;
  int x = m.input("x", {4, 8, 16});
  int w1 = m.weight("w1", {16, 32}), b1 = m.weight("b1", {32}), w2 = m.weight("w2", {32, 16});
  int h = m.op("MatMul", {x, w1}, "h", {4, 8, 32});
  int hb = m.op("Add", {h, b1}, "hb", {4, 8, 32});
  int act = m.op("Tanh", {hb}, "act", {4, 8, 32});
  int y = m.op("MatMul", {act, w2}, "y", {4, 8, 16});
  m.g.outputs = {y};
  m.annotate(x, {"data", "", ""});
  m.annotate(w1, {"", "model"});
  m.annotate(w2, {"model", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, h), R"(["data", null, "model"])");
  EXPECT_EQ(m.spec(p, hb), R"(["data", null, "model"])");
  EXPECT_EQ(m.spec(p, b1), R"(["model"])");
  EXPECT_EQ(m.spec(p, act), R"(["data", null, "model"])");
  EXPECT_EQ(m.spec(p, y), R"(["data", null, null])");  // k split: not in the result
  EXPECT_TRUE(p.shardings[y].unreduced.empty());
  EXPECT_EQ(p.origins[x].kind, Origin::kAnnotation);
  EXPECT_EQ(p.origins[h].kind, Origin::kPropagated);
  EXPECT_EQ(origin_chain(m.g, p, act), "annotation x -> MatMul_h -> h -> Add_hb -> hb -> Tanh_act -> act");
  EXPECT_TRUE(p.nodes_without_rule.empty());
}

TEST(Propagation, MegatronWeightsInferred) {
  // Only the first weight is annotated; the second gets its split through the reduction factor of MatMul 2.
  Model m;
  int x = m.input("x", {4, 8, 16});
  int w1 = m.weight("w1", {16, 32}), w2 = m.weight("w2", {32, 16});
  int h = m.op("MatMul", {x, w1}, "h", {4, 8, 32});
  int a = m.op("Relu", {h}, "a", {4, 8, 32});
  int y = m.op("MatMul", {a, w2}, "y", {4, 8, 16});
  m.g.outputs = {y};
  m.annotate(w1, {"", "model"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, h), R"([null, null, "model"])");
  EXPECT_EQ(m.spec(p, w2), R"(["model", null])");
  EXPECT_EQ(m.spec(p, y), "[null, null, null]");
  EXPECT_EQ(m.spec(p, x), "[null, null, null]");
}

TEST(Propagation, AttentionReshape) {
  Model m;
  int q = m.input("q", {2, 8, 16}), k = m.input("k", {2, 8, 16});
  int sh = m.ints("sh", {2, 8, 4, 4});
  int qr = m.op("Reshape", {q, sh}, "qr", {2, 8, 4, 4});
  int qt = m.op("Transpose", {qr}, "qt", {2, 4, 8, 4}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  int kr = m.op("Reshape", {k, sh}, "kr", {2, 8, 4, 4});
  int kt = m.op("Transpose", {kr}, "kt", {2, 4, 4, 8}, {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  int s = m.op("MatMul", {qt, kt}, "s", {2, 4, 8, 8});
  int pr = m.op("Softmax", {s}, "p", {2, 4, 8, 8});
  m.g.outputs = {pr};
  m.annotate(q, {"", "", "model"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, qr), R"([null, null, "model", null])");
  EXPECT_EQ(m.spec(p, qt), R"([null, "model", null, null])");
  EXPECT_EQ(m.spec(p, s), R"([null, "model", null, null])");
  EXPECT_EQ(m.spec(p, pr), R"([null, "model", null, null])");
  // k reached backwards through the batch factor of the MatMul.
  EXPECT_EQ(m.spec(p, kt), R"([null, "model", null, null])");
  EXPECT_EQ(m.spec(p, k), R"([null, null, "model"])");
  EXPECT_EQ(m.spec(p, sh), "[null]");
  EXPECT_FALSE(p.origins[k].forward);
}

TEST(Propagation, SoftmaxAxisNotSplit) {
  Model m;
  int x = m.input("x", {4, 8});
  int y = m.op("Softmax", {x}, "y", {4, 8});
  int z = m.op("Relu", {y}, "z", {4, 8});
  m.g.outputs = {z};
  m.annotate(x, {"data", "model"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"(["data", null])");
  EXPECT_EQ(m.spec(p, z), R"(["data", null])");
}

TEST(Propagation, VocabParallelEmbedding) {
  Model m;
  int table = m.weight("table", {64, 16});
  int ids = m.input("ids", {4, 8}, DType::kInt64);
  int e = m.op("Gather", {table, ids}, "e", {4, 8, 16});
  m.g.outputs = {e};
  m.annotate(table, {"model", ""});
  m.annotate(ids, {"data", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, e), R"(["data", null, null])");
}

TEST(Propagation, DataParallel) {
  Model m;
  int ids = m.input("ids", {4, 8}, DType::kInt64);
  int table = m.weight("table", {64, 16}), w = m.weight("w", {16, 16}), b = m.weight("b", {16});
  int sc = m.weight("ln.scale", {16}), sb = m.weight("ln.bias", {16}), wout = m.weight("wout", {16, 64});
  int shp = m.ints("shape", {32, 16});
  int e = m.op("Gather", {table, ids}, "e", {4, 8, 16});
  int h = m.op("MatMul", {e, w}, "h", {4, 8, 16});
  int hb = m.op("Add", {h, b}, "hb", {4, 8, 16});
  int ln = m.op("LayerNormalization", {hb, sc, sb}, "ln", {4, 8, 16});
  int flat = m.op("Reshape", {ln, shp}, "flat", {32, 16});
  int logits = m.op("MatMul", {flat, wout}, "logits", {32, 64});
  int prob = m.op("Softmax", {logits}, "prob", {32, 64});
  m.g.outputs = {prob};
  m.annotate(ids, {"data", ""});
  auto p = m.run();
  for (int v : {e, h, hb, ln}) EXPECT_EQ(m.spec(p, v), R"(["data", null, null])") << m.g.values[v].name;
  EXPECT_EQ(m.spec(p, flat), R"(["data", null])");
  EXPECT_EQ(m.spec(p, logits), R"(["data", null])");
  EXPECT_EQ(m.spec(p, prob), R"(["data", null])");
  for (int v : {table, w, b, sc, sb, wout}) {
    EXPECT_TRUE(p.shardings[v].is_replicated()) << m.g.values[v].name;
    EXPECT_EQ(p.origins[v].kind, Origin::kDefault);
  }
  EXPECT_EQ(origin_chain(m.g, p, w), "w: replicated (no annotation reached it)");
  EXPECT_EQ(origin_chain(m.g, p, ids), "annotation ids");
  EXPECT_EQ(origin_chain(m.g, p, flat),
            "annotation ids -> Gather_e -> e -> MatMul_h -> h -> Add_hb -> hb -> LayerNormalization_ln -> ln -> "
            "Reshape_flat -> flat");
}

TEST(Propagation, Backward) {
  Model m;
  int x = m.input("x", {4, 8}), bias = m.weight("bias", {8});
  int a = m.op("Add", {x, bias}, "a", {4, 8});
  int y = m.op("Relu", {a}, "y", {4, 8});
  m.g.outputs = {y};
  m.annotate(y, {"data", "model"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, a), R"(["data", "model"])");
  EXPECT_EQ(m.spec(p, x), R"(["data", "model"])");
  EXPECT_EQ(m.spec(p, bias), R"(["model"])");
  EXPECT_FALSE(p.origins[x].forward);
  EXPECT_EQ(origin_chain(m.g, p, x), "annotation y -> Relu_y (backward) -> a -> Add_a (backward) -> x");
}

TEST(Propagation, ConflictLargerTensorThenEarlierOperand) {
  Model m;
  int a = m.input("a", {4, 8}), b = m.input("b", {4, 8});
  int c = m.op("Add", {a, b}, "c", {4, 8});
  m.g.outputs = {c};
  m.annotate(a, {"data", ""});
  m.annotate(b, {"", "data"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, c), R"(["data", null])");  // same size: the earlier operand wins

  Model n;
  int s = n.input("s", {8}), t = n.input("t", {4, 8});
  int u = n.op("Mul", {s, t}, "u", {4, 8});
  n.g.outputs = {u};
  n.annotate(s, {"data"});
  n.annotate(t, {"data", ""});
  auto q = n.run();
  EXPECT_EQ(n.spec(q, u), R"(["data", null])");  // t is larger
}

TEST(Propagation, Priorities) {
  Model m;
  int x = m.input("x", {4, 8});
  int y = m.op("Relu", {x}, "y", {4, 8});
  int z = m.op("Relu", {y}, "z", {4, 8});
  m.g.outputs = {z};
  m.annotate(x, {"data", ""}, 1);
  m.annotate(z, {"", "data"}, 0);
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"([null, "data"])");  // priority 0 reached y first
  EXPECT_EQ(m.spec(p, x), R"(["data", null])");  // annotations are kept
}

TEST(Propagation, DimsOnlyFilledNeverTwice) {
  // x split on dim 0 over data; a transpose brings data to dim 1 and a later add wants model on dim 0.
  Model m;
  int x = m.input("x", {4, 8}), w = m.input("w", {8, 4});
  int xt = m.op("Transpose", {x}, "xt", {8, 4});
  int s = m.op("Add", {xt, w}, "s", {8, 4});
  m.g.outputs = {s};
  m.annotate(x, {"data", ""});
  m.annotate(w, {"model", "data"});
  auto p = m.run();
  // s: factors from w (operand 1) and xt agree on dim 1; dim 0 gets model from w, and xt's free dim 0 gets it
  // backwards (x is annotated, so it keeps its own sharding; the partitioner reshards).
  EXPECT_EQ(m.spec(p, s), R"(["model", "data"])");
  EXPECT_EQ(m.spec(p, xt), R"(["model", "data"])");
  EXPECT_EQ(m.spec(p, x), R"(["data", null])");
  for (size_t v = 0; v < m.g.values.size(); ++v) p.shardings[v].verify(m.ann.mesh, (int)m.g.values[v].shape.size());
}

TEST(Propagation, UnreducedAnnotationDoesNotPropagateUnreduced) {
  Model m;
  int x = m.input("x", {4, 8});
  int y = m.op("Relu", {x}, "y", {4, 8});
  m.g.outputs = {y};
  Annotation a;
  a.sharding = m.parse({"data", ""});
  a.sharding.unreduced = {1};
  m.ann.by_value[x] = a;
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"(["data", null])");
  EXPECT_EQ(m.spec(p, x), R"(["data", null] unreduced={model})");
}

TEST(Propagation, NoRuleNodesAreListed) {
  Model m;
  int x = m.input("x", {4, 8});
  int y = m.op("FancyOp", {x}, "y", {4, 8});
  int z = m.op("Relu", {y}, "z", {4, 8});
  m.g.outputs = {z};
  m.annotate(x, {"data", ""});
  auto p = m.run();
  EXPECT_EQ(p.nodes_without_rule, (std::vector<int>{0}));
  EXPECT_TRUE(p.shardings[y].is_replicated());
  EXPECT_TRUE(p.shardings[z].is_replicated());
}

TEST(Propagation, BadAnnotationRank) {
  Model m;
  int x = m.input("x", {4, 8});
  m.annotate(x, {"data"});
  EXPECT_THROW(m.run(), InputError);
}

TEST(Propagation, LongChainScales) {
  // A deep chain propagates in a few sweeps (forward then backward in one round).
  Model m;
  int v = m.input("x0", {8, 8});
  int first = v;
  for (int i = 1; i <= 2000; ++i) v = m.op("Relu", {v}, "x" + std::to_string(i), {8, 8});
  m.g.outputs = {v};
  m.annotate(first, {"data", "model"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, v), R"(["data", "model"])");
}

}  // namespace
}  // namespace gspmd
