// The command flow shared by every command: load -> read sharding file -> (--auto) search -> propagate -> partition
// (compile_model). Pipeline parallelism's part of it (--pipeline) is in cli/pipeline_parallel.cc.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/kernels/kernels.h"
#include "backend/profile/host_target.h"
#include "cli/commands.h"
#include "cli/pipeline_parallel.h"
#include "cli/progress.h"
#include "cli/wiring.h"
#include "core/autodiff/step_shardings.h"
#include "core/ir/name_pattern.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

CostReport Compiled::cost(bool overlap) {
  auto t0 = std::chrono::steady_clock::now();
  CostReport r = simulate_cost(graph, program, target, overlap, memory_roles ? &*memory_roles : nullptr);
  // Model FLOPs as MFU counts them: without rematerialization (the recomputed nodes are work the model does not
  // need) and, with --pipeline, the model's own (the pipelined graph also computes the bubble's and the padding
  // slots' idle work and selects the circular rounds' weights). Their time stays in the step.
  double model = r.model_flops;
  if (training) model -= training->recomputed_flops;
  if (pipeline) model *= pipeline_flops_scale;
  if (r.model_flops > 0 && model != r.model_flops) {
    r.flops_utilization *= model / r.model_flops;
    r.model_flops = model;
  }
  times.cost = seconds_since(t0);
  return r;
}

int64_t parse_memory_limit(const std::string& text) {
  if (text.empty()) return 0;
  // A number, then optionally a unit: B, kB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024).
  static const std::pair<std::string_view, double> kUnits[] = {
      {"", 1},      {"B", 1},        {"kB", 1e3},     {"KB", 1e3},     {"MB", 1e6},    {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40}};
  double v = -1;
  size_t used = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    v = -1;
  }
  const std::string_view unit = std::string_view(text).substr(std::min(used, text.size()));
  auto u = std::find_if(std::begin(kUnits), std::end(kUnits), [&](const auto& x) { return x.first == unit; });
  if (u == std::end(kUnits))
    v = -1;
  else
    v *= u->second;
  if (!(v >= 1) || !std::isfinite(v) || v > 9.0e18)
    throw InputError(fmt::format(
        "--memory-limit: '{}' is not a positive number of bytes (like 17179869184, 8.5e9, 512MiB or 16GiB)", text));
  return static_cast<int64_t>(v);
}

void check_materialized_devices(const DeviceMesh& mesh, const char* cmd, const char* what) {
  const int64_t n = mesh.num_devices();
  if (n > kMaxMaterializedDevices)
    throw InputError(
        fmt::format("{}: the mesh {} has {} devices; {} {} for at most {} (simulate costs meshes of up "
                    "to {} devices)",
                    cmd, fmt::join(mesh.shape, "x"), n, cmd, what, kMaxMaterializedDevices, kMaxDevices));
}

namespace {
/// --trainable's compiled pattern (nullopt when not given).
std::optional<NamePattern> trainable_pattern(const TrainingFlags& f) {
  std::optional<NamePattern> re;
  if (!f.trainable.empty()) re.emplace(f.trainable, "--trainable");
  return re;
}

/// trainable_weights over a compiled pattern. With a pattern, graph inputs (neither initializers nor computed) are
/// variables too.
std::function<bool(const Value&)> trainable_predicate(std::optional<NamePattern> re) {
  return [re = std::move(re)](const Value& v) {
    if (!is_floating(v.dtype)) return false;
    if (v.is_initializer) return re ? re->search(v.name) : num_elements(v.shape) > 1;
    return re && v.producer < 0 && re->search(v.name);
  };
}
}  // namespace

std::function<bool(const Value&)> trainable_weights(const TrainingFlags& f) {
  return trainable_predicate(trainable_pattern(f));
}

TrainingOptions training_options(const TrainingFlags& f, const Graph& forward) {
  TrainingOptions t;
  if (f.loss == "output") {
    t.loss = LossKind::kOutput;
  } else if (f.loss == "mean") {
    t.loss = LossKind::kMean;
  } else if (f.loss == "sum") {
    t.loss = LossKind::kSum;
  } else if (f.loss.rfind("cross-entropy:", 0) == 0 && f.loss.size() > 14) {
    t.loss = LossKind::kCrossEntropy;
    t.labels = f.loss.substr(14);
  } else {
    throw InputError(fmt::format("--loss: '{}' is not output, mean, sum or cross-entropy:LABELS", f.loss));
  }
  t.optimizer = pick<OptimizerKind>(f.optimizer, "--optimizer",
                                    {{"sgd", OptimizerKind::kSgd},
                                     {"momentum", OptimizerKind::kMomentum},
                                     {"adam", OptimizerKind::kAdam},
                                     {"adafactor", OptimizerKind::kAdafactor}});
  t.remat =
      pick<RematPolicy>(f.remat.empty() ? "none" : f.remat, "--remat",
                        {{"none", RematPolicy::kNone}, {"full", RematPolicy::kFull}, {"dots", RematPolicy::kDots}});
  t.lr = f.lr;
  t.momentum = f.momentum;
  t.beta1 = f.beta1;
  t.beta2 = f.beta2;
  t.eps = f.eps ? *f.eps : t.optimizer == OptimizerKind::kAdafactor ? 1e-30 : 1e-8;
  t.shard_update = !f.shard_update.empty();
  if (f.accumulate < 1 || f.accumulate > kMaxAccumulate)
    throw InputError(
        fmt::format("--accumulate: {} is not a microbatch count from 1 to {}", f.accumulate, kMaxAccumulate));
  t.accumulate = f.accumulate;
  const std::optional<NamePattern> re = trainable_pattern(f);
  const auto trainable = trainable_predicate(re);
  for (const Value& v : forward.values)
    if (trainable(v)) t.trainable.push_back(v.name);
  if (re)  // integer inputs that match are not trained, and the summary says so
    for (int i : forward.inputs) {
      const Value& v = forward.values[static_cast<size_t>(i)];
      if (!is_floating(v.dtype) && re->search(v.name)) t.ignored.push_back(v.name);
    }
  if (t.trainable.empty())
    throw InputError(f.trainable.empty()
                         ? std::string("--training: the model has no float initializer to train")
                         : fmt::format("--trainable: '{}' matches no float initializer or graph input", f.trainable));
  return t;
}

namespace {
/// The load report's signature over the training step `g`: the forward's inputs found again by name (`names`, in
/// the order of the report's inputs' flat values: the step renumbers values), plus an added labels input; the
/// outputs the step's (the loss, the updated weights and optimizer state: tensors).
void training_signature(LoadReport& r, const std::vector<std::string>& names, const Graph& g) {
  std::set<int> seen;
  size_t k = 0;
  for (FlatValue& fv : r.inputs)
    for (int& v : fv.values) seen.insert(v = g.at(names.at(k++)));
  auto tensor = [&](int v) {
    FlatValue fv;
    fv.name = g.values[static_cast<size_t>(v)].name;
    fv.structure.elem_dtype = g.values[static_cast<size_t>(v)].dtype;
    fv.values = {v};
    return fv;
  };
  for (int v : g.inputs)
    if (!seen.count(v)) r.inputs.push_back(tensor(v));
  r.outputs.clear();
  for (int v : g.outputs) r.outputs.push_back(tensor(v));
}
/// --shard-update AXIS's mesh axis in p's mesh, or -1 without it; sets p.shard_update.
int shard_update_axis(Compiled& p, const std::string& shard_update) {
  if (shard_update.empty()) return -1;
  const int axis = p.annotations.mesh.axis_index(shard_update);
  if (axis < 0)
    throw InputError(
        fmt::format("--shard-update: '{}' is not an axis of the mesh {}", shard_update, p.annotations.mesh.str()));
  p.shard_update = shard_update;
  return axis;
}

/// MODEL's sibling sharding file, <stem>.sharding.json (it may not exist).
fs::path sibling_sharding_file(const CommonOptions& o) { return fs::path(o.model).replace_extension(".sharding.json"); }

/// The annotations: --shardings FILE (a sharding file, or an annotated model *.onnx), else MODEL's own annotations
/// or its sibling <stem>.sharding.json, not both (docs/cli.md); "" for none.
std::string sharding_file_of(const CommonOptions& o, const LoadReport& r) {
  if (!o.shardings.empty()) return o.shardings;
  const fs::path sibling = sibling_sharding_file(o);
  if (r.sharding_annotations && fs::exists(sibling))
    throw InputError(fmt::format("{}: carries sharding annotations and has a sibling {}: choose one with --shardings",
                                 o.model, sibling.string()));
  if (r.sharding_annotations) return o.model;
  return fs::exists(sibling) ? sibling.string() : std::string();
}

/// --dim and --hint (`flag`): NAME=VALUE, VALUE in 1 .. kMaxDim, each NAME once, into `out`.
void parse_sizes(const std::vector<std::string>& flags, const char* flag, std::map<std::string, int64_t>& out) {
  for (const std::string& d : flags) {
    auto eq = d.find('=');
    int64_t v = 0;
    try {
      if (eq == std::string::npos || eq == 0) throw std::invalid_argument(d);
      size_t used = 0;
      v = std::stoll(d.substr(eq + 1), &used);
      if (used != d.size() - eq - 1 || v <= 0) throw std::invalid_argument(d);
    } catch (const std::exception&) {
      throw InputError(fmt::format("{}: '{}' is not NAME=VALUE with a positive VALUE", flag, cut_text(d)));
    }
    if (v > kMaxDim)
      throw InputError(
          fmt::format("{}: '{}' is more than the {} a dim may be (docs/cli.md#limits)", flag, cut_text(d), kMaxDim));
    if (auto [it, fresh] = out.emplace(d.substr(0, eq), v); !fresh)
      throw InputError(fmt::format("{}: '{}' is given twice ({} and {})", flag, cut_text(it->first), it->second, v));
  }
}

/// compile_model in its phases: the options checked, the model loaded (and retyped), the pipeline and the training
/// step built, the annotations read, --auto's search, then propagation and partitioning.
class CompileFlow {
 public:
  CompileFlow(const CommonOptions& o, bool load_data) : o_(o) {
    if (o.mesh) cli_mesh_ = DeviceMesh::parse(*o.mesh);
    memory_limit_ = parse_memory_limit(o.memory_limit);
    if (memory_limit_ > 0 && !o.auto_search && !o.stage_candidate)
      throw InputError("--memory-limit: only used with --auto");
    lo_ = kernel_load_options();
    lo_.load_data = load_data;
    trained_ = trainable_weights(o.training);
    if (o.training.on) lo_.variable = trained_;
    // An annotated weight (a float initializer of more than one element, as --training's trainable set) is a
    // constraint: it stays in the graph, not folded into a transposed copy of another name.
    const fs::path sibling = sibling_sharding_file(o);
    const std::string sidecar = !o.shardings.empty() ? o.shardings : fs::exists(sibling) ? sibling.string() : "";
    if (fs::path(sidecar).extension() == ".json")
      if (auto annotated = sharding_file_names(sidecar))
        lo_.variable = [annotated, trained = lo_.variable](const Value& v) {
          return (is_floating(v.dtype) && num_elements(v.shape) > 1 && annotated(v)) || (trained && trained(v));
        };
    if (!o.training.on && !o.training.shard_update.empty())
      throw InputError("--shard-update: only used with --training");
    if (!o.training.on && !o.training.remat.empty() && o.training.remat != "none")
      throw InputError("--remat: only used with --training");
    if (!o.training.on && o.training.accumulate != 1) throw InputError("--accumulate: only used with --training");
    parse_sizes(o.dims, "--dim", lo_.dims);
    parse_sizes(o.hints, "--hint", lo_.hints);
  }

  Compiled run() {
    load();
    build_step();
    annotate();
    p_.times.load = seconds_since(t0_);
    t0_ = std::chrono::steady_clock::now();
    p_.rules = RuleTable(p_.graph);  // once, for the search, the reshape cuts, propagation and partitioning
    rules_s_ = seconds_since(t0_);
    if (o_.auto_search) {  // timed by the search itself (the report's "auto")
      search();
      if (o_.search_only) return std::move(p_);
    }
    partition_step();
    return std::move(p_);
  }

 private:
  /// The target, the model (typed, its symbolic dims bound by --dim and --inputs), --precision.
  void load() {
    p_.target = Target::load(o_.target);
    if (!o_.device_order.empty()) p_.target.device_order = Target::parse_device_order(o_.device_order);
    t0_ = std::chrono::steady_clock::now();
    lo_.inputs_dir = o_.inputs_dir;  // the given inputs' shapes bind symbolic dims (--dim must agree)
    lo_.keep_symbols = o_.keep_symbols && !o_.training.on && o_.pipeline.axis.empty() && !o_.auto_search;
    lo_.data_dependent_dims = !o_.training.on && o_.pipeline.axis.empty();  // the step builder and stages are static
    p_.graph = load_model(o_.model, lo_, &p_.load_report);
    if (!o_.precision.empty()) {
      const Precision precision = pick<Precision>(o_.precision, "--precision",
                                                  {{"bf16", Precision::kBF16},
                                                   {"mixed", Precision::kMixed},
                                                   {"autocast", Precision::kAutocast},
                                                   {"f32", Precision::kF32}});
      set_precision(p_.graph, precision, trained_, lo_.shape_function);
      p_.precision = precision;
    }
    file_ = sharding_file_of(o_, p_.load_report);
  }

  /// The annotations of `g`: --pipeline auto's candidate's, the sharding file's or annotated model's, or none on
  /// --mesh.
  Annotations read_annotations(const Graph& g) const {
    if (o_.stage_candidate) {  // --pipeline auto's sweep: the S = 1 plan on the mesh with a stage axis
      Annotations a;
      a.mesh = o_.stage_candidate->mesh;
      for (const auto& [name, ann] : o_.stage_candidate->annotations)
        if (const int v = g.find(name); v >= 0) a.by_value[v] = ann;
      return a;
    }
    if (file_.empty()) {
      if (!cli_mesh_)
        throw InputError(fmt::format(
            "{}: no mesh: give --mesh, or a sharding file that names one (--shardings FILE, or {} beside the model)",
            o_.model, sibling_sharding_file(o_).filename().string()));
      Annotations a;
      a.mesh = *cli_mesh_;
      return a;
    }
    const DeviceMesh* m = cli_mesh_ ? &*cli_mesh_ : nullptr;
    return fs::path(file_).extension() == ".onnx" ? read_annotated_model(file_, g, m) : read_sharding_file(file_, g, m);
  }

  /// --pipeline's stages (their annotations kept for annotate()), then --training's step over the loaded graph.
  void build_step() {
    if (o_.training.on) to_ = training_options(o_.training, p_.graph);  // against the model as loaded
    if (!o_.pipeline.axis.empty()) {
      pipelined_ = apply_pipeline(p_, o_, read_annotations(p_.graph), lo_.shape_function);
      if (to_) {  // re-keyed by name onto the step below
        p_.reference_training = *to_;
        to_->trainable = pipelined_trainable(to_->trainable, *p_.pipeline, p_.graph);
        to_->remat_keep = p_.pipeline->carried_values;
        for (auto& [v, ann] : pipelined_->by_value)
          pipelined_by_name_.emplace_back(p_.graph.values[static_cast<size_t>(v)].name, std::move(ann));
        pipelined_->by_value.clear();
      }
    } else {
      if (o_.pipeline.microbatches != 0) throw InputError("--microbatches: only used with --pipeline");
      if (o_.pipeline.schedule != "gpipe") throw InputError("--schedule: only used with --pipeline");
      if (!o_.pipeline.layers.empty()) throw InputError("--layers: only used with --pipeline");
    }
    // --auto costs repeated layers once, on the model cut to its first layers (docs/auto.md, "Scale"): it needs the
    // forward graph (values share their data, so the copy is cheap) and a builder of the step from it.
    if (o_.auto_search && o_.pipeline.axis.empty()) forward_ = p_.graph;
    forward_inputs_ = p_.load_report.inputs.size();
    if (o_.training.on) {
      for (const FlatValue& fv : p_.load_report.inputs)
        for (int v : fv.values) input_names_.push_back(p_.graph.values[static_cast<size_t>(v)].name);
      p_.training = build_training_step(std::move(p_.graph), *to_, lo_.shape_function);
      training_signature(p_.load_report, input_names_, p_.training->graph);
      p_.graph = std::move(p_.training->graph);
      p_.training->graph = Graph();
    }
  }

  /// The annotations of the graph to partition (the step's, for --training); the step's memory roles.
  void annotate() {
    p_.annotations = pipelined_ ? std::move(*pipelined_) : read_annotations(p_.graph);
    for (auto& [name, ann] : pipelined_by_name_) p_.annotations.by_value.emplace(p_.graph.at(name), std::move(ann));
    if (p_.training && p_.training->accumulate > 1)
      annotate_microbatches(p_.graph, p_.training->accumulate, p_.annotations);
    p_.sharding_file = file_;
    p_.sharding_file_implicit = o_.shardings.empty() && !file_.empty();
    if (p_.training) {
      update_axis_ = shard_update_axis(p_, o_.training.shard_update);
      p_.memory_roles = training_memory_roles(p_.graph, *p_.training);
    }
    p_.target.check_device_order(p_.annotations.mesh);
  }

  /// The step --auto's layered costing builds from a cut forward graph `g` for a step choice.
  AutoModel build_candidate(Graph g, const StepChoice& step) const {
    AutoModel m;
    if (!to_) {
      m.graph = std::move(g);
      return m;
    }
    TrainingOptions t = *to_;
    t.remat = step.remat;
    t.shard_update = step.update_axis >= 0;
    if (step.microbatches > 0) t.accumulate = step.microbatches;
    std::erase_if(t.trainable, [&](const std::string& name) { return g.find(name) < 0; });
    m.training = build_training_step(std::move(g), t, lo_.shape_function);
    m.roles = training_memory_roles(m.training->graph, *m.training);
    m.graph = std::move(m.training->graph);
    m.training->graph = Graph();
    return m;
  }

  /// --auto: the search, and the chosen plan's step when it is built otherwise than the searched one.
  void search() {
    AutoOptions ao;
    ao.target = p_.target;
    ao.overlap = o_.overlap;
    ao.memory_limit_bytes = memory_limit_;
    ao.memory_roles = p_.memory_roles ? &*p_.memory_roles : nullptr;
    ao.training = p_.training ? &*p_.training : nullptr;
    ao.progress = o_.progress ? auto_progress(*o_.progress) : auto_progress();
    ao.best_if_none_fits = o_.stage_search_base;
    if (forward_) {
      ao.forward = &*forward_;
      ao.build = [&](Graph g, const StepChoice& step) { return build_candidate(std::move(g), step); };
      if (to_) {
        ao.step = {to_->remat, update_axis_};
        // --training without --remat (--shard-update): the search chooses the policy (and the weight-update sharding)
        // (docs/auto.md, "Training").
        if (o_.training.remat.empty()) ao.remat_choices = {RematPolicy::kNone, RematPolicy::kDots, RematPolicy::kFull};
        ao.update_choice = o_.training.shard_update.empty();
        ao.accumulate = to_->accumulate;
      }
    }
    p_.auto_result = auto_shard(p_.graph, p_.annotations, ao, &p_.rules);
    p_.annotations = p_.auto_result->annotations;
    update_axis_ = p_.auto_result->chosen.step.update_axis;
    if (update_axis_ >= 0) p_.shard_update = p_.annotations.mesh.axes[update_axis_];
    if (p_.auto_result->model) {  // the chosen plan's step is built otherwise than the searched one: its step
      AutoModel& m = *p_.auto_result->model;
      p_.graph = std::move(m.graph);
      p_.training = std::move(m.training);
      p_.memory_roles = std::move(m.roles);
      p_.load_report.inputs.erase(p_.load_report.inputs.begin() + static_cast<long>(forward_inputs_),
                                  p_.load_report.inputs.end());
      training_signature(p_.load_report, input_names_, p_.graph);
      p_.rules = RuleTable(p_.graph);
      p_.auto_result->model.reset();
    }
  }

  /// The step's values annotated after their weights, propagation, partitioning; on the host target, its ops measured.
  void partition_step() {
    // The step's values follow their weights' annotations (docs/training.md), --auto's too.
    if (p_.training)
      annotate_step(p_.graph, step_followers(p_.graph, *p_.training), update_axis_,
                    fmt::format("--shard-update {}", p_.shard_update), p_.annotations,
                    step_batch_inputs(p_.graph, *p_.training));
    t0_ = std::chrono::steady_clock::now();
    p_.annotations = refine_for_reshapes(p_.graph, p_.annotations, &p_.rules);
    p_.plan = propagate(p_.graph, p_.annotations, &p_.rules);
    p_.times.propagate = rules_s_ + seconds_since(t0_);
    t0_ = std::chrono::steady_clock::now();
    p_.program = partition(p_.graph, p_.plan, p_.annotations.mesh, p_.target, &p_.rules,
                           p_.memory_roles ? &*p_.memory_roles : nullptr);
    p_.times.partition = seconds_since(t0_);
    if (o_.target == "host" && o_.measure_host_ops) {
      t0_ = std::chrono::steady_clock::now();
      MeasureSpread spread;
      measure_program_ops(p_.program, p_.target, 1, 5, int64_t{1} << 30, &spread);
      p_.times.measure_ops = seconds_since(t0_);
      if (const std::string w = host_spread_warning(spread, host_threads(), host_cores()); !w.empty())
        p_.program.warnings.push_back(w);
    }
  }

  const CommonOptions& o_;
  int64_t memory_limit_ = 0;                   // --memory-limit, bytes (0: the target's HBM)
  std::function<bool(const Value&)> trained_;  // --trainable's weights
  std::optional<DeviceMesh> cli_mesh_;         // --mesh, else the mesh the sharding file names
  LoadOptions lo_;
  Compiled p_;
  std::string file_;                      // the sharding file (or annotated model), "" for none
  std::optional<TrainingOptions> to_;     // against the model as loaded
  std::optional<Annotations> pipelined_;  // --pipeline's, until annotate(); with --training re-keyed by name:
  std::vector<std::pair<std::string, Annotation>> pipelined_by_name_;
  std::optional<Graph> forward_;          // --auto's layered costing: the forward graph
  std::vector<std::string> input_names_;  // the forward's inputs, as the load report lists them
  size_t forward_inputs_ = 0;
  int update_axis_ = -1;
  std::chrono::steady_clock::time_point t0_;
  double rules_s_ = 0;
};

}  // namespace

Compiled compile_model(const CommonOptions& o, bool load_data) {
  if (o.pipeline.axis == "auto" && !o.stage_candidate) return search_stages(o, load_data);
  return CompileFlow(o, load_data).run();
}

}  // namespace gspmd::cli
