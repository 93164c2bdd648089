// The batching rules of BlockStacker (core/pipeline/batching.h): one per op, over the stage dim.
#include "core/pipeline/batching.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "core/ir/typing.h"

namespace gspmd {

Batching::Rule Batching::find(const std::string& op, int64_t opset) {
  // Ops that compute each element from the same elements of their operands (numpy broadcasting): a stage-stacked
  // operand only needs its stage dim lined up with the others'.
  static const std::map<std::string, Rule> rules = [] {
    std::map<std::string, Rule> r;
    for (const char* e :
         {"Add",      "Sub",       "Mul",     "Div",         "Pow",       "Where",      "Equal", "Less",     "Greater",
          "And",      "Or",        "Not",     "Max",         "Min",       "Erf",        "Tanh",  "Relu",     "Sqrt",
          "Exp",      "Log",       "Neg",     "Abs",         "Sigmoid",   "Reciprocal", "Cast",  "Identity", "Gelu",
          "Softplus", "LeakyRelu", "Elu",     "HardSigmoid", "HardSwish", "Sin",        "Cos",   "Floor",    "Ceil",
          "Round",    "Sign",      "Dropout", "Clip",        "IsNaN",     "IsInf"})
      r[e] = &Batching::elementwise;
    r["MatMul"] = &Batching::matmul;
    r["Transpose"] = &Batching::transpose;
    r["Reshape"] = &Batching::reshape;
    r["Slice"] = &Batching::slice;
    r["ReduceSum"] = &Batching::reduce_sum;
    for (const char* e : {"ReduceMean", "ReduceMax", "ReduceMin"}) r[e] = &Batching::reduce_other;
    r["Gemm"] = &Batching::gemm;
    r["Softmax"] = r["LogSoftmax"] = &Batching::softmax;
    r["Concat"] = &Batching::concat;
    r["LayerNormalization"] = &Batching::layer_norm;
    r["Split"] = &Batching::split;
    r["Unsqueeze"] = &Batching::unsqueeze;
    r["ArgMax"] = r["ArgMin"] = &Batching::arg_reduce;
    r["CumSum"] = &Batching::cumsum;
    r["OneHot"] = &Batching::one_hot;
    r["Einsum"] = &Batching::einsum;
    return r;
  }();
  if (op == "Slice" && opset < 10) return nullptr;  // starts and ends as attributes: no rule
  auto it = rules.find(op);
  return it == rules.end() ? nullptr : it->second;
}

Batching::Batching(BlockStacker& s, const Node& node, const std::string& tag, std::vector<Bound> operands)
    : s_(s),
      g_(s.g_),
      out_(s.out_),
      stages_(s.stages_),
      batch_(s.batch_),
      microbatch_(s.microbatch_),
      n(node),
      op(node.op_type),
      tag_(tag),
      in(std::move(operands)),
      attrs(node.attrs),
      name(node.name + tag),
      micro(s.batch_ > 0 && s.microbatch_ != s.batch_) {
  for (const Bound& m : in) ids.push_back(m.id);
  for (const Bound& m : in)
    if (m.batch >= 0) inner = m.batch_inner;
}

void Batching::run(Rule rule) {
  (this->*rule)();
  if (!bound_) bind(emit(op, ids, attrs, n.outputs.size(), name));
}

InputError Batching::fail(const std::string& why) const {
  return InputError(fmt::format("--pipeline: node '{}' ({}): {}", n.name, n.op_type, why));
}

void Batching::refuse(const std::string& what) const {
  if (micro)
    throw fail(what + ": microbatches need the batch dim (dim 0 of the stream entering the first layer) kept whole");
}

int64_t Batching::orig_rank(const Bound& m) const {
  const int64_t r = static_cast<int64_t>(out_.values[static_cast<size_t>(m.id)].shape.size());
  return m.stacked ? r - 1 : r;
}

const Tensor* Batching::constant_of(size_t i) const {
  return i < in.size() && in[i].id >= 0 && !in[i].stacked ? out_.values[static_cast<size_t>(ids[i])].data.get()
                                                          : nullptr;
}

std::vector<int> Batching::emit(const std::string& o, const std::vector<int>& inputs,
                                std::map<std::string, AttrValue> a, size_t outputs, const std::string& nm) {
  return s_.emit(n, o, inputs, std::move(a), outputs, nm);
}

int Batching::constant(const std::string& nm, Tensor t) { return s_.constant(nm, std::move(t)); }

int Batching::widen(int id, size_t rank) { return s_.widen(n, id, rank, tag_); }

void Batching::bind(const std::vector<int>& outs) {
  s_.bind(n, outs, true, bd, inner);
  bound_ = true;
}

/// Elementwise ops and MatMul (`matmul`): numpy broadcasting lines the stage dim up; a stacked operand of lower rank
/// gets unit dims.
void Batching::broadcasting(bool matmul) {
  int64_t rank = 0;
  for (const Bound& m : in)
    if (m.id >= 0) rank = std::max(rank, orig_rank(m));
  if (matmul && (orig_rank(in[0]) < 2 || orig_rank(in[1]) < 2)) throw fail("a 1-D operand stacked over stages");
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].id < 0 || in[i].batch < 0) continue;
    const int64_t r = orig_rank(in[i]), d = in[i].batch;
    int64_t pos = rank - r + d;  // numpy broadcasting aligns the dims from the right
    if (matmul) {                // A [..., M, K] x B [..., K, N]: the batch may be a batch dim, M or N, not K
      if ((i == 0 && d == r - 1) || (i == 1 && d == r - 2)) refuse("contracts over the batch dim");
      if (i == 0 && d == r - 2) pos = rank - 2;
    }
    if (bd >= 0 && (bd != pos || in[i].batch_inner != inner)) refuse("combines values whose batch dims differ");
    bd = static_cast<int>(pos);
  }
  // An operand without the batch broadcasts over it (a MatMul's only in its batch dims).
  const bool broadcast_dim = bd >= 0 && (!matmul || bd < rank - 2);
  for (size_t i = 0; broadcast_dim && i < in.size(); ++i) {
    if (in[i].id < 0 || in[i].batch >= 0) continue;
    const int64_t d = bd - (rank - orig_rank(in[i]));
    if (d >= 0 && out_.values[static_cast<size_t>(ids[i])].shape[static_cast<size_t>(d + (in[i].stacked ? 1 : 0))] != 1)
      refuse(fmt::format("input {} spans the batch dim without being computed from the microbatch", i));
  }
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].stacked) ids[i] = widen(ids[i], static_cast<size_t>(rank));
}

/// Transpose: the permutation keeps the stage dim first.
void Batching::transpose() {
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
}

/// Reshape: a constant target with the stage dim in front; with microbatches, the dim holding the batch scaled to the
/// microbatch.
void Batching::reshape() {
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
}

/// Slice (opset 10+): constant starts, ends and axes; the axes shift past the stage dim.
void Batching::slice() {
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
}

/// ReduceMean / Sum / Max / Min: the axes shift past the stage dim (`axes_input`: an input, else an attribute).
void Batching::reduce(bool axes_input) {
  // Axes as an attribute (ReduceSum before opset 13, the others before 18) or a constant input.
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
}

/// Gemm as a batched MatMul.
void Batching::gemm() {
  // Y = alpha A' B' + beta C as a batched MatMul (Gemm has no batch dims): A' = A or its transpose, likewise B'.
  if (in[0].batch >= 0 && (n.i("transA", 0) ? in[0].batch == 0 : in[0].batch == 1))
    refuse("contracts over the batch dim");
  if (in[1].batch >= 0) refuse("multiplies by a matrix computed from the microbatch");
  auto operand = [&](size_t i, const char* trans) {
    const int v = ids[i];
    if (n.i(trans, 0) == 0) return v;
    const std::vector<int64_t> perm = in[i].stacked ? std::vector<int64_t>{0, 2, 1} : std::vector<int64_t>{1, 0};
    return emit("Transpose", {v}, {{"perm", perm}}, 1, name + "/" + trans)[0];
  };
  const int a = operand(0, "transA"), b2 = operand(1, "transB");
  int y = emit("MatMul", {a, b2}, {}, 1, name + "/matmul")[0];
  const DType t = out_.values[static_cast<size_t>(y)].dtype;
  auto scalar = [&](float v, const std::string& what) {
    if (!is_floating(t)) throw fail("supported in floating-point types");
    return constant(n.name + "/" + what, Tensor::filled(t, {}, v));
  };
  if (const float alpha = n.f("alpha", 1.f); alpha != 1.f)
    y = emit("Mul", {y, scalar(alpha, "alpha")}, {}, 1, name + "/alpha")[0];
  if (in.size() > 2 && in[2].id >= 0) {
    if (in[2].batch >= 0) refuse("adds a bias computed from the microbatch");
    int c = in[2].stacked ? widen(ids[2], 2) : ids[2];
    if (const float beta = n.f("beta", 1.f); beta != 1.f)
      c = emit("Mul", {c, scalar(beta, "beta")}, {}, 1, name + "/beta")[0];
    y = emit("Add", {y, c}, {}, 1, name)[0];
  }
  bd = in[0].batch < 0 ? -1 : 0;  // A' [M, K]: the batch in M
  bind({y});
}

/// Softmax, LogSoftmax (opset 13+): the axis shifts past the stage dim.
void Batching::softmax() {
  if (g_.opset < 13) throw fail("opset < 13 flattens from the axis: stack a model of opset 13 or later");
  bd = in[0].batch;
  if (bd >= 0 && norm(n.i("axis", -1), orig_rank(in[0])) == bd) refuse("normalizes over the batch dim");
  attrs["axis"] = shifted(n.i("axis", -1));
}

/// Concat of stacked values: the axis shifts past the stage dim.
void Batching::concat() {
  bd = in[0].batch;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].stacked) throw fail("concatenates a value shared by the stages");
    if (in[i].batch != bd) refuse("concatenates values whose batch dims differ");
  }
  if (bd >= 0 && norm(n.i("axis", 0), orig_rank(in[0])) == bd) refuse("concatenates along the batch dim");
  attrs["axis"] = shifted(n.i("axis", 0));
}

/// LayerNormalization: the axis shifts; a stacked scale or bias is applied after a unit-scale normalization.
void Batching::layer_norm() {
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
      auto it = s_.unit_scales_.find(n.inputs[1]);
      if (it != s_.unit_scales_.end()) return it->second;
      return s_.unit_scales_[n.inputs[1]] = constant(
                 n.name + "/unit_scale", Tensor::filled(out_.values[static_cast<size_t>(ids[0])].dtype, norm_shape, 1));
    }();
    std::vector<int> y = emit(op, {ids[0], ones}, attrs, n.outputs.size(), name);
    const size_t rank = static_cast<size_t>(orig_rank(in[0]));
    auto lined_up = [&](size_t i) { return in[i].stacked ? widen(ids[i], rank) : ids[i]; };
    int r = emit("Mul", {y[0], lined_up(1)}, {}, 1, name + "/scale")[0];  // x̂ · Scale, then + B
    if (in.size() > 2 && ids[2] >= 0) r = emit("Add", {r, lined_up(2)}, {}, 1, name + "/bias")[0];
    y[0] = r;
    bind(y);
  }
}

/// Split: the axis shifts past the stage dim.
void Batching::split() {
  bd = in[0].batch;
  const int64_t axis = norm(n.i("axis", 0), orig_rank(in[0]));
  if (axis == bd) refuse("splits the batch dim");
  attrs["axis"] = shifted(n.i("axis", 0));  // a negative axis stays negative, as the rules expect it
}

/// Unsqueeze: the new axes shift past the stage dim.
void Batching::unsqueeze() {
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
}

/// ArgMax, ArgMin: the axis shifts past the stage dim.
void Batching::arg_reduce() {
  bd = in[0].batch;
  const int64_t axis = norm(n.i("axis", 0), orig_rank(in[0]));
  if (axis == bd) refuse("reduces over the batch dim");
  if (bd > axis && n.i("keepdims", 1) == 0) --bd;
  attrs["axis"] = shifted(n.i("axis", 0));
}

/// CumSum: a constant axis, shifted past the stage dim.
void Batching::cumsum() {
  const Tensor* a = constant_of(1);
  if (!a || a->numel() != 1) throw fail("the axis is not a constant");
  bd = in[0].batch;
  const int64_t axis = norm(a->as_int64s()[0], orig_rank(in[0]));
  if (axis == bd) refuse("accumulates along the batch dim");
  Tensor t = Tensor::from_int64s({shifted(a->as_int64s()[0])});
  t.shape = a->shape;  // a scalar, or [1], as the operand was
  ids[1] = constant(n.name + "/stage_axis", std::move(t));
}

/// OneHot of stacked indices: the axis shifts past the stage dim.
void Batching::one_hot() {
  // The one-hot dim goes in at `axis` of the result (rank + 1).
  if (!in[0].stacked) throw fail("one-hot encodes indices shared by the stages");
  const int64_t axis = norm(n.i("axis", -1), orig_rank(in[0]) + 1);
  bd = in[0].batch < 0 ? -1 : in[0].batch + (axis <= in[0].batch ? 1 : 0);
  attrs["axis"] = shifted(n.i("axis", -1));
}

/// Einsum: a new label for the stage dim.
void Batching::einsum() {
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
}

}  // namespace gspmd
