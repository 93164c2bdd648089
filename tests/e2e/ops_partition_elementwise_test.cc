// Partitioning elementwise ops and reductions (the generic driver), and partial (unreduced) values through their
// consumers; an elementwise op on equally sharded operands moves nothing.
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Elementwise

Case binary_case(const std::string& op, Shape a, Shape b, Shape y, InputGen ga = {}, InputGen gb = {}, DType t = F32,
                 DType yt = F32) {
  Builder B(op + " " + shape_str(a) + " x " + shape_str(b));
  int A = B.in("A", t, a, ga);
  int Bv = B.in("B", t, b, gb);
  B.out(B.op1(op, {A, Bv}, "Y", yt, y), true);
  return B.done(70);
}

TEST(OpsPartition, BinaryBroadcast) {
  std::vector<Case> cs;
  const InputGen pos{Gen::kPositive}, nz{Gen::kNonZero};
  for (std::string op : {"Add", "Sub", "Mul", "Div", "Pow"}) {
    InputGen ga = op == "Pow" ? pos : InputGen{};
    InputGen gb = op == "Div" ? nz : InputGen{};
    cs.push_back(binary_case(op, {4, 1, 6}, {5, 1}, {4, 5, 6}, ga, gb));
    cs.push_back(binary_case(op, {5, 7}, {5, 7}, {5, 7}, ga, gb));
  }
  cs.push_back(binary_case("Add", {7}, {3, 5, 7}, {3, 5, 7}));
  cs.push_back(binary_case("Equal", {4, 1, 6}, {5, 1}, {4, 5, 6}, {Gen::kSmallSet}, {Gen::kSmallSet}, F32, BOOL));
  cs.push_back(binary_case("Equal", {5, 7}, {7}, {5, 7}, {}, {}, I64, BOOL));
  {
    Builder B("Where cond[5,1] X[4,5,6] Y[6]");
    int C = B.in("cond", BOOL, {5, 1}, {Gen::kBool});
    int X = B.fin("X", {4, 5, 6});
    int Y = B.fin("Yv", {6});
    B.out(B.opf("Where", {C, X, Y}, "Z", {4, 5, 6}), true);
    cs.push_back(B.done(90));
  }
  run_all("Add/Sub/Mul/Div/Pow/Equal/Where", cs);
}

Case unary_case(const std::string& op, Shape s, InputGen g = {}, std::map<std::string, AttrValue> at = {},
                DType yt = F32) {
  Builder B(op + " " + shape_str(s));
  int X = B.fin("X", s, g);
  B.out(B.op1(op, {X}, "Y", yt, s, at), true);
  return B.done(60);
}

TEST(OpsPartition, Unary) {
  std::vector<Case> cs;
  for (Shape s : {Shape{5, 7}, Shape{3, 4, 5}}) {
    cs.push_back(unary_case("Sqrt", s, {Gen::kPositive}));
    for (std::string op : {"Erf", "Tanh", "Relu", "Exp", "Neg", "Identity"}) cs.push_back(unary_case(op, s));
  }
  cs.push_back(unary_case("Cast", {5, 7}, {}, {{"to", int64_t(DType::kFloat64)}}, DType::kFloat64));
  {
    Builder B("Cast float->double->float");
    int X = B.fin("X", {7, 3});
    int D = B.op1("Cast", {X}, "D", DType::kFloat64, {7, 3}, {{"to", int64_t(DType::kFloat64)}});
    B.out(B.opf("Cast", {D}, "Y", {7, 3}, {{"to", int64_t(DType::kFloat32)}}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Cast float*10->int64");
    int X = B.fin("X", {5, 7});
    int X10 = B.opf("Mul", {X, B.scalar("ten", 10.f)}, "X10", {5, 7});
    B.out(B.op1("Cast", {X10}, "Y", I64, {5, 7}, {{"to", int64_t(DType::kInt64)}}), true);
    cs.push_back(B.done());
  }
  run_all("Unary (Sqrt/Erf/Tanh/Relu/Exp/Neg/Identity/Cast)", cs);
}

Case reduce_case(const std::string& op, int64_t opset, Shape in, std::vector<int64_t> axes, bool keep, bool axes_input,
                 bool noaxes = false) {
  Shape out;
  const int r = static_cast<int>(in.size());
  for (int d = 0; d < r; ++d) {
    bool red = noaxes || std::any_of(axes.begin(), axes.end(), [&](int64_t a) { return (a < 0 ? a + r : a) == d; });
    if (!red)
      out.push_back(in[d]);
    else if (keep)
      out.push_back(1);
  }
  std::ostringstream nm;
  nm << op << " " << shape_str(in) << " axes=" << (noaxes ? "all" : shape_str(axes)) << " keepdims=" << keep
     << (axes_input ? " (axes input)" : " (axes attr)");
  Builder B(nm.str(), opset);
  int X = B.fin("X", in);
  std::vector<int> ins = {X};
  std::map<std::string, AttrValue> at = {{"keepdims", int64_t{keep}}};
  if (!noaxes) {
    if (axes_input)
      ins.push_back(B.ints("axes", axes));
    else
      at["axes"] = axes;
  }
  B.out(B.opf(op, ins, "Y", out, at), true);
  return B.done(60);
}

TEST(OpsPartition, Reductions) {
  std::vector<Case> cs;
  for (int64_t opset : {13, 17}) {
    cs.push_back(reduce_case("ReduceMean", opset, {3, 5, 7}, {1}, true, false));
    cs.push_back(reduce_case("ReduceMean", opset, {3, 5, 7}, {-1}, false, false));
    cs.push_back(reduce_case("ReduceMean", opset, {3, 5, 7}, {0, 2}, true, false));
    cs.push_back(reduce_case("ReduceMax", opset, {3, 5, 7}, {1}, false, false));
    cs.push_back(reduce_case("ReduceMax", opset, {5, 7}, {-1}, true, false));
  }
  cs.push_back(reduce_case("ReduceMean", 17, {5, 7}, {}, false, false, true));
  cs.push_back(reduce_case("ReduceMax", 17, {3, 5, 7}, {0, 2}, false, false));
  cs.push_back(reduce_case("ReduceMax", 17, {5, 7}, {}, false, false, true));
  cs.push_back(reduce_case("ReduceSum", 17, {3, 5, 7}, {1}, true, true));
  cs.push_back(reduce_case("ReduceSum", 17, {3, 5, 7}, {-1}, false, true));
  cs.push_back(reduce_case("ReduceSum", 13, {3, 5, 7}, {0, 2}, false, true));
  cs.push_back(reduce_case("ReduceSum", 17, {9, 5}, {}, true, false, true));
  cs.push_back(reduce_case("ReduceSum", 17, {7, 9}, {}, false, false, true));
  run_all("ReduceMean/ReduceSum/ReduceMax", cs);
}

// ---------------------------------------------------------------------------------------------------------------
// Deferred reductions: partial (unreduced) values through linear and non-linear consumers

TEST(OpsPartition, PartialChains) {
  std::vector<Case> cs;
  auto mm = [](Builder& B, const std::string& a, const std::string& b, int64_t M, int64_t K, int64_t N) {
    int A = B.fin(a, {M, K});
    int W = B.fin(b, {K, N});
    return B.opf("MatMul", {A, W}, a + b, {M, N});
  };
  {
    Builder B("MatMul -> Transpose -> Neg");
    int y = mm(B, "A", "B", 5, 7, 6);
    int t = B.opf("Transpose", {y}, "T", {6, 5});
    B.out(B.opf("Neg", {t}, "Y", {6, 5}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("MatMul + MatMul -> Relu");
    int y1 = mm(B, "A", "B", 4, 7, 5);
    int y2 = mm(B, "C", "D", 4, 6, 5);
    int s = B.opf("Add", {y1, y2}, "S", {4, 5});
    B.out(B.opf("Relu", {s}, "Y", {4, 5}), true);
    cs.push_back(B.done(120));
  }
  {
    Builder B("MatMul - MatMul (Sub of partials)");
    int y1 = mm(B, "A", "B", 5, 4, 3);
    int y2 = mm(B, "C", "D", 5, 4, 3);
    B.out(B.opf("Sub", {y1, y2}, "Y", {5, 3}), true);
    cs.push_back(B.done(120));
  }
  {
    Builder B("MatMul * itself (Mul of two partials)");
    int y = mm(B, "A", "B", 5, 7, 3);
    B.out(B.opf("Mul", {y, y}, "Y", {5, 3}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("MatMul * X, / const, - X");
    int y = mm(B, "A", "B", 5, 7, 3);
    int X = B.fin("X", {5, 3});
    int m = B.opf("Mul", {y, X}, "M", {5, 3});
    int d = B.opf("Div", {m, B.scalar("three", 3.f)}, "Dv", {5, 3});
    B.out(B.opf("Sub", {d, X}, "Y", {5, 3}), true);
    cs.push_back(B.done(120));
  }
  {
    Builder B("const / MatMul (Div not linear in divisor)");
    int y = mm(B, "A", "B", 4, 5, 3);
    int e = B.opf("Exp", {y}, "E", {4, 3});  // keep the divisor away from zero
    int z = mm(B, "C", "D", 4, 5, 3);
    B.out(B.opf("Div", {z, e}, "Y", {4, 3}), true);
    cs.push_back(B.done(120));
  }
  {
    Builder B("MatMul -> Reshape -> ReduceSum -> ReduceMax");
    int y = mm(B, "A", "B", 6, 5, 4);
    int r = B.opf("Reshape", {y, B.ints("shape", {2, 3, 4})}, "R", {2, 3, 4});
    int s = B.opf("ReduceSum", {r, B.ints("axes", {1})}, "S", {2, 4}, {{"keepdims", int64_t{0}}});
    B.out(B.opf("ReduceMax", {s}, "Y", {2}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("ReduceSum -> ReduceMax (split reduced dims)");
    int X = B.fin("X", {5, 7, 3});
    int s = B.opf("ReduceSum", {X, B.ints("axes", {1})}, "S", {5, 3}, {{"keepdims", int64_t{0}}});
    B.out(B.opf("ReduceMax", {s}, "Y", {3}, {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("ReduceMax(Exp) -> Sub (softmax max trick)");
    int X = B.fin("X", {5, 7});
    int e = B.opf("Exp", {X}, "E", {5, 7});
    int m = B.opf("ReduceMax", {e}, "Mx", {5, 1}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{1}}});
    B.out(B.opf("Sub", {e, m}, "Y", {5, 7}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Div(X, 0-padding) -> MatMul K split (NaN padding masked)");
    int X = B.fin("X", {4, 5});
    int D = B.fin("Dn", {4, 5}, {Gen::kNonZero});
    int q = B.opf("Div", {X, D}, "Q", {4, 5});
    int W = B.fin("W", {5, 3});
    B.out(B.opf("MatMul", {q, W}, "Y", {4, 3}), true);
    cs.push_back(B.done(120));
  }
  {
    Builder B("Concat of two partial MatMuls");
    int y1 = mm(B, "A", "B", 4, 5, 3);
    int y2 = mm(B, "C", "D", 4, 5, 2);
    B.out(B.opf("Concat", {y1, y2}, "Y", {4, 5}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(120));
  }
  {
    Builder B("Gather vocab split -> ReduceSum -> Cast double");
    int T = B.fin("table", {7, 5});
    int I = B.in("ids", I64, {3, 2}, {Gen::kIds, 7});
    int g = B.opf("Gather", {T, I}, "G", {3, 2, 5});
    int s = B.opf("ReduceSum", {g, B.ints("axes", {-1})}, "S", {3, 2}, {{"keepdims", int64_t{0}}});
    B.out(B.op1("Cast", {s}, "Y", DType::kFloat64, {3, 2}, {{"to", int64_t(DType::kFloat64)}}), true);
    cs.push_back(B.done(80));
  }
  run_all("Partial (unreduced) chains", cs);
}

// ---------------------------------------------------------------------------------------------------------------
// Analytically known collective counts

TEST(OpsPartition, CollectiveCountsElementwiseSameSharding) {
  Builder B("Add same sharding");
  int A = B.fin("A", {5, 7});
  int C = B.fin("C", {5, 7});
  B.out(B.opf("Add", {A, C}, "Y", {5, 7}));
  Case c = B.done();
  std::mt19937 rng(5);
  std::vector<Tensor> inputs = {make_input(c.g.values[A], {}, rng), make_input(c.g.values[C], {}, rng)};
  std::vector<Tensor> ref = run_single(c.g, inputs).outputs;
  int n = 0;
  for (const DeviceMesh& mesh : all_meshes()) {
    for (const TensorSharding& s : all_shardings(2, mesh)) {
      Annotations ann;
      ann.mesh = mesh;
      ann.by_value[A] = Annotation{s, 0, "t"};
      ann.by_value[C] = Annotation{s, 0, "t"};
      SpmdProgram p;
      std::string why = run_one(c, ann, inputs, ref, &p);
      ++n;
      EXPECT_EQ(why, "") << describe(c, ann);
      if (why.empty()) {
        EXPECT_EQ(p.collectives.size(), 0u) << describe(c, ann) << collectives_str(p);
      }
    }
  }
  std::cout << "[ops] Add same sharding, 0 collectives: " << n << " cases\n";
}

}  // namespace
}  // namespace gspmd::ops_partition
