// core/shapes internal: the shape-function context and table (shapes.cc). Every op of the kernel table
// (backend/kernels) has a shape function here: output dtypes and static dims from input types, attributes and constant
// operands, following the ONNX operator specs (onnx/docs/Operators.md) at the node's opset. The loader infers with
// these functions and the executor checks every kernel result against what they inferred, so what loads is what runs.
// Not part of the public interface (shapes.h); included only by core/shapes/*.cc.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ir/ir.h"
#include "core/shapes/shapes.h"

namespace gspmd::shapes {

/// Everything a shape function sees: the node, its input types (nullptr = absent optional input), the values of its
/// constant inputs (nullptr = not known at load, or absent), the graph opset and infer_types's evaluator (nullptr:
/// none).
struct ShapeCtx {
  const Node& node;
  const std::vector<const TensorType*>& types;
  const std::vector<const Tensor*>& values;
  int64_t opset;
  const ValueEvaluator* evaluate = nullptr;

  size_t n_in() const { return types.size(); }
  /// True when input i is present.
  bool has(size_t i) const { return i < types.size() && types[i] != nullptr; }
  /// Input i's type; fails (SpecError naming the node) when the required input is absent.
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
  /// Throws SpecError(prefix() + msg): the inputs violate the op's spec.
  [[noreturn]] void fail(std::string_view msg) const;
  /// The element type that integer attribute `name` (default `dflt`) names, as ONNX's TensorProto.DataType (Cast's
  /// `to`, EyeLike's `dtype`, the windows' `output_datatype`); fails unless it is one of DType's (not undefined).
  DType dtype_attr(const char* name, int64_t dflt) const;
  /// Normalises axis `a` into [0, rank) (negative counts from the end); fails if out of range.
  int64_t axis(int64_t a, int64_t rank) const;
  /// Multidirectional (numpy) broadcast of two shapes; fails when they do not broadcast.
  Shape broadcast(const Shape& a, const Shape& b) const;
};

/// A shape function: one TensorType per node output, in order (absent trailing outputs may be omitted).
using ShapeFn = std::vector<TensorType> (*)(const ShapeCtx&);
/// op_type (or "ai.onnx.preview.training:<Op>") -> shape function; keys equal the kernel table's.
using ShapeTable = std::unordered_map<std::string, ShapeFn>;

// One registration function per op family: <family>.cc holds the shape functions of the kernels in
// backend/kernels/ops_<family>.cc (and ops_<family>_<part>.cc where the family's kernels span two files); the families
// are those of kernels_util.h's register_* functions, core/rules' where an op has a sharding rule.

/// elementwise.cc (ops_elementwise.cc, ops_elementwise_unary.cc): the elementwise ops, Where, Cast, CastLike,
/// Clip, Identity, Dropout.
void register_elementwise_shapes(ShapeTable& t);
/// matmul.cc: MatMul, Gemm, MatMulInteger, QLinearMatMul.
void register_matmul_shapes(ShapeTable& t);
/// reduce_norm.cc: Softmax, LogSoftmax, Hardmax, LayerNormalization, Reduce*, ArgMax, ArgMin.
void register_reduce_norm_shapes(ShapeTable& t);
/// gather.cc: Gather.
void register_gather_shapes(ShapeTable& t);
/// conv_pool.cc (ops_conv_pool.cc, ops_conv_pool_norm.cc): Conv, ConvTranspose, ConvInteger, QLinearConv, the
/// pools, BatchNormalization, InstanceNormalization, LRN, MeanVarianceNormalization, DepthToSpace, SpaceToDepth.
void register_conv_pool_shapes(ShapeTable& t);
/// einsum.cc: Einsum.
void register_einsum_shapes(ShapeTable& t);
/// shape_ops.cc: Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Concat, Slice, Split, Expand, Constant,
/// ConstantOfShape, Shape, Size.
void register_shape_ops_shapes(ShapeTable& t);
/// index.cc (ops_index.cc, ops_index_resize.cc): GatherElements, GatherND, ScatterElements, Scatter,
/// ScatterND, OneHot, NonZero, Compress, TopK, CumSum, Tile, Pad, Range, Resize, Upsample.
void register_index_shapes(ShapeTable& t);
/// rnn.cc: RNN, GRU, LSTM.
void register_rnn_shapes(ShapeTable& t);
/// loss.cc: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
void register_loss_shapes(ShapeTable& t);
/// signal.cc: HannWindow, HammingWindow, BlackmanWindow, DFT, STFT, MelWeightMatrix.
void register_signal_shapes(ShapeTable& t);
/// spatial.cc: MaxUnpool, RoiAlign, GridSample.
void register_spatial_shapes(ShapeTable& t);
/// misc.cc: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, Det, Trilu, EyeLike, Unique,
/// ReverseSequence, NonMaxSuppression, TfIdfVectorizer.
void register_misc_shapes(ShapeTable& t);
/// training.cc: the "ai.onnx.preview.training:<Op>" optimizers Adagrad, Adam, Momentum.
void register_training_shapes(ShapeTable& t);
/// control.cc: If, Loop, Scan.
void register_control_shapes(ShapeTable& t);
/// pipeline.cc: "gspmd.pipeline:Shift".
void register_pipeline_shapes(ShapeTable& t);
/// collectives.cc: "gspmd:AllReduce" and the other collectives in their exported form (group_size).
void register_collective_shapes(ShapeTable& t);

/// The kernel's output types on the constant inputs, computed by c.evaluate: for ops whose output sizes are the result
/// itself (NonZero, Unique, NonMaxSuppression). `needed` names each input whose values decide them (the first
/// `required` ones required); every one present must be constant. Throws DataDependentError when c has no evaluator.
std::vector<TensorType> evaluated_types(const ShapeCtx& c, const std::vector<std::string_view>& needed,
                                        size_t required = 1);

/// The type of input 0 (elementwise unary ops, CumSum, PRelu, ...).
inline std::vector<TensorType> same_as_input0(const ShapeCtx& c) { return {c.type(0)}; }

/// The one-output result {dtype, shape}.
inline std::vector<TensorType> one_type(DType t, Shape s) { return {TensorType{t, std::move(s)}}; }

}  // namespace gspmd::shapes
