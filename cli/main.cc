// gspmd-onnx: the command line (the only file that includes CLI11). Exit codes: 0 ok, 1 --check mismatch,
// 2 unusable input, 3 unsupported operator, 4 internal error.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>
#include <stdexcept>

#include "backend/profile/host_target.h"
#include "cli/commands.h"
#include "cli/report.h"

using namespace gspmd;

namespace {

void add_common(CLI::App* c, cli::CommonOptions& o) {
  c->add_option("model", o.model, "ONNX model file")->required();
  c->add_option(
      "--mesh", o.mesh,
      "device mesh shape, e.g. 4x4, 16, 2x2x4 (default: the mesh the sharding file or annotated model names)");
  c->add_option("--shardings", o.shardings,
                "sharding file, or an annotated model (.onnx) (default: MODEL's own annotations, or its sibling "
                "<stem>.sharding.json)");
  c->add_option("--dim", o.dims, "bind a symbolic input dimension, NAME=VALUE (repeatable)");
  c->add_option("--inputs", o.inputs_dir,
                "directory of input_<i>.pb (ONNX test-data layout): run's inputs; their shapes bind symbolic dims "
                "and the structure of sequence and optional inputs");
  c->add_option("--target", o.target,
                "emulated pod: tpu-v3 (default), tpu-v4, tpu-v5e, dgx-a100, dgx-h100 (8-GPU nodes), host (this "
                "machine, measured), or a JSON file");
  c->add_option("--device-order", o.device_order,
                "mesh axes per physical dim of the target's torus, e.g. \"y,x\" or \"data,model*expert\" "
                "(default: axis i on dim i, extra axes folded onto the last)");
  c->add_flag("--overlap", o.overlap, "simulated step: overlap collectives with independent compute (default off)");
  c->add_flag("--auto", o.auto_search, "search shardings for everything the sharding file leaves open");
  c->add_option("--memory-limit", o.memory_limit,
                "--auto: per-device peak memory limit: bytes, or 512MiB, 16GiB, 12GB (default: HBM)");
  c->add_option("--precision", o.precision,
                "retype the model's float values: bf16, mixed (bfloat16 compute, float32 weights cast where read), "
                "autocast (torch.autocast's: contractions in bfloat16, the rest in its inputs' widest type) or f32 "
                "(default: as the model declares them; docs/training.md)");
  auto& t = o.training;
  c->add_flag("--training", t.on, "one training step: forward, loss, backward, optimizer update (docs/training.md)");
  c->add_option("--loss", t.loss, "--training: output (a scalar output 0, default), mean, sum or cross-entropy:LABELS");
  c->add_option("--optimizer", t.optimizer, "--training: sgd (default), momentum, adam or adafactor");
  c->add_option("--trainable", t.trainable,
                "--training: regex over initializer names (default: float initializers of more than one element)");
  c->add_option("--shard-update", t.shard_update,
                "--training: shard the weight update and optimizer state over mesh axis AXIS: reduce-scatter the "
                "gradient, update the shard, all-gather the weight (weight-update sharding, ZeRO-1/2)");
  c->add_option(
      "--remat", t.remat,
      "--training: rematerialization: none (default; with --auto the search chooses), full (keep only the cut "
      "values between segments, recompute the rest in the backward) or dots (also keep contraction outputs)");
  c->add_option("--accumulate", t.accumulate,
                "--training: gradient accumulation: one step over K microbatches of the model's batch (the data "
                "inputs take K times it), gradients summed, one update (default 1)");
  c->add_option("--lr", t.lr, "--training: learning rate (default 0.01)");
  c->add_option("--momentum", t.momentum, "--optimizer momentum: momentum (default 0.9)");
  c->add_option("--beta1", t.beta1, "--optimizer adam: beta1 (default 0.9)");
  c->add_option("--beta2", t.beta2, "--optimizer adam: beta2 (default 0.999)");
  auto& pl = o.pipeline;
  c->add_option("--pipeline", pl.axis,
                "pipeline parallelism over mesh axis AXIS: the repeated layers become stages, one per device along "
                "AXIS, run as one stacked layer with a collective-permute shift per iteration; 'auto' with --auto: "
                "the search chooses the stage count (docs/pipeline.md)");
  c->add_option("--microbatches", pl.microbatches,
                "--pipeline: microbatches the batch is split into (default: the largest divisor of the batch up to "
                "the number of stages; with --auto, the fastest)")
      ->check(CLI::PositiveNumber);
  c->add_option("--schedule", pl.schedule,
                "--pipeline: gpipe (default: consecutive layers per stage) or circular (stage s runs layers s, s+S, "
                "...: a smaller bubble)");
  c->add_option("--layers", pl.layers,
                "--pipeline: regex over initializer names whose first capture group is the layer index (default: "
                "layers found by weight names)");
  c->add_option("--eps", t.eps,
                "--optimizer adam: epsilon (default 1e-8); adafactor: eps1, added to the squared gradient (default "
                "1e-30)");
}

/// The `partition` command and its options.
CLI::App* add_partition(CLI::App& app, cli::PartitionOptions& po) {
  auto* part = app.add_subcommand("partition", "infer shardings, partition, write one ONNX model per device");
  add_common(part, po.common);
  part->add_option("-o,--output", po.out_dir, "output directory")->required();
  part->add_option("--hint", po.common.hints,
                   "the size a symbolic dim is partitioned and costed at, NAME=VALUE, without binding it: the files "
                   "still serve every size (repeatable; default: primes from 17)");
  part->add_option("--notation", po.notation, "notation of shardings.json: spec (default), hlo or sbp")
      ->check(CLI::IsMember({"spec", "hlo", "sbp"}));
  part->add_option("--collectives", po.collectives,
                   "how device files write collectives: gspmd (default: domain gspmd) or ort (ONNX Runtime's "
                   "com.microsoft AllReduce/AllGather/AllToAll)")
      ->check(CLI::IsMember({"gspmd", "ort"}));
  part->add_option("--annotated-model", po.annotated_model,
                   "also write MODEL with every value's sharding as ONNX multi-device annotations (readable back "
                   "in place of a sharding file)");
  return part;
}

/// The `run` command and its options.
CLI::App* add_run(CLI::App& app, cli::RunOptions& ro) {
  auto* run = app.add_subcommand("run", "run the partitioned model on an emulated pod");
  add_common(run, ro.common);
  run->add_option("--outputs", ro.outputs_dir, "write output_<i>.pb here");
  run->add_flag("--check", ro.check, "compare with the unpartitioned run (exit 1 on mismatch)");
  run->add_option("--expected", ro.expected_dir,
                  "compare the outputs with DIR/output_<i>.pb (ONNX test-data layout; exit 1 on mismatch)");
  // A tolerance is a finite number >= 0 (a negative or NaN one fails every comparison: "check FAILED" between equal
  // values).
  const CLI::Validator tolerance(
      [](std::string& text) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size()) return "'" + text + "' is not a number";
        } catch (const std::exception&) {
          return "'" + text + "' is not a number";
        }
        return std::isfinite(v) && v >= 0 ? "" : "'" + text + "' is not a finite number >= 0";
      },
      "TOL");
  run->add_option("--rtol", ro.rtol, "relative tolerance of --check and --expected (default 1e-4)")->check(tolerance);
  run->add_option("--atol", ro.atol, "absolute tolerance of --check and --expected (default 1e-5)")->check(tolerance);
  run->add_option("--report", ro.report, "write the JSON report here");
  run->add_option("--seed", ro.seed, "seed of the pseudo-random inputs (without --inputs)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })
                       ? ""
                       : "'" + text + "' is not a whole number >= 0";
          },
          "N"));
  run->add_option("--trace", ro.trace, "write the simulated step as Chrome trace JSON (Perfetto) here");
  run->add_option("--backend", ro.backend, "pod (default: the emulator) or mpi (under mpirun -np N: rank = device)")
      ->check(CLI::IsMember({"pod", "mpi"}));
  run->add_option("--warmup", ro.warmup, "with --backend mpi: untimed executions before the measured one (default 1)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--repeat", ro.repeat,
                  "with --backend mpi: measured executions; the report describes the median one (default 1)")
      ->check(CLI::PositiveNumber);
  run->add_option(
      "--program", ro.program_dir,
      "run the device files DIR/device_<k>.onnx of partition -o DIR: one thread per device on the emulator, "
      "one MPI rank per device with --backend mpi");
  return run;
}

/// The `simulate` command and its options.
CLI::App* add_simulate(CLI::App& app, cli::SimulateOptions& so) {
  auto* sim = app.add_subcommand("simulate", "partition and cost on the target pod without weights or running");
  add_common(sim, so.common);
  sim->add_option("--report", so.report, "write the JSON report here");
  sim->add_option("--trace", so.trace, "write the simulated step as Chrome trace JSON (Perfetto) here");
  return sim;
}

/// The `explain` command and its options.
CLI::App* add_explain(CLI::App& app, cli::ExplainOptions& eo) {
  auto* explain = app.add_subcommand("explain", "show every value's sharding, its origin, and every collective");
  add_common(explain, eo.common);
  explain->add_option("--value", eo.value, "only this value");
  explain->add_flag("--constraints", eo.constraints,
                    "list every annotation: open or a constraint, kept as computed or resharded, at what cost");
  explain->add_option("--html", eo.html,
                      "also write the plan as one self-contained web page: the mesh, each value's shards, the "
                      "collectives (sortable, with origins) and the simulated timeline");
  return explain;
}

/// The `inspect` command and its options.
CLI::App* add_inspect(CLI::App& app, cli::InspectOptions& io) {
  auto* inspect = app.add_subcommand(
      "inspect", "list the model's values (names, shapes, weights, torch modules), or print a starter sharding file");
  inspect->add_option("model", io.model, "ONNX model file")->required();
  inspect->add_flag("--weights", io.weights, "only the weights (float initializers)");
  inspect->add_option("--match", io.match, "only values whose name or module path matches this regex (RE2)");
  inspect->add_option("--template", io.template_name,
                      "print a starter sharding file for a classical plan: data, fsdp, megatron or 2d (needs --mesh)");
  inspect->add_option("--mesh", io.mesh, "device mesh shape for --template, e.g. 2x4 (axes named data, model)");
  inspect->add_option("--shardings", io.shardings,
                      "report what each tensor and rule of this sharding file annotates, and where a rule fails");
  inspect->add_option("-o", io.output, "write the --template file here (default: standard output)");
  return inspect;
}

}  // namespace

int main(int argc, char** argv) {
  limit_threads_to_cores();  // before any OpenMP region: a CPU-limited container would otherwise oversubscribe
  Target::register_preset("host", measure_host_target);
  CLI::App app{"gspmd-onnx: GSPMD sharding propagation and SPMD partitioning for ONNX models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "gspmd-onnx 0.1.0");

  cli::PartitionOptions po;
  CLI::App* part = add_partition(app, po);
  cli::RunOptions ro;
  CLI::App* run = add_run(app, ro);
  cli::SimulateOptions so;
  CLI::App* sim = add_simulate(app, so);
  cli::ExplainOptions eo;
  CLI::App* explain = add_explain(app, eo);
  cli::InspectOptions io;
  CLI::App* inspect = add_inspect(app, io);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::string what = e.what();  // holds the user's text, which may hold newlines: one line all the same
    for (size_t k = what.find('\n'); k != std::string::npos; k = what.find('\n', k + 2)) what.replace(k, 1, "\\n");
    fmt::print(stderr, "error: usage: {} (see gspmd-onnx --help)\n", cut_text(what, 300));
    return 2;
  }

  try {
    if (*part) return cli::cmd_partition(po);
    if (*run) return cli::cmd_run(ro);
    if (*sim) return cli::cmd_simulate(so);
    if (*explain) return cli::cmd_explain(eo);
    if (*inspect) return cli::cmd_inspect(io);
  } catch (const std::exception& e) {  // every error is one line (docs/errors.md)
    const auto [code, line] = cli::error_exit(e);
    fmt::print(stderr, "error: {}\n", line);
    return code;
  }
  return 2;
}
