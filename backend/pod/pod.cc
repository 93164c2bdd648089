// backend/pod: the SPMD interpreter. All devices run the program in lock step, node by node, on this host.
//
// Per device: a slot per program value, either owned (a Tensor the device holds) or shared (a pointer to data that
// outlives the run: program constants, replicated weights/inputs). Memory accounting counts every live value's
// bytes on every device whether owned or shared. Weights (params) and program constants are resident for the whole
// run; other values (inputs, intermediates) are freed after their last use; program outputs stay until the end.
// peak_memory_bytes = max over the run of the live bytes, measured after each node's outputs are allocated and
// before its dead operands are freed (operands and results coexist).
#include "backend/pod/pod.h"

#include <chrono>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/pod/collective_executor.h"
#include "backend/pod/collectives.h"
#include "core/partition/reshard.h"
#include "core/cost/cost.h"

namespace gspmd {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string type_str(DType t, const Shape& s) {
  std::string_view n;
  try {
    n = dtype_name(t);
  } catch (const std::exception&) {
    n = "?";
  }
  return fmt::format("{}{}", n, shape_str(s));
}

class Executor {
 public:
  /// Runs `prog` for the devices `devices` (global ids on `mesh`; local index d holds device devices[d]); their
  /// collectives go to `coll`.
  Executor(const Graph& prog, const DeviceMesh& mesh, std::vector<int64_t> devices, CollectiveExecutor& coll)
      : prog_(prog), mesh_(mesh), n_(static_cast<int64_t>(devices.size())), nv_(prog.values.size()),
        dev_(std::move(devices)), coll_(coll) {
    local_of_.assign(static_cast<size_t>(std::max<int64_t>(mesh.num_devices(), 1)), -1);
    for (int64_t d = 0; d < n_; ++d) local_of_.at(static_cast<size_t>(dev_[d])) = d;
    own_.assign(n_, std::vector<Tensor>(nv_));
    ptr_.assign(n_, std::vector<const Tensor*>(nv_, nullptr));
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
    live_[d] += static_cast<int64_t>(own_[d][v].nbytes());
  }
  /// Device d sees `t` (owned by someone that outlives the run) as value v; accounted as if held.
  void set_shared(int64_t d, int v, const Tensor* t) {
    release_slot(d, v);
    ptr_[d][v] = t;
    live_[d] += static_cast<int64_t>(t->nbytes());
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

  void run(const RunProgress& progress = {}) {
    // last use of every value (node index); kept values (outputs) are never freed.
    last_use_.assign(nv_, -1);
    for (size_t i = 0; i < prog_.nodes.size(); ++i)
      for (int v : prog_.nodes[i].inputs)
        if (v >= 0) last_use_[v] = static_cast<int>(i);
    for (int64_t d = 0; d < n_; ++d) stats_[d].peak_memory_bytes = std::max(stats_[d].peak_memory_bytes, live_[d]);
    for (size_t i = 0; i < prog_.nodes.size(); ++i) {
      const Node& n = prog_.nodes[i];
      if (n.domain == kGspmdDomain) run_gspmd(n);
      else run_kernel_node(n);
      for (int64_t d = 0; d < n_; ++d) {
        stats_[d].peak_memory_bytes = std::max(stats_[d].peak_memory_bytes, live_[d]);
        for (int v : n.inputs)
          if (v >= 0 && last_use_[v] == static_cast<int>(i)) free_value(d, v);
        for (int v : n.outputs)
          if (v >= 0 && last_use_[v] < 0) free_value(d, v);  // produced but never read
      }
      host_flops_ += node_flops(prog_, n) * static_cast<double>(n_);
      if (progress) progress(i + 1, prog_.nodes.size());
    }
  }

  std::vector<DeviceStats>& stats() { return stats_; }
  double host_flops() const { return host_flops_; }

 private:
  void release_slot(int64_t d, int v) {
    if (ptr_[d][v]) {
      live_[d] -= static_cast<int64_t>(ptr_[d][v]->nbytes());
      own_[d][v] = Tensor();
      ptr_[d][v] = nullptr;
    }
  }
  void free_value(int64_t d, int v) {
    if (resident_[v] || keep_[v]) return;
    release_slot(d, v);
  }

  // d: local device index
  [[noreturn]] void fail(const Node& n, int64_t d, const std::string& what) const {
    throw std::runtime_error(fmt::format("node '{}' ({}) on device {}: {}", n.name, n.op_type, dev_[d], what));
  }

  const Tensor* input(const Node& n, int64_t d, size_t k) const {
    int v = n.inputs[k];
    if (v < 0) return nullptr;
    const Tensor* t = ptr_[d][v];
    if (!t) fail(n, d, fmt::format("input {} '{}' is not available (not computed yet or already freed)", k,
                                   prog_.values[v].name));
    return t;
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

  void run_kernel_node(const Node& n) {
    std::vector<const Tensor*> ins(n.inputs.size());
    for (int64_t d = 0; d < n_; ++d) {
      for (size_t k = 0; k < ins.size(); ++k) ins[k] = input(n, d, k);
      std::vector<Tensor> outs;
      auto t0 = Clock::now();
      try {
        outs = run_kernel(n, ins, prog_.opset);
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
    }
  }

  std::vector<int> mesh_axes(const Node& n, const char* attr = "mesh_axes") const {
    std::vector<int> axes;
    for (int64_t a : n.ints(attr, {})) {
      if (a < 0 || a >= mesh_.rank())
        fail(n, 0, fmt::format("mesh axis {} out of range for mesh {}", a, mesh_.str()));
      axes.push_back(static_cast<int>(a));
    }
    return axes;
  }

  void run_gspmd(const Node& n) {
    const std::string& op = n.op_type;
    bool collective = op == "AllReduce" || op == "AllGather" || op == "ReduceScatter" || op == "AllToAll" ||
                      op == "CollectivePermute";
    bool per_device = op == "ShardSlice" || op == "MaskPad" || op == "PartitionOffset";
    if (!collective && !per_device)
      throw UnsupportedError(fmt::format("node '{}' ({}.{}): unknown gspmd op", n.name, n.domain, op));
    std::vector<int> axes = mesh_axes(n);
    if (collective) {
      if (n.inputs.size() != 1 || n.outputs.size() != 1) fail(n, 0, "a collective takes one input and one output");
      std::vector<std::vector<int64_t>> groups = mesh_.replica_groups(axes);
      CollectiveCall call;
      call.node = &n;
      call.op = op;
      call.mesh_axes = axes;
      try {
        if (op == "AllReduce" || op == "ReduceScatter") call.reduction = pod::parse_reduction(n.s("reduction", "sum"));
        call.axis = n.i("axis", 0);
        call.split_axis = n.i("split_axis", 0);
        call.concat_axis = n.i("concat_axis", 0);
        if (op == "CollectivePermute")
          call.sources = permute_sources(mesh_, axes, n.i("shift", 0), mesh_axes(n, "target_axes"));
      } catch (const std::exception& e) {
        fail(n, 0, e.what());
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
          fail(n, locals[0], fmt::format("the collective returned {} results for {} members", outs.size(), locals.size()));
        double dt = seconds_since(t0);
        for (size_t j = 0; j < locals.size(); ++j) {
          stats_[locals[j]].communication_wall_s += dt;
          store(n, locals[j], 0, std::move(outs[j]));
        }
      }
      return;
    }
    for (int64_t d = 0; d < n_; ++d) {
      auto t0 = Clock::now();
      try {
        int64_t tile = mesh_.tile_index(dev_[d], axes);
        if (op == "PartitionOffset") {
          const Value& out = prog_.values.at(n.outputs.at(0));
          Shape s = num_elements(out.shape) == 1 ? out.shape : Shape{};
          Tensor t(DType::kInt64, s);
          t.data<int64_t>()[0] = tile * n.i("shard_size", 0);
          store(n, d, 0, std::move(t));
        } else if (op == "ShardSlice") {
          const Tensor* x = input(n, d, 0);
          const int64_t step = n.i("shard_size", 0);
          store(n, d, 0, pod::shard_slice(*x, n.i("axis", 0), n.i("base", 0) + tile * step, n.i("size", step)));
        } else {  // MaskPad
          int xv = n.inputs.at(0);
          const Tensor* x = input(n, d, 0);
          Tensor y;
          // in place (steal the operand) when this is its last use and the device owns it
          bool steal = x == &own_[d][xv] && !resident_[xv] && !keep_[xv] && last_use_[xv] == current_node(n) &&
                       count_uses(n, xv) == 1;
          if (steal) {
            live_[d] -= static_cast<int64_t>(x->nbytes());
            y = std::move(own_[d][xv]);
            own_[d][xv] = Tensor();
            ptr_[d][xv] = nullptr;
          } else {
            y = *x;
          }
          const int64_t axis = n.i("axis", 0);
          const int64_t len = y.shape.at(static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(y.shape.size()) : axis));
          pod::mask_pad(y, axis, n.i("base", 0) + tile * n.i("step", len), n.i("full_size", 0), n.f("value", 0.f));
          store(n, d, 0, std::move(y));  // when stolen, the result reuses the operand's buffer: net 0 bytes
        }
      } catch (const UnsupportedError& e) {
        throw UnsupportedError(fmt::format("node '{}' ({}) on device {}: {}", n.name, op, dev_[d], e.what()));
      } catch (const std::runtime_error& e) {
        std::string w = e.what();
        if (w.rfind("node '", 0) == 0) throw;
        fail(n, d, w);
      } catch (const std::exception& e) {
        fail(n, d, e.what());
      }
      stats_[d].compute_wall_s += seconds_since(t0);
    }
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
  std::vector<std::vector<Tensor>> own_;
  std::vector<std::vector<const Tensor*>> ptr_;
  std::vector<int64_t> live_;
  std::vector<char> resident_, keep_;
  std::vector<int> last_use_;
  std::vector<DeviceStats> stats_;
  double host_flops_ = 0;
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
// resident; replicated params shared) for the executor's devices `devices`.
void bind_weights(Executor& ex, const SpmdProgram& p, const Graph& global, const std::vector<int64_t>& devices,
                  std::vector<char>& bound) {
  const Graph& prog = p.program;
  const int64_t n = static_cast<int64_t>(devices.size());
  for (size_t v = 0; v < prog.values.size(); ++v) {
    const Value& val = prog.values[v];
    if (val.is_initializer && val.data) {
      ex.mark_resident(static_cast<int>(v));
      for (int64_t d = 0; d < n; ++d) ex.set_shared(d, static_cast<int>(v), val.data.get());
      bound[v] = 1;
    }
  }
  for (const ProgramBinding& b : p.params) {
    const Value& gv = global.values.at(b.global);
    if (!gv.data) throw InputError(fmt::format("initializer '{}' has no data", gv.name));
    ex.mark_resident(b.local);
    bool shared = b.sharding.is_replicated() && prog.values.at(b.local).shape == gv.shape;
    for (int64_t d = 0; d < n; ++d) {
      if (shared) ex.set_shared(d, b.local, gv.data.get());
      else ex.set_owned(d, b.local, shard_tensor(*gv.data, b.sharding, p.mesh, devices[d]));
    }
    bound[b.local] = 1;
  }
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
                   CollectiveExecutor& coll, const RunProgress& progress) {
  auto t_start = Clock::now();
  if (inputs.size() != g.inputs.size())
    throw InputError(fmt::format("run: the model has {} inputs, {} were given", g.inputs.size(), inputs.size()));
  Executor ex(g, mesh, {device}, coll);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (!val.is_initializer) continue;
    if (!val.data) throw InputError(fmt::format("initializer '{}' has no data", val.name));
    ex.mark_resident(static_cast<int>(v));
    ex.set_shared(0, static_cast<int>(v), val.data.get());
  }
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    check_input(g.values[g.inputs[k]], inputs[k]);
    ex.set_shared(0, g.inputs[k], &inputs[k]);
  }
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
  r.wall_s = seconds_since(t_start);
  return r;
}

}  // namespace

PodRun run_spmd(const SpmdProgram& p, const Graph& global, const std::vector<Tensor>& inputs,
                const RunProgress& progress) {
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
  Executor ex(prog, mesh, devices, coll);
  std::vector<char> bound(prog.values.size(), 0);
  bind_weights(ex, p, global, devices, bound);
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

  ex.run(progress);

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
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.wall_s = seconds_since(t_start);
  return r;
}

LocalRun run_spmd_local(const SpmdProgram& p, const Graph& global,
                        const std::vector<std::vector<Tensor>>& input_shards, const std::vector<int64_t>& devices,
                        CollectiveExecutor& collectives, const RunProgress& progress) {
  auto t_start = Clock::now();
  const Graph& prog = p.program;
  if (input_shards.size() != p.inputs.size())
    throw InputError(fmt::format("run: the program has {} inputs, {} were given", p.inputs.size(), input_shards.size()));
  for (int64_t d : devices)
    if (d < 0 || d >= p.mesh.num_devices())
      throw std::runtime_error(fmt::format("device {} is not on the mesh {}", d, p.mesh.str()));
  Executor ex(prog, p.mesh, devices, collectives);
  std::vector<char> bound(prog.values.size(), 0);
  bind_weights(ex, p, global, devices, bound);
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
  r.wall_s = seconds_since(t_start);
  return r;
}

LocalRun run_device_graph(const Graph& g, const DeviceMesh& mesh, int64_t device, const std::vector<Tensor>& inputs,
                          CollectiveExecutor& collectives, const RunProgress& progress) {
  if (device < 0 || device >= mesh.num_devices())
    throw std::runtime_error(fmt::format("device {} is not on the mesh {}", device, mesh.str()));
  return run_graph(g, mesh, device, inputs, collectives, progress);
}

PodRun run_single(const Graph& g, const std::vector<Tensor>& inputs, const RunProgress& progress) {
  DeviceMesh mesh;
  mesh.shape = {1};
  mesh.axes = {"x"};
  InProcessCollectives coll;
  LocalRun l = run_graph(g, mesh, 0, inputs, coll, progress);
  PodRun r;
  for (auto& o : l.output_shards) r.outputs.push_back(std::move(o.at(0)));
  r.devices = std::move(l.devices);
  r.host_flops = l.host_flops;
  r.wall_s = l.wall_s;
  return r;
}

}  // namespace gspmd
