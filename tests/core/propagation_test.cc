// Propagation (core/propagation): priorities, conflicts, open and closed dims, transformers' plans.
#include "tests/core/propagation_test_util.h"

namespace gspmd {
namespace {

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

// Open annotations (Shardy's open dims): a closed dim keeps exactly its axes, an open dim takes more after its own,
// a wholly open annotation is a starting point; every annotated value keeps its origin and source.
TEST(Propagation, OpenDimsTakeMoreAxesClosedDimsNone) {
  for (const char* form : {"closed", "open dim 0", "open", "open dim 0 seeded"}) {
    SCOPED_TRACE(form);
    Model m;
    int a = m.input("a", {8, 4});
    int b = m.op("Relu", {a}, "b", {8, 4});
    m.g.outputs = {b};
    m.annotate(a, {"data,model", ""});
    const std::string f = form;
    m.annotate(b, {f == "open dim 0 seeded" ? "data" : "", ""});
    if (f == "open") m.ann.by_value[b].open = true;
    if (f.rfind("open dim 0", 0) == 0) m.ann.by_value[b].open_dims = {1, 0};
    auto p = m.run();
    const char* want = f == "closed" ? R"([null, null])" : R"([["data", "model"], null])";
    EXPECT_EQ(m.spec(p, b), want);
    EXPECT_EQ(p.origins[b].kind, Origin::kAnnotation);
    EXPECT_EQ(p.origins[b].source, "test");
    EXPECT_EQ(p.origins[b].constrained(), f != "open");
  }
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

TEST(Propagation, EinsumLikeMatMul) {
  Model m;
  int x = m.input("x", {4, 8, 16});
  int w1 = m.weight("w1", {16, 32}), w2 = m.weight("w2", {32, 16});
  std::map<std::string, AttrValue> up{{"equation", std::string("bsh,hf->bsf")}};
  std::map<std::string, AttrValue> down{{"equation", std::string("bsf,fh->bsh")}};
  int h = m.op("Einsum", {x, w1}, "h", {4, 8, 32}, up);
  int act = m.op("Gelu", {h}, "act", {4, 8, 32});
  int y = m.op("Einsum", {act, w2}, "y", {4, 8, 16}, down);
  m.g.outputs = {y};
  m.annotate(x, {"data", "", ""});
  m.annotate(w1, {"", "model"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, h), R"(["data", null, "model"])");
  EXPECT_EQ(m.spec(p, act), R"(["data", null, "model"])");
  EXPECT_EQ(m.spec(p, w2), R"(["model", null])");  // through the contracted label f
  EXPECT_EQ(m.spec(p, y), R"(["data", null, null])");
}

TEST(Propagation, ReduceMeanKeepsOtherDims) {
  Model m;
  int x = m.input("x", {4, 6});
  int mean = m.op("ReduceMean", {x}, "mean", {4}, {{"axes", Ints{1}}, {"keepdims", int64_t{0}}});
  int y = m.op("Relu", {mean}, "y", {4});
  m.g.outputs = {y};
  m.annotate(x, {"data", "model"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, mean), R"(["data"])");  // the reduced (mean) axis never splits the result
  EXPECT_EQ(m.spec(p, y), R"(["data"])");
  EXPECT_TRUE(p.shardings[mean].unreduced.empty());
}

TEST(Propagation, ReshapeKeepsBatchAndHeadSplits) {
  // [B*S, D] -> [B, S, D] keeps a B split, and back.
  Model m;
  int x = m.input("x", {8, 6});
  int r = m.op("Reshape", {x, m.ints("sh", {2, 4, 6})}, "r", {2, 4, 6});
  int t = m.op("Relu", {r}, "t", {2, 4, 6});
  int back = m.op("Reshape", {t, m.ints("sh2", {8, 6})}, "back", {8, 6});
  m.g.outputs = {back};
  m.annotate(x, {"data", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, r), R"(["data", null, null])");
  EXPECT_EQ(m.spec(p, back), R"(["data", null])");

  // A split of S alone cannot be expressed on [B*S] without sub-axes: the merged dim stays whole.
  Model s;
  int sx = s.input("x", {2, 4, 6});
  int sr = s.op("Reshape", {sx, s.ints("sh", {8, 6})}, "r", {8, 6});
  s.g.outputs = {sr};
  s.annotate(sx, {"", "data", ""});
  auto q = s.run();
  EXPECT_EQ(s.spec(q, sr), "[null, null]");

  // [B, S, H, D] -> [B, S, H*D] backward from the merged dim, H = 4 split over both axes.
  Model h;
  int hx = h.input("x", {2, 8, 4, 4});
  int hr = h.op("Reshape", {hx, h.ints("sh", {2, 8, 16})}, "r", {2, 8, 16});
  int hy = h.op("Relu", {hr}, "y", {2, 8, 16});
  h.g.outputs = {hy};
  h.annotate(hy, {"", "", "data,model"});
  auto u = h.run();
  EXPECT_EQ(h.spec(u, hx), R"([null, null, ["data", "model"], null])");
}

TEST(Propagation, ConflictResolvesTowardLargerTensor) {
  // x [4,8] wants data on m, w [8,64] wants data on n: w is larger, so n wins (whatever the operand order).
  Model m;
  int x = m.input("x", {4, 8}), w = m.weight("w", {8, 64});
  int y = m.op("MatMul", {x, w}, "y", {4, 64});
  m.g.outputs = {y};
  m.annotate(x, {"data", ""});
  m.annotate(w, {"", "data"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"([null, "data"])");

  Model n;
  int nx = n.input("x", {64, 8}), nw = n.weight("w", {8, 4});
  int ny = n.op("MatMul", {nx, nw}, "y", {64, 4});
  n.g.outputs = {ny};
  n.annotate(nx, {"data", ""});
  n.annotate(nw, {"", "data"});
  auto q = n.run();
  EXPECT_EQ(n.spec(q, ny), R"(["data", null])");

  // The larger tensor may be the result: y (annotated, larger) beats the operand x.
  Model k;
  int kx = k.input("x", {4, 8}), kw = k.weight("w", {8, 64});
  int ky = k.op("MatMul", {kx, kw}, "y", {4, 64});
  int kz = k.op("Relu", {ky}, "z", {4, 64});
  k.g.outputs = {kz};
  k.annotate(kx, {"", "data"});  // k split
  k.annotate(ky, {"", "data"});  // n split, same axis
  auto r = k.run();
  EXPECT_EQ(k.spec(r, kw), R"([null, "data"])");  // from y (n), not from x (k)
}

TEST(Propagation, PassThroughOpsBeforeOthers) {
  // y gets its sharding from the Add (stage 0) before the MatMul (stage 1) can give it x's row split.
  Model m;
  int x = m.input("x", {8, 8}), u = m.input("u", {8, 8}), t = m.input("t", {8, 8});
  int y = m.op("MatMul", {x, u}, "y", {8, 8});
  int z = m.op("Add", {y, t}, "z", {8, 8});
  m.g.outputs = {z};
  m.annotate(x, {"data", ""});
  m.annotate(t, {"", "data"});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"([null, "data"])");
  EXPECT_EQ(m.spec(p, z), R"([null, "data"])");
  // In the MatMul, x (m = data) and y (n = data) conflict over the axis; same size, so the earlier operand wins
  // and u gets nothing.
  EXPECT_EQ(m.spec(p, u), "[null, null]");
}

TEST(Propagation, BroadcastsForwardLast) {
  // The bias b [8] is split over data; a same-shape operand of a later elementwise op splits the batch dim. Without
  // "broadcasts forward last", the Add would copy b's split onto h first.
  Model m;
  int x = m.input("x", {4, 8}), b = m.weight("b", {8}), ids = m.input("ids", {4, 8});
  int h = m.op("Add", {x, b}, "h", {4, 8});
  int z = m.op("Mul", {h, ids}, "z", {4, 8});
  m.g.outputs = {z};
  m.annotate(b, {"data"});
  m.annotate(ids, {"data", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, h), R"(["data", null])");
  EXPECT_EQ(m.spec(p, x), R"(["data", null])");
  EXPECT_EQ(m.spec(p, z), R"(["data", null])");

  // With nothing else around, the broadcast operand still propagates forward (last stage).
  Model n;
  int nx = n.input("x", {4, 8}), nb = n.weight("b", {8});
  int nh = n.op("Add", {nx, nb}, "h", {4, 8});
  int ne = n.op("Expand", {nb, n.ints("shape", {4, 8})}, "e", {4, 8});
  n.g.outputs = {nh, ne};
  n.annotate(nb, {"model"});
  auto q = n.run();
  EXPECT_EQ(n.spec(q, nh), R"([null, "model"])");
  EXPECT_EQ(n.spec(q, ne), R"([null, "model"])");
  EXPECT_EQ(n.spec(q, nx), R"([null, "model"])");
}

TEST(Propagation, OverSplitSourceIsCopied) {
  // 3 rows over data*model (4 shards, one all padding): still a valid split, copied as is so the Add runs locally.
  Model m;
  int a = m.input("a", {3, 8}), c = m.input("c", {3, 8});
  int y = m.op("Add", {a, c}, "y", {3, 8});
  m.g.outputs = {y};
  m.annotate(a, {"data,model", ""});
  m.annotate(c, {"data,model", ""});
  auto p = m.run();
  EXPECT_EQ(m.spec(p, y), R"([["data", "model"], null])");
}

}  // namespace
}  // namespace gspmd
