// core/cost: the GPU cluster presets (dgx-a100, dgx-h100) and collectives inside and across nodes, against the
// formulas of docs/cost-model.md ("GPU clusters") computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/cost/cost.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

using testing::mesh_of;

void expect_rel(double got, double want) {
  EXPECT_NEAR(got, want, std::abs(want) * 1e-12) << "got " << got << " want " << want;
}

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path = std::string(GSPMD_BINARY_DIR) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(GpuTarget, PresetValues) {
  Target a = Target::load("dgx-a100");
  EXPECT_EQ(a.name, "dgx-a100");
  EXPECT_EQ(a.peak_flops, 312e12);
  EXPECT_EQ(a.peak_for(DType::kBFloat16), 312e12);
  EXPECT_EQ(a.peak_for(DType::kFloat16), 312e12);
  EXPECT_EQ(a.peak_for(DType::kFloat32), 19.5e12);
  EXPECT_EQ(a.peak_for(DType::kInt8), 624e12);
  EXPECT_EQ(a.hbm_bytes, 80 * kGiB);
  EXPECT_EQ(a.hbm_bandwidth, 2039e9);
  EXPECT_EQ(a.switch_bandwidth(), 300e9);  // 12 NVLinks x 25 GB/s per direction
  EXPECT_EQ(a.topology(), "switch");
  EXPECT_EQ(a.devices_per_node, 8);
  EXPECT_EQ(a.network_bandwidth, 25e9);  // 200 Gb/s HDR per GPU
  EXPECT_EQ(a.network_latency, 5e-6);

  Target h = Target::load("dgx-h100");
  EXPECT_EQ(h.peak_flops, 989.5e12);
  EXPECT_EQ(h.peak_for(DType::kFloat32), 67e12);
  EXPECT_EQ(h.peak_for(DType::kInt8), 1979e12);
  EXPECT_EQ(h.hbm_bytes, 80 * kGiB);
  EXPECT_EQ(h.hbm_bandwidth, 3.35e12);
  EXPECT_EQ(h.switch_bandwidth(), 450e9);  // 18 NVLinks x 25 GB/s per direction
  EXPECT_EQ(h.devices_per_node, 8);
  EXPECT_EQ(h.network_bandwidth, 50e9);  // 400 Gb/s NDR per GPU
}

TEST(GpuTarget, ToJsonRoundTrips) {
  for (const char* name : {"dgx-a100", "dgx-h100"}) {
    Target t = Target::load(name);
    Target u = Target::load(write_tmp(std::string(name) + "_rt.json", t.to_json()));
    EXPECT_EQ(u.to_json(), t.to_json()) << name;
    EXPECT_EQ(u.name, name);
    EXPECT_EQ(u.topology(), "switch");
    EXPECT_EQ(u.devices_per_node, 8);
    EXPECT_EQ(u.links_per_axis, t.links_per_axis);
    EXPECT_EQ(u.network_bandwidth, t.network_bandwidth);
    EXPECT_EQ(u.network_latency, t.network_latency);
    EXPECT_EQ(u.peak_flops_f32, t.peak_flops_f32);
  }
  // The TPU presets' files do not gain the cluster fields.
  EXPECT_EQ(Target::load("tpu-v3").to_json().find("devices_per_node"), std::string::npos);
}

TEST(GpuTarget, BadClusterFiles) {
  auto expect_error = [](const std::string& file, const std::string& text, const std::string& msg) {
    const std::string path = write_tmp(file, text);
    try {
      Target::load(path);
      FAIL() << text;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), path + ": " + msg);
    }
  };
  expect_error("gpu_bad1.json", R"({"base": "tpu-v4", "devices_per_node": 8})",
               "network_bandwidth must be > 0 when devices_per_node is set");
  expect_error("gpu_bad2.json", R"({"base": "dgx-h100", "topology": "2d-torus"})",
               "devices_per_node needs topology \"switch\" (the devices of a node share one switch), not \"2d-torus\"");
  expect_error("gpu_bad3.json", R"({"base": "dgx-h100", "devices_per_node": 2.5})",
               "field 'devices_per_node' must be an integer >= 0");
}

// H100 nodes on a 2x8 mesh (x = 2, y = 8): y's groups {0..7}, {8..15} are nodes; x's groups {k, 8+k} span two.
TEST(GpuTarget, AxisAcrossNodesCostsMoreThanInside) {
  const Target h = Target::load("dgx-h100");
  const DeviceMesh m = mesh_of({2, 8});
  const double S = kMiB, nv = 450e9, ib = 50e9, lat = 1e-6, net = 5e-6;
  // Inside a node: a ring of 8 on NVSwitch.
  const double inside = 2 * (7.0 / 8 * S / nv + 7 * lat);
  expect_rel(collective_time(Collective::kAllReduce, S, {1}, m, h), inside);
  EXPECT_NEAR(inside, 18.078e-6, 1e-9);
  // Across nodes: one GPU per node per group (k = 1, m = 2), over InfiniBand.
  const double across = 2 * (0.5 * S / ib + net);
  expect_rel(collective_time(Collective::kAllReduce, S, {0}, m, h), across);
  EXPECT_NEAR(across, 30.972e-6, 1e-9);
  EXPECT_GT(across, inside);
  // Both axes: intra-node reduce-scatter, inter-node all-reduce of S/8, intra-node all-gather.
  const double both = 2 * (7.0 / 8 * S / nv + 7 * lat + 0.5 * (S / 8) / ib + net);
  expect_rel(collective_time(Collective::kAllReduce, S, {0, 1}, m, h), both);
  expect_rel(collective_time(Collective::kAllReduce, S, {0}, mesh_of({16}), h), both);  // one axis, two nodes
  expect_rel(collective_time(Collective::kAllGather, S, {0, 1}, m, h), both / 2);
  expect_rel(collective_time(Collective::kReduceScatter, S, {0}, m, h), across / 2);
  // All-to-all over both: 7/16 of S over NVLink, 1/2 of S through the NIC.
  expect_rel(collective_time(Collective::kAllToAll, S, {0, 1}, m, h), 7.0 / 16 * S / nv + 7 * lat + 0.5 * S / ib + net);
  expect_rel(collective_time(Collective::kAllToAll, S, {1}, m, h), 7.0 / 8 * S / nv + 7 * lat);
  // Collective-permute: a neighbour on another node over InfiniBand, inside a node over all NVLinks.
  expect_rel(collective_time(Collective::kCollectivePermute, S, {0}, m, h), S / ib + net);
  expect_rel(collective_time(Collective::kCollectivePermute, S, {1}, m, h), S / nv + lat);
}

TEST(GpuTarget, SwitchIgnoresStrideAndUnevenGroupsTakeTheSlowest) {
  // One A100 node, mesh 2x4: x has stride 4, but on a switch its bandwidth is every NVLink of the GPU.
  const Target a = Target::load("dgx-a100");
  const DeviceMesh m = mesh_of({2, 4});
  EXPECT_EQ(a.placement(0, m).ring_bandwidth, 300e9);
  expect_rel(collective_time(Collective::kAllGather, kMiB, {0}, m, a), 0.5 * kMiB / 300e9 + 1e-6);
  // Several axes on a switch: hierarchical, one ring per axis (3 + 1 steps), each at the switch bandwidth; an
  // all-to-all per axis moves (n-1)/n of the payload.
  expect_rel(collective_time(Collective::kAllReduce, kMiB, {0, 1}, m, a), 2 * (7.0 / 8 * kMiB / 300e9 + 4e-6));
  expect_rel(collective_time(Collective::kAllToAll, kMiB, {0, 1}, m, a),
             0.5 * kMiB / 300e9 + 1e-6 + 0.75 * kMiB / 300e9 + 3e-6);
  // Mesh 3x4 of H100s (12 devices: node 0 holds 0..7, node 1 holds 8..11). x's group {0, 4, 8} has two devices on
  // node 0 and one on node 1: k = 2, m = 2. Gathering across the network first moves S/2 over InfiniBand.
  const Target h = Target::load("dgx-h100");
  const double S = kMiB;
  const double gather = 0.5 * (S / 2) / 50e9 + 5e-6 + 0.5 * S / 450e9 + 1e-6;
  expect_rel(collective_time(Collective::kAllReduce, S, {0}, mesh_of({3, 4}), h), 2 * gather);
  // y's groups {0..3}, {4..7} are inside node 0, {8..11} inside node 1: the switch alone.
  expect_rel(collective_time(Collective::kAllReduce, S, {1}, mesh_of({3, 4}), h), 2 * (0.75 * S / 450e9 + 3e-6));
}

TEST(GpuTarget, DeviceOrderOnASwitchHasOneDim) {
  Target h = Target::load("dgx-h100");
  const DeviceMesh m = mesh_of({2, 8});
  EXPECT_EQ(h.device_order_str(m), "x*y");
  h.device_order = Target::parse_device_order("x,y");
  try {
    h.check_device_order(m);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--device-order: 2 physical dims given, but target dgx-h100 has 1 (switch)");
  }
}

}  // namespace
}  // namespace gspmd
