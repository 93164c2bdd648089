// cli: the gspmd-onnx commands (contract: docs/cli.md). main.cc parses flags with CLI11 and calls these.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/pod/pod.h"
#include "core/auto/auto.h"
#include "core/autodiff/autodiff.h"
#include "core/cost/cost.h"
#include "core/ir/ir.h"
#include "core/ir/precision.h"
#include "core/partition/spmd.h"
#include "core/pipeline/schedule.h"
#include "core/propagation/propagation.h"
#include "core/rules/rule.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

/// --training and its flags (docs/training.md).
struct TrainingFlags {
  bool on = false;                // --training: partition / run / cost one training step, not the forward graph
  std::string loss = "output";    // --loss output|mean|sum|cross-entropy:LABELS
  std::string optimizer = "sgd";  // --optimizer sgd|momentum|adam|adafactor
  std::string shard_update;       // --shard-update AXIS: shard each update and its optimizer state over AXIS
  std::string remat;              // --remat none|full|dots; "" = none, or with --auto the search chooses
  std::string trainable;          // --trainable REGEX over initializer names ("" = float initializers of >1 element)
  int64_t accumulate = 1;         // --accumulate K: microbatches per step, gradients summed (docs/training.md)
  double lr = 0.01;               // --lr
  double momentum = 0.9;          // --momentum
  double beta1 = 0.9, beta2 = 0.999;  // --beta1, --beta2 (adam)
  std::optional<double> eps;          // --eps (default: adam 1e-8, adafactor 1e-30)
};

/// --pipeline and its flags (docs/pipeline.md).
struct PipelineFlags {
  std::string axis;          // --pipeline AXIS ("" = no pipeline; "auto" with --auto: the search chooses the stages)
  int64_t microbatches = 0;  // --microbatches M (0: the largest divisor of the batch up to the stages; --auto: fastest)
  std::string schedule = "gpipe";  // --schedule gpipe|circular
  std::string layers;              // --layers REGEX (the layer index is its first capture group)
};

/// What `--pipeline auto` hands each stage count it costs (compile_model): the mesh with the stage axis carved out of
/// the first axis, and the annotations by value name (the S = 1 search's plan). Not a flag.
struct StageCandidate {
  DeviceMesh mesh;
  std::vector<std::pair<std::string, Annotation>> annotations;
  std::string remat, shard_update;  // the S = 1 plan's training step choices ("" = none)
};

/// One stage count that `--pipeline auto` costed.
struct StageSearchEntry {
  int64_t stages = 1;
  int64_t microbatches = 1;
  double step_s = 0;       // seconds
  int64_t peak_bytes = 0;  // bytes per device
  bool fits = true;
  /// The sharding it ran under: "searched" (for this stage count: --auto on one stage's mesh) or "as for 1 stage"
  /// (the plan searched without a pipeline)
  std::string sharding;
  std::string error;  // the pipeline refused this stage count (under both shardings)
};

/// Flags shared by partition, run, simulate and explain.
struct CommonOptions {
  std::string model;                // MODEL path
  std::optional<std::string> mesh;  // --mesh "4x4"; none: the mesh the sharding file names
  std::string shardings;            // --shardings FILE: a sharding file, or an annotated model (*.onnx); "" = MODEL's
                                    // own annotations, or its sibling <stem>.sharding.json if present
  std::vector<std::string> dims;    // --dim NAME=VALUE
  std::vector<std::string> hints;   // partition --hint NAME=VALUE (LoadOptions::hints)
  std::string target = "tpu-v3";    // --target
  std::string device_order;         // --device-order "y,x" ("" = the default mapping; Target::parse_device_order)
  bool overlap = false;             // --overlap: collectives overlap independent compute in the simulated step
  bool auto_search = false;         // --auto: search shardings for what the sharding file leaves open (core/auto)
  std::string memory_limit;         // --memory-limit BYTES for --auto ("" = the target's HBM)
  bool measure_host_ops = true;     // --target host: compile_model measures the program's ops (measure_program_ops)
  std::string inputs_dir;           // run --inputs DIR (input_<i>.pb): their shapes bind symbolic input dims
  /// partition: keep the symbolic dims that neither --dim nor --inputs bind (LoadOptions::keep_symbols), so that
  /// the device files serve every size (docs/shapes.md); not with --training, --pipeline or --auto, which need sizes.
  bool keep_symbols = false;
  std::string precision;         // --precision bf16|mixed|f32 ("" = as the model declares; core/ir/precision.h)
  TrainingFlags training;        // --training ...
  PipelineFlags pipeline;        // --pipeline ...
  std::optional<bool> progress;  // show the --auto search's progress on stderr (nullopt: when it is a terminal;
                                 // run --backend mpi: rank 0 only, cli/progress.h)
  const StageCandidate* stage_candidate = nullptr;  // --pipeline auto's sweep (not a flag)
  bool stage_search_base = false;  // --pipeline auto's 1-stage search: keep its best plan when none fits (not a flag)
  bool search_only = false;        // --pipeline auto's per-count search: stop after --auto's search (not a flag)
};

/// One microbatch count that `--pipeline AXIS --auto` (without --microbatches) tried: the simulated step and peak
/// memory per device of the pipelined forward graph with the annotations as given.
struct MicrobatchCandidate {
  int64_t microbatches = 0;
  double step_s = 0;       // seconds
  int64_t peak_bytes = 0;  // bytes per device
  bool fits = true;        // peak_bytes within the memory limit (--memory-limit, else the target's HBM)
};

/// The loaded model and everything derived from it, in the order the command flow (compile_model, cli/compile.cc)
/// derives them: what every command works from.
struct Compiled {
  Target target;  // --target with --device-order applied (resolved once: "host" is measured)
  Graph graph;
  Precision precision = Precision::kAsLoaded;  // --precision (applied to `graph` right after loading)
  RuleTable rules;  // every node's sharding rule, built once after loading (auto, propagate, partition)
  Annotations annotations;
  std::string sharding_file;            // the file actually read ("" if none)
  bool sharding_file_implicit = false;  // read without --shardings: MODEL's own annotations or its sibling file
  ShardingPlan plan;
  SpmdProgram program;
  /// Wall time of each stage (s), reported as "compile_time_s": loading (with the sharding file), propagation
  /// (with building the rule table, sub-axis refinement, and the --auto search), partitioning, measuring the
  /// program's ops on this machine (--target host only), and costing (set by cost()).
  struct StageTimes {
    double load = 0, propagate = 0, partition = 0, measure_ops = 0, cost = 0;
  } times;
  std::optional<TrainingStep> training;     // --training: what the step graph computes (its graph is `graph`)
  std::string shard_update;                 // --training: the axis weight updates are sharded over (--shard-update, or
                                            // --auto's choice), or ""
  std::optional<MemoryRoles> memory_roles;  // --training: the step's memory roles; the program's donated params
                                            // (the weights and optimizer state) follow them
  std::optional<AutoResult> auto_result;    // --auto: the search's choices, cost and baselines
  std::optional<PipelineLayout> pipeline;   // --pipeline: what the pipeline transformation built (`graph` is its
                                            // pipelined graph)
  std::string pipeline_axis;                // --pipeline AXIS
  std::optional<Graph> reference;           // --pipeline: the model as loaded, which run --check compares with
  std::optional<TrainingOptions> reference_training;  // --pipeline --training: the step options for `reference`
  /// --pipeline: the model's forward FLOPs over the pipelined forward graph's; cost() scales the model FLOPs by it
  /// (with --training, the step's backward scales as its forward).
  double pipeline_flops_scale = 1;
  /// --pipeline on layer weights that are graph inputs: the program takes them stacked (PipelineLayout::weights), in
  /// place of the model's per-layer inputs; run feeds them from the per-layer tensors (stacked_from_layers).
  bool stacked_inputs = false;
  std::vector<MicrobatchCandidate> microbatch_search;  // --pipeline --auto without --microbatches: what was tried
  std::vector<StageSearchEntry> stage_search;          // --pipeline auto: each stage count costed (1 = no pipeline)
  LoadReport load_report;                              // what loading folded and rewrote (explain)

  /// simulate_cost of the program on `target` (with the memory roles), timed into times.cost.
  CostReport cost(bool overlap);
};

/// The choice named `text` among `choices` (in order), or InputError("FLAG: 'text' is not a, b or c").
template <class T>
T pick(const std::string& text, const char* flag, std::initializer_list<std::pair<const char*, T>> choices) {
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) {
    if (text == name) return value;
    names.push_back(name);
  }
  const std::string last = names.back();
  names.pop_back();
  throw InputError(fmt::format("{}: '{}' is not {} or {}", flag, text, fmt::join(names, ", "), last));
}

/// Resolves the target, loads MODEL, reads the sharding file, (with --auto) searches the open shardings, propagates
/// and partitions; with --target host (and measure_host_ops) then measures the program's ops into
/// target.measured_ops (measure_program_ops); with CommonOptions::search_only, returns right after --auto's search
/// (graph, training step, auto_result and shard_update set; no plan or program). Throws InputError for bad input (the
/// target and --device-order are checked first, the device order again once the mesh is known; --memory-limit that is
/// not a positive number of bytes; --auto when no plan fits in memory).
Compiled compile_model(const CommonOptions& o, bool load_data = true);
/// Whether an initializer is a trainable weight under --trainable REGEX (default: floating point with more than one
/// element). The loader keeps these unfolded. Throws InputError for a REGEX that is not a regular expression.
std::function<bool(const Value&)> trainable_weights(const TrainingFlags& f);
/// The training-step options from the flags and the loaded forward graph: the trainable weights (--trainable REGEX
/// over float initializers, default those of more than one element), the loss, the optimizer. Throws InputError for
/// a bad --loss / --optimizer, a REGEX that is not a regular expression or matches no float initializer.
TrainingOptions training_options(const TrainingFlags& f, const Graph& forward);
/// --memory-limit text -> bytes: a positive number ("8589934592", "8.5e9") with optionally a unit right after it: B,
/// kB/KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), as "16GiB"; "" -> 0 (the target's
/// HBM). Throws InputError("--memory-limit: 'x' is not a positive number of bytes (like ...)").
int64_t parse_memory_limit(const std::string& text);

/// The most microbatches `--accumulate` takes: the step is unrolled over them (docs/cli.md#limits).
inline constexpr int64_t kMaxAccumulate = 256;
/// The largest value `--dim NAME=V` may give (docs/cli.md#limits): 2^31 - 1, far above any real dim.
inline constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
/// The most devices `partition` writes files for and `run` emulates in one process (docs/cli.md#limits); `simulate`
/// and `explain` take meshes up to kMaxDevices (2^20).
inline constexpr int64_t kMaxMaterializedDevices = 16384;
/// Throws InputError("<cmd>: the mesh 256x256 has 65536 devices; <cmd> <what> for at most 16384 (simulate costs
/// meshes of up to 1048576 devices)") when the user's mesh `mesh` has more than kMaxMaterializedDevices devices.
void check_materialized_devices(const DeviceMesh& mesh, const char* cmd, const char* what);

struct PartitionOptions {
  CommonOptions common;
  std::string out_dir;                // -o DIR
  std::string notation = "spec";      // --notation spec|hlo|sbp: how shardings.json writes each sharding
  std::string collectives = "gspmd";  // --collectives: "gspmd" (domain gspmd) or "ort" (com.microsoft)
  std::string annotated_model;        // --annotated-model FILE: MODEL with every value's sharding ("" = none)
};
int cmd_partition(const PartitionOptions& o);

struct RunOptions {
  CommonOptions common;
  std::string outputs_dir;          // --outputs DIR
  bool check = false;               // --check
  std::string expected_dir;         // --expected DIR: compare the outputs with DIR/output_<i>.pb
  double rtol = 1e-4, atol = 1e-5;  // tolerance of --check and --expected
  std::string report;               // --report FILE
  std::string trace;                // --trace FILE
  uint64_t seed = 0;                // --seed
  std::string backend = "pod";      // --backend: "pod" (the emulator) or "mpi" (one MPI rank per device, docs/mpi.md)
  std::string program_dir;          // --program DIR: device k runs DIR/device_<k>.onnx (DeviceFiles)
  int warmup = 1;                   // --warmup N (mpi only): untimed executions before the measured one
  int repeat = 1;                   // --repeat N (mpi only): measured executions; the report describes the median one
};
int cmd_run(const RunOptions& o);

/// `run --backend mpi`, on every rank of an mpirun job (docs/mpi.md): rank r executes partition id r; rank 0 reads
/// and scatters the inputs, gathers and writes the outputs, the report (with `measured` per-rank times) and the
/// summary. Returns the exit code. Setup errors are printed by every rank ("error: rank K: ..."); errors after the
/// ranks started to communicate abort the job. Without MPI support in the build it throws InputError
/// ("--backend mpi: this gspmd-onnx was built without MPI ...").
int cmd_run_mpi(const RunOptions& o);

/// The device files of `partition -o DIR` for the program `p` (built from MODEL with `common`'s flags), run again:
/// `run --program DIR` on the emulator (run(), one thread per device) and under MPI (load(), one rank per device).
/// Each file is checked before it runs (docs/mpi.md): its device id, and its program fingerprint against p's; a file
/// partitioned over dim symbols (metadata gspmd.dim_hints, docs/shapes.md) against the program partitioned over the
/// symbols (built once), its dims bound from this run's local input shapes and its gspmd_dims input given this run's
/// sizes. Throws InputError naming the file for a missing, foreign or stale file.
class DeviceFiles {
 public:
  DeviceFiles(const Compiled& p, const CommonOptions& common, std::string dir);
  /// DIR/device_<device>.onnx, loaded and checked.
  Graph load(int64_t device);
  /// Every device's file, one thread each with ThreadCollectives (backend/pod), on `inputs` (one per global graph
  /// input, full values, sharded per p.program.inputs); the outputs assembled per p.program.outputs. Throws what
  /// load() and run_device_graph throw.
  PodRun run(const std::vector<Tensor>& inputs, const ExecutorOptions& options);

 private:
  void symbolic(const std::string& path, const ModelInfo& info);  // the symbolic program's fingerprint and dims
  const Compiled& p_;
  const CommonOptions& common_;
  std::string dir_;
  std::optional<std::string> symbolic_fingerprint_;
  std::optional<Tensor> dims_;  // the gspmd_dims input's value
};

/// The run inputs, one per g.inputs: with --inputs, DIR/input_<i>.pb per ONNX input of `signature` (a tensor,
/// sequence or optional; docs/sequences.md), flattened and checked against the graph inputs' dtype and shape
/// (InputError naming the file otherwise); else pseudo-random from --seed (docs/cli.md), except the optimizer state
/// of `step`'s variables (trained graph inputs), which starts at zero like an initializer's (a fresh optimizer).
std::vector<Tensor> make_inputs(const Graph& g, const LoadReport& signature, const RunOptions& o,
                                const TrainingStep* step);

/// Before a run allocates anything: every value of `g` (its sizes bound for this run) fits this machine's physical
/// memory, else InputError("value 'x' has the shape [..]: N bytes, more than this machine's memory (M bytes)"). A
/// failed allocation is an error too (main: exit 2), but under AddressSanitizer one past its limit aborts instead.
void check_fits_memory(const Graph& g);

struct SimulateOptions {
  CommonOptions common;
  std::string report;  // --report FILE
  std::string trace;   // --trace FILE
};
/// Propagates, partitions and costs without reading initializer data or running (weights' external data files may
/// be absent); prints and writes the run report without host and check, with the static peak memory per device.
int cmd_simulate(const SimulateOptions& o);

/// gspmd-onnx inspect (docs/cli.md, "inspect"): the model's values, a starter sharding file, or a file's rules.
struct InspectOptions {
  std::string model;                // MODEL path
  bool weights = false;             // --weights: only the weights
  std::string match;                // --match REGEX (RE2, over names and module paths)
  std::string template_name;        // --template data|fsdp|megatron|2d: print a starter sharding file
  std::optional<std::string> mesh;  // --mesh (with --template; with --shardings, as the other commands take it)
  std::string shardings;            // --shardings FILE: what each of its rules matches, and where one fails
  std::string output;               // -o FILE: write the template here instead of stdout
};
/// Returns the exit code: 0, or 2 when a rule of --shardings fails on a tensor it matches (after the report).
/// Throws InputError for a bad model, a bad flag or an unusable template.
int cmd_inspect(const InspectOptions& o);

/// Where each unreduced axis of value v (as the program holds it) comes from: walking back through the producers that
/// carry a partial operand over the axis (linear ops keep it partial), to the node that contracts over a dim split over
/// it (a reduction factor of its rule: MatMul's K, ReduceSum's axis), with the annotation that gave that operand the
/// axis, as axis_origins_str does for tiled axes. One line per unreduced axis ("model from /h.0/attn/proj/MatMul
/// (MatMul), which reduces over dim 0 of ..."); none when v is not unreduced.
std::vector<std::string> unreduced_origins(const Compiled& p, int v);

struct ExplainOptions {
  CommonOptions common;
  std::string value;         // --value NAME ("" = all)
  bool constraints = false;  // --constraints: list every annotation, kept or resharded, and at what cost
  std::string html;          // --html FILE: the plan as one self-contained page (cli/html.h)
};
int cmd_explain(const ExplainOptions& o);

/// Box picture of a 1-D or 2-D value's shards on the mesh (device ids per shard; uneven shards drawn in proportion
/// to their real extent), "" for other ranks or more than 16 shards per dim. Like jax.debug.visualize_array_sharding.
std::string sharding_picture(const Shape& shape, const TensorSharding& s, const DeviceMesh& mesh);
/// Each shard's index ranges of a tiled value, one line per distinct range with the devices that hold it ("[0:3, :]
/// device 0", "(padding only)" for a shard of padding), at most 32 lines; "" for an untiled value. As PyTorch
/// DTensor's visualize_sharding lists offsets.
std::string shard_ranges(const Shape& shape, const TensorSharding& s, const DeviceMesh& mesh);

}  // namespace gspmd::cli
