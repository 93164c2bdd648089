// backend/pod: the SPMD interpreter. All devices run the program in lock step, node by node, on this host.
//
// Per device: a slot per program value, either owned (a Tensor the device holds) or shared (a pointer to data that
// outlives the run: program constants, replicated weights/inputs). Memory accounting counts every live value's
// bytes on every device whether owned or shared. Weights (params) and program constants are resident for the whole
// run; other values (inputs, intermediates) are freed after their last use; program outputs stay until the end.
// peak_memory_bytes = max over the run of the live bytes, measured after each node's outputs are allocated and
// before its dead operands are freed (operands and results coexist).
#include "backend/pod/pod.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <exception>
#include <map>
#include <memory>

#include <malloc.h>
#include <omp.h>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/pod/collective_executor.h"
#include "backend/kernels/onednn.h"
#include "backend/pod/collectives.h"
#include "backend/pod/fusion.h"
#include "core/partition/reshard.h"
#include "core/cost/cost.h"

namespace gspmd {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Number of devices that run a node concurrently: `device_threads` (ExecutorOptions) when not 0 (at least 1), else
/// min(devices, omp_get_max_threads()).
int device_parallelism(int64_t devices, int device_threads) {
  const int t = device_threads == 0 ? omp_get_max_threads() : std::max(1, device_threads);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(devices, t)));
}

/// Keeps freed tensor buffers in the heap for reuse instead of returning them to the OS (glibc serves large
/// allocations with mmap by default: every fresh intermediate then page-faults and is zeroed by the kernel).
/// Process-wide, set once; buffers up to 32 MiB (glibc's limit) come from the heap afterwards.
void keep_freed_buffers() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    return true;
  }();
  (void)done;
}

/// The interpreter; fusion (fusion.h) sees its state through pod::FusionHost.
class Executor final : private pod::FusionHost {
 public:
  /// Runs `prog` for the devices `devices` (global ids on `mesh`; local index d holds device devices[d]); their
  /// collectives go to `coll`.
  Executor(const Graph& prog, const DeviceMesh& mesh, std::vector<int64_t> devices, CollectiveExecutor& coll,
           const ExecutorOptions& options)
      : prog_(prog), mesh_(mesh), n_(static_cast<int64_t>(devices.size())), nv_(prog.values.size()),
        dev_(std::move(devices)), coll_(coll), options_(options), par_(device_parallelism(n_, options.device_threads)) {
    keep_freed_buffers();
    local_of_.assign(static_cast<size_t>(std::max<int64_t>(mesh.num_devices(), 1)), -1);
    for (int64_t d = 0; d < n_; ++d) local_of_.at(static_cast<size_t>(dev_[d])) = d;
    own_.assign(n_, std::vector<Tensor>(nv_));
    ptr_.assign(n_, std::vector<const Tensor*>(nv_, nullptr));
    owner_.assign(nv_, nullptr);
    acct_.assign(n_, std::vector<int64_t>(nv_, 0));
    live_.assign(n_, 0);
    resident_.assign(nv_, 0);
    keep_.assign(nv_, 0);
    for (int v : prog.outputs) keep_[v] = 1;
    stats_.resize(n_);
    for (int64_t d = 0; d < n_; ++d) stats_[d].device = dev_[d];
  }

  /// Device d holds `t` as value v.
  void set_owned(int64_t d, int v, Tensor t) {
    release_slot(d, v);
    own_[d][v] = std::move(t);
    ptr_[d][v] = &own_[d][v];
    acct_[d][v] = static_cast<int64_t>(own_[d][v].nbytes());
    live_[d] += acct_[d][v];
  }
  /// Device d sees `t` (owned by someone that outlives the run) as value v; accounted as if held. `owner`, when given,
  /// owns `t` and never changes it (a model weight or constant): kernels may cache what they derive from it (a
  /// convolution's weights in oneDNN's blocked layout) for as long as it lives.
  void set_shared(int64_t d, int v, const Tensor* t, const std::shared_ptr<const Tensor>& owner = {}) {
    release_slot(d, v);
    ptr_[d][v] = t;
    if (owner && owner.get() == t) owner_[v] = owner;
    acct_[d][v] = static_cast<int64_t>(t->nbytes());
    live_[d] += acct_[d][v];
  }
  void mark_resident(int v) { resident_[v] = 1; }
  void keep(int v) { keep_[v] = 1; }
  const Tensor* get(int64_t d, int v) const { return ptr_[d][v]; }

  /// Moves value v of device d out (copies it when shared). The slot becomes empty.
  Tensor take(int64_t d, int v) {
    const Tensor* p = ptr_[d][v];
    if (!p) throw std::runtime_error(fmt::format("value '{}' is not available", prog_.values[v].name));
    Tensor out = p == &own_[d][v] ? std::move(own_[d][v]) : *p;
    ptr_[d][v] = nullptr;
    return out;
  }

  /// Runs f(d) for every device: up to par_ devices at a time, each on one OpenMP thread (kernels inside see one
  /// thread), or one after another when par_ == 1. The exception of the lowest failing device is rethrown.
  template <class F>
  void for_devices(F&& f) {
    for_each_index(n_, f);
  }
  /// f(i) for i in [0, count), like for_devices (used for devices and for disjoint replica groups).
  template <class F>
  void for_each_index(int64_t count, F&& f) {
    const int par = static_cast<int>(std::min<int64_t>(par_, count));
    if (par <= 1) {
      for (int64_t d = 0; d < count; ++d) f(d);
      return;
    }
    std::vector<std::exception_ptr> err(static_cast<size_t>(count));
#pragma omp parallel num_threads(par)
    {
      omp_set_num_threads(1);  // nested regions of this worker (oneDNN, elementwise loops) run on it alone
#pragma omp for schedule(dynamic, 1)
      for (int64_t d = 0; d < count; ++d) {
        try {
          f(d);
        } catch (...) {
          err[static_cast<size_t>(d)] = std::current_exception();
        }
      }
    }
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
  }

  void run(const RunProgress& progress = {}) {
    // last use of every value (node index); kept values (outputs) are never freed.
    last_use_.assign(nv_, -1);
    for (size_t i = 0; i < prog_.nodes.size(); ++i)
      for (int v : prog_.nodes[i].inputs)
        if (v >= 0) last_use_[v] = static_cast<int>(i);
    for (int64_t d = 0; d < n_; ++d) stats_[d].peak_memory_bytes = std::max(stats_[d].peak_memory_bytes, live_[d]);
    plan_fusion();
    for (size_t i = 0; i < prog_.nodes.size(); ++i) {
      const Node& n = prog_.nodes[i];
      auto t0 = Clock::now();
      const pod::FusedGroup* g = group_at_[i] >= 0 ? &groups_[static_cast<size_t>(group_at_[i])] : nullptr;
      std::vector<Tensor> results;  // per device: a fused group's result
      if (g) results = pod::run_fused_group(*this, *g, options_.stack);
      else if (n.domain == kGspmdDomain) run_gspmd(n);
      else run_kernel_node(n, static_cast<int>(i));
      const size_t last = g ? static_cast<size_t>(g->last) : i;
      double flops = 0;
      // The accounting walks every node of a fused group as if it had run alone: its intermediates are accounted
      // (virtually) from their node to their last reader, the result is stored at the group's last node.
      for (size_t j = i; j <= last; ++j) {
        const Node& nj = prog_.nodes[j];
        if (g)
          for (int64_t d = 0; d < n_; ++d) {
            const int o = nj.outputs.at(0);
            if (j == last) store(nj, d, 0, std::move(results[static_cast<size_t>(d)]));
            else account_virtual(d, o, declared_bytes(o));
          }
        for (int64_t d = 0; d < n_; ++d) {
          stats_[d].peak_memory_bytes = std::max(stats_[d].peak_memory_bytes, live_[d]);
          for (int v : nj.inputs)
            if (v >= 0 && last_use_[v] == static_cast<int>(j)) free_value(d, v);
          for (int v : nj.outputs)
            if (v >= 0 && last_use_[v] < 0) free_value(d, v);  // produced but never read
        }
        flops += node_flops(prog_, nj) * static_cast<double>(n_);
      }
      host_flops_ += flops;
      OpProfile& op = profile_[g ? g->label : n.domain == kGspmdDomain ? "gspmd." + n.op_type : n.op_type];
      op.nodes += 1;
      op.wall_s += seconds_since(t0);
      op.flops += flops;
      i = last;
      if (progress) progress(i + 1, prog_.nodes.size());
    }
  }

  /// Fused groups planned for the last run (for tests and the profile).
  size_t fused_groups() const { return groups_.size(); }

  std::vector<DeviceStats>& stats() { return stats_; }
  double host_flops() const { return host_flops_; }
  /// Adds wall time outside run() (loading, assembling) to the profile under `what`.
  void add_profile(const std::string& what, double wall_s) {
    OpProfile& op = profile_[what];
    op.nodes += 1;
    op.wall_s += wall_s;
  }
  std::vector<OpProfile> profile() const {
    std::vector<OpProfile> out;
    for (const auto& [name, p] : profile_) {
      out.push_back(p);
      out.back().op = name;
    }
    std::stable_sort(out.begin(), out.end(), [](const OpProfile& a, const OpProfile& b) { return a.wall_s > b.wall_s; });
    return out;
  }

 private:
  void release_slot(int64_t d, int v) {
    live_[d] -= acct_[d][v];
    acct_[d][v] = 0;
    if (ptr_[d][v]) {
      own_[d][v] = Tensor();
      ptr_[d][v] = nullptr;
    }
  }
  void free_value(int64_t d, int v) {
    if (resident_[v] || keep_[v]) return;
    release_slot(d, v);
  }
  /// Device d accounts `bytes` for value v, which the host never materialises (inside a fused group).
  void account_virtual(int64_t d, int v, int64_t bytes) {
    release_slot(d, v);
    acct_[d][v] = bytes;
    live_[d] += bytes;
  }
  int64_t declared_bytes(int v) const { return prog_.values[static_cast<size_t>(v)].nbytes(); }

  /// Plans the fused groups of this run (none when ExecutorOptions::fuse is off).
  void plan_fusion() {
    groups_.clear();
    group_at_.assign(prog_.nodes.size(), -1);
    if (!options_.fuse) return;
    groups_ = pod::plan_fusion(*this);
    for (size_t k = 0; k < groups_.size(); ++k) group_at_[static_cast<size_t>(groups_[k].first)] = static_cast<int>(k);
  }

  // pod::FusionHost
  const Graph& program() const override { return prog_; }
  int64_t devices() const override { return n_; }
  int parallelism() const override { return par_; }
  bool resident(int v) const override { return resident_[static_cast<size_t>(v)] != 0; }
  bool kept(int v) const override { return keep_[static_cast<size_t>(v)] != 0; }
  const Tensor* value(int64_t d, int v) const override { return ptr_[d][v]; }
  void parallel_for(int64_t count, const std::function<void(int64_t)>& f) override { for_each_index(count, f); }
  void add_compute_s(int64_t d, double seconds) override { stats_[d].compute_wall_s += seconds; }

  // d: local device index
  [[noreturn]] void fail(const Node& n, int64_t d, const std::string& what) const override {
    throw std::runtime_error(fmt::format("node '{}' ({}) on device {}: {}", n.name, n.op_type, dev_[d], what));
  }

  const Tensor* input(const Node& n, int64_t d, size_t k) const override {
    int v = n.inputs[k];
    if (v < 0) return nullptr;
    const Tensor* t = ptr_[d][v];
    if (!t) fail(n, d, fmt::format("input {} '{}' is not available (not computed yet or already freed)", k,
                                   prog_.values[v].name));
    return t;
  }

  /// True when device d owns value v and node `node` (which reads v exactly once) is its last reader: the kernel may
  /// then reuse v's buffer. The accounting is unaffected (acct_ keeps v's bytes until it is freed after the node).
  bool donatable(const Node& n, int node, int64_t d, int v) const {
    return v >= 0 && ptr_[d][v] == &own_[d][v] && !resident_[v] && !keep_[v] && last_use_[v] == node &&
           count_uses(n, v) == 1;
  }

  // Stores output k of node n on device d, checking it against the program's declared type and shape.
  void store(const Node& n, int64_t d, size_t k, Tensor t) {
    if (k >= n.outputs.size()) return;
    int v = n.outputs[k];
    if (v < 0) return;
    const Value& val = prog_.values[v];
    if ((val.dtype != DType::kUndefined && t.dtype != val.dtype) || t.shape != val.shape)
      fail(n, d, fmt::format("output {} '{}' is {} but the program declares {}", k, val.name,
                             type_str(t.dtype, t.shape), type_str(val.dtype, val.shape)));
    set_owned(d, v, std::move(t));
  }

  /// True when a node is too cheap to be worth waking worker threads for: views (Reshape & co. reuse the donated
  /// buffer) and nodes whose every output is small.
  bool cheap(const Node& n) const {
    static const char* const kViews[] = {"Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze", "Shape", "Size"};
    for (const char* v : kViews)
      if (n.op_type == v) return true;
    int64_t bytes = 0;
    for (int v : n.outputs) {
      if (v < 0) continue;
      try {
        bytes += prog_.values[static_cast<size_t>(v)].nbytes();
      } catch (const std::exception&) {
        return false;  // no fixed element size (undefined or string): let the kernel decide
      }
    }
    return bytes < (int64_t{64} << 10);
  }

  void run_kernel_node(const Node& n, int node) {
    // A cheap node on several devices: devices one after another on the calling thread, with one OpenMP thread
    // like the workers (the same cached primitives, no parallel region).
    const bool seq = par_ > 1 && cheap(n);
    struct Restore {
      int& par;
      int saved_par, saved_threads;
      bool on;
      ~Restore() {
        if (!on) return;
        par = saved_par;
        omp_set_num_threads(saved_threads);
      }
    } restore{par_, par_, omp_get_max_threads(), seq};
    if (seq) {
      par_ = 1;
      omp_set_num_threads(1);
    }
    for_devices([&](int64_t d) {
      std::vector<const Tensor*> ins(n.inputs.size());
      std::vector<Tensor*> donated(n.inputs.size(), nullptr);
      std::vector<const std::shared_ptr<const Tensor>*> owners(n.inputs.size(), nullptr);
      for (size_t k = 0; k < ins.size(); ++k) {
        ins[k] = input(n, d, k);
        if (donatable(n, node, d, n.inputs[k])) donated[k] = &own_[d][n.inputs[k]];
        const int v = n.inputs[k];
        if (v >= 0 && owner_[v] && owner_[v].get() == ins[k]) owners[k] = &owner_[v];
      }
      std::vector<Tensor> outs;
      auto t0 = Clock::now();
      try {
        outs = run_kernel(n, ins, prog_.opset, donated, owners);
      } catch (const UnsupportedError&) {
        throw;
      } catch (const std::exception& e) {
        fail(n, d, e.what());
      }
      stats_[d].compute_wall_s += seconds_since(t0);
      if (outs.size() < n.outputs.size()) {
        for (size_t k = outs.size(); k < n.outputs.size(); ++k)
          if (n.outputs[k] >= 0 && last_use_[n.outputs[k]] >= 0)
            fail(n, d, fmt::format("kernel returned {} outputs, output {} is used", outs.size(), k));
      }
      for (size_t k = 0; k < outs.size(); ++k) store(n, d, k, std::move(outs[k]));
    });
  }

  /// `axes` (an attribute of `n`) checked against the mesh.
  const std::vector<int>& checked(const Node& n, const std::vector<int>& axes) const {
    for (int a : axes)
      if (a >= mesh_.rank()) fail(n, 0, fmt::format("mesh axis {} out of range for mesh {}", a, mesh_.str()));
    return axes;
  }

  /// Runs a `gspmd` node (core/partition/program_ops.h) on every device.
  void run_gspmd(const Node& n) {
    const std::optional<GspmdOp> op = gspmd_op(n);
    if (!op) throw UnsupportedError(fmt::format("node '{}' ({}.{}): unknown gspmd op", n.name, n.domain, n.op_type));
    switch (*op) {
      case GspmdOp::kAllReduce:
      case GspmdOp::kAllGather:
      case GspmdOp::kReduceScatter:
      case GspmdOp::kAllToAll:
      case GspmdOp::kCollectivePermute: return run_collective(n);
      case GspmdOp::kShardSlice: {
        const ShardSliceAttrs a = shard_slice_attrs(n);
        return run_per_device(n, checked(n, a.mesh_axes), [&](int64_t d, int64_t tile) {
          store(n, d, 0, pod::shard_slice(*input(n, d, 0), a.axis, a.start(tile), a.length()));
        });
      }
      case GspmdOp::kMaskPad: {
        const MaskPadAttrs a = mask_pad_attrs(n);
        return run_per_device(n, checked(n, a.mesh_axes), [&](int64_t d, int64_t tile) {
          int xv = n.inputs.at(0);
          const Tensor* x = input(n, d, 0);
          Tensor y;
          // in place (steal the operand) when this is its last use and the device owns it
          bool steal = donatable(n, current_node(n), d, xv);
          if (steal) {
            y = std::move(own_[d][xv]);  // the operand stays accounted until it is freed after this node
          } else {
            y = *x;
          }
          const int64_t rank = static_cast<int64_t>(y.shape.size());
          const int64_t len = y.shape.at(static_cast<size_t>(a.axis < 0 ? a.axis + rank : a.axis));
          pod::mask_pad(y, a.axis, a.first(tile, len), a.full_size, a.value);
          store(n, d, 0, std::move(y));
        });
      }
      case GspmdOp::kPartitionOffset: {
        const PartitionOffsetAttrs a = partition_offset_attrs(n);
        return run_per_device(n, checked(n, a.mesh_axes), [&](int64_t d, int64_t tile) {
          const Value& out = prog_.values.at(n.outputs.at(0));
          Shape s = num_elements(out.shape) == 1 ? out.shape : Shape{};
          Tensor t(DType::kInt64, s);
          t.data<int64_t>()[0] = a.offset(tile);
          store(n, d, 0, std::move(t));
        });
      }
    }
  }

  /// Runs a collective node: one CollectiveExecutor call per replica group with members on this process.
  void run_collective(const Node& n) {
    const CollectiveAttrs a = collective_attrs(n);
    const std::vector<int>& axes = checked(n, a.mesh_axes);
    const std::string& op = n.op_type;
    if (n.inputs.size() != 1 || n.outputs.size() != 1) fail(n, 0, "a collective takes one input and one output");
    std::vector<std::vector<int64_t>> groups = mesh_.replica_groups(axes);
    CollectiveCall call;
    call.node = &n;
    call.op = a.kind;
    call.mesh_axes = axes;
    call.reduction = a.reduction;
    call.axis = a.axis;
    call.split_axis = a.split_axis;
    call.concat_axis = a.concat_axis;
    if (a.kind == Collective::kCollectivePermute) {
      const std::vector<int>& target_axes = checked(n, a.target_axes);
      try {
        call.sources = permute_sources(mesh_, axes, a.shift, target_axes);
      } catch (const std::exception& e) {
        fail(n, 0, e.what());
      }
    }
    std::vector<const Tensor*> ins;
    std::vector<int64_t> members, locals;
    for (const auto& group : groups) {
      ins.clear();
      members.clear();
      locals.clear();
      for (size_t t = 0; t < group.size(); ++t) {
        int64_t d = local_of_.at(static_cast<size_t>(group[t]));
        if (d < 0) continue;
        members.push_back(static_cast<int64_t>(t));
        locals.push_back(d);
        ins.push_back(input(n, d, 0));
      }
      if (members.empty()) continue;
      call.group = &group;
      auto t0 = Clock::now();
      std::vector<Tensor> outs;
      try {
        outs = coll_.run(call, members, ins);
      } catch (const UnsupportedError& e) {
        throw UnsupportedError(fmt::format("node '{}' ({}) on device {}: {}", n.name, op, dev_[locals[0]], e.what()));
      } catch (const std::exception& e) {
        fail(n, locals[0], e.what());
      }
      if (outs.size() != locals.size())
        fail(n, locals[0],
             fmt::format("the collective returned {} results for {} members", outs.size(), locals.size()));
      double dt = seconds_since(t0);
      for (size_t j = 0; j < locals.size(); ++j) {
        stats_[locals[j]].communication_wall_s += dt;
        store(n, locals[j], 0, std::move(outs[j]));
      }
    }
  }

  /// Runs `body(d, tile)` for every device d of this process, with d's tile index over `axes` (the node's
  /// mesh_axes); errors name the node and the device.
  template <class Body>
  void run_per_device(const Node& n, const std::vector<int>& axes, const Body& body) {
    for_devices([&](int64_t d) {
      auto t0 = Clock::now();
      try {
        body(d, mesh_.tile_index(dev_[d], axes));
      } catch (const UnsupportedError& e) {
        throw UnsupportedError(fmt::format("node '{}' ({}) on device {}: {}", n.name, n.op_type, dev_[d], e.what()));
      } catch (const std::runtime_error& e) {
        std::string w = e.what();
        if (w.rfind("node '", 0) == 0) throw;
        fail(n, d, w);
      } catch (const std::exception& e) {
        fail(n, d, e.what());
      }
      stats_[d].compute_wall_s += seconds_since(t0);
    });
  }

  int current_node(const Node& n) const { return static_cast<int>(&n - prog_.nodes.data()); }
  static int count_uses(const Node& n, int v) {
    int c = 0;
    for (int x : n.inputs) c += x == v;
    return c;
  }

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
  std::vector<std::vector<int64_t>> acct_;  // bytes accounted per device and value (0 when not live)
  std::vector<int64_t> live_;
  std::vector<char> resident_, keep_;
  std::vector<int> last_use_;
  std::vector<DeviceStats> stats_;
  double host_flops_ = 0;
  int par_ = 1;
  std::map<std::string, OpProfile> profile_;
  std::vector<pod::FusedGroup> groups_;
  std::vector<int> group_at_;                 // per node: index into groups_ of the group starting there, or -1
};

void check_input(const Value& v, const Tensor& t) {
  if (t.dtype != v.dtype || t.shape != v.shape)
    throw InputError(fmt::format("input '{}': expected {} but got {}", v.name, type_str(v.dtype, v.shape),
                                 type_str(t.dtype, t.shape)));
}

}  // namespace

namespace {

std::vector<int64_t> all_devices(int64_t n) {
  std::vector<int64_t> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[i] = i;
  return d;
}

// Binds the program constants (shared, resident) and the params (each device's slice of the global initializer,
// resident; replicated params shared; a slice held by several devices cut once into `slices` and shared) for the
// executor's devices `devices`.
void bind_weights(Executor& ex, const SpmdProgram& p, const Graph& global, const std::vector<int64_t>& devices,
                  std::vector<char>& bound, std::vector<std::unique_ptr<Tensor>>& slices) {
  const Graph& prog = p.program;
  const DeviceMesh& mesh = p.mesh;
  const int64_t n = static_cast<int64_t>(devices.size());
  for (size_t v = 0; v < prog.values.size(); ++v) {
    const Value& val = prog.values[v];
    if (val.is_initializer && val.data) {
      ex.mark_resident(static_cast<int>(v));
      for (int64_t d = 0; d < n; ++d) ex.set_shared(d, static_cast<int>(v), val.data.get(), val.data);
      bound[v] = 1;
    }
  }
  // Params: resident. Replicated params share the global data. Otherwise every distinct slice is cut once (devices
  // whose coordinates differ only on mesh axes the param is replicated over hold the same slice) and shared by the
  // local devices that hold it; the slices are cut concurrently. Every device still accounts its slice.
  struct SliceJob {
    const Tensor* full;
    const TensorSharding* sharding;
    int64_t device;  // the first (global) device holding this slice
    Tensor* out;
  };
  std::vector<SliceJob> jobs;
  std::vector<std::pair<int, std::vector<Tensor*>>> param_slices;  // (local value, slice of each local device)
  for (const ProgramBinding& b : p.params) {
    const Value& gv = global.values.at(b.global);
    if (!gv.data) throw InputError(fmt::format("initializer '{}' has no data", gv.name));
    ex.mark_resident(b.local);
    bound[b.local] = 1;
    if (b.sharding.is_replicated() && prog.values.at(b.local).shape == gv.shape) {
      for (int64_t d = 0; d < n; ++d) ex.set_shared(d, b.local, gv.data.get(), gv.data);
      continue;
    }
    std::map<std::vector<int64_t>, Tensor*> by_key;
    std::vector<Tensor*> of_device(static_cast<size_t>(n));
    for (int64_t d = 0; d < n; ++d) {
      const int64_t dev = devices[static_cast<size_t>(d)];
      // shard_tensor's result depends only on the offsets and on whether an unreduced tile is not the first
      std::vector<int64_t> key;
      for (int i = 0; i < b.sharding.rank(); ++i) key.push_back(b.sharding.offset(i, gv.shape, mesh, dev));
      key.push_back(b.sharding.unreduced.empty() ? 0 : mesh.tile_index(dev, b.sharding.unreduced) != 0);
      Tensor*& t = by_key[key];
      if (!t) {
        slices.push_back(std::make_unique<Tensor>());
        t = slices.back().get();
        jobs.push_back({gv.data.get(), &b.sharding, dev, t});
      }
      of_device[static_cast<size_t>(d)] = t;
    }
    param_slices.emplace_back(b.local, std::move(of_device));
  }
  std::vector<std::exception_ptr> slice_err(jobs.size());
#pragma omp parallel for schedule(dynamic, 1) if (jobs.size() > 1)
  for (size_t j = 0; j < jobs.size(); ++j) {
    try {
      *jobs[j].out = shard_tensor(*jobs[j].full, *jobs[j].sharding, mesh, jobs[j].device);
    } catch (...) {
      slice_err[j] = std::current_exception();
    }
  }
  for (auto& e : slice_err)
    if (e) std::rethrow_exception(e);
  for (const auto& [local, of_device] : param_slices)
    for (int64_t d = 0; d < n; ++d) ex.set_shared(d, local, of_device[static_cast<size_t>(d)]);
}

// Every program input and initializer is bound; outputs are kept to the end.
void finish_binding(Executor& ex, const SpmdProgram& p, const std::vector<char>& bound) {
  const Graph& prog = p.program;
  for (int v : prog.inputs)
    if (!bound[v]) throw std::runtime_error(fmt::format("program input '{}' has no binding", prog.values[v].name));
  for (size_t v = 0; v < prog.values.size(); ++v)
    if (prog.values[v].is_initializer && !bound[v])
      throw std::runtime_error(
          fmt::format("program initializer '{}' has neither data nor a param binding", prog.values[v].name));
  for (const ProgramBinding& b : p.outputs) ex.keep(b.local);
}

// Runs a plain graph as `device` of `mesh`: initializers are shared resident constants, inputs shared.
LocalRun run_graph(const Graph& g, const DeviceMesh& mesh, int64_t device, const std::vector<Tensor>& inputs,
                   CollectiveExecutor& coll, const RunProgress& progress, const ExecutorOptions& options) {
  auto t_start = Clock::now();
  if (inputs.size() != g.inputs.size())
    throw InputError(fmt::format("run: the model has {} inputs, {} were given", g.inputs.size(), inputs.size()));
  Executor ex(g, mesh, {device}, coll, options);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (!val.is_initializer) continue;
    if (!val.data) throw InputError(fmt::format("initializer '{}' has no data", val.name));
    ex.mark_resident(static_cast<int>(v));
    ex.set_shared(0, static_cast<int>(v), val.data.get(), val.data);
  }
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    check_input(g.values[g.inputs[k]], inputs[k]);
    ex.set_shared(0, g.inputs[k], &inputs[k]);
  }
  ex.add_profile("(load)", seconds_since(t_start));
  auto t_exec = Clock::now();
  ex.run(progress);
  LocalRun r;
  r.run_s = seconds_since(t_exec);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    int v = g.outputs[k];
    bool again = false;
    for (size_t j = k + 1; j < g.outputs.size(); ++j) again |= g.outputs[j] == v;
    const Tensor* t = ex.get(0, v);
    if (!t) throw std::runtime_error(fmt::format("graph output '{}' was not computed", g.values[v].name));
    r.output_shards.push_back({});
    r.output_shards.back().push_back(again ? *t : ex.take(0, v));
  }
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.wall_s = seconds_since(t_start);
  return r;
}

}  // namespace

PodRun run_spmd(const SpmdProgram& p, const Graph& global, const std::vector<Tensor>& inputs,
                const RunProgress& progress, const ExecutorOptions& options) {
  auto t_start = Clock::now();
  const Graph& prog = p.program;
  const DeviceMesh& mesh = p.mesh;
  const int64_t N = mesh.num_devices();
  if (inputs.size() != global.inputs.size())
    throw InputError(fmt::format("run: the model has {} inputs, {} were given", global.inputs.size(), inputs.size()));
  std::vector<int> input_index(global.values.size(), -1);
  for (size_t k = 0; k < global.inputs.size(); ++k) input_index[global.inputs[k]] = static_cast<int>(k);

  InProcessCollectives coll;
  const std::vector<int64_t> devices = all_devices(N);
  std::vector<std::unique_ptr<Tensor>> slices;  // weight slices shared by devices; outlive the executor's use
  Executor ex(prog, mesh, devices, coll, options);
  std::vector<char> bound(prog.values.size(), 0);
  bind_weights(ex, p, global, devices, bound, slices);
  // Inputs: shard the full values.
  for (const ProgramBinding& b : p.inputs) {
    const Value& gv = global.values.at(b.global);
    int k = input_index.at(b.global);
    if (k < 0) throw std::runtime_error(fmt::format("program input binds '{}', not a graph input", gv.name));
    check_input(gv, inputs[k]);
    bool shared = b.sharding.is_replicated() && prog.values.at(b.local).shape == gv.shape;
    for (int64_t d = 0; d < N; ++d) {
      if (shared) ex.set_shared(d, b.local, &inputs[k]);
      else ex.set_owned(d, b.local, shard_tensor(inputs[k], b.sharding, mesh, d));
    }
    bound[b.local] = 1;
  }
  finish_binding(ex, p, bound);
  ex.add_profile("(load)", seconds_since(t_start));

  ex.run(progress);

  auto t_assemble = Clock::now();
  PodRun r;
  std::vector<const Tensor*> shards(static_cast<size_t>(N));
  for (const ProgramBinding& b : p.outputs) {
    for (int64_t d = 0; d < N; ++d) {
      shards[d] = ex.get(d, b.local);
      if (!shards[d])
        throw std::runtime_error(fmt::format("program output '{}' was not computed", prog.values[b.local].name));
    }
    r.outputs.push_back(assemble_tensor(shards, b.sharding, mesh, global.values.at(b.global).shape));
  }
  ex.add_profile("(assemble)", seconds_since(t_assemble));
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.wall_s = seconds_since(t_start);
  return r;
}

LocalRun run_spmd_local(const SpmdProgram& p, const Graph& global,
                        const std::vector<std::vector<Tensor>>& input_shards, const std::vector<int64_t>& devices,
                        CollectiveExecutor& collectives, const RunProgress& progress,
                        const ExecutorOptions& options) {
  auto t_start = Clock::now();
  const Graph& prog = p.program;
  if (input_shards.size() != p.inputs.size())
    throw InputError(fmt::format("run: the program has {} inputs, {} were given", p.inputs.size(), input_shards.size()));
  for (int64_t d : devices)
    if (d < 0 || d >= p.mesh.num_devices())
      throw std::runtime_error(fmt::format("device {} is not on the mesh {}", d, p.mesh.str()));
  std::vector<std::unique_ptr<Tensor>> slices;  // weight slices shared by devices; outlive the executor's use
  Executor ex(prog, p.mesh, devices, collectives, options);
  std::vector<char> bound(prog.values.size(), 0);
  bind_weights(ex, p, global, devices, bound, slices);
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const ProgramBinding& b = p.inputs[k];
    if (input_shards[k].size() != devices.size())
      throw std::runtime_error(fmt::format("input '{}': {} shards for {} devices", prog.values[b.local].name,
                                           input_shards[k].size(), devices.size()));
    for (size_t d = 0; d < devices.size(); ++d) {
      check_input(prog.values[b.local], input_shards[k][d]);
      ex.set_shared(static_cast<int64_t>(d), b.local, &input_shards[k][d]);
    }
    bound[b.local] = 1;
  }
  finish_binding(ex, p, bound);
  ex.add_profile("(load)", seconds_since(t_start));

  auto t_exec = Clock::now();
  ex.run(progress);

  LocalRun r;
  r.run_s = seconds_since(t_exec);
  for (const ProgramBinding& b : p.outputs) {
    r.output_shards.emplace_back();
    for (size_t d = 0; d < devices.size(); ++d) {
      if (!ex.get(static_cast<int64_t>(d), b.local))
        throw std::runtime_error(fmt::format("program output '{}' was not computed", prog.values[b.local].name));
      r.output_shards.back().push_back(*ex.get(static_cast<int64_t>(d), b.local));
    }
  }
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.wall_s = seconds_since(t_start);
  return r;
}

LocalRun run_device_graph(const Graph& g, const DeviceMesh& mesh, int64_t device, const std::vector<Tensor>& inputs,
                          CollectiveExecutor& collectives, const RunProgress& progress,
                          const ExecutorOptions& options) {
  if (device < 0 || device >= mesh.num_devices())
    throw std::runtime_error(fmt::format("device {} is not on the mesh {}", device, mesh.str()));
  return run_graph(g, mesh, device, inputs, collectives, progress, options);
}

PodRun run_single(const Graph& g, const std::vector<Tensor>& inputs, const RunProgress& progress,
                  const ExecutorOptions& options) {
  DeviceMesh mesh;
  mesh.shape = {1};
  mesh.axes = {"x"};
  InProcessCollectives coll;
  LocalRun l = run_graph(g, mesh, 0, inputs, coll, progress, options);
  PodRun r;
  for (auto& o : l.output_shards) r.outputs.push_back(std::move(o.at(0)));
  r.devices = std::move(l.devices);
  r.host_flops = l.host_flops;
  r.profile = std::move(l.profile);
  r.wall_s = l.wall_s;
  return r;
}

std::string format_profile(const PodRun& r) {
  std::string out = fmt::format("{:<40} {:>7} {:>10} {:>6} {:>9}\n", "step", "nodes", "wall ms", "%", "GFLOP/s");
  for (const OpProfile& p : r.profile)
    out += fmt::format("{:<40} {:>7} {:>10.2f} {:>6.1f} {:>9}\n", p.op, p.nodes, p.wall_s * 1e3,
                       r.wall_s > 0 ? 100.0 * p.wall_s / r.wall_s : 0.0,
                       p.flops > 0 && p.wall_s > 0 ? fmt::format("{:.1f}", p.flops / p.wall_s / 1e9) : "");
  out += fmt::format("{:<40} {:>7} {:>10.2f} {:>6.1f} {:>9.1f}\n", "total", "", r.wall_s * 1e3, 100.0,
                     r.wall_s > 0 ? r.host_flops / r.wall_s / 1e9 : 0.0);
  return out;
}

}  // namespace gspmd
