// read_model_info: a model's opset, node op types and graph inputs/outputs, without shape inference.
#include <unordered_set>

#include <fmt/format.h>

#include "onnx_frontend/frontend.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd {
namespace {

// A tensor type's element type (kUndefined when absent or not one the IR knows).
DType tensor_elem(const onnx::TypeProto& t) {
  if (!t.has_tensor_type()) return DType::kUndefined;
  try {
    return frontend::proto_dtype(t.tensor_type().elem_type(), "");
  } catch (const InputError&) {
    return DType::kUndefined;
  }
}

// A value's element type: a tensor's dtype, a sequence's element tensors' dtype, an optional's tensor's or sequence
// elements' dtype; kUndefined for anything else (maps, sparse tensors, nested sequences) or when not declared.
DType elem_type(const onnx::ValueInfoProto& vi) {
  const onnx::TypeProto& t = vi.type();
  if (t.has_tensor_type()) return tensor_elem(t);
  if (t.has_sequence_type()) return tensor_elem(t.sequence_type().elem_type());
  if (t.has_optional_type()) {
    const onnx::TypeProto& e = t.optional_type().elem_type();
    return e.has_sequence_type() ? tensor_elem(e.sequence_type().elem_type()) : tensor_elem(e);
  }
  return DType::kUndefined;
}

// tensor, sequence or optional; kTensor for the types the IR has no kind for (maps, sparse tensors; their
// elem_type is kUndefined).
ValueKind value_kind(const onnx::ValueInfoProto& vi) {
  if (vi.type().has_sequence_type()) return ValueKind::kSequence;
  if (vi.type().has_optional_type()) return ValueKind::kOptional;
  return ValueKind::kTensor;
}

}  // namespace

ModelInfo read_model_info(const std::string& path) {
  onnx::ModelProto m;
  frontend::parse_model_file(path, &m);
  ModelInfo info;
  info.opset = m.opset_import_size() == 0 ? 1 : 0;
  for (const auto& op : m.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") info.opset = op.version();
  const auto& g = m.graph();
  for (const auto& n : g.node())
    info.op_types.push_back(n.domain().empty() || n.domain() == "ai.onnx" ? n.op_type()
                                                                          : n.domain() + ":" + n.op_type());
  std::unordered_set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  for (const auto& i : g.input())
    if (!inits.count(i.name())) {
      info.inputs.push_back(i.name());
      std::vector<std::string> dims;
      std::vector<int64_t> shape;
      if (i.type().has_tensor_type() && i.type().tensor_type().has_shape())
        for (const auto& d : i.type().tensor_type().shape().dim()) {
          dims.push_back(d.has_dim_param() ? d.dim_param() : "");
          shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
        }
      info.input_dim_params.push_back(std::move(dims));
      info.input_shapes.push_back(std::move(shape));
      info.input_dtypes.push_back(elem_type(i));
      info.input_kinds.push_back(value_kind(i));
    }
  for (const auto& e : m.metadata_props()) info.metadata[e.key()] = e.value();
  for (const auto& o : g.output()) {
    info.outputs.push_back(o.name());
    info.output_dtypes.push_back(elem_type(o));
    info.output_kinds.push_back(value_kind(o));
  }
  return info;
}

}  // namespace gspmd
