// Kernels of the control-flow ops (If, Loop, Scan; onnx/docs/Operators.md): a small sequential interpreter runs a
// body with the same kernels (run_kernel), node by node, so nested control flow works. Inputs bind per
// core/ir/control_flow.h (captured values last).
#include <algorithm>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/kernels/kernels_util.h"
#include "core/ir/control_flow.h"
#include "core/shapes/shapes.h"

namespace gspmd::kern {
namespace {

// Runs `body` with `inputs` (one per body input). Each intermediate is freed after its last reader.
std::vector<Tensor> run_body(const Ctx& c, const Graph& body, const std::vector<const Tensor*>& inputs) {
  const size_t nv = body.values.size();
  std::vector<Tensor> owned(nv);
  std::vector<const Tensor*> val(nv, nullptr);
  for (size_t k = 0; k < body.inputs.size(); ++k) val[static_cast<size_t>(body.inputs[k])] = inputs.at(k);
  for (size_t v = 0; v < nv; ++v)
    if (body.values[v].producer < 0 && body.values[v].data) val[v] = body.values[v].data.get();
  std::vector<size_t> last(nv, 0);
  for (size_t ni = 0; ni < body.nodes.size(); ++ni)
    for (int i : body.nodes[ni].inputs)
      if (i >= 0) last[static_cast<size_t>(i)] = ni;
  for (int o : body.outputs) last[static_cast<size_t>(o)] = SIZE_MAX;
  std::vector<const Tensor*> ins;
  for (size_t ni = 0; ni < body.nodes.size(); ++ni) {
    const Node& n = body.nodes[ni];
    ins.clear();
    for (int i : n.inputs) {
      ins.push_back(i >= 0 ? val[static_cast<size_t>(i)] : nullptr);
      if (i >= 0 && !ins.back())
        c.fail(fmt::format("body '{}' reads '{}', which nothing defines", body.name,
                           body.values[static_cast<size_t>(i)].name));
    }
    std::vector<Tensor> outs = run_kernel(n, ins, c.opset);
    for (size_t k = 0; k < n.outputs.size() && k < outs.size(); ++k) {
      const auto o = static_cast<size_t>(n.outputs[k]);
      owned[o] = std::move(outs[k]);
      val[o] = &owned[o];
    }
    for (int i : n.inputs)
      if (i >= 0 && last[static_cast<size_t>(i)] == ni && body.values[static_cast<size_t>(i)].producer >= 0) {
        owned[static_cast<size_t>(i)] = Tensor();
        val[static_cast<size_t>(i)] = nullptr;
      }
  }
  std::vector<Tensor> out;
  for (auto it = body.outputs.begin(); it != body.outputs.end(); ++it) {
    const auto o = static_cast<size_t>(*it);
    if (!val[o]) c.fail(fmt::format("body '{}' does not compute its output '{}'", body.name, body.values[o].name));
    const bool again = std::find(it + 1, body.outputs.end(), *it) != body.outputs.end();
    if (val[o] == &owned[o] && !again)
      out.push_back(std::move(owned[o]));  // an intermediate: moved out
    else
      out.push_back(*val[o]);
  }
  return out;
}

const Graph& body_of(const Ctx& c, const char* attr) {
  const Graph* g = c.node.g(attr);
  if (!g) c.fail(fmt::format("missing graph attribute '{}'", attr));
  return *g;
}

bool truth(const Tensor& t) { return t.numel() > 0 && t.bytes[0] != std::byte{0}; }

// The node's captured inputs (ir.h), in order.
std::vector<const Tensor*> captured(const Ctx& c) {
  return {c.ins.begin() + static_cast<int64_t>(own_inputs(c.node)), c.ins.end()};
}

// Bytes of the dims of `s` from `from` on, times the element size.
size_t block_bytes(const Shape& s, size_t from, DType t) {
  int64_t n = 1;
  for (size_t i = from; i < s.size(); ++i) n *= s[i];
  return static_cast<size_t>(n) * dtype_size(t);
}

// Element `index` of `t` along `axis`, that dim removed.
Tensor slice_at(const Tensor& t, size_t axis, int64_t index) {
  Shape s = t.shape;
  const int64_t len = s[axis];
  s.erase(s.begin() + static_cast<int64_t>(axis));
  Tensor r(t.dtype, s);
  const size_t inner = block_bytes(t.shape, axis + 1, t.dtype);
  const int64_t outer = num_elements(Shape(t.shape.begin(), t.shape.begin() + static_cast<int64_t>(axis)));
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(r.bytes.data() + static_cast<size_t>(o) * inner,
                t.bytes.data() + static_cast<size_t>(o * len + index) * inner, inner);
  return r;
}

// The same-typed `parts` stacked along a new dim at `axis` (in reverse order when `reverse`); an empty stack takes
// `type` (a part's type).
Tensor stack(const Ctx& c, const std::vector<Tensor>& parts, int64_t axis, bool reverse, const TensorType& type) {
  const int64_t len = static_cast<int64_t>(parts.size());
  const auto a = static_cast<size_t>(c.axis(axis, static_cast<int64_t>(type.shape.size()) + 1));
  Shape s = type.shape;
  s.insert(s.begin() + static_cast<int64_t>(a), len);
  Tensor r(type.dtype, s);
  const size_t inner = block_bytes(type.shape, a, type.dtype);
  const int64_t outer = num_elements(Shape(type.shape.begin(), type.shape.begin() + static_cast<int64_t>(a)));
  for (int64_t i = 0; i < len; ++i) {
    const Tensor& p = parts[static_cast<size_t>(i)];
    if (p.dtype != type.dtype || p.shape != type.shape)
      c.fail(fmt::format("iteration {} gives {}, an earlier one {}", i, type_str(p.dtype, p.shape),
                         type_str(type.dtype, type.shape)));
    const int64_t at = reverse ? len - 1 - i : i;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(r.bytes.data() + static_cast<size_t>(o * len + at) * inner,
                  p.bytes.data() + static_cast<size_t>(o) * inner, inner);
  }
  return r;
}

// The type of the body's output `k` for a run that produced no iteration (from the shape functions).
TensorType output_type(const Ctx& c, const Graph& body, const std::vector<const Tensor*>& inputs, size_t k) {
  std::vector<TensorType> in;
  for (const Tensor* t : inputs) in.push_back(t ? TensorType{t->dtype, t->shape} : TensorType{});
  BodyTypes b = type_body(body, in, {}, c.opset, &kernel_evaluator());
  if (!b.outputs.at(k)) c.fail("no iteration ran and the body's output types are not static: " + b.why);
  return *b.outputs[k];
}

std::vector<Tensor> run_if(const Ctx& c) {
  return run_body(c, body_of(c, truth(c.req(0)) ? "then_branch" : "else_branch"), captured(c));
}

std::vector<Tensor> run_loop(const Ctx& c) {
  const Graph& body = body_of(c, "body");
  const size_t carried = own_inputs(c.node) - 2;
  const int64_t trips = c.in(0) ? c.in(0)->as_int64s().at(0) : INT64_MAX;
  Tensor iter = Tensor::from_int64s({0}, /*scalar=*/true);
  Tensor cond(DType::kBool, {});
  cond.bytes[0] = std::byte{static_cast<unsigned char>(c.in(1) ? truth(*c.in(1)) : 1)};
  std::vector<Tensor> state;
  for (size_t k = 0; k < carried; ++k) state.push_back(c.req(2 + k));
  const std::vector<const Tensor*> caps = captured(c);
  std::vector<const Tensor*> ins;
  auto bind = [&] {
    ins = {&iter, &cond};
    for (const Tensor& s : state) ins.push_back(&s);
    ins.insert(ins.end(), caps.begin(), caps.end());
    return ins;
  };
  std::vector<std::vector<Tensor>> scans(body.outputs.size() - 1 - carried);
  for (int64_t i = 0; i < trips && truth(cond); ++i) {
    if (i == kMaxLoopIterations)  // a model from strangers cannot make the run endless (docs/cli.md#limits)
      throw InputError(fmt::format("{}more than the {} iterations a Loop may run ({})", c.prefix(), kMaxLoopIterations,
                                   trips == INT64_MAX ? std::string("its condition is still true")
                                                      : fmt::format("its trip count is {}", trips)));
    iter.data<int64_t>()[0] = i;
    std::vector<Tensor> outs = run_body(c, body, bind());
    cond = std::move(outs[0]);
    for (size_t k = 0; k < carried; ++k) state[k] = std::move(outs[1 + k]);
    for (size_t j = 0; j < scans.size(); ++j) scans[j].push_back(std::move(outs[1 + carried + j]));
  }
  std::vector<Tensor> out;
  for (size_t j = 0; j < scans.size(); ++j) {
    const TensorType t = scans[j].empty() ? output_type(c, body, bind(), 1 + carried + j)
                                          : TensorType{scans[j][0].dtype, scans[j][0].shape};
    out.push_back(stack(c, scans[j], 0, false, t));
  }
  out.insert(out.begin(), std::make_move_iterator(state.begin()), std::make_move_iterator(state.end()));
  return out;
}

// One scan (no batch dim): `states`, the scan inputs `xs` scanned along `axes`; returns the final states, then the
// scan outputs.
std::vector<Tensor> scan_once(const Ctx& c, const Graph& body, const ScanLayout& s, std::vector<Tensor> states,
                              const std::vector<const Tensor*>& xs, const std::vector<int64_t>& axes) {
  const int64_t len = xs.at(0)->shape.at(static_cast<size_t>(axes[0]));
  const std::vector<const Tensor*> caps = captured(c);
  std::vector<std::vector<Tensor>> scans(s.out_axes.size());
  std::vector<Tensor> slices(xs.size());
  std::vector<const Tensor*> ins;
  for (int64_t i = 0; i < len; ++i) {
    ins.clear();
    for (const Tensor& st : states) ins.push_back(&st);
    for (size_t k = 0; k < xs.size(); ++k) {
      slices[k] = slice_at(*xs[k], static_cast<size_t>(axes[k]), s.in_reverse[k] ? len - 1 - i : i);
      ins.push_back(&slices[k]);
    }
    ins.insert(ins.end(), caps.begin(), caps.end());
    std::vector<Tensor> outs = run_body(c, body, ins);
    for (size_t k = 0; k < states.size(); ++k) states[k] = std::move(outs[k]);
    for (size_t j = 0; j < scans.size(); ++j) scans[j].push_back(std::move(outs[states.size() + j]));
  }
  std::vector<Tensor> out = std::move(states);
  for (size_t j = 0; j < scans.size(); ++j) {
    TensorType t;
    if (scans[j].empty()) {
      std::vector<const Tensor*> in;
      for (const Tensor& st : out) in.push_back(&st);
      std::vector<Tensor> empty_slices;
      for (size_t k = 0; k < xs.size(); ++k) {
        Shape sh = xs[k]->shape;
        sh.erase(sh.begin() + axes[k]);
        empty_slices.emplace_back(xs[k]->dtype, sh);
      }
      for (const Tensor& e : empty_slices) in.push_back(&e);
      in.insert(in.end(), caps.begin(), caps.end());
      t = output_type(c, body, in, out.size() + j);
    } else {
      t = {scans[j][0].dtype, scans[j][0].shape};
    }
    out.push_back(stack(c, scans[j], s.batched ? 0 : s.out_axes[j], s.out_reverse[j], t));
  }
  return out;
}

std::vector<Tensor> run_scan(const Ctx& c) {
  const Graph& body = body_of(c, "body");
  const ScanLayout s = scan_layout(c.node, body.outputs.size(), c.opset);
  std::vector<Tensor> states;
  std::vector<const Tensor*> xs;
  std::vector<int64_t> axes;
  for (int k = 0; k < s.num_state; ++k) states.push_back(c.req(static_cast<size_t>(s.first_state + k)));
  for (int k = 0; k < s.num_scan_in; ++k) {
    const Tensor& x = c.req(static_cast<size_t>(s.first_state + s.num_state + k));
    xs.push_back(&x);
    axes.push_back(c.axis(s.in_axes[static_cast<size_t>(k)], static_cast<int64_t>(x.shape.size())));
    if (x.shape[static_cast<size_t>(axes.back())] != xs[0]->shape[static_cast<size_t>(axes[0])])
      c.fail("scan inputs have different lengths");
  }
  if (!s.batched) return scan_once(c, body, s, std::move(states), xs, axes);
  // Opset 8: every input has a leading batch dim; each batch entry is one scan.
  const int64_t batch = xs[0]->shape.at(0);
  const int64_t len = xs[0]->shape.at(1);
  if (batch == 0) c.unsupported("an empty batch is not supported");
  if (const Tensor* lens = c.in(0))
    for (int64_t l : lens->as_int64s())
      if (l != len) c.unsupported("sequence_lens shorter than the scan inputs are not supported");
  for (int64_t& a : axes) a -= 1;
  std::vector<std::vector<Tensor>> per_out;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> st, x;
    for (const Tensor& t : states) st.push_back(slice_at(t, 0, b));
    for (const Tensor* t : xs) x.push_back(slice_at(*t, 0, b));
    std::vector<const Tensor*> xp;
    for (const Tensor& t : x) xp.push_back(&t);
    std::vector<Tensor> outs = scan_once(c, body, s, std::move(st), xp, axes);
    per_out.resize(outs.size());
    for (size_t k = 0; k < outs.size(); ++k) per_out[k].push_back(std::move(outs[k]));
  }
  std::vector<Tensor> out;
  for (auto& parts : per_out) out.push_back(stack(c, parts, 0, false, {parts[0].dtype, parts[0].shape}));
  return out;
}

}  // namespace

void register_control(KernelTable& t) {
  t["If"] = run_if;
  t["Loop"] = run_loop;
  t["Scan"] = run_scan;
}

}  // namespace gspmd::kern
