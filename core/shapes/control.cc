// Shape functions of the control-flow ops (If, Loop, Scan) and type_body (shapes.h): a body is typed node by node
// with the same shape functions, from the types its node binds (core/ir/control_flow.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ir/control_flow.h"
#include "core/shapes/shape_ctx.h"
#include "core/shapes/shapes.h"

namespace gspmd {

BodyTypes type_body(const Graph& body, const std::vector<TensorType>& inputs, const std::vector<const Tensor*>& values,
                    int64_t opset, const ValueEvaluator* evaluate) {
  std::vector<std::optional<TensorType>> t(body.values.size());
  std::vector<const Tensor*> val(body.values.size(), nullptr);
  std::vector<std::string> why(body.values.size());
  std::vector<char> data_dep(body.values.size(), 0);
  for (size_t k = 0; k < body.inputs.size() && k < inputs.size(); ++k) {
    t[static_cast<size_t>(body.inputs[k])] = inputs[k];
    if (k < values.size()) val[static_cast<size_t>(body.inputs[k])] = values[k];
  }
  for (size_t v = 0; v < body.values.size(); ++v)
    if (body.values[v].producer < 0 && body.values[v].data) {
      t[v] = TensorType{body.values[v].dtype, body.values[v].shape};
      val[v] = body.values[v].data.get();
    }
  std::vector<const TensorType*> types;
  std::vector<const Tensor*> vals;
  for (const Node& n : body.nodes) {
    types.clear();
    vals.clear();
    std::string unknown;
    bool dep = false;
    for (int i : n.inputs) {
      const auto v = static_cast<size_t>(i);
      types.push_back(i >= 0 && t[v] ? &*t[v] : nullptr);
      vals.push_back(i >= 0 ? val[v] : nullptr);
      if (i >= 0 && !t[v] && unknown.empty()) {
        unknown = why[v].empty() ? fmt::format("body value '{}' has no type", body.values[v].name) : why[v];
        dep = data_dep[v];
      }
    }
    std::vector<TensorType> out;
    if (unknown.empty()) {
      try {
        out = infer_types(n, types, vals, opset, evaluate);
      } catch (const DataDependentError& e) {
        unknown = e.what();
        dep = true;
      } catch (const UnsupportedError& e) {
        unknown = e.what();
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const auto o = static_cast<size_t>(n.outputs[k]);
      if (k < out.size()) {
        t[o] = out[k];
        continue;
      }
      why[o] =
          unknown.empty() ? fmt::format("node '{}' ({}) gives no type for output {}", n.name, n.op_type, k) : unknown;
      data_dep[o] = dep;
    }
  }
  BodyTypes r;
  for (int o : body.outputs) {
    const auto v = static_cast<size_t>(o);
    r.outputs.push_back(t[v]);
    if (!t[v] && r.why.empty()) {
      r.why = why[v].empty() ? fmt::format("body value '{}' has no type", body.values[v].name) : why[v];
      r.data_dependent = data_dep[v];
    }
  }
  return r;
}

namespace shapes {
namespace {

std::string types_str(const std::vector<TensorType>& ts) {
  std::vector<std::string> s;
  for (const TensorType& t : ts) s.push_back(type_str(t.dtype, t.shape));
  return fmt::format("({})", fmt::join(s, ", "));
}

// What the shape functions know of body `attr`'s outputs, typed from the node's inputs (captured constants
// included).
BodyTypes body_types(const ShapeCtx& c, const char* attr) {
  const Graph* body = c.node.g(attr);
  if (!body) c.fail(fmt::format("missing graph attribute '{}'", attr));
  const std::vector<TensorType> in = body_input_types(c.node, *body, c.types, c.opset);
  std::vector<const Tensor*> vals(in.size(), nullptr);
  const size_t caps = static_cast<size_t>(c.node.captures());
  for (size_t j = 0; j < caps; ++j) vals[in.size() - caps + j] = c.value(c.n_in() - caps + j);
  return type_body(*body, in, vals, c.opset, c.evaluate);
}

// Output k of `b`, which must be static: else DataDependentError (no single input) or UnsupportedError.
const TensorType& required(const ShapeCtx& c, const BodyTypes& b, size_t k, const char* attr) {
  if (k >= b.outputs.size()) c.fail(fmt::format("its {} has {} outputs, fewer than needed", attr, b.outputs.size()));
  if (b.outputs[k]) return *b.outputs[k];
  const std::string what = fmt::format("{}its {} output {} has no static shape: {}", c.prefix(), attr, k, b.why);
  if (b.data_dependent) throw DataDependentError(what);
  throw UnsupportedError(what);
}

// All of body `attr`'s output types (each required).
std::vector<TensorType> body_output_types(const ShapeCtx& c, const char* attr) {
  const BodyTypes b = body_types(c, attr);
  std::vector<TensorType> out;
  for (size_t k = 0; k < b.outputs.size(); ++k) out.push_back(required(c, b, k, attr));
  return out;
}

std::vector<TensorType> if_shape(const ShapeCtx& c) {
  if (const Tensor* cond = c.value(0)) {
    if (cond->numel() != 1) c.fail("the condition must have one element");
    return body_output_types(c, cond->bytes[0] != std::byte{0} ? "then_branch" : "else_branch");
  }
  std::vector<TensorType> then_t = body_output_types(c, "then_branch");
  std::vector<TensorType> else_t = body_output_types(c, "else_branch");
  if (then_t != else_t)
    throw DataDependentError(fmt::format("{}output types depend on which branch runs: then_branch gives {}, "
                                         "else_branch {}",
                                         c.prefix(), types_str(then_t), types_str(else_t)),
                             0);
  return then_t;
}

// True when the Loop body's condition output stays what its condition input was (passed through, or constant true).
bool keeps_condition(const Graph& body) {
  if (body.outputs.empty() || body.inputs.size() < 2) return false;
  int v = body.outputs[0];
  while (body.values[static_cast<size_t>(v)].producer >= 0) {
    const Node& p = body.nodes[static_cast<size_t>(body.values[static_cast<size_t>(v)].producer)];
    if (p.op_type != "Identity" || p.inputs.empty()) return false;
    v = p.inputs[0];
  }
  const Value& cv = body.values[static_cast<size_t>(v)];
  return v == body.inputs[1] || (cv.data && cv.data->numel() == 1 && cv.data->bytes[0] != std::byte{0});
}

// The Loop's number of iterations, when it is known before it runs.
int64_t static_trip_count(const ShapeCtx& c) {
  if (!c.has(0))
    throw DataDependentError(c.prefix() +
                             "output shape depends on the trip count: the loop has no M and runs until "
                             "its body's condition is false");
  const int64_t m = c.needs_value(0, "the trip count").as_int64s().at(0);
  if (c.has(1) && c.needs_value(1, "the condition, whether the loop runs at all").bytes.at(0) == std::byte{0}) return 0;
  if (!keeps_condition(*c.node.g("body")))
    throw DataDependentError(c.prefix() + "output shape depends on the trip count: the body computes its condition");
  return std::max<int64_t>(m, 0);
}

// Loop (opset 1+): outputs = the final carried values (typed as they enter: the body must keep their types), then the
// scan outputs (per-iteration values stacked on a new leading dim of the trip count).
std::vector<TensorType> loop_shape(const ShapeCtx& c) {
  const size_t carried = own_inputs(c.node) - 2;
  const BodyTypes body = body_types(c, "body");
  if (body.outputs.size() < 1 + carried)
    c.fail(fmt::format("the body has {} outputs for {} carried values", body.outputs.size(), carried));
  std::vector<TensorType> out;
  for (size_t k = 0; k < carried; ++k) {
    if (body.outputs[1 + k] && *body.outputs[1 + k] != c.type(2 + k))
      c.fail(
          fmt::format("carried value {} enters the body as {} and leaves it as {}: types that change across "
                      "iterations are not supported",
                      k, types_str({c.type(2 + k)}), types_str({*body.outputs[1 + k]})));
    out.push_back(c.type(2 + k));
  }
  if (body.outputs.size() == 1 + carried) return out;
  const int64_t trips = static_trip_count(c);
  for (size_t k = 1 + carried; k < body.outputs.size(); ++k) {
    TensorType t = required(c, body, k, "body");
    t.shape.insert(t.shape.begin(), trips);
    out.push_back(std::move(t));
  }
  return out;
}

// Scan (opset 8+, control_flow.h's ScanLayout): outputs = the final states, then the scan outputs (per-iteration
// values stacked along their scan_output_axes; opset 8: [batch, length, ...]).
std::vector<TensorType> scan_shape(const ShapeCtx& c) {
  const BodyTypes body = body_types(c, "body");
  const ScanLayout s = scan_layout(c.node, body.outputs.size(), c.opset);
  const std::vector<TensorType> in = body_input_types(c.node, *c.node.g("body"), c.types, c.opset);
  int64_t length = -1;
  for (int k = 0; k < s.num_scan_in; ++k) {
    const size_t i = static_cast<size_t>(s.first_state + s.num_state + k);
    const int64_t d = c.shape(i).at(static_cast<size_t>(c.axis(s.in_axes[static_cast<size_t>(k)], c.rank(i))));
    if (length >= 0 && d != length) c.fail(fmt::format("scan inputs have lengths {} and {}", length, d));
    length = d;
  }
  const int64_t batch = s.batched ? c.shape(static_cast<size_t>(s.first_state + s.num_state)).at(0) : 0;
  std::vector<TensorType> out;
  for (int k = 0; k < s.num_state; ++k) {
    const auto& kept = body.outputs[static_cast<size_t>(k)];
    if (kept && *kept != in[static_cast<size_t>(k)])
      c.fail(fmt::format("state {} enters the body as {} and leaves it as {}", k,
                         types_str({in[static_cast<size_t>(k)]}), types_str({*kept})));
    out.push_back(c.type(static_cast<size_t>(s.first_state + k)));
  }
  for (size_t j = 0; j < s.out_axes.size(); ++j) {
    TensorType t = required(c, body, static_cast<size_t>(s.num_state) + j, "body");
    if (s.batched) {
      t.shape.insert(t.shape.begin(), {batch, length});
    } else {
      const int64_t a = c.axis(s.out_axes[j], static_cast<int64_t>(t.shape.size()) + 1);
      t.shape.insert(t.shape.begin() + a, length);
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

void register_control_shapes(ShapeTable& t) {
  t["If"] = if_shape;
  t["Loop"] = loop_shape;
  t["Scan"] = scan_shape;
}

}  // namespace shapes
}  // namespace gspmd
