// backend/kernels internal: the shape-function context and table (shapes.cc). Every op of the kernel table has a
// shape function here: output dtypes and static dims from input types, attributes and constant operands, following
// the ONNX operator specs (onnx/docs/Operators.md) at the node's opset. The loader infers with these functions and the
// executor checks every kernel result against what they inferred, so what loads is what runs.
// Not part of the public interface (kernels.h); included only by backend/kernels/*.cc.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd::kern {

/// Everything a shape function sees: the node, its input types (nullptr = absent optional input), the values of its
/// constant inputs (nullptr = not known at load, or absent) and the graph opset.
struct ShapeCtx {
  const Node& node;
  const std::vector<const TensorType*>& types;
  const std::vector<const Tensor*>& values;
  int64_t opset;

  size_t n_in() const { return types.size(); }
  /// True when input i is present.
  bool has(size_t i) const { return i < types.size() && types[i] != nullptr; }
  /// Input i's type; fails (std::runtime_error naming the node) when the required input is absent.
  const TensorType& type(size_t i) const;
  const Shape& shape(size_t i) const { return type(i).shape; }
  DType dtype(size_t i) const { return type(i).dtype; }
  int64_t rank(size_t i) const { return static_cast<int64_t>(type(i).shape.size()); }
  /// Input i's value when it is a constant, else nullptr.
  const Tensor* value(size_t i) const { return i < values.size() ? values[i] : nullptr; }
  /// Input i's value, needed for the output shape: throws DataDependentError("output shape depends on the values of
  /// input i (<what>)") when input i is present but not a constant.
  const Tensor& needs_value(size_t i, std::string_view what) const;
  /// Number of outputs the node declares (at least 1).
  size_t n_out() const { return node.outputs.empty() ? 1 : node.outputs.size(); }
  /// "node 'n' (Op): "
  std::string prefix() const;
  /// Throws std::runtime_error(prefix() + msg): the inputs violate the op's spec.
  [[noreturn]] void fail(std::string_view msg) const;
  /// Normalises axis `a` into [0, rank) (negative counts from the end); fails if out of range.
  int64_t axis(int64_t a, int64_t rank) const;
  /// Multidirectional (numpy) broadcast of two shapes; fails when they do not broadcast.
  Shape broadcast(const Shape& a, const Shape& b) const;
};

/// A shape function: one TensorType per node output, in order (absent trailing outputs may be omitted).
using ShapeFn = std::vector<TensorType> (*)(const ShapeCtx&);
/// op_type (or "ai.onnx.preview.training:<Op>") -> shape function; keys equal the kernel table's.
using ShapeTable = std::unordered_map<std::string, ShapeFn>;

/// One registration function per kernel file (ops_<family>.cc has shapes_<family>.cc).
void register_elementwise_shapes(ShapeTable& t);
void register_shape_op_shapes(ShapeTable& t);
void register_math_shapes(ShapeTable& t);
void register_nn_shapes(ShapeTable& t);
void register_index_shapes(ShapeTable& t);
void register_misc_shapes(ShapeTable& t);
void register_loss_shapes(ShapeTable& t);
void register_signal_shapes(ShapeTable& t);  // + GridSample
void register_rnn_shapes(ShapeTable& t);
void register_spatial_shapes(ShapeTable& t);
void register_training_shapes(ShapeTable& t);
void register_control_shapes(ShapeTable& t);  // shapes_control.cc: If, Loop, Scan

/// What the shape functions know of a body's outputs (a body of If / Loop / Scan, core/ir/control_flow.h).
struct BodyTypes {
  std::vector<std::optional<TensorType>> outputs;  // per body output; nullopt when not static
  std::string why;  // why the first unknown output is not static (a data-dependent shape, an op without a shape
                    // function)
  bool data_dependent = false;  // that reason is a data-dependent shape (else an op without a shape function)
};
/// Types `body`'s values node by node with infer_types (no folding), its inputs typed `inputs` (one per body input)
/// with the constant values `values` (one per body input, nullptr = not constant; may be shorter). A node whose
/// shape is data-dependent, or that has no shape function, leaves its outputs (and what depends on them) unknown;
/// other errors (spec violations) are thrown.
BodyTypes type_body(const Graph& body, const std::vector<TensorType>& inputs, const std::vector<const Tensor*>& values,
                    int64_t opset);

/// numpy matmul of shapes a and b: 1-D operands promoted (their unit dim dropped from the result), batch dims
/// broadcast; fails unless both have rank >= 1 and the contracted dims agree. MatMul, MatMulInteger, QLinearMatMul.
Shape matmul_shape(const ShapeCtx& c, const Shape& a, const Shape& b);

/// The type of input 0 (elementwise unary ops, CumSum, PRelu, ...).
inline std::vector<TensorType> same_as_input0(const ShapeCtx& c) { return {c.type(0)}; }

/// The one-output result {dtype, shape}.
inline std::vector<TensorType> one_type(DType t, Shape s) { return {TensorType{t, std::move(s)}}; }

}  // namespace gspmd::kern
