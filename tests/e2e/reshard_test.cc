// The reshard planner (core/partition/reshard.h, emitted by reshard() in partition.cc), tested through the public entry
// point: a graph `y = Identity(x)` with a hand-made ShardingPlan (x: FROM, y: TO) is partitioned and run on the
// emulated pod; the assembled output must equal x exactly (resharding is data movement plus sums with zeros), and the
// collectives the program records must be the planner's plan.
//
// How the reshard is reached: the Identity node takes its factor assignment from y's planned sharding (TO) first and
// then fills the dims TO leaves unsplit from x's sharding (FROM) where those axes are free; call the result F. x is
// resharded FROM -> F (as the Identity's operand; its unreduced axes stay unreduced when F does not use them) and y
// is resharded F -> TO at the graph output. So every (FROM, TO) pair is one reshard or the composition of two; the
// exhaustive test reports how many pairs hit reshard() directly and how many distinct (from, to) pairs reshard()
// itself saw.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/pod/pod.h"
#include "core/ir/ir.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/sharding/sharding.h"

using namespace gspmd;

namespace {

// ---- building and running one reshard ---------------------------------------------------------------------------

Graph identity_graph(const Shape& shape) {
  Graph g;
  g.name = "reshard";
  Value x;
  x.name = "x";
  x.dtype = DType::kFloat32;
  x.shape = shape;
  int xv = g.add_value(x);
  Value y = x;
  y.name = "y";
  int yv = g.add_value(y);
  Node n;
  n.name = "id";
  n.op_type = "Identity";
  n.inputs = {xv};
  n.outputs = {yv};
  g.add_node(n);
  g.inputs = {xv};
  g.outputs = {yv};
  g.verify();
  return g;
}

ShardingPlan plan_of(const Graph& g, const TensorSharding& from, const TensorSharding& to) {
  ShardingPlan p;
  p.shardings.resize(g.values.size());
  p.origins.resize(g.values.size());
  p.shardings[g.at("x")] = from;
  p.shardings[g.at("y")] = to;
  return p;
}

/// x[i] = i + 1 (every element distinct and exactly representable).
Tensor iota(const Shape& shape) {
  std::vector<float> v(num_elements(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1);
  return Tensor::from_floats(shape, v);
}

std::string axes_names(const DeviceMesh& mesh, const std::vector<int>& axes) {
  std::vector<std::string> n;
  for (int a : axes) n.push_back(mesh.axes[a]);
  return fmt::format("{{{}}}", fmt::join(n, ","));
}

/// "all-to-all{x} 128B; all-gather{y} 256B" (empty when no collectives).
std::string collectives_str(const SpmdProgram& p) {
  std::vector<std::string> s;
  for (const CollectiveRecord& c : p.collectives)
    s.push_back(fmt::format("{}{} {}B", collective_name(c.kind), axes_names(p.mesh, c.mesh_axes), c.bytes));
  return fmt::format("{}", fmt::join(s, "; "));
}

/// The program's ops in order, for the report: "ShardSlice, AllGather, Slice".
std::string ops_str(const SpmdProgram& p) {
  std::vector<std::string> s;
  for (const Node& n : p.program.nodes) s.push_back(n.op_type);
  return fmt::format("{}", fmt::join(s, ", "));
}

std::string case_name(const DeviceMesh& mesh, const Shape& shape, const TensorSharding& from,
                      const TensorSharding& to) {
  return fmt::format("mesh {} shape {}: {} -> {}", mesh.str(), shape_str(shape), from.to_partition_spec(mesh),
                     to.to_partition_spec(mesh));
}

/// Compares two float tensors exactly; "" when equal, else a description of the first differences.
std::string exact_diff(const Tensor& got, const Tensor& want) {
  if (got.dtype != want.dtype) return fmt::format("dtype {} != {}", dtype_name(got.dtype), dtype_name(want.dtype));
  if (got.shape != want.shape) return fmt::format("shape {} != {}", shape_str(got.shape), shape_str(want.shape));
  const float* a = got.data<float>();
  const float* b = want.data<float>();
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    if (bad < 6) first += fmt::format(" [{}]={} (want {})", i, a[i], b[i]);
    ++bad;
  }
  if (!bad) return "";
  return fmt::format("{} of {} elements differ:{}{}", bad, want.numel(), first, bad > 6 ? " ..." : "");
}

struct Outcome {
  std::string error;  // partition / run exception or wrong numbers ("" = exact)
  SpmdProgram program;
};

/// Partitions y = Identity(x) for FROM -> TO and (when `run`) runs it and checks the output is x exactly.
Outcome reshard_case(const DeviceMesh& mesh, const Shape& shape, const TensorSharding& from, const TensorSharding& to,
                     bool run = true) {
  Outcome o;
  Graph g = identity_graph(shape);
  ShardingPlan plan = plan_of(g, from, to);
  try {
    o.program = partition(g, plan, mesh);
  } catch (const std::exception& e) {
    o.error = fmt::format("partition threw: {}", e.what());
    return o;
  }
  TensorSharding out = to;
  out.unreduced.clear();
  if (o.program.outputs.size() != 1 || !(o.program.outputs[0].sharding == out)) {
    o.error = "output binding does not have the target sharding";
    return o;
  }
  if (!run) return o;
  Tensor xt = iota(shape);
  try {
    PodRun r = run_spmd(o.program, g, {xt});
    if (r.outputs.size() != 1) {
      o.error = fmt::format("run gave {} outputs", r.outputs.size());
      return o;
    }
    std::string d = exact_diff(r.outputs[0], xt);
    if (!d.empty()) o.error = "wrong output: " + d;
  } catch (const std::exception& e) {
    o.error = fmt::format("run_spmd threw: {}", e.what());
  }
  return o;
}

// ---- enumerating shardings ----------------------------------------------------------------------------------------

/// Every tiled sharding of a rank-`rank` tensor over `mesh`: each mesh axis unused or on one dim, every order of the
/// axes within a dim.
std::vector<TensorSharding> all_tiled(const DeviceMesh& mesh, int rank) {
  std::vector<TensorSharding> out;
  const int k = mesh.rank();
  std::vector<int> where(k, -1);  // axis -> dim or -1
  std::function<void(int)> assign = [&](int a) {
    if (a == k) {
      std::vector<std::vector<int>> dims(rank);
      for (int ax = 0; ax < k; ++ax)
        if (where[ax] >= 0) dims[where[ax]].push_back(ax);
      // every permutation of each dim's axes
      std::function<void(int, std::vector<std::vector<int>>&)> perm = [&](int d, std::vector<std::vector<int>>& cur) {
        if (d == rank) {
          TensorSharding s = TensorSharding::replicated(rank);
          s.dims = cur;
          out.push_back(s);
          return;
        }
        std::vector<int> axes = dims[d];
        std::sort(axes.begin(), axes.end());
        do {
          cur[d] = axes;
          perm(d + 1, cur);
        } while (std::next_permutation(axes.begin(), axes.end()));
      };
      std::vector<std::vector<int>> cur(rank);
      perm(0, cur);
      return;
    }
    for (int d = -1; d < rank; ++d) {
      where[a] = d;
      assign(a + 1);
    }
  };
  assign(0);
  return out;
}

/// `tiled` plus every sum-unreduced variant over its unused axes.
std::vector<TensorSharding> with_unreduced(const DeviceMesh& mesh, const std::vector<TensorSharding>& tiled) {
  std::vector<TensorSharding> out;
  for (const TensorSharding& t : tiled) {
    std::vector<int> unused;
    std::vector<int> used = t.tiled_axes();
    for (int a = 0; a < mesh.rank(); ++a)
      if (std::find(used.begin(), used.end(), a) == used.end()) unused.push_back(a);
    for (uint32_t m = 0; m < (1u << unused.size()); ++m) {
      TensorSharding s = t;
      for (size_t i = 0; i < unused.size(); ++i)
        if (m & (1u << i)) s.unreduced.push_back(unused[i]);
      s.reduction = ReductionKind::kSum;
      out.push_back(s);
    }
  }
  return out;
}

/// True when every device's TO shard lies inside the FROM shard it already holds (and nothing is unreduced): the
/// reshard needs no communication at all.
bool communication_free(const DeviceMesh& mesh, const Shape& shape, const TensorSharding& from,
                        const TensorSharding& to) {
  if (!from.unreduced.empty()) return false;
  for (int64_t k = 0; k < mesh.num_devices(); ++k)
    for (int d = 0; d < from.rank(); ++d) {
      int64_t tv = to.valid(d, shape, mesh, k);
      if (tv == 0) continue;
      int64_t to0 = to.offset(d, shape, mesh, k), f0 = from.offset(d, shape, mesh, k);
      int64_t fv = from.valid(d, shape, mesh, k);
      if (to0 < f0 || to0 + tv > f0 + fv) return false;
    }
  return true;
}

/// The assignment F the Identity node computes in (see the header comment), and whether x's unreduced axes stay
/// unreduced through it.
std::pair<TensorSharding, bool> identity_assignment(const TensorSharding& from, const TensorSharding& to) {
  TensorSharding f = TensorSharding::replicated(to.rank());
  std::vector<int> to_axes = to.tiled_axes();
  auto in_to = [&](int a) { return std::find(to_axes.begin(), to_axes.end(), a) != to_axes.end(); };
  for (int d = 0; d < to.rank(); ++d) {
    if (!to.dims[d].empty())
      f.dims[d] = to.dims[d];
    else if (std::none_of(from.dims[d].begin(), from.dims[d].end(), in_to))
      f.dims[d] = from.dims[d];
  }
  bool kept = std::none_of(from.unreduced.begin(), from.unreduced.end(), in_to);
  return {f, kept && !from.unreduced.empty()};
}

/// True when reshard()'s per-dim step (3.) would slice dim d over an axis that a later dim d' > d of `from` still
/// holds (it is gathered only when dim d' is processed, after the slice). The all-to-all step is ignored.
bool slice_before_gather(const DeviceMesh& mesh, const Shape& shape, const TensorSharding& from,
                         const TensorSharding& to) {
  for (int d = 0; d < from.rank(); ++d) {
    const auto& cd = from.dims[d];
    const auto& wd = to.dims[d];
    size_t p = 0;
    while (p < cd.size() && p < wd.size() && cd[p] == wd[p]) ++p;
    if (shape[d] % mesh.axes_size(cd) != 0 || shape[d] % mesh.axes_size(wd) != 0) p = 0;
    for (size_t i = p; i < wd.size(); ++i)
      for (int e = d + 1; e < from.rank(); ++e)
        if (std::find(from.dims[e].begin(), from.dims[e].end(), wd[i]) != from.dims[e].end()) return true;
  }
  return false;
}

// ---- 1. exhaustive --------------------------------------------------------------------------------------------------

struct Stats {
  int64_t slice_before_gather_failures = 0;
  int64_t pairs = 0, direct = 0, with_unreduced = 0, free_pairs = 0, free_but_communicated = 0;
  std::map<size_t, int64_t> collectives_hist;
  std::set<std::string> reshard_pairs_seen;  // distinct (from, to) handed to reshard()
  std::vector<std::string> failures;
  std::vector<std::string> free_but_communicated_examples;
};

void exhaustive(const DeviceMesh& mesh, const Shape& shape, Stats& st, double sample = 1.0, uint32_t seed = 1) {
  const int rank = static_cast<int>(shape.size());
  std::vector<TensorSharding> to_all = all_tiled(mesh, rank);
  std::vector<TensorSharding> from_all = with_unreduced(mesh, to_all);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (const TensorSharding& from : from_all)
    for (const TensorSharding& to : to_all) {
      if (sample < 1.0 && coin(rng) >= sample) continue;
      const std::string name = case_name(mesh, shape, from, to);
      ++st.pairs;
      if (!from.unreduced.empty()) ++st.with_unreduced;
      auto [f, kept] = identity_assignment(from, to);
      TensorSharding mid = f;
      if (kept) mid.unreduced = from.unreduced;
      bool op_identity = mid == from, out_identity = mid == to;
      if (op_identity || out_identity) ++st.direct;
      std::string key = fmt::format("{} {}: ", mesh.str(), shape_str(shape));
      if (!op_identity)
        st.reshard_pairs_seen.insert(key + from.to_partition_spec(mesh) + " -> " + mid.to_partition_spec(mesh));
      if (!out_identity)
        st.reshard_pairs_seen.insert(key + mid.to_partition_spec(mesh) + " -> " + to.to_partition_spec(mesh));

      Outcome o = reshard_case(mesh, shape, from, to);
      if (!o.error.empty()) {
        bool hazard = (!op_identity && slice_before_gather(mesh, shape, from, mid)) ||
                      (!out_identity && slice_before_gather(mesh, shape, mid, to));
        if (hazard) ++st.slice_before_gather_failures;
        st.failures.push_back(name + ": " + o.error + " [collectives: " + collectives_str(o.program) + "]" +
                              (hazard ? " [slices a dim over an axis a later dim still holds]" : ""));
        continue;
      }
      // The Identity computed in F (with x's unreduced axes when they stay unreduced), as modelled above.
      const TensorSharding& computed = o.program.final_shardings.at(1);
      if (!(computed == mid))
        st.failures.push_back(name + ": Identity computed in " + computed.to_partition_spec(mesh) + ", expected " +
                              mid.to_partition_spec(mesh));
      st.collectives_hist[o.program.collectives.size()]++;
      for (const CollectiveRecord& c : o.program.collectives)
        if (c.mesh_axes.empty() || c.bytes <= 0)
          st.failures.push_back(
              fmt::format("{}: collective {} with no axes or no bytes", name, collective_name(c.kind)));
      bool free = communication_free(mesh, shape, from, to);
      if (free) ++st.free_pairs;
      // Refinement by appending axes to even dims must be a local slice.
      bool even_refinement = from.unreduced.empty();
      for (int d = 0; d < rank && even_refinement; ++d) {
        const auto& fd = from.dims[d];
        const auto& td = to.dims[d];
        even_refinement = td.size() >= fd.size() && std::equal(fd.begin(), fd.end(), td.begin()) &&
                          (fd.empty() || shape[d] % to.shards(d, mesh) == 0);
      }
      if (even_refinement && !o.program.collectives.empty())
        st.failures.push_back(name + ": an even refinement must be communication-free, got " +
                              collectives_str(o.program));
      if (free && !o.program.collectives.empty()) {
        ++st.free_but_communicated;
        if (st.free_but_communicated_examples.size() < 8)
          st.free_but_communicated_examples.push_back(name + ": " + collectives_str(o.program));
      }
      if (!free && o.program.collectives.empty())
        st.failures.push_back(name + ": needs communication but the program has no collectives");
    }
}

TEST(Reshard, ExhaustivePairsSmallUnevenShapes) {
  struct Config {
    const char* mesh;
    std::vector<Shape> shapes;
  };
  const std::vector<Config> configs = {
      {"2", {{5, 6}, {7, 9}, {4, 6}, {3, 4, 5}}},
      {"3", {{5, 6}, {7, 9}, {4, 6}, {3, 4, 5}}},
      {"2x2", {{5, 6}, {7, 9}, {8, 12}, {3, 4, 5}}},
      {"2x3", {{5, 6}, {7, 9}, {12, 12}, {3, 4, 5}}},
      {"2x2x2", {{5, 6}, {7, 9}, {8, 12}, {3, 4, 5}, {4, 8, 2}}},
  };
  auto t0 = std::chrono::steady_clock::now();
  Stats total;
  std::ostringstream per;
  for (const Config& c : configs) {
    DeviceMesh mesh = DeviceMesh::parse(c.mesh);
    for (const Shape& s : c.shapes) {
      Stats st;
      auto t1 = std::chrono::steady_clock::now();
      exhaustive(mesh, s, st);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      per << fmt::format(
          "  mesh {:<6} shape {:<8} pairs {:>6} (FROM unreduced {:>5}) direct {:>6} "
          "distinct reshard() pairs {:>6} free {:>5} free-but-communicated {:>4} failures {:>5} "
          "{:.2f}s\n",
          c.mesh, shape_str(s), st.pairs, st.with_unreduced, st.direct, st.reshard_pairs_seen.size(), st.free_pairs,
          st.free_but_communicated, st.failures.size(), secs);
      total.pairs += st.pairs;
      total.direct += st.direct;
      total.with_unreduced += st.with_unreduced;
      total.free_pairs += st.free_pairs;
      total.slice_before_gather_failures += st.slice_before_gather_failures;
      total.free_but_communicated += st.free_but_communicated;
      for (auto [n, k] : st.collectives_hist) total.collectives_hist[n] += k;
      total.reshard_pairs_seen.insert(st.reshard_pairs_seen.begin(), st.reshard_pairs_seen.end());
      total.failures.insert(total.failures.end(), st.failures.begin(), st.failures.end());
      for (const auto& e : st.free_but_communicated_examples)
        if (total.free_but_communicated_examples.size() < 12) total.free_but_communicated_examples.push_back(e);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[reshard] exhaustive:\n" << per.str();
  std::cout << fmt::format(
      "[reshard] total pairs {} (FROM unreduced {}), direct {}, distinct reshard() pairs {}, "
      "communication-free {} of which communicated {}, failures {}, {:.1f}s\n",
      total.pairs, total.with_unreduced, total.direct, total.reshard_pairs_seen.size(), total.free_pairs,
      total.free_but_communicated, total.failures.size(), secs);
  std::cout << "[reshard] collectives per pair:";
  for (auto [n, k] : total.collectives_hist) std::cout << fmt::format(" {}:{}", n, k);
  std::cout << "\n";
  std::cout << fmt::format("[reshard] failures with a slice-before-gather step: {} of {}\n",
                           total.slice_before_gather_failures, total.failures.size());
  {
    std::filesystem::path dir = std::filesystem::path(GSPMD_BINARY_DIR) / "e2e-scratch" / "reshard";
    std::filesystem::create_directories(dir);
    std::ofstream f(dir / "failures.txt");
    for (const auto& e : total.failures) f << e << "\n";
    std::cout << "[reshard] all failures: " << (dir / "failures.txt").string() << "\n";
  }
  for (const auto& e : total.free_but_communicated_examples)
    std::cout << "[reshard] free but communicated: " << e << "\n";
  std::ostringstream msg;
  for (size_t i = 0; i < total.failures.size() && i < 60; ++i) msg << "  " << total.failures[i] << "\n";
  EXPECT_EQ(total.failures.size(), 0u) << "failing pairs (first 60):\n" << msg.str();
  EXPECT_GT(total.pairs, 10000);
}

// ---- 2. analytic expectations ---------------------------------------------------------------------------------------

/// Builds a sharding from per-dim axis names ("" = unsplit) and unreduced axis names.
TensorSharding S(const DeviceMesh& mesh, std::vector<std::vector<std::string>> dims,
                 std::vector<std::string> unreduced = {}) {
  TensorSharding s = TensorSharding::replicated(static_cast<int>(dims.size()));
  for (size_t d = 0; d < dims.size(); ++d)
    for (const auto& a : dims[d]) s.dims[d].push_back(mesh.axis_index(a));
  for (const auto& a : unreduced) s.unreduced.push_back(mesh.axis_index(a));
  std::sort(s.unreduced.begin(), s.unreduced.end());
  s.verify(mesh, static_cast<int>(dims.size()));
  return s;
}

struct Expect {
  std::vector<std::vector<std::string>> from;
  std::vector<std::string> from_unreduced;
  std::vector<std::vector<std::string>> to;
  std::string collectives;  // collectives_str of the expected plan
};

void check_analytic(const char* mesh_text, const Shape& shape, const Expect& e) {
  DeviceMesh mesh = DeviceMesh::parse(mesh_text);
  TensorSharding from = S(mesh, e.from, e.from_unreduced), to = S(mesh, e.to);
  std::string name = case_name(mesh, shape, from, to);
  Outcome o = reshard_case(mesh, shape, from, to);
  EXPECT_EQ(o.error, "") << name;
  EXPECT_EQ(collectives_str(o.program), e.collectives) << name << "\n  program ops: " << ops_str(o.program);
}

TEST(Reshard, AnalyticPlansEven8x8On2x2) {
  const Shape sh = {8, 8};  // float32: a [4,8] shard is 128 B, the full tensor 256 B
  std::vector<Expect> cases = {
      // moving a split between dims: one all-to-all, [4,8] -> [8,4]
      {{{"x"}, {}}, {}, {{}, {"x"}}, "all-to-all{x} 128B"},
      {{{"x", "y"}, {}}, {}, {{}, {"x", "y"}}, "all-to-all{x,y} 64B"},
      {{{"x"}, {"y"}}, {}, {{}, {"y", "x"}}, "all-to-all{x} 64B"},
      // dropping splits: all-gather
      {{{"x"}, {}}, {}, {{}, {}}, "all-gather{x} 256B"},
      {{{"x", "y"}, {}}, {}, {{"x"}, {}}, "all-gather{y} 128B"},
      {{{"x", "y"}, {}}, {}, {{}, {}}, "all-gather{x,y} 256B"},
      {{{"x"}, {"y"}}, {}, {{}, {}}, "all-gather{y} 128B; all-gather{x} 256B"},  // either order costs the same
      // adding splits: local slices only
      {{{}, {}}, {}, {{"x"}, {}}, ""},
      {{{}, {}}, {}, {{"x"}, {"y"}}, ""},
      {{{"x"}, {}}, {}, {{"x", "y"}, {}}, ""},
      {{{"x"}, {}}, {}, {{"x"}, {"y"}}, ""},
      // unreduced: all-reduce, or reduce-scatter when the target appends exactly the reduced axes to a dim
      {{{"x"}, {}}, {"y"}, {{"x"}, {}}, "all-reduce{y} 128B"},
      {{{"x"}, {}}, {"y"}, {{"x", "y"}, {}}, "reduce-scatter{y} 128B"},
      {{{}, {}}, {"x", "y"}, {{}, {}}, "all-reduce{x,y} 256B"},
      {{{}, {}}, {"x", "y"}, {{"x", "y"}, {}}, "reduce-scatter{x,y} 256B"},
      {{{}, {}}, {"y"}, {{}, {"y"}}, "reduce-scatter{y} 256B"},
  };
  for (const Expect& e : cases) check_analytic("2x2", sh, e);
}

TEST(Reshard, AnalyticPlansUneven) {
  // [5,6] on 2x2: dim 0 is uneven over x (shards of 3: [0,3) [3,5)), so it is gathered completely and trimmed.
  std::vector<Expect> cases = {
      {{{"x"}, {}}, {}, {{"y"}, {}}, "all-gather{x} 144B"},  // [3,6] -> [6,6]
      {{{"x"}, {}}, {}, {{}, {}}, "all-gather{x} 144B"},
      {{{"x"}, {}}, {}, {{"x", "y"}, {}}, "all-gather{x} 144B"},  // uneven refinement still needs data
      {{{}, {"x"}}, {}, {{}, {"x", "y"}}, "all-gather{x} 120B"},  // 6 over 4 is uneven: [5,3] -> [5,6]
      {{{}, {"x"}}, {}, {{}, {}}, "all-gather{x} 120B"},          // even dim: plain gather
      // Through Identity, x is sliced to [x,null] first (y stays unreduced: Identity is linear) and reduced at the
      // output, on the [3,6] shard: 72 B rather than 120 B.
      {{{}, {}}, {"y"}, {{"x"}, {}}, "all-reduce{y} 72B"},
      // Here the target uses x, so x is reduced at the operand. 5 rows do not reduce-scatter over x, but 6 columns
      // do over y: reduce-scatter y onto dim 1, all-reduce x on the half, all-gather y (the bandwidth-optimal
      // all-reduce), then slice x: 2*60 + 60 B over the links, against 2*120 B for all-reduce{x,y}.
      {{{}, {}}, {"x", "y"}, {{"x"}, {}}, "reduce-scatter{y} 120B; all-reduce{x} 60B; all-gather{y} 72B"},
  };
  for (const Expect& e : cases) check_analytic("2x2", {5, 6}, e);
}

/// [x,y] -> [y,x] (and friends): the axes trade places but every dim keeps its number of shards, so each device
/// sends its whole shard to one other device: one collective-permute (relayout form, spmd.h), even when uneven.
TEST(Reshard, SwapIsOneCollectivePermute) {
  struct Swap {
    const char* mesh;
    Shape shape;
    std::vector<std::vector<std::string>> from, to;
    const char* collectives;
  };
  std::vector<Swap> cases = {
      {"2x2", {8, 8}, {{"x"}, {"y"}}, {{"y"}, {"x"}}, "collective-permute{x,y} 64B"},
      {"2x2", {5, 6}, {{"x"}, {"y"}}, {{"y"}, {"x"}}, "collective-permute{x,y} 36B"},
      {"2x2", {8, 8}, {{"x", "y"}, {}}, {{"y", "x"}, {}}, "collective-permute{x,y} 64B"},
      {"2x4", {8, 8}, {{"x", "y"}, {}}, {{"y", "x"}, {}}, "collective-permute{x,y} 32B"},
      {"2x2x2", {8, 8, 8}, {{"x"}, {"y"}, {"z"}}, {{"z"}, {"x"}, {"y"}}, "collective-permute{x,y,z} 256B"},
      // 2 vs 3 shards per dim: not a permutation; gather x, move y's split with an all-to-all, slice x
      {"2x3", {12, 12}, {{"x"}, {"y"}}, {{"y"}, {"x"}}, "all-gather{x} 192B; all-to-all{y} 192B"},
  };
  for (const Swap& c : cases) {
    DeviceMesh mesh = DeviceMesh::parse(c.mesh);
    TensorSharding from = S(mesh, c.from), to = S(mesh, c.to);
    std::string name = case_name(mesh, c.shape, from, to);
    Outcome o = reshard_case(mesh, c.shape, from, to);
    EXPECT_EQ(o.error, "") << name << "\n  program ops: " << ops_str(o.program);
    EXPECT_EQ(collectives_str(o.program), c.collectives) << name;
  }
}

// ---- 3. program size does not depend on the device count
// -------------------------------------------------------------

TEST(Reshard, ProgramSizeIndependentOfDeviceCount) {
  DeviceMesh small = DeviceMesh::parse("2x2"), big = DeviceMesh::parse("16x16");
  ASSERT_EQ(big.num_devices(), 256);
  // The planner prices steps with the target's cost model, so the best plan may differ between meshes: on 16x16,
  // [512,512] unreduced={x} -> [[x,y],null] slices y first and reduce-scatters a 16x smaller shard, then permutes
  // [y,x] -> [x,y]; on 2x2 the direct reduce-scatter is cheaper. What must not grow with the device count is the
  // program: per dim at most all-gather, trim, slice, plus reductions, all-to-alls and a permute.
  int64_t checked = 0;
  for (const Shape& shape : {Shape{512, 512}, Shape{5, 7}}) {
    std::vector<TensorSharding> to_all = all_tiled(small, 2);
    std::vector<TensorSharding> from_all = with_unreduced(small, to_all);
    for (const TensorSharding& from : from_all)
      for (const TensorSharding& to : to_all) {
        std::string name = case_name(small, shape, from, to) + " vs 16x16";
        Outcome a = reshard_case(small, shape, from, to, /*run=*/false);
        Outcome b = reshard_case(big, shape, from, to, /*run=*/false);
        if (!a.error.empty() || !b.error.empty()) {
          ADD_FAILURE() << name << ": " << a.error << " / " << b.error;
          continue;
        }
        ++checked;
        const size_t bound = 3 * shape.size() + 2;
        EXPECT_LE(a.program.program.nodes.size(), bound) << name;
        EXPECT_LE(b.program.program.nodes.size(), bound) << name;
      }
  }
  EXPECT_EQ(checked, 2 * 18 * 11);  // rank 2 on a 2-axis mesh: 11 tiled shardings, 18 with unreduced variants
}

}  // namespace
