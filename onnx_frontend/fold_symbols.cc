// The typing pass's dim symbols (fold_impl.h): data-dependent outputs (NonZero, Loop, If with outputs of other
// sizes) typed over fresh symbols with their bounds, symbolic shapes inferred and folded (docs/shapes.md).
#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ir/control_flow.h"
#include "onnx_frontend/fold_impl.h"

namespace gspmd::frontend {
namespace {

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

// Body `attr` of control-flow node `n` when type_bodies typed every one of its outputs (`typed`), else nullptr.
const Graph* typed_body(const Node& n, const std::map<std::string, std::vector<char>>& typed, const char* attr) {
  auto it = typed.find(attr);
  const Graph* body = n.g(attr);
  if (!body || it == typed.end() || std::find(it->second.begin(), it->second.end(), 0) != it->second.end())
    return nullptr;
  return body;
}

}  // namespace

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

}  // namespace gspmd::frontend
