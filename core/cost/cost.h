// core/cost: FLOPs and bytes per op, pod targets, and the simulated step time of an SPMD program.
// Per op: roofline max(FLOPs / peak, bytes / HBM bandwidth). Per collective: alpha-beta on rings over the mesh axes'
// physical links (bidirectional with wraparound on a torus). Sources for every target number are in docs/cost-model.md.
#pragma once

#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/partition/spmd.h"

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

  /// A preset by name ("tpu-v3", "tpu-v4", "tpu-v5e") or a JSON file path with the same fields.
  /// Throws InputError("--target: unknown target 'x' (known: tpu-v3, tpu-v4, tpu-v5e)").
  static Target load(const std::string& name_or_path);
};

/// FLOPs of one execution of `node` in `g` (2*M*N*K for MatMul/Gemm, 1 per output element for elementwise ops,
/// ~5 per element for Softmax/LayerNorm, 0 for pure data movement and gspmd ops).
double node_flops(const Graph& g, const Node& node);
/// Sum of node_flops over the graph.
double graph_flops(const Graph& g);
/// Bytes read + written by `node` (its inputs' and outputs' sizes).
double node_bytes(const Graph& g, const Node& node);

/// Time of one collective of `kind` on `bytes` per device over `mesh_axes` (alpha-beta, ring per axis):
/// all-gather/reduce-scatter (n-1)/n * bytes / bw + (n-1) * latency; all-reduce = reduce-scatter + all-gather;
/// all-to-all (n-1)/n * bytes / bw / (n/4 bisection on rings); collective-permute bytes / bw + latency.
double collective_time(const std::string& kind, double bytes, const std::vector<int>& mesh_axes,
                       const DeviceMesh& mesh, const Target& t);

/// Simulated cost of one step of the program on the target (every device runs the same program, so per-device
/// numbers are equal except for memory).
struct CostReport {
  double model_flops = 0;           // FLOPs of the unpartitioned model (one step)
  double compute_time_s = 0;        // sum of per-op roofline times of the program on one device
  double communication_time_s = 0;  // sum of collective times (no overlap)
  double step_time_s = 0;           // compute + communication
  double flops_utilization = 0;     // model_flops / (devices * peak * step_time)
};

/// Costs `p` (the global graph `g` gives model FLOPs). O(program nodes), independent of device count.
CostReport simulate_cost(const Graph& g, const SpmdProgram& p, const Target& t);

}  // namespace gspmd
