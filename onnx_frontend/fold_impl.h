// onnx_frontend (private to the typing and folding pass, fold.h): what one node's typing reads and gets, and the
// typing of data-dependent outputs over dim symbols (fold_symbols.cc) and the structured inputs and outputs
// (fold_structured.cc) that the pass (fold.cc) calls.
#pragma once

#include <string>
#include <vector>

#include "core/shapes/symbolic.h"
#include "onnx_frontend/fold.h"

namespace gspmd::frontend {

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

// The node's outputs over the dim symbols (LoadOptions::keep_symbols), when an input reads one: empty otherwise, or
// when the shape function gave no types. Its guards join the graph's. Throws UnsupportedError for a node whose
// outputs' dims cannot be kept symbolic (core/shapes/symbolic.h).
std::vector<SymbolicValue> infer_symbols(Pass& p, const Node& n, const NodeInputs& in, Inferred& inferred);

// Node `n`'s outputs when their size depends on its input values (inferred.data_dependent; LoadOptions::
// data_dependent_dims): the count becomes a fresh data-dependent symbol ("nonzero_0"), typed at its upper bound,
// which joins the graph's dim_hints and runtime_dims (docs/shapes.md step 6). Sets `inferred` and `syms`; false when
// the op has no such rule or the node is in a body (it stays untyped, refused as before).
bool type_data_dependent(Pass& p, const Node& n, const NodeInputs& in, Inferred& inferred,
                         std::vector<SymbolicValue>& syms);

// If node `n` whose branches give outputs of different sizes (torchvision's batched NMS: an empty tensor, or the kept
// boxes of a NonMaxSuppression in the else branch), both branches typed (`typed`, type_bodies): each output dim
// that is not one constant in both becomes a fresh data-dependent symbol ("if_4", a RuntimeDim of n), bound by the
// larger of the branches' bounds, unbounded when one is. Sets `inferred` and `syms` as type_data_dependent does;
// false when a branch output is untyped, or the branches disagree on an output's dtype or rank.
bool type_data_dependent_if(Pass& p, const Node& n, const std::map<std::string, std::vector<char>>& typed,
                            Inferred& inferred, std::vector<SymbolicValue>& syms);

// Loop node `n` whose trip count is known only at run time (a computed M, or a condition its body computes: the ONNX
// tests' expanded Range), its body typed (`typed`, type_bodies; its carried values keep their types): the carried
// values keep their input types and each scan output is [loop_N, per-iteration dims...], loop_N a fresh
// data-dependent symbol for the number of iterations, bound by M when M is a constant, else unbounded. Sets
// `inferred` and `syms` as type_data_dependent does; false for another node or an untyped body output.
bool type_data_dependent_loop(Pass& p, const Node& n, const NodeInputs& in,
                              const std::map<std::string, std::vector<char>>& typed, Inferred& inferred,
                              std::vector<SymbolicValue>& syms);

// True when a node with symbolic inputs may fold: each output's dims are constants and its values expressions.
bool symbols_fold(const NodeInputs& in, const std::vector<SymbolicValue>& syms);

// Attaches the symbolic outputs to node `n`'s output values (those that read a symbol), after checking that they
// are, at the hints, what the shape function and the folding computed: a disagreement is a bug of a symbolic rule.
void attach_symbols(Pass& p, const Node& n, std::vector<SymbolicValue> syms);

// The model's sequence and optional inputs become one graph input per element, typed from opts.structured_inputs;
// report.inputs receives the signature.
void bind_structured_inputs(Pass& p);

// The model's sequence and optional outputs become one graph output per element (an Identity named like the element);
// report.outputs receives the signature. An output still untyped stays (the loader reports it).
void flatten_outputs(Pass& p);

}  // namespace gspmd::frontend
