// Layer blocks vectorized over a leading stage dim (core/pipeline/vectorize.h).
#include "core/pipeline/vectorize.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/ir/name_pattern.h"
#include "core/ir/typing.h"

namespace gspmd {
namespace {

/// Ops that compute each element from the same elements of their operands (numpy broadcasting): a stage-stacked
/// operand only needs its stage dim lined up with the others'.
const std::set<std::string>& elementwise_ops() {
  static const std::set<std::string> ops = {
      "Add",      "Sub",       "Mul",     "Div",         "Pow",       "Where",      "Equal", "Less",     "Greater",
      "And",      "Or",        "Not",     "Max",         "Min",       "Erf",        "Tanh",  "Relu",     "Sqrt",
      "Exp",      "Log",       "Neg",     "Abs",         "Sigmoid",   "Reciprocal", "Cast",  "Identity", "Gelu",
      "Softplus", "LeakyRelu", "Elu",     "HardSigmoid", "HardSwish", "Sin",        "Cos",   "Floor",    "Ceil",
      "Round",    "Sign",      "Dropout", "Clip",        "IsNaN",     "IsInf"};
  return ops;
}

}  // namespace

BlockStacker::BlockStacker(const Graph& g, const LayerBlocks& b, Graph& out, int64_t stages,
                           const ShapeFunction& shapes, int64_t batch, int64_t microbatch)
    : g_(g), b_(b), out_(out), stages_(stages), batch_(batch), microbatch_(microbatch), shapes_(shapes) {}

void BlockStacker::share(int v, int id) { shared_[v] = {id, false, -1}; }

BlockStacker::Bound BlockStacker::lookup(int v) {
  if (auto it = local_.find(v); it != local_.end()) return it->second;
  if (auto it = shared_.find(v); it != shared_.end()) return it->second;
  // A constant of g that the block reads: copied once, shared by every stage and application.
  const Value& val = g_.values[static_cast<size_t>(v)];
  if (!val.is_initializer)
    throw InternalError(fmt::format("BlockStacker: value '{}' is neither bound nor shared", val.name));
  const int id = out_.add_value_unique(val.name, val.dtype, val.shape);
  out_.values[static_cast<size_t>(id)].is_initializer = true;
  out_.values[static_cast<size_t>(id)].data = val.data;
  return shared_[v] = {id, false, -1};
}

std::vector<int> BlockStacker::emit(const Node& like, const std::string& op, const std::vector<int>& inputs,
                                    std::map<std::string, AttrValue> attrs, size_t outputs, const std::string& name) {
  Node n;
  n.name = name;
  n.op_type = op;
  n.inputs = inputs;
  n.attrs = std::move(attrs);
  std::vector<std::string> names;
  for (size_t k = 0; k < outputs; ++k) names.push_back(fmt::format("{}:{}", name, k));
  try {
    return add_typed_node(out_, std::move(n), names, shapes_);
  } catch (const std::exception& e) {
    throw InputError(fmt::format("--pipeline: node '{}' ({}) stacked over {} stages: {}", like.name, like.op_type,
                                 stages_, e.what()));
  }
}

int BlockStacker::constant(const std::string& name, Tensor t) { return add_constant(out_, name, std::move(t)); }

int BlockStacker::widen(const Node& like, int id, size_t rank, const std::string& tag) {
  const Shape& s = out_.values[static_cast<size_t>(id)].shape;
  if (s.size() >= rank + 1) return id;
  Shape t{s[0]};
  t.resize(rank + 1 - (s.size() - 1), 1);
  t.insert(t.end(), s.begin() + 1, s.end());
  const int shape = constant(like.name + "/stage_shape", Tensor::from_int64s(std::vector<int64_t>(t.begin(), t.end())));
  return emit(like, "Reshape", {id, shape}, {}, 1, like.name + tag + "/stage_align")[0];
}

int BlockStacker::apply(const std::map<int, Bound>& bound, const std::string& tag, std::map<int, int>* instances) {
  local_ = bound;
  const LayerBlocks::Block& b0 = b_.blocks.at(0);
  for (int k : b0.nodes) stack(g_.nodes[static_cast<size_t>(k)], tag);
  if (instances)
    for (int k : b0.nodes)
      for (int v : g_.nodes[static_cast<size_t>(k)].outputs)
        if (auto it = local_.find(v); v >= 0 && it != local_.end()) (*instances)[v] = it->second.id;
  const Bound result = lookup(b0.output);
  local_.clear();
  if (!result.stacked) throw InputError("--pipeline: the layer's output does not depend on its input");
  if (batch_ > 0 && microbatch_ != batch_ && (result.batch != 0 || result.batch_inner != 1))
    throw InputError(fmt::format("--pipeline: layer {}'s output '{}' does not lead with the batch", b0.layer,
                                 g_.values[static_cast<size_t>(b0.output)].name));
  return result.id;
}

void BlockStacker::bind(const Node& n, const std::vector<int>& ids, bool stacked, int batch, int64_t inner) {
  // A node computed from shared values only is the same in every application: later ones reuse it.
  auto& into = stacked ? local_ : shared_;
  for (size_t k = 0; k < n.outputs.size() && k < ids.size(); ++k)
    if (n.outputs[k] >= 0) into[n.outputs[k]] = {ids[k], stacked, batch, inner};
}

void BlockStacker::stack(const Node& n, const std::string& tag) {
  if (!n.outputs.empty() && n.outputs[0] >= 0 && shared_.count(n.outputs[0])) return;  // computed once already
  std::vector<Bound> in;
  bool any = false;
  for (int v : n.inputs) {
    in.push_back(v < 0 ? Bound{} : lookup(v));
    any = any || in.back().stacked;
  }
  auto fail = [&](const std::string& why) {
    return InputError(fmt::format("--pipeline: node '{}' ({}): {}", n.name, n.op_type, why));
  };
  std::vector<int> ids;
  for (const Bound& m : in) ids.push_back(m.id);
  if (!any) {  // computed from shared values only: once, for every stage
    bind(n, emit(n, n.op_type, ids, n.attrs, n.outputs.size(), n.name), false, -1, 1);
    return;
  }
  if (!n.domain.empty()) throw fail("no batching rule for a non-ONNX op");
  auto orig_rank = [&](const Bound& m) {
    const int64_t r = static_cast<int64_t>(out_.values[static_cast<size_t>(m.id)].shape.size());
    return m.stacked ? r - 1 : r;
  };
  // Values computed from the microbatch carry it in their batch dim (Bound::batch, which a transpose may move): the
  // microbatch is a slice of that dim, so an op may not mix it with other dims or reduce over it.
  const bool micro = batch_ > 0 && microbatch_ != batch_;
  auto refuse = [&](const std::string& what) {
    if (micro)
      throw fail(what + ": microbatches need the batch dim (dim 0 of the stream entering the first layer) kept whole");
  };
  auto norm = [&](int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; };
  auto shifted = [&](int64_t axis) { return axis < 0 ? axis : axis + 1; };
  int bd = -1;        // the result's batch dim
  int64_t inner = 1;  // and how many elements of that dim one batch index spans (Bound::inner)
  for (const Bound& m : in)
    if (m.batch >= 0) inner = m.batch_inner;
  // A constant operand's values (Slice's starts, Reduce's axes), or nullptr.
  auto constant_of = [&](size_t i) -> const Tensor* {
    return i < in.size() && in[i].id >= 0 && !in[i].stacked ? out_.values[static_cast<size_t>(ids[i])].data.get()
                                                            : nullptr;
  };
  std::map<std::string, AttrValue> attrs = n.attrs;
  const std::string& op = n.op_type;
  const std::string name = n.name + tag;
  if (elementwise_ops().count(op) || op == "MatMul") {
    int64_t rank = 0;
    for (const Bound& m : in)
      if (m.id >= 0) rank = std::max(rank, orig_rank(m));
    if (op == "MatMul" && (orig_rank(in[0]) < 2 || orig_rank(in[1]) < 2))
      throw fail("a 1-D operand stacked over stages");
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].id < 0 || in[i].batch < 0) continue;
      const int64_t r = orig_rank(in[i]), d = in[i].batch;
      int64_t pos = rank - r + d;  // numpy broadcasting aligns the dims from the right
      if (op == "MatMul") {        // A [..., M, K] x B [..., K, N]: the batch may be a batch dim, M or N, not K
        if ((i == 0 && d == r - 1) || (i == 1 && d == r - 2)) refuse("contracts over the batch dim");
        if (i == 0 && d == r - 2) pos = rank - 2;
      }
      if (bd >= 0 && (bd != pos || in[i].batch_inner != inner)) refuse("combines values whose batch dims differ");
      bd = static_cast<int>(pos);
    }
    // An operand without the batch broadcasts over it (a MatMul's only in its batch dims).
    const bool broadcast_dim = bd >= 0 && (op != "MatMul" || bd < rank - 2);
    for (size_t i = 0; broadcast_dim && i < in.size(); ++i) {
      if (in[i].id < 0 || in[i].batch >= 0) continue;
      const int64_t d = bd - (rank - orig_rank(in[i]));
      if (d >= 0 &&
          out_.values[static_cast<size_t>(ids[i])].shape[static_cast<size_t>(d + (in[i].stacked ? 1 : 0))] != 1)
        refuse(fmt::format("input {} spans the batch dim without being computed from the microbatch", i));
    }
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].stacked) ids[i] = widen(n, ids[i], static_cast<size_t>(rank), tag);
  } else if (op == "Transpose") {
    const int64_t r = orig_rank(in[0]);
    std::vector<int64_t> perm = n.ints("perm");
    if (perm.empty())
      for (int64_t d = r; d-- > 0;) perm.push_back(d);
    std::vector<int64_t> p{0};
    for (size_t j = 0; j < perm.size(); ++j) {
      p.push_back(perm[j] + 1);
      if (perm[j] == in[0].batch) bd = static_cast<int>(j);
    }
    attrs["perm"] = p;
  } else if (op == "Reshape") {
    const Tensor* target = in[1].stacked ? nullptr : out_.values[static_cast<size_t>(ids[1])].data.get();
    if (!target) throw fail("the target shape is not a constant");
    std::vector<int64_t> t{stages_};
    for (int64_t d : target->as_int64s()) t.push_back(d);
    if (in[0].batch >= 0 && micro) {
      // A reshape keeps the elements' order: one step of the batch index spans `step` elements before and after.
      // The target dim holding the batch is the one whose minor dims hold a divisor of `step` elements and which
      // spans all B steps; with the model's own output shape as the target, that dim is scaled to the microbatch.
      const Shape& is = g_.values[static_cast<size_t>(n.inputs[0])].shape;
      const Shape& os = g_.values[static_cast<size_t>(n.outputs[0])].shape;
      int64_t step = in[0].batch_inner, minor = 1;
      for (size_t d = static_cast<size_t>(in[0].batch) + 1; d < is.size(); ++d) step *= is[d];
      for (size_t j = os.size(); j-- > 0 && bd < 0;) {
        if (step % minor == 0 && (minor * os[j]) % (step * batch_) == 0) {
          bd = static_cast<int>(j);
          inner = step / minor;
        }
        minor *= os[j];
      }
      if (bd < 0) refuse("splits the batch dim");
      t.assign(1, stages_);
      t.insert(t.end(), os.begin(), os.end());
      t[static_cast<size_t>(bd) + 1] = os[static_cast<size_t>(bd)] / batch_ * microbatch_;
    }
    ids[1] = constant(n.name + "/stage_shape", Tensor::from_int64s(t));
  } else if (op == "Slice" && g_.opset >= 10) {
    // Constant starts, ends, axes (steps): the axes shift past the stage dim; slicing the batch dim is refused
    // unless it keeps all of it.
    const int64_t r = orig_rank(in[0]);
    std::vector<int64_t> axes;
    if (const Tensor* a = constant_of(3)) {
      axes = a->as_int64s();
    } else if (in.size() > 3 && in[3].id >= 0) {
      throw fail("the axes are not a constant");
    } else if (const Tensor* st = constant_of(1)) {
      for (int64_t k = 0; k < st->numel(); ++k) axes.push_back(k);
    }
    if (!constant_of(1) || !constant_of(2)) throw fail("the starts and ends are not constants");
    bd = in[0].batch;
    const Shape& is = g_.values[static_cast<size_t>(n.inputs[0])].shape;
    for (int64_t& a : axes) {
      a = norm(a, r);
      if (a == bd &&
          g_.values[static_cast<size_t>(n.outputs[0])].shape[static_cast<size_t>(a)] != is[static_cast<size_t>(a)])
        refuse("slices the batch dim");
      ++a;
    }
    if (ids.size() < 4) ids.resize(4, -1);
    ids[3] = constant(n.name + "/stage_axes", Tensor::from_int64s(axes));
  } else if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin") {
    // Axes as an attribute (ReduceSum before opset 13, the others before 18) or a constant input.
    const bool axes_input = op == "ReduceSum" ? g_.opset >= 13 : g_.opset >= 18;
    const int64_t r = orig_rank(in[0]);
    std::vector<int64_t> axes;
    if (axes_input && in.size() > 1 && in[1].id >= 0) {
      const Tensor* a = constant_of(1);
      if (!a) throw fail("the axes are not a constant");
      axes = a->as_int64s();
    } else if (!axes_input) {
      axes = n.ints("axes");
    }
    if (axes.empty())
      for (int64_t d = 0; d < r; ++d) axes.push_back(d);  // all dims (noop_with_empty_axes is not supported)
    if (n.i("noop_with_empty_axes", 0) != 0) throw fail("noop_with_empty_axes is not supported");
    bd = in[0].batch;
    const bool keep = n.i("keepdims", 1) != 0;
    int below = 0;
    for (int64_t& a : axes) {
      a = norm(a, r);
      if (a == bd) refuse("reduces over the batch dim");
      below += a < bd;
      ++a;
    }
    if (bd >= 0 && !keep) bd -= below;
    if (axes_input) {
      ids.resize(2);
      ids[1] = constant(n.name + "/stage_axes", Tensor::from_int64s(axes));
    } else {
      attrs["axes"] = axes;
    }
  } else if (op == "Gemm") {
    // Y = alpha A' B' + beta C as a batched MatMul (Gemm has no batch dims): A' = A or its transpose, likewise B'.
    if (in[0].batch >= 0 && (n.i("transA", 0) ? in[0].batch == 0 : in[0].batch == 1))
      refuse("contracts over the batch dim");
    if (in[1].batch >= 0) refuse("multiplies by a matrix computed from the microbatch");
    auto operand = [&](size_t i, const char* trans) {
      const int v = ids[i];
      if (n.i(trans, 0) == 0) return v;
      const std::vector<int64_t> perm = in[i].stacked ? std::vector<int64_t>{0, 2, 1} : std::vector<int64_t>{1, 0};
      return emit(n, "Transpose", {v}, {{"perm", perm}}, 1, name + "/" + trans)[0];
    };
    const int a = operand(0, "transA"), b2 = operand(1, "transB");
    int y = emit(n, "MatMul", {a, b2}, {}, 1, name + "/matmul")[0];
    const DType t = out_.values[static_cast<size_t>(y)].dtype;
    auto scalar = [&](float v, const std::string& what) {
      if (!is_floating(t)) throw fail("supported in floating-point types");
      return constant(n.name + "/" + what, Tensor::filled(t, {}, v));
    };
    if (const float alpha = n.f("alpha", 1.f); alpha != 1.f)
      y = emit(n, "Mul", {y, scalar(alpha, "alpha")}, {}, 1, name + "/alpha")[0];
    if (in.size() > 2 && in[2].id >= 0) {
      if (in[2].batch >= 0) refuse("adds a bias computed from the microbatch");
      int c = in[2].stacked ? widen(n, ids[2], 2, tag) : ids[2];
      if (const float beta = n.f("beta", 1.f); beta != 1.f)
        c = emit(n, "Mul", {c, scalar(beta, "beta")}, {}, 1, name + "/beta")[0];
      y = emit(n, "Add", {y, c}, {}, 1, name)[0];
    }
    bd = in[0].batch < 0 ? -1 : 0;  // A' [M, K]: the batch in M
    bind(n, {y}, true, bd, inner);
    return;
  } else if (op == "Softmax" || op == "LogSoftmax") {
    if (g_.opset < 13) throw fail("opset < 13 flattens from the axis: stack a model of opset 13 or later");
    bd = in[0].batch;
    if (bd >= 0 && norm(n.i("axis", -1), orig_rank(in[0])) == bd) refuse("normalizes over the batch dim");
    attrs["axis"] = shifted(n.i("axis", -1));
  } else if (op == "Concat") {
    bd = in[0].batch;
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].stacked) throw fail("concatenates a value shared by the stages");
      if (in[i].batch != bd) refuse("concatenates values whose batch dims differ");
    }
    if (bd >= 0 && norm(n.i("axis", 0), orig_rank(in[0])) == bd) refuse("concatenates along the batch dim");
    attrs["axis"] = shifted(n.i("axis", 0));
  } else if (op == "LayerNormalization") {
    if (!in[0].stacked) throw fail("normalizes a value shared by the stages");
    bd = in[0].batch;
    if (bd >= 0 && norm(n.i("axis", -1), orig_rank(in[0])) <= bd) refuse("normalizes over the batch dim");
    attrs["axis"] = shifted(n.i("axis", -1));
    // A stacked Scale / B does not broadcast onto the normalized dims: normalize with unit scale, then scale and
    // shift by the stacked parameters lined up with the stage dim.
    const bool scale_stacked = in.size() > 1 && in[1].stacked, bias_stacked = in.size() > 2 && in[2].stacked;
    if (scale_stacked || bias_stacked) {
      const Shape& norm_shape = g_.values[static_cast<size_t>(n.inputs[1])].shape;
      const int ones = [&] {
        auto it = unit_scales_.find(n.inputs[1]);
        if (it != unit_scales_.end()) return it->second;
        return unit_scales_[n.inputs[1]] =
                   constant(n.name + "/unit_scale",
                            Tensor::filled(out_.values[static_cast<size_t>(ids[0])].dtype, norm_shape, 1));
      }();
      std::vector<int> y = emit(n, op, {ids[0], ones}, attrs, n.outputs.size(), name);
      const size_t rank = static_cast<size_t>(orig_rank(in[0]));
      auto lined_up = [&](size_t i) { return in[i].stacked ? widen(n, ids[i], rank, tag) : ids[i]; };
      int r = emit(n, "Mul", {y[0], lined_up(1)}, {}, 1, name + "/scale")[0];  // x̂ · Scale, then + B
      if (in.size() > 2 && ids[2] >= 0) r = emit(n, "Add", {r, lined_up(2)}, {}, 1, name + "/bias")[0];
      y[0] = r;
      bind(n, y, true, bd, inner);
      return;
    }
  } else if (op == "Split") {
    bd = in[0].batch;
    const int64_t axis = norm(n.i("axis", 0), orig_rank(in[0]));
    if (axis == bd) refuse("splits the batch dim");
    attrs["axis"] = shifted(n.i("axis", 0));  // a negative axis stays negative, as the rules expect it
  } else if (op == "Unsqueeze") {
    // Axes (of the result) as an attribute before opset 13, else a constant input.
    std::vector<int64_t> axes;
    if (g_.opset >= 13) {
      const Tensor* a = constant_of(1);
      if (!a) throw fail("the axes are not a constant");
      axes = a->as_int64s();
    } else {
      axes = n.ints("axes");
    }
    const int64_t rank = orig_rank(in[0]) + static_cast<int64_t>(axes.size());
    std::vector<char> listed(static_cast<size_t>(rank), 0);
    for (int64_t& a : axes) {
      a = norm(a, rank);
      listed[static_cast<size_t>(a)] = 1;
      ++a;
    }
    // The batch dim: the in[0].batch-th of the result's dims that are not new.
    for (int64_t d = 0, kept = 0; in[0].batch >= 0 && d < rank && bd < 0; ++d)
      if (!listed[static_cast<size_t>(d)] && kept++ == in[0].batch) bd = static_cast<int>(d);
    if (g_.opset >= 13) {
      ids.resize(2);
      ids[1] = constant(n.name + "/stage_axes", Tensor::from_int64s(axes));
    } else {
      attrs["axes"] = axes;
    }
  } else if (op == "ArgMax" || op == "ArgMin") {
    bd = in[0].batch;
    const int64_t axis = norm(n.i("axis", 0), orig_rank(in[0]));
    if (axis == bd) refuse("reduces over the batch dim");
    if (bd > axis && n.i("keepdims", 1) == 0) --bd;
    attrs["axis"] = shifted(n.i("axis", 0));
  } else if (op == "CumSum") {
    const Tensor* a = constant_of(1);
    if (!a || a->numel() != 1) throw fail("the axis is not a constant");
    bd = in[0].batch;
    const int64_t axis = norm(a->as_int64s()[0], orig_rank(in[0]));
    if (axis == bd) refuse("accumulates along the batch dim");
    Tensor t = Tensor::from_int64s({shifted(a->as_int64s()[0])});
    t.shape = a->shape;  // a scalar, or [1], as the operand was
    ids[1] = constant(n.name + "/stage_axis", std::move(t));
  } else if (op == "OneHot") {
    // The one-hot dim goes in at `axis` of the result (rank + 1).
    if (!in[0].stacked) throw fail("one-hot encodes indices shared by the stages");
    const int64_t axis = norm(n.i("axis", -1), orig_rank(in[0]) + 1);
    bd = in[0].batch < 0 ? -1 : in[0].batch + (axis <= in[0].batch ? 1 : 0);
    attrs["axis"] = shifted(n.i("axis", -1));
  } else if (op == "Einsum") {
    // A new label for the stage dim, in front of every stacked operand's term and of the result's; the batch dim is
    // one label, which the result must keep.
    std::string eq = n.s("equation");
    std::erase(eq, ' ');
    const size_t arrow = eq.find("->");
    if (arrow == std::string::npos || eq.find("...") != std::string::npos)
      throw fail("an equation with '...' or without '->' is not supported");
    std::vector<std::string> terms(1);
    for (size_t k = 0; k < arrow; ++k) {
      if (eq[k] == ',')
        terms.emplace_back();
      else
        terms.back().push_back(eq[k]);
    }
    const std::string result = eq.substr(arrow + 2);
    char stage = 0;
    for (char c = 'a'; c <= 'z' && !stage; ++c)
      if (eq.find(c) == std::string::npos) stage = c;
    for (char c = 'A'; c <= 'Z' && !stage; ++c)
      if (eq.find(c) == std::string::npos) stage = c;
    if (!stage || terms.size() != in.size()) throw fail("no label is left for the stage dim");
    char batch = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].batch < 0) continue;
      const char l = terms[i].at(static_cast<size_t>(in[i].batch));
      if (batch && (l != batch || in[i].batch_inner != inner)) refuse("combines values whose batch dims differ");
      batch = l;
    }
    if (batch) {
      const size_t at = result.find(batch);
      if (at == std::string::npos) refuse("contracts over the batch dim");
      bd = at == std::string::npos ? -1 : static_cast<int>(at);
      for (size_t i = 0; i < in.size(); ++i) {
        const size_t d = terms[i].find(batch);
        if (in[i].batch < 0 && d != std::string::npos &&
            out_.values[static_cast<size_t>(ids[i])].shape[d + (in[i].stacked ? 1 : 0)] != 1)
          refuse(fmt::format("input {} spans the batch dim without being computed from the microbatch", i));
      }
    }
    std::string stacked_eq;
    for (size_t i = 0; i < terms.size(); ++i)
      stacked_eq += (i ? "," : "") + (in[i].stacked ? std::string(1, stage) : "") + terms[i];
    attrs["equation"] = stacked_eq + "->" + stage + result;
  } else {
    throw fail("no batching rule over a stage dim (the ops of transformer layers and GShard's MoE are supported)");
  }
  bind(n, emit(n, op, ids, attrs, n.outputs.size(), name), true, bd, inner);
}

Graph stack_blocks(const Graph& g, const LayerBlocks& b, const std::vector<size_t>& blocks,
                   const ShapeFunction& shapes) {
  const int64_t stages = static_cast<int64_t>(blocks.size());
  for (size_t k : blocks)
    if (k >= b.blocks.size()) throw std::out_of_range(fmt::format("stack_blocks: block {} of {}", k, b.blocks.size()));
  if (blocks.empty()) throw std::out_of_range("stack_blocks: no block");
  const LayerBlocks::Block& b0 = b.blocks[0];
  Graph out;
  out.name = g.name + ".stages";
  out.opset = g.opset;
  BlockStacker s(g, b, out, stages, shapes);
  std::map<int, BlockStacker::Bound> bound;
  const Value& in = g.values[static_cast<size_t>(b0.input)];
  Shape state_shape{stages};
  state_shape.insert(state_shape.end(), in.shape.begin(), in.shape.end());
  const int state = out.add_value_unique("state", in.dtype, state_shape);
  out.inputs.push_back(state);
  bound[b0.input] = {state, true};
  for (int v : b.side_inputs) {  // computed side inputs are inputs of the stacked graph
    const Value& val = g.values[static_cast<size_t>(v)];
    if (val.is_initializer) continue;
    const int id = out.add_value_unique(val.name, val.dtype, val.shape);
    out.inputs.push_back(id);
    s.share(v, id);
  }
  for (size_t k = 0; k < b0.weights.size(); ++k) {
    std::vector<int> members;
    for (size_t st : blocks) members.push_back(b.blocks[st].weights[k]);
    const Value& w = g.values[static_cast<size_t>(b0.weights[k])];
    bound[b0.weights[k]] = {stack_weights(g, out, members, {stages}, layer_key(w.name)), true};
  }
  const int y = s.apply(bound, "");
  out.rename(y, "state_out");
  out.outputs.push_back(y);
  return out;
}

int stack_weights(const Graph& g, Graph& out, const std::vector<int>& members, const Shape& lead,
                  const std::string& name) {
  const Value& w = g.values[static_cast<size_t>(members.at(0))];
  Shape shape = lead;
  shape.insert(shape.end(), w.shape.begin(), w.shape.end());
  if (num_elements(lead) != static_cast<int64_t>(members.size()))
    throw std::invalid_argument(fmt::format("stack_weights: {} members for {}", members.size(), shape_str(lead)));
  const int id = out.add_value_unique(name, w.dtype, shape);
  // Initializers stack into an initializer; graph inputs (a step's parameters) into a graph input of `out`.
  if (w.is_initializer)
    out.values[static_cast<size_t>(id)].is_initializer = true;
  else
    out.inputs.push_back(id);
  const bool data = std::all_of(members.begin(), members.end(),
                                [&](int m) { return g.values[static_cast<size_t>(m)].data != nullptr; });
  if (data) {
    Tensor t(w.dtype, shape);
    const size_t bytes = static_cast<size_t>(w.nbytes());
    for (size_t k = 0; k < members.size(); ++k)
      std::memcpy(t.bytes.data() + k * bytes, g.values[static_cast<size_t>(members[k])].data->bytes.data(), bytes);
    out.values[static_cast<size_t>(id)].data = std::make_shared<const Tensor>(std::move(t));
  }
  return id;
}

}  // namespace gspmd
