// core/cost: FLOPs and bytes per op, pod targets, and the simulated step time of an SPMD program.
// Per op: roofline max(FLOPs / peak, bytes / HBM bandwidth). Per collective: alpha-beta on rings over the mesh axes'
// physical links (bidirectional with wraparound on a torus). Sources for every target number are in docs/cost-model.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cost/target.h"
#include "core/ir/ir.h"
#include "core/program/program.h"

namespace gspmd {

/// FLOPs of one execution of `node` in `g` (2*M*N*K for MatMul/Gemm, 1 per output element for elementwise ops,
/// ~5 per element for Softmax/LayerNorm, 0 for pure data movement and gspmd ops).
double node_flops(const Graph& g, const Node& node);
/// Sum of node_flops over the graph.
double graph_flops(const Graph& g);
/// Bytes read + written by `node` (its inputs' and outputs' sizes).
double node_bytes(const Graph& g, const Node& node);

/// Time of one collective of `kind` on `bytes` per device over `mesh_axes` (alpha-beta, ring per axis).
/// `bytes` is the per-device payload as in CollectiveRecord: the larger of the local operand and result (S).
/// Per mesh axis a of size n: ring bandwidth bw_a = links_per_axis * link_bandwidth (x 1/2 without wraparound).
///   all-gather / reduce-scatter over one axis: (n-1)/n * S / bw + (n-1) * latency
///   all-reduce = reduce-scatter + all-gather = 2 * that
///   all-to-all over one axis: floor(n^2/4)/n * S / bw + (n-1) * latency   (bisection bound of a ring)
///   collective-permute: S / link_bandwidth + latency                    (one neighbour hop, one direction)
/// Several axes: hierarchical, one axis after the other (all-gather: the stage over the axis done last moves the
/// full S, the one before S/n_last, ...; the cheapest axis order is used); all-to-all: sum over axes with the full S.
/// On a switch (t.torus_dims 0) every axis is a ring of bw = t.switch_bandwidth() wherever its devices are (several
/// axes: hierarchical as above); all-to-all moves (n-1)/n * S per axis and collective-permute takes
/// S / switch_bandwidth.
/// GPU clusters (t.devices_per_node > 0), when a replica group (DeviceMesh::replica_groups) spans m > 1 nodes with at
/// most k of its devices on one node: two levels, the node's switch (k, switch_bandwidth, link_latency) and the
/// network (m, network_bandwidth, network_latency), in the cheapest order as above (all-reduce = intra-node
/// reduce-scatter, inter-node all-reduce of S/k, intra-node all-gather); all-to-all (k-1)/(k m) * S over the switch
/// plus (m-1)/m * S over the network; collective-permute S / network_bandwidth + network_latency. Groups inside one
/// node use the switch alone. Cost O(devices) then (docs/cost-model.md, "GPU clusters").
/// Axes of size 1 and an empty axis list cost 0. A mesh axis outside the mesh: std::invalid_argument.
double collective_time(Collective kind, double bytes, const std::vector<int>& mesh_axes, const DeviceMesh& mesh,
                       const Target& t);

/// The identity of an op for Target::measured_ops: op type (with "domain:" when not ai.onnx), the inputs' dtypes and
/// shapes ("-" for an absent one), the outputs', and every attribute, e.g.
/// `Conv(float32[16,64,10,16],float32[64,64,3,3],-)->(float32[16,64,8,16]){group=1,pads=[0,1,0,1]}`. Two nodes
/// with the same signature run the same kernel on the same shapes. Throws nothing (graph attributes show as "graph").
std::string op_signature(const Graph& g, const Node& node);

/// Simulated time of one node of an SPMD program on one device: collective_time for gspmd collectives
/// (is_collective, core/program/program_ops.h; bytes = the larger of operand and result); the target's measured_ops
/// entry for op_signature(node) when there is one; otherwise the roofline max(node_flops / peak_for(dtype of the
/// first input), node_bytes / hbm_bandwidth) + op_overhead.
double node_time(const Graph& program, const Node& node, const DeviceMesh& mesh, const Target& t);

/// What a buffer of the step holds, for the memory breakdown (docs/training.md, "Memory").
enum class MemoryKind : uint8_t {
  kWeights,           // initializers (trained weights, frozen weights, constants), variables (trained graph
                      // inputs) and the updated weights
  kGradients,         // the trained weights' gradients and their resharded copies
  kOptimizerState,    // momentum / Adam moments (initializers, or inputs for variables), before and after the
                      // update, and their copies
  kSavedActivations,  // computed by the forward pass and read by the backward pass (kept across the boundary)
  kInputs,            // the step's other graph inputs (data, labels)
  kTransient,         // everything else: intermediates, collective buffers, copies of weights
};
inline constexpr size_t kMemoryKinds = 6;
/// "weights", "gradients", "optimizer_state", "saved_activations", "inputs", "transient" (report keys).
std::string_view memory_kind_name(MemoryKind k);

/// The roles of a training step's global values (built by training_memory_roles, core/autodiff/autodiff.h).
/// Without roles, a step is a forward graph: initializers are weights, graph inputs inputs, the rest transient.
struct MemoryRoles {
  std::vector<MemoryKind> kind;  // per global value: kWeights (trained weight or updated weight), kGradients,
                                 // kOptimizerState (state or updated state); kTransient for everything else
  std::vector<char> donated;     // per global value: an initializer the step may free after its last reader
  /// Per global value (empty: none): a gradient buffer that MemoryBreakdown::total does not count (gradient
  /// accumulation's per-microbatch gradients and running sums: each weight's gradient counts once, as its final sum).
  std::vector<char> partial;
  /// The step's forward passes (with the loss) as global node ranges [begin, end), in order
  /// (TrainingStep::forward_ranges): one, or one per microbatch with --accumulate. Empty: no phases.
  std::vector<std::pair<int, int>> forward_ranges;

  /// The phase of global node `n`: 2m in forward pass m (forward_ranges[m]), 2m + 1 after it, up to the next forward
  /// pass (microbatch m's backward pass; after the last one, with the update); -1 for no node or no phases.
  /// O(log passes).
  int phase(int n) const;
  /// The last phase (the last backward pass and the update), -1 without phases.
  int last_phase() const { return 2 * static_cast<int>(forward_ranges.size()) - 1; }
  /// The forward pass (an index into forward_ranges) that global node `n` belongs to, or -1 (a backward pass, the
  /// update, or no node).
  int forward_pass(int n) const {
    const int p = phase(n);
    return p >= 0 && p % 2 == 0 ? p / 2 : -1;
  }
};

/// Per-device memory of one step: the peak and what is live at that moment, by kind.
struct MemoryBreakdown {
  int64_t peak_bytes = 0;                       // as static peak memory (bytes)
  std::array<int64_t, kMemoryKinds> at_peak{};  // live bytes by MemoryKind at the peak; sums to peak_bytes
  /// What each kind needs over the whole step (bytes): weights and optimizer state: their params (the trained
  /// weights' slices, or every weight and constant without roles; the updated values replace them); gradients: each
  /// weight's gradient once, at its smallest local copy (the sharded gradient the update reads; a partial sum before
  /// its reduce-scatter is a larger copy); saved activations and inputs: every such program value; transient
  /// 0.
  std::array<int64_t, kMemoryKinds> total{};
  int peak_node = -1;  // program node at whose results the peak is sampled (-1: before
                       // the first node)
};

/// Peak bytes one device holds while running `p.program` in node order (a static estimate, no data needed): weights,
/// constants and inputs for the whole step, except donated params (ProgramBinding::donated, which partition sets
/// from the roles; the emulator reads the same flag), freed after their last reader; every other value from the node
/// that makes it to its last reader (graph outputs to the end; a result nobody reads is dropped at once). The
/// emulator's measured peak (PodRun::peak_memory_bytes) follows the same rules. A program value's kind is its origin's
/// (SpmdProgram::value_origin) per `roles`, except that a copy of a weight that is not a param is transient, and a
/// value made by a forward node (MemoryRoles::forward_pass) and read by a backward one is a saved activation.
/// O(nodes + values).
MemoryBreakdown memory_breakdown(const SpmdProgram& p, const MemoryRoles* roles = nullptr);

/// Simulated cost of one step of the program on the target (every device runs the same program, so per-device
/// numbers are equal except for memory).
struct CostReport {
  double model_flops = 0;            // FLOPs of the unpartitioned model (one step)
  double compute_time_s = 0;         // sum of per-op roofline times of the program on one device
  double communication_time_s = 0;   // sum of collective times (no overlap)
  double step_time_s = 0;            // compute + communication
  double flops_utilization = 0;      // model_flops / (devices * peak * step_time)
  std::vector<double> node_time_s;   // per program node id: node_time (without overlap they sum to step_time_s)
  std::vector<double> node_start_s;  // per program node id: when it starts in the step (s)
  bool overlap = false;              // collectives overlapped with independent compute (simulate_cost's option)
  int64_t peak_memory_bytes = 0;     // memory.peak_bytes: the same on every device (bytes)
  MemoryBreakdown memory;            // memory_breakdown of the program
};

/// Costs `p` (the global graph `g` gives model FLOPs). O(program nodes), independent of device count.
/// With `overlap`, collectives run on a communication stream beside the compute stream: every node starts once its
/// operands are ready and its stream is free, in program order per stream (a list schedule); step_time_s is then
/// the makespan, which is at most compute + communication. Off by default (the GSPMD paper's numbers do not assume
/// overlap).
/// `roles`: a training step's memory roles (memory_breakdown), null for a forward graph.
CostReport simulate_cost(const Graph& g, const SpmdProgram& p, const Target& t, bool overlap = false,
                         const MemoryRoles* roles = nullptr);

}  // namespace gspmd
