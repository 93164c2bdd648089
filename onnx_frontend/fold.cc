// The load-time typing and folding pass (fold.h).
#include "onnx_frontend/fold.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ir/control_flow.h"
#include "core/shapes/symbolic.h"
#include "onnx_frontend/file_util.h"
#include "onnx_frontend/fold_impl.h"

namespace gspmd::frontend {
namespace {

bool is_nondeterministic(const std::string& op) {
  static const char* const kOps[] = {"RandomNormal",      "RandomUniform", "RandomNormalLike",
                                     "RandomUniformLike", "Multinomial",   "Bernoulli"};
  return std::any_of(std::begin(kOps), std::end(kOps), [&](const char* o) { return op == o; });
}

bool is_onnx_domain(const Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

// Bytes of a value of type `t`, saturated at INT64_MAX (a model may declare any dims; this only meets the folding cap).
int64_t type_bytes(const TensorType& t) {
  int64_t bytes = 0;
  try {
    bytes = static_cast<int64_t>(dtype_size(t.dtype));
  } catch (const std::exception&) {
    return 0;
  }
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(bytes, d, &bytes)) return INT64_MAX;
  return bytes;
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// Shape / Size folded from a static shape. Returns false when the node is not one of them.
bool fold_shape_op(const Graph& g, const Node& n, std::vector<Tensor>& out) {
  if (n.op_type == "Shape") {
    const Shape& s = g.values[n.inputs[0]].shape;
    const int64_t r = static_cast<int64_t>(s.size());
    int64_t start = g.opset >= 15 ? n.i("start", 0) : 0;
    int64_t end = g.opset >= 15 ? n.i("end", r) : r;
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<int64_t>(start, 0, r);
    end = std::clamp<int64_t>(end, 0, r);
    std::vector<int64_t> dims;
    for (int64_t i = start; i < end; ++i) dims.push_back(s[static_cast<size_t>(i)]);
    out.push_back(Tensor::from_int64s(dims));
    return true;
  }
  if (n.op_type == "Size") {
    out.push_back(Tensor::from_int64s({num_elements(g.values[n.inputs[0]].shape)}, /*scalar=*/true));
    return true;
  }
  return false;
}

// True when a Dropout node computes the inference identity: opset < 12 (no training mode), or training_mode absent,
// or a constant false.
bool dropout_is_identity(const Graph& g, const Node& n) {
  if (g.opset < 7) return n.i("is_test", 0) != 0;
  if (g.opset < 12 || n.inputs.size() < 3 || n.inputs[2] < 0) return true;
  const Value& tm = g.values[n.inputs[2]];
  return tm.data && tm.data->numel() == 1 && tm.data->as_int64s()[0] == 0;
}

// The graph inputs whose values `v` is computed from, in graph-input order.
std::vector<std::string> graph_inputs_reaching(const Graph& g, int v) {
  std::vector<char> seen(g.values.size(), 0);
  std::vector<int> todo{v};
  seen[v] = 1;
  while (!todo.empty()) {
    const int x = todo.back();
    todo.pop_back();
    const int p = g.values[x].producer;
    if (p < 0) continue;
    for (int i : g.nodes[p].inputs)
      if (i >= 0 && !seen[i]) {
        seen[i] = 1;
        todo.push_back(i);
      }
  }
  std::vector<std::string> out;
  for (int i : g.inputs)
    if (seen[i]) out.push_back(g.values[i].name);
  return out;
}

// Node `ni`, an If whose condition is a constant, is replaced by its taken branch's nodes (renamed "<if>/<node>",
// values made unique in `g`); outputs that the branch does not compute itself come from Identity nodes. Returns false
// when node `ni` is not such an If.
bool inline_constant_if(Pass& p, size_t ni) {
  Graph& g = p.g;
  if (ni >= g.nodes.size()) return false;
  const Node& n = g.nodes[ni];
  if (!is_onnx_domain(n) || n.op_type != "If" || n.inputs.empty() || n.inputs[0] < 0) return false;
  const Value& c = g.values[static_cast<size_t>(n.inputs[0])];
  if (!c.data || c.data->numel() != 1) return false;
  const Node node = n;  // keeps the branch alive
  const bool taken = c.data->bytes[0] != std::byte{0};
  const char* attr = taken ? "then_branch" : "else_branch";
  const Graph* b = node.g(attr);
  if (!b) return false;
  // An If's body inputs are its captured values.
  const std::vector<int> bound(node.inputs.end() - static_cast<int64_t>(b->inputs.size()), node.inputs.end());
  std::vector<int> out_ids;
  std::vector<Node> spliced = p.clone_body(*b, node.name, bound, node.outputs, /*keep_types=*/true, out_ids);
  for (size_t k = 0; k < node.outputs.size() && k < out_ids.size(); ++k) {
    if (out_ids[k] == node.outputs[k]) continue;
    Node id;
    id.name = fmt::format("{}/output_{}", node.name, k);
    id.op_type = "Identity";
    id.inputs = {out_ids[k]};
    id.outputs = {node.outputs[k]};
    spliced.push_back(std::move(id));
  }
  p.splice(ni, std::move(spliced));
  p.report.rewrites.push_back(
      fmt::format("node '{}' (If): condition is constant {}, {} inlined", node.name, taken ? "true" : "false", attr));
  return true;
}

// True when typed body `b` of Loop / Scan node `n` gives its loop-carried values (Loop: carried values; Scan: states)
// back with the types they entered with, so that what was typed and folded for the first iteration holds for all.
// `unknown`: the body's untyped values.
bool keeps_carried_types(const Node& n, const Graph& b, const std::unordered_set<std::string>& unknown) {
  size_t first_in = 0, first_out = 0, count = 0;
  if (n.op_type == "Loop") {
    first_in = 2;
    first_out = 1;
    count = own_inputs(n) - 2;
  } else if (n.op_type == "Scan") {
    count = static_cast<size_t>(scan_layout(n, b.outputs.size(), b.opset).num_state);
  }
  for (size_t k = 0; k < count; ++k) {
    const Value& in = b.values[static_cast<size_t>(b.inputs.at(first_in + k))];
    const Value& out = b.values[static_cast<size_t>(b.outputs.at(first_out + k))];
    if (unknown.count(out.name) || out.dtype != in.dtype || out.shape != in.shape) return false;
  }
  return true;
}

void run_pass(Pass& p);

// Types the bodies of control-flow node `n` (its inputs typed `types`): each body's inputs get the types the node
// binds (core/ir/control_flow.h) and infer_and_fold types (and folds) its values. A body that cannot be bound, or
// whose carried values do not provably keep their types, is left as it is (the shape function reports the problem;
// the kernel runs the body as it is).
// Returns, per body kept typed, per body output: 1 when typed.
std::map<std::string, std::vector<char>> type_bodies(Node& n, const std::vector<const TensorType*>& types,
                                                     const LoadOptions& opts, LoadReport& report) {
  std::map<std::string, std::vector<char>> typed;
  for (auto& [name, a] : n.attrs) {
    auto* body = std::get_if<std::shared_ptr<const Graph>>(&a);
    if (!body) continue;
    Graph b = **body;
    std::vector<TensorType> in;
    try {
      in = body_input_types(n, b, types, b.opset);
    } catch (const std::exception&) {
      continue;
    }
    for (size_t k = 0; k < in.size(); ++k) {
      Value& v = b.values[static_cast<size_t>(b.inputs[k])];
      v.dtype = in[k].dtype;
      v.shape = in[k].shape;
    }
    std::unordered_set<std::string> unknown;
    for (const Value& v : b.values)
      if (v.dtype == DType::kUndefined || v.kind != ValueKind::kTensor) unknown.insert(v.name);
    std::map<std::string, std::string> why;
    LoadReport inner;
    Pass bp{b, unknown, why, opts, inner, {}, {}, {}};
    bp.body = true;
    bp.branch = n.op_type == "If";
    run_pass(bp);
    bool keeps = false;
    try {
      keeps = keeps_carried_types(n, b, unknown);
    } catch (const std::exception&) {
    }
    if (!keeps) continue;
    for (auto& d : inner.shape_disagreements) report.shape_disagreements.push_back(std::move(d));
    std::vector<char>& t = typed[name];
    for (int o : b.outputs) t.push_back(!unknown.count(b.values[static_cast<size_t>(o)].name));
    a = std::make_shared<const Graph>(std::move(b));
  }
  return typed;
}

}  // namespace

void simplify_for_inference(Graph& g, LoadReport& report) {
  std::vector<char> read(g.values.size(), 0);
  for (const Node& n : g.nodes)
    for (int v : n.inputs)
      if (v >= 0) read[v] = 1;
  for (int v : g.outputs) read[v] = 1;
  for (Node& n : g.nodes) {
    while (n.outputs.size() > 1 && !read[n.outputs.back()]) {
      report.rewrites.push_back(fmt::format("node '{}' ({}): unused output '{}' dropped", n.name, n.op_type,
                                            g.values[n.outputs.back()].name));
      g.values[n.outputs.back()].producer = -1;
      n.outputs.pop_back();
    }
    if (is_onnx_domain(n) && n.op_type == "Dropout" && n.outputs.size() == 1 && dropout_is_identity(g, n)) {
      n.op_type = "Identity";
      n.inputs.resize(1);
      n.attrs.clear();
      report.rewrites.push_back(fmt::format("node '{}' (Dropout): inference (not training), an Identity", n.name));
    }
  }
}

namespace {

Inferred infer(const Pass& p, const Node& n, const NodeInputs& in) {
  Inferred r;
  if (!p.opts.shape_function) return r;
  try {
    r.types = p.opts.shape_function(n, in.types, in.values, p.g.opset);
  } catch (const DataDependentError& e) {
    r.error = e.what();
    r.needed_input = e.input;
    r.data_dependent = true;
  } catch (const UnsupportedError&) {
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

// What folding Loop or Scan node `n` would cost (kMaxFoldBodyBytes): the bytes its body's nodes write per iteration
// (each output at least kFoldNodeBytes; untyped outputs at that), times its iterations: a Loop's trip count (none:
// kMaxLoopIterations; 0 when the condition starts false), a Scan's scan length. Saturated at INT64_MAX; 0 for other
// nodes.
int64_t body_work_bytes(const Node& n, const NodeInputs& in) {
  if (n.op_type != "Loop" && n.op_type != "Scan") return 0;
  const Graph* body = n.g("body");
  if (!body) return 0;
  int64_t iterations = kMaxLoopIterations;
  try {
    if (n.op_type == "Loop") {
      const Tensor* trips = n.inputs.size() > 0 ? in.values[0] : nullptr;
      const Tensor* cond = n.inputs.size() > 1 ? in.values[1] : nullptr;
      if (cond && cond->dtype == DType::kBool && cond->numel() == 1 && cond->bytes[0] == std::byte{0})
        iterations = 0;
      else if (trips && trips->numel() == 1)
        iterations = std::clamp<int64_t>(trips->as_int64s()[0], 0, kMaxLoopIterations);
    } else {
      const ScanLayout l = scan_layout(n, body->outputs.size(), body->opset);
      const TensorType* x = l.num_scan_in > 0 ? in.types.at(static_cast<size_t>(l.first_state + l.num_state)) : nullptr;
      if (x && !x->shape.empty()) {
        const int64_t r = static_cast<int64_t>(x->shape.size());
        const int64_t axis = l.batched ? 1 : (l.in_axes.empty() ? 0 : l.in_axes[0]);
        if (axis >= -r && axis < r) iterations = x->shape[static_cast<size_t>(axis < 0 ? axis + r : axis)];
      }
    }
  } catch (const std::exception&) {  // the kernel reports what is wrong with the node
  }
  int64_t per_iteration = 0;
  for (const Node& bn : body->nodes)
    for (int o : bn.outputs) {
      const Value& v = body->values[static_cast<size_t>(o)];
      const int64_t bytes = std::max(kFoldNodeBytes, type_bytes({v.dtype, v.shape}));
      if (__builtin_add_overflow(per_iteration, bytes, &per_iteration)) return INT64_MAX;
    }
  int64_t total = 0;
  return __builtin_mul_overflow(per_iteration, iterations, &total) ? INT64_MAX : total;
}

// Node `ni` evaluated once when it folds (fold.h): deterministic ai.onnx ops on constants within the size cap, and
// Shape / Size of static values. Its outputs become constants; returns false when it does not fold.
bool fold(Pass& p, size_t ni, const NodeInputs& in, const Inferred& inferred) {
  Graph& g = p.g;
  const Node& n = g.nodes[ni];
  if (!is_onnx_domain(n) || is_nondeterministic(n.op_type)) return false;
  std::vector<Tensor> results;
  if ((n.op_type == "Shape" || n.op_type == "Size") && n.inputs.size() == 1 && n.inputs[0] >= 0) {
    fold_shape_op(g, n, results);
  } else if (in.all_const && p.opts.evaluator) {
    int64_t out_bytes = 0;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const Value& v = g.values[static_cast<size_t>(n.outputs[k])];
      const int64_t bytes = k < inferred.types.size() ? type_bytes(inferred.types[k])
                            : p.unknown.count(v.name) ? 0
                                                      : type_bytes({v.dtype, v.shape});
      if (__builtin_add_overflow(out_bytes, bytes, &out_bytes)) out_bytes = INT64_MAX;
    }
    if (out_bytes > kMaxExpandingFoldBytes && out_bytes > in.const_bytes) {
      p.report.not_folded.push_back(
          fmt::format("node '{}' ({}): {} of outputs from {} of constants, over the {} "
                      "folding cap: it runs as a node",
                      n.name, n.op_type, mib(out_bytes), mib(in.const_bytes), mib(kMaxExpandingFoldBytes)));
      return false;
    }
    if (const int64_t work = body_work_bytes(n, in); work > kMaxFoldBodyBytes) {
      p.report.not_folded.push_back(
          fmt::format("node '{}' ({}): its body writes {} over its iterations, over the {} "
                      "folding cap: it runs as a node",
                      n.name, n.op_type, mib(work), mib(kMaxFoldBodyBytes)));
      return false;
    }
    try {
      results = p.opts.evaluator(n, in.values, g.opset);
    } catch (const std::exception&) {
      return false;  // no kernel (or the kernel rejects it): keep the node; the executor reports it
    }
  }
  if (results.empty() || results.size() < n.outputs.size()) return false;
  LoadReport::Folded f{n.name, n.op_type, {}, 0};
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    Value& v = g.values[static_cast<size_t>(n.outputs[k])];
    v.dtype = results[k].dtype;
    v.shape = results[k].shape;
    v.is_initializer = true;
    v.producer = -1;
    f.outputs.push_back(v.name);
    f.bytes += static_cast<int64_t>(results[k].nbytes());
    v.data = std::make_shared<const Tensor>(std::move(results[k]));
    p.typed(n.outputs[k]);
  }
  p.report.folded.push_back(std::move(f));
  return true;
}

// Types node `n`'s outputs with the shape function's answer, cross-checked against ONNX inference where it typed
// them (fold.h; over a data-dependent dim, `data_dependent`, only their dtypes: a declared shape is the one some data
// gave); an output left untyped gets its reason in p.why.
void type_outputs(Pass& p, const Node& n, const Inferred& inferred, bool data_dependent = false) {
  Graph& g = p.g;
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    Value& v = g.values[static_cast<size_t>(n.outputs[k])];
    const bool onnx_typed = !p.unknown.count(v.name);
    std::string disagreement;
    if (k >= inferred.types.size()) {
      if (!onnx_typed) {
        p.why[v.name] = untyped_reason(g, n, inferred.error, inferred.data_dependent ? inferred.needed_input : -2);
      } else if (!inferred.error.empty() && !inferred.data_dependent) {
        // ONNX typed what the op's spec rejects (a Conv's group that does not divide its channels): the kernel
        // would fail on it at run time
        throw InputError(inferred.error);
      }
    } else {
      const TensorType& t = inferred.types[k];
      // a data-dependent output's declared shape (the node tests declare the one their data gives) is no type
      if (onnx_typed && (t.dtype != v.dtype || (t.shape != v.shape && !data_dependent)))
        disagreement = fmt::format("value '{}' (node '{}' ({})): shape function {}, ONNX inference {}", v.name, n.name,
                                   n.op_type, type_str(t.dtype, t.shape), type_str(v.dtype, v.shape));
      v.dtype = t.dtype;
      v.shape = t.shape;
      p.typed(n.outputs[k]);
    }
    if (disagreement.empty()) continue;
    if (p.opts.strict_shapes) throw InputError(disagreement);
    p.report.shape_disagreements.push_back(std::move(disagreement));
  }
}

// The pass over one graph (infer_and_fold's loop; bodies run it too): per node, in order, inline a constant If,
// lower sequences and optionals, then fold or type it.
void run_pass(Pass& p) {
  Graph& g = p.g;
  p.dead.assign(g.nodes.size(), 0);
  NodeInputs in;
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    while (inline_constant_if(p, ni)) {
    }
    if (ni >= g.nodes.size()) break;
    std::string symbolic_node;  // "node 'n' (Op)" when it reads a symbolic value: lowering it would freeze the hints
    if (std::any_of(g.nodes[ni].inputs.begin(), g.nodes[ni].inputs.end(),
                    [&](int v) { return v >= 0 && g.values[static_cast<size_t>(v)].sym; }))
      symbolic_node = fmt::format("node '{}' ({})", g.nodes[ni].name, g.nodes[ni].op_type);
    const Lowered lowered = lower_structured(p, ni);
    if (lowered != Lowered::kNo && !symbolic_node.empty())
      throw UnsupportedError(symbolic_node +
                             ": a sequence or optional of values with symbolic dims: bind them with --dim");
    if (lowered == Lowered::kSpliced) {
      --ni;  // visit the replacement nodes
      continue;
    }
    if (lowered == Lowered::kDone) p.dead[ni] = 1;
    if (lowered != Lowered::kNo) continue;
    const Node& n = g.nodes[ni];
    in.read(p, n);
    if (!in.untyped.empty()) {  // the outputs stay as ONNX typed them
      for (int o : n.outputs)
        if (p.unknown.count(g.values[static_cast<size_t>(o)].name))
          p.why[g.values[static_cast<size_t>(o)].name] =
              fmt::format("has no static shape: its input '{}' has none", in.untyped);
      continue;
    }
    std::map<std::string, std::vector<char>> typed;
    if (n.has_body()) typed = type_bodies(g.nodes[ni], in.types, p.opts, p.report);
    Inferred inferred = infer(p, n, in);
    std::vector<SymbolicValue> syms;
    if (type_data_dependent_if(p, n, typed, inferred, syms) ||
        type_data_dependent_loop(p, n, in, typed, inferred, syms) || type_data_dependent(p, n, in, inferred, syms)) {
      type_outputs(p, n, inferred, /*data_dependent=*/true);
      attach_symbols(p, n, std::move(syms));
      continue;
    }
    syms = infer_symbols(p, n, in, inferred);
    if (symbols_fold(in, syms) && fold(p, ni, in, inferred)) {
      p.dead[ni] = 1;
      attach_symbols(p, n, std::move(syms));
      continue;
    }
    // over a data-dependent dim, a static shape the model declares is the one its test data gave
    const bool runtime = std::any_of(in.syms.begin(), in.syms.end(), [&](const SymbolicValue* x) {
      return x &&
             std::any_of(x->dims.begin(), x->dims.end(), [&](const DimExpr& d) { return reads_runtime_dim(g, d); });
    });
    type_outputs(p, n, inferred, runtime);
    attach_symbols(p, n, std::move(syms));
  }
  if (std::find(p.dead.begin(), p.dead.end(), 1) == p.dead.end()) return;
  std::vector<Node> kept;
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    if (p.dead[ni]) continue;
    for (int o : g.nodes[ni].outputs) g.values[static_cast<size_t>(o)].producer = static_cast<int>(kept.size());
    kept.push_back(std::move(g.nodes[ni]));
  }
  g.nodes = std::move(kept);
}

}  // namespace

std::string untyped_reason(const Graph& g, const Node& n, const std::string& error, int needed_input) {
  const std::string prefix = fmt::format("node '{}' ({}): ", n.name, n.op_type);
  const std::string detail = error.rfind(prefix, 0) == 0 ? error.substr(prefix.size()) : error;
  if (needed_input >= 0 && static_cast<size_t>(needed_input) < n.inputs.size() && n.inputs[needed_input] >= 0) {
    const int needed = n.inputs[needed_input];
    const std::vector<std::string> from = graph_inputs_reaching(g, needed);
    const std::string& name = g.values[needed].name;
    if (from.size() == 1 && from[0] == name)
      return fmt::format(
          "has a data-dependent shape: {}, graph input '{}', which is known only at run time; make "
          "'{}' a constant (an initializer) to bind it",
          detail, name, name);
    if (!from.empty())
      return fmt::format(
          "has a data-dependent shape: {}, '{}', computed at run time from graph input{} '{}'; make "
          "{} to bind it",
          detail, name, from.size() > 1 ? "s" : "", fmt::join(from, "', '"),
          from.size() > 1 ? "them constants (initializers)" : "it a constant (an initializer)");
    return fmt::format("has a data-dependent shape: {}, '{}', which is known only at run time", detail, name);
  }
  if (needed_input == -1) return fmt::format("has a data-dependent shape: {}", detail);
  if (!error.empty()) return fmt::format("has no static shape: {}", detail);
  return fmt::format("has no static shape: ONNX inference left it untyped and no shape function typed {}", n.op_type);
}

void Pass::splice(size_t ni, std::vector<Node> nodes) {
  for (int o : g.nodes[ni].outputs) g.values[static_cast<size_t>(o)].producer = -1;
  const auto at = static_cast<int64_t>(ni);
  g.nodes.erase(g.nodes.begin() + at);
  dead.erase(dead.begin() + at);
  const size_t count = nodes.size();
  g.nodes.insert(g.nodes.begin() + at, std::make_move_iterator(nodes.begin()), std::make_move_iterator(nodes.end()));
  dead.insert(dead.begin() + at, count, 0);
  for (size_t k = ni; k < g.nodes.size(); ++k)
    for (int o : g.nodes[k].outputs) g.values[static_cast<size_t>(o)].producer = static_cast<int>(k);
}

std::vector<Node> Pass::clone_body(const Graph& b, const std::string& prefix, const std::vector<int>& bound,
                                   const std::vector<int>& outputs, bool keep_types, std::vector<int>& out_ids) {
  std::vector<int> map(b.values.size(), -1);
  for (size_t j = 0; j < b.inputs.size() && j < bound.size(); ++j) map[static_cast<size_t>(b.inputs[j])] = bound[j];
  for (size_t k = 0; k < b.outputs.size() && k < outputs.size(); ++k) {
    const auto o = static_cast<size_t>(b.outputs[k]);
    if (outputs[k] >= 0 && b.values[o].producer >= 0 && map[o] < 0) map[o] = outputs[k];
  }
  for (size_t v = 0; v < b.values.size(); ++v) {
    const Value& bv = b.values[v];
    if (map[v] >= 0 || (bv.producer < 0 && !bv.is_initializer)) continue;  // bound, or an input left unbound
    const int id = g.add_value_unique(prefix + "/" + bv.name, DType::kUndefined, {});
    Value& nv = g.values[static_cast<size_t>(id)];
    nv.kind = bv.kind;
    if (bv.producer < 0 || keep_types) {
      nv.dtype = bv.dtype;
      nv.shape = bv.shape;
    }
    if (bv.producer < 0) {  // a constant of the body
      nv.is_initializer = true;
      nv.data = bv.data;
    } else if (!keep_types || bv.dtype == DType::kUndefined || bv.kind != ValueKind::kTensor) {
      unknown.insert(nv.name);  // typed when the pass visits its node
    }
    map[v] = id;
  }
  std::vector<Node> nodes;
  nodes.reserve(b.nodes.size());
  for (const Node& bn : b.nodes) {
    Node m = bn;
    m.name = prefix + "/" + bn.name;
    for (int& i : m.inputs)
      if (i >= 0) i = map[static_cast<size_t>(i)];
    for (int& o : m.outputs) o = map[static_cast<size_t>(o)];
    nodes.push_back(std::move(m));
  }
  out_ids.clear();
  for (int o : b.outputs) out_ids.push_back(map[static_cast<size_t>(o)]);
  return nodes;
}

int Pass::add_constant(const std::string& hint, Tensor t) {
  const int id = g.add_value_unique(hint, t.dtype, t.shape);
  Value& v = g.values[static_cast<size_t>(id)];
  v.is_initializer = true;
  v.data = std::make_shared<const Tensor>(std::move(t));
  return id;
}

void Pass::typed(int v) {
  const std::string& name = g.values[static_cast<size_t>(v)].name;
  unknown.erase(name);
  why.erase(name);
}

void infer_and_fold(Graph& g, std::unordered_set<std::string>& unknown, std::map<std::string, std::string>& why,
                    const LoadOptions& opts, LoadReport& report) {
  Pass p{g, unknown, why, opts, report, {}, {}, {}};
  bind_structured_inputs(p);
  run_pass(p);
  flatten_outputs(p);
}

}  // namespace gspmd::frontend
