// core/cost: every formula against hand-computed numbers (docs/cost-model.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/cost/cost.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

using testing::mesh_of;
using testing::V;

void expect_rel(double got, double want, double tol = 1e-12) {
  EXPECT_NEAR(got, want, std::abs(want) * tol) << "got " << got << " want " << want;
}

TEST(CostTarget, Presets) {
  Target v3 = Target::load("tpu-v3");
  EXPECT_EQ(v3.name, "tpu-v3");
  expect_rel(v3.peak_flops, 61.5e12);
  expect_rel(v3.hbm_bytes, 16.0 * 1024 * 1024 * 1024);
  expect_rel(v3.hbm_bandwidth, 450e9);
  expect_rel(v3.link_bandwidth, 340e12 / 1024 / 4 / 2);  // 41.50390625 GB/s per core
  EXPECT_TRUE(v3.wraparound);
  EXPECT_EQ(v3.torus_dims, 2);
  Target v4 = Target::load("tpu-v4");
  expect_rel(v4.peak_flops, 275e12);
  expect_rel(v4.hbm_bytes, 32.0 * 1024 * 1024 * 1024);
  expect_rel(v4.hbm_bandwidth, 1200e9);
  expect_rel(v4.link_bandwidth, 1.1e15 / 4096 / 6);
  EXPECT_EQ(v4.torus_dims, 3);
  Target v5e = Target::load("tpu-v5e");
  expect_rel(v5e.peak_flops, 197e12);
  expect_rel(v5e.hbm_bandwidth, 819e9);
  expect_rel(v5e.link_bandwidth, 50e9);
  EXPECT_EQ(Target::presets(), (std::vector<std::string>{"tpu-v3", "tpu-v4", "tpu-v5e", "dgx-a100", "dgx-h100"}));
}

TEST(CostTarget, UnknownName) {
  try {
    Target::load("tpu-v9");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--target: unknown target 'tpu-v9' (known: tpu-v3, tpu-v4, tpu-v5e, dgx-a100, dgx-h100)");
  }
}

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path = std::string(GSPMD_BINARY_DIR) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(CostTarget, JsonFile) {
  std::string p = write_tmp("cost_test_target.json",
                            R"({"base": "tpu-v4", "name": "my-pod", "link_bandwidth": 1e11, "wraparound": false,
                                "links_per_axis": 1, "torus_dims": 2})");
  Target t = Target::load(p);
  EXPECT_EQ(t.name, "my-pod");
  expect_rel(t.peak_flops, 275e12);  // from the base
  expect_rel(t.link_bandwidth, 1e11);
  EXPECT_FALSE(t.wraparound);
  EXPECT_EQ(t.links_per_axis, 1);
  EXPECT_EQ(t.torus_dims, 2);
  // round trip
  std::string q = write_tmp("cost_test_target2.json", t.to_json());
  Target u = Target::load(q);
  EXPECT_EQ(u.name, "my-pod");
  expect_rel(u.link_bandwidth, 1e11);
  expect_rel(u.hbm_bytes, t.hbm_bytes);
  EXPECT_FALSE(u.wraparound);

  // no name: the file stem
  std::string r =
      write_tmp("stem_target.json", R"({"peak_flops": 1e12, "hbm_bandwidth": 1e11, "link_bandwidth": 1e10})");
  EXPECT_EQ(Target::load(r).name, "stem_target");
}

TEST(CostTarget, BadJsonFiles) {
  auto expect_input_error = [](const std::string& path, const std::string& needle) {
    try {
      Target::load(path);
      FAIL() << path;
    } catch (const InputError& e) {
      std::string w = e.what();
      EXPECT_EQ(w.rfind(path + ": ", 0), 0u) << w;
      EXPECT_NE(w.find(needle), std::string::npos) << w;
    }
  };
  expect_input_error(write_tmp("bad1.json", R"({"peak_flops": 1e12,)"), "expected");
  expect_input_error(write_tmp("bad2.json", R"({"peak_flopz": 1})"), "unknown field 'peak_flopz'");
  expect_input_error(write_tmp("bad3.json", R"({"peak_flops": "fast"})"), "must be a number");
  expect_input_error(write_tmp("bad4.json", R"({"hbm_bandwidth": 1, "link_bandwidth": 1})"), "peak_flops must be > 0");
  expect_input_error(write_tmp("bad5.json", R"([1, 2])"), "expected one JSON object");
  expect_input_error(write_tmp("bad9.json", R"({"peak_flops": 1E6212})"), "number overflow parsing '1E6212'");
  // Nested 40,000 deep: refused while it is read (docs/sharding-file.md#limits), never walked.
  const std::string deep =
      write_tmp("deep.json", "{\"name\": " + std::string(40000, '[') + std::string(40000, ']') + "}");
  try {
    Target::load(deep);
    FAIL() << deep;
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), deep + ": JSON nested deeper than 64 levels");
  }
  expect_input_error(write_tmp("bad6.json", R"({"topology": "3d-donut", "peak_flops": 1})"),
                     "'topology' must be \"ring\", \"line\", \"<n>d-torus\", \"<n>d-mesh\" or \"switch\"");
  expect_input_error(write_tmp("bad7.json", R"({"base": "tpu-v3", "topology": "ring", "torus_dims": 1})"),
                     "give 'topology' or 'torus_dims'/'wraparound', not both");
  expect_input_error(write_tmp("bad8.json", R"({"base": "tpu-v3", "peak_flops_int8": -1})"),
                     "field 'peak_flops_int8' must be a finite number >= 0");
  expect_input_error(std::string(GSPMD_BINARY_DIR) + "/does_not_exist.json", "cannot open");
}

/// A graph with one MatMul c = a x a on [64, 64] values of `dt` (2 * 64^3 = 524,288 FLOPs); `mm` is the node.
struct SquareMatMul {
  Graph g;
  Node mm;
  explicit SquareMatMul(DType dt) {
    int a = g.add_value(V("a", dt, {64, 64}));
    int c = g.add_value(V("c", dt, {64, 64}));
    mm.op_type = "MatMul";
    mm.inputs = {a, a};
    mm.outputs = {c};
  }
};

TEST(CostTarget, TopologyAndPerDtypePeaks) {
  EXPECT_EQ(Target::load("tpu-v3").topology(), "2d-torus");
  EXPECT_EQ(Target::load("tpu-v4").topology(), "3d-torus");
  Target v5e = Target::load("tpu-v5e");
  // f32 matmuls run as bf16 passes at XLA's default precision: the f32 peak is the bf16 peak; int8 is 2x on v5e.
  EXPECT_EQ(v5e.peak_for(DType::kFloat32), 197e12);
  EXPECT_EQ(v5e.peak_for(DType::kBFloat16), 197e12);
  EXPECT_EQ(v5e.peak_for(DType::kInt8), 394e12);
  EXPECT_EQ(v5e.peak_for(DType::kFloat64), 197e12);  // no per-dtype field: peak_flops
  EXPECT_EQ(Target::load("tpu-v4").peak_for(DType::kUInt8), 275e12);

  Target t = Target::load(write_tmp("topo.json", R"({"base": "tpu-v3", "topology": "3d-mesh",
                                                     "peak_flops_f32": 1e12, "peak_flops_int8": 4e12})"));
  EXPECT_EQ(t.torus_dims, 3);
  EXPECT_FALSE(t.wraparound);
  EXPECT_EQ(t.topology(), "3d-mesh");
  EXPECT_EQ(t.peak_for(DType::kFloat32), 1e12);
  EXPECT_EQ(t.peak_for(DType::kInt8), 4e12);
  EXPECT_EQ(t.peak_for(DType::kFloat16), 61.5e12);
  Target line = Target::load(write_tmp("line.json", R"({"base": "tpu-v3", "topology": "line"})"));
  EXPECT_EQ(line.torus_dims, 1);
  EXPECT_EQ(line.topology(), "line");
  // to_json writes topology and the per-dtype peaks, and loads back
  Target u = Target::load(write_tmp("topo2.json", t.to_json()));
  EXPECT_EQ(u.topology(), "3d-mesh");
  EXPECT_EQ(u.peak_for(DType::kInt8), 4e12);

  // node_time uses the peak of the op's input dtype: 2*64*64*64 FLOPs of an f16 MatMul at 1e9 FLOP/s = 524.288 us
  Target slow = Target::load("tpu-v3");
  slow.peak_flops_f16 = 1e9;
  SquareMatMul f16(DType::kFloat16);
  const Graph& g = f16.g;
  const Node& mm = f16.mm;
  expect_rel(node_time(g, mm, mesh_of({1}), slow), 2.0 * 64 * 64 * 64 / 1e9);
  // a fixed per-op overhead adds to the roofline (loaded from a file like every field)
  slow.op_overhead = Target::load(write_tmp("ovh.json", R"({"base": "tpu-v3", "op_overhead": 2.5e-6})")).op_overhead;
  expect_rel(node_time(g, mm, mesh_of({1}), slow), 2.0 * 64 * 64 * 64 / 1e9 + 2.5e-6);
}

TEST(CostTarget, ContractionCurve) {
  Target t = Target::load(write_tmp("curve.json", R"({"base": "tpu-v3", "peak_flops": 8e10,
      "contraction_curve": [[1e6, 1e9], [1e8, 5e10], [1e10, 1e11]], "conv_efficiency": 0.5})"));
  EXPECT_EQ(t.contraction_rate(1e5, DType::kFloat32, false), 1e9);  // clamped below the first point
  EXPECT_EQ(t.contraction_rate(1e6, DType::kFloat32, false), 1e9);
  expect_rel(t.contraction_rate(1e7, DType::kFloat32, false), 2.55e10);  // halfway in log(flops): (1e9 + 5e10) / 2
  expect_rel(t.contraction_rate(1e9, DType::kFloat32, false), 7.5e10);   // halfway between the last two points
  EXPECT_EQ(t.contraction_rate(1e12, DType::kFloat32, false), 8e10);     // 1e11 by the curve, capped at the peak
  expect_rel(t.contraction_rate(1e7, DType::kFloat32, true), 1.275e10);  // convolutions at half the rate
  // node_time of a 2*64^3 = 524,288-FLOP MatMul: below the first point, 1e9 FLOP/s
  SquareMatMul f32(DType::kFloat32);
  const Graph& g = f32.g;
  const Node& mm = f32.mm;
  expect_rel(node_time(g, mm, mesh_of({1}), t), 524288.0 / 1e9);
  // written back and loaded again
  Target u = Target::load(write_tmp("curve2.json", t.to_json()));
  EXPECT_EQ(u.contraction_curve, t.contraction_curve);
  EXPECT_EQ(u.conv_efficiency, 0.5);
  try {
    Target::load(write_tmp("curve_bad.json", R"({"base": "tpu-v3", "contraction_curve": [[1e8, 1], [1e6, 1]]})"));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'contraction_curve' must be [[flops, flop_per_s], ...] with positive "
                                         "numbers and increasing flops"),
              std::string::npos)
        << e.what();
  }
}

TEST(CostTarget, MeasuredOps) {
  // A Conv with a bias left out and attributes of three kinds: the signature names every input, output and attribute.
  Graph g;
  int x = g.add_value(V("x", DType::kFloat32, {16, 64, 10, 16}));
  int w = g.add_value(V("w", DType::kFloat32, {64, 64, 3, 3}));
  int y = g.add_value(V("y", DType::kFloat32, {16, 64, 8, 16}));
  Node conv;
  conv.op_type = "Conv";
  conv.inputs = {x, w, -1};
  conv.outputs = {y};
  conv.attrs["pads"] = std::vector<int64_t>{0, 1, 0, 1};
  conv.attrs["group"] = int64_t{1};
  conv.attrs["auto_pad"] = std::string("NOTSET");
  const std::string sig = op_signature(g, conv);
  EXPECT_EQ(sig,
            "Conv(float32[16,64,10,16],float32[64,64,3,3],-)->(float32[16,64,8,16])"
            "{auto_pad=NOTSET,group=1,pads=[0,1,0,1]}");
  Node gspmd_op = conv;
  gspmd_op.domain = "gspmd";
  gspmd_op.attrs.clear();
  EXPECT_EQ(op_signature(g, gspmd_op),
            "gspmd:Conv(float32[16,64,10,16],float32[64,64,3,3],-)->(float32[16,64,8,16]){}");

  // node_time takes the measured time for that signature, the roofline for any other
  Target t = Target::load("tpu-v3");
  const double roofline = node_time(g, conv, mesh_of({1}), t);
  t.measured_ops[sig] = 0.0125;
  t.measured_ops["Relu(float32[1])->(float32[1]){}"] = 1;
  EXPECT_EQ(node_time(g, conv, mesh_of({1}), t), 0.0125);
  conv.attrs["group"] = int64_t{2};
  EXPECT_EQ(node_time(g, conv, mesh_of({1}), t), roofline);

  // written back and loaded again; bad tables are errors naming the file
  Target u = Target::load(write_tmp("ops.json", t.to_json()));
  EXPECT_EQ(u.measured_ops, t.measured_ops);
  EXPECT_EQ(Target::load("tpu-v3").to_json().find("measured_ops"), std::string::npos);  // no table, no field
  const std::string bad = write_tmp("ops_bad.json", R"({"base": "tpu-v3", "measured_ops": [1]})");
  try {
    Target::load(bad);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), bad + ": 'measured_ops' must be {\"op signature\": seconds, ...}");
  }
  const std::string neg = write_tmp("ops_neg.json", R"({"base": "tpu-v3", "measured_ops": {"Relu()->(){}": -1}})");
  try {
    Target::load(neg);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), neg + ": field 'measured_ops.Relu()->(){}' must be a finite number >= 0");
  }
}

TEST(CostTarget, RegisteredPresets) {
  int made = 0;
  Target::register_preset("test-pod", [&made] {
    ++made;
    Target t = Target::load("tpu-v4");
    t.name = "test-pod";
    return t;
  });
  EXPECT_EQ(made, 0);  // made on demand
  EXPECT_EQ(Target::load("test-pod").name, "test-pod");
  EXPECT_EQ(made, 1);
  EXPECT_EQ(Target::presets().back(), "test-pod");
  try {
    Target::load("tpu-v9");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "--target: unknown target 'tpu-v9' (known: tpu-v3, tpu-v4, tpu-v5e, dgx-a100, dgx-h100, test-pod)");
  }
  // a file may start from a registered preset
  EXPECT_EQ(Target::load(write_tmp("based.json", R"({"base": "test-pod", "link_latency": 2e-6})")).link_latency, 2e-6);
}

TEST(CostTarget, DeviceOrder) {
  Target t = Target::load("tpu-v3");  // 2D torus
  const double lb = 340e12 / 1024 / 4 / 2;
  DeviceMesh m = mesh_of({2, 2, 2});          // axes x, y, z
  EXPECT_EQ(t.device_order_str(m), "x,y*z");  // the default: y and z fold onto the last dim
  t.device_order = Target::parse_device_order("z,x*y");
  EXPECT_EQ(t.device_order_str(m), "z,x*y");
  AxisPlacement z = t.placement(2, m), x = t.placement(0, m), y = t.placement(1, m);
  EXPECT_EQ(z.physical_dim, 0);  // z alone on dim 0: a closed ring over both directions
  EXPECT_TRUE(z.wraparound);
  expect_rel(z.ring_bandwidth, 2 * lb);
  EXPECT_EQ(x.physical_dim, 1);  // x major on dim 1: stride 2 (y is minor), spans the ring: 2 rings share it
  EXPECT_EQ(x.stride, 2);
  EXPECT_TRUE(x.wraparound);
  expect_rel(x.ring_bandwidth, lb);
  EXPECT_EQ(y.stride, 1);  // y: a segment of 2 of the ring of 4, no wraparound
  EXPECT_FALSE(y.wraparound);
  expect_rel(y.ring_bandwidth, lb);
  // the collective follows: an all-gather over z now uses both directions of its own dim
  expect_rel(collective_time(Collective::kAllGather, kMiB, {2}, m, t), 0.5 * kMiB / (2 * lb) + 1e-6);

  auto expect_error = [&](const std::string& order, const std::string& msg) {
    Target u = Target::load("tpu-v3");
    try {
      u.device_order = Target::parse_device_order(order);
      u.check_device_order(m);
      FAIL() << order;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), msg);
    }
  };
  expect_error("x,q*y*z", "--device-order: unknown mesh axis 'q' (mesh axes: x, y, z)");
  expect_error("x,y*x*z", "--device-order: mesh axis 'x' is given twice");
  expect_error("x,y", "--device-order: mesh axis 'z' is missing (every axis must be placed once)");
  expect_error("x,y,z", "--device-order: 3 physical dims given, but target tpu-v3 has 2 (2d-torus)");
  expect_error("x,,y*z",
               "--device-order: 'x,,y*z' has an empty axis name (expected e.g. \"y,x\" or \"data,model*expert\")");
}

// ---------------------------------------------------------------------------------------------------- collectives
TEST(CostCollectives, AllReduce1MiBOver4DeviceRingOnV3) {
  Target t = Target::load("tpu-v3");
  DeviceMesh m = mesh_of({4});
  // ring bandwidth per device = 2 links * 41.50390625e9 B/s = 83.0078125e9 B/s
  // reduce-scatter = all-gather = 3/4 * 1048576 / 83.0078125e9 + 3 * 1e-6 = 9.4741926e-6 + 3e-6 = 12.4741926e-6
  double ag = 0.75 * 1048576.0 / 83.0078125e9 + 3e-6;
  expect_rel(collective_time(Collective::kAllGather, kMiB, {0}, m, t), ag);
  expect_rel(collective_time(Collective::kReduceScatter, kMiB, {0}, m, t), ag);
  expect_rel(collective_time(Collective::kAllReduce, kMiB, {0}, m, t), 2 * ag);
  EXPECT_NEAR(collective_time(Collective::kAllReduce, kMiB, {0}, m, t), 24.9483851e-6, 1e-12);  // 24.95 us
}

TEST(CostCollectives, AllToAllAndPermute) {
  Target t = Target::load("tpu-v3");
  const double lb = 340e12 / 1024 / 4 / 2, bw = 2 * lb;
  DeviceMesh m4 = mesh_of({4});
  // floor(16/4)/4 = 1 -> S / bw + 3 lat
  expect_rel(collective_time(Collective::kAllToAll, kMiB, {0}, m4, t), kMiB / bw + 3e-6);
  DeviceMesh m2 = mesh_of({2});
  // floor(4/4)/2 = 1/2 -> S / (2 bw) + lat
  expect_rel(collective_time(Collective::kAllToAll, kMiB, {0}, m2, t), kMiB / (2 * bw) + 1e-6);
  // permute: one link, one direction
  expect_rel(collective_time(Collective::kCollectivePermute, kMiB, {0}, m4, t), kMiB / lb + 1e-6);
  // 2x4 all-to-all over both axes: sum of the per-axis times with the full payload
  DeviceMesh m24 = mesh_of({2, 4});
  expect_rel(collective_time(Collective::kAllToAll, kMiB, {0, 1}, m24, t), kMiB / (2 * bw) + 1e-6 + kMiB / bw + 3e-6);
}

TEST(CostCollectives, MultiAxisHierarchical) {
  Target t = Target::load("tpu-v4");
  const double bw = 2 * (1.1e15 / 4096 / 6);
  DeviceMesh m = mesh_of({2, 4});
  // equal bandwidth on both axes: stages move S/8*... = 7/8 S in total, latency (1 + 3)
  double ag = 7.0 / 8.0 * kMiB / bw + 4e-6;
  expect_rel(collective_time(Collective::kAllGather, kMiB, {0, 1}, m, t), ag);
  expect_rel(collective_time(Collective::kAllGather, kMiB, {1, 0}, m, t), ag);
  expect_rel(collective_time(Collective::kAllReduce, kMiB, {0, 1}, m, t), 2 * ag);
  // a single axis of the 2x4 mesh
  expect_rel(collective_time(Collective::kAllGather, kMiB, {0}, m, t), 0.5 * kMiB / bw + 1e-6);
}

TEST(CostCollectives, FoldedAxesAndMeshWithoutWraparound) {
  Target t = Target::load("tpu-v3");  // 2D torus
  const double lb = 340e12 / 1024 / 4 / 2;
  DeviceMesh m = mesh_of({2, 2, 2});
  // y and z fold onto physical dim 1 (a ring of 4). z: stride 1, spans 2 of 4 -> no wraparound: bw = lb.
  expect_rel(collective_time(Collective::kAllGather, kMiB, {2}, m, t), 0.5 * kMiB / lb + 1e-6);
  // y: stride 2, spans the whole ring (wraparound), two rings share the links: bw = 2 lb / 2 = lb.
  expect_rel(collective_time(Collective::kAllGather, kMiB, {1}, m, t), 0.5 * kMiB / lb + 1e-6);
  // x: its own physical dim, bw = 2 lb
  expect_rel(collective_time(Collective::kAllGather, kMiB, {0}, m, t), 0.5 * kMiB / (2 * lb) + 1e-6);

  Target mesh_t = t;
  mesh_t.wraparound = false;
  DeviceMesh m4 = mesh_of({4});
  expect_rel(collective_time(Collective::kAllGather, kMiB, {0}, m4, mesh_t), 0.75 * kMiB / lb + 3e-6);
  // all-to-all on a line: bisection of one link per direction
  expect_rel(collective_time(Collective::kAllToAll, kMiB, {0}, m4, mesh_t), kMiB / lb + 3e-6);
}

TEST(CostCollectives, DegenerateCases) {
  Target t = Target::load("tpu-v3");
  DeviceMesh m = mesh_of({1, 4});
  EXPECT_EQ(collective_time(Collective::kAllReduce, kMiB, {0}, m, t), 0.0);
  EXPECT_EQ(collective_time(Collective::kAllReduce, kMiB, {}, m, t), 0.0);
  EXPECT_EQ(collective_time(Collective::kAllReduce, 0, {1}, m, t), 0.0);
  EXPECT_FALSE(collective_from_name("broadcast"));  // not a collective: no kind to cost
  EXPECT_THROW(collective_time(Collective::kAllReduce, kMiB, {2}, m, t), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------- FLOPs / bytes
Node make_node(const std::string& op, std::vector<int> in, std::vector<int> out,
               std::map<std::string, AttrValue> attrs = {}) {
  Node n;
  n.name = op;
  n.op_type = op;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attrs = std::move(attrs);
  return n;
}

TEST(CostFlops, PerOp) {
  Graph g;
  int a = g.add_value(V("a", DType::kFloat32, {8, 64, 128}));
  int b = g.add_value(V("b", DType::kFloat32, {128, 512}));
  int c = g.add_value(V("c", DType::kFloat32, {8, 64, 512}));
  Node mm = make_node("MatMul", {a, b}, {c});
  EXPECT_EQ(node_flops(g, mm), 2.0 * 8 * 64 * 512 * 128);  // 67,108,864
  EXPECT_EQ(node_flops(g, mm), 67108864.0);
  // bytes: (8*64*128 + 128*512 + 8*64*512) * 4
  EXPECT_EQ(node_bytes(g, mm), (65536.0 + 65536.0 + 262144.0) * 4);

  int ga = g.add_value(V("ga", DType::kFloat32, {16, 32}));
  int gb = g.add_value(V("gb", DType::kFloat32, {10, 32}));
  int gc = g.add_value(V("gc", DType::kFloat32, {16, 10}));
  EXPECT_EQ(node_flops(g, make_node("Gemm", {ga, gb}, {gc}, {{"transB", int64_t{1}}})), 2.0 * 16 * 10 * 32);
  int gt = g.add_value(V("gt", DType::kFloat32, {32, 16}));
  EXPECT_EQ(node_flops(g, make_node("Gemm", {gt, gb}, {gc}, {{"transA", int64_t{1}}, {"transB", int64_t{1}}})),
            2.0 * 16 * 10 * 32);

  EXPECT_EQ(node_flops(g, make_node("Add", {c, c}, {c})), 8.0 * 64 * 512);
  EXPECT_EQ(node_flops(g, make_node("Relu", {c}, {c})), 8.0 * 64 * 512);
  EXPECT_EQ(node_flops(g, make_node("Softmax", {c}, {c})), 5.0 * 8 * 64 * 512);
  EXPECT_EQ(node_flops(g, make_node("LayerNormalization", {c}, {c})), 5.0 * 8 * 64 * 512);
  int r = g.add_value(V("r", DType::kFloat32, {8, 64, 1}));
  EXPECT_EQ(node_flops(g, make_node("ReduceSum", {c}, {r})), 8.0 * 64 * 512);
  EXPECT_EQ(node_flops(g, make_node("Reshape", {c}, {c})), 0.0);
  EXPECT_EQ(node_flops(g, make_node("Transpose", {c}, {c})), 0.0);
  Node ar = make_node("AllReduce", {c}, {c});
  ar.domain = kGspmdDomain;
  EXPECT_EQ(node_flops(g, ar), 0.0);

  // Conv: X[1,3,8,8] * W[4,3,3,3] -> Y[1,4,6,6]: 2 * 144 * 27
  int x = g.add_value(V("x", DType::kFloat32, {1, 3, 8, 8}));
  int w = g.add_value(V("w", DType::kFloat32, {4, 3, 3, 3}));
  int y = g.add_value(V("y", DType::kFloat32, {1, 4, 6, 6}));
  EXPECT_EQ(node_flops(g, make_node("Conv", {x, w}, {y})), 2.0 * 144 * 27);

  // absent optional inputs are skipped in bytes
  EXPECT_EQ(node_bytes(g, make_node("Relu", {-1, r}, {r})), 2.0 * 8 * 64 * 4);

  g.add_node(mm);
  g.add_node(make_node("Relu", {c}, {g.add_value(V("d", DType::kFloat32, {8, 64, 512}))}));
  EXPECT_EQ(graph_flops(g), 67108864.0 + 262144.0);
}

// ---------------------------------------------------------------------------------------------------- simulate
/// Program on 4 devices: z[64,256] = x[64,128] @ w[128,256] (a partial sum), y = AllReduce(z) over axis 0.
SpmdProgram matmul_all_reduce_program() {
  SpmdProgram p;
  p.mesh = mesh_of({4});
  Graph& g = p.program;
  int x = g.add_value(V("x", DType::kFloat32, {64, 128}));
  int w = g.add_value(V("w", DType::kFloat32, {128, 256}));
  int z = g.add_value(V("z", DType::kFloat32, {64, 256}));
  int y = g.add_value(V("y", DType::kFloat32, {64, 256}));
  g.add_node(make_node("MatMul", {x, w}, {z}));
  Node ar = make_node("AllReduce", {z}, {y}, {{"mesh_axes", std::vector<int64_t>{0}}});
  ar.domain = kGspmdDomain;
  g.add_node(ar);
  return p;
}

TEST(CostSimulate, MatMulPlusAllReduce) {
  // global: Y[64,256] = X[64,512] x W[512,256]; program on 4 devices with K split: local x[64,128] w[128,256],
  // z[64,256] partial, AllReduce over x.
  Graph global;
  int gx = global.add_value(V("X", DType::kFloat32, {64, 512}));
  int gw = global.add_value(V("W", DType::kFloat32, {512, 256}));
  int gy = global.add_value(V("Y", DType::kFloat32, {64, 256}));
  global.add_node(make_node("MatMul", {gx, gw}, {gy}));
  SpmdProgram p = matmul_all_reduce_program();
  const Graph& g = p.program;
  EXPECT_TRUE(is_collective(g.nodes[1]));
  EXPECT_EQ(collective_name(*collective_of(g.nodes[1])), "all-reduce");
  EXPECT_FALSE(is_collective(g.nodes[0]));

  Target t = Target::load("tpu-v3");
  CostReport r = simulate_cost(global, p, t);
  const double model = 2.0 * 64 * 256 * 512;
  EXPECT_EQ(r.model_flops, model);
  // local MatMul: 2*64*256*128 = 4,194,304 FLOPs -> 6.82e-8 s; bytes (8192+32768+16384)*4 = 229,376 -> 5.10e-7 s
  double mm = std::max(4194304.0 / 61.5e12, 229376.0 / 450e9);
  expect_rel(r.compute_time_s, mm);
  double comm = 2 * (0.75 * 65536.0 / (2 * (340e12 / 1024 / 4 / 2)) + 3e-6);
  expect_rel(r.communication_time_s, comm);
  expect_rel(r.step_time_s, mm + comm);
  expect_rel(r.flops_utilization, model / (4 * 61.5e12 * (mm + comm)));
  ASSERT_EQ(r.node_time_s.size(), 2u);
  expect_rel(r.node_time_s[0], mm);
  expect_rel(r.node_time_s[1], comm);
  expect_rel(node_time(g, g.nodes[1], p.mesh, t), comm);
}

TEST(Cost, OverlapRunsCollectivesBesideIndependentCompute) {
  // z = x@w; y = AllReduce(z); u = x@w (independent of y); o = y + u. Without overlap the four times add up; with
  // it the all-reduce runs on the communication stream while the second MatMul computes.
  Graph global;
  global.add_value(V("g", DType::kFloat32, {1}));
  SpmdProgram p = matmul_all_reduce_program();
  Graph& g = p.program;
  const int x = g.at("x"), w = g.at("w"), y = g.at("y");
  int u = g.add_value(V("u", DType::kFloat32, {64, 256}));
  int o = g.add_value(V("o", DType::kFloat32, {64, 256}));
  g.add_node(make_node("MatMul", {x, w}, {u}));
  g.add_node(make_node("Add", {y, u}, {o}));
  const Target t = Target::load("tpu-v3");
  const CostReport seq = simulate_cost(global, p, t);
  const CostReport ovl = simulate_cost(global, p, t, /*overlap=*/true);
  const double mm = seq.node_time_s[0], comm = seq.node_time_s[1], add = seq.node_time_s[3];
  ASSERT_GT(comm, mm);  // the all-reduce outlasts the second MatMul, so the Add waits for it
  expect_rel(seq.step_time_s, 2 * mm + comm + add);
  ASSERT_EQ(seq.node_start_s.size(), 4u);
  EXPECT_EQ(seq.node_start_s[0], 0.0);
  expect_rel(seq.node_start_s[1], mm);
  expect_rel(seq.node_start_s[2], mm + comm);
  expect_rel(seq.node_start_s[3], 2 * mm + comm);
  EXPECT_FALSE(seq.overlap);
  EXPECT_TRUE(ovl.overlap);
  EXPECT_EQ(ovl.node_start_s[0], 0.0);
  EXPECT_EQ(ovl.node_start_s[1], mm);  // as soon as z exists
  EXPECT_EQ(ovl.node_start_s[2], mm);  // the compute stream is free: no wait for the all-reduce
  EXPECT_EQ(ovl.node_start_s[3], mm + comm);
  expect_rel(ovl.step_time_s, mm + comm + add);
  expect_rel(ovl.compute_time_s, seq.compute_time_s);  // the sums do not change, only the step
  expect_rel(ovl.communication_time_s, seq.communication_time_s);
}

}  // namespace
}  // namespace gspmd
