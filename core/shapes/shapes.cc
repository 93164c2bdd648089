// core/shapes: the shape-function table, infer_types, and the helpers of shape_ctx.h (ShapeCtx, evaluated_types).
#include "core/shapes/shapes.h"

#include <fmt/format.h>

#include "core/shapes/geometry.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd {
namespace shapes {

const TensorType& ShapeCtx::type(size_t i) const {
  if (!has(i)) fail(fmt::format("missing required input {}", i));
  return *types[i];
}

const Tensor& ShapeCtx::needs_value(size_t i, std::string_view what) const {
  const Tensor* v = value(i);
  if (!v) {
    if (!has(i)) fail(fmt::format("missing required input {}", i));
    throw DataDependentError(fmt::format("{}output shape depends on the values of input {} ({})", prefix(), i, what),
                             static_cast<int>(i));
  }
  return *v;
}

std::string ShapeCtx::prefix() const { return fmt::format("node '{}' ({}): ", node.name, node.op_type); }

void ShapeCtx::fail(std::string_view msg) const { throw SpecError(prefix() + std::string(msg)); }

DType ShapeCtx::dtype_attr(const char* name, int64_t dflt) const {
  const int64_t v = node.i(name, dflt);
  const DType t = static_cast<DType>(v);
  if (v < INT32_MIN || v > INT32_MAX || t == DType::kUndefined || dtype_name(t) == "undefined")
    fail(
        fmt::format("attribute '{}' is {}, which is not an element type (ONNX TensorProto.DataType) this tool "
                    "supports",
                    name, v));
  return t;
}

int64_t ShapeCtx::axis(int64_t a, int64_t rank) const { return normalize_axis(*this, a, rank); }

Shape ShapeCtx::broadcast(const Shape& a, const Shape& b) const { return broadcast_shapes(*this, a, b); }

std::vector<TensorType> evaluated_types(const ShapeCtx& c, const std::vector<std::string_view>& needed,
                                        size_t required) {
  for (size_t i = 0; i < needed.size(); ++i)
    if (i < required || c.has(i)) c.needs_value(i, needed[i]);
  if (!c.evaluate)
    throw DataDependentError(c.prefix() +
                             "output shape is the kernel's result on the constant inputs, and no evaluator "
                             "was given to compute it");
  std::vector<TensorType> out;
  for (const Tensor& t : (*c.evaluate)(c.node, c.values, c.opset)) out.push_back({t.dtype, t.shape});
  return out;
}

const ShapeTable& shape_table() {
  static const ShapeTable t = [] {
    ShapeTable k;
    register_elementwise_shapes(k);
    register_matmul_shapes(k);
    register_reduce_norm_shapes(k);
    register_gather_shapes(k);
    register_conv_pool_shapes(k);
    register_einsum_shapes(k);
    register_shape_ops_shapes(k);
    register_index_shapes(k);
    register_rnn_shapes(k);
    register_loss_shapes(k);
    register_signal_shapes(k);
    register_spatial_shapes(k);
    register_misc_shapes(k);
    register_training_shapes(k);
    register_control_shapes(k);
    register_pipeline_shapes(k);
    register_collective_shapes(k);
    return k;
  }();
  return t;
}

}  // namespace shapes

std::vector<TensorType> infer_types(const Node& node, const std::vector<const TensorType*>& types,
                                    const std::vector<const Tensor*>& values, int64_t opset,
                                    const ValueEvaluator* evaluate) {
  const shapes::ShapeCtx ctx{node, types, values, opset, evaluate};
  // the exported collectives have shape functions but no kernel (the executor runs them itself)
  const std::string key =
      node.domain == "gspmd" ? "gspmd:" + node.op_type : shapes::table_key(node.domain, node.op_type);
  if (key.empty()) throw UnsupportedError(ctx.prefix() + fmt::format("no shape function for domain '{}'", node.domain));
  const auto& t = shapes::shape_table();
  auto it = t.find(key);
  if (it == t.end()) throw UnsupportedError(ctx.prefix() + "no shape function for this operator");
  try {
    return it->second(ctx);
  } catch (const DataDependentError&) {
    throw;
  } catch (const UnsupportedError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.rfind(ctx.prefix(), 0) == 0) throw;
    throw SpecError(ctx.prefix() + what);
  }
}

bool has_shape_function(const std::string& domain, const std::string& op_type) {
  const std::string key = shapes::table_key(domain, op_type);
  return !key.empty() && shapes::shape_table().count(key) != 0;
}

}  // namespace gspmd
