// gspmd-onnx run --backend mpi: one MPI rank per device (docs/mpi.md). Compiled with or without MPI support; without
// it, --backend mpi is a one-line error (exit 2).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "cli/commands.h"

#ifdef GSPMD_WITH_MPI
#include "backend/kernels/kernels.h"
#include "backend/mpi/mpi_backend.h"
#include "backend/profile/host_target.h"
#include "cli/executor_env.h"
#include "cli/progress.h"
#include "cli/report.h"
#include "cli/trace.h"
#include "cli/wiring.h"
#include "onnx_frontend/frontend.h"
#endif

namespace gspmd::cli {

#ifndef GSPMD_WITH_MPI

int cmd_run_mpi(const RunOptions&) {
  throw InputError(
      "--backend mpi: this gspmd-onnx was built without MPI (install openmpi-bin and libopenmpi-dev, then rebuild)");
}

#else

namespace fs = std::filesystem;

namespace {

/// The test hook of GSPMD_MPI_TEST_DIE_RANK (docs/mpi.md, tests/mpi/mpi_run_test.cc): a progress callback that, once
/// max(nodes / 2, 1) of the program's `nodes` are done, prints "error: rank R: GSPMD_MPI_TEST_DIE_RANK: dying at node
/// N/M (test hook)" and kills this process (SIGKILL), as a crashing rank would.
RunProgress die_halfway(int rank, size_t nodes) {
  const size_t die_at = std::max<size_t>(nodes / 2, 1);
  return [rank, die_at](size_t done, size_t total) {
    if (done < die_at) return;  // fused groups report several nodes at once
    std::fprintf(stderr, "error: rank %d: GSPMD_MPI_TEST_DIE_RANK: dying at node %zu/%zu (test hook)\n", rank, done,
                 total);
    std::fflush(stderr);
    ::raise(SIGKILL);
  };
}

mpi::Failure classify(const std::exception& e) {
  auto [code, line] = error_exit(e);
  return {code, std::move(line)};
}

/// The fraction of a core each rank gets: this process's cores over (ranks on this host x OpenMP threads), <= 1.
double core_share(int ranks_on_this_host) {
  return std::min(1.0, static_cast<double>(host_cores()) / (static_cast<double>(ranks_on_this_host) * host_threads()));
}

/// `--target host` under MPI: rank 0 measures this machine while the other ranks wait without spinning, scales the
/// per-device rates by `share` (rates times share, times over share), and every rank uses that one target: the same
/// program on every rank, and a prediction for ranks that run at the same time. Collective over MPI_COMM_WORLD.
void share_host_target(mpi::Session& s, double share) {
  std::string text;
  if (s.rank() == 0) {
    Target t = measure_host_target();
    t.peak_flops *= share;
    for (auto& pt : t.contraction_curve) pt.second *= share;
    t.hbm_bandwidth *= share;
    t.link_bandwidth *= share;
    t.op_overhead /= share;
    t.name = "host";
    text = t.to_json();
  }
  text = s.broadcast(text);
  Target t = Target::from_json(text, "host target from rank 0");
  Target::register_preset("host", [t] { return t; });
}

/// `--target host` under MPI, once the program is known: rank 0 measures its ops (measure_program_ops, times over
/// `share`) while the other ranks wait without spinning; every rank gets the table. Collective over MPI_COMM_WORLD.
void share_measured_ops(mpi::Session& s, Compiled& p, double share) {
  std::string text;
  if (s.rank() == 0) {
    auto t0 = std::chrono::steady_clock::now();
    measure_program_ops(p.program, p.target, share);
    p.times.measure_ops = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    text = nlohmann::json(p.target.measured_ops).dump();
  }
  text = s.broadcast(text);
  if (s.rank() != 0) p.target.measured_ops = nlohmann::json::parse(text).get<std::map<std::string, double> >();
}

/// What a rank sets up before the run: the compiled model, its device file (--program), and on rank 0 the inputs and
/// --expected's outputs.
struct RankSetup {
  Compiled p;
  Graph device;
  std::vector<Tensor> inputs;
  std::vector<OnnxValue> expected;  // rank 0, --expected
};

/// Sets up rank `s.rank()` on its own (`share`: its share of the host's cores); throws what it meets.
void set_up_rank(mpi::Session& s, const RunOptions& o, bool terminal, double share, RankSetup& r) {
  const int rank = s.rank();
  const bool from_files = !o.program_dir.empty();
  // The ranks exist before the model is read, so their count comes from --mesh.
  if (!o.common.mesh) throw InputError("--backend mpi: --mesh is required (it is the number of ranks)");
  const int64_t n = DeviceMesh::parse(*o.common.mesh).num_devices();
  if (n != s.size())
    throw InputError(
        fmt::format("--mesh {} has {} devices but this MPI job has {} rank{}: start it with "
                    "mpirun -np {}",
                    *o.common.mesh, n, s.size(), s.size() == 1 ? "" : "s", n));
  if (o.common.target == "host") share_host_target(s, share);
  // with --program the weights come from the device files; rank 0 still needs them for --check
  CommonOptions common = o.common;
  common.measure_host_ops = false;  // rank 0 measures them below, for every rank
  common.progress = terminal;
  r.p = compile_model(common, !from_files || (o.check && rank == 0));
  if (r.p.program.mesh.num_devices() != s.size())
    throw InputError(fmt::format("the mesh {} has {} devices but this MPI job has {} ranks", r.p.program.mesh.str(),
                                 r.p.program.mesh.num_devices(), s.size()));
  if (from_files) r.device = DeviceFiles(r.p, common, o.program_dir).load(rank);
  check_fits_memory(r.p.graph);
  if (rank == 0) r.inputs = make_inputs(r.p.graph, r.p.load_report, o, r.p.training ? &*r.p.training : nullptr);
  if (rank == 0 && !o.expected_dir.empty()) r.expected = read_expected_outputs(o.expected_dir, r.p.load_report);
}

/// The ranks' measured times: the report's "measured" section (`pod` gets each rank's device stats).
nlohmann::json measured_json(const mpi::MpiRun& run, const RunOptions& o, PodRun& pod) {
  double max_wall = 0, max_step = 0, sum_compute = 0, sum_comm = 0, max_compute = 0, max_comm = 0;
  nlohmann::json per_rank = nlohmann::json::array();
  for (const mpi::RankStats& r : run.ranks) {
    DeviceStats d;
    d.device = r.rank;
    d.peak_memory_bytes = r.peak_memory_bytes;
    d.compute_wall_s = r.compute_s;
    d.communication_wall_s = r.communication_s;
    pod.devices.push_back(d);
    pod.host_flops += r.flops;
    max_wall = std::max(max_wall, r.wall_s);
    max_step = std::max(max_step, r.run_s);
    sum_compute += r.compute_s;
    sum_comm += r.communication_s;
    max_compute = std::max(max_compute, r.compute_s);
    max_comm = std::max(max_comm, r.communication_s);
    per_rank.push_back({{"rank", r.rank},
                        {"device", r.rank},
                        {"host", r.host},
                        {"compute_s", r.compute_s},
                        {"communication_s", r.communication_s},
                        {"step_s", r.run_s},
                        {"cpu_s", r.cpu_s},
                        {"wall_s", r.wall_s},
                        {"peak_memory_bytes", r.peak_memory_bytes}});
  }
  pod.wall_s = max_step;
  const double nr = static_cast<double>(std::max<size_t>(run.ranks.size(), 1));
  return {
      {"ranks", run.ranks.size()},
      {"program", o.program_dir.empty() ? "spmd" : "device files"},
      {"warmup_runs", o.warmup},
      {"measured_runs", o.repeat},
      {"median_run", run.median_run},
      {"steps_s", run.steps_s},
      {"step_time_s", max_step},
      {"wall_s", max_wall},
      {"compute_time_s", sum_compute / nr},
      {"communication_time_s", sum_comm / nr},
      {"max_compute_s", max_compute},
      {"max_communication_s", max_comm},
      {"scatter_s", run.scatter_s},
      {"gather_s", run.gather_s},
      {"per_rank", per_rank},
  };
}

/// Rank 0 after the run: --check, --expected, --outputs, the report, the trace and the summary; the exit code.
int report_run(const RunOptions& o, RankSetup& r, mpi::MpiRun& run, bool terminal) {
  Compiled& p = r.p;
  PodRun pod;
  pod.outputs = std::move(run.outputs);
  nlohmann::json measured = measured_json(run, o, pod);
  CheckResult check;
  if (o.check) {
    check = check_against_reference(p, r.inputs, pod.outputs, o.rtol, o.atol,
                                    node_progress("run: reference, 1 device", terminal), executor_options_from_env());
  }
  ExpectedResult exp;
  if (!o.expected_dir.empty())
    exp = compare_expected(p.graph, p.load_report, pod.outputs, r.expected, o.expected_dir, o.rtol, o.atol);
  if (!o.outputs_dir.empty()) write_outputs(o.outputs_dir, p.graph, p.load_report, pod.outputs);
  CostReport cost = p.cost(o.common.overlap);
  nlohmann::json report =
      make_report(p, cost, &pod, o.check ? &check : nullptr, o.expected_dir.empty() ? nullptr : &exp);
  report["backend"] = "mpi";
  report["measured"] = std::move(measured);
  if (!o.report.empty()) write_json(o.report, report);
  if (!o.trace.empty()) write_trace(o.trace, p.program, cost, p.target.name, run.timelines, pipeline_track(p));
  print_summary(report, o.common.model);
  const auto& m = report["measured"];
  const double compute = m["compute_time_s"].get<double>(), comm = m["communication_time_s"].get<double>();
  fmt::print(
      "mpi       {} ranks, step {:.3f} ms measured (compute {:.3f} ms, communication {:.3f} ms, mean over "
      "ranks; slowest rank's step {:.3f} ms)\n",
      run.ranks.size(), 1e3 * (compute + comm), 1e3 * compute, 1e3 * comm, 1e3 * m["step_time_s"].get<double>());
  std::fflush(stdout);
  return (o.check && !check.passed) || !exp.passed ? 1 : 0;
}

int run_on_rank(mpi::Session& s, const RunOptions& o) {
  const int rank = s.rank();
  RankSetup r;
  const bool from_files = !o.program_dir.empty();
  const bool terminal = rank == 0 && stderr_is_terminal(/*launched=*/true);  // progress: rank 0 only

  // Setup: every rank on its own; failures are agreed on, so every rank reports them and exits.
  std::optional<mpi::Failure> failure;
  const double share = core_share(s.ranks_on_this_host());  // collective: every rank
  try {
    set_up_rank(s, o, terminal, share, r);
  } catch (const std::exception& e) {
    failure = classify(e);
  }
  s.agree(failure);
  mpi::check_same_program(s, mpi::run_fingerprint(r.p.program, r.p.graph, !from_files));
  if (o.common.target == "host") share_measured_ops(s, r.p, share);

  // The run: a failure from here on may leave other ranks blocked in a collective, so it aborts the job.
  try {
    RunProgress progress = node_progress(fmt::format("run: rank {} of {} ranks", rank, s.size()), terminal);
    if (const char* env = std::getenv("GSPMD_MPI_TEST_DIE_RANK"); env && std::atoi(env) == rank)
      progress = die_halfway(rank, from_files ? r.device.nodes.size() : r.p.program.program.nodes.size());
    mpi::MpiRun run = mpi::run_mpi(s, r.p.program, r.p.graph, r.inputs, from_files ? &r.device : nullptr, o.warmup,
                                   o.repeat, executor_options_from_env(), progress);
    if (rank != 0) return 0;
    return report_run(o, r, run, terminal);
  } catch (const std::exception& e) {
    mpi::Failure f = classify(e);
    fmt::print(stderr, "error: rank {}: {}\n", rank, f.message);
    s.abort(f.exit_code);
  }
}

}  // namespace

int cmd_run_mpi(const RunOptions& o) {
  check_output_path(o.report, "--report");
  mpi::Session s;
  try {
    return run_on_rank(s, o);
  } catch (const mpi::RankFailure& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    std::fflush(stderr);
    s.exiting_with_error(e.exit_code);
    return e.exit_code;
  }
}

#endif

}  // namespace gspmd::cli
