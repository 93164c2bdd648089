// core/autodiff/step_shardings: a training step's values take their weights' shardings (docs/training.md).
#include "core/autodiff/step_shardings.h"

#include "core/autodiff/accumulate.h"

#include <algorithm>

#include <fmt/format.h>

namespace gspmd {

std::vector<WeightFollowers> step_followers(const Graph& g, const TrainingStep& step) {
  std::vector<WeightFollowers> out;
  out.reserve(step.weights.size());
  for (const TrainingStep::Weight& w : step.weights) {
    WeightFollowers f;
    f.weight = g.find(w.name);
    if (f.weight < 0) continue;
    f.name = w.name;
    auto add = [&](const std::string& name, int reduced, bool update) {
      if (const int v = name.empty() ? -1 : g.find(name); v >= 0) f.values.push_back({v, reduced, update});
    };
    add(w.grad, -1, true);
    add(w.update_shard, -1, true);
    for (size_t k = 0; k < w.state.size(); ++k) {
      add(w.state[k], w.state_reduced_dim[k], true);
      add(w.state_updated[k], w.state_reduced_dim[k], true);
    }
    add(w.updated, -1, false);
    for (const std::string& name : w.partial_grads)
      if (const int v = g.find(name); v >= 0) f.values.push_back({v, -1, false, true});
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<int> step_batch_inputs(const Graph& g, const TrainingStep& step) {
  std::vector<int> out;
  for (const std::string& name : step.batch_inputs)
    if (const int v = g.find(name); v >= 0) out.push_back(v);
  return out;
}

TensorSharding update_sharding(const TensorSharding& w, const Shape& shape, const DeviceMesh& mesh, int axis) {
  for (int a : w.tiled_axes())
    if (a == axis) return w;
  int best = -1;
  for (int d = 0; d < w.rank(); ++d) {
    const int64_t per_shard = (shape[static_cast<size_t>(d)] + w.shards(d, mesh) - 1) / w.shards(d, mesh);
    if (per_shard >= mesh.shape[static_cast<size_t>(axis)] &&
        (best < 0 || shape[static_cast<size_t>(d)] > shape[static_cast<size_t>(best)]))
      best = d;
  }
  TensorSharding s = w;
  if (best >= 0) s.dims[static_cast<size_t>(best)].push_back(axis);
  return s;
}

void annotate_step(const Graph& g, const std::vector<WeightFollowers>& weights, int update_axis, std::string_view held,
                   Annotations& a, const std::vector<int>& batch_inputs) {
  std::vector<char> batch_axes(static_cast<size_t>(a.mesh.rank()), 0);  // the mesh axes splitting the batch
  for (int v : batch_inputs)
    if (auto it = a.by_value.find(v); it != a.by_value.end() && it->second.sharding.rank() > 0)
      for (int axis : it->second.sharding.dims[0]) batch_axes[static_cast<size_t>(axis)] = 1;
  for (const WeightFollowers& f : weights) {
    auto it = a.by_value.find(f.weight);
    if (it == a.by_value.end()) {
      const int rank = static_cast<int>(g.values[static_cast<size_t>(f.weight)].shape.size());
      if (update_axis < 0 || rank < 2) continue;
      Annotation r;
      r.sharding = TensorSharding::replicated(rank);
      r.source = fmt::format("{}: '{}' is not annotated, held replicated", held, f.name);
      it = a.by_value.emplace(f.weight, std::move(r)).first;
    }
    const Annotation& base = it->second;
    const std::vector<int> tiled = base.sharding.tiled_axes();
    const bool split_like_batch = std::any_of(tiled.begin(), tiled.end(), [&](int axis) { return batch_axes[axis]; });
    for (const WeightFollowers::Follower& u : f.values) {
      if (a.by_value.count(u.value) || (u.partial && !split_like_batch)) continue;
      const bool sharded = u.update && update_axis >= 0;
      Annotation x = base;
      x.source = fmt::format("{} (--training: {} '{}')", base.source, sharded ? "the update of" : "follows", f.name);
      // A state tensor that lacks a weight dim takes the weight's sharding without that dim, sharded over the update
      // axis by its own shape.
      if (u.reduced_dim >= 0 && u.reduced_dim < x.sharding.rank())
        x.sharding.dims.erase(x.sharding.dims.begin() + u.reduced_dim);
      if (sharded)
        x.sharding = update_sharding(x.sharding, g.values[static_cast<size_t>(u.value)].shape, a.mesh, update_axis);
      a.by_value.emplace(u.value, std::move(x));
    }
  }
}

void annotate_microbatches(const Graph& g, int64_t k, Annotations& a) {
  std::vector<std::pair<int, Annotation>> copies;
  for (const auto& [v, ann] : a.by_value)
    for (int64_t m = 1; m < k; ++m)
      if (const int c = g.find(microbatch_name(g.values[static_cast<size_t>(v)].name, m)); c >= 0) {
        Annotation copy = ann;
        copy.source = fmt::format("{} (--accumulate: microbatch {})", ann.source, m);
        copies.emplace_back(c, std::move(copy));
      }
  for (auto& [v, ann] : copies) a.by_value.emplace(v, std::move(ann));
}

}  // namespace gspmd
