// The training step's builder (core/autodiff, private to the module): the graph under construction and the
// GradContext the gradient rules see, and the step's parts built over it: the loss (losses.cc), the optimizer
// update (optimizers.cc) and rematerialization's choice of saved values (remat.cc). build_training_step
// (autodiff.cc) runs them in order.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/autodiff/autodiff.h"
#include "core/ir/typing.h"
#include "core/rules/gradient.h"

namespace gspmd::autodiff {

/// The name prefix of the forward nodes the backward pass recomputes under --remat ("remat/<node>"), by which the
/// step counts them.
constexpr std::string_view kRematPrefix = "remat/";

/// The graph under construction and the GradContext the rules see.
class StepBuilder final : public GradContext {
 public:
  StepBuilder(Graph g, const ShapeFunction& shapes) : g_(std::move(g)), shapes_(shapes) {}

  Graph& g() { return g_; }
  /// Continues on `g` (the accumulated step): g() refers to it; value ids of the old graph that `g` keeps stay valid.
  void replace_graph(Graph g) { g_ = std::move(g); }
  const Node& node() const override { return *node_; }
  const Graph& graph() const override { return g_; }

  int dy(size_t k) override {
    const int v = node_->outputs.at(k);
    return v >= 0 && static_cast<size_t>(v) < grad_.size() ? grad_[static_cast<size_t>(v)] : -1;
  }
  bool wants(size_t i) const override {
    const int v = i < node_->inputs.size() ? node_->inputs[i] : -1;
    return v >= 0 && static_cast<size_t>(v) < requires_.size() && requires_[static_cast<size_t>(v)];
  }
  int activation(int v) override {
    if (v < 0 || static_cast<size_t>(v) >= saved_.size() || saved_[static_cast<size_t>(v)]) return v;
    if (recomputed_[static_cast<size_t>(v)] >= 0) return recomputed_[static_cast<size_t>(v)];
    // A copy of v's producer, reading the saved or recomputed copies of its inputs; its outputs typed as the
    // originals (the same computation).
    Node copy = g_.nodes.at(static_cast<size_t>(g_.values[static_cast<size_t>(v)].producer));
    for (int& in : copy.inputs) in = activation(in);
    copy.name = std::string(kRematPrefix) + copy.name;
    for (int& o : copy.outputs) {
      if (o < 0) continue;
      const Value val = g_.values[static_cast<size_t>(o)];
      const int r = g_.add_value_unique(val.name + ".remat", val.dtype, val.shape);
      recomputed_[static_cast<size_t>(o)] = r;
      o = r;
    }
    g_.add_node(std::move(copy));
    return recomputed_[static_cast<size_t>(v)];
  }
  void set_dx(size_t i, int grad) override {
    const int v = i < node_->inputs.size() ? node_->inputs[i] : -1;
    if (v < 0) throw InternalError(fmt::format("gradient of node '{}': input {} is absent", node_->name, i));
    accumulate(v, grad, fmt::format("gradient of node '{}' ({}) input {}", node_->name, node_->op_type, i));
  }

  std::vector<int> emit_in(const std::string& domain, const std::string& op, const std::vector<int>& inputs,
                           const std::map<std::string, AttrValue>& attrs, size_t num_outputs) override {
    Node n;
    n.name = fresh_name(op);
    n.domain = domain;
    n.op_type = op;
    n.inputs = inputs;
    n.attrs = attrs;
    const std::vector<TensorType> out = types_of(n, "emitted");
    if (out.size() < num_outputs)
      throw InternalError(fmt::format("{}: emitted node '{}' ({}) has {} outputs, not {}", where(), n.name, op,
                                      out.size(), num_outputs));
    for (size_t k = 0; k < num_outputs; ++k)
      n.outputs.push_back(g_.add_value_unique(n.name + ":" + std::to_string(k), out[k].dtype, out[k].shape));
    const std::vector<int> ids = n.outputs;
    g_.add_node(std::move(n));
    return ids;
  }

  /// The output types of node `n` (its inputs are values of the graph) by the shape function; throws
  /// InternalError naming the node (`what` it is) when the function rejects it.
  std::vector<TensorType> types_of(const Node& n, std::string_view what) const {
    try {
      return node_types(g_, n, shapes_);
    } catch (const std::exception& e) {
      throw InternalError(fmt::format("{}: {} node '{}' ({}): {}", where(), what, n.name, n.op_type, e.what()));
    }
  }

  /// Gives forward node `k` the outputs its gradient rule reads beyond the model's (SavedOutputs, gradient.h),
  /// named "<node>:<output index>".
  void add_saved_outputs(size_t k) {
    Node& n = g_.nodes[k];
    const SavedOutputs* saved = find_saved_outputs(n.domain, n.op_type);
    const size_t want = saved ? (*saved)(g_, n) : 0;
    bool missing = false;
    for (size_t o = 0; o < want; ++o) missing = missing || o >= n.outputs.size() || n.outputs[o] < 0;
    if (!missing) return;
    Node typed = n;
    typed.outputs.resize(std::max(want, n.outputs.size()), 0);
    const std::vector<TensorType> types = types_of(typed, "forward");
    if (types.size() < want) return;  // the shape function gives fewer: keep the model's outputs
    n.outputs.resize(typed.outputs.size(), -1);
    for (size_t o = 0; o < want; ++o) {
      if (n.outputs[o] >= 0) continue;
      n.outputs[o] = g_.add_value_unique(fmt::format("{}:{}", n.name, o), types[o].dtype, types[o].shape);
      g_.values[static_cast<size_t>(n.outputs[o])].producer = static_cast<int>(k);
    }
  }

  int constant(const Tensor& t) override {
    // Small constants (scalars, axes, shapes) are shared by value: the backward pass asks for the same few many
    // times, and every value costs propagation and partitioning.
    std::string key;
    if (t.nbytes() <= 64) {
      key = fmt::format("{}:{}:", static_cast<int>(t.dtype), shape_str(t.shape));
      key.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
      auto it = constants_.find(key);
      if (it != constants_.end()) return it->second;
    }
    const int id = initializer(fresh_name("const"), t.dtype, t.shape, std::make_shared<const Tensor>(t));
    if (!key.empty()) constants_.emplace(std::move(key), id);
    return id;
  }

  /// Optimizer state named `name` of `like`'s type for a weight: an initializer of zeros when `with_data`, else
  /// shapes only; a new graph input (after the others) when the weight is a variable (a graph input).
  int state_like(const std::string& name, const Value& like, bool with_data, bool variable) {
    if (variable) {
      const int id = g_.add_value_unique(name, like.dtype, like.shape);
      g_.inputs.push_back(id);
      return id;
    }
    return initializer(name, like.dtype, like.shape,
                       with_data ? std::make_shared<const Tensor>(Tensor(like.dtype, like.shape)) : nullptr);
  }

  /// Gives the value `v` the extra gradient `grad` (summed with what it has).
  void accumulate(int v, int grad, const std::string& what) {
    const Value& x = g_.values.at(static_cast<size_t>(v));
    const Value& gv = g_.values.at(static_cast<size_t>(grad));
    if (gv.dtype != x.dtype || gv.shape != x.shape)
      throw InternalError(fmt::format("{}: is {}, the value '{}' is {}", what, type_str(gv.dtype, gv.shape), x.name,
                                      type_str(x.dtype, x.shape)));
    if (grad_.size() < g_.values.size()) grad_.resize(g_.values.size(), -1);
    int& slot = grad_[static_cast<size_t>(v)];
    slot = slot < 0 ? grad : op("Add", {slot, grad});
  }

  /// Runs node `n`'s gradient rule.
  void differentiate(const Node& n, const GradRule& rule) {
    node_ = &n;
    rule(*this);
    node_ = nullptr;
  }

  std::vector<bool> requires_;   // per forward value: on a path from a trainable weight (and floating point)
  std::vector<int> grad_;        // per value: its gradient's value id, or -1
  std::vector<char> saved_;      // --remat: per forward value, whether the backward pass reads it as is (empty: all)
  std::vector<int> recomputed_;  // --remat: per forward value, its recomputed copy, or -1
  std::string prefix = "grad";   // name prefix of emitted nodes

 private:
  std::string where() const {
    return node_ ? fmt::format("gradient of node '{}' ({})", node_->name, node_->op_type)
                 : std::string("training step");
  }
  /// "<prefix>/<node>/<what>_<k>": unique within the step's nodes (values go through add_value_unique).
  std::string fresh_name(const std::string& what) {
    return fmt::format("{}/{}/{}_{}", prefix, node_ ? node_->name : "step", what, ++counter_);
  }
  /// A new initializer named `hint` (made unique) holding `data` (null: shapes only).
  int initializer(const std::string& hint, DType t, const Shape& s, std::shared_ptr<const Tensor> data) {
    const int id = g_.add_value_unique(hint, t, s);
    g_.values[static_cast<size_t>(id)].is_initializer = true;
    g_.values[static_cast<size_t>(id)].data = std::move(data);
    return id;
  }

  Graph g_;
  const ShapeFunction& shapes_;
  const Node* node_ = nullptr;
  int64_t counter_ = 0;
  std::unordered_map<std::string, int> constants_;  // small constants by dtype, shape and bytes
};

/// The loss (a scalar value of `b`'s graph) from output 0, per `o.loss` (LossKind); emits its nodes. Throws InputError
/// (naming the output, its type and the labels) when output 0 cannot form that loss. losses.cc.
int build_loss(StepBuilder& b, const TrainingOptions& o);

/// The update of weight `w` (what the learning rate multiplies) from its gradient `grad`, per `o.optimizer`
/// (OptimizerKind, following torch.optim and HF transformers' Adafactor). The optimizer's state values (zeros before
/// the step; shapes only unless `data`; graph inputs when `variable`) are added to `tw.state` and their new values to
/// `state_outputs`, in that order. optimizers.cc.
int optimizer_update(StepBuilder& b, const TrainingOptions& o, const Value& w, int grad, bool data, bool variable,
                     TrainingStep::Weight& tw, std::vector<int>& state_outputs);

/// --remat: which values of `g` (forward nodes [0, forward_nodes) with the loss) the backward pass reads as they are
/// (RematPolicy): the results of the cut points over the weight-dependent values (core/ir/cuts.h); contraction outputs
/// too under kDots; nondeterministic ops' outputs always; the values named in `keep` always. Per value, 1 = saved.
/// O(nodes + edges). remat.cc.
std::vector<char> remat_saved(const Graph& g, size_t forward_nodes, const std::vector<bool>& needs_grad,
                              RematPolicy policy, const std::vector<std::string>& keep);

}  // namespace gspmd::autodiff
