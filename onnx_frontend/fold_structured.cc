// The typing pass's structured inputs and outputs (fold_impl.h): sequence and optional graph inputs bound to their
// element tensors, and such outputs flattened (docs/loading.md).
#include <fmt/format.h>

#include "onnx_frontend/file_util.h"
#include "onnx_frontend/fold_impl.h"

namespace gspmd::frontend {
namespace {

// A flattened element's name: "x[i]" for a sequence's, "x.value" for an optional's tensor, "x.value[i]" for an
// optional's sequence.
std::string element_name(const std::string& name, const ValueStructure& s, size_t i) {
  if (s.kind == ValueKind::kSequence) return fmt::format("{}[{}]", name, i);
  return s.of_sequence ? fmt::format("{}.value[{}]", name, i) : name + ".value";
}

}  // namespace

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

}  // namespace gspmd::frontend
