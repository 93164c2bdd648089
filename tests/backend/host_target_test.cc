// backend/profile: the measured "host" target (docs/cost-model.md, "The host preset").
#include <gtest/gtest.h>

#include <omp.h>
#include <unistd.h>

#include <cstdlib>

#include "backend/profile/host_target.h"
#include "core/cost/cost.h"
#include "core/partition/spmd.h"

namespace gspmd {
namespace {

TEST(HostTarget, MeasuredOnceWithPlausibleNumbers) {
  Target t = measure_host_target();
  EXPECT_EQ(t.name, "host");
  // Any x86-64 machine that runs this suite does between 1 GFLOP/s and 100 TFLOP/s of f32 matmul, and moves between
  // 100 MB/s and 10 TB/s: the measurement is a number of the right kind, not a placeholder.
  EXPECT_GT(t.peak_flops, 1e9);
  EXPECT_LT(t.peak_flops, 1e14);
  for (double bw : {t.hbm_bandwidth, t.link_bandwidth}) {
    EXPECT_GT(bw, 1e8);
    EXPECT_LT(bw, 1e13);
  }
  ASSERT_EQ(t.contraction_curve.size(), 5u);  // square matmuls of 64 .. 1024
  for (size_t i = 0; i < 5; ++i) {
    const double n = 64 << i;
    EXPECT_EQ(t.contraction_curve[i].first, 2 * n * n * n);
    if (i) EXPECT_GE(t.contraction_curve[i].second, t.contraction_curve[i - 1].second);
  }
  EXPECT_EQ(t.peak_flops, t.contraction_curve.back().second);
  EXPECT_GT(t.conv_efficiency, 0);
  EXPECT_LE(t.conv_efficiency, 1);
  EXPECT_GT(t.op_overhead, 1e-8);  // between 10 ns and 10 ms per executed node
  EXPECT_LT(t.op_overhead, 1e-2);
  EXPECT_EQ(t.hbm_bytes, static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(t.topology(), "ring");
  EXPECT_EQ(t.links_per_axis, 1);
  EXPECT_EQ(t.peak_for(DType::kFloat16), t.peak_flops);  // f16 kernels compute in f32 here
  // cached: the second call returns the same measurement
  Target again = measure_host_target();
  EXPECT_EQ(again.peak_flops, t.peak_flops);
  EXPECT_EQ(again.hbm_bandwidth, t.hbm_bandwidth);
}

/// x[8,32] -> Relu -> Relu (same signature) -> MatMul with weight w[32,16] (an initializer with data) ->
/// gspmd AllReduce -> Softmax -> Reshape by a shape graph input (placeholder zeros make it invalid).
Graph ops_graph() {
  Graph g;
  g.opset = 17;
  auto value = [&](const char* name, Shape s) {
    Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = std::move(s);
    return g.add_value(v);
  };
  auto node = [&](const char* op, std::vector<int> in, int out, const char* domain = "") {
    Node n;
    n.name = n.op_type = op;
    n.domain = domain;
    n.inputs = std::move(in);
    n.outputs = {out};
    g.nodes.push_back(n);
  };
  int x = value("x", {8, 32}), r1 = value("r1", {8, 32}), r2 = value("r2", {8, 32});
  int w = value("w", {32, 16});
  g.values[static_cast<size_t>(w)].is_initializer = true;
  g.values[static_cast<size_t>(w)].data =
      std::make_shared<Tensor>(Tensor::from_floats({32, 16}, std::vector<float>(32 * 16, 0.25f)));
  int m = value("m", {8, 16}), ar = value("ar", {8, 16}), sm = value("sm", {8, 16});
  Value shp;
  shp.name = "shape";
  shp.dtype = DType::kInt64;
  shp.shape = {2};
  int shape = g.add_value(shp);
  int rs = value("rs", {16, 8});
  g.inputs = {x, shape};
  node("Relu", {x}, r1);
  node("Relu", {r1}, r2);
  node("MatMul", {r2, w}, m);
  node("AllReduce", {m}, ar, kGspmdDomain);
  node("Softmax", {ar}, sm);
  node("Reshape", {sm, shape}, rs);  // shape [0, 0] with allowzero: 128 elements into 0, the kernel refuses
  g.nodes.back().attrs["allowzero"] = int64_t{1};
  g.outputs = {rs};
  return g;
}

TEST(HostTarget, MeasuresEachDistinctOpOnce) {
  SpmdProgram p;
  p.program = ops_graph();
  const Graph& g = p.program;
  Target t;
  t.measured_ops["Softmax(float32[8,16])->(float32[8,16]){}"] = 7;  // already known: kept
  EXPECT_EQ(measure_program_ops(p, t), 2);                          // Relu (twice, one signature) and MatMul
  const Node& relu = g.nodes[0];
  const Node& mm = g.nodes[2];
  ASSERT_EQ(t.measured_ops.size(), 3u);
  const double r = t.measured_ops.at(op_signature(g, relu)), m = t.measured_ops.at(op_signature(g, mm));
  // a 256-element Relu and a 8x32x16 MatMul run in more than 10 ns and well under 10 ms on any machine
  for (double s : {r, m}) {
    EXPECT_GT(s, 1e-8);
    EXPECT_LT(s, 1e-2);
  }
  EXPECT_EQ(t.measured_ops.at("Softmax(float32[8,16])->(float32[8,16]){}"), 7);
  EXPECT_EQ(t.measured_ops.count(op_signature(g, g.nodes[3])), 0u);  // the collective: the link model's
  EXPECT_EQ(t.measured_ops.count(op_signature(g, g.nodes[5])), 0u);  // Reshape threw: left to the roofline

  // a process with half a core: every time doubles (newly measured ones; known ones are kept)
  Target half;
  EXPECT_EQ(measure_program_ops(p, half, 0.5), 3);
  EXPECT_GT(half.measured_ops.at(op_signature(g, relu)), 1e-8 / 0.5);
  // no budget, or inputs over the memory cap: nothing measured
  Target none;
  EXPECT_EQ(measure_program_ops(p, none, 1, 0), 0);
  EXPECT_EQ(measure_program_ops(p, none, 1, 5, 511), 0);  // every op reads at least 512 fresh bytes (8x16 floats)
  EXPECT_TRUE(none.measured_ops.empty());
}

// The spread of each op's repeats is counted: every timed op, each with a ratio of at least 1.
TEST(HostTarget, CountsHowSteadyTheRepeatsWere) {
  SpmdProgram p;
  p.program = ops_graph();
  Target t;
  MeasureSpread spread;
  EXPECT_EQ(measure_program_ops(p, t, 1, 5, int64_t{1} << 30, &spread), 3);
  EXPECT_EQ(spread.ops, 3);
  EXPECT_GE(spread.worst, 1);
  EXPECT_LE(spread.unsteady, spread.ops);
}

TEST(HostTarget, WarnsWhenTheTimesMayNotRepeat) {
  MeasureSpread quiet;
  quiet.ops = 37, quiet.unsteady = 1, quiet.worst = 4.1, quiet.worst_op = "Mul";  // one small op: noise
  EXPECT_EQ(host_spread_warning(quiet, 2, 2), "");
  MeasureSpread busy;
  busy.ops = 93, busy.unsteady = 31, busy.worst = 492.1, busy.worst_op = "Mul";
  EXPECT_EQ(host_spread_warning(busy, 2, 2),
            "host: 31 of 93 measured ops varied more than 4x between repeats (worst 492.1x, a Mul): the machine is "
            "busy, so the host times may not repeat");
  EXPECT_EQ(host_spread_warning(quiet, 8, 2),
            "host: OpenMP runs 8 threads on 2 cores (OMP_NUM_THREADS): kernels oversubscribe the cores, so the host "
            "times may not repeat; set OMP_NUM_THREADS=2");
}

// Without OMP_NUM_THREADS, OpenMP's threads are capped at the cores this process may use; with it, left alone.
TEST(HostTarget, LimitsThreadsToTheCores) {
  const int saved = omp_get_max_threads();
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string was = env ? env : "";
  ::unsetenv("OMP_NUM_THREADS");
  omp_set_num_threads(host_cores() + 3);
  EXPECT_EQ(limit_threads_to_cores(), host_cores());
  ::setenv("OMP_NUM_THREADS", "64", 1);
  omp_set_num_threads(host_cores() + 3);
  EXPECT_EQ(limit_threads_to_cores(), host_cores() + 3);
  if (env)
    ::setenv("OMP_NUM_THREADS", was.c_str(), 1);
  else
    ::unsetenv("OMP_NUM_THREADS");
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace gspmd
