// Every supported operator partitions exactly: for hand-built one-node (or few-node) graphs, many input shardings
// (each dim unsplit or split over each mesh axis, or over both axes of a 2-D mesh, including dims that do not divide
// the mesh), on meshes {2}, {2x2}, {2x3}, {3}: propagate() -> partition() -> run_spmd() must equal run_single()
// (floats within 1e-5 + 1e-4|ref|, ints and bools exactly). Some cases also annotate the output or the weights.
// Analytically known collective counts are checked on a few graphs (elementwise, K-split MatMul, Megatron MLP).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/pod/pod.h"
#include "core/ir/shift_op.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/sharding/sharding.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Meshes and shardings

using testing::mesh_of;

const std::vector<DeviceMesh>& all_meshes() {
  static const std::vector<DeviceMesh> m = {mesh_of({2}), mesh_of({2, 2}), mesh_of({2, 3}), mesh_of({3})};
  return m;
}

/// Every sharding of a rank-r tensor where each dim is unsplit, split over one mesh axis, or (2-D meshes) over both
/// axes in either order; each axis used at most once.
std::vector<TensorSharding> all_shardings(int rank, const DeviceMesh& mesh) {
  std::vector<std::vector<int>> opts = {{}};
  for (int a = 0; a < mesh.rank(); ++a) opts.push_back({a});
  if (mesh.rank() == 2) {
    opts.push_back({0, 1});
    opts.push_back({1, 0});
  }
  std::vector<TensorSharding> out;
  TensorSharding cur = TensorSharding::replicated(rank);
  std::function<void(int, unsigned)> rec = [&](int d, unsigned used) {
    if (d == rank) {
      out.push_back(cur);
      return;
    }
    for (const auto& o : opts) {
      unsigned m = 0;
      for (int a : o) m |= 1u << a;
      if (m & used) continue;
      cur.dims[d] = o;
      rec(d + 1, used | m);
    }
    cur.dims[d].clear();
  };
  rec(0, 0);
  return out;
}

TensorSharding spec(int rank, std::vector<std::vector<int>> dims) {
  TensorSharding s = TensorSharding::replicated(rank);
  s.dims = std::move(dims);
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Test cases: a graph, how to generate its inputs, which values get enumerated shardings

enum class Gen { kUniform, kPositive, kNonZero, kSmallSet, kBool, kIds, kIdsSigned };

struct InputGen {
  Gen kind = Gen::kUniform;
  int64_t hi = 0;  // ids: [0, hi) (kIdsSigned: [-hi, hi))
};

struct Case {
  std::string name;
  Graph g;
  std::map<int, InputGen> gens;  // per graph input value id
  std::vector<int> shardable;    // values whose shardings are enumerated (inputs and some weights)
  std::vector<int> out_ann;      // values that sometimes get an annotation too (outputs)
  int cap = 60;                  // max annotation sets per mesh
};

/// Small builder for hand-made graphs.
struct Builder {
  Case c;
  std::mt19937 rng;

  explicit Builder(std::string name, int64_t opset = 17, uint32_t seed = 7) : rng(seed) {
    c.name = std::move(name);
    c.g.name = c.name;
    c.g.opset = opset;
  }
  int value(const std::string& name, DType t, Shape s) { return c.g.add_value(testing::V(name, t, std::move(s))); }
  int in(const std::string& name, DType t, Shape s, InputGen gen = {}, bool shard = true) {
    int v = value(name, t, std::move(s));
    c.g.inputs.push_back(v);
    c.gens[v] = gen;
    if (shard) c.shardable.push_back(v);
    return v;
  }
  int fin(const std::string& name, Shape s, InputGen gen = {}, bool shard = true) {
    return in(name, DType::kFloat32, std::move(s), gen, shard);
  }
  int init(const std::string& name, Tensor t, bool shard = false) {
    Value v;
    v.name = name;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.is_initializer = true;
    v.data = std::make_shared<Tensor>(std::move(t));
    int id = c.g.add_value(std::move(v));
    if (shard) c.shardable.push_back(id);
    return id;
  }
  int weight(const std::string& name, Shape s, bool shard = true, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> d(static_cast<size_t>(num_elements(s)));
    for (float& x : d) x = u(rng);
    return init(name, Tensor::from_floats(s, d), shard);
  }
  int ints(const std::string& name, std::vector<int64_t> v) { return init(name, Tensor::from_int64s(v)); }
  int scalar(const std::string& name, float x) { return init(name, Tensor::from_floats({}, {x})); }
  std::vector<int> op(const std::string& type, std::vector<int> inputs,
                      std::vector<std::tuple<std::string, DType, Shape>> outs,
                      std::map<std::string, AttrValue> attrs = {}) {
    Node n;
    n.name = type + "_" + std::to_string(c.g.nodes.size());
    n.op_type = type;
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    for (auto& [nm, t, s] : outs) n.outputs.push_back(value(nm, t, s));
    c.g.add_node(n);
    return n.outputs;
  }
  int op1(const std::string& type, std::vector<int> inputs, const std::string& out, DType t, Shape s,
          std::map<std::string, AttrValue> attrs = {}) {
    return op(type, std::move(inputs), {{out, t, std::move(s)}}, std::move(attrs))[0];
  }
  int opf(const std::string& type, std::vector<int> inputs, const std::string& out, Shape s,
          std::map<std::string, AttrValue> attrs = {}) {
    return op1(type, std::move(inputs), out, DType::kFloat32, std::move(s), std::move(attrs));
  }
  void out(int v, bool annotate = false) {
    c.g.outputs.push_back(v);
    if (annotate) c.out_ann.push_back(v);
  }
  Case done(int cap = 60) {
    c.g.verify();
    c.cap = cap;
    return std::move(c);
  }
};

Tensor make_input(const Value& v, const InputGen& gen, std::mt19937& rng) {
  Tensor t(v.dtype, v.shape);
  const int64_t n = t.numel();
  std::uniform_real_distribution<float> u(-1.f, 1.f), pos(0.5f, 2.f);
  auto fval = [&]() -> double {
    switch (gen.kind) {
      case Gen::kPositive: return pos(rng);
      case Gen::kNonZero: {
        float x = pos(rng);
        return (rng() & 1) ? x : -x;
      }
      case Gen::kSmallSet: return static_cast<double>(rng() % 3);
      default: return u(rng);
    }
  };
  switch (v.dtype) {
    case DType::kFloat32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(fval());
      break;
    case DType::kFloat64:
      for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = fval();
      break;
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i) t.data<bool>()[i] = (rng() & 1) != 0;
      break;
    case DType::kInt64:
    case DType::kInt32: {
      int64_t lo = 0, hi = 3;
      if (gen.kind == Gen::kIds) hi = gen.hi;
      if (gen.kind == Gen::kIdsSigned) lo = -gen.hi, hi = gen.hi;
      for (int64_t i = 0; i < n; ++i) {
        int64_t x = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo));
        if (v.dtype == DType::kInt64)
          t.data<int64_t>()[i] = x;
        else
          t.data<int32_t>()[i] = static_cast<int32_t>(x);
      }
      break;
    }
    default: throw std::logic_error("make_input: unsupported dtype");
  }
  return t;
}

std::string value_desc(const Graph& g, int v) {
  const Value& x = g.values[v];
  return x.name + ":" + std::string(dtype_name(x.dtype)) + shape_str(x.shape);
}

struct Outcome {
  int cases = 0;
  std::vector<std::string> failures;
};

/// One annotation set: propagate, partition, run, compare. Returns "" or what went wrong.
std::string run_one(const Case& c, const Annotations& ann, const std::vector<Tensor>& inputs,
                    const std::vector<Tensor>& ref, SpmdProgram* keep = nullptr) {
  try {
    ShardingPlan plan = propagate(c.g, ann);
    SpmdProgram p = partition(c.g, plan, ann.mesh);
    PodRun r = run_spmd(p, c.g, inputs);
    std::string why;
    if (r.outputs.size() != ref.size()) return "wrong number of outputs";
    for (size_t o = 0; o < ref.size(); ++o) {
      std::string d = testing::compare_tensors(r.outputs[o], ref[o]);
      if (!d.empty()) {
        why += (why.empty() ? "" : "; ") + std::string("output ") + c.g.values[c.g.outputs[o]].name + " (" +
               plan.shardings[c.g.outputs[o]].to_partition_spec(ann.mesh) + " -> final " +
               p.final_shardings[c.g.outputs[o]].to_partition_spec(ann.mesh) + "): " + d;
      }
    }
    if (keep) *keep = std::move(p);
    return why;
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  }
}

std::string describe(const Case& c, const Annotations& ann) {
  std::ostringstream os;
  os << c.name << " (opset " << c.g.opset << ") inputs {";
  bool first = true;
  for (int v : c.g.inputs) os << (first ? "" : ", ") << value_desc(c.g, v), first = false;
  os << "} mesh " << ann.mesh.str() << " annotations {";
  first = true;
  for (const auto& [v, a] : ann.by_value)
    os << (first ? "" : ", ") << c.g.values[v].name << "=" << a.sharding.to_partition_spec(ann.mesh), first = false;
  os << "}";
  return os.str();
}

/// Runs a case over every mesh and many annotation sets.
Outcome run_case(const Case& c, const std::vector<DeviceMesh>& meshes = all_meshes()) {
  Outcome out;
  std::mt19937 rng(20240601u);
  std::vector<Tensor> inputs;
  for (int v : c.g.inputs) inputs.push_back(make_input(c.g.values[v], c.gens.at(v), rng));
  std::vector<Tensor> ref;
  try {
    ref = run_single(c.g, inputs).outputs;
  } catch (const std::exception& e) {
    out.failures.push_back(c.name + ": run_single failed: " + e.what());
    return out;
  }
  for (const DeviceMesh& mesh : meshes) {
    std::vector<std::vector<TensorSharding>> opts;
    for (int v : c.shardable) opts.push_back(all_shardings(static_cast<int>(c.g.values[v].shape.size()), mesh));
    int64_t total = 1;
    for (const auto& o : opts) total *= static_cast<int64_t>(o.size());
    std::vector<int64_t> picks;
    const int64_t cap = static_cast<int64_t>(c.cap) * 2;  // annotation sets per mesh and graph
    if (total <= cap) {
      for (int64_t i = 0; i < total; ++i) picks.push_back(i);
    } else {
      std::mt19937_64 prng(1234567u + static_cast<uint64_t>(mesh.num_devices()) * 31 + c.name.size());
      picks.push_back(0);
      std::vector<int64_t> seen = {0};
      while (static_cast<int64_t>(picks.size()) < cap) {
        int64_t k = static_cast<int64_t>(prng() % static_cast<uint64_t>(total));
        if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
        seen.push_back(k);
        picks.push_back(k);
      }
    }
    std::vector<std::vector<TensorSharding>> out_opts;
    for (int v : c.out_ann) out_opts.push_back(all_shardings(static_cast<int>(c.g.values[v].shape.size()), mesh));
    int j = 0;
    for (int64_t k : picks) {
      Annotations ann;
      ann.mesh = mesh;
      int64_t rest = k;
      for (size_t i = 0; i < c.shardable.size(); ++i) {
        const TensorSharding& s = opts[i][static_cast<size_t>(rest % static_cast<int64_t>(opts[i].size()))];
        rest /= static_cast<int64_t>(opts[i].size());
        // Unsplit: usually left to propagation, sometimes pinned replicated by the user.
        if (s.is_replicated() && (j + static_cast<int>(i)) % 3 != 0) continue;
        ann.by_value[c.shardable[i]] = Annotation{s, 0, "test"};
      }
      for (size_t i = 0; i < c.out_ann.size(); ++i)
        if (j % 3 == 2)
          ann.by_value[c.out_ann[i]] = Annotation{
              out_opts[i][static_cast<size_t>((j * 7 + static_cast<int>(i) * 3) % out_opts[i].size())], 0, "test"};
      ++j;
      ++out.cases;
      std::string why = run_one(c, ann, inputs, ref);
      if (!why.empty()) out.failures.push_back(describe(c, ann) + ": " + why);
    }
  }
  return out;
}

/// Runs every case, prints a coverage line and reports failures (all of them, one line each).
void run_all(const std::string& family, const std::vector<Case>& cases,
             const std::vector<DeviceMesh>& meshes = all_meshes()) {
  auto t0 = std::chrono::steady_clock::now();
  int total = 0, failed = 0, shown = 0;
  constexpr int kMaxShown = 40;  // full lines per family; every failing graph is counted in the summary below
  std::ostringstream msg, summary;
  for (const Case& c : cases) {
    Outcome o = run_case(c, meshes);
    total += o.cases;
    failed += static_cast<int>(o.failures.size());
    if (!o.failures.empty())
      summary << "\n  " << o.failures.size() << "/" << o.cases << " cases fail: " << c.name << " (opset " << c.g.opset
              << ")";
    for (const auto& f : o.failures)
      if (shown++ < kMaxShown) msg << "\n  FAIL " << f;
  }
  if (shown > kMaxShown) msg << "\n  ... " << shown - kMaxShown << " more";
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ops] " << family << ": " << cases.size() << " graphs x " << meshes.size() << " meshes, " << total
            << " sharding cases, " << failed << " failures, " << s << " s\n";
  if (failed)
    ADD_FAILURE() << family << ": " << failed << " of " << total << " cases differ. Per graph:" << summary.str()
                  << "\nFirst failures:" << msg.str();
}

constexpr DType F32 = DType::kFloat32;
constexpr DType I64 = DType::kInt64;
constexpr DType BOOL = DType::kBool;

std::map<std::string, int> count_kinds(const SpmdProgram& p) {
  std::map<std::string, int> m;
  for (const auto& c : p.collectives) ++m[std::string(collective_name(c.kind))];
  return m;
}

std::string collectives_str(const SpmdProgram& p) {
  std::ostringstream os;
  for (const auto& c : p.collectives)
    os << "\n  " << c.kind << " bytes=" << c.bytes << " value=" << c.value << " for=" << c.for_node << ": " << c.reason;
  return os.str();
}

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

// ---------------------------------------------------------------------------------------------------------------
// Softmax, LayerNorm, reductions

TEST(OpsPartition, SoftmaxAndLayerNorm) {
  std::vector<Case> cs;
  for (int64_t axis : {-1, 1}) {
    Builder B("Softmax axis " + std::to_string(axis));
    int X = B.fin("X", {3, 5, 7});
    B.out(B.opf("Softmax", {X}, "Y", {3, 5, 7}, {{"axis", axis}}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Softmax opset 13 axis 0 [5,7]", 13);
    int X = B.fin("X", {5, 7});
    B.out(B.opf("Softmax", {X}, "Y", {5, 7}, {{"axis", int64_t{0}}}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("LayerNormalization axis -1 scale/bias inputs");
    int X = B.fin("X", {3, 5, 7});
    int S = B.fin("scale", {7});
    int Bi = B.fin("bias", {7});
    B.out(B.opf("LayerNormalization", {X, S, Bi}, "Y", {3, 5, 7}, {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("LayerNormalization axis 1 scale/bias [5,7] weights");
    int X = B.fin("X", {3, 5, 7});
    int S = B.weight("scale", {5, 7});
    int Bi = B.weight("bias", {5, 7});
    B.out(B.opf("LayerNormalization", {X, S, Bi}, "Y", {3, 5, 7}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  {
    // Two normalized dims and all three outputs: Mean and InvStdDev are [3,1,1] and keep dim 0's split.
    Builder B("LayerNormalization axis 1 with Mean and InvStdDev outputs");
    int X = B.fin("X", {3, 5, 7});
    auto outs = B.op("LayerNormalization", {X, B.weight("scale", {5, 7}), B.weight("bias", {5, 7})},
                     {{"Y", DType::kFloat32, {3, 5, 7}},
                      {"Mean", DType::kFloat32, {3, 1, 1}},
                      {"InvStdDev", DType::kFloat32, {3, 1, 1}}},
                     {{"axis", int64_t{1}}});
    B.out(outs[0], true);
    B.out(outs[1]);
    B.out(outs[2]);
    cs.push_back(B.done(80));
  }
  {
    Builder B("LayerNormalization axis -1 no bias, 2-D [9,6]");
    int X = B.fin("X", {9, 6});
    int S = B.weight("scale", {6}, false);
    B.out(B.opf("LayerNormalization", {X, S}, "Y", {9, 6}), true);
    cs.push_back(B.done());
  }
  {
    // The opset-13 export of LayerNorm: ReduceMean(axes attr) ... Sqrt, Div, Mul, Add.
    Builder B("LayerNorm decomposition opset 13", 13);
    int X = B.fin("X", {3, 5, 7});
    int mean =
        B.opf("ReduceMean", {X}, "mean", {3, 5, 1}, {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}});
    int d = B.opf("Sub", {X, mean}, "d", {3, 5, 7});
    int sq = B.opf("Pow", {d, B.scalar("two", 2.f)}, "sq", {3, 5, 7});
    int var =
        B.opf("ReduceMean", {sq}, "var", {3, 5, 1}, {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}});
    int ve = B.opf("Add", {var, B.scalar("eps", 1e-5f)}, "ve", {3, 5, 1});
    int sd = B.opf("Sqrt", {ve}, "sd", {3, 5, 1});
    int n = B.opf("Div", {d, sd}, "n", {3, 5, 7});
    int m = B.opf("Mul", {n, B.weight("gamma", {7})}, "m", {3, 5, 7});
    B.out(B.opf("Add", {m, B.weight("beta", {7})}, "Y", {3, 5, 7}), true);
    cs.push_back(B.done());
  }
  run_all("Softmax/LayerNormalization", cs);
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
// Data movement

TEST(OpsPartition, TransposeReshapeSqueeze) {
  std::vector<Case> cs;
  {
    Builder B("Transpose perm [2,0,1]");
    int X = B.fin("X", {3, 5, 7});
    B.out(B.opf("Transpose", {X}, "Y", {7, 3, 5}, {{"perm", std::vector<int64_t>{2, 0, 1}}}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Transpose default perm");
    int X = B.fin("X", {5, 9});
    B.out(B.opf("Transpose", {X}, "Y", {9, 5}), true);
    cs.push_back(B.done());
  }
  auto reshape = [&](Shape in, std::vector<int64_t> target, Shape out) {
    Builder B("Reshape " + shape_str(in) + " -> " + shape_str(target));
    int X = B.fin("X", in);
    B.out(B.opf("Reshape", {X, B.ints("shape", target)}, "Y", out), true);
    cs.push_back(B.done());
  };
  reshape({6, 4}, {2, 3, 4}, {2, 3, 4});
  reshape({2, 3, 4}, {6, 4}, {6, 4});
  reshape({2, 3, 4}, {-1, 4}, {6, 4});
  reshape({2, 5, 12}, {2, 5, 3, 4}, {2, 5, 3, 4});
  reshape({2, 5, 12}, {0, 0, 3, -1}, {2, 5, 3, 4});
  reshape({2, 5, 12}, {2, 5, 4, 3}, {2, 5, 4, 3});
  reshape({3, 5, 9}, {3, 5, 3, 3}, {3, 5, 3, 3});
  reshape({2, 5, 3, 4}, {2, 5, 12}, {2, 5, 12});
  reshape({5, 7}, {35}, {35});
  reshape({35}, {5, 7}, {5, 7});
  {
    Builder B("Unsqueeze [5,7] axes [0,2]");
    int X = B.fin("X", {5, 7});
    B.out(B.opf("Unsqueeze", {X, B.ints("axes", {0, 2})}, "Y", {1, 5, 1, 7}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Unsqueeze [5,7] axes [-1]");
    int X = B.fin("X", {5, 7});
    B.out(B.opf("Unsqueeze", {X, B.ints("axes", {-1})}, "Y", {5, 7, 1}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Squeeze [5,1,7] axes [1]");
    int X = B.fin("X", {5, 1, 7});
    B.out(B.opf("Squeeze", {X, B.ints("axes", {1})}, "Y", {5, 7}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Squeeze [1,9,1] axes [0,-1]");
    int X = B.fin("X", {1, 9, 1});
    B.out(B.opf("Squeeze", {X, B.ints("axes", {0, -1})}, "Y", {9}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Squeeze [3,1,5] no axes");
    int X = B.fin("X", {3, 1, 5});
    B.out(B.opf("Squeeze", {X}, "Y", {3, 5}), true);
    cs.push_back(B.done());
  }
  run_all("Transpose/Reshape/Unsqueeze/Squeeze", cs);
}

TEST(OpsPartition, ConcatSliceSplit) {
  std::vector<Case> cs;
  {
    Builder B("Concat axis 0 [3,5]+[4,5]");
    int A = B.fin("A", {3, 5});
    int C = B.fin("C", {4, 5});
    B.out(B.opf("Concat", {A, C}, "Y", {7, 5}, {{"axis", int64_t{0}}}), true);
    cs.push_back(B.done(70));
  }
  {
    Builder B("Concat axis 1 [5,3]+[5,4]+[5,2]");
    int A = B.fin("A", {5, 3});
    int C = B.fin("C", {5, 4});
    int D = B.fin("D", {5, 2});
    B.out(B.opf("Concat", {A, C, D}, "Y", {5, 9}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(70));
  }
  {
    Builder B("Concat axis -1 [2,3,4]+[2,3,5]");
    int A = B.fin("A", {2, 3, 4});
    int C = B.fin("C", {2, 3, 5});
    B.out(B.opf("Concat", {A, C}, "Y", {2, 3, 9}, {{"axis", int64_t{-1}}}), true);
    cs.push_back(B.done(70));
  }
  auto slice = [&](const std::string& nm, Shape in, std::vector<int64_t> st, std::vector<int64_t> en,
                   std::vector<int64_t> ax, std::vector<int64_t> sp, Shape out) {
    Builder B("Slice " + nm + " " + shape_str(in) + " starts=" + shape_str(st) + " ends=" + shape_str(en) +
              " axes=" + shape_str(ax) + " steps=" + shape_str(sp));
    int X = B.fin("X", in);
    std::vector<int> ins = {X, B.ints("starts", st), B.ints("ends", en)};
    if (!ax.empty()) ins.push_back(B.ints("axes", ax));
    if (!sp.empty()) ins.push_back(B.ints("steps", sp));
    B.out(B.opf("Slice", ins, "Y", out), true);
    cs.push_back(B.done());
  };
  slice("step2+neg", {7, 9}, {1, -7}, {6, 100}, {0, 1}, {2, 1}, {3, 7});
  slice("reverse", {5, 9}, {-1}, {std::numeric_limits<int64_t>::min()}, {1}, {-2}, {5, 5});
  slice("full-reverse", {5, 7}, {-1}, {-100}, {1}, {-1}, {5, 7});
  slice("unsplit-dim-only", {6, 9}, {2}, {-2}, {1}, {}, {6, 5});
  slice("no-op", {5, 7}, {0}, {7}, {1}, {1}, {5, 7});
  slice("default-axes", {7, 5}, {2}, {5}, {}, {}, {3, 5});
  slice("3-D neg axis", {3, 5, 7}, {1, 0}, {5, 7}, {-2, -1}, {1, 3}, {3, 4, 3});
  {
    Builder B("Split axis 0 sizes [3,4] [7,6]");
    int X = B.fin("X", {7, 6});
    auto o =
        B.op("Split", {X, B.ints("split", {3, 4})}, {{"Y0", F32, {3, 6}}, {"Y1", F32, {4, 6}}}, {{"axis", int64_t{0}}});
    B.out(o[0], true);
    B.out(o[1]);
    cs.push_back(B.done());
  }
  {
    Builder B("Split axis 1 equal 3 outputs [5,9]");
    int X = B.fin("X", {5, 9});
    auto o =
        B.op("Split", {X}, {{"Y0", F32, {5, 3}}, {"Y1", F32, {5, 3}}, {"Y2", F32, {5, 3}}}, {{"axis", int64_t{1}}});
    for (int v : o) B.out(v);
    cs.push_back(B.done());
  }
  {
    Builder B("Split axis -1 sizes [2,3,4] [3,5,9]");
    int X = B.fin("X", {3, 5, 9});
    auto o = B.op("Split", {X, B.ints("split", {2, 3, 4})},
                  {{"Y0", F32, {3, 5, 2}}, {"Y1", F32, {3, 5, 3}}, {"Y2", F32, {3, 5, 4}}}, {{"axis", int64_t{-1}}});
    for (int v : o) B.out(v, v == o[2]);
    cs.push_back(B.done());
  }
  {
    Builder B("Split opset 13 axis 0 equal [8,5]", 13);
    int X = B.fin("X", {8, 5});
    auto o = B.op("Split", {X}, {{"Y0", F32, {4, 5}}, {"Y1", F32, {4, 5}}}, {{"axis", int64_t{0}}});
    for (int v : o) B.out(v);
    cs.push_back(B.done());
  }
  run_all("Concat/Slice/Split", cs);
}

// Ops whose operands hold a result shape or sizes (docs/partitioning.md): Resize's `sizes`, Expand's and Reshape's
// `shape`, Tile's `repeats`, ConstantOfShape's and Range's operands, given as constants and computed from the input
// by Shape / Gather / Concat (torchvision's segmentation heads: Resize to Concat(Shape(x)[0:2], [H, W])). Every
// sharding of the input (batch, channel, row, column splits, even and uneven) must give the unpartitioned result.
TEST(OpsPartition, ShapeOperands) {
  std::vector<Case> cs;
  const std::map<std::string, AttrValue> nearest = {{"mode", std::string("nearest")}};
  auto resize = [&](const std::string& nm, Shape in, Shape sizes, bool computed,
                    std::map<std::string, AttrValue> attrs) {
    Builder B("Resize " + nm + " " + shape_str(in) + " sizes=" + shape_str(sizes) +
              (computed ? " (computed from Shape)" : ""));
    int X = B.fin("X", in);
    int S = -1;
    if (computed) {  // Concat(Shape(X)[0:2], sizes[2:]): the batch and channel from the input
      int shp = B.op1("Shape", {X}, "shape", I64, {static_cast<int64_t>(in.size())});
      int nc = B.op1("Slice", {shp, B.ints("s0", {0}), B.ints("s1", {2})}, "nc", I64, {2});
      int hw = B.ints("hw", {sizes.begin() + 2, sizes.end()});
      S = B.op1("Concat", {nc, hw}, "sizes", I64, {static_cast<int64_t>(sizes.size())}, {{"axis", int64_t{0}}});
    } else {
      S = B.ints("sizes", sizes);
    }
    int roi = B.init("roi", Tensor(F32, {0})), scales = B.init("scales", Tensor(F32, {0}));
    B.out(B.opf("Resize", {X, roi, scales, S}, "Y", sizes, attrs), true);
    cs.push_back(B.done(40));
  };
  resize("nearest 2x", {4, 3, 6, 5}, {4, 3, 12, 10}, false, nearest);
  resize("nearest 2x", {4, 3, 6, 5}, {4, 3, 12, 10}, true, nearest);
  resize("linear rows kept", {5, 2, 6, 4}, {5, 2, 6, 7}, false, {{"mode", std::string("linear")}});
  resize("linear rows kept", {5, 2, 6, 4}, {5, 2, 6, 7}, true, {{"mode", std::string("linear")}});
  resize("same size", {3, 2, 5, 4}, {3, 2, 5, 4}, false, {{"mode", std::string("linear")}});
  {
    Builder B("Expand [5,1,4] to Concat(Shape(X)[0:1], [3], Shape(X)[2:3])");
    int X = B.fin("X", {5, 1, 4});
    int shp = B.op1("Shape", {X}, "shape", I64, {3});
    int a = B.op1("Gather", {shp, B.ints("i0", {0})}, "a", I64, {1}, {{"axis", int64_t{0}}});
    int c = B.op1("Gather", {shp, B.ints("i2", {2})}, "c", I64, {1}, {{"axis", int64_t{0}}});
    int S = B.op1("Concat", {a, B.ints("three", {3}), c}, "target", I64, {3}, {{"axis", int64_t{0}}});
    B.out(B.opf("Expand", {X, S}, "Y", {5, 3, 4}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Expand [6,1] constant shape [2,6,5]");
    int X = B.fin("X", {6, 1});
    B.out(B.opf("Expand", {X, B.ints("shape", {2, 6, 5})}, "Y", {2, 6, 5}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Reshape [5,6,4] to Concat(Shape(X)[0:1], [-1])");
    int X = B.fin("X", {5, 6, 4});
    int shp = B.op1("Shape", {X}, "shape", I64, {3});
    int n = B.op1("Slice", {shp, B.ints("s0", {0}), B.ints("s1", {1})}, "n", I64, {1});
    int S = B.op1("Concat", {n, B.ints("rest", {-1})}, "target", I64, {2}, {{"axis", int64_t{0}}});
    B.out(B.opf("Reshape", {X, S}, "Y", {5, 24}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Tile [5,3,4] repeats [1,2,1]");
    int X = B.fin("X", {5, 3, 4});
    B.out(B.opf("Tile", {X, B.ints("repeats", {1, 2, 1})}, "Y", {5, 6, 4}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("ConstantOfShape(Shape(X)) + X [5,4,3]");
    int X = B.fin("X", {5, 4, 3});
    int shp = B.op1("Shape", {X}, "shape", I64, {3});
    int Z = B.opf("ConstantOfShape", {shp}, "Z", {5, 4, 3}, {{"value", Tensor::from_floats({1}, {0.5f})}});
    B.out(B.opf("Add", {X, Z}, "Y", {5, 4, 3}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Range(0, Shape(X)[1]) + X [5,7]");
    int X = B.fin("X", {5, 7});
    int shp = B.op1("Shape", {X}, "shape", I64, {2});
    int lim =
        B.op1("Gather", {shp, B.init("one", Tensor::from_int64s({1}, true))}, "limit", I64, {}, {{"axis", int64_t{0}}});
    int R = B.op1("Range",
                  {B.init("zero", Tensor::from_int64s({0}, true)), lim, B.init("step", Tensor::from_int64s({1}, true))},
                  "r", I64, {7});
    int Rf = B.opf("Cast", {R}, "rf", {7}, {{"to", int64_t{1}}});
    B.out(B.opf("Add", {X, Rf}, "Y", {5, 7}), true);
    cs.push_back(B.done());
  }
  run_all("Shape operands (Resize/Expand/Reshape/Tile/ConstantOfShape/Range)", cs);
}

// The pipeline's stage shift (core/ir/shift_op.h) under every sharding of its state: the stage dim split one row
// per device (a collective-permute, cyclic with wrap; the leaving row a partial sum, here added to another value),
// split otherwise or not at all (gathered, shifted locally); both directions, with and without an entering row.
TEST(OpsPartition, PipelineShift) {
  std::vector<Case> cases;
  for (int64_t S : {2, 3, 4})
    for (int64_t shift : {1, -1})
      for (int64_t wrap : {0, 1})
        for (bool with_in : {true, false}) {
          Builder b("shift_S" + std::to_string(S) + (shift > 0 ? "_fwd" : "_back") + (wrap ? "_wrap" : "") +
                    (with_in ? "_in" : ""));
          const int x = b.fin("x", {S, 3, 2});
          std::vector<int> ins{x};
          if (with_in) ins.push_back(b.fin("in", {1, 3, 2}));
          const std::vector<int> r =
              b.op("Shift", ins, {{"y", F32, {S, 3, 2}}, {"out", F32, {1, 3, 2}}}, {{"shift", shift}, {"wrap", wrap}});
          b.c.g.nodes.back().domain = kPipelineDomain;
          b.out(b.opf("Relu", {r[0]}, "y_relu", {S, 3, 2}));
          b.out(b.opf("Add", {r[1], b.weight("w", {1, 3, 2}, false)}, "out_plus", {1, 3, 2}));
          cases.push_back(b.done(12));
        }
  run_all("pipeline shift", cases);
}

TEST(OpsPartition, Gather) {
  std::vector<Case> cs;
  {
    Builder B("Gather axis 0 table[7,6] ids[3,4]");
    int T = B.fin("table", {7, 6});
    int I = B.in("ids", I64, {3, 4}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {T, I}, "Y", {3, 4, 6}, {{"axis", int64_t{0}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 0 weight table[9,5] ids[5]");
    int T = B.weight("table", {9, 5});
    int I = B.in("ids", I64, {5}, {Gen::kIds, 9});
    B.out(B.opf("Gather", {T, I}, "Y", {5, 5}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 0 negative ids table[7,4] ids[2,5]");
    int T = B.fin("table", {7, 4});
    int I = B.in("ids", I64, {2, 5}, {Gen::kIdsSigned, 7});
    B.out(B.opf("Gather", {T, I}, "Y", {2, 5, 4}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 0 int32 ids table[7,4] ids[6]");
    int T = B.fin("table", {7, 4});
    int I = B.in("ids", DType::kInt32, {6}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {T, I}, "Y", {6, 4}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 1 X[5,7,3] ids[4]");
    int X = B.fin("X", {5, 7, 3});
    int I = B.in("ids", I64, {4}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {X, I}, "Y", {5, 4, 3}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 1 X[5,7] ids[2,3]");
    int X = B.fin("X", {5, 7});
    int I = B.in("ids", I64, {2, 3}, {Gen::kIds, 7});
    B.out(B.opf("Gather", {X, I}, "Y", {5, 2, 3}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  {
    Builder B("Gather axis 1 scalar id X[5,7,3]");
    int X = B.fin("X", {5, 7, 3});
    int I = B.init("idx", Tensor::from_int64s({4}, true));
    B.out(B.opf("Gather", {X, I}, "Y", {5, 3}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(80));
  }
  run_all("Gather", cs);
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

// ---------------------------------------------------------------------------------------------------------------
// Smallest reproductions of the failures found by the sweeps above (kept failing until the partitioner is fixed).

/// Runs one case with the given annotations (value name -> sharding) and expects exact results.
SpmdProgram expect_exact(const Case& c, const DeviceMesh& mesh, std::vector<std::pair<std::string, TensorSharding>> a,
                         std::vector<Tensor> inputs = {}) {
  Annotations ann;
  ann.mesh = mesh;
  for (auto& [k, s] : a) ann.by_value[c.g.at(k)] = Annotation{s, 0, "t"};
  if (inputs.empty()) {
    std::mt19937 rng(20240601u);
    for (int v : c.g.inputs) inputs.push_back(make_input(c.g.values[v], c.gens.at(v), rng));
  }
  std::vector<Tensor> ref = run_single(c.g, inputs).outputs;
  SpmdProgram p;
  std::string why = run_one(c, ann, inputs, ref, &p);
  EXPECT_EQ(why, "") << describe(c, ann);
  return p;
}

TEST(OpsPartitionRepro, ReshardMovesAxisBetweenUnevenDims) {
  // X [3,5] split on dim 1 over x, needed split on dim 0 over x (both uneven, so no all-to-all): the per-dim planner
  // slices dim 0 over x (ShardSlice) *before* all-gathering dim 1 over x, so the gather concatenates pieces of
  // different rows.
  Builder B("Identity [3,5]");
  int X = B.fin("X", {3, 5});
  B.out(B.opf("Identity", {X}, "Y", {3, 5}));
  expect_exact(B.done(), mesh_of({2}), {{"X", spec(2, {{}, {0}})}, {"Y", spec(2, {{0}, {}})}});
}

TEST(OpsPartitionRepro, ReduceMaxOverSplitDim) {
  // ReduceMax over a split dim: the result is unreduced (max); the all-reduce leaves TensorSharding::reduction = max
  // with no unreduced axes, so it never equals the target (reduction = sum): "reshard of 'Y' did not reach its target".
  Builder B("ReduceMax [4] all axes");
  int X = B.fin("X", {4});
  B.out(B.opf("ReduceMax", {X}, "Y", {}, {{"keepdims", int64_t{0}}}));
  expect_exact(B.done(), mesh_of({2}), {{"X", spec(1, {{0}})}});
}

TEST(OpsPartitionRepro, GatherNegativeIdsVocabSplit) {
  // Vocab-parallel Gather with negative ids (valid in ONNX: -1 = last row): the lowering subtracts the offset without
  // normalising negative ids first, so their rows come out as zeros.
  Builder B("Gather table[4,2] ids[3]");
  int T = B.fin("table", {4, 2});
  int I = B.in("ids", I64, {3}, {Gen::kIdsSigned, 4});
  B.out(B.opf("Gather", {T, I}, "Y", {3, 2}));
  Case c = B.done();
  Tensor ids = Tensor::from_int64s({-1, 1, -4});
  Tensor table = Tensor::from_floats({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  expect_exact(c, mesh_of({2}), {{"table", spec(2, {{0}, {}})}}, {table, ids});
}

TEST(OpsPartitionRepro, SqueezeWithoutAxesOnSplitDim) {
  // Squeeze with no axes input squeezes every size-1 dim of its *local* input: X [3,1,5] split on dim 0 over 3 has
  // local shape [1,1,5], and the local Squeeze drops dim 0 too.
  Builder B("Squeeze [3,1,5] no axes");
  int X = B.fin("X", {3, 1, 5});
  B.out(B.opf("Squeeze", {X}, "Y", {3, 5}));
  expect_exact(B.done(), mesh_of({3}), {{"X", spec(3, {{0}, {}, {}})}});
}

TEST(OpsPartitionRepro, GemmBiasWithSplitK) {
  // Gemm with C and K split: every device adds beta*C to its partial product, so the all-reduce adds C n times.
  Builder B("Gemm A[4,6] B[6,3] C[3]");
  int A = B.fin("A", {4, 6});
  int W = B.fin("B", {6, 3});
  int C = B.fin("C", {3});
  B.out(B.opf("Gemm", {A, W, C}, "Y", {4, 3}));
  expect_exact(B.done(), mesh_of({2}), {{"A", spec(2, {{}, {0}})}, {"B", spec(2, {{0}, {}})}});
}

TEST(OpsPartitionRepro, OverSplitElementwiseNeedsNoCollectives) {
  // A and C [5,7] both split on dim 0 over {x, y} of a 2x3 mesh (6 tiles for 5 rows): the Add could run locally, but
  // the factor projection keeps only x, so both operands are all-gathered over y (numerically right, 2 collectives).
  Builder B("Add [5,7]");
  int A = B.fin("A", {5, 7});
  int C = B.fin("C", {5, 7});
  B.out(B.opf("Add", {A, C}, "Y", {5, 7}));
  SpmdProgram p = expect_exact(B.done(), mesh_of({2, 3}), {{"A", spec(2, {{0, 1}, {}})}, {"C", spec(2, {{0, 1}, {}})}});
  EXPECT_EQ(p.collectives.size(), 0u) << collectives_str(p);
}

// Shape and Size read only their operand's static global shape: a constant on every device, whatever the split, and
// never a collective (before, the operand was gathered).
TEST(OpsPartition, ShapeAndSizeMoveNothing) {
  for (const char* op : {"Shape", "Size"}) {
    Builder B(std::string(op) + " of a split value");
    int X = B.fin("X", {5, 6, 7});
    const bool size = std::string(op) == "Size";
    int Y = B.op1(op, {X}, "Y", I64, size ? Shape{} : Shape{2},
                  size ? std::map<std::string, AttrValue>{} : std::map<std::string, AttrValue>{{"start", int64_t{-2}}});
    B.out(Y);
    B.out(B.opf("Relu", {X}, "Z", {5, 6, 7}));
    Case c = B.done();
    for (const DeviceMesh& mesh : all_meshes())
      for (const TensorSharding& s : all_shardings(3, mesh)) {
        const SpmdProgram p = expect_exact(c, mesh, {{"X", s}});
        EXPECT_EQ(p.collectives.size(), 0u) << op << " " << s.to_partition_spec(mesh) << collectives_str(p);
      }
  }
}

}  // namespace
}  // namespace gspmd
