// Sequence and optional values (docs/sequences.md): their .pb files (onnx.SequenceProto / OptionalProto, from
// onnx-data.proto), and the mapping between ONNX-typed values and the loaded graph's flat tensor inputs / outputs.
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <onnx/onnx-data_pb.h>

#include "onnx_frontend/frontend.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd {

std::string frontend::with_article(const ValueStructure& s) {
  return (s.kind == ValueKind::kOptional ? "an " : "a ") + structure_str(s);
}

namespace {

using frontend::count_str;
using frontend::with_article;

// onnx-data.proto's SequenceProto.DataType / OptionalProto.DataType values (the two enums agree).
constexpr int32_t kElemUndefined = 0, kElemTensor = 1, kElemSparseTensor = 2, kElemSequence = 3, kElemMap = 4,
                  kElemOptional = 5;

// True when the structure's tensors are a sequence's elements (any count), false when it holds 0 or 1 tensor.
bool holds_sequence(const ValueStructure& s) {
  return s.kind == ValueKind::kSequence || (s.kind == ValueKind::kOptional && s.present && s.of_sequence);
}

// Number of tensors a non-sequence structure holds (a tensor or a present optional tensor: 1; empty optional: 0).
size_t fixed_count(const ValueStructure& s) { return s.kind == ValueKind::kOptional && !s.present ? 0 : 1; }

// Same structure for flatten_inputs: kind and presence, and for a present optional whether it holds a sequence
// (an empty optional's declared element kind does not matter: it holds nothing).
bool same_structure(const ValueStructure& a, const ValueStructure& b) {
  if (a.kind != b.kind) return false;
  if (a.kind != ValueKind::kOptional) return true;
  return a.present == b.present && (!a.present || a.of_sequence == b.of_sequence);
}

// What an unsupported element type is, for "<path>: <what> is not supported": a sequence's (`in_sequence`) or an
// optional's.
std::string unsupported_elem(int32_t elem_type, bool in_sequence) {
  switch (elem_type) {
    case kElemUndefined: return in_sequence ? "a sequence without an element type" : "an optional of undefined type";
    case kElemSparseTensor: return in_sequence ? "a sequence of sparse tensors" : "an optional sparse tensor";
    case kElemSequence: return "a sequence of sequences";  // an optional's sequence is supported
    case kElemMap: return in_sequence ? "a sequence of maps" : "an optional map";
    case kElemOptional: return in_sequence ? "a sequence of optionals" : "an optional optional";
    default: return fmt::format("{} element type {}", in_sequence ? "a sequence of" : "an optional of", elem_type);
  }
}

// Parses `bytes` into `msg` (one whole message, no fields it does not define: a TensorProto read as a SequenceProto
// parses, into unknown fields). Throws InputError("<path>: not a valid serialized onnx.<type>").
template <class Msg>
void parse_exact(const std::string& bytes, const std::string& path, const char* type, Msg& msg) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) || !msg.unknown_fields().empty())
    throw InputError(fmt::format("{}: not a valid serialized onnx.{}", path, type));
}

// A SequenceProto's tensors, converted with tensor_from_proto; `what` prefixes errors ("<path>" or "<path>: the
// optional's sequence"). Checks the element type and that every element has the same dtype; sets elem_dtype.
std::vector<Tensor> sequence_tensors(const onnx::SequenceProto& p, const std::string& path, const std::string& what,
                                     DType& elem_dtype) {
  if (p.elem_type() != kElemTensor)
    throw InputError(fmt::format("{}: {} is not supported", path, unsupported_elem(p.elem_type(), true)));
  if (p.sparse_tensor_values_size() || p.sequence_values_size() || p.map_values_size() || p.optional_values_size())
    throw InputError(fmt::format("{}: a sequence of tensors holds values of another type", what));
  std::vector<Tensor> out;
  out.reserve(p.tensor_values_size());
  const std::string base_dir = frontend::dir_of(path);
  for (int i = 0; i < p.tensor_values_size(); ++i) {
    out.push_back(frontend::tensor_from_proto(p.tensor_values(i), base_dir, fmt::format("{}: element {}", what, i)));
    if (i > 0 && out[i].dtype != out[0].dtype)
      throw InputError(fmt::format("{}: element {} is {} but element 0 is {}: a sequence's elements share a dtype",
                                   what, i, dtype_name(out[i].dtype), dtype_name(out[0].dtype)));
  }
  elem_dtype = out.empty() ? DType::kUndefined : out[0].dtype;
  return out;
}

// Fills a SequenceProto of tensors (unnamed elements).
void sequence_to_proto(const std::vector<Tensor>& tensors, onnx::SequenceProto* p) {
  p->set_elem_type(kElemTensor);
  for (const Tensor& t : tensors) frontend::tensor_to_proto(t, p->add_tensor_values());
}

// Serializes `msg` to `path` (write_file_atomic); UnsupportedError when it cannot (over protobuf's 2 GiB limit).
template <class Msg>
void write_message(const std::string& path, const Msg& msg, const char* what) {
  std::string bytes;
  if (!msg.SerializeToString(&bytes))
    throw UnsupportedError(fmt::format("{}: cannot serialize {} (over protobuf's 2 GiB limit)", path, what));
  frontend::write_file_atomic(path, bytes);
}

}  // namespace

std::string structure_str(const ValueStructure& s) {
  switch (s.kind) {
    case ValueKind::kTensor: return "tensor";
    case ValueKind::kSequence: return "sequence";
    case ValueKind::kOptional:
      if (!s.present) return "empty optional";
      return s.of_sequence ? "optional(sequence)" : "optional(tensor)";
  }
  return "?";
}

OnnxValue OnnxValue::of(Tensor t) {
  OnnxValue v;
  v.structure = ValueStructure{ValueKind::kTensor, true, false, t.dtype};
  v.tensors.push_back(std::move(t));
  return v;
}

OnnxValue read_value_pb(const std::string& path, ValueKind kind) {
  if (kind == ValueKind::kTensor) return OnnxValue::of(read_tensor_pb(path));
  const std::string bytes = frontend::read_file(path);
  OnnxValue v;
  v.structure.kind = kind;
  if (kind == ValueKind::kSequence) {
    onnx::SequenceProto p;
    parse_exact(bytes, path, "SequenceProto", p);
    v.tensors = sequence_tensors(p, path, path, v.structure.elem_dtype);
    return v;
  }
  onnx::OptionalProto p;
  parse_exact(bytes, path, "OptionalProto", p);
  const bool other = p.has_sparse_tensor_value() || p.has_map_value() || p.has_optional_value();
  switch (p.elem_type()) {
    case kElemUndefined:  // the empty optional (what onnx.numpy_helper.from_optional(None) writes)
      if (other || p.has_tensor_value() || p.has_sequence_value())
        throw InputError(fmt::format("{}: an optional without an element type holds a value", path));
      v.structure.present = false;
      return v;
    case kElemTensor:  // without tensor_value: an empty optional of a declared tensor type
      if (other || p.has_sequence_value())
        throw InputError(fmt::format("{}: an optional tensor holds a value of another type", path));
      v.structure.present = p.has_tensor_value();
      if (v.structure.present) {
        v.tensors.push_back(frontend::tensor_from_proto(p.tensor_value(), frontend::dir_of(path),
                                                        fmt::format("{}: the optional's tensor", path)));
        v.structure.elem_dtype = v.tensors[0].dtype;
      }
      return v;
    case kElemSequence:
      if (other || p.has_tensor_value())
        throw InputError(fmt::format("{}: an optional sequence holds a value of another type", path));
      v.structure.of_sequence = true;
      v.structure.present = p.has_sequence_value();
      if (v.structure.present)
        v.tensors = sequence_tensors(p.sequence_value(), path, fmt::format("{}: the optional's sequence", path),
                                     v.structure.elem_dtype);
      return v;
    default: throw InputError(fmt::format("{}: {} is not supported", path, unsupported_elem(p.elem_type(), false)));
  }
}

void write_value_pb(const std::string& path, const OnnxValue& v, const std::string& name) {
  const ValueStructure& s = v.structure;
  if (!holds_sequence(s) && v.tensors.size() != fixed_count(s))
    throw std::invalid_argument(fmt::format("{}: {} holds {}, not {}", path, with_article(s),
                                            count_str(fixed_count(s), "tensor"), v.tensors.size()));
  switch (s.kind) {
    case ValueKind::kTensor: write_tensor_pb(path, v.tensors[0], name); return;
    case ValueKind::kSequence: {
      onnx::SequenceProto p;
      p.set_name(name);
      sequence_to_proto(v.tensors, &p);
      write_message(path, p, "sequence");
      return;
    }
    case ValueKind::kOptional: {
      onnx::OptionalProto p;
      p.set_name(name);
      if (!s.present) {
        p.set_elem_type(kElemUndefined);
      } else if (s.of_sequence) {
        p.set_elem_type(kElemSequence);
        sequence_to_proto(v.tensors, p.mutable_sequence_value());
      } else {
        p.set_elem_type(kElemTensor);
        frontend::tensor_to_proto(v.tensors[0], p.mutable_tensor_value());
      }
      write_message(path, p, "optional");
      return;
    }
  }
}

std::vector<Tensor> flatten_inputs(const Graph& g, const LoadReport& report, std::vector<OnnxValue> values) {
  if (values.size() != report.inputs.size())
    throw InputError(fmt::format("{}, the model has {}", count_str(values.size(), "input value"),
                                 count_str(report.inputs.size(), "input")));
  std::unordered_map<int, size_t> slot;  // graph input id -> its position in g.inputs
  for (size_t i = 0; i < g.inputs.size(); ++i) slot.emplace(g.inputs[i], i);
  std::vector<Tensor> out(g.inputs.size());
  std::vector<bool> filled(g.inputs.size(), false);
  for (size_t e = 0; e < report.inputs.size(); ++e) {
    const FlatValue& entry = report.inputs[e];
    OnnxValue& v = values[e];
    if (!same_structure(entry.structure, v.structure))
      throw InputError(fmt::format("input '{}': the model was loaded for {} but the value is {}", entry.name,
                                   with_article(entry.structure), with_article(v.structure)));
    if (v.tensors.size() != entry.values.size()) {
      if (holds_sequence(entry.structure))
        throw InputError(fmt::format("input '{}': the model was loaded for {} of {} but the value has {}", entry.name,
                                     with_article(entry.structure), count_str(entry.values.size(), "tensor"),
                                     v.tensors.size()));
      throw InputError(fmt::format("input '{}': the value is {} but holds {}", entry.name, with_article(v.structure),
                                   count_str(v.tensors.size(), "tensor")));
    }
    for (size_t k = 0; k < entry.values.size(); ++k) {
      const int id = entry.values[k];
      auto it = slot.find(id);
      if (it == slot.end())
        throw std::invalid_argument(
            fmt::format("flatten_inputs: input '{}': value {} is not a graph input", entry.name, id));
      if (filled[it->second])
        throw std::invalid_argument(
            fmt::format("flatten_inputs: input '{}': graph input '{}' is mapped twice", entry.name, g.values[id].name));
      const DType want = g.values[id].dtype;
      if (v.tensors[k].dtype != want) {
        const std::string where = holds_sequence(entry.structure) ? fmt::format("input '{}' element {}", entry.name, k)
                                                                  : fmt::format("input '{}'", entry.name);
        throw InputError(
            fmt::format("{}: dtype {}, the model expects {}", where, dtype_name(v.tensors[k].dtype), dtype_name(want)));
      }
      out[it->second] = std::move(v.tensors[k]);
      filled[it->second] = true;
    }
  }
  for (size_t i = 0; i < g.inputs.size(); ++i)
    if (!filled[i])
      throw std::invalid_argument(fmt::format("flatten_inputs: graph input '{}' belongs to no input of the signature",
                                              g.values[g.inputs[i]].name));
  return out;
}

std::vector<OnnxValue> unflatten_outputs(const Graph& g, const LoadReport& report, std::vector<Tensor> outputs) {
  if (outputs.size() != g.outputs.size())
    throw std::invalid_argument(fmt::format("unflatten_outputs: {} for a graph with {}",
                                            count_str(outputs.size(), "tensor"),
                                            count_str(g.outputs.size(), "output")));
  // Each use of a value id takes the id's next position in g.outputs (the last one once they run out); a position
  // is moved from at its last use and copied before.
  std::unordered_map<int, std::vector<size_t>> positions;
  for (size_t i = 0; i < g.outputs.size(); ++i) positions[g.outputs[i]].push_back(i);
  std::unordered_map<int, size_t> uses_so_far;
  std::vector<std::vector<size_t>> use_pos(report.outputs.size());
  std::vector<int> remaining(g.outputs.size(), 0);  // uses of each position not yet consumed
  for (size_t e = 0; e < report.outputs.size(); ++e)
    for (int id : report.outputs[e].values) {
      auto it = positions.find(id);
      if (it == positions.end())
        throw std::invalid_argument(
            fmt::format("unflatten_outputs: output '{}': value {} is not a graph output", report.outputs[e].name, id));
      const size_t k = uses_so_far[id]++;
      const size_t pos = it->second[std::min(k, it->second.size() - 1)];
      use_pos[e].push_back(pos);
      ++remaining[pos];
    }
  std::vector<OnnxValue> out(report.outputs.size());
  for (size_t e = 0; e < report.outputs.size(); ++e) {
    out[e].structure = report.outputs[e].structure;
    out[e].tensors.reserve(use_pos[e].size());
    for (size_t pos : use_pos[e]) {
      if (--remaining[pos] == 0)
        out[e].tensors.push_back(std::move(outputs[pos]));
      else
        out[e].tensors.push_back(outputs[pos]);
    }
  }
  return out;
}

}  // namespace gspmd
