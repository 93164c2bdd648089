// core/cost/target.h: an emulated accelerator pod (the numbers the cost model and the reshard planner use), and how
// the mesh's axes sit on its physical interconnect. Sources for every preset number: docs/cost-model.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// Where one mesh axis runs on the target's physical torus or mesh (docs/cost-model.md, "Mapping mesh axes").
struct AxisPlacement {
  int physical_dim = 0;       // 0 .. torus_dims-1
  double stride = 1;          // product of the sizes of the axes folded more-minor onto the same physical dim
  bool wraparound = false;    // the axis' ring closes (it spans its physical dim and the target wraps around)
  double ring_bandwidth = 0;  // per device along this axis (bytes/s): links_per_axis * link_bandwidth
                              // (x 1/2 without wraparound) / stride
};

/// An emulated accelerator pod: one device of the SPMD program (the unit that gets a partition id) and its links.
/// Units: FLOP/s, bytes, bytes/s, seconds.
struct Target {
  std::string name;            // "tpu-v3"
  double peak_flops = 0;       // per device: the dense-matmul peak of the default compute dtype (bf16 on TPUs,
                               // f32 on the host); FLOPs utilization is model FLOPs over this peak
  double peak_flops_f32 = 0;   // per-dtype peaks (FLOP/s) for ops computing in that dtype; 0 = peak_flops.
  double peak_flops_bf16 = 0;  //   TPUs run f32 matmuls as bf16 passes at XLA's default precision, so their
  double peak_flops_f16 = 0;   //   f32 peak is the bf16 peak
  double peak_flops_int8 = 0;  //   int8/uint8 (MatMulInteger, ConvInteger, QLinear*)
  double hbm_bytes = 0;        // HBM capacity per device (bytes)
  double hbm_bandwidth = 0;    // per device (bytes/s)
  double link_bandwidth = 0;   // one direction of one interconnect link (bytes/s)
  double link_latency = 0;     // per hop / per collective step (s)
  double op_overhead = 0;      // fixed time per non-collective op (s): dispatch and launch; 0 on the TPU
                               // presets (XLA fuses ops; not modelled), measured for "host"
  bool wraparound = true;      // torus (true) or mesh (false) links
  int links_per_axis = 2;      // links per device along one mesh axis (2 = both directions / neighbours); on a
                               // switch, the device's links to the switch (12 NVLinks on an A100, 18 on an H100)
  int torus_dims = 2;          // physical torus/mesh dimensions: 1 = ring (or line), 2 for v3/v5e, 3 for v4;
                               // 0 = a switch (topology "switch", NVSwitch): every device reaches every other with
                               // all its links, so an axis' bandwidth does not depend on where it lies
  /// GPU clusters (docs/cost-model.md, "GPU clusters"): devices per node (0 = one interconnect for all devices, the
  /// TPU presets). Device k is on node k / devices_per_node (k as DeviceMesh numbers devices); the devices of a node
  /// share its switch (torus_dims 0), nodes are joined by a network of network_bandwidth per device.
  int64_t devices_per_node = 0;
  double network_bandwidth = 0;  // between nodes: one direction of one device's network link (bytes/s), e.g. one
                                 // 400 Gb/s InfiniBand NIC per H100
  double network_latency = 0;    // per step of a collective between nodes (s)
  /// Achieved FLOP/s of contractions (MatMul, Gemm, Einsum, Conv, ConvTranspose) by their FLOPs per op: points
  /// (flops, flop_per_s) in increasing flops, interpolated linearly in log(flops) and clamped at both ends. Empty:
  /// the peak (the TPU presets). Measured for "host", where small matmuls run far below the peak.
  std::vector<std::pair<double, double>> contraction_curve;
  double conv_efficiency = 1;  // Conv/ConvTranspose rate as a fraction of the curve's (or the peak's) rate
  /// Measured time (s) of one execution of an op, by op_signature (core/cost/cost.h): node_time uses it instead of
  /// the roofline for a node with that signature. Empty on the TPU presets. "host" fills it with the ops of the
  /// program being costed (backend/profile: measure_program_ops), as XLA's profile-guided latency estimator feeds
  /// measured instruction costs into its scheduler: oneDNN's speed on this machine varies 2.5x at equal FLOPs with
  /// the shape (a convolution's output width and channels), which no FLOPs curve predicts.
  std::map<std::string, double> measured_ops;
  /// --device-order: for each physical dim (major first), the user mesh axes laid along it (major first; several
  /// axes fold onto one dim). Empty: the default, user axis i on physical dim min(i, torus_dims-1).
  std::vector<std::vector<std::string>> device_order;

  /// A preset by name ("tpu-v3", "tpu-v4", "tpu-v5e", "dgx-a100", "dgx-h100", or one added with register_preset,
  /// e.g. the CLI's "host") or a JSON file path. A string is read as a file when it is not a preset and names an
  /// existing file, ends in ".json" or contains '/'. The file is one JSON object with the fields above (except
  /// device_order), plus optional "base": "<preset>" to start from a preset (otherwise from the struct defaults) and
  /// "topology": "ring", "line", "<n>d-torus", "<n>d-mesh" or "switch" (sets torus_dims and wraparound; not together
  /// with those two). Throws InputError("--target: unknown target 'x' (known: tpu-v3, ...)"), and
  /// InputError("FILE: <why>") for unreadable files, bad JSON, unknown fields, wrong types, negative numbers,
  /// non-positive peak_flops / hbm_bandwidth / link_bandwidth, and devices_per_node without network_bandwidth or
  /// on another topology than "switch".
  static Target load(const std::string& name_or_path);
  /// The same from JSON text; `origin` names it in errors (InputError("<origin>: <why>")), and its stem is the
  /// default name.
  static Target from_json(const std::string& text, const std::string& origin);
  /// Names of the presets, built-in first ("tpu-v3", "tpu-v4", "tpu-v5e", "dgx-a100", "dgx-h100"), then registered
  /// ones in order.
  static std::vector<std::string> presets();
  /// Adds (or replaces) a named preset made on demand by `make` (called at most once per load). The backend's
  /// measured "host" preset is registered this way by the CLI, so core stays free of the kernels.
  static void register_preset(const std::string& name, std::function<Target()> make);
  /// The target as a JSON object (loadable again with load(); device_order is not part of it).
  std::string to_json() const;

  /// Peak FLOP/s for an op computing in `dtype` (the per-dtype field, or peak_flops when it is 0 or the dtype has
  /// none: f64, integers other than 8-bit, bool).
  double peak_for(DType dtype) const;
  /// FLOP/s of one contraction of `flops` FLOPs in `dtype`: min(peak_for(dtype), contraction_curve at flops),
  /// times conv_efficiency for convolutions.
  double contraction_rate(double flops, DType dtype, bool conv) const;
  /// "ring", "line", "2d-torus", "3d-mesh", ..., "switch": torus_dims and wraparound as one word.
  std::string topology() const;
  /// One direction of all of a device's links together (bytes/s): link_bandwidth * links_per_axis. On a switch
  /// (torus_dims 0) every mesh axis and every collective inside a node runs at this bandwidth.
  double switch_bandwidth() const { return link_bandwidth * std::max(1, links_per_axis); }
  /// Parses a --device-order text: physical dims separated by ',', axes folded onto one dim joined by '*' (major
  /// first), e.g. "y,x" or "data,model*expert". Throws InputError("--device-order: ...") on empty parts.
  static std::vector<std::vector<std::string>> parse_device_order(const std::string& text);
  /// The effective order as text for `mesh` ("data,model"): device_order, or the default mapping.
  std::string device_order_str(const DeviceMesh& mesh) const;
  /// Checks device_order against `mesh` (its user axes): every axis exactly once, at most torus_dims groups.
  /// Throws InputError("--device-order: ...") naming the axis or the count.
  void check_device_order(const DeviceMesh& mesh) const;
  /// Placement of (refined) mesh axis `axis`: its physical dim, its stride among the axes folded onto that dim, and
  /// its ring bandwidth (on a switch: switch_bandwidth(), whatever the stride). The parts of a refined axis fold
  /// onto their parent's dim. O(mesh rank^2).
  AxisPlacement placement(int axis, const DeviceMesh& mesh) const;
};

}  // namespace gspmd
