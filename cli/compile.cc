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

}  // namespace

Compiled compile_model(const CommonOptions& o, bool load_data) {
  if (o.pipeline.axis == "auto" && !o.stage_candidate) return search_stages(o, load_data);
  std::optional<DeviceMesh> cli_mesh;  // --mesh, else the mesh the sharding file names
  if (o.mesh) cli_mesh = DeviceMesh::parse(*o.mesh);
  const int64_t memory_limit = parse_memory_limit(o.memory_limit);
  if (memory_limit > 0 && !o.auto_search && !o.stage_candidate)
    throw InputError("--memory-limit: only used with --auto");
  LoadOptions lo = kernel_load_options();
  lo.load_data = load_data;
  const std::function<bool(const Value&)> trained = trainable_weights(o.training);
  if (o.training.on) lo.variable = trained;
  // An annotated weight (a float initializer of more than one element, as --training's trainable set) is a
  // constraint: it stays in the graph, not folded into a transposed copy of another name.
  const fs::path sibling = sibling_sharding_file(o);
  const std::string sidecar = !o.shardings.empty() ? o.shardings : fs::exists(sibling) ? sibling.string() : "";
  if (fs::path(sidecar).extension() == ".json")
    if (auto annotated = sharding_file_names(sidecar))
      lo.variable = [annotated, trained = lo.variable](const Value& v) {
        return (is_floating(v.dtype) && num_elements(v.shape) > 1 && annotated(v)) || (trained && trained(v));
      };
  if (!o.training.on && !o.training.shard_update.empty()) throw InputError("--shard-update: only used with --training");
  if (!o.training.on && !o.training.remat.empty() && o.training.remat != "none")
    throw InputError("--remat: only used with --training");
  if (!o.training.on && o.training.accumulate != 1) throw InputError("--accumulate: only used with --training");
  // --dim and --hint: NAME=VALUE, VALUE in 1 .. kMaxDim, each NAME once
  auto sizes = [](const std::vector<std::string>& flags, const char* flag, std::map<std::string, int64_t>& out) {
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
  };
  sizes(o.dims, "--dim", lo.dims);
  sizes(o.hints, "--hint", lo.hints);

  Compiled p;
  p.target = Target::load(o.target);
  if (!o.device_order.empty()) p.target.device_order = Target::parse_device_order(o.device_order);
  auto t0 = std::chrono::steady_clock::now();
  lo.inputs_dir = o.inputs_dir;  // the given inputs' shapes bind symbolic dims (--dim must agree)
  lo.keep_symbols = o.keep_symbols && !o.training.on && o.pipeline.axis.empty() && !o.auto_search;
  lo.data_dependent_dims = !o.training.on && o.pipeline.axis.empty();  // the step builder and stages are static
  p.graph = load_model(o.model, lo, &p.load_report);
  if (!o.precision.empty()) {
    const Precision precision = pick<Precision>(o.precision, "--precision",
                                                {{"bf16", Precision::kBF16},
                                                 {"mixed", Precision::kMixed},
                                                 {"autocast", Precision::kAutocast},
                                                 {"f32", Precision::kF32}});
    set_precision(p.graph, precision, trained, lo.shape_function);
    p.precision = precision;
  }
  const std::string file = sharding_file_of(o, p.load_report);
  auto read_annotations = [&](const Graph& g) {
    if (o.stage_candidate) {  // --pipeline auto's sweep: the S = 1 plan on the mesh with a stage axis
      Annotations a;
      a.mesh = o.stage_candidate->mesh;
      for (const auto& [name, ann] : o.stage_candidate->annotations)
        if (const int v = g.find(name); v >= 0) a.by_value[v] = ann;
      return a;
    }
    if (file.empty()) {
      if (!cli_mesh)
        throw InputError(fmt::format(
            "{}: no mesh: give --mesh, or a sharding file that names one (--shardings FILE, or {} beside the model)",
            o.model, sibling_sharding_file(o).filename().string()));
      Annotations a;
      a.mesh = *cli_mesh;
      return a;
    }
    const DeviceMesh* m = cli_mesh ? &*cli_mesh : nullptr;
    return fs::path(file).extension() == ".onnx" ? read_annotated_model(file, g, m) : read_sharding_file(file, g, m);
  };
  std::optional<TrainingOptions> to;  // against the model as loaded
  if (o.training.on) to = training_options(o.training, p.graph);
  std::optional<Annotations> pipelined;  // with --training, re-keyed by name onto the step below
  std::vector<std::pair<std::string, Annotation>> pipelined_by_name;
  if (!o.pipeline.axis.empty()) {
    pipelined = apply_pipeline(p, o, read_annotations(p.graph), lo.shape_function);
    if (to) {
      p.reference_training = *to;
      to->trainable = pipelined_trainable(to->trainable, *p.pipeline, p.graph);
      to->remat_keep = p.pipeline->carried_values;
      for (auto& [v, ann] : pipelined->by_value)
        pipelined_by_name.emplace_back(p.graph.values[static_cast<size_t>(v)].name, std::move(ann));
      pipelined->by_value.clear();
    }
  } else {
    if (o.pipeline.microbatches != 0) throw InputError("--microbatches: only used with --pipeline");
    if (o.pipeline.schedule != "gpipe") throw InputError("--schedule: only used with --pipeline");
    if (!o.pipeline.layers.empty()) throw InputError("--layers: only used with --pipeline");
  }
  // --auto costs repeated layers once, on the model cut to its first layers (docs/auto.md, "Scale"): it needs the
  // forward graph (values share their data, so the copy is cheap) and a builder of the step from it.
  std::optional<Graph> forward;
  if (o.auto_search && o.pipeline.axis.empty()) forward = p.graph;
  std::vector<std::string> input_names;  // the forward's inputs, as the load report lists them
  const size_t forward_inputs = p.load_report.inputs.size();
  if (o.training.on) {
    for (const FlatValue& fv : p.load_report.inputs)
      for (int v : fv.values) input_names.push_back(p.graph.values[static_cast<size_t>(v)].name);
    p.training = build_training_step(std::move(p.graph), *to, lo.shape_function);
    training_signature(p.load_report, input_names, p.training->graph);
    p.graph = std::move(p.training->graph);
    p.training->graph = Graph();
  }

  p.annotations = pipelined ? std::move(*pipelined) : read_annotations(p.graph);
  for (auto& [name, ann] : pipelined_by_name) p.annotations.by_value.emplace(p.graph.at(name), std::move(ann));
  if (p.training && p.training->accumulate > 1) annotate_microbatches(p.graph, p.training->accumulate, p.annotations);
  p.sharding_file = file;
  p.sharding_file_implicit = o.shardings.empty() && !file.empty();
  int update_axis = -1;
  if (p.training) {
    update_axis = shard_update_axis(p, o.training.shard_update);
    p.memory_roles = training_memory_roles(p.graph, *p.training);
  }
  p.target.check_device_order(p.annotations.mesh);
  p.times.load = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  p.rules = RuleTable(p.graph);  // once, for the search, the reshape cuts, propagation and partitioning
  const double rules_s = seconds_since(t0);
  if (o.auto_search) {  // timed by the search itself (the report's "auto")
    AutoOptions ao;
    ao.target = p.target;
    ao.overlap = o.overlap;
    ao.memory_limit_bytes = memory_limit;
    ao.memory_roles = p.memory_roles ? &*p.memory_roles : nullptr;
    ao.training = p.training ? &*p.training : nullptr;
    ao.progress = o.progress ? auto_progress(*o.progress) : auto_progress();
    ao.best_if_none_fits = o.stage_search_base;
    if (forward) {
      ao.forward = &*forward;
      ao.build = [&](Graph g, const StepChoice& step) {
        AutoModel m;
        if (!to) {
          m.graph = std::move(g);
          return m;
        }
        TrainingOptions t = *to;
        t.remat = step.remat;
        t.shard_update = step.update_axis >= 0;
        if (step.microbatches > 0) t.accumulate = step.microbatches;
        std::erase_if(t.trainable, [&](const std::string& name) { return g.find(name) < 0; });
        m.training = build_training_step(std::move(g), t, lo.shape_function);
        m.roles = training_memory_roles(m.training->graph, *m.training);
        m.graph = std::move(m.training->graph);
        m.training->graph = Graph();
        return m;
      };
      if (to) {
        ao.step = {to->remat, update_axis};
        // --training without --remat (--shard-update): the search chooses the policy (and the weight-update sharding)
        // (docs/auto.md, "Training").
        if (o.training.remat.empty()) ao.remat_choices = {RematPolicy::kNone, RematPolicy::kDots, RematPolicy::kFull};
        ao.update_choice = o.training.shard_update.empty();
        ao.accumulate = to->accumulate;
      }
    }
    p.auto_result = auto_shard(p.graph, p.annotations, ao, &p.rules);
    p.annotations = p.auto_result->annotations;
    update_axis = p.auto_result->chosen.step.update_axis;
    if (update_axis >= 0) p.shard_update = p.annotations.mesh.axes[update_axis];
    if (p.auto_result->model) {  // the chosen plan's step is built otherwise than the searched one: its step
      AutoModel& m = *p.auto_result->model;
      p.graph = std::move(m.graph);
      p.training = std::move(m.training);
      p.memory_roles = std::move(m.roles);
      p.load_report.inputs.erase(p.load_report.inputs.begin() + static_cast<long>(forward_inputs),
                                 p.load_report.inputs.end());
      training_signature(p.load_report, input_names, p.graph);
      p.rules = RuleTable(p.graph);
      p.auto_result->model.reset();
    }
    if (o.search_only) return p;
  }
  // The step's values follow their weights' annotations (docs/training.md), --auto's too.
  if (p.training)
    annotate_step(p.graph, step_followers(p.graph, *p.training), update_axis,
                  fmt::format("--shard-update {}", p.shard_update), p.annotations,
                  step_batch_inputs(p.graph, *p.training));
  t0 = std::chrono::steady_clock::now();
  p.annotations = refine_for_reshapes(p.graph, p.annotations, &p.rules);
  p.plan = propagate(p.graph, p.annotations, &p.rules);
  p.times.propagate = rules_s + seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  p.program =
      partition(p.graph, p.plan, p.annotations.mesh, p.target, &p.rules, p.memory_roles ? &*p.memory_roles : nullptr);
  p.times.partition = seconds_since(t0);
  if (o.target == "host" && o.measure_host_ops) {
    t0 = std::chrono::steady_clock::now();
    MeasureSpread spread;
    measure_program_ops(p.program, p.target, 1, 5, int64_t{1} << 30, &spread);
    p.times.measure_ops = seconds_since(t0);
    if (const std::string w = host_spread_warning(spread, host_threads(), host_cores()); !w.empty())
      p.program.warnings.push_back(w);
  }
  return p;
}

}  // namespace gspmd::cli
