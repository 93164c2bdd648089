// The JSON report of partition / run (schema: docs/cli.md) and the terminal summary.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "backend/pod/pod.h"
#include "cli/commands.h"
#include "core/cost/cost.h"

namespace gspmd::cli {

/// Result of --check: outputs of the partitioned run against the unpartitioned one.
struct CheckResult {
  bool passed = true;
  double max_abs_error = 0;  // max |partitioned - reference| over all outputs
  double max_rel_error = 0;  // per output: max |partitioned - reference| / max |reference| (normwise)
  std::string worst;         // "output 'logits' element 123: 1.5 vs 1.49"
  std::string tolerance;     // what compare_outputs allowed: "rtol 0.0001, atol 1e-05" (and the 16-bit rule)
  /// A trained weight whose Adam or Adafactor update differs beyond the tolerance only where its gradient is
  /// within the check's tolerance of 0 (compare_outputs): those elements are reported here, not failed.
  struct Amplified {
    std::string weight;
    int64_t elements = 0, total = 0;  // elements amplified, of the weight's
    double max_abs_error = 0;         // the largest |partitioned - reference| among them
  };
  std::vector<Amplified> amplified;
};

/// Compares `got` with `want` (output `name`) into `r`: passes when |a-b| <= atol + rtol*|b| everywhere (integers and
/// bools: exactly; float16 / bfloat16 in float32 with rtol and atol raised to 4 units of the type's rounding,
/// docs/cli.md). A dtype or shape difference fails with infinite errors. The first failure sets r.worst ("output
/// 'logits' element 123: 1.5 vs <against> 1.49", `against` naming what `want` is: "reference", "expected");
/// r.max_abs_error and r.max_rel_error (normwise: max |a-b| / max |b|) grow to cover this output.
void compare_tensor(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& name,
                    std::string_view against, CheckResult& r);

/// One warning per floating-point graph output of `g` that holds NaN or infinite values in `outputs` (the run's full
/// values), with the counts: a check compares such values equal in both runs, so the summary says so.
std::vector<std::string> nonfinite_warnings(const Graph& g, const std::vector<Tensor>& outputs);

/// --check: compare_tensor for every graph output of `g` against the unpartitioned run's `want`; sets
/// CheckResult::tolerance. With `step` (a training step), an adaptive optimizer's updated weight is judged with its
/// state: Adam's first step is g / (|g| + eps) and Adafactor's divides g by its RMS, so a gradient element that is 0
/// in exact arithmetic (attention's key bias) or too small to have a sign at the check's precision becomes a step
/// of about lr whose sign is rounding noise, different in the two runs. An element of `<w>.updated` that fails is
/// *amplified*, not failed, when the reference run's state says its gradient is within the tolerance of 0: Adam's
/// m (`<w>.adam_m.updated`) differs in sign between the runs or is below rtol times the largest m of the step;
/// Adafactor's accumulator of its row or column (or its own, for a weight of fewer than 2 dims) has a square root
/// below rtol times the largest of the step (rtol: the check's, raised for 16-bit outputs). Such elements count in
/// CheckResult::amplified and not in the errors; every other element, and every other output, is compared as usual.
/// With `inputs` (the run's, one per g.inputs) a trained weight's `<w>.updated` is compared by its step,
/// w - <w>.updated (w: its initializer's data or its input), within the tolerance relative to the step's size plus
/// one unit of the weight's type per element (the rounding of w - step): the weight's own size would hide the step.
/// In a graph that computes in 16 bits a trained weight's step and its optimizer's updated state are compared as a
/// whole, by their normwise relative error (a gradient element that is a small sum of large terms carries their
/// rounding). With `float32_run` (the
/// reference graph retyped to float32 and run on the same inputs, widened; one output per graph output) the step may
/// also differ from the reference step by twice the reference step's own normwise distance from the float32 run's: a
/// run as accurate as the reference is that close to it (triangle inequality), so the check does not fail a
/// partitioned run for rounding that the unpartitioned run has as much of (Adafactor's bfloat16 step of a
/// Megatron-split weight was 1.06x the fixed 4 units). The tolerance says so.
CheckResult compare_outputs(const Graph& g, const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                            double rtol, double atol, const TrainingStep* step = nullptr,
                            const std::vector<Tensor>* inputs = nullptr,
                            const std::vector<Tensor>* float32_run = nullptr);

/// The narrowest floating-point type among `g`'s values: kBFloat16 or kFloat16 when the graph computes in 16 bits
/// (bfloat16 when it has both), kUndefined when nothing is narrower than float32. The precision its outputs carry.
DType compute_precision(const Graph& g);

/// A float16 or bfloat16 tensor as float32 (exact).
Tensor widen_half(const Tensor& t);

/// Result of `run --expected DIR`: the run's outputs against DIR/output_<i>.pb.
struct ExpectedResult {
  struct Output {
    std::string name;   // the ONNX graph output
    std::string file;   // DIR/output_<i>.pb
    CheckResult check;  // this output alone (a sequence: all its elements)
  };
  std::string dir;
  std::vector<Output> outputs;  // one per ONNX graph output, in order
  bool passed = true;
  std::string worst;  // the first failure, as CheckResult::worst ("... vs expected ...")
};

/// Throws InputError("DIR/input_2.pb: the model has 2 inputs, so --inputs DIR holds input_0.pb .. input_1.pb only")
/// when DIR holds a file <kind>_<i>.pb with i >= n (kind "input" or "output", flag "--inputs" or "--expected"): a file
/// the run would ignore is a mistake.
void check_no_extra_files(const std::string& dir, std::string_view kind, size_t n, std::string_view flag);

/// Reads the reference outputs of `run --expected DIR`: DIR/output_<i>.pb for every ONNX output of `signature`, each
/// as the model declares it (a TensorProto, SequenceProto or OptionalProto; read_value_pb). Throws InputError naming
/// the directory or file: "DIR: no such directory (--expected)", "DIR/output_1.pb: no such file (--expected: the
/// model has 2 outputs)", "DIR/output_2.pb: the model has 2 outputs, so --expected DIR holds output_0.pb ..
/// output_1.pb only" (a count mismatch), or read_value_pb's error for an unreadable file.
std::vector<OnnxValue> read_expected_outputs(const std::string& dir, const LoadReport& signature);

/// Compares the run's `outputs` (one per g.outputs) with `expected` (read_expected_outputs) per ONNX output, with
/// compare_tensor's tolerance (the --check rule and --rtol / --atol). A sequence or optional whose element count
/// differs fails with infinite errors ("output 'x': 3 tensors vs expected 4").
ExpectedResult compare_expected(const Graph& g, const LoadReport& signature, const std::vector<Tensor>& outputs,
                                const std::vector<OnnxValue>& expected, const std::string& dir, double rtol,
                                double atol);

/// Builds the report (docs/cli.md fields, plus "target_spec" and "device_order" from p.target). `run`, `check` and
/// `expected` may be null (partition, simulate: no measured fields). With --auto, "auto" holds the search: time,
/// evaluations, the chosen plan's cost, the baselines' and every group's choice.
nlohmann::json make_report(const Compiled& p, const CostReport& cost, const PodRun* run, const CheckResult* check,
                           const ExpectedResult* expected = nullptr);

/// run --check: runs the unpartitioned model on one device and compares the program's `outputs` (one per p.graph
/// output) with its outputs. The unpartitioned model is p.graph, or with --pipeline the model as loaded
/// (p.reference), and with --pipeline --training that model's own training step; a stacked weight's outputs (its
/// updated value, its optimizer state) are compared row by row with each layer's.
CheckResult check_against_reference(const Compiled& p, const std::vector<Tensor>& inputs,
                                    const std::vector<Tensor>& outputs, double rtol, double atol,
                                    const RunProgress& progress, const ExecutorOptions& exec);

/// The report's "pipeline" section (docs/pipeline.md): the schedule, stages, microbatches, iterations, padding slots,
/// the bubble fraction and the layers each stage runs, for a pipeline over mesh axis `axis`.
/// `search`: the microbatch counts --auto tried ("auto_microbatches": microbatches, step_s, peak_bytes, fits), if any;
/// `prefix_and_suffix`: that field's text (the function below).
nlohmann::json pipeline_json(const PipelineLayout& l, const std::string& axis,
                             const std::vector<MicrobatchCandidate>& search, const std::string& prefix_and_suffix);

/// --pipeline: how the prefix and the suffix run over the pipeline axis in p's plan, "prefix replicated over stage,
/// suffix with its batch split over stage": the prefix is split when the stream entering the first layer uses the axis,
/// the suffix when the gathered results' batch dim does (pipeline_annotations' default, unless annotated otherwise).
std::string prefix_and_suffix(const Compiled& p);

/// Writes each ONNX output of `signature` as DIR/output_<i>.pb (ONNX test-data layout, named as the output; a
/// sequence or optional as its proto, from the graph's flattened `outputs`), creating DIR. Throws InputError naming
/// the file when it cannot be written.
void write_outputs(const std::string& dir, const Graph& g, const LoadReport& signature,
                   const std::vector<Tensor>& outputs);

/// Writes `j` to `path` (pretty-printed); throws InputError("PATH: cannot write") on failure.
void write_json(const std::string& path, const nlohmann::json& j);

/// Writes `path` whole or not at all: `write` fills PATH.tmp, which is then renamed into place (never a half-written
/// file). Throws InputError("PATH: cannot write").
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

/// A sharding as a sharding file's partition spec: per dim null, an axis name, or a list of axis names (of `mesh`).
nlohmann::json spec_json(const TensorSharding& s, const DeviceMesh& mesh);
/// Checks, before anything is computed or written, that output `path` (given with `flag`; a directory when `folder`)
/// can be written: an existing path is a directory or a regular file as asked (never a FIFO, which would block the
/// write), and a file's directory exists and is writable. Nothing for an empty path. Throws InputError("FLAG: PATH:
/// <problem>"), so that a run never leaves one output written and fails on the next (docs/errors.md).
void check_output_path(const std::string& path, const char* flag, bool folder = false);

/// How a command that threw `e` ends (docs/errors.md): the exit code and the one line `main` prints after "error: ".
/// 2 for an InputError and for what the input asks past this machine (std::bad_alloc, std::length_error, a
/// std::filesystem error on a path the user gave: too long, a symlink loop), 3 for an UnsupportedError
/// ("unsupported: ..."), 4 for anything else, a bug ("internal error: ..."). Each line is first_line() of the text.
std::pair<int, std::string> error_exit(const std::exception& e);

/// Prints the human summary of a report (make_report) to stdout, a line per topic ("model", "mesh", "dims",
/// "training", "pipeline", "collectives", "simulated step", "memory", "auto", "check"...). summary.cc.
void print_summary(const nlohmann::json& report, const std::string& model);

/// `b` bytes as "1.50 GiB", "3.00 MiB", "1.5 KiB" or "12 B" (1024-based).
std::string human_bytes(double b);
/// `s` seconds as "1.234 s", "5.000 ms" or "7.000 us".
std::string human_time(double s);

}  // namespace gspmd::cli
