// backend/pod/pod_run.cc: the run_* entry points of pod.h: binding the weights, constants and inputs to the
// interpreter (Executor, executor.h), running it and collecting the outputs, per-device stats and profile.
#include "backend/pod/pod.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "backend/pod/executor.h"

namespace gspmd {
namespace {

using pod::Clock;
using pod::Executor;
using pod::seconds_since;

/// Throws InputError "input 'X': expected <type> but got <type>" when `t`'s dtype or shape differs from `v`'s.
void check_input(const Value& v, const Tensor& t) {
  if (t.dtype != v.dtype || t.shape != v.shape)
    throw InputError(fmt::format("input '{}': expected {} but got {}", v.name, type_str(v.dtype, v.shape),
                                 type_str(t.dtype, t.shape)));
}

/// The device ids 0, 1, ..., n - 1.
std::vector<int64_t> all_devices(int64_t n) {
  std::vector<int64_t> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[i] = i;
  return d;
}

/// Binds the program constants (shared, resident) and the params (each device's slice of the global initializer,
/// resident; replicated params shared; a slice held by several devices cut once into `slices` and shared) for the
/// executor's devices `devices` (global ids, in local order), and sets bound[v] = 1 (program value v) for each.
/// `slices` must outlive the executor's use. Throws InputError when a param's global initializer has no data; a
/// slicing error (shard_tensor) is rethrown.
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
  // Params: resident, except donated ones (ProgramBinding::donated). Replicated params share the global data. Otherwise
  // every distinct slice is cut once (devices whose coordinates differ only on mesh axes the param is replicated over
  // hold the same slice) and shared by the local devices that hold it; the slices are cut concurrently. Every device
  // still accounts its slice.
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
    if (!b.donated) ex.mark_resident(b.local);  // a donated weight slice is freed after its last reader
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

/// Checks that every program input and initializer is bound (bound[v] != 0, else InternalError naming it) and
/// keeps the program outputs to the end of the run.
void finish_binding(Executor& ex, const SpmdProgram& p, const std::vector<char>& bound) {
  const Graph& prog = p.program;
  for (int v : prog.inputs)
    if (!bound[v]) throw InternalError(fmt::format("program input '{}' has no binding", prog.values[v].name));
  for (size_t v = 0; v < prog.values.size(); ++v)
    if (prog.values[v].is_initializer && !bound[v])
      throw InternalError(
          fmt::format("program initializer '{}' has neither data nor a param binding", prog.values[v].name));
  for (const ProgramBinding& b : p.outputs) ex.keep(b.local);
}

/// Fills `r`'s stats, FLOPs, profile and timeline from the executor after a run that started at `t_start`, and its
/// wall time (seconds) up to now.
void finish_local_run(Executor& ex, Clock::time_point t_start, LocalRun& r) {
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.timeline = ex.timeline(t_start);
  r.wall_s = seconds_since(t_start);
}

/// Runs a plain graph as `device` of `mesh`: initializers are shared resident constants, inputs shared.
/// output_shards[k][0] is graph output k. Throws InputError on an input count, dtype or shape mismatch or an
/// initializer without data, InternalError when an output was not computed, and as Executor::run.
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
    if (!t) throw InternalError(fmt::format("graph output '{}' was not computed", g.values[v].name));
    r.output_shards.push_back({});
    r.output_shards.back().push_back(again ? *t : ex.take(0, v));
  }
  finish_local_run(ex, t_start, r);
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
    if (k < 0) throw InternalError(fmt::format("program input binds '{}', not a graph input", gv.name));
    check_input(gv, inputs[k]);
    bool shared = b.sharding.is_replicated() && prog.values.at(b.local).shape == gv.shape;
    for (int64_t d = 0; d < N; ++d) {
      if (shared)
        ex.set_shared(d, b.local, &inputs[k]);
      else
        ex.set_owned(d, b.local, shard_tensor(inputs[k], b.sharding, mesh, d));
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
        throw InternalError(fmt::format("program output '{}' was not computed", prog.values[b.local].name));
    }
    r.outputs.push_back(assemble_tensor(shards, b.sharding, mesh, run_shape(global, b.global, shards[0]->shape)));
  }
  ex.add_profile("(assemble)", seconds_since(t_assemble));
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.wall_s = seconds_since(t_start);
  return r;
}

LocalRun run_spmd_local(const SpmdProgram& p, const Graph& global, const std::vector<std::vector<Tensor>>& input_shards,
                        const std::vector<int64_t>& devices, CollectiveExecutor& collectives,
                        const RunProgress& progress, const ExecutorOptions& options) {
  auto t_start = Clock::now();
  const Graph& prog = p.program;
  if (input_shards.size() != p.inputs.size())
    throw InputError(
        fmt::format("run: the program has {} inputs, {} were given", p.inputs.size(), input_shards.size()));
  for (int64_t d : devices)
    if (d < 0 || d >= p.mesh.num_devices())
      throw InternalError(fmt::format("device {} is not on the mesh {}", d, p.mesh.str()));
  std::vector<std::unique_ptr<Tensor>> slices;  // weight slices shared by devices; outlive the executor's use
  Executor ex(prog, p.mesh, devices, collectives, options);
  std::vector<char> bound(prog.values.size(), 0);
  bind_weights(ex, p, global, devices, bound, slices);
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const ProgramBinding& b = p.inputs[k];
    if (input_shards[k].size() != devices.size())
      throw InternalError(fmt::format("input '{}': {} shards for {} devices", prog.values[b.local].name,
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
        throw InternalError(fmt::format("program output '{}' was not computed", prog.values[b.local].name));
      r.output_shards.back().push_back(*ex.get(static_cast<int64_t>(d), b.local));
    }
  }
  finish_local_run(ex, t_start, r);
  return r;
}

LocalRun run_device_graph(const Graph& g, const DeviceMesh& mesh, int64_t device, const std::vector<Tensor>& inputs,
                          CollectiveExecutor& collectives, const RunProgress& progress,
                          const ExecutorOptions& options) {
  if (device < 0 || device >= mesh.num_devices())
    throw InternalError(fmt::format("device {} is not on the mesh {}", device, mesh.str()));
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

PodRun run_device_graphs(const SpmdProgram& p, const Graph& global, const std::vector<Graph>& device_graphs,
                         const std::vector<Tensor>& inputs, const ExecutorOptions& options) {
  const DeviceMesh& mesh = p.mesh;
  const int64_t n = mesh.num_devices();
  if (static_cast<int64_t>(device_graphs.size()) != n)
    throw std::invalid_argument(fmt::format("run_device_graphs: {} graphs for {} devices", device_graphs.size(), n));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<LocalRun> runs(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  ThreadCollectives coll(n);
  ExecutorOptions one = options;  // one device per thread
  one.device_threads = 1;
  std::vector<std::thread> threads;
  for (int64_t k = 0; k < n; ++k)
    threads.emplace_back([&, k] {
      try {
        std::vector<Tensor> local;
        for (const ProgramBinding& b : p.inputs) {
          const auto i = std::find(global.inputs.begin(), global.inputs.end(), b.global) - global.inputs.begin();
          local.push_back(shard_tensor(inputs.at(static_cast<size_t>(i)), b.sharding, mesh, k));
        }
        runs[static_cast<size_t>(k)] =
            run_device_graph(device_graphs[static_cast<size_t>(k)], mesh, k, local, coll, {}, one);
      } catch (...) {
        errors[static_cast<size_t>(k)] = std::current_exception();
        coll.fail(errors[static_cast<size_t>(k)]);
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  PodRun r;
  for (size_t o = 0; o < p.outputs.size(); ++o) {
    std::vector<const Tensor*> shards;
    for (const LocalRun& l : runs) shards.push_back(&l.output_shards.at(o).at(0));
    const ProgramBinding& b = p.outputs[o];
    r.outputs.push_back(assemble_tensor(shards, b.sharding, mesh, run_shape(global, b.global, shards.at(0)->shape)));
  }
  for (int64_t k = 0; k < n; ++k) {
    const LocalRun& l = runs[static_cast<size_t>(k)];
    r.devices.push_back(l.devices.at(0));
    r.devices.back().device = k;
    r.host_flops += l.host_flops;
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace gspmd
