// core/cost/target.cc: the Target implementation: the TPU presets and the registry of added ones, the target-file
// reader and writer (Target::load, from_json, to_json), per-dtype peaks and the contraction curve, and how the mesh's
// axes are placed on the physical interconnect (--device-order). Sources of every preset number: docs/cost-model.md.
#include "core/cost/target.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/ir/json_bounded.h"

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------------------------------------------
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// See docs/cost-model.md for the sources and derivations.
Target preset_v3() {
  Target t;
  t.name = "tpu-v3";
  t.peak_flops = 123e12 / 2;                 // 123 TFLOP/s bf16 per chip, 2 TensorCores per chip; a device is a core
  t.hbm_bytes = 32 * kGiB / 2;               // 32 GiB per chip
  t.hbm_bandwidth = 900e9 / 2;               // 900 GB/s per chip
  t.link_bandwidth = 340e12 / 1024 / 4 / 2;  // all-reduce BW per pod / chips / ICI ports, shared by the 2 cores
  t.link_latency = 1e-6;
  t.wraparound = true;
  t.links_per_axis = 2;
  t.torus_dims = 2;
  return t;
}

Target preset_v4() {
  Target t;
  t.name = "tpu-v4";
  t.peak_flops = 275e12;       // per chip (megacore: one device per chip)
  t.peak_flops_int8 = 275e12;  // "275 teraflops (bf16 or int8)"
  t.hbm_bytes = 32 * kGiB;
  t.hbm_bandwidth = 1200e9;
  t.link_bandwidth = 1.1e15 / 4096 / 6;  // all-reduce BW per pod / chips / 6 ICI ports = 44.8 GB/s
  t.link_latency = 1e-6;
  t.wraparound = true;
  t.links_per_axis = 2;
  t.torus_dims = 3;
  return t;
}

Target preset_v5e() {
  Target t;
  t.name = "tpu-v5e";
  t.peak_flops = 197e12;
  t.peak_flops_int8 = 394e12;  // "Peak compute per chip (int8) 394 TOPs"
  t.hbm_bytes = 16 * kGiB;
  t.hbm_bandwidth = 819e9;
  t.link_bandwidth = 400e9 / 4 / 2;  // 400 GB/s bidirectional ICI per chip, 4 ports, 2 directions = 50 GB/s
  t.link_latency = 1e-6;
  t.wraparound = true;
  t.links_per_axis = 2;
  t.torus_dims = 2;
  return t;
}

// GPU nodes (docs/cost-model.md, "GPU clusters"): one device is one GPU; 8 GPUs per node on NVSwitch (every GPU's
// NVLinks go to the switches: a "switch" topology with `nvlinks` links of 25 GB/s per direction, 50 GB/s both ways),
// one InfiniBand NIC of `nic_bits` bits/s per GPU between nodes. Peaks are the datasheets' dense (not sparse)
// tensor-core rates: bf16 = fp16, and true FP32 (no TF32); "80GB" is 80 GiB.
Target gpu_node(const char* name, double bf16, double f32, double int8, double hbm_bandwidth, int nvlinks,
                double nic_bits) {
  Target t;
  t.name = name;
  t.peak_flops = t.peak_flops_bf16 = t.peak_flops_f16 = bf16;
  t.peak_flops_f32 = f32;
  t.peak_flops_int8 = int8;
  t.hbm_bytes = 80 * kGiB;
  t.hbm_bandwidth = hbm_bandwidth;
  t.link_bandwidth = 25e9;
  t.links_per_axis = nvlinks;
  t.link_latency = 1e-6;
  t.torus_dims = 0;  // NVSwitch
  t.wraparound = true;
  t.devices_per_node = 8;
  t.network_bandwidth = nic_bits / 8;
  t.network_latency = 5e-6;
  return t;
}

// A100 80GB SXM: BF16 312 TFLOPS (624 with sparsity), FP32 19.5, INT8 624 TOPS (1248 sparse), HBM2e 2,039 GB/s,
// 12 NVLink 3 links (600 GB/s both ways); DGX A100: one 200 Gb/s HDR ConnectX-6 per GPU.
Target preset_dgx_a100() { return gpu_node("dgx-a100", 312e12, 19.5e12, 624e12, 2039e9, 12, 200e9); }

// H100 SXM: BF16 1,979 TFLOPS with sparsity (half dense), FP32 67, INT8 3,958 TOPS sparse, HBM3 3.35 TB/s, 18 NVLink 4
// links (900 GB/s both ways); DGX H100: one 400 Gb/s NDR ConnectX-7 per GPU.
Target preset_dgx_h100() { return gpu_node("dgx-h100", 1979e12 / 2, 67e12, 3958e12 / 2, 3.35e12, 18, 400e9); }

// A named preset: the built-in TPUs and GPU nodes, then those registered by register_preset (the CLI's measured
// "host").
struct PresetRegistry {
  std::vector<std::pair<std::string, std::function<Target()>>> entries;
  PresetRegistry() {
    entries = {{"tpu-v3", preset_v3},
               {"tpu-v4", preset_v4},
               {"tpu-v5e", preset_v5e},
               {"dgx-a100", preset_dgx_a100},
               {"dgx-h100", preset_dgx_h100}};
  }
  const std::function<Target()>* find(const std::string& name) const {
    for (const auto& [n, f] : entries)
      if (n == name) return &f;
    return nullptr;
  }
};
PresetRegistry& registry() {
  static PresetRegistry r;
  return r;
}
std::string known_presets() {
  std::string s;
  for (const auto& [n, f] : registry().entries) s += (s.empty() ? "" : ", ") + n;
  return s;
}

bool file_exists(const std::string& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}

Target load_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))  // a FIFO would block
    throw InputError(fmt::format("{}: not a regular file (a directory, FIFO, socket or device)", path));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(fmt::format("{}: cannot open target file", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return Target::from_json(ss.str(), path);
}

}  // namespace

namespace {

/// A target file's "contraction_curve" `v` ([[flops, flop_per_s], ...]) into t.contraction_curve; throws InputError
/// naming `path` unless the points are positive with increasing flops.
void parse_contraction_curve(const nlohmann::json& v, const std::string& path, Target& t) {
  t.contraction_curve.clear();
  bool ok = v.is_array();
  for (const auto& pt : ok ? v : nlohmann::json::array()) {
    ok = ok && pt.is_array() && pt.size() == 2 && pt[0].is_number() && pt[1].is_number() && pt[0].get<double>() > 0 &&
         pt[1].get<double>() > 0 &&
         (t.contraction_curve.empty() || pt[0].get<double>() > t.contraction_curve.back().first);
    if (ok) t.contraction_curve.emplace_back(pt[0].get<double>(), pt[1].get<double>());
  }
  if (!ok)
    throw InputError(
        fmt::format("{}: 'contraction_curve' must be [[flops, flop_per_s], ...] with positive "
                    "numbers and increasing flops",
                    path));
}

/// A target file's "topology" `v` ("ring", "line", "<n>d-torus", "<n>d-mesh", "switch") into t.torus_dims and
/// t.wraparound; throws InputError naming `path` for another.
void parse_topology(const nlohmann::json& v, const std::string& path, Target& t) {
  std::string s = v.is_string() ? v.get<std::string>() : "";
  int dims = 0;
  bool wrap = false;
  if (s == "switch") {
    dims = 0;
    wrap = true;
  } else if (s == "ring" || s == "line") {
    dims = 1;
    wrap = s == "ring";
  } else if (s.size() >= 4 && s[0] >= '1' && s[0] <= '9' && s[1] == 'd' &&
             (s.substr(2) == "-torus" || s.substr(2) == "-mesh")) {
    dims = s[0] - '0';
    wrap = s.substr(2) == "-torus";
  } else {
    throw InputError(
        fmt::format("{}: 'topology' must be \"ring\", \"line\", \"<n>d-torus\", \"<n>d-mesh\" or \"switch\"", path));
  }
  t.torus_dims = dims;
  t.wraparound = wrap;
}

}  // namespace

Target Target::from_json(const std::string& text, const std::string& path) {
  nlohmann::json js;
  try {
    js = parse_json_bounded(text, path);
  } catch (const nlohmann::json::exception& e) {  // malformed, or a number out of range
    throw InputError(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!js.is_object()) throw InputError(fmt::format("{}: expected one JSON object {{\"field\": value, ...}}", path));
  Target t;
  std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (base.size() > 5 && base.ends_with(".json")) base.resize(base.size() - 5);
  t.name = base;  // the file's stem unless "name" says otherwise
  if (js.contains("base")) {
    const auto& b = js["base"];
    const auto* make = b.is_string() ? registry().find(b.get<std::string>()) : nullptr;
    if (!b.is_string()) throw InputError(fmt::format("{}: 'base' must be a string", path));
    if (!make)
      throw InputError(
          fmt::format("{}: unknown base target '{}' (known: {})", path, b.get<std::string>(), known_presets()));
    std::string keep = t.name;
    t = (*make)();
    t.name = keep;
  }
  if (js.contains("topology") && (js.contains("torus_dims") || js.contains("wraparound")))
    throw InputError(fmt::format("{}: give 'topology' or 'torus_dims'/'wraparound', not both", path));
  auto num = [&](const std::string& k, const nlohmann::json& v) {
    if (!v.is_number()) throw InputError(fmt::format("{}: field '{}' must be a number", path, k));
    double d = v.get<double>();
    if (!std::isfinite(d) || d < 0)
      throw InputError(fmt::format("{}: field '{}' must be a finite number >= 0", path, k));
    return d;
  };
  const std::vector<std::pair<const char*, double Target::*>> numbers = {
      {"peak_flops", &Target::peak_flops},
      {"peak_flops_f32", &Target::peak_flops_f32},
      {"peak_flops_bf16", &Target::peak_flops_bf16},
      {"peak_flops_f16", &Target::peak_flops_f16},
      {"peak_flops_int8", &Target::peak_flops_int8},
      {"hbm_bytes", &Target::hbm_bytes},
      {"hbm_bandwidth", &Target::hbm_bandwidth},
      {"link_bandwidth", &Target::link_bandwidth},
      {"link_latency", &Target::link_latency},
      {"op_overhead", &Target::op_overhead},
      {"network_bandwidth", &Target::network_bandwidth},
      {"network_latency", &Target::network_latency}};
  for (const auto& [k, v] : js.items()) {
    if (k == "base") continue;
    auto it = std::find_if(numbers.begin(), numbers.end(), [&k = k](const auto& e) { return k == e.first; });
    if (it != numbers.end()) {
      t.*(it->second) = num(k, v);
    } else if (k == "name") {
      if (!v.is_string()) throw InputError(fmt::format("{}: 'name' must be a string", path));
      t.name = v.get<std::string>();
    } else if (k == "conv_efficiency") {
      t.conv_efficiency = num(k, v);
      if (!(t.conv_efficiency > 0)) throw InputError(fmt::format("{}: conv_efficiency must be > 0", path));
    } else if (k == "contraction_curve") {
      parse_contraction_curve(v, path, t);
    } else if (k == "measured_ops") {
      if (!v.is_object())
        throw InputError(fmt::format("{}: 'measured_ops' must be {{\"op signature\": seconds, ...}}", path));
      t.measured_ops.clear();
      for (const auto& [sig, sec] : v.items()) t.measured_ops[sig] = num("measured_ops." + sig, sec);
    } else if (k == "wraparound") {
      if (!v.is_boolean()) throw InputError(fmt::format("{}: 'wraparound' must be true or false", path));
      t.wraparound = v.get<bool>();
    } else if (k == "devices_per_node") {
      double d = num(k, v);
      if (d != std::floor(d) || d > 1e9)
        throw InputError(fmt::format("{}: field 'devices_per_node' must be an integer >= 0", path));
      t.devices_per_node = static_cast<int64_t>(d);
    } else if (k == "links_per_axis" || k == "torus_dims") {
      double d = num(k, v);
      if (d < 1 || d != std::floor(d) || d > 64)
        throw InputError(fmt::format("{}: field '{}' must be an integer in [1, 64]", path, k));
      (k == "links_per_axis" ? t.links_per_axis : t.torus_dims) = static_cast<int>(d);
    } else if (k == "topology") {
      parse_topology(v, path, t);
    } else {
      std::string known =
          "name, base, topology, wraparound, links_per_axis, torus_dims, devices_per_node, contraction_curve, "
          "conv_efficiency, measured_ops";
      for (const auto& e : numbers) known += std::string(", ") + e.first;
      throw InputError(fmt::format("{}: unknown field '{}' (known: {})", path, k, known));
    }
  }
  if (!(t.peak_flops > 0)) throw InputError(fmt::format("{}: peak_flops must be > 0", path));
  if (!(t.hbm_bandwidth > 0)) throw InputError(fmt::format("{}: hbm_bandwidth must be > 0", path));
  if (!(t.link_bandwidth > 0)) throw InputError(fmt::format("{}: link_bandwidth must be > 0", path));
  if (t.devices_per_node > 0 && !(t.network_bandwidth > 0))
    throw InputError(fmt::format("{}: network_bandwidth must be > 0 when devices_per_node is set", path));
  if (t.devices_per_node > 0 && t.torus_dims != 0)
    throw InputError(fmt::format(
        "{}: devices_per_node needs topology \"switch\" (the devices of a node share one switch), not \"{}\"", path,
        t.topology()));
  return t;
}

std::vector<std::string> Target::presets() {
  std::vector<std::string> v;
  for (const auto& [n, f] : registry().entries) v.push_back(n);
  return v;
}

void Target::register_preset(const std::string& name, std::function<Target()> make) {
  for (auto& [n, f] : registry().entries)
    if (n == name) {
      f = std::move(make);
      return;
    }
  registry().entries.emplace_back(name, std::move(make));
}

Target Target::load(const std::string& name_or_path) {
  if (const auto* make = registry().find(name_or_path)) return (*make)();
  if (!name_or_path.empty() &&
      (name_or_path.ends_with(".json") || name_or_path.find('/') != std::string::npos || file_exists(name_or_path)))
    return load_file(name_or_path);
  throw InputError(fmt::format("--target: unknown target '{}' (known: {})", name_or_path, known_presets()));
}

std::string Target::to_json() const {
  nlohmann::json j;
  j["name"] = name;
  j["peak_flops"] = peak_flops;
  j["peak_flops_f32"] = peak_flops_f32;
  j["peak_flops_bf16"] = peak_flops_bf16;
  j["peak_flops_f16"] = peak_flops_f16;
  j["peak_flops_int8"] = peak_flops_int8;
  j["hbm_bytes"] = hbm_bytes;
  j["hbm_bandwidth"] = hbm_bandwidth;
  j["link_bandwidth"] = link_bandwidth;
  j["link_latency"] = link_latency;
  j["op_overhead"] = op_overhead;
  j["topology"] = topology();
  j["contraction_curve"] = contraction_curve;
  j["conv_efficiency"] = conv_efficiency;
  j["links_per_axis"] = links_per_axis;
  if (devices_per_node > 0) {  // GPU clusters only: the TPU presets' files stay as they were
    j["devices_per_node"] = devices_per_node;
    j["network_bandwidth"] = network_bandwidth;
    j["network_latency"] = network_latency;
  }
  if (!measured_ops.empty()) j["measured_ops"] = measured_ops;
  return j.dump();
}

double Target::peak_for(DType dtype) const {
  double p = 0;
  switch (dtype) {
    case DType::kFloat32: p = peak_flops_f32; break;
    case DType::kBFloat16: p = peak_flops_bf16; break;
    case DType::kFloat16: p = peak_flops_f16; break;
    case DType::kInt8:
    case DType::kUInt8: p = peak_flops_int8; break;
    default: break;
  }
  return p > 0 ? p : peak_flops;
}

double Target::contraction_rate(double flops, DType dtype, bool conv) const {
  double rate = peak_for(dtype);
  const auto& c = contraction_curve;
  if (!c.empty()) {
    double r = c.front().second;
    if (flops >= c.back().first) {
      r = c.back().second;
    } else if (flops > c.front().first) {
      size_t i = 1;
      while (c[i].first < flops) ++i;
      const double w = std::log(flops / c[i - 1].first) / std::log(c[i].first / c[i - 1].first);
      r = c[i - 1].second + w * (c[i].second - c[i - 1].second);
    }
    rate = std::min(rate, r);
  }
  return conv ? rate * conv_efficiency : rate;
}

std::string Target::topology() const {
  if (torus_dims == 0) return "switch";
  if (torus_dims <= 1) return wraparound ? "ring" : "line";
  return fmt::format("{}d-{}", torus_dims, wraparound ? "torus" : "mesh");
}

std::vector<std::vector<std::string>> Target::parse_device_order(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  auto split = [](const std::string& s, char c) {
    std::vector<std::string> parts;
    size_t b = 0;
    for (size_t e; (e = s.find(c, b)) != std::string::npos; b = e + 1) parts.push_back(s.substr(b, e - b));
    parts.push_back(s.substr(b));
    return parts;
  };
  for (const std::string& dim : split(text, ',')) {
    out.emplace_back();
    for (const std::string& axis : split(dim, '*')) {
      if (axis.empty())
        throw InputError(
            fmt::format("--device-order: '{}' has an empty axis name (expected e.g. \"y,x\" or "
                        "\"data,model*expert\")",
                        text));
      out.back().push_back(axis);
    }
  }
  return out;
}

namespace {

// Physical dim and folding position of every user axis of `mesh` under t's device order (default: user axis i on
// dim min(i, dims-1), folded in axis order).
struct UserPlacement {
  std::vector<int> dim, pos;
};
UserPlacement user_placement(const Target& t, const DeviceMesh& mesh) {
  const std::vector<std::string>& names = mesh.sub.empty() ? mesh.axes : mesh.user_axes;
  const int n = static_cast<int>(names.size());
  UserPlacement u{std::vector<int>(static_cast<size_t>(n), -1), std::vector<int>(static_cast<size_t>(n), 0)};
  const int dims = std::max(1, t.torus_dims);
  if (t.device_order.empty()) {
    for (int i = 0; i < n; ++i) {
      u.dim[static_cast<size_t>(i)] = std::min(i, dims - 1);
      u.pos[static_cast<size_t>(i)] = i;
    }
    return u;
  }
  if (static_cast<int>(t.device_order.size()) > dims)
    throw InputError(fmt::format("--device-order: {} physical dims given, but target {} has {} ({})",
                                 t.device_order.size(), t.name, dims, t.topology()));
  for (size_t d = 0; d < t.device_order.size(); ++d)
    for (size_t k = 0; k < t.device_order[d].size(); ++k) {
      const std::string& a = t.device_order[d][k];
      auto it = std::find(names.begin(), names.end(), a);
      if (it == names.end())
        throw InputError(
            fmt::format("--device-order: unknown mesh axis '{}' (mesh axes: {})", a, fmt::join(names, ", ")));
      size_t i = static_cast<size_t>(it - names.begin());
      if (u.dim[i] >= 0) throw InputError(fmt::format("--device-order: mesh axis '{}' is given twice", a));
      u.dim[i] = static_cast<int>(d);
      u.pos[i] = static_cast<int>(k);
    }
  for (int i = 0; i < n; ++i)
    if (u.dim[static_cast<size_t>(i)] < 0)
      throw InputError(fmt::format("--device-order: mesh axis '{}' is missing (every axis must be placed once)",
                                   names[static_cast<size_t>(i)]));
  return u;
}

}  // namespace

void Target::check_device_order(const DeviceMesh& mesh) const { (void)user_placement(*this, mesh); }

std::string Target::device_order_str(const DeviceMesh& mesh) const {
  const std::vector<std::string>& names = mesh.sub.empty() ? mesh.axes : mesh.user_axes;
  UserPlacement u = user_placement(*this, mesh);
  std::vector<std::vector<std::pair<int, std::string>>> dims;
  for (size_t i = 0; i < names.size(); ++i) {
    if (dims.size() <= static_cast<size_t>(u.dim[i])) dims.resize(static_cast<size_t>(u.dim[i]) + 1);
    dims[static_cast<size_t>(u.dim[i])].emplace_back(u.pos[i], names[i]);
  }
  std::vector<std::string> out;
  for (auto& d : dims) {
    std::sort(d.begin(), d.end());
    std::vector<std::string> axes;
    for (auto& [p, n] : d) axes.push_back(n);
    out.push_back(fmt::format("{}", fmt::join(axes, "*")));
  }
  return fmt::format("{}", fmt::join(out, ","));
}

AxisPlacement Target::placement(int a, const DeviceMesh& mesh) const {
  UserPlacement u = user_placement(*this, mesh);
  // Axes folded onto one physical dim are ordered by (position of their user axis, refined index): parts of a
  // refined axis are consecutive, major first.
  auto key = [&](int b) {
    size_t ub = static_cast<size_t>(mesh.user_axis(b));
    return std::make_pair(u.pos[ub], b);
  };
  AxisPlacement p;
  p.physical_dim = u.dim[static_cast<size_t>(mesh.user_axis(a))];
  double span_total = 1;
  for (int b = 0; b < mesh.rank(); ++b) {
    if (u.dim[static_cast<size_t>(mesh.user_axis(b))] != p.physical_dim) continue;
    span_total *= static_cast<double>(mesh.shape[static_cast<size_t>(b)]);
    if (key(b) > key(a)) p.stride *= static_cast<double>(mesh.shape[static_cast<size_t>(b)]);
  }
  const double n = static_cast<double>(mesh.shape[static_cast<size_t>(a)]);
  if (torus_dims == 0) {  // a switch: every device reaches every other with all its links, whatever the stride
    p.wraparound = true;
    p.ring_bandwidth = switch_bandwidth();
    return p;
  }
  p.wraparound = wraparound && n * p.stride == span_total;
  p.ring_bandwidth = link_bandwidth * std::max(1, links_per_axis) * (p.wraparound ? 1.0 : 0.5) / p.stride;
  return p;
}

}  // namespace gspmd
