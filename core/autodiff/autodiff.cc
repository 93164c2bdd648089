// The training step (core/autodiff/autodiff.h), in its phases: the trainable weights, the values they reach, the loss
// (losses.cc), the reverse pass over the gradient rules, --accumulate's microbatches (accumulate.cc), the optimizer
// update (optimizers.cc) and the step's names. The builder and the parts' declarations: step_builder.h.
#include "core/autodiff/autodiff.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include <fmt/format.h>

#include "core/autodiff/accumulate.h"
#include "core/autodiff/step_builder.h"
#include "core/ir/simplify.h"

namespace gspmd {
namespace {

using autodiff::StepBuilder;

/// --accumulate: the graph inputs of `g` that split into microbatches: not a trained weight (`weights`), and leading
/// with the model's batch, dim 0 of its output 0 (`output`, before the loss; the labels input lead with it too).
std::vector<int> microbatched_inputs(const Graph& g, const TrainingOptions& o, int output,
                                     const std::vector<int>& weights) {
  if (o.loss == LossKind::kOutput)
    throw InputError(
        "--accumulate: needs --loss mean, sum or cross-entropy:LABELS (a scalar output 0 is the model's own loss, "
        "which may not sum or average over its batch)");
  const Value& y = g.values.at(static_cast<size_t>(output));
  if (y.shape.empty())
    throw InputError(fmt::format("--accumulate: output 0 '{}' is a scalar: it has no batch to split", y.name));
  const int64_t batch = y.shape[0];
  std::vector<int> data;
  for (int v : g.inputs) {
    const Value& x = g.values[static_cast<size_t>(v)];
    if (!x.shape.empty() && x.shape[0] == batch && std::find(weights.begin(), weights.end(), v) == weights.end())
      data.push_back(v);
  }
  if (data.empty())
    throw InputError(fmt::format(
        "--accumulate: no graph input leads with the batch {} (dim 0 of output 0 '{}'): nothing to split into "
        "microbatches",
        batch, y.name));
  return data;
}

/// --accumulate: unrolls the one-microbatch step built in `b` (forward and loss: nodes [0, differentiated); the
/// backward pass after them) over the microbatches (accumulate_microbatches, after folding its transposes as the
/// step would), continues `b` on the accumulated graph with each weight's gradient its accumulator, and returns the
/// step's loss. Sets step.forward_ranges and step.batch_inputs, and per weight its partial gradient buffers.
int unroll_microbatches(StepBuilder& b, const TrainingOptions& o, const std::vector<int>& weights,
                        size_t differentiated, int loss, const std::vector<int>& data, double loss_scale,
                        TrainingStep& step, std::map<int, std::vector<int>>& partial_grads) {
  Graph& g = b.g();
  std::vector<int> grads;
  for (int w : weights)
    if (static_cast<size_t>(w) < b.grad_.size() && b.grad_[static_cast<size_t>(w)] >= 0)
      grads.push_back(b.grad_[static_cast<size_t>(w)]);
  const std::vector<int> model_outputs = g.outputs;
  g.outputs = grads;  // what the folding must keep
  g.outputs.push_back(loss);
  fold_transposes(g, differentiated, o.remat == RematPolicy::kNone);
  g.outputs = model_outputs;
  AccumulatedStep a = accumulate_microbatches(g, o.accumulate, differentiated, loss, grads, data, loss_scale);
  for (size_t j = 0, k = 0; j < weights.size(); ++j)
    if (static_cast<size_t>(weights[j]) < b.grad_.size() && b.grad_[static_cast<size_t>(weights[j])] >= 0) {
      partial_grads[weights[j]] = std::move(a.partial_grads[k]);
      b.grad_[static_cast<size_t>(weights[j])] = a.grads[k++];
    }
  step.forward_ranges = std::move(a.forward_ranges);
  for (int v : data) step.batch_inputs.push_back(g.values[static_cast<size_t>(v)].name);  // the whole batch's
  b.replace_graph(std::move(a.graph));
  b.grad_.resize(b.g().values.size(), -1);
  return a.loss;
}

/// The trainable weights' value ids (o.trainable, in order). Throws InputError naming a weight that is not a value
/// of `g`, or not a floating-point initializer or graph input.
std::vector<int> trainable_weights(const Graph& g, const TrainingOptions& o) {
  std::vector<int> weights;
  for (const std::string& name : o.trainable) {
    const int v = g.find(name);
    if (v < 0) throw InputError(fmt::format("--training: trainable weight '{}' is not a value of the model", name));
    const Value& w = g.values[static_cast<size_t>(v)];
    const bool input = std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end();
    if (!(w.is_initializer || input) || !is_floating(w.dtype))
      throw InputError(fmt::format("--training: '{}' is not a floating-point initializer or graph input ({}{})", name,
                                   type_str(w.dtype, w.shape),
                                   w.is_initializer || input ? "" : ", computed by a node"));
    weights.push_back(v);
  }
  return weights;
}

/// Marks b.requires_ for the outputs of nodes [from, end), in order: a value requires a gradient when it is floating
/// point and a node input that requires one reaches it.
void mark_requires(StepBuilder& b, size_t from) {
  const Graph& g = b.g();
  b.requires_.resize(g.values.size(), false);
  for (size_t k = from; k < g.nodes.size(); ++k) {
    bool any = false;
    for (int v : g.nodes[k].inputs) any = any || (v >= 0 && b.requires_[static_cast<size_t>(v)]);
    if (!any) continue;
    for (int v : g.nodes[k].outputs)
      if (v >= 0) b.requires_[static_cast<size_t>(v)] = is_floating(g.values[static_cast<size_t>(v)].dtype);
  }
}

/// The reverse pass over nodes [0, differentiated), in reverse topological order: each node with an output gradient
/// and an input that wants one runs its gradient rule. Throws InputError for a node without one.
void reverse_pass(StepBuilder& b, size_t differentiated) {
  const Graph& g = b.g();
  for (size_t k = differentiated; k-- > 0;) {
    const Node n = g.nodes[k];  // a copy: emitting appends to g.nodes
    bool has_dy = false, wants = false;
    for (int v : n.outputs) has_dy = has_dy || (v >= 0 && b.grad_.size() > static_cast<size_t>(v) && b.grad_[v] >= 0);
    for (int v : n.inputs) wants = wants || (v >= 0 && b.requires_[static_cast<size_t>(v)]);
    if (!has_dy || !wants) continue;
    const GradRule* rule = find_gradient(n.domain, n.op_type);
    if (!rule)
      throw InputError(
          fmt::format("--training: node '{}' ({}): no gradient rule for {}", n.name, n.op_type, n.op_type));
    b.differentiate(n, *rule);
  }
}

/// The values the optimizer update adds: per updated weight (in step.weights' order) its new value and, with
/// --shard-update, its update before the Identity; the optimizer state's new values in order.
struct Updates {
  std::vector<int> updated, update_shards, state;
};

/// The optimizer update, weight by weight: appends to step.weights (step.unused: weights without a gradient).
/// `forward_values`: the forward graph's value count (a gradient that is one of them gets an Identity of its own).
Updates update_weights(StepBuilder& b, const TrainingOptions& o, const std::vector<int>& weights, size_t forward_values,
                       TrainingStep& step) {
  Graph& g = b.g();
  b.prefix = "update";
  Updates u;
  std::unordered_set<int> own_grad;
  for (int w : weights) {
    int grad = static_cast<size_t>(w) < b.grad_.size() ? b.grad_[static_cast<size_t>(w)] : -1;
    const Value wv = g.values[static_cast<size_t>(w)];
    if (grad < 0) {
      step.unused.push_back(wv.name);
      continue;
    }
    // Each weight's gradient is a value of its own (two weights added together share one), so it can be named.
    if (!own_grad.insert(grad).second || static_cast<size_t>(grad) < forward_values) {
      grad = b.op("Identity", {grad});
      b.grad_[static_cast<size_t>(w)] = grad;
    }
    TrainingStep::Weight tw;
    tw.name = wv.name;
    const int lr = b.scalar(o.lr, wv.dtype);
    // A variable (a graph input) has its state as graph inputs too.
    const int update = autodiff::optimizer_update(b, o, wv, grad, wv.data != nullptr, !wv.is_initializer, tw, u.state);
    tw.state_reduced_dim.resize(tw.state.size(), -1);
    int updated = b.op("Sub", {w, b.op("Mul", {update, lr})});
    if (o.shard_update) {
      u.update_shards.push_back(updated);
      updated = b.op("Identity", {updated});
    }
    u.updated.push_back(updated);
    step.weights.push_back(std::move(tw));
  }
  if (step.weights.empty()) throw InputError("--training: no trainable weight reaches the loss");
  return u;
}

/// Readable names for what the step computes: "loss", "<w>.grad", "<w>.updated", "<w>.update_shard",
/// "<state>.updated", and each weight's partial gradient buffers (a forward value keeps its name).
void name_step_values(StepBuilder& b, const TrainingOptions& o, const Updates& u, int loss, size_t forward_values,
                      const std::map<int, std::vector<int>>& partial_grads, TrainingStep& step) {
  Graph& g = b.g();
  auto rename = [&](int v, const std::string& name) {
    if (static_cast<size_t>(v) < forward_values) return g.values[static_cast<size_t>(v)].name;
    std::string n = name;
    for (int k = 1; g.find(n) >= 0; ++k) n = fmt::format("{}_{}", name, k);
    g.rename(v, n);
    return n;
  };
  step.loss = rename(loss, "loss");
  size_t s = 0;
  for (size_t k = 0; k < step.weights.size(); ++k) {
    TrainingStep::Weight& tw = step.weights[k];
    tw.grad = rename(b.grad_[static_cast<size_t>(g.find(tw.name))], tw.name + ".grad");
    tw.updated = rename(u.updated[k], tw.name + ".updated");
    if (o.shard_update) tw.update_shard = rename(u.update_shards[k], tw.name + ".update_shard");
    for (const std::string& st : tw.state) tw.state_updated.push_back(rename(u.state[s++], st + ".updated"));
  }
  for (TrainingStep::Weight& tw : step.weights)
    if (auto it = partial_grads.find(g.at(tw.name)); it != partial_grads.end())
      for (int v : it->second) tw.partial_grads.push_back(g.values[static_cast<size_t>(v)].name);
}

}  // namespace

TrainingStep build_training_step(Graph forward, const TrainingOptions& o, const ShapeFunction& shapes) {
  StepBuilder b(std::move(forward), shapes);
  Graph& g = b.g();
  const size_t forward_values = g.values.size();

  // Trainable weights, and which forward values depend on them (requires grad).
  const std::vector<int> weights = trainable_weights(g, o);
  b.requires_.assign(forward_values, false);
  for (int w : weights) b.requires_[static_cast<size_t>(w)] = true;
  mark_requires(b, 0);
  const size_t forward_nodes = g.nodes.size();
  for (size_t k = 0; k < forward_nodes; ++k)  // before the reverse pass and --remat's choice of saved values
    if (std::any_of(g.nodes[k].inputs.begin(), g.nodes[k].inputs.end(),
                    [&](int v) { return v >= 0 && b.requires_[static_cast<size_t>(v)]; }))
      b.add_saved_outputs(k);
  mark_requires(b, 0);  // the added outputs depend on the weights like their nodes' others
  const int model_output = g.outputs.empty() ? -1 : g.outputs[0];
  int loss = autodiff::build_loss(b, o);
  mark_requires(b, forward_nodes);  // the loss's nodes are differentiated like any node
  const Value lv = g.values[static_cast<size_t>(loss)];
  if (!b.requires_[static_cast<size_t>(loss)]) throw InputError("--training: no trainable weight reaches the loss");
  const std::vector<int> data =
      o.accumulate > 1 ? microbatched_inputs(g, o, model_output, weights) : std::vector<int>();
  // A mean over the step's batch is the mean of the microbatches' means: each backward pass is seeded with 1/K.
  const double loss_scale = o.accumulate > 1 && o.loss != LossKind::kSum ? 1.0 / static_cast<double>(o.accumulate) : 1;
  const size_t differentiated = g.nodes.size();
  if (o.remat != RematPolicy::kNone) {
    b.saved_ = autodiff::remat_saved(g, differentiated, b.requires_, o.remat, o.remat_keep);
    b.recomputed_.assign(g.values.size(), -1);
  }
  b.grad_.assign(g.values.size(), -1);
  b.grad_[static_cast<size_t>(loss)] = b.reshape(b.scalar(loss_scale, lv.dtype), lv.shape);
  reverse_pass(b, differentiated);

  TrainingStep step;
  step.accumulate = o.accumulate;
  std::map<int, std::vector<int>> partial_grads;  // per weight, named once the step is complete
  if (o.accumulate > 1)
    loss = unroll_microbatches(b, o, weights, differentiated, loss, data, loss_scale, step, partial_grads);

  const Updates u = update_weights(b, o, weights, forward_values, step);
  g.outputs = {loss};
  g.outputs.insert(g.outputs.end(), u.updated.begin(), u.updated.end());
  g.outputs.insert(g.outputs.end(), u.state.begin(), u.state.end());
  if (o.accumulate <= 1) fold_transposes(g, differentiated, o.remat == RematPolicy::kNone);
  name_step_values(b, o, u, loss, forward_values, partial_grads, step);

  const size_t nodes = g.nodes.size();
  g.prune();
  g.verify();
  if (step.forward_ranges.empty())
    step.forward_ranges = {{0, g.values[static_cast<size_t>(g.at(step.loss))].producer + 1}};
  else if (g.nodes.size() != nodes)  // the unrolled step emits only nodes the loss or a gradient needs
    throw InternalError("--accumulate: the accumulated step had unused nodes, which its forward ranges count");
  step.remat = o.remat;
  step.ignored = o.ignored;
  for (const Node& n : g.nodes)
    if (n.name.starts_with(autodiff::kRematPrefix)) {
      ++step.recomputed_nodes;
      step.recomputed_flops += node_flops(g, n);
    }
  step.graph = std::move(g);
  return step;
}

MemoryRoles training_memory_roles(const Graph& g, const TrainingStep& step) {
  MemoryRoles r;
  r.kind.assign(g.values.size(), MemoryKind::kTransient);
  r.donated.assign(g.values.size(), 0);
  r.forward_ranges = step.forward_ranges;
  const auto set = [&](const std::string& name, MemoryKind k, bool donated = false) {
    if (name.empty()) return;
    const size_t v = static_cast<size_t>(g.at(name));
    r.kind[v] = k;
    r.donated[v] = donated;
  };
  for (const TrainingStep::Weight& w : step.weights)
    for (const std::string& name : w.partial_grads) {
      set(name, MemoryKind::kGradients);
      r.partial.resize(g.values.size(), 0);
      r.partial[static_cast<size_t>(g.at(name))] = 1;
    }
  for (const TrainingStep::Weight& w : step.weights) {
    set(w.name, MemoryKind::kWeights, true);
    set(w.updated, MemoryKind::kWeights);
    set(w.update_shard, MemoryKind::kWeights);
    set(w.grad, MemoryKind::kGradients);
    for (const std::string& s : w.state) set(s, MemoryKind::kOptimizerState, true);
    for (const std::string& s : w.state_updated) set(s, MemoryKind::kOptimizerState);
  }
  return r;
}

}  // namespace gspmd
