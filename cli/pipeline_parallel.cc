// --pipeline's part of the command flow (cli/pipeline_parallel.h).
#include "cli/pipeline_parallel.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "core/pipeline/schedule.h"

namespace gspmd::cli {

std::vector<std::string> pipelined_trainable(const std::vector<std::string>& trainable, const PipelineLayout& l,
                                             const Graph& g) {
  const std::set<std::string> t(trainable.begin(), trainable.end());
  std::vector<std::string> out;
  for (const std::string& w : trainable)
    if (g.find(w) >= 0) out.push_back(w);
  for (const PipelineLayout::StackedWeight& w : l.weights)
    if (std::any_of(w.members.begin(), w.members.end(), [&](const std::string& m) { return t.count(m) != 0; }))
      out.push_back(w.name);
  return out;
}

namespace {

/// --pipeline AXIS --auto without --microbatches: the microbatch count among `divisors` (of the batch) whose
/// pipelined forward graph, propagated, partitioned and costed with the annotations `a` alone, has the fastest
/// simulated step within the memory limit (--memory-limit, else the target's HBM), else the fastest (the sharding
/// search then looks for a plan that fits; for --pipeline auto's stage counts, which get no such search, the one with
/// the least memory). What was tried goes to p.microbatch_search. `model_plan`: the model
/// propagated with `a` (pipeline_annotations).
int64_t fastest_microbatches(Compiled& p, const CommonOptions& o, const Annotations& a, int axis, PipelineOptions po,
                             const std::vector<int64_t>& divisors, const ShapeFunction& shapes,
                             const ShardingPlan& model_plan) {
  const int64_t limit =
      o.memory_limit.empty() ? static_cast<int64_t>(p.target.hbm_bytes) : parse_memory_limit(o.memory_limit);
  for (int64_t d : divisors) {
    po.microbatches = d;
    const PipelinedGraph c = pipeline_graph(p.graph, po, shapes);
    const RuleTable rules(c.graph);
    const Annotations ca = refine_for_reshapes(c.graph, pipeline_annotations(p.graph, a, c, axis, &model_plan), &rules);
    const SpmdProgram prog = partition(c.graph, propagate(c.graph, ca, &rules), ca.mesh, p.target, &rules);
    const CostReport cost = simulate_cost(c.graph, prog, p.target, o.overlap);
    p.microbatch_search.push_back({d, cost.step_time_s, cost.peak_memory_bytes, cost.peak_memory_bytes <= limit});
  }
  // --pipeline auto's stage counts get no sharding search after this: when no count fits, the least memory.
  const bool least_memory = o.stage_candidate && std::none_of(p.microbatch_search.begin(), p.microbatch_search.end(),
                                                              [](const MicrobatchCandidate& c) { return c.fits; });
  return std::min_element(p.microbatch_search.begin(), p.microbatch_search.end(),
                          [&](const MicrobatchCandidate& x, const MicrobatchCandidate& y) {
                            if (least_memory) return x.peak_bytes < y.peak_bytes;
                            return x.fits != y.fits ? x.fits : x.step_s < y.step_s;
                          })
      ->microbatches;
}

}  // namespace

Annotations apply_pipeline(Compiled& p, const CommonOptions& o, const Annotations& a, const ShapeFunction& shapes) {
  const int axis = a.mesh.axis_index(o.pipeline.axis);
  if (axis < 0)
    throw InputError(fmt::format("--pipeline: '{}' is not an axis of the mesh {}", o.pipeline.axis, a.mesh.str()));
  PipelineOptions po;
  po.stages = a.mesh.shape[static_cast<size_t>(axis)];
  po.schedule =
      pick<PipelineSchedule>(o.pipeline.schedule, "--schedule",
                             {{"gpipe", PipelineSchedule::kGpipe}, {"circular", PipelineSchedule::kCircular}});
  po.layers = o.pipeline.layers;
  const ShardingPlan model_plan = propagate(p.graph, a);  // once: the state buffers start from it
  if (o.pipeline.microbatches > 0) {
    po.microbatches = o.pipeline.microbatches;
  } else {
    // A divisor of the batch: by default the largest not above the stage count, with --auto the fastest.
    const int64_t batch = pipeline_batch(p.graph, po.layers);
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= batch; ++d)
      if (batch % d == 0) divisors.push_back(d);
    po.microbatches = 1;
    for (int64_t d : divisors)
      if (d <= po.stages) po.microbatches = d;
    if (o.auto_search || o.stage_candidate) {
      // Up to 8 microbatches per stage (a GPipe bubble under 12%): more only add iterations to the unrolled loop.
      std::erase_if(divisors, [&](int64_t d) { return d > 8 * po.stages; });
      po.microbatches = fastest_microbatches(p, o, a, axis, po, divisors, shapes, model_plan);
    }
  }
  PipelinedGraph pg = pipeline_graph(p.graph, po, shapes);
  Annotations out = pipeline_annotations(p.graph, a, pg, axis, &model_plan);
  // The signature's values, found again by name (the pipelined graph keeps the inputs' and outputs' names), except
  // layer weights that are graph inputs: their stacked inputs take their place, at the end.
  std::erase_if(p.load_report.inputs, [&](const FlatValue& fv) {
    return std::any_of(fv.values.begin(), fv.values.end(),
                       [&](int v) { return pg.graph.find(p.graph.values[static_cast<size_t>(v)].name) < 0; });
  });
  for (auto* side : {&p.load_report.inputs, &p.load_report.outputs})
    for (FlatValue& fv : *side)
      for (int& v : fv.values) v = pg.graph.at(p.graph.values[static_cast<size_t>(v)].name);
  for (int v : pg.graph.inputs)
    if (p.graph.find(pg.graph.values[static_cast<size_t>(v)].name) < 0) {
      FlatValue fv;
      fv.name = pg.graph.values[static_cast<size_t>(v)].name;
      fv.structure.elem_dtype = pg.graph.values[static_cast<size_t>(v)].dtype;
      fv.values = {v};
      p.load_report.inputs.push_back(std::move(fv));
      p.stacked_inputs = true;
    }
  if (p.stacked_inputs && !o.inputs_dir.empty()) {
    const PipelineLayout::StackedWeight& w = pg.layout.weights.at(0);
    throw InputError(fmt::format(
        "--inputs: --pipeline stacks the layer weights, which this model takes as graph inputs ('{}' ... into '{}'), "
        "so their files cannot be fed per layer; run without --inputs (pseudo-random inputs), or give the weights as "
        "initializers",
        w.members.at(0), w.name));
  }
  const double flops = graph_flops(pg.graph);
  p.pipeline_flops_scale = flops > 0 ? graph_flops(p.graph) / flops : 1;
  p.reference = std::move(p.graph);
  p.graph = std::move(pg.graph);
  p.pipeline = std::move(pg.layout);
  p.pipeline_axis = o.pipeline.axis;
  return out;
}

namespace {

/// The stage count `s` of `--pipeline auto` under the plan of `base` (an --auto search's): the mesh `stage` x `user`
/// with `user`'s axis `carved` divided by s, the plan's annotations with their axes renumbered, its step choices.
StageCandidate stage_candidate(const Compiled& base, const DeviceMesh& user, int carved, int64_t s) {
  StageCandidate c;
  c.mesh.axes = {user.axis_index("stage") < 0 ? "stage" : "pipeline_stage"};
  for (const std::string& a : user.axes) c.mesh.axes.push_back(a);
  c.mesh.devices = user.devices;
  c.mesh.shape = {s};
  c.mesh.shape.insert(c.mesh.shape.end(), user.shape.begin(), user.shape.end());
  c.mesh.shape[static_cast<size_t>(carved) + 1] /= s;
  // The model's data inputs (token ids, labels; not a trained weight or its state, not floating point without
  // --training) keep their batch over the whole carved axis: over the stage axis too, then the rest of it (the
  // devices are in the same order), so that the prefix and suffix do not run replicated over the stages.
  std::set<std::string> weights;
  if (base.training)
    for (const TrainingStep::Weight& w : base.training->weights) {
      weights.insert(w.name);
      weights.insert(w.state.begin(), w.state.end());
    }
  std::set<int> inputs(base.graph.inputs.begin(), base.graph.inputs.end());
  for (const auto& [v, ann] : base.auto_result->annotations.by_value) {
    const Value& value = base.graph.values[static_cast<size_t>(v)];
    Annotation shifted = ann;  // axis ids on the user's mesh, one on in the stage mesh
    for (auto& dim : shifted.sharding.dims)
      for (int& a : dim) ++a;
    for (int& a : shifted.sharding.unreduced) ++a;
    const bool data = inputs.count(v) && !weights.count(value.name) && (base.training || !is_floating(value.dtype));
    if (data && !shifted.sharding.dims.empty()) {
      std::vector<int>& dim0 = shifted.sharding.dims[0];
      if (auto at = std::find(dim0.begin(), dim0.end(), carved + 1); at != dim0.end()) dim0.insert(at, 0);
    }
    c.annotations.emplace_back(value.name, std::move(shifted));
  }
  if (base.training) c.remat = std::string(remat_name(base.training->remat));
  c.shard_update = base.shard_update;
  return c;
}

}  // namespace

Compiled search_stages(const CommonOptions& o, bool load_data) {
  if (!o.auto_search) throw InputError("--pipeline auto: only with --auto (the search chooses the stage count)");
  CommonOptions flat = o;
  flat.pipeline.axis.clear();
  flat.stage_search_base = true;
  Compiled base = compile_model(flat, load_data);
  const int64_t limit = base.auto_result->memory_limit_bytes;
  std::vector<StageSearchEntry> tried;
  auto entry = [&](Compiled& p, int64_t stages, const char* sharding) {
    const CostReport c = p.cost(o.overlap);
    return StageSearchEntry{stages,
                            p.pipeline ? p.pipeline->microbatches : 1,
                            c.step_time_s,
                            c.peak_memory_bytes,
                            c.peak_memory_bytes <= limit,
                            sharding,
                            ""};
  };
  auto better = [](const StageSearchEntry& a, const StageSearchEntry& b) {
    if (a.error.empty() != b.error.empty()) return a.error.empty();
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.step_s < b.step_s : a.peak_bytes < b.peak_bytes;
  };
  tried.push_back(entry(base, 1, "searched"));
  StageSearchEntry chosen = tried.back();
  std::optional<Compiled> winner;  // a pipelined program that beat the S = 1 plan
  const DeviceMesh user = base.annotations.mesh.user();
  int carved = 0;  // the first axis of more than one device
  while (carved + 1 < user.rank() && user.shape[static_cast<size_t>(carved)] <= 1) ++carved;
  const int64_t first = user.rank() > 0 ? user.shape[static_cast<size_t>(carved)] : 1;
  for (int64_t s = 2; s <= std::min<int64_t>(first, 64); ++s) {
    if (first % s != 0) continue;
    // The plan searched for S stages: --auto on the mesh of one stage, with S times the memory.
    std::vector<int64_t> stage_shape = user.shape;
    stage_shape[static_cast<size_t>(carved)] /= s;
    CommonOptions per = flat;
    per.mesh = fmt::format("{}", fmt::join(stage_shape, "x"));
    per.memory_limit = std::to_string(limit > std::numeric_limits<int64_t>::max() / s ? limit : limit * s);
    per.progress = false;
    per.search_only = true;  // its plan (annotations, step choices) is all stage_candidate reads
    std::optional<Compiled> searched;
    try {
      searched = compile_model(per, false);
    } catch (const InputError&) {  // a constraint that the stage's mesh cannot hold: the S = 1 plan only
    }
    StageSearchEntry here{s, 0, 0, 0, false, "", "refused"};
    std::optional<Compiled> kept;
    for (const auto& [plan, sharding] : {std::pair<const Compiled*, const char*>{&base, "as for 1 stage"},
                                         {searched ? &*searched : nullptr, "searched"}}) {
      if (!plan) continue;
      const StageCandidate cand = stage_candidate(*plan, user, carved, s);
      CommonOptions os = o;
      os.auto_search = false;
      os.pipeline.axis = cand.mesh.axes[0];
      os.stage_candidate = &cand;
      if (plan->training) os.training.remat = cand.remat, os.training.shard_update = cand.shard_update;
      try {
        Compiled p = compile_model(os, load_data);
        StageSearchEntry e = entry(p, s, sharding);
        if (better(e, here)) here = e, kept = std::move(p);
      } catch (const InputError& e) {
        if (!here.error.empty()) here.error = e.what();
      }
    }
    tried.push_back(here);
    if (kept && better(here, chosen)) chosen = here, winner = std::move(kept);
  }
  if (!chosen.fits) {
    std::vector<std::string> peaks;
    for (const StageSearchEntry& e : tried)
      peaks.push_back(e.error.empty() ? fmt::format("{}: {}", e.stages, e.peak_bytes)
                                      : fmt::format("{}: refused", e.stages));
    throw InputError(fmt::format(
        "--pipeline auto: no plan fits in {} bytes per device at any stage count; the closest ({} stage(s)) needs {} "
        "bytes per device (stages: bytes per device {})",
        limit, chosen.stages, chosen.peak_bytes, fmt::join(peaks, ", ")));
  }
  Compiled out = winner ? std::move(*winner) : std::move(base);
  out.stage_search = std::move(tried);
  return out;
}

}  // namespace gspmd::cli
