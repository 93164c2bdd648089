// The training-step builder (core/autodiff/autodiff.h): loss, reverse pass over the gradient rules, optimizer.
#include "core/autodiff/autodiff.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "core/autodiff/accumulate.h"
#include "core/ir/cuts.h"
#include "core/ir/typing.h"
#include "core/rules/gradient.h"

namespace gspmd {
namespace {

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

/// The loss (a scalar) from output 0, per options.loss.
int build_loss(StepBuilder& b, const TrainingOptions& o) {
  Graph& g = b.g();
  if (g.outputs.empty()) throw InputError("--training: the model has no output");
  int out = g.outputs[0];
  Value y = g.values.at(static_cast<size_t>(out));  // a copy: emitting appends to g.values
  if (!is_floating(y.dtype))
    throw InputError(fmt::format("--training: output 0 '{}' is {}, not floating point", y.name, dtype_name(y.dtype)));
  if (y.dtype == DType::kFloat16 || y.dtype == DType::kBFloat16) {  // the loss in float32, as torch's autocast
    out = b.cast(out, DType::kFloat32);
    y.dtype = DType::kFloat32;
  }
  const auto all_axes = [&](int v) {
    std::vector<int64_t> axes;
    for (size_t d = 0; d < b.value(v).shape.size(); ++d) axes.push_back(static_cast<int64_t>(d));
    return axes;
  };
  switch (o.loss) {
    case LossKind::kOutput:
      if (num_elements(y.shape) != 1)
        throw InputError(
            fmt::format("--training: output 0 '{}' is {}, not a scalar: choose --loss mean, sum or "
                        "cross-entropy:LABELS",
                        y.name, type_str(y.dtype, y.shape)));
      return out;
    case LossKind::kSum: return b.reduce_sum(out, all_axes(out), false);
    case LossKind::kMean: {
      const int s = b.reduce_sum(out, all_axes(out), false);
      return b.op("Div", {s, b.scalar(static_cast<double>(num_elements(y.shape)), y.dtype)});
    }
    case LossKind::kCrossEntropy: {
      if (y.shape.empty())
        throw InputError(fmt::format("--loss cross-entropy: output 0 '{}' is a scalar, not logits", y.name));
      const Shape logits_shape = y.shape;
      const DType dt = y.dtype;
      const int64_t classes = logits_shape.back();
      const Shape label_shape(logits_shape.begin(), logits_shape.end() - 1);
      int labels = g.find(o.labels);
      if (labels < 0) {
        labels =
            g.add_value(Value{o.labels, ValueKind::kTensor, DType::kInt64, label_shape, -1, false, nullptr, nullptr});
        g.inputs.push_back(labels);
      } else {
        const Value& l = g.values.at(static_cast<size_t>(labels));
        const bool integer = l.dtype == DType::kInt64 || l.dtype == DType::kInt32;
        if (!integer || l.shape != label_shape)
          throw InputError(fmt::format(
              "--loss cross-entropy:{}: the labels are {}, not int64 or int32 {} (output 0 '{}' is {})", o.labels,
              type_str(l.dtype, l.shape), shape_str(label_shape), y.name, type_str(dt, logits_shape)));
      }
      const int64_t last = static_cast<int64_t>(logits_shape.size()) - 1;
      const int logp = b.op("LogSoftmax", {out}, {{"axis", last}});
      const int onehot = b.one_hot(labels, classes, -1, dt);
      const int picked = b.reduce_sum(b.op("Mul", {logp, onehot}), {last}, false);
      const int total = b.reduce_sum(picked, all_axes(picked), false);
      return b.op("Div", {total, b.scalar(-static_cast<double>(num_elements(label_shape)), dt)});
    }
  }
  return -1;
}

/// Folds Transposes into the Einsums the step emitted (nodes from `first`), as XLA folds transposes into dots: an
/// Einsum whose result only a Transpose reads computes the transposed result itself (its output labels permuted),
/// and an Einsum reading a Transpose's result reads the Transpose's input (that operand's labels permuted): an
/// emitted Transpose's, or with `forward_too` (no --remat: every forward value is kept anyway) a forward one's. A
/// Transpose left without readers is dropped by the final prune. Equations are the explicit, ellipsis-free ones the
/// gradient rules emit. O(nodes + edges).
void fold_transposes(Graph& g, size_t first, bool forward_too) {
  std::vector<int> uses(g.values.size(), 0);
  for (const Node& n : g.nodes)
    for (int v : n.inputs)
      if (v >= 0) ++uses[static_cast<size_t>(v)];
  for (int v : g.outputs) ++uses[static_cast<size_t>(v)];
  auto perm_of = [&](const Node& t) {
    std::vector<int64_t> perm = t.ints("perm");
    if (perm.empty())
      for (size_t d = g.values[static_cast<size_t>(t.inputs[0])].shape.size(); d-- > 0;)
        perm.push_back(static_cast<int64_t>(d));
    return perm;
  };
  auto is_transpose = [&](int p) {
    return p >= (forward_too ? 0 : static_cast<int>(first)) && g.nodes[static_cast<size_t>(p)].op_type == "Transpose" &&
           g.nodes[static_cast<size_t>(p)].domain.empty() && !g.nodes[static_cast<size_t>(p)].outputs.empty();
  };
  for (size_t k = first; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    if (!n.domain.empty()) continue;
    if (n.op_type == "Transpose" && !n.outputs.empty()) {  // Einsum -> Transpose: one Einsum
      const int x = n.inputs[0];
      const int p = g.values[static_cast<size_t>(x)].producer;
      if (p < static_cast<int>(first) || uses[static_cast<size_t>(x)] != 1) continue;
      Node& e = g.nodes[static_cast<size_t>(p)];
      if (e.op_type != "Einsum" || !e.domain.empty()) continue;
      const std::string eq = e.s("equation");
      const size_t arrow = eq.find("->");
      const std::string out = eq.substr(arrow + 2);
      std::string permuted;
      for (int64_t d : perm_of(n)) permuted += out[static_cast<size_t>(d)];
      e.attrs["equation"] = eq.substr(0, arrow + 2) + permuted;
      e.outputs[0] = n.outputs[0];
      g.values[static_cast<size_t>(n.outputs[0])].producer = p;
      uses[static_cast<size_t>(x)] = 0;
      n.inputs.clear();  // dropped by prune (no outputs)
      n.outputs.clear();
    } else if (n.op_type == "Einsum") {  // Transpose -> Einsum: the Einsum reads the Transpose's input
      const std::string eq = n.s("equation");
      const size_t arrow = eq.find("->");
      std::vector<std::string> terms;
      for (size_t b = 0, e; b <= arrow; b = e + 1) {
        e = std::min(eq.find(',', b), arrow);
        terms.push_back(eq.substr(b, e - b));
      }
      bool changed = false;
      for (size_t i = 0; i < n.inputs.size() && i < terms.size(); ++i) {
        for (int y = n.inputs[i]; y >= 0 && is_transpose(g.values[static_cast<size_t>(y)].producer); y = n.inputs[i]) {
          const Node& t = g.nodes[static_cast<size_t>(g.values[static_cast<size_t>(y)].producer)];
          const std::vector<int64_t> perm = perm_of(t);
          std::string x_term(terms[i].size(), ' ');
          for (size_t d = 0; d < perm.size(); ++d) x_term[static_cast<size_t>(perm[d])] = terms[i][d];
          terms[i] = x_term;
          --uses[static_cast<size_t>(y)];
          n.inputs[i] = t.inputs[0];
          ++uses[static_cast<size_t>(n.inputs[i])];
          changed = true;
        }
      }
      if (!changed) continue;
      std::string lhs;
      for (const std::string& t : terms) lhs += (lhs.empty() ? "" : ",") + t;
      n.attrs["equation"] = lhs + eq.substr(arrow);
    }
  }
}

/// --remat: which values of `g` (forward nodes [0, forward_nodes) with the loss) the backward pass reads as they are
/// (RematPolicy): the results of the cut points over the weight-dependent values (core/ir/cuts.h). O(nodes + edges).
std::vector<char> remat_saved(const Graph& g, size_t forward_nodes, const std::vector<bool>& needs_grad,
                              RematPolicy policy, const std::vector<std::string>& keep) {
  static const std::unordered_set<std::string> kNondeterministic = {
      "Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"};
  static const std::unordered_set<std::string> kContractions = {
      "MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "FusedMatMul", "MatMulInteger", "ConvInteger"};
  std::vector<char> saved(g.values.size(), 1);
  std::vector<char> kept(g.values.size(), 0);
  for (const std::string& name : keep)
    if (const int v = g.find(name); v >= 0) kept[static_cast<size_t>(v)] = 1;
  const auto recomputable = [&](int v) {
    return v >= 0 && static_cast<size_t>(v) < needs_grad.size() && needs_grad[static_cast<size_t>(v)] &&
           g.values[static_cast<size_t>(v)].producer >= 0 && !kept[static_cast<size_t>(v)];
  };
  const std::vector<char> cut = cut_points(g, forward_nodes, recomputable, /*graph_outputs_read=*/false);
  for (size_t i = 0; i < forward_nodes; ++i) {
    const Node& n = g.nodes[i];
    const bool keep = cut[i] || kNondeterministic.count(n.op_type) ||
                      (policy == RematPolicy::kDots && kContractions.count(n.op_type));
    for (int v : n.outputs)
      if (recomputable(v) && !keep) saved[static_cast<size_t>(v)] = 0;
  }
  return saved;
}

/// Adafactor's update U of weight `w` (what lr multiplies) from its gradient `grad`, one step (t = o.step):
/// Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", as HF transformers'
/// `Adafactor(scale_parameter=False, relative_step=False, warmup_init=False, beta1=None)` computes it (factored over
/// the last two dims, clip_threshold 1, decay_rate -0.8, eps[0] = o.eps; docs/training.md):
///   G = g^2 + eps;  beta2_t = 1 - t^-0.8
///   rank >= 2:  R = beta2_t R + (1-beta2_t) mean_{-1}(G);  C = beta2_t C + (1-beta2_t) mean_{-2}(G)
///               U = g * rsqrt(R / mean_{-1}(R))[..., :, None] * rsqrt(C)[..., None, :]
///   otherwise:  V = beta2_t V + (1-beta2_t) G;  U = g * rsqrt(V)
///   U = U / max(1, RMS(U) / 1.0)
/// The accumulators (zeros before the step) are added to `tw` and their new values to `state_outputs`.
/// The dtype of an adaptive optimizer's state and arithmetic for a weight of dtype `t`: float32 for 16-bit floats,
/// as mixed-precision training keeps its optimizer math in float32 (HF's Adafactor casts the gradient to float32;
/// in float16 the default epsilons, 1e-8 and 1e-30, are 0 and a zero gradient's update is 0/0).
DType optimizer_dtype(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16 ? DType::kFloat32 : t; }

int adafactor_update(StepBuilder& b, const TrainingOptions& o, const Value& w, int grad16, bool data, bool variable,
                     TrainingStep::Weight& tw, std::vector<int>& state_outputs) {
  constexpr double kDecayRate = 0.8, kClipThreshold = 1.0;
  const DType dt = optimizer_dtype(w.dtype);
  const int grad = b.cast(grad16, dt);
  const double beta2 = 1 - std::pow(static_cast<double>(o.step), -kDecayRate);
  const auto mean = [&](int v, int64_t axis, bool keepdims) {
    const int64_t n = b.value(v).shape.at(static_cast<size_t>(axis));
    return b.op("Div", {b.reduce_sum(v, {axis}, keepdims), b.scalar(static_cast<double>(n), dt)});
  };
  const auto average = [&](int state, int fresh) {  // beta2_t * state + (1 - beta2_t) * fresh
    return b.op("Add", {b.op("Mul", {state, b.scalar(beta2, dt)}), b.op("Mul", {fresh, b.scalar(1 - beta2, dt)})});
  };
  const auto rsqrt = [&](int v) { return b.op("Reciprocal", {b.op("Sqrt", {v})}); };
  const auto state = [&](const std::string& suffix, Shape shape, int reduced_dim) {
    Value like = w;
    like.shape = std::move(shape);
    like.dtype = dt;
    const int s = b.state_like(w.name + suffix, like, data, variable);
    tw.state.push_back(b.value(s).name);
    tw.state_reduced_dim.push_back(reduced_dim);
    return s;
  };
  const int g2 = b.op("Add", {b.op("Mul", {grad, grad}), b.scalar(o.eps, dt)});
  int update = -1;
  const int64_t rank = static_cast<int64_t>(w.shape.size());
  if (rank >= 2) {
    Shape row_shape(w.shape.begin(), w.shape.end() - 1), col_shape = w.shape;
    col_shape.erase(col_shape.end() - 2);
    const int r = state(".adafactor_row", row_shape, static_cast<int>(rank - 1));
    const int c = state(".adafactor_col", col_shape, static_cast<int>(rank - 2));
    const int r1 = average(r, mean(g2, rank - 1, false)), c1 = average(c, mean(g2, rank - 2, false));
    state_outputs.push_back(r1);
    state_outputs.push_back(c1);
    Shape r_unsq = row_shape, c_unsq = col_shape;  // [..., n, 1] and [..., 1, m]
    r_unsq.push_back(1);
    c_unsq.insert(c_unsq.end() - 1, 1);
    const int r_factor = b.reshape(rsqrt(b.op("Div", {r1, mean(r1, rank - 2, true)})), r_unsq);
    const int c_factor = b.reshape(rsqrt(c1), c_unsq);
    update = b.op("Mul", {b.op("Mul", {grad, r_factor}), c_factor});
  } else {
    const int v = state(".adafactor_v", w.shape, -1);
    const int v1 = average(v, g2);
    state_outputs.push_back(v1);
    update = b.op("Mul", {grad, rsqrt(v1)});
  }
  std::vector<int64_t> all(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) all[static_cast<size_t>(d)] = d;
  const int mean_sq = b.op("Div", {b.reduce_sum(b.op("Mul", {update, update}), all, false),
                                   b.scalar(static_cast<double>(num_elements(w.shape)), dt)});
  const int clip =
      b.op("Max", {b.op("Div", {b.op("Sqrt", {mean_sq}), b.scalar(kClipThreshold, dt)}), b.scalar(1.0, dt)});
  return b.cast(b.op("Div", {update, clip}), w.dtype);
}

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

}  // namespace

TrainingStep build_training_step(Graph forward, const TrainingOptions& o, const ShapeFunction& shapes) {
  StepBuilder b(std::move(forward), shapes);
  Graph& g = b.g();
  const size_t forward_values = g.values.size();

  // Trainable weights, and which forward values depend on them (requires grad).
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
  // requires_[v]: v is floating point and computed from a weight. Marked for nodes [from, end), in order.
  auto mark = [&](size_t from) {
    b.requires_.resize(g.values.size(), false);
    for (size_t k = from; k < g.nodes.size(); ++k) {
      bool any = false;
      for (int v : g.nodes[k].inputs) any = any || (v >= 0 && b.requires_[static_cast<size_t>(v)]);
      if (!any) continue;
      for (int v : g.nodes[k].outputs)
        if (v >= 0) b.requires_[static_cast<size_t>(v)] = is_floating(g.values[static_cast<size_t>(v)].dtype);
    }
  };
  b.requires_.assign(forward_values, false);
  for (int w : weights) b.requires_[static_cast<size_t>(w)] = true;
  mark(0);
  const size_t forward_nodes = g.nodes.size();
  for (size_t k = 0; k < forward_nodes; ++k)  // before the reverse pass and --remat's choice of saved values
    if (std::any_of(g.nodes[k].inputs.begin(), g.nodes[k].inputs.end(),
                    [&](int v) { return v >= 0 && b.requires_[static_cast<size_t>(v)]; }))
      b.add_saved_outputs(k);
  mark(0);  // the added outputs depend on the weights like their nodes' others
  const int model_output = g.outputs.empty() ? -1 : g.outputs[0];
  int loss = build_loss(b, o);
  mark(forward_nodes);  // the loss's nodes are differentiated like any node
  const Value lv = g.values[static_cast<size_t>(loss)];
  if (!b.requires_[static_cast<size_t>(loss)]) throw InputError("--training: no trainable weight reaches the loss");
  const std::vector<int> data =
      o.accumulate > 1 ? microbatched_inputs(g, o, model_output, weights) : std::vector<int>();
  // A mean over the step's batch is the mean of the microbatches' means: each backward pass is seeded with 1/K.
  const double loss_scale = o.accumulate > 1 && o.loss != LossKind::kSum ? 1.0 / static_cast<double>(o.accumulate) : 1;
  const size_t differentiated = g.nodes.size();
  if (o.remat != RematPolicy::kNone) {
    b.saved_ = remat_saved(g, differentiated, b.requires_, o.remat, o.remat_keep);
    b.recomputed_.assign(g.values.size(), -1);
  }
  b.grad_.assign(g.values.size(), -1);
  b.grad_[static_cast<size_t>(loss)] = b.reshape(b.scalar(loss_scale, lv.dtype), lv.shape);

  // The reverse pass: nodes in reverse topological order; the copies of g.nodes stay valid while emit appends.
  for (size_t k = differentiated; k-- > 0;) {
    const Node n = g.nodes[k];
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

  TrainingStep step;
  step.accumulate = o.accumulate;
  std::map<int, std::vector<int>> partial_grads;  // per weight, named once the step is complete
  if (o.accumulate > 1)
    loss = unroll_microbatches(b, o, weights, differentiated, loss, data, loss_scale, step, partial_grads);

  // The optimizer update, weight by weight.
  b.prefix = "update";
  std::vector<int> outputs{loss};
  std::vector<int> state_outputs;
  std::unordered_set<int> own_grad;
  std::vector<int> update_shards;  // shard_update: per weight, the update before the Identity
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
    const bool data = wv.data != nullptr;
    const bool variable = !wv.is_initializer;  // a graph input: its state is an input too
    const DType dt = wv.dtype;
    const int lr = b.scalar(o.lr, dt);
    int update = grad;  // what lr multiplies
    switch (o.optimizer) {
      case OptimizerKind::kSgd: break;
      case OptimizerKind::kMomentum: {
        const int v = b.state_like(wv.name + ".momentum", wv, data, variable);
        const int v1 = b.op("Add", {b.op("Mul", {v, b.scalar(o.momentum, dt)}), grad});
        tw.state.push_back(g.values[static_cast<size_t>(v)].name);
        state_outputs.push_back(v1);
        update = v1;
        break;
      }
      case OptimizerKind::kAdam: {
        const DType ct = optimizer_dtype(dt);
        Value like = wv;
        like.dtype = ct;
        const int gc = b.cast(grad, ct);
        const int m = b.state_like(wv.name + ".adam_m", like, data, variable);
        const int v = b.state_like(wv.name + ".adam_v", like, data, variable);
        const int m1 =
            b.op("Add", {b.op("Mul", {m, b.scalar(o.beta1, ct)}), b.op("Mul", {gc, b.scalar(1 - o.beta1, ct)})});
        const int g2 = b.op("Mul", {gc, gc});
        const int v1 =
            b.op("Add", {b.op("Mul", {v, b.scalar(o.beta2, ct)}), b.op("Mul", {g2, b.scalar(1 - o.beta2, ct)})});
        const double t = static_cast<double>(o.step);
        const int mhat = b.op("Div", {m1, b.scalar(1 - std::pow(o.beta1, t), ct)});
        const int vhat = b.op("Div", {v1, b.scalar(1 - std::pow(o.beta2, t), ct)});
        update = b.cast(b.op("Div", {mhat, b.op("Add", {b.op("Sqrt", {vhat}), b.scalar(o.eps, ct)})}), dt);
        tw.state = {g.values[static_cast<size_t>(m)].name, g.values[static_cast<size_t>(v)].name};
        state_outputs.push_back(m1);
        state_outputs.push_back(v1);
        break;
      }
      case OptimizerKind::kAdafactor:
        update = adafactor_update(b, o, wv, grad, data, variable, tw, state_outputs);
        break;
    }
    tw.state_reduced_dim.resize(tw.state.size(), -1);
    int updated = b.op("Sub", {w, b.op("Mul", {update, lr})});
    if (o.shard_update) {
      update_shards.push_back(updated);
      updated = b.op("Identity", {updated});
    }
    outputs.push_back(updated);
    step.weights.push_back(std::move(tw));
  }
  if (step.weights.empty()) throw InputError("--training: no trainable weight reaches the loss");
  outputs.insert(outputs.end(), state_outputs.begin(), state_outputs.end());
  g.outputs = outputs;
  if (o.accumulate <= 1) fold_transposes(g, differentiated, o.remat == RematPolicy::kNone);

  // Readable names for what the step computes: "loss", "<w>.grad", "<w>.updated", "<state>.updated" (a forward
  // value keeps its name).
  auto rename = [&](int v, const std::string& name) {
    if (static_cast<size_t>(v) < forward_values) return g.values[static_cast<size_t>(v)].name;
    std::string n = name;
    for (int k = 1; g.find(n) >= 0; ++k) n = fmt::format("{}_{}", name, k);
    g.rename(v, n);
    return n;
  };
  step.loss = rename(loss, "loss");
  size_t s = 0;
  for (auto& tw : step.weights) {
    tw.grad = rename(b.grad_[static_cast<size_t>(g.find(tw.name))], tw.name + ".grad");
    const size_t k = static_cast<size_t>(&tw - step.weights.data());
    tw.updated = rename(outputs[1 + k], tw.name + ".updated");
    if (o.shard_update) tw.update_shard = rename(update_shards[k], tw.name + ".update_shard");
    for (const std::string& st : tw.state) tw.state_updated.push_back(rename(state_outputs[s++], st + ".updated"));
  }
  for (TrainingStep::Weight& tw : step.weights)
    if (auto it = partial_grads.find(g.at(tw.name)); it != partial_grads.end())
      for (int v : it->second) tw.partial_grads.push_back(g.values[static_cast<size_t>(v)].name);
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
    if (n.name.starts_with(kRematPrefix)) {
      ++step.recomputed_nodes;
      step.recomputed_flops += node_flops(g, n);
    }
  step.graph = std::move(g);
  return step;
}

std::string_view remat_name(RematPolicy p) {
  switch (p) {
    case RematPolicy::kNone: return "none";
    case RematPolicy::kFull: return "full";
    case RematPolicy::kDots: return "dots";
  }
  return "none";
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
