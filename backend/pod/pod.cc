// backend/pod/pod.cc: the interpreter (Executor, executor.h): the run loop, kernel nodes, gspmd ops, collectives
// and the per-device buffers and their memory accounting. The run_* entry points of pod.h are in pod_run.cc.
#include "backend/pod/executor.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <exception>
#include <new>
#include <stdexcept>

#include <malloc.h>
#include <omp.h>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/kernels/onednn.h"
#include "backend/pod/collectives.h"
#include "core/cost/cost.h"
#include "core/partition/reshard.h"
#include "core/shapes/symbolic.h"

namespace gspmd::pod {
namespace {

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

}  // namespace

Executor::Executor(const Graph& prog, const DeviceMesh& mesh, std::vector<int64_t> devices, CollectiveExecutor& coll,
                   const ExecutorOptions& options)
    : prog_(prog),
      mesh_(mesh),
      n_(static_cast<int64_t>(devices.size())),
      nv_(prog.values.size()),
      dev_(std::move(devices)),
      coll_(coll),
      options_(options),
      par_(device_parallelism(n_, options.device_threads)) {
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
  runtime_dims_ = !prog.runtime_dims.empty();
  if (runtime_dims_) {
    runtime_const_.assign(nv_, 0);
    for (size_t v = 0; v < nv_; ++v) {
      const Value& val = prog.values[v];
      if (val.is_initializer && val.sym && val.sym->elems)
        for (const DimExpr& e : *val.sym->elems) runtime_const_[v] |= reads_runtime_dim(prog, e) ? 1 : 0;
    }
  }
}

void Executor::set_owned(int64_t d, int v, Tensor t) {
  release_slot(d, v);
  own_[d][v] = std::move(t);
  ptr_[d][v] = &own_[d][v];
  acct_[d][v] = static_cast<int64_t>(own_[d][v].nbytes());
  live_[d] += acct_[d][v];
}

void Executor::set_shared(int64_t d, int v, const Tensor* t, const std::shared_ptr<const Tensor>& owner) {
  release_slot(d, v);
  ptr_[d][v] = t;
  if (owner && owner.get() == t) owner_[v] = owner;
  acct_[d][v] = static_cast<int64_t>(t->nbytes());
  live_[d] += acct_[d][v];
}

Tensor Executor::take(int64_t d, int v) {
  const Tensor* p = ptr_[d][v];
  if (!p) throw InternalError(fmt::format("value '{}' is not available", prog_.values[v].name));
  Tensor out = p == &own_[d][v] ? std::move(own_[d][v]) : *p;
  ptr_[d][v] = nullptr;
  return out;
}

template <class F>
void Executor::for_each_index(int64_t count, F&& f) {
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

template <class F>
void Executor::for_devices(F&& f) {
  for_each_index(n_, f);
}

void Executor::run(const RunProgress& progress) {
  // last use of every value (node index); kept values (outputs) are never freed.
  last_use_.assign(nv_, -1);
  for (size_t i = 0; i < prog_.nodes.size(); ++i)
    for (int v : prog_.nodes[i].inputs)
      if (v >= 0) last_use_[v] = static_cast<int>(i);
  for (int64_t d = 0; d < n_; ++d) stats_[d].peak_memory_bytes = std::max(stats_[d].peak_memory_bytes, live_[d]);
  if (runtime_dims_) {
    runtime_.assign(static_cast<size_t>(n_), prog_.dim_hints);
    seen_.assign(static_cast<size_t>(n_), {});
    evaluated_.assign(static_cast<size_t>(n_), {});
  }
  plan_fusion();
  steps_.clear();
  for (size_t i = 0; i < prog_.nodes.size(); ++i) {
    const Node& n = prog_.nodes[i];
    auto t0 = Clock::now();
    const pod::FusedGroup* g = group_at_[i] >= 0 ? &groups_[static_cast<size_t>(group_at_[i])] : nullptr;
    std::vector<Tensor> results;  // per device: a fused group's result
    if (g)
      results = pod::run_fused_group(*this, *g, options_.stack);
    else if (n.domain == kGspmdDomain)
      run_gspmd(n);
    else
      run_kernel_node(n, static_cast<int>(i));
    const size_t last = g ? static_cast<size_t>(g->last) : i;
    double flops = 0;
    // The accounting walks every node of a fused group as if it had run alone: its intermediates are accounted
    // (virtually) from their node to their last reader, the result is stored at the group's last node.
    for (size_t j = i; j <= last; ++j) {
      const Node& nj = prog_.nodes[j];
      if (g)
        for (int64_t d = 0; d < n_; ++d) {
          const int o = nj.outputs.at(0);
          if (j == last)
            store(nj, d, 0, std::move(results[static_cast<size_t>(d)]));
          else
            account_virtual(d, o, declared_bytes(o));
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
    const auto t1 = Clock::now();
    steps_.push_back({static_cast<int>(i), static_cast<int>(last), t0, t1});
    op.nodes += 1;
    op.wall_s += std::chrono::duration<double>(t1 - t0).count();
    op.flops += flops;
    i = last;
    if (progress) progress(i + 1, prog_.nodes.size());
  }
}

std::vector<ExecutedStep> Executor::timeline(Clock::time_point origin) const {
  std::vector<ExecutedStep> out;
  out.reserve(steps_.size());
  for (const StepTime& st : steps_) {
    ExecutedStep e;
    for (int i = st.first; i <= st.last; ++i) {
      e.nodes.push_back(prog_.nodes[static_cast<size_t>(i)].name);
      e.ops.push_back(prog_.nodes[static_cast<size_t>(i)].op_type);
    }
    e.start_s = std::chrono::duration<double>(st.start - origin).count();
    e.end_s = std::chrono::duration<double>(st.end - origin).count();
    out.push_back(std::move(e));
  }
  return out;
}

void Executor::add_profile(const std::string& what, double wall_s) {
  OpProfile& op = profile_[what];
  op.nodes += 1;
  op.wall_s += wall_s;
}

std::vector<OpProfile> Executor::profile() const {
  std::vector<OpProfile> out;
  for (const auto& [name, p] : profile_) {
    out.push_back(p);
    out.back().op = name;
  }
  std::stable_sort(out.begin(), out.end(), [](const OpProfile& a, const OpProfile& b) { return a.wall_s > b.wall_s; });
  return out;
}

void Executor::release_slot(int64_t d, int v) {
  live_[d] -= acct_[d][v];
  acct_[d][v] = 0;
  if (ptr_[d][v]) {
    own_[d][v] = Tensor();
    ptr_[d][v] = nullptr;
  }
}

void Executor::free_value(int64_t d, int v) {
  if (resident_[v] || keep_[v]) return;
  release_slot(d, v);
}

void Executor::account_virtual(int64_t d, int v, int64_t bytes) {
  release_slot(d, v);
  acct_[d][v] = bytes;
  live_[d] += bytes;
}

void Executor::plan_fusion() {
  groups_.clear();
  group_at_.assign(prog_.nodes.size(), -1);
  if (!options_.fuse) return;
  groups_ = pod::plan_fusion(*this);
  if (runtime_dims_) {  // a fused group's buffers have the declared shapes: none over a data-dependent dim
    auto symbolic = [&](const pod::FusedGroup& g) {
      for (int i = g.first; i <= g.last; ++i)
        for (const std::vector<int>* vs :
             {&prog_.nodes[static_cast<size_t>(i)].inputs, &prog_.nodes[static_cast<size_t>(i)].outputs})
          for (int v : *vs)
            if (v >= 0 && prog_.values[static_cast<size_t>(v)].sym) return true;
      return false;
    };
    groups_.erase(std::remove_if(groups_.begin(), groups_.end(), symbolic), groups_.end());
  }
  for (size_t k = 0; k < groups_.size(); ++k) group_at_[static_cast<size_t>(groups_[k].first)] = static_cast<int>(k);
}

void Executor::parallel_for(int64_t count, const std::function<void(int64_t)>& f) { for_each_index(count, f); }

void Executor::fail(const Node& n, int64_t d, const std::string& what) const {
  throw InternalError(fmt::format("node '{}' ({}) on device {}: {}", n.name, n.op_type, dev_[d], what));
}

const Tensor* Executor::input(const Node& n, int64_t d, size_t k) const {
  int v = n.inputs[k];
  if (v < 0) return nullptr;
  if (runtime_dims_ && runtime_const_[static_cast<size_t>(v)]) return runtime_constant(n, d, v);
  const Tensor* t = ptr_[d][v];
  if (!t)
    fail(n, d,
         fmt::format("input {} '{}' is not available (not computed yet or already freed)", k, prog_.values[v].name));
  return t;
}

bool Executor::donatable(const Node& n, int node, int64_t d, int v) const {
  return v >= 0 && ptr_[d][v] == &own_[d][v] && !resident_[v] && !keep_[v] && last_use_[v] == node &&
         count_uses(n, v) == 1;
}

void Executor::check_runtime_dims(const Node& n, int64_t d, size_t k, const Value& val, const Tensor& t) {
  DimBindings& at = runtime_[static_cast<size_t>(d)];
  std::set<std::string>& seen = seen_[static_cast<size_t>(d)];
  bool ok = (val.dtype == DType::kUndefined || t.dtype == val.dtype) && t.shape.size() == val.sym->dims.size();
  for (size_t i = 0; ok && i < t.shape.size(); ++i) {
    const DimExpr& e = val.sym->dims[i];
    if (e.is_constant()) {
      ok = e.constant_part() == t.shape[i];
      continue;
    }
    if (const std::string* s = e.as_symbol()) {
      auto rt = prog_.runtime_dims.find(*s);
      if (rt != prog_.runtime_dims.end() && !seen.count(*s)) {  // its node: its size binds the symbol
        if (rt->second.given && t.shape[i] > rt->second.bound)  // the user's bound: bad input
          throw InputError(fmt::format("--dim {}={}: node '{}' ({}) gives {} = {} on device {}", *s, rt->second.bound,
                                       n.name, n.op_type, *s, t.shape[i], d));
        if (rt->second.bound >= 0 && t.shape[i] > rt->second.bound)
          fail(n, d,
               fmt::format("output {} '{}' dim {} is {}, over the bound {} of {} ({})", k, val.name, i, t.shape[i],
                           rt->second.bound, *s, rt->second.what));
        seen.insert(*s);
        at[*s] = t.shape[i];
        continue;
      }
    } else {
      for (const std::string& s : e.symbols())
        if (prog_.runtime_dims.count(s) && !seen.count(s))
          fail(
              n, d,
              fmt::format("output {} '{}' dim {} ({}) reads {} before a node computes it", k, val.name, i, e.str(), s));
    }
    ok = e.eval(at) == t.shape[i];
  }
  if (!ok)
    fail(n, d,
         fmt::format("output {} '{}' is {} but the program declares {}{}", k, val.name, type_str(t.dtype, t.shape),
                     dtype_name(val.dtype), dims_str(val.sym->dims)));
}

const Tensor* Executor::runtime_constant(const Node& n, int64_t d, int v) const {
  std::map<int, Tensor>& done = evaluated_[static_cast<size_t>(d)];
  if (auto it = done.find(v); it != done.end()) return &it->second;
  const Value& val = prog_.values[static_cast<size_t>(v)];
  const std::set<std::string>& seen = seen_[static_cast<size_t>(d)];
  for (const DimExpr& e : *val.sym->elems)
    for (const std::string& s : e.symbols())
      if (prog_.runtime_dims.count(s) && !seen.count(s))
        fail(n, d, fmt::format("constant '{}' ({}) reads {} before a node computes it", val.name, e.str(), s));
  std::optional<Tensor> t = constant_at(val, runtime_[static_cast<size_t>(d)]);
  if (!t) fail(n, d, fmt::format("constant '{}' over the dim symbols is {}", val.name, dtype_name(val.dtype)));
  return &done.emplace(v, std::move(*t)).first->second;
}

void Executor::store(const Node& n, int64_t d, size_t k, Tensor t) {
  if (k >= n.outputs.size()) return;
  int v = n.outputs[k];
  if (v < 0) return;
  const Value& val = prog_.values[v];
  if (runtime_dims_ && val.sym) {
    check_runtime_dims(n, d, k, val, t);
    set_owned(d, v, std::move(t));
    return;
  }
  if ((val.dtype != DType::kUndefined && t.dtype != val.dtype) || t.shape != val.shape)
    fail(n, d,
         fmt::format("output {} '{}' is {} but the program declares {}", k, val.name, type_str(t.dtype, t.shape),
                     type_str(val.dtype, val.shape)));
  set_owned(d, v, std::move(t));
}

bool Executor::cheap(const Node& n) const {
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

void Executor::run_kernel_node(const Node& n, int node) {
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
    } catch (const std::exception& e) {
      if (is_input_caused(e)) throw;  // the data, not a bug: the same error on every device and plan
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

const std::vector<int>& Executor::checked(const Node& n, const std::vector<int>& axes) const {
  for (int a : axes)
    if (a >= mesh_.rank()) fail(n, 0, fmt::format("mesh axis {} out of range for mesh {}", a, mesh_.str()));
  return axes;
}

template <class Body>
void Executor::run_per_device(const Node& n, const std::vector<int>& axes, const Body& body) {
  for_devices([&](int64_t d) {
    auto t0 = Clock::now();
    try {
      body(d, mesh_.tile_index(dev_[d], axes));
    } catch (const UnsupportedError& e) {
      throw UnsupportedError(fmt::format("node '{}' ({}) on device {}: {}", n.name, n.op_type, dev_[d], e.what()));
    } catch (const std::exception& e) {
      // the data, not a bug, or fail()'s message from a nested executor
      if (is_input_caused(e) || std::string_view(e.what()).rfind("node '", 0) == 0) throw;
      fail(n, d, e.what());
    }
    stats_[d].compute_wall_s += seconds_since(t0);
  });
}

void Executor::run_gspmd(const Node& n) {
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

void Executor::run_collective(const Node& n) {
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
      call.sources = permute_sources(mesh_, axes, a.shift, target_axes, a.wrap);
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
      fail(n, locals[0], fmt::format("the collective returned {} results for {} members", outs.size(), locals.size()));
    double dt = seconds_since(t0);
    for (size_t j = 0; j < locals.size(); ++j) {
      stats_[locals[j]].communication_wall_s += dt;
      store(n, locals[j], 0, std::move(outs[j]));
    }
  }
}

int Executor::count_uses(const Node& n, int v) {
  int c = 0;
  for (int x : n.inputs) c += x == v;
  return c;
}

}  // namespace gspmd::pod
