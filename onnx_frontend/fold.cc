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

// One node's inputs as the shape function and the evaluator see them.
struct NodeInputs {
  std::vector<TensorType> storage;
  std::vector<const TensorType*> types;    // nullptr: absent
  std::vector<const Tensor*> values;       // nullptr: not a constant
  std::vector<const SymbolicValue*> syms;  // nullptr: static
  bool symbolic = false;                   // some input reads a dim symbol
  std::string untyped;                     // the first input without a static type ("" when all are typed)
  bool all_const = false;
  int64_t const_bytes = 0;

  void read(const Pass& p, const Node& n) {
    storage.assign(n.inputs.size(), {});
    types.assign(n.inputs.size(), nullptr);
    values.assign(n.inputs.size(), nullptr);
    syms.assign(n.inputs.size(), nullptr);
    symbolic = false;
    untyped.clear();
    all_const = !n.inputs.empty();
    const_bytes = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (n.inputs[k] < 0) continue;
      const Value& v = p.g.values[static_cast<size_t>(n.inputs[k])];
      if (p.unknown.count(v.name)) {
        if (untyped.empty()) untyped = v.name;
        continue;
      }
      storage[k] = {v.dtype, v.shape};
      types[k] = &storage[k];
      values[k] = v.data.get();
      syms[k] = v.sym.get();
      symbolic = symbolic || v.sym != nullptr;
      if (v.data) const_bytes += static_cast<int64_t>(v.data->nbytes());
      all_const = all_const && v.data != nullptr && !(v.is_initializer && p.opts.variable && p.opts.variable(v));
    }
  }
};

// The shape function's answer for one node: its output types, or why it has none.
struct Inferred {
  std::vector<TensorType> types;  // empty when the shape function has none or failed
  std::string error;
  int needed_input = -1;  // DataDependentError's input
  bool data_dependent = false;
};

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

// A fresh name for a data-dependent symbol: "<prefix>_<k>" (the prefix in lower case: "loop_3" for a Loop), k the
// number of such symbols so far (or more, to be unique among the dim symbols).
std::string fresh_runtime_symbol(const Pass& p, std::string prefix) {
  for (char& ch : prefix) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string name;
  for (size_t k = p.g.runtime_dims.size(); name.empty() || p.g.dim_hints.count(name); ++k)
    name = fmt::format("{}_{}", prefix, k);
  return name;
}

// Registers the data-dependent symbol `name` that node `node` computes (Graph::runtime_dims): its upper bound (-1:
// none) and its hint, the size it is typed and costed at (the bound, else `unbounded_hint`). In the model's graph a
// `--dim NAME=V` (LoadOptions::dims) gives both instead (RuntimeDim::given). Returns the hint.
int64_t add_runtime_dim(Pass& p, const std::string& name, const std::string& node, std::string what, int64_t bound,
                        int64_t unbounded_hint = kUnboundedDimHint) {
  bool given = false;
  if (auto it = p.opts.dims.find(name); it != p.opts.dims.end() && !p.body) {
    if (it->second < 0) throw InputError(fmt::format("--dim {}={}: a size must be >= 0", name, it->second));
    bound = it->second;
    given = true;
  }
  const int64_t hint = bound >= 0 ? bound : unbounded_hint;
  p.g.dim_hints[name] = hint;
  p.g.runtime_dims[name] = {node, std::move(what), bound, given};
  return hint;
}

// Concat node `n` whose axis dim, the sum of its inputs' data-dependent counts, has more terms than a DimExpr keeps
// (SSD's 91 per-class detection counts): that dim becomes a fresh data-dependent symbol ("concat_3", the
// RuntimeDim of n), bound by the sum of its inputs' bounds, unbounded when one of them is. nullopt for another node,
// or when data-dependent dims are off.
std::optional<SymbolicValue> concat_of_many(Pass& p, const Node& n, const NodeInputs& in, Inferred& inferred) {
  if (n.op_type != "Concat" || !p.opts.data_dependent_dims || p.body || inferred.types.size() != 1) return {};
  const Shape& shape = inferred.types[0].shape;
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t ax = n.i("axis", 0) + (n.i("axis", 0) < 0 ? rank : 0);
  if (ax < 0 || ax >= rank) return {};
  SymbolicValue out;
  out.dims.assign(shape.begin(), shape.end());
  bool bounded = true;
  std::vector<std::string> terms;
  for (size_t k = 0; k < in.syms.size(); ++k) {
    const SymbolicValue* x = in.syms[k];
    if (!x) {
      if (in.types[k]) terms.push_back(std::to_string(in.types[k]->shape.at(static_cast<size_t>(ax))));
      continue;
    }
    if (x->dims.size() != shape.size()) return {};
    for (int64_t i = 0; i < rank; ++i)
      if (i != ax && !x->dims[static_cast<size_t>(i)].is_constant()) out.dims[static_cast<size_t>(i)] = x->dims[i];
    const DimExpr& e = x->dims[static_cast<size_t>(ax)];
    terms.push_back(e.str());
    for (const std::string& s : e.symbols())
      if (auto rt = p.g.runtime_dims.find(s); rt != p.g.runtime_dims.end() && rt->second.bound < 0) bounded = false;
  }
  std::sort(terms.begin(), terms.end());
  std::string& name = p.sums[fmt::format("{}", fmt::join(terms, " + "))];
  if (name.empty()) {
    name = fresh_runtime_symbol(p, "concat");
    const int64_t sum = shape[static_cast<size_t>(ax)];  // the sum at the hints, which are the counts' bounds
    add_runtime_dim(p, name, n.name, fmt::format("the sum of the dim {} sizes of its {} inputs", ax, n.inputs.size()),
                    bounded ? sum : -1, sum);
  }
  inferred.types[0].shape[static_cast<size_t>(ax)] = p.g.dim_hints.at(name);
  out.dims[static_cast<size_t>(ax)] = DimExpr::symbol(name);
  return out;
}

// Control-flow node `n` on values with symbolic dims (torchvision's paste-masks Loop: one mask per kept detection,
// concatenated onto a carried value that grows each iteration): its bodies are typed at the hints only, so every
// output dim becomes a fresh data-dependent symbol ("loop_5"), unbounded, typed at the shape function's answer at
// the hints (kUnboundedDimHint when that is 0), known when the node runs. Sets `inferred`'s types to those sizes.
std::vector<SymbolicValue> control_flow_over_symbols(Pass& p, const Node& n, Inferred& inferred) {
  std::vector<SymbolicValue> out(inferred.types.size());
  for (size_t k = 0; k < inferred.types.size(); ++k) {
    for (int64_t& d : inferred.types[k].shape) {
      const std::string name = fresh_runtime_symbol(p, n.op_type);
      d = add_runtime_dim(p, name, n.name, fmt::format("a dim of output {}, which its body computes", k), -1,
                          d > 0 ? d : kUnboundedDimHint);
      out[k].dims.push_back(DimExpr::symbol(name));
    }
  }
  return out;
}

// The node's outputs over the dim symbols (LoadOptions::keep_symbols), when an input reads one: empty otherwise, or
// when the shape function gave no types. Its guards join the graph's. Throws UnsupportedError for a node whose
// outputs' dims cannot be kept symbolic (core/shapes/symbolic.h).
std::vector<SymbolicValue> infer_symbols(Pass& p, const Node& n, const NodeInputs& in, Inferred& inferred) {
  if (!in.symbolic || inferred.types.empty()) return {};
  std::vector<SymbolicInput> sin(n.inputs.size());
  for (size_t k = 0; k < sin.size(); ++k) sin[k] = {in.types[k], in.values[k], in.syms[k]};
  auto adopt = [&](SymbolicResult& r) {  // its guards join the graph's
    for (auto& guard : r.assumed_equal)
      if (std::find(p.g.dim_guards.begin(), p.g.dim_guards.end(), guard) == p.g.dim_guards.end())
        p.g.dim_guards.push_back(std::move(guard));
    return std::move(r.outputs);
  };
  if (n.has_body()) {
    if (has_symbolic_rule(n.domain, n.op_type)) {  // a Scan whose body sees static values: its length stays
      try {
        SymbolicResult r = infer_symbolic(n, sin, inferred.types, p.g.opset, p.g.dim_hints);
        return adopt(r);
      } catch (const UnsupportedError&) {  // its body sees symbols: as other control flow
      }
    }
    if (p.opts.data_dependent_dims && !p.body) return control_flow_over_symbols(p, n, inferred);
    throw UnsupportedError(fmt::format(
        "node '{}' ({}): control flow on values with symbolic dims: bind them with --dim", n.name, n.op_type));
  }
  SymbolicResult r;
  try {
    r = infer_symbolic(n, sin, inferred.types, p.g.opset, p.g.dim_hints);
  } catch (const DimExprTooLarge& e) {
    if (std::optional<SymbolicValue> whole = concat_of_many(p, n, in, inferred)) return {std::move(*whole)};
    throw InputError(fmt::format("node '{}' ({}): {}", n.name, n.op_type, e.what()));
  } catch (const UnsupportedError& e) {  // --dim cannot bind a data-dependent dim: say what it is
    const std::string what = e.what(), bind = ": bind them with --dim";
    const bool runtime = std::any_of(sin.begin(), sin.end(), [&](const SymbolicInput& x) {
      return x.sym && std::any_of(x.sym->dims.begin(), x.sym->dims.end(),
                                  [&](const DimExpr& d) { return reads_runtime_dim(p.g, d); });
    });
    if (!runtime || what.size() < bind.size() || what.compare(what.size() - bind.size(), bind.size(), bind) != 0) throw;
    throw UnsupportedError(what.substr(0, what.size() - bind.size()) +
                           " (data-dependent dims are typed by NonZero, Compress, TopK, Unique and NonMaxSuppression "
                           "and the ops of core/shapes/symbolic.h; docs/shapes.md)");
  }
  return adopt(r);
}

// Node `n`'s outputs when their size depends on its input values (inferred.data_dependent; LoadOptions::
// data_dependent_dims): the count becomes a fresh data-dependent symbol ("nonzero_0"), typed at its upper bound,
// which joins the graph's dim_hints and runtime_dims (docs/shapes.md step 6). Sets `inferred` and `syms`; false when
// the op has no such rule or the node is in a body (it stays untyped, refused as before).
bool type_data_dependent(Pass& p, const Node& n, const NodeInputs& in, Inferred& inferred,
                         std::vector<SymbolicValue>& syms) {
  if (!inferred.data_dependent || !p.opts.data_dependent_dims || (p.body && !p.branch)) return false;
  std::vector<SymbolicInput> sin(n.inputs.size());
  for (size_t k = 0; k < sin.size(); ++k) sin[k] = {in.types[k], in.values[k], in.syms[k]};
  const std::string name = fresh_runtime_symbol(p, n.op_type == "NonMaxSuppression" ? "nms" : n.op_type);
  std::optional<DataDependentOutputs> r = infer_data_dependent(n, sin, p.g.opset, p.g.dim_hints, name);
  if (!r) return false;
  // unbounded (Range): typed and costed at kUnboundedDimHint, and no run checks it
  const int64_t bound = r->bound ? std::max<int64_t>(r->bound->eval(p.g.dim_hints), 0) : -1;
  const int by = r->input < n.inputs.size() ? n.inputs[r->input] : -1;
  add_runtime_dim(p, name, n.name,
                  by >= 0 ? fmt::format("{} of '{}'", r->counts, p.g.values[static_cast<size_t>(by)].name) : r->counts,
                  bound);
  inferred = Inferred{};
  for (size_t k = 0; k < r->outputs.size(); ++k) {
    Shape shape;
    for (const DimExpr& d : r->outputs[k].dims) shape.push_back(d.eval(p.g.dim_hints));
    inferred.types.push_back({r->dtypes[k], std::move(shape)});
  }
  syms = std::move(r->outputs);
  return true;
}

// Body `attr` of control-flow node `n` when type_bodies typed every one of its outputs (`typed`), else nullptr.
const Graph* typed_body(const Node& n, const std::map<std::string, std::vector<char>>& typed, const char* attr) {
  auto it = typed.find(attr);
  const Graph* body = n.g(attr);
  if (!body || it == typed.end() || std::find(it->second.begin(), it->second.end(), 0) != it->second.end())
    return nullptr;
  return body;
}

// If node `n` whose branches give outputs of different sizes (torchvision's batched NMS: an empty tensor, or the kept
// boxes of a NonMaxSuppression in the else branch), both branches typed (`typed`, type_bodies): each output dim
// that is not one constant in both becomes a fresh data-dependent symbol ("if_4", a RuntimeDim of n), bound by the
// larger of the branches' bounds, unbounded when one is. Sets `inferred` and `syms` as type_data_dependent does;
// false when a branch output is untyped, or the branches disagree on an output's dtype or rank.
bool type_data_dependent_if(Pass& p, const Node& n, const std::map<std::string, std::vector<char>>& typed,
                            Inferred& inferred, std::vector<SymbolicValue>& syms) {
  if (!inferred.data_dependent || !p.opts.data_dependent_dims || p.body || n.op_type != "If") return false;
  const Graph* branch[2] = {typed_body(n, typed, "then_branch"), typed_body(n, typed, "else_branch")};
  for (const Graph* b : branch)
    if (!b || b->outputs.size() != n.outputs.size()) return false;
  // a branch output dim's bound: its size at the branch's hints, which are its data-dependent dims' bounds
  auto bound_of = [](const Graph& g, const Value& v, size_t d) -> int64_t {
    if (!v.sym) return v.shape[d];
    for (const std::string& s : v.sym->dims[d].symbols())
      if (auto rt = g.runtime_dims.find(s); rt == g.runtime_dims.end() || rt->second.bound < 0) return -1;
    return v.shape[d];
  };
  std::vector<TensorType> types;
  std::vector<SymbolicValue> out;
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    const Value& a = branch[0]->values[static_cast<size_t>(branch[0]->outputs[k])];
    const Value& b = branch[1]->values[static_cast<size_t>(branch[1]->outputs[k])];
    if (a.kind != ValueKind::kTensor || a.dtype != b.dtype || a.shape.size() != b.shape.size()) return false;
    types.push_back({a.dtype, a.shape});
    out.emplace_back().dims.assign(a.shape.begin(), a.shape.end());
    for (size_t d = 0; d < a.shape.size(); ++d) {
      if (!a.sym && !b.sym && a.shape[d] == b.shape[d]) continue;
      const int64_t ba = bound_of(*branch[0], a, d), bb = bound_of(*branch[1], b, d);
      const int64_t bound = ba < 0 || bb < 0 ? -1 : std::max(ba, bb);
      const std::string name = fresh_runtime_symbol(p, "if");
      add_runtime_dim(p, name, n.name,
                      fmt::format("the dim {} size of output {} of the branch that runs (on '{}')", d, k,
                                  p.g.values[static_cast<size_t>(n.inputs.at(0))].name),
                      bound);
      types.back().shape[d] = p.g.dim_hints[name];
      out.back().dims[d] = DimExpr::symbol(name);
    }
  }
  inferred = Inferred{};
  inferred.types = std::move(types);
  syms = std::move(out);
  return true;
}

// Loop node `n` whose trip count is known only at run time (a computed M, or a condition its body computes: the ONNX
// tests' expanded Range), its body typed (`typed`, type_bodies; its carried values keep their types): the carried
// values keep their input types and each scan output is [loop_N, per-iteration dims...], loop_N a fresh
// data-dependent symbol for the number of iterations, bound by M when M is a constant, else unbounded. Sets
// `inferred` and `syms` as type_data_dependent does; false for another node or an untyped body output.
bool type_data_dependent_loop(Pass& p, const Node& n, const NodeInputs& in,
                              const std::map<std::string, std::vector<char>>& typed, Inferred& inferred,
                              std::vector<SymbolicValue>& syms) {
  if (!inferred.data_dependent || !p.opts.data_dependent_dims || p.body || n.op_type != "Loop") return false;
  const Graph* body = typed_body(n, typed, "body");
  if (!body || own_inputs(n) < 2) return false;
  const size_t carried = own_inputs(n) - 2;
  if (n.outputs.size() < carried || body->outputs.size() != 1 + n.outputs.size()) return false;
  int64_t bound = -1;
  if (const Tensor* m = n.inputs.at(0) >= 0 ? in.values[0] : nullptr; m && m->numel() == 1)
    bound = std::max<int64_t>(m->as_int64s()[0], 0);
  std::vector<TensorType> types;
  std::vector<SymbolicValue> out;
  for (size_t k = 0; k < carried; ++k) {
    const TensorType* t = in.types.at(2 + k);
    if (!t) return false;
    types.push_back(*t);
    const SymbolicValue* s = in.syms.at(2 + k);
    out.push_back(s ? *s : SymbolicValue{std::vector<DimExpr>(t->shape.begin(), t->shape.end()), std::nullopt});
    out.back().elems.reset();
  }
  std::string name;
  for (size_t k = carried; k < n.outputs.size(); ++k) {
    const Value& v = body->values[static_cast<size_t>(body->outputs[1 + k])];
    if (v.kind != ValueKind::kTensor || v.sym) return false;
    if (name.empty()) {
      name = fresh_runtime_symbol(p, "loop");
      add_runtime_dim(p, name, n.name, "the number of iterations", bound);
    }
    TensorType t{v.dtype, v.shape};
    t.shape.insert(t.shape.begin(), p.g.dim_hints[name]);
    out.push_back({std::vector<DimExpr>(t.shape.begin(), t.shape.end()), std::nullopt});
    out.back().dims[0] = DimExpr::symbol(name);
    types.push_back(std::move(t));
  }
  inferred = Inferred{};
  inferred.types = std::move(types);
  syms = std::move(out);
  return true;
}

// True when a node with symbolic inputs may fold: each output's dims are constants and its values expressions.
bool symbols_fold(const NodeInputs& in, const std::vector<SymbolicValue>& syms) {
  if (!in.symbolic) return true;
  if (syms.empty()) return false;
  for (const SymbolicValue& s : syms) {
    if (!s.elems) return false;
    for (const DimExpr& d : s.dims)
      if (!d.is_constant()) return false;
  }
  return true;
}

// Attaches the symbolic outputs to node `n`'s output values (those that read a symbol), after checking that they
// are, at the hints, what the shape function and the folding computed: a disagreement is a bug of a symbolic rule.
void attach_symbols(Pass& p, const Node& n, std::vector<SymbolicValue> syms) {
  for (size_t k = 0; k < syms.size() && k < n.outputs.size(); ++k) {
    Value& v = p.g.values[static_cast<size_t>(n.outputs[k])];
    SymbolicValue& s = syms[k];
    std::vector<int64_t> at_hints;
    for (const DimExpr& d : s.dims) at_hints.push_back(d.eval(p.g.dim_hints));
    bool ok = at_hints == v.shape;
    if (ok && s.elems && v.data) {
      std::vector<int64_t> e;
      for (const DimExpr& x : *s.elems) e.push_back(x.eval(p.g.dim_hints));
      ok = e == v.data->as_int64s();
    } else if (s.elems && !v.data) {
      s.elems.reset();  // a value computed at run time: its dims are what counts
    }
    if (!ok)
      throw InternalError(
          fmt::format("node '{}' ({}): output {} over the symbols is {} ({} at the hints) but the "
                      "shape function gives {}",
                      n.name, n.op_type, k, dims_str(s.dims), shape_str(at_hints), shape_str(v.shape)));
    if (s.has_symbols()) v.sym = std::make_shared<const SymbolicValue>(std::move(s));
  }
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

// A flattened element's name: "x[i]" for a sequence's, "x.value" for an optional's tensor, "x.value[i]" for an
// optional's sequence.
std::string element_name(const std::string& name, const ValueStructure& s, size_t i) {
  if (s.kind == ValueKind::kSequence) return fmt::format("{}[{}]", name, i);
  return s.of_sequence ? fmt::format("{}.value[{}]", name, i) : name + ".value";
}

// The model's sequence and optional inputs become one graph input per element, typed from opts.structured_inputs;
// report.inputs receives the signature.
void bind_structured_inputs(Pass& p) {
  Graph& g = p.g;
  std::vector<int> inputs;
  for (int v : g.inputs) {
    const Value val = g.values[static_cast<size_t>(v)];
    FlatValue fv{val.name, {val.kind, true, false, val.dtype}, {}};
    if (val.kind == ValueKind::kTensor) {
      fv.values = {v};
      inputs.push_back(v);
      p.report.inputs.push_back(std::move(fv));
      continue;
    }
    const char* kind = val.kind == ValueKind::kSequence ? "sequence" : "optional";
    auto it = p.opts.structured_inputs.find(val.name);
    if (it == p.opts.structured_inputs.end())
      throw InputError(
          fmt::format("input '{}' is a {}: its structure (length, element shapes) must be known at load; "
                      "give its value (--inputs DIR)",
                      val.name, kind));
    const OnnxValue& given = it->second;
    if (given.structure.kind != val.kind)
      throw InputError(
          fmt::format("input '{}' is a {} but the given value is {}", val.name, kind, with_article(given.structure)));
    fv.structure = given.structure;
    for (const Tensor& t : given.tensors) {
      if (val.dtype != DType::kUndefined && t.dtype != val.dtype)
        throw InputError(fmt::format("input '{}': the given value has {} elements, the model declares {}", val.name,
                                     dtype_name(t.dtype), dtype_name(val.dtype)));
      fv.structure.elem_dtype = t.dtype;
    }
    if (fv.structure.elem_dtype == DType::kUndefined) fv.structure.elem_dtype = val.dtype;
    std::vector<std::string> names;
    for (size_t i = 0; i < given.tensors.size(); ++i) {
      const int id =
          g.add_value_unique(element_name(val.name, fv.structure, i), given.tensors[i].dtype, given.tensors[i].shape);
      fv.values.push_back(id);
      inputs.push_back(id);
      names.push_back(g.values[static_cast<size_t>(id)].name);
    }
    p.structures[v] = fv;
    p.typed(v);
    p.report.rewrites.push_back(fmt::format("input '{}' ({} of {}): graph inputs '{}'", val.name,
                                            structure_str(fv.structure), count_str(names.size(), "tensor"),
                                            fmt::join(names, "', '")));
    p.report.inputs.push_back(std::move(fv));
  }
  g.inputs = std::move(inputs);
}

// The model's sequence and optional outputs become one graph output per element (an Identity named like the element);
// report.outputs receives the signature. An output still untyped stays (the loader reports it).
void flatten_outputs(Pass& p) {
  Graph& g = p.g;
  std::vector<int> outputs;
  for (int v : g.outputs) {
    const std::string name = g.values[static_cast<size_t>(v)].name;
    auto it = p.structures.find(v);
    if (it == p.structures.end()) {
      const Value& val = g.values[static_cast<size_t>(v)];
      p.report.outputs.push_back({name, {val.kind, true, false, val.dtype}, {v}});
      outputs.push_back(v);
      continue;
    }
    FlatValue fv = it->second;
    fv.name = name;
    fv.values.clear();
    for (size_t i = 0; i < it->second.values.size(); ++i) {
      const int e = it->second.values[i];
      const Value from = g.values[static_cast<size_t>(e)];
      const int id = g.add_value_unique(element_name(name, fv.structure, i), from.dtype, from.shape);
      if (p.unknown.count(from.name)) {
        p.unknown.insert(g.values[static_cast<size_t>(id)].name);
        p.why[g.values[static_cast<size_t>(id)].name] = fmt::format("has no static shape: '{}' has none", from.name);
      }
      Node n;
      n.name = g.values[static_cast<size_t>(id)].name;
      n.op_type = "Identity";
      n.inputs = {e};
      n.outputs = {id};
      g.add_node(std::move(n));
      fv.values.push_back(id);
      outputs.push_back(id);
    }
    p.report.outputs.push_back(std::move(fv));
  }
  g.outputs = std::move(outputs);
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
