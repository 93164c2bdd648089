// The partitioner's op handler registry: the one place in core/partition that names op types. Everything else the
// partitioner knows about an op comes from its factor rule (core/rules); a handler adds what a rule cannot say (a
// lowering with its own collectives, a local attribute rewrite, how a window reads its padding).
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "core/ir/shift_op.h"
#include "core/partition/partitioner.h"

namespace gspmd::partition_internal {
namespace {

using Table = std::unordered_map<std::string, OpHandler>;  // ai.onnx op type (or "domain:op") -> handler

const Table& table() {
  static const Table t = [] {
    Table h;
    // Split reductions: two passes of all-reduce instead of gathering the reduced dims (split_reduction.cc).
    h["Softmax"].lower = &Partitioner::lower_split_softmax;
    h["LogSoftmax"].lower = &Partitioner::lower_split_log_softmax;
    h["LayerNormalization"].lower = &Partitioner::lower_split_layer_norm;
    // The masked lookup of a table split on the looked-up axis (gather.cc).
    h["Gather"].lower_split_reduction = &Partitioner::lower_gather;
    // Windowed ops (windowed.cc): what the window reads outside the input, and how it counts.
    h["Conv"].window.kernel_from_weights = true;
    h["MaxPool"].window.pad_value = -std::numeric_limits<float>::infinity();
    h["AveragePool"].window.average = true;
    // Local rewrites.
    h["Reshape"].rewrite_local = &Partitioner::rewrite_reshape;
    h["Squeeze"].rewrite_local = &Partitioner::rewrite_squeeze;
    // What only reads its operand's (static, global) shape.
    h["Shape"].lower = h["Size"].lower = &Partitioner::lower_shape_of;
    // The pipeline's stage shift (pipeline_shift.cc): a collective-permute between stages.
    h[std::string(kPipelineDomain) + ":" + kShiftOp].lower = &Partitioner::lower_pipeline_shift;
    return h;
  }();
  return t;
}

}  // namespace

const OpHandler* find_handler(const Node& node) {
  const Table& t = table();
  auto it = node.domain.empty()              ? t.find(node.op_type)
            : node.domain == kPipelineDomain ? t.find(node.domain + ":" + node.op_type)
                                             : t.end();
  return it == t.end() ? nullptr : &it->second;
}

void Partitioner::rewrite_reshape(Node& local, const Node& global) {
  if (global.inputs.size() < 2) return;  // opset < 5: the shape is an attribute
  // A 0 in the literal local shape means an empty dim (allowzero, opset 14+), never "copy the input's".
  local.attrs.erase("allowzero");
  const Shape& ls = P().values[local.outputs[0]].shape;
  if (g_.opset >= 14 && std::find(ls.begin(), ls.end(), 0) != ls.end()) local.attrs["allowzero"] = int64_t{1};
}

bool Partitioner::lower_shape_of(int n) {
  const Node& node = g_.nodes[static_cast<size_t>(n)];
  if (node.inputs.size() != 1 || node.outputs.size() != 1 || node.inputs[0] < 0 || node.outputs[0] < 0) return false;
  const Shape& x = g_.values[node.inputs[0]].shape;
  const Value& out = g_.values[node.outputs[0]];
  Tensor t;
  if (node.op_type == "Size") {
    t = Tensor::from_int64s({num_elements(x)}, /*scalar=*/true);
  } else {  // Shape, with opset 15's start and end (clamped, negative from the back)
    const int64_t r = static_cast<int64_t>(x.size());
    auto clamp = [&](int64_t a) { return std::clamp(a < 0 ? a + r : a, int64_t{0}, r); };
    const int64_t b = clamp(node.i("start", 0)), e = clamp(node.i("end", r));
    t = Tensor::from_int64s(std::vector<int64_t>(x.begin() + b, x.begin() + std::max(b, e)));
  }
  if (t.shape != out.shape || out.dtype != DType::kInt64) return false;  // not the node the loader typed: generic path
  bind(node.outputs[0], TensorSharding::replicated(static_cast<int>(out.shape.size())), new_constant(out.name, t));
  return true;
}

void Partitioner::rewrite_squeeze(Node& local, const Node& global) {
  if ((global.inputs.size() >= 2 && global.inputs[1] >= 0) || global.has("axes")) return;
  std::vector<int64_t> axes;
  const Shape& gs = g_.values[global.inputs[0]].shape;
  for (size_t d = 0; d < gs.size(); ++d)
    if (gs[d] == 1) axes.push_back(static_cast<int64_t>(d));
  if (g_.opset >= 13)
    local.inputs = {local.inputs[0], int64_const("axes", axes)};
  else
    local.attrs["axes"] = axes;
}

}  // namespace gspmd::partition_internal
