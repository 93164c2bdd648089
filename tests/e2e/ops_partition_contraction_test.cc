// Partitioning contractions (the generic driver from their factor rules): MatMul, Gemm, the Megatron MLP chain, and
// the collectives of a split contraction dim (counted analytically).
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// MatMul / Gemm

Case matmul_case(const std::string& name, Shape a, Shape b, Shape y, bool b_weight = false) {
  Builder B(name);
  int A = B.fin("A", a);
  int W = b_weight ? B.weight("B", b) : B.fin("B", b);
  B.out(B.opf("MatMul", {A, W}, "Y", y), true);
  return B.done(80);
}

TEST(OpsPartition, MatMul) {
  run_all("MatMul", {
                        matmul_case("MatMul 2-D x 2-D uneven", {5, 7}, {7, 9}, {5, 9}),
                        matmul_case("MatMul 2-D x 2-D even", {4, 6}, {6, 6}, {4, 6}),
                        matmul_case("MatMul batched 3-D x 2-D", {3, 5, 7}, {7, 4}, {3, 5, 4}),
                        matmul_case("MatMul 3-D x 3-D batch-1 broadcast", {2, 5, 6}, {1, 6, 7}, {2, 5, 7}),
                        matmul_case("MatMul 1-D x 2-D", {7}, {7, 5}, {5}),
                        matmul_case("MatMul 2-D x 1-D", {4, 7}, {7}, {4}),
                        matmul_case("MatMul 3-D x 2-D weight", {2, 5, 7}, {7, 9}, {2, 5, 9}, true),
                    });
}

Case gemm_case(const std::string& name, Shape a, Shape b, Shape cshape, int64_t ta, int64_t tb, float alpha, float beta,
               bool c_input = true) {
  Builder B(name);
  int A = B.fin("A", a);
  int W = B.fin("B", b);
  std::vector<int> ins = {A, W};
  if (!cshape.empty()) ins.push_back(c_input ? B.fin("C", cshape) : B.weight("C", cshape));
  int64_t M = ta ? a[1] : a[0], N = tb ? b[0] : b[1];
  std::map<std::string, AttrValue> at = {{"alpha", alpha}, {"beta", beta}};
  if (ta) at["transA"] = int64_t{1};
  if (tb) at["transB"] = int64_t{1};
  B.out(B.opf("Gemm", ins, "Y", {M, N}, at), true);
  return B.done(80);
}

TEST(OpsPartition, Gemm) {
  run_all("Gemm", {
                      gemm_case("Gemm C[N] alpha beta", {5, 7}, {7, 6}, {6}, 0, 0, 0.5f, 2.f),
                      gemm_case("Gemm transA C[M,N]", {7, 5}, {7, 6}, {5, 6}, 1, 0, 1.f, 1.f),
                      gemm_case("Gemm transB C[M,N] alpha", {5, 7}, {6, 7}, {5, 6}, 0, 1, 1.5f, 0.25f),
                      gemm_case("Gemm transA transB no C", {7, 5}, {9, 7}, {}, 1, 1, 2.f, 1.f),
                      gemm_case("Gemm C[1,N] weight", {4, 9}, {9, 5}, {1, 5}, 0, 0, 1.f, 1.f, false),
                  });
}

// ---------------------------------------------------------------------------------------------------------------
// Megatron MLP chain: Gather embedding -> Add pos -> LayerNorm -> MatMul (column) -> Relu -> MatMul (row) -> Add
// bias -> Softmax.

Case megatron_case(int64_t V, int64_t D, int64_t F, int64_t Bsz, int64_t S) {
  Builder B("Megatron MLP V=" + std::to_string(V) + " D=" + std::to_string(D) + " F=" + std::to_string(F));
  int ids = B.in("ids", I64, {Bsz, S}, {Gen::kIds, V}, false);
  int table = B.weight("wte", {V, D}, false);
  int pos = B.weight("wpe", {S, D}, false);
  int emb = B.opf("Gather", {table, ids}, "emb", {Bsz, S, D});
  int h = B.opf("Add", {emb, pos}, "h", {Bsz, S, D});
  int ln = B.opf("LayerNormalization", {h, B.weight("ln_g", {D}, false), B.weight("ln_b", {D}, false)}, "ln",
                 {Bsz, S, D}, {{"axis", int64_t{-1}}});
  int w1 = B.weight("w1", {D, F}, false);
  int a = B.opf("MatMul", {ln, w1}, "a", {Bsz, S, F});
  int r = B.opf("Relu", {a}, "r", {Bsz, S, F});
  int w2 = B.weight("w2", {F, D}, false);
  int o = B.opf("MatMul", {r, w2}, "o", {Bsz, S, D});
  int ob = B.opf("Add", {o, B.weight("b2", {D}, false)}, "ob", {Bsz, S, D});
  B.out(B.opf("Softmax", {ob}, "Y", {Bsz, S, D}, {{"axis", int64_t{-1}}}));
  return B.done();
}

/// Megatron annotations: ids [data, null], wte [model, null], w1 [null, model], w2 [model, null]. `data` may be -1.
Annotations megatron_ann(const Graph& g, const DeviceMesh& mesh, int data, int model) {
  Annotations ann;
  ann.mesh = mesh;
  auto put = [&](const char* v, TensorSharding s) { ann.by_value[g.at(v)] = Annotation{s, 0, "megatron"}; };
  auto ax = [](int a) { return a < 0 ? std::vector<int>{} : std::vector<int>{a}; };
  put("ids", spec(2, {ax(data), {}}));
  put("wte", spec(2, {{model}, {}}));
  put("w1", spec(2, {{}, {model}}));
  put("w2", spec(2, {{model}, {}}));
  return ann;
}

TEST(OpsPartition, MegatronMlpChain) {
  std::mt19937 rng(99);
  int cases = 0;
  for (auto [V, D, F] : {std::tuple<int64_t, int64_t, int64_t>{7, 8, 12}, {12, 6, 8}, {11, 5, 9}}) {
    Case c = megatron_case(V, D, F, 4, 3);
    std::vector<Tensor> inputs = {make_input(c.g.values[c.g.at("ids")], c.gens.at(c.g.at("ids")), rng)};
    std::vector<Tensor> ref = run_single(c.g, inputs).outputs;
    struct M {
      DeviceMesh mesh;
      int data, model;
    };
    for (const M& m : {M{mesh_of({2}), -1, 0}, M{mesh_of({3}), -1, 0}, M{mesh_of({2, 2}), 0, 1},
                       M{mesh_of({2, 3}), 0, 1}, M{mesh_of({2, 3}), 1, 0}}) {
      Annotations ann = megatron_ann(c.g, m.mesh, m.data, m.model);
      SpmdProgram p;
      ++cases;
      std::string why = run_one(c, ann, inputs, ref, &p);
      EXPECT_EQ(why, "") << describe(c, ann);
      if (!why.empty()) continue;
      auto k = count_kinds(p);
      // One all-reduce for the vocab-parallel embedding, one for the row-parallel MatMul; nothing else.
      EXPECT_EQ(k["all-reduce"], 2) << describe(c, ann) << collectives_str(p);
      EXPECT_EQ(p.collectives.size(), 2u) << describe(c, ann) << collectives_str(p);
      std::multiset<std::string> reduced;
      for (const auto& r : p.collectives) reduced.insert(r.value);
      EXPECT_EQ(reduced, (std::multiset<std::string>{"emb", "o"})) << describe(c, ann) << collectives_str(p);
      EXPECT_TRUE(p.warnings.empty()) << describe(c, ann);
    }
  }
  std::cout << "[ops] Megatron MLP chain: " << cases << " cases\n";
}

TEST(OpsPartition, CollectiveCountsMatMulKSplit) {
  // A[M,K] and B[K,N] both split on K over x: Y is unreduced over x; the replicated graph output needs exactly one
  // all-reduce of M*N*4 bytes. Also K over both axes of a 2-D mesh, and uneven K.
  int n = 0;
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{4, 6, 5}, {3, 7, 5}}) {
    Builder B("MatMul K split M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
    int A = B.fin("A", {M, K});
    int W = B.fin("B", {K, N});
    int Y = B.opf("MatMul", {A, W}, "Y", {M, N});
    B.out(Y);
    Case c = B.done();
    std::mt19937 rng(6);
    std::vector<Tensor> inputs = {make_input(c.g.values[A], {}, rng), make_input(c.g.values[W], {}, rng)};
    std::vector<Tensor> ref = run_single(c.g, inputs).outputs;
    for (const DeviceMesh& mesh : all_meshes()) {
      std::vector<std::vector<int>> ks = {{0}};
      if (mesh.rank() == 2) ks = {{0}, {1}, {0, 1}};
      for (const auto& k : ks) {
        Annotations ann;
        ann.mesh = mesh;
        ann.by_value[A] = Annotation{spec(2, {{}, k}), 0, "t"};
        ann.by_value[W] = Annotation{spec(2, {k, {}}), 0, "t"};
        ann.by_value[Y] = Annotation{TensorSharding::replicated(2), 0, "t"};
        SpmdProgram p;
        std::string why = run_one(c, ann, inputs, ref, &p);
        ++n;
        EXPECT_EQ(why, "") << describe(c, ann);
        if (!why.empty()) continue;
        ASSERT_EQ(p.collectives.size(), 1u) << describe(c, ann) << collectives_str(p);
        EXPECT_EQ(collective_name(p.collectives[0].kind), "all-reduce") << describe(c, ann);
        EXPECT_EQ(p.collectives[0].bytes, M * N * 4) << describe(c, ann);
        EXPECT_EQ(p.collectives[0].mesh_axes, k) << describe(c, ann);
      }
    }
  }
  std::cout << "[ops] MatMul K split, 1 all-reduce: " << n << " cases\n";
}

TEST(OpsPartition, CollectiveCountsMatMulKSplitReduceScatter) {
  // Y = A[6,4] @ B[4,5] with K split over x (Y hinted unsplit by an open annotation, so it stays unreduced over x);
  // Z = Y + X with X split on M over x: the Add needs Y's full value split like X, i.e. exactly one reduce-scatter
  // of 6*5*4 bytes. With a closed annotation, Y is a constraint: one all-reduce right after the MatMul instead.
  Builder B("MatMul K split -> Add X split on M");
  int A = B.fin("A", {6, 4});
  int W = B.fin("B", {4, 5});
  int X = B.fin("X", {6, 5});
  int Y = B.opf("MatMul", {A, W}, "Y", {6, 5});
  B.out(B.opf("Add", {Y, X}, "Z", {6, 5}));
  Case c = B.done();
  std::mt19937 rng(8);
  std::vector<Tensor> inputs;
  for (int v : c.g.inputs) inputs.push_back(make_input(c.g.values[v], {}, rng));
  std::vector<Tensor> ref = run_single(c.g, inputs).outputs;
  for (const DeviceMesh& mesh : {mesh_of({2}), mesh_of({3}), mesh_of({2, 2}), mesh_of({2, 3})}) {
    Annotations ann;
    ann.mesh = mesh;
    ann.by_value[A] = Annotation{spec(2, {{}, {0}}), 0, "t"};
    ann.by_value[W] = Annotation{spec(2, {{0}, {}}), 0, "t"};
    ann.by_value[X] = Annotation{spec(2, {{0}, {}}), 0, "t"};
    for (bool open : {true, false}) {
      ann.by_value[Y] = Annotation{TensorSharding::replicated(2), 0, "t", open};
      SpmdProgram p;
      std::string why = run_one(c, ann, inputs, ref, &p);
      EXPECT_EQ(why, "") << describe(c, ann);
      if (!why.empty()) continue;
      ASSERT_EQ(p.collectives.size(), 1u) << describe(c, ann) << collectives_str(p);
      EXPECT_EQ(collective_name(p.collectives[0].kind), open ? "reduce-scatter" : "all-reduce") << describe(c, ann);
      EXPECT_EQ(p.collectives[0].bytes, 6 * 5 * 4) << describe(c, ann);
      const TensorSharding y_final = open ? TensorSharding{{{}, {}}, {0}} : TensorSharding::replicated(2);
      EXPECT_EQ(p.final_shardings[Y], y_final);
    }
  }
}

}  // namespace
}  // namespace gspmd::ops_partition
