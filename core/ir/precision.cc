#include "core/ir/precision.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/ir/typing.h"

namespace gspmd {
namespace {

/// Element i of a floating-point tensor as a double.
double element(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kFloat32: return t.data<float>()[i];
    case DType::kFloat64: return t.data<double>()[i];
    case DType::kFloat16: return half_to_float(t.data<uint16_t>()[i]);
    case DType::kBFloat16: return bf16_to_float(t.data<uint16_t>()[i]);
    default: throw InternalError(fmt::format("--precision: {} is not a float type", dtype_name(t.dtype)));
  }
}

/// `t` (floating point) converted to the floating-point type `to`, rounded to nearest even.
Tensor converted(const Tensor& t, DType to) {
  if (t.dtype == to) return t;
  Tensor r(to, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = element(t, i);
    switch (to) {
      case DType::kFloat32: r.data<float>()[i] = static_cast<float>(x); break;
      case DType::kFloat64: r.data<double>()[i] = x; break;
      case DType::kFloat16: r.data<uint16_t>()[i] = float_to_half(static_cast<float>(x)); break;
      default: r.data<uint16_t>()[i] = float_to_bf16(static_cast<float>(x)); break;
    }
  }
  return r;
}

/// A Cast of value `x` to `to`, appended to `g`: its output's id (named after `name`).
int cast(Graph& g, int x, DType to, const std::string& name) {
  Node n;
  n.name = name;
  n.op_type = "Cast";
  n.inputs = {x};
  n.attrs["to"] = static_cast<int64_t>(to);
  n.outputs = {g.add_value_unique(name, to, g.values[static_cast<size_t>(x)].shape)};
  const int out = n.outputs[0];
  g.add_node(std::move(n));
  return out;
}

/// Points input `x` of the node being rebuilt at its own Cast of `x` to `to` (made on first use, named after `x` with
/// `suffix`, appended to `g` before the node): `casts` holds that node's (input, Cast) pairs, so an input read twice
/// is cast once.
void read_through_cast(Graph& g, std::vector<std::pair<int, int>>& casts, int& x, DType to, const char* suffix) {
  auto it = std::find_if(casts.begin(), casts.end(), [&](const auto& c) { return c.first == x; });
  if (it == casts.end())
    it = casts.insert(casts.end(), {x, cast(g, x, to, g.values[static_cast<size_t>(x)].name + suffix)});
  x = it->second;
}

/// The bits of a floating-point type (16, 32, 64).
int float_bits(DType t) { return t == DType::kFloat64 ? 64 : t == DType::kFloat32 ? 32 : 16; }

/// set_precision's kAutocast (see there): torch.autocast's bfloat16 policy, node by node in graph order.
void set_autocast(Graph& g, const ShapeFunction& shapes) {
  std::vector<Node> old = std::move(g.nodes);
  g.nodes.clear();
  for (Node& n : old) {
    static const std::set<std::string> contractions = {"MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose"};
    const bool contraction = n.domain.empty() && contractions.count(n.op_type);
    DType widest = DType::kUndefined;  // among the floating-point inputs
    for (int x : n.inputs) {
      const DType t = x < 0 ? DType::kUndefined : g.values[static_cast<size_t>(x)].dtype;
      if (is_floating(t) && (widest == DType::kUndefined || float_bits(t) > float_bits(widest))) widest = t;
    }
    std::vector<std::pair<int, int>> casts;  // (input, its Cast for this node)
    for (int& x : n.inputs) {
      if (x < 0) continue;
      const DType t = g.values[static_cast<size_t>(x)].dtype;
      if (!is_floating(t)) continue;
      const DType to = contraction ? DType::kBFloat16 : float_bits(t) == 16 ? widest : t;
      if (to != t) read_through_cast(g, casts, x, to, to == DType::kBFloat16 ? ".bf16" : ".f32");
    }
    std::vector<TensorType> want;
    try {
      want = node_types(g, n, shapes);
    } catch (const std::exception& e) {
      throw UnsupportedError(fmt::format("--precision autocast: node '{}' ({}): {}", n.name, n.op_type, e.what()));
    }
    for (size_t k = 0; k < n.outputs.size() && k < want.size(); ++k) {
      if (n.outputs[k] < 0) continue;
      Value& out = g.values[static_cast<size_t>(n.outputs[k])];
      if (is_floating(out.dtype) && is_floating(want[k].dtype)) out.dtype = want[k].dtype;
    }
    g.add_node(std::move(n));
  }
  g.verify();
}

}  // namespace

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::kAsLoaded: return "as-loaded";
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
    case Precision::kMixed: return "mixed";
    case Precision::kAutocast: return "autocast";
  }
  return "as-loaded";
}

void set_precision(Graph& g, Precision p, const std::function<bool(const Value&)>& master,
                   const ShapeFunction& shapes) {
  if (p == Precision::kAsLoaded) return;
  for (const Node& n : g.nodes)
    if (n.has_body())
      throw UnsupportedError(fmt::format("--precision {}: node '{}' ({}) has a body, whose values it does not retype",
                                         precision_name(p), n.name, n.op_type));
  if (p == Precision::kAutocast) return set_autocast(g, shapes);
  const DType compute = p == Precision::kF32 ? DType::kFloat32 : DType::kBFloat16;
  // Values: the compute type, or float32 for the masters under kMixed.
  std::vector<char> is_master(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    Value& val = g.values[v];
    if (!is_floating(val.dtype)) continue;
    is_master[v] = p == Precision::kMixed && val.producer < 0 && master && master(val);
    const DType to = is_master[v] ? DType::kFloat32 : compute;
    if (val.data) val.data = std::make_shared<const Tensor>(converted(*val.data, to));
    val.dtype = to;
  }
  // Nodes, rebuilt in order: a Cast of each master before each reader, Softmax and LogSoftmax between float32 Casts.
  std::vector<Node> old = std::move(g.nodes);
  g.nodes.clear();
  for (Node& n : old) {
    // a master's bfloat16 Cast for each node that reads it, right before it: a copy shared by distant readers (a
    // tied embedding and LM head) would be a value computed from the weights that lives across the whole forward
    // pass, and --remat would find no cut between them
    std::vector<std::pair<int, int>> casts;  // (master, its Cast for this node)
    for (int& x : n.inputs) {
      if (x >= 0 && is_master[static_cast<size_t>(x)]) read_through_cast(g, casts, x, compute, ".bf16");
    }
    const int out = n.outputs.empty() ? -1 : n.outputs[0];
    const DType out_type = out >= 0 ? g.values[static_cast<size_t>(out)].dtype : DType::kUndefined;
    if (n.op_type == "Cast" && is_floating(out_type)) n.attrs["to"] = static_cast<int64_t>(out_type);
    if (n.has("dtype") && is_floating(out_type)) n.attrs["dtype"] = static_cast<int64_t>(out_type);
    if (n.op_type == "ConstantOfShape" && n.t("value") && is_floating(n.t("value")->dtype))
      n.attrs["value"] = converted(*n.t("value"), out_type);
    const bool softmax =
        (n.op_type == "Softmax" || n.op_type == "LogSoftmax") && n.domain.empty() && out_type == DType::kBFloat16;
    if (softmax) {
      n.inputs[0] = cast(g, n.inputs[0], DType::kFloat32, n.name + "/input_f32");
      n.outputs[0] = g.add_value_unique(n.name + "/f32", DType::kFloat32, g.values[static_cast<size_t>(out)].shape);
    }
    std::vector<TensorType> want;
    try {
      want = node_types(g, n, shapes);
    } catch (const std::exception& e) {
      throw UnsupportedError(
          fmt::format("--precision {}: node '{}' ({}): {}", precision_name(p), n.name, n.op_type, e.what()));
    }
    for (size_t k = 0; k < n.outputs.size() && k < want.size(); ++k) {
      const int o = n.outputs[k];
      if (o >= 0 && g.values[static_cast<size_t>(o)].dtype != want[k].dtype)
        throw UnsupportedError(fmt::format("--precision {}: node '{}' ({}) gives {} where {} was set",
                                           precision_name(p), n.name, n.op_type, dtype_name(want[k].dtype),
                                           dtype_name(g.values[static_cast<size_t>(o)].dtype)));
    }
    const std::string name = n.name;
    const int f32_out = softmax ? n.outputs[0] : -1;
    g.add_node(std::move(n));  // sets the producers; a Softmax's declared output is its Cast's, below
    if (softmax) {
      Node back;
      back.name = name + "/output_bf16";
      back.op_type = "Cast";
      back.inputs = {f32_out};
      back.outputs = {out};
      back.attrs["to"] = static_cast<int64_t>(DType::kBFloat16);
      g.add_node(std::move(back));
    }
  }
  g.verify();
}

}  // namespace gspmd
