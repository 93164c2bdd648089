// The annotations of the pipelined graph (core/pipeline/schedule.h, pipeline_annotations): the model's annotations
// carried to the stacked copies, the stacked weights, the state buffers and the gathered results.
#include <algorithm>
#include <iterator>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/pipeline/schedule.h"
#include "core/propagation/propagation.h"

namespace gspmd {
namespace {

/// pipeline_annotations in its phases: the annotations of g's values collected (and joined per layer position),
/// then placed on the stacked copies, the stacked weights, the state buffers and the results; an annotation that
/// reached nothing is refused.
class StackedAnnotations {
 public:
  StackedAnnotations(const Graph& g, const Annotations& a, const PipelinedGraph& p, int axis)
      : g_(g), p_(p), pg_(p.graph), axis_(axis), axis_name_(a.mesh.axes.at(static_cast<size_t>(axis))) {
    out_.mesh = a.mesh;
    collect(a);
  }

  Annotations build(const Graph& g, const Annotations& a, const ShardingPlan* model_plan) {
    place_inside();
    place_weights();
    // The state buffers and the results start as the model's own plan shards the values they carry.
    const ShardingPlan plan = model_plan ? ShardingPlan() : propagate(g, a);
    const std::vector<TensorSharding>& model = (model_plan ? *model_plan : plan).shardings;
    place_states(model);
    place_results(model);
    // An annotation is a constraint: one that reached no value of the pipelined graph is refused, never dropped.
    for (const auto& [name, ann] : by_name_)
      if (!placed_.count(name))
        throw InputError(
            fmt::format("{}: '{}' has no copy in the graph that --pipeline builds, so its annotation "
                        "cannot be kept",
                        ann->source, name));
    return std::move(out_);
  }

 private:
  static bool same(const Annotation* x, const Annotation* y) {
    return (!x && !y) || (x && y && x->sharding == y->sharding && x->open == y->open && x->open_dims == y->open_dims);
  }
  static Annotation sourced(const Annotation& ann, const std::string& why) {
    Annotation s = ann;
    s.source = fmt::format("{} ({})", ann.source, why);
    return s;
  }
  /// Each stage holds its own layers: the stage dim of every stacked copy takes the axis, which `ann` may not use.
  void check_axis(const Annotation& ann, const std::string& name) const {
    const std::vector<int> used = ann.sharding.tiled_axes();
    if (std::find(used.begin(), used.end(), axis_) != used.end() ||
        std::find(ann.sharding.unreduced.begin(), ann.sharding.unreduced.end(), axis_) != ann.sharding.unreduced.end())
      throw InputError(
          fmt::format("{}: '{}' belongs to the layers, whose stacked copies have their stage dim over "
                      "'{}' (--pipeline): it cannot be sharded over '{}' too",
                      ann.source, name, axis_name_, axis_name_));
  }
  /// [axis] + ann, for a stacked copy of rank `rank`.
  Annotation stacked(const Annotation& ann, int rank, const std::string& why) const {
    Annotation s = sourced(ann, why);
    s.sharding.dims.insert(s.sharding.dims.begin(), std::vector<int>{axis_});
    s.sharding.unreduced.clear();
    if (!s.open_dims.empty() || s.open) {
      s.open_dims.assign(static_cast<size_t>(rank), 0);
      for (int d = 1; d < rank; ++d) s.open_dims[static_cast<size_t>(d)] = ann.dim_open(d - 1);
      s.open = false;
    }
    return s;
  }

  /// Values both graphs have keep their annotation. A value inside the layers (or a layer's constant) joins the
  /// annotated values of the other layers at its place, which must say the same.
  void collect(const Annotations& a) {
    for (const auto& [v, ann] : a.by_value) {
      const std::string& name = g_.values[static_cast<size_t>(v)].name;
      by_name_[name] = &ann;
      if (const int id = pg_.find(name); id >= 0) {
        out_.by_value[id] = ann;
        placed_.insert(name);
      }
      auto at = p_.layout.block_values.find(name);
      if (at == p_.layout.block_values.end()) continue;
      Inside& in = inside_[at->second];
      if (in.ann && !same(in.ann, &ann))
        throw InputError(
            fmt::format("{}: '{}' and '{}' are the same value of two layers, which --pipeline runs as one "
                        "stacked layer, but are annotated differently",
                        ann.source, in.names.front(), name));
      in.ann = &ann;
      in.names.push_back(name);
    }
  }

  /// A layer position's annotation goes to every stage-stacked copy of block 0's value with the stage dim over the
  /// axis in front, or as it is to the one copy of a value computed from constants.
  void place_inside() {
    for (const auto& [v0, in] : inside_) {
      const Annotation& ann = *in.ann;
      const size_t rank = g_.values[static_cast<size_t>(g_.at(in.names.front()))].shape.size();
      std::vector<int> copies;
      if (auto inst = p_.layout.block_instances.find(v0); inst != p_.layout.block_instances.end())
        for (const std::string& c : inst->second) copies.push_back(pg_.at(c));
      else if (const int id = pg_.find(v0); id >= 0)
        copies.push_back(id);  // a constant the layers read
      for (const int id : copies) {
        const size_t copy_rank = pg_.values[static_cast<size_t>(id)].shape.size();
        if (copy_rank == rank + 1) {
          check_axis(ann, in.names.front());
          out_.by_value[id] = stacked(ann, static_cast<int>(copy_rank), "on every layer's copy, stacked by --pipeline");
        } else {
          out_.by_value[id] = sourced(ann, "the copy every layer reads, by --pipeline");
        }
      }
      if (!copies.empty()) placed_.insert(in.names.begin(), in.names.end());
    }
  }

  /// Each stacked weight takes its members' annotation (which must agree) behind the stage (and round) dims.
  void place_weights() {
    for (const PipelineLayout::StackedWeight& w : p_.layout.weights) {
      const int id = pg_.at(w.name);
      const int rank = static_cast<int>(pg_.values[static_cast<size_t>(id)].shape.size());
      const Annotation* first = nullptr;
      std::string first_name;
      for (const std::string& m : w.members) {
        if (m.empty()) continue;
        auto it = by_name_.find(m);
        const Annotation* ann = it == by_name_.end() ? nullptr : it->second;
        if (ann) placed_.insert(m);
        if (first_name.empty()) {
          first = ann;
          first_name = m;
        } else if (!same(first, ann)) {
          throw InputError(fmt::format("--pipeline: '{}' and '{}' are stacked into '{}' but annotated differently",
                                       first_name, m, w.name));
        }
      }
      Annotation s;
      s.sharding = TensorSharding::replicated(rank);
      s.open_dims.assign(static_cast<size_t>(rank), 1);
      const int offset = w.stage_dim + 1;  // the member's dims follow the lead dims
      if (first) {
        check_axis(*first, first_name);
        for (size_t d = 0; d < first->sharding.dims.size(); ++d) {
          s.sharding.dims[d + static_cast<size_t>(offset)] = first->sharding.dims[d];
          s.open_dims[d + static_cast<size_t>(offset)] = first->dim_open(static_cast<int>(d));
        }
        s.source = fmt::format("{} (stacked by --pipeline)", first->source);
      } else {
        s.source = fmt::format("--pipeline {}: the stage dim of '{}'", axis_name_, w.name);
      }
      s.sharding.dims[static_cast<size_t>(w.stage_dim)] = {axis_};
      s.open_dims[static_cast<size_t>(w.stage_dim)] = 0;
      if (w.stage_dim == 1) s.open_dims[0] = 0;  // the rounds stay whole on every stage
      out_.by_value[id] = std::move(s);
    }
  }

  /// An open annotation of rank `rank` whose dims from `offset` on are the model plan's (`model`) of `carries` without
  /// the axis, dim 0 closed (its axes set by the caller).
  Annotation as_the_model(const std::vector<TensorSharding>& model, int rank, int offset, const std::string& carries,
                          std::string source) const {
    const TensorSharding& rows = model.at(static_cast<size_t>(g_.at(carries)));
    Annotation s;
    s.sharding = TensorSharding::replicated(rank);
    if (rows.rank() + offset == rank)
      for (int d = 0; d < rows.rank(); ++d)
        std::copy_if(rows.dims[static_cast<size_t>(d)].begin(), rows.dims[static_cast<size_t>(d)].end(),
                     std::back_inserter(s.sharding.dims[static_cast<size_t>(d + offset)]),
                     [&](int x) { return x != axis_; });
    s.open_dims.assign(static_cast<size_t>(rank), 1);
    s.open_dims[0] = 0;
    s.source = std::move(source);
    return s;
  }

  /// The state buffers that no annotated layer output reached: dim 0 over the axis; the others start as the model's
  /// own plan shards the value whose microbatch rows they carry (a batch split stays split in every microbatch, as
  /// without --pipeline), and stay open.
  void place_states(const std::vector<TensorSharding>& model) {
    for (const PipelineLayout::State& st : p_.layout.states) {
      const int id = pg_.at(st.name);
      if (out_.by_value.count(id)) continue;
      const int rank = static_cast<int>(pg_.values[static_cast<size_t>(id)].shape.size());
      Annotation s = as_the_model(model, rank, 1, st.carries,
                                  fmt::format("--pipeline {}: the stage dim of the state buffer, the rest as '{}' "
                                              "without --pipeline",
                                              axis_name_, st.carries));
      s.sharding.dims[0] = {axis_};
      out_.by_value[id] = std::move(s);
    }
  }

  /// The gathered results: the batch over the model's batch axes, then over the axis (the suffix is not replicated
  /// over the stages); the other dims open, as the model's plan starts them.
  void place_results(const std::vector<TensorSharding>& model) {
    const std::string& name = p_.layout.results;
    const int results = pg_.find(name);
    const int rank = results < 0 ? 0 : static_cast<int>(pg_.values[static_cast<size_t>(results)].shape.size());
    if (rank == 0 || model.at(static_cast<size_t>(g_.at(name))).rank() != rank || out_.by_value.count(results)) return;
    Annotation s =
        as_the_model(model, rank, 0, name,
                     fmt::format("--pipeline {}: the results' batch over '{}' too, the rest as '{}' without --pipeline",
                                 axis_name_, axis_name_, name));
    s.sharding.dims[0].push_back(axis_);
    out_.by_value[results] = std::move(s);
  }

  /// A layer position of block 0: the annotation its layers' values share, and their names in value order.
  struct Inside {
    const Annotation* ann = nullptr;
    std::vector<std::string> names;
  };

  const Graph& g_;
  const PipelinedGraph& p_;
  const Graph& pg_;
  const int axis_;
  const std::string axis_name_;
  Annotations out_;
  std::map<std::string, Inside> inside_;  // block 0's value -> its layers' annotated copies
  std::map<std::string, const Annotation*> by_name_;
  std::set<std::string> placed_;  // annotated values of g that reached a value of pg
};

}  // namespace

Annotations pipeline_annotations(const Graph& g, const Annotations& a, const PipelinedGraph& p, int axis,
                                 const ShardingPlan* model_plan) {
  return StackedAnnotations(g, a, p, axis).build(g, a, model_plan);
}

}  // namespace gspmd
