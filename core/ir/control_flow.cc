// Control-flow input bindings (control_flow.h).
#include "core/ir/control_flow.h"

#include <stdexcept>

#include <fmt/format.h>

namespace gspmd {
namespace {

[[noreturn]] void fail(const Node& n, const std::string& why) {
  throw SpecError(fmt::format("node '{}' ({}): {}", n.name, n.op_type, why));
}

// `attr` as a list of `count` entries, `def` each when absent.
std::vector<int64_t> per_entry(const Node& n, const char* attr, int count, int64_t def) {
  std::vector<int64_t> v = n.ints(attr, std::vector<int64_t>(static_cast<size_t>(count), def));
  if (static_cast<int>(v.size()) != count)
    fail(n, fmt::format("attribute '{}' has {} entries for {} values", attr, v.size(), count));
  return v;
}

const TensorType& required(const Node& n, const std::vector<const TensorType*>& types, size_t i) {
  if (i >= types.size() || !types[i]) fail(n, fmt::format("missing required input {}", i));
  return *types[i];
}

}  // namespace

ScanLayout scan_layout(const Node& n, size_t body_outputs, int64_t opset) {
  ScanLayout s;
  s.batched = opset < 9;
  s.first_state = s.batched ? 1 : 0;
  const int own = static_cast<int>(own_inputs(n));
  s.num_scan_in = static_cast<int>(n.i("num_scan_inputs", -1));
  s.num_state = own - s.first_state - s.num_scan_in;
  if (s.num_scan_in < 1 || s.num_state < 0)
    fail(n, fmt::format("num_scan_inputs {} does not fit its {} inputs", s.num_scan_in, own));
  const int num_scan_out = static_cast<int>(body_outputs) - s.num_state;
  if (num_scan_out < 0) fail(n, fmt::format("the body has {} outputs for {} states", body_outputs, s.num_state));
  auto flags = [](const std::vector<int64_t>& v) { return std::vector<char>(v.begin(), v.end()); };
  if (s.batched) {
    s.in_axes.assign(static_cast<size_t>(s.num_scan_in), 1);
    s.out_axes.assign(static_cast<size_t>(num_scan_out), 1);
    s.in_reverse = flags(per_entry(n, "directions", s.num_scan_in, 0));
    s.out_reverse.assign(static_cast<size_t>(num_scan_out), 0);
  } else {
    s.in_axes = per_entry(n, "scan_input_axes", s.num_scan_in, 0);
    s.in_reverse = flags(per_entry(n, "scan_input_directions", s.num_scan_in, 0));
    s.out_axes = per_entry(n, "scan_output_axes", num_scan_out, 0);
    s.out_reverse = flags(per_entry(n, "scan_output_directions", num_scan_out, 0));
  }
  return s;
}

std::vector<TensorType> body_input_types(const Node& n, const Graph& body, const std::vector<const TensorType*>& types,
                                         int64_t opset) {
  std::vector<TensorType> out;
  const size_t own = own_inputs(n);
  if (n.op_type == "Loop") {
    out.push_back({DType::kInt64, {}});
    out.push_back({DType::kBool, {}});
    for (size_t k = 2; k < own; ++k) out.push_back(required(n, types, k));
  } else if (n.op_type == "Scan") {
    const ScanLayout s = scan_layout(n, body.outputs.size(), opset);
    const size_t drop = s.batched ? 1 : 0;  // the batch dim
    for (int k = 0; k < s.num_state; ++k) {
      TensorType t = required(n, types, static_cast<size_t>(s.first_state + k));
      if (t.shape.size() < drop) fail(n, fmt::format("state input {} has no batch dim", s.first_state + k));
      t.shape.erase(t.shape.begin(), t.shape.begin() + static_cast<int64_t>(drop));
      out.push_back(std::move(t));
    }
    for (int k = 0; k < s.num_scan_in; ++k) {
      const size_t i = static_cast<size_t>(s.first_state + s.num_state + k);
      TensorType t = required(n, types, i);
      const int64_t r = static_cast<int64_t>(t.shape.size());
      int64_t a = s.in_axes[static_cast<size_t>(k)];
      if (a < 0) a += r;
      if (a < static_cast<int64_t>(drop) || a >= r)
        fail(n,
             fmt::format("scan axis {} out of range for input {} of rank {}", s.in_axes[static_cast<size_t>(k)], i, r));
      t.shape.erase(t.shape.begin() + a);
      t.shape.erase(t.shape.begin(), t.shape.begin() + static_cast<int64_t>(drop));
      out.push_back(std::move(t));
    }
  }
  for (size_t k = own; k < n.inputs.size(); ++k) out.push_back(required(n, types, k));
  if (out.size() != body.inputs.size())
    fail(n, fmt::format("its body '{}' has {} inputs, the node binds {}", body.name, body.inputs.size(), out.size()));
  return out;
}

}  // namespace gspmd
