// backend/mpi: run_mpi (mpi_backend.h): the inputs scattered, the program run on every rank, the outputs, timelines
// and statistics gathered on rank 0.
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "backend/mpi/mpi_backend.h"
#include "backend/mpi/mpi_check.h"
#include "backend/pod/collectives.h"

namespace gspmd::mpi {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// CPU time of this process, all threads (seconds).
double process_cpu_s() {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Numbers per measured execution in a rank's stats row (the fields stats_row reads, in that order).
constexpr int kStats = 7;

/// Rank 0 slices every device's shard of each program input from `inputs` (the full global inputs) and scatters
/// them over MPI_COMM_WORLD (a replicated input is broadcast); collective. Returns shards[k][0], this rank's shard
/// of program input k (p.inputs order) on the program's local shape. Throws InternalError when a program input
/// binds a value that is not a graph input or a shard's size differs from the program's, or on an MPI error.
std::vector<std::vector<Tensor>> scatter_inputs(int rank, int N, const SpmdProgram& p, const Graph& global,
                                                const std::vector<Tensor>& inputs) {
  const Graph& prog = p.program;
  std::vector<int> input_index(global.values.size(), -1);
  for (size_t k = 0; k < global.inputs.size(); ++k) input_index[global.inputs[k]] = static_cast<int>(k);
  std::vector<std::vector<Tensor>> shards(p.inputs.size());
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const ProgramBinding& b = p.inputs[k];
    const Value& lv = prog.values.at(b.local);
    const Value& gv = global.values.at(b.global);
    const int gk = input_index.at(b.global);
    if (gk < 0) throw InternalError(fmt::format("program input binds '{}', not a graph input", gv.name));
    Tensor local(lv.dtype, lv.shape);
    const size_t nb = local.nbytes();
    const bool replicated = b.sharding.is_replicated() && lv.shape == gv.shape;
    if (replicated) {
      if (rank == 0) local = inputs.at(static_cast<size_t>(gk));
      check(MPI_Bcast(local.bytes.data(), count_of(nb, "MPI_Bcast"), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
    } else {
      std::vector<std::byte> send;
      if (rank == 0) {
        send.resize(nb * static_cast<size_t>(N));
        for (int d = 0; d < N; ++d) {
          Tensor s = shard_tensor(inputs.at(static_cast<size_t>(gk)), b.sharding, p.mesh, d);
          if (s.nbytes() != nb)
            throw InternalError(fmt::format("input '{}': device {}'s shard is {} bytes, the program expects {}",
                                            gv.name, d, s.nbytes(), nb));
          std::memcpy(send.data() + static_cast<size_t>(d) * nb, s.bytes.data(), nb);
        }
      }
      check(MPI_Scatter(send.data(), count_of(nb, "MPI_Scatter"), MPI_BYTE, local.bytes.data(), static_cast<int>(nb),
                        MPI_BYTE, 0, MPI_COMM_WORLD),
            "MPI_Scatter");
    }
    shards[k].push_back(std::move(local));
  }
  return shards;
}

/// Calls `execute` (one execution of this rank's device) `warmup_runs` times untimed, then `measured_runs` times
/// timed, each after a barrier on MPI_COMM_WORLD; `progress` goes to the first execution only. Appends kStats numbers
/// per measured execution to `rows` (compute, communication and wall seconds, peak bytes, FLOPs, run seconds, CPU
/// seconds) and its timeline to `timelines`, and returns the last execution's result. Throws what `execute` throws,
/// InternalError on an MPI error.
LocalRun execute_runs(const std::function<LocalRun(const RunProgress&)>& execute, int warmup_runs, int measured_runs,
                      const RunProgress& progress, std::vector<double>& rows,
                      std::vector<std::vector<ExecutedStep>>& timelines) {
  // Warm-up executions (untimed): oneDNN creates and JIT-compiles its primitives on first use in each process.
  for (int w = 0; w < warmup_runs; ++w) {
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    execute(w == 0 ? progress : RunProgress{});
  }
  // Measured executions: this rank's stats of each; the outputs are the last one's.
  rows.reserve(static_cast<size_t>(kStats) * static_cast<size_t>(measured_runs));
  LocalRun lr;
  for (int m = 0; m < measured_runs; ++m) {
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    auto t_run = Clock::now();
    const double cpu0 = process_cpu_s();
    lr = execute(warmup_runs == 0 && m == 0 ? progress : RunProgress{});
    const double cpu = process_cpu_s() - cpu0, wall = seconds_since(t_run);
    const DeviceStats& d = lr.devices.at(0);
    rows.insert(rows.end(), {d.compute_wall_s, d.communication_wall_s, wall, static_cast<double>(d.peak_memory_bytes),
                             lr.host_flops, lr.run_s, cpu});
    timelines.push_back(std::move(lr.timeline));
  }
  return lr;
}

/// Gathers every rank's `mine` (its steps of one execution) on rank 0 into r.timelines (indexed by rank); other
/// ranks leave it empty. Per step, the times travel as doubles (start, end, node count) and the names as text
/// (name, op type, each NUL-terminated). Collective; throws InternalError on an MPI error.
void gather_timelines(int rank, int N, const std::vector<ExecutedStep>& mine, MpiRun& r) {
  std::vector<double> nums;
  std::string text;
  for (const ExecutedStep& st : mine) {
    nums.insert(nums.end(), {st.start_s, st.end_s, static_cast<double>(st.nodes.size())});
    for (size_t k = 0; k < st.nodes.size(); ++k) {
      text.append(st.nodes[k]).push_back('\0');
      text.append(st.ops[k]).push_back('\0');
    }
  }
  const int sizes[2] = {count_of(nums.size(), "MPI_Gatherv (timeline)"),
                        count_of(text.size(), "MPI_Gatherv (timeline)")};
  std::vector<int> all_sizes(rank == 0 ? 2 * static_cast<size_t>(N) : 0);
  check(MPI_Gather(sizes, 2, MPI_INT, all_sizes.data(), 2, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather (timeline sizes)");
  std::vector<int> num_counts, num_displs, text_counts, text_displs;
  size_t num_total = 0, text_total = 0;
  for (int d = 0; d < (rank == 0 ? N : 0); ++d) {
    num_counts.push_back(all_sizes[2 * d]);
    num_displs.push_back(count_of(num_total, "MPI_Gatherv (timeline)"));
    num_total += static_cast<size_t>(all_sizes[2 * d]);
    text_counts.push_back(all_sizes[2 * d + 1]);
    text_displs.push_back(count_of(text_total, "MPI_Gatherv (timeline)"));
    text_total += static_cast<size_t>(all_sizes[2 * d + 1]);
  }
  std::vector<double> all_nums(num_total);
  std::string all_text(text_total, '\0');
  check(MPI_Gatherv(nums.data(), sizes[0], MPI_DOUBLE, all_nums.data(), num_counts.data(), num_displs.data(),
                    MPI_DOUBLE, 0, MPI_COMM_WORLD),
        "MPI_Gatherv (timeline times)");
  check(MPI_Gatherv(text.data(), sizes[1], MPI_CHAR, all_text.data(), text_counts.data(), text_displs.data(), MPI_CHAR,
                    0, MPI_COMM_WORLD),
        "MPI_Gatherv (timeline names)");
  if (rank != 0) return;
  r.timelines.assign(static_cast<size_t>(N), {});
  for (int d = 0; d < N; ++d) {
    size_t at = static_cast<size_t>(text_displs[d]);
    auto next = [&] {
      const size_t end = all_text.find('\0', at);
      std::string w = all_text.substr(at, end - at);
      at = end + 1;
      return w;
    };
    for (int i = num_displs[d]; i + 2 < num_displs[d] + num_counts[d]; i += 3) {
      ExecutedStep st;
      st.start_s = all_nums[static_cast<size_t>(i)];
      st.end_s = all_nums[static_cast<size_t>(i) + 1];
      for (int k = 0; k < static_cast<int>(all_nums[static_cast<size_t>(i) + 2]); ++k) {
        st.nodes.push_back(next());
        st.ops.push_back(next());
      }
      r.timelines[static_cast<size_t>(d)].push_back(std::move(st));
    }
  }
}

/// Gathers every rank's shard of each program output (lr.output_shards[k][0]) on rank 0, which appends the assembled
/// global output to `outputs` (p.outputs order); collective. Throws InternalError when the run's outputs do not
/// match the program's (count, dtype, shape) or on an MPI error.
void gather_outputs(int rank, int N, const SpmdProgram& p, const Graph& global, const LocalRun& lr,
                    std::vector<Tensor>& outputs) {
  const Graph& prog = p.program;
  if (lr.output_shards.size() != p.outputs.size())
    throw InternalError(
        fmt::format("the run gave {} outputs, the program has {}", lr.output_shards.size(), p.outputs.size()));
  for (size_t k = 0; k < p.outputs.size(); ++k) {
    const ProgramBinding& b = p.outputs[k];
    const Value& lv = prog.values.at(b.local);
    const Tensor& shard = lr.output_shards[k].at(0);
    // a data-dependent dim has the size this run found (docs/shapes.md step 6): the rest is the program's
    const std::vector<char> runtime = runtime_dims_of(prog, b.local);
    bool ok = shard.dtype == lv.dtype && shard.shape.size() == lv.shape.size();
    for (size_t d = 0; ok && d < shard.shape.size(); ++d)
      ok = shard.shape[d] == lv.shape[d] || (d < runtime.size() && runtime[d]);
    if (!ok)
      throw InternalError(fmt::format("output '{}' is {}{} but the program declares {}{}", lv.name,
                                      dtype_name(shard.dtype), shape_str(shard.shape), dtype_name(lv.dtype),
                                      shape_str(lv.shape)));
    // every rank's shape first (they differ only where a data-dependent dim does), then the bytes
    const size_t r = shard.shape.size();
    std::vector<int64_t> shapes(rank == 0 ? r * static_cast<size_t>(N) : 0);
    check(MPI_Gather(shard.shape.data(), static_cast<int>(r), MPI_INT64_T, shapes.data(), static_cast<int>(r),
                     MPI_INT64_T, 0, MPI_COMM_WORLD),
          "MPI_Gather (output shapes)");
    std::vector<Tensor> all;
    std::vector<int> counts, displs;
    size_t total = 0;
    if (rank == 0) {
      for (int d = 0; d < N; ++d) {
        all.emplace_back(lv.dtype, Shape(shapes.begin() + static_cast<std::ptrdiff_t>(r * d),
                                         shapes.begin() + static_cast<std::ptrdiff_t>(r * (d + 1))));
        counts.push_back(count_of(all.back().nbytes(), "MPI_Gatherv"));
        displs.push_back(count_of(total, "MPI_Gatherv"));
        total += all.back().nbytes();
      }
    }
    std::vector<std::byte> recv(total);
    check(MPI_Gatherv(shard.bytes.data(), count_of(shard.nbytes(), "MPI_Gatherv"), MPI_BYTE, recv.data(), counts.data(),
                      displs.data(), MPI_BYTE, 0, MPI_COMM_WORLD),
          "MPI_Gatherv");
    if (rank == 0) {
      std::vector<const Tensor*> ptrs;
      for (int d = 0; d < N; ++d) {
        std::memcpy(all[d].bytes.data(), recv.data() + displs[d], all[d].nbytes());
        ptrs.push_back(&all[d]);
      }
      outputs.push_back(assemble_tensor(ptrs, b.sharding, p.mesh, run_shape(global, b.global, all[0].shape)));
    }
  }
}

/// Rank `d`'s stats of measured execution `m` from `from`, which holds kStats numbers per execution (as
/// execute_runs writes them) for `measured_runs` executions per rank, ranks one after another from `d` = 0.
RankStats stats_row(const std::vector<double>& from, int d, int m, int measured_runs) {
  const double* x = from.data() + static_cast<size_t>(kStats) * (static_cast<size_t>(d) * measured_runs + m);
  RankStats s;
  s.rank = d;
  s.compute_s = x[0];
  s.communication_s = x[1];
  s.wall_s = x[2];
  s.peak_memory_bytes = static_cast<int64_t>(x[3]);
  s.flops = x[4];
  s.run_s = x[5];
  s.cpu_s = x[6];
  return s;
}

/// Gathers every rank's stats rows (`rows_mine`, from execute_runs) and host name on rank 0, which sets r.steps_s,
/// r.median_run and r.ranks (every rank's stats of the median execution); another rank sets r.ranks to its own stats
/// of its last execution. Collective; throws InternalError on an MPI error.
void gather_rank_stats(int rank, int N, int measured_runs, const std::vector<double>& rows_mine, MpiRun& r) {
  // Stats: every rank's rows on rank 0, which keeps the execution whose step (its slowest rank's) is the median.
  std::vector<double> rows(rank == 0 ? rows_mine.size() * static_cast<size_t>(N) : 0);
  const int count = static_cast<int>(rows_mine.size());
  check(MPI_Gather(rows_mine.data(), count, MPI_DOUBLE, rows.data(), count, MPI_DOUBLE, 0, MPI_COMM_WORLD),
        "MPI_Gather (stats)");
  char name[MPI_MAX_PROCESSOR_NAME + 1] = {};
  int name_len = 0;
  check(MPI_Get_processor_name(name, &name_len), "MPI_Get_processor_name");
  std::vector<char> names(rank == 0 ? static_cast<size_t>(N) * (MPI_MAX_PROCESSOR_NAME + 1) : 0);
  check(MPI_Gather(name, MPI_MAX_PROCESSOR_NAME + 1, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME + 1, MPI_CHAR, 0,
                   MPI_COMM_WORLD),
        "MPI_Gather (host names)");
  if (rank == 0) {
    std::vector<int> order(static_cast<size_t>(measured_runs));
    for (int m = 0; m < measured_runs; ++m) {
      double step = 0;
      for (int d = 0; d < N; ++d) step = std::max(step, stats_row(rows, d, m, measured_runs).run_s);
      r.steps_s.push_back(step);
      order[static_cast<size_t>(m)] = m;
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return r.steps_s[a] < r.steps_s[b]; });
    r.median_run = order[static_cast<size_t>(measured_runs / 2)];
    for (int d = 0; d < N; ++d) {
      r.ranks.push_back(stats_row(rows, d, r.median_run, measured_runs));
      r.ranks.back().host = names.data() + static_cast<size_t>(d) * (MPI_MAX_PROCESSOR_NAME + 1);
    }
  } else {
    r.ranks.push_back(stats_row(rows_mine, 0, measured_runs - 1, measured_runs));
    r.ranks.back().rank = rank;
    r.ranks.back().host = name;
  }
}

}  // namespace

MpiRun run_mpi(const Session& session, const SpmdProgram& p, const Graph& global, const std::vector<Tensor>& inputs,
               const Graph* device_model, int warmup_runs, int measured_runs, const ExecutorOptions& options,
               const RunProgress& progress) {
  const int rank = session.rank();
  const int N = session.size();
  if (N != p.mesh.num_devices()) throw InternalError(fmt::format("{} ranks for {} devices", N, p.mesh.num_devices()));
  if (measured_runs < 1) throw std::invalid_argument("run_mpi: measured_runs must be >= 1");
  MpiRun r;

  // Communicators first (collective), so that the timed part below is the program only.
  MpiCollectives coll(p.mesh, rank, device_model ? *device_model : p.program);

  // Inputs: rank 0 slices every device's shard and scatters them.
  auto t_scatter = Clock::now();
  std::vector<std::vector<Tensor>> shards = scatter_inputs(rank, N, p, global, inputs);
  r.scatter_s = seconds_since(t_scatter);

  std::vector<Tensor> local_inputs;  // device-model mode: graph inputs in order
  if (device_model)
    for (auto& sh : shards) local_inputs.push_back(sh[0]);
  auto execute = [&](const RunProgress& prog_cb) {
    return device_model ? run_device_graph(*device_model, p.mesh, rank, local_inputs, coll, prog_cb, options)
                        : run_spmd_local(p, global, shards, {rank}, coll, prog_cb, options);
  };
  std::vector<double> rows_mine;
  std::vector<std::vector<ExecutedStep>> timelines;
  const LocalRun lr = execute_runs(execute, warmup_runs, measured_runs, progress, rows_mine, timelines);

  // Outputs: gather every device's shard on rank 0 and assemble; then the stats, and every rank's timeline of the
  // execution the stats describe.
  auto t_gather = Clock::now();
  gather_outputs(rank, N, p, global, lr, r.outputs);
  gather_rank_stats(rank, N, measured_runs, rows_mine, r);
  int median = r.median_run;
  check(MPI_Bcast(&median, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast (median run)");
  gather_timelines(rank, N, timelines.at(static_cast<size_t>(median)), r);
  r.gather_s = seconds_since(t_gather);
  return r;
}

uint64_t run_fingerprint(const SpmdProgram& p, const Graph& global, bool with_weights) {
  uint64_t h = program_fingerprint(p);
  if (!with_weights) return h;
  for (const ProgramBinding& b : p.params) {
    const Value& gv = global.values.at(b.global);
    if (gv.data) h = fnv1a(h, gv.data->bytes.data(), gv.data->bytes.size());
  }
  for (const Value& v : p.program.values)  // program constants (folded values, small initializers)
    if (v.is_initializer && v.data) h = fnv1a(h, v.data->bytes.data(), v.data->bytes.size());
  return h;
}

void check_same_program(const Session& session, uint64_t fingerprint) {
  std::vector<uint64_t> all(static_cast<size_t>(session.size()));
  check(MPI_Allgather(&fingerprint, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD),
        "MPI_Allgather (program fingerprints)");
  for (int r = 1; r < session.size(); ++r)
    if (all[r] != all[0])
      throw RankFailure(2, fmt::format("rank {}: ranks were given different models: rank {} has program fingerprint "
                                       "{:016x}, rank 0 has {:016x} (every rank needs the same MODEL, --shardings, "
                                       "--mesh, --target and weights)",
                                       session.rank(), r, all[r], all[0]));
}

}  // namespace gspmd::mpi
