// core/cost/target.h: an emulated accelerator pod (the numbers the cost model and the reshard planner use).
// Sources for every preset number: docs/cost-model.md.
#pragma once

#include <string>
#include <vector>

namespace gspmd {

/// An emulated accelerator pod. Units: FLOP/s, bytes, bytes/s, seconds.
struct Target {
  std::string name;                 // "tpu-v3"
  double peak_flops = 0;            // per device, dense bf16/f32-matmul peak used for utilization (FLOP/s)
  double hbm_bytes = 0;             // HBM capacity per device (bytes)
  double hbm_bandwidth = 0;         // per device (bytes/s)
  double link_bandwidth = 0;        // one direction of one interconnect link (bytes/s)
  double link_latency = 0;          // per hop / per collective step (s)
  bool wraparound = true;           // torus (true) or mesh (false) links
  int links_per_axis = 2;           // links per device along one mesh axis (2 = both directions / neighbours)
  int torus_dims = 2;               // physical torus/mesh dimensions (2D for v3/v5e, 3D for v4). Mesh axis i runs on
                                    // physical dim i; axes beyond torus_dims fold onto the last dim (docs/cost-model.md)

  /// A preset by name ("tpu-v3", "tpu-v4", "tpu-v5e") or a JSON file path with the same fields.
  /// Throws InputError("--target: unknown target 'x' (known: tpu-v3, tpu-v4, tpu-v5e)").
  /// A JSON file is one flat object {"field": number|string|bool, ...} with the field names above, plus optional
  /// "base": "<preset>" to start from a preset (otherwise from the struct defaults). Unknown fields, bad syntax or
  /// non-positive peak_flops / hbm_bandwidth / link_bandwidth throw InputError("FILE: <why>"). A string is read as a
  /// file when it is not a preset and names an existing file, ends in ".json" or contains '/'.
  static Target load(const std::string& name_or_path);
  /// Names of the presets, in order ("tpu-v3", "tpu-v4", "tpu-v5e").
  static std::vector<std::string> presets();
  /// The target as a flat JSON object (loadable again with load()).
  std::string to_json() const;
};

}  // namespace gspmd
