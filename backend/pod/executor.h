// backend/pod/executor.h (private to backend/pod): the interpreter behind run_spmd, run_spmd_local, run_device_graph
// and run_single (pod.h). pod.cc implements it (run loop, kernels, gspmd ops, collectives, buffers); pod_run.cc binds
// weights and inputs to it, runs it and collects the outputs, stats and profile.
//
// Per device: a slot per program value, either owned (a Tensor the device holds) or shared (a pointer to data that
// outlives the run: program constants, replicated weights/inputs). Memory accounting counts every live value's
// bytes on every device whether owned or shared. Weights (params) and program constants are resident for the whole
// run; other values (inputs, intermediates) are freed after their last use; program outputs stay until the end.
// peak_memory_bytes = max over the run of the live bytes, measured after each node's outputs are allocated and
// before its dead operands are freed (operands and results coexist).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/pod/collective_executor.h"
#include "backend/pod/fusion.h"
#include "backend/pod/pod.h"
#include "core/ir/ir.h"

namespace gspmd::pod {

using Clock = std::chrono::steady_clock;

/// Host wall time elapsed since `t0` (seconds).
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// The interpreter: runs one program for a set of local devices in lock step, node by node, keeping every device's
/// values, memory accounting, stats and profile. Local device index d in [0, devices) is global device devices[d] of
/// the mesh. Fusion (fusion.h) sees its state through pod::FusionHost. Not thread-safe: one caller drives it (it
/// spreads the devices of a node over OpenMP threads itself).
class Executor final : private FusionHost {
 public:
  /// Runs `prog` for the devices `devices` (global ids on `mesh`; local index d holds device devices[d]); their
  /// collectives go to `coll`. `prog`, `mesh` and `coll` must outlive the executor. Throws std::out_of_range when a
  /// device id is not on the mesh.
  Executor(const Graph& prog, const DeviceMesh& mesh, std::vector<int64_t> devices, CollectiveExecutor& coll,
           const ExecutorOptions& options);

  /// Device d holds `t` as value v (its bytes are accounted to d until the slot is freed).
  void set_owned(int64_t d, int v, Tensor t);
  /// Device d sees `t` (owned by someone that outlives the run) as value v; accounted as if held. `owner`, when given,
  /// owns `t` and never changes it (a model weight or constant): kernels may cache what they derive from it (a
  /// convolution's weights in oneDNN's blocked layout) for as long as it lives.
  void set_shared(int64_t d, int v, const Tensor* t, const std::shared_ptr<const Tensor>& owner = {});
  /// Value v stays bound on every device for the whole run (a weight or a program constant).
  void mark_resident(int v) { resident_[v] = 1; }
  /// Value v is kept on every device until the end of the run (a program output).
  void keep(int v) { keep_[v] = 1; }
  /// Device d's value v, or nullptr when it is not live.
  const Tensor* get(int64_t d, int v) const { return ptr_[d][v]; }
  /// Moves value v of device d out (copies it when shared). The slot becomes empty; its bytes stay accounted.
  /// Throws InternalError "value 'X' is not available" when the slot is empty.
  Tensor take(int64_t d, int v);

  /// Runs every program node on every local device, calling `progress` (when set) with (nodes done, nodes in all)
  /// after each node or fused group. Throws as run_spmd (pod.h): UnsupportedError for a node with no kernel,
  /// InternalError "node 'X' (Op) on device k: <what>" on a kernel or collective failure or a result whose
  /// dtype/shape differs from the program's.
  void run(const RunProgress& progress = {});

  /// Fused groups planned for the last run (for tests and the profile).
  size_t fused_groups() const { return groups_.size(); }

  /// The steps of the last run() in order (a node, or a fused group), with their nodes' names and op types and their
  /// host wall times in seconds since `origin`.
  std::vector<ExecutedStep> timeline(Clock::time_point origin) const;

  /// Per local device: peak memory (bytes), compute and communication wall time (seconds).
  std::vector<DeviceStats>& stats() { return stats_; }
  /// FLOPs executed by all local devices so far (node_flops x devices).
  double host_flops() const { return host_flops_; }
  /// Adds `wall_s` seconds of wall time outside run() (loading, assembling) to the profile under `what`.
  void add_profile(const std::string& what, double wall_s);
  /// The profile so far, one OpProfile per kind of step, largest wall_s first.
  std::vector<OpProfile> profile() const;

 private:
  /// Runs f(d) for every device: up to par_ devices at a time, each on one OpenMP thread (kernels inside see one
  /// thread), or one after another when par_ == 1. The exception of the lowest failing device is rethrown.
  template <class F>
  void for_devices(F&& f);
  /// f(i) for i in [0, count), like for_devices (used for devices and for disjoint replica groups).
  template <class F>
  void for_each_index(int64_t count, F&& f);

  /// Empties device d's slot of value v and stops accounting its bytes.
  void release_slot(int64_t d, int v);
  /// Frees device d's value v unless it is resident or kept.
  void free_value(int64_t d, int v);
  /// Device d accounts `bytes` for value v, which the host never materialises (inside a fused group).
  void account_virtual(int64_t d, int v, int64_t bytes);
  /// Value v's bytes as the program declares them (dtype and shape).
  int64_t declared_bytes(int v) const { return prog_.values[static_cast<size_t>(v)].nbytes(); }

  /// Plans the fused groups of this run (none when ExecutorOptions::fuse is off).
  void plan_fusion();

  // pod::FusionHost (fusion.h documents each)
  const Graph& program() const override { return prog_; }
  int64_t devices() const override { return n_; }
  int parallelism() const override { return par_; }
  bool resident(int v) const override { return resident_[static_cast<size_t>(v)] != 0; }
  bool kept(int v) const override { return keep_[static_cast<size_t>(v)] != 0; }
  const Tensor* value(int64_t d, int v) const override { return ptr_[d][v]; }
  void parallel_for(int64_t count, const std::function<void(int64_t)>& f) override;
  void add_compute_s(int64_t d, double seconds) override { stats_[d].compute_wall_s += seconds; }
  /// Throws InternalError "node 'X' (Op) on device k: <what>" (k: the global id of local device d).
  [[noreturn]] void fail(const Node& n, int64_t d, const std::string& what) const override;
  /// Device d's input k of node n (nullptr for an omitted optional input); fails when it is not live.
  const Tensor* input(const Node& n, int64_t d, size_t k) const override;

  /// True when device d owns value v and node `node` (which reads v exactly once) is its last reader: the kernel may
  /// then reuse v's buffer. The accounting is unaffected (acct_ keeps v's bytes until it is freed after the node).
  bool donatable(const Node& n, int node, int64_t d, int v) const;
  /// Stores output k of node n on device d, checking it against the program's declared type and shape (fails on a
  /// mismatch). Does nothing for an output the node does not have or that is omitted.
  void store(const Node& n, int64_t d, size_t k, Tensor t);
  /// Data-dependent dims (Graph::runtime_dims, docs/shapes.md step 6): checks that output k of node n (value `val`)
  /// has the dims its expressions give at this run's sizes; a dim that is a data-dependent symbol not seen yet
  /// binds it (at most its bound). Fails naming the output otherwise.
  void check_runtime_dims(const Node& n, int64_t d, size_t k, const Value& val, const Tensor& t);
  /// Value v, a constant whose elements read a data-dependent symbol (a shape torch computed from NonZero's count),
  /// at the sizes device d has seen in this run; evaluated once per run.
  const Tensor* runtime_constant(const Node& n, int64_t d, int v) const;
  /// True when a node is too cheap to be worth waking worker threads for: views (Reshape & co. reuse the donated
  /// buffer) and nodes whose every output is small.
  bool cheap(const Node& n) const;
  /// Runs a kernel node (program node index `node`) on every device through run_kernel (backend/kernels).
  void run_kernel_node(const Node& n, int node);
  /// `axes` (an attribute of `n`) checked against the mesh; fails on an axis the mesh does not have.
  const std::vector<int>& checked(const Node& n, const std::vector<int>& axes) const;
  /// Runs a `gspmd` node (core/program/program_ops.h) on every device; UnsupportedError for an unknown op.
  void run_gspmd(const Node& n);
  /// Runs a collective node: one CollectiveExecutor call per replica group with members on this process.
  void run_collective(const Node& n);
  /// Runs `body(d, tile)` for every device d of this process, with d's tile index over `axes` (the node's
  /// mesh_axes); errors name the node and the device.
  template <class Body>
  void run_per_device(const Node& n, const std::vector<int>& axes, const Body& body);

  /// Program index of node `n` (an element of prog_.nodes).
  int current_node(const Node& n) const { return static_cast<int>(&n - prog_.nodes.data()); }
  /// How many of n's inputs are value v.
  static int count_uses(const Node& n, int v);

  const Graph& prog_;
  const DeviceMesh& mesh_;
  int64_t n_;
  size_t nv_;
  std::vector<int64_t> dev_;       // local index -> global device id
  std::vector<int64_t> local_of_;  // global device id -> local index, -1 when not held here
  CollectiveExecutor& coll_;
  const ExecutorOptions options_;
  std::vector<std::vector<Tensor>> own_;
  std::vector<std::vector<const Tensor*>> ptr_;
  std::vector<std::shared_ptr<const Tensor>> owner_;  // per value: the immutable weight it is bound to, if any
  std::vector<std::vector<int64_t>> acct_;            // bytes accounted per device and value (0 when not live)
  std::vector<int64_t> live_;
  std::vector<char> resident_, keep_;
  std::vector<int> last_use_;
  std::vector<DeviceStats> stats_;
  double host_flops_ = 0;
  int par_ = 1;
  std::map<std::string, OpProfile> profile_;
  std::vector<pod::FusedGroup> groups_;
  std::vector<int> group_at_;  // per node: index into groups_ of the group starting there, or -1
  /// When one step of the last run() ran: program nodes [first, last] (a node, or a fused group), host wall clock.
  struct StepTime {
    int first = 0, last = 0;
    Clock::time_point start, end;
  };
  std::vector<StepTime> steps_;
  // Data-dependent dims: whether the program has any, per value whether it is a constant that reads one, and per
  // device every symbol's size in this run (the hints, then each count as its node computes it), the counts bound so
  // far, and the constants evaluated at them.
  bool runtime_dims_ = false;
  std::vector<char> runtime_const_;
  std::vector<DimBindings> runtime_;
  std::vector<std::set<std::string>> seen_;
  mutable std::vector<std::map<int, Tensor>> evaluated_;
};

}  // namespace gspmd::pod
