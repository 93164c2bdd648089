// core/shapes: symbolic shape functions (docs/shapes.md, "Symbolic dims"). For a model loaded with its dim symbols
// kept, they give each node's output dims as expressions over the symbols (`batch`, `past + seq`), and the elements of
// the small integer tensors that torch's exports compute shapes with (Shape, Gather, Concat, integer arithmetic) as
// expressions too, as ONNX Runtime's symbolic_shape_infer.py does with sympy. They follow the ONNX operator specs,
// as the numeric shape functions (shapes.h) do; the loader runs both and checks that the expressions, evaluated at
// the symbols' hints, are the numeric answer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// One node input as infer_symbolic sees it.
struct SymbolicInput {
  const TensorType* type = nullptr;    // its type at the hints; nullptr: an absent optional input
  const Tensor* value = nullptr;       // a constant's data (at the hints); nullptr: not a constant
  const SymbolicValue* sym = nullptr;  // its dims and elements over the symbols; nullptr: static
};

/// What infer_symbolic found for one node.
struct SymbolicResult {
  std::vector<SymbolicValue> outputs;  // one per output type given
  /// Equalities the node's spec needs that hold at the hints but not for every value (a broadcast of `seq` with
  /// `min(seq, 64)`: the model runs only for seq <= 64). torch's shape guards: a run checks them against its dims.
  std::vector<std::pair<DimExpr, DimExpr>> assumed_equal;
};

/// The outputs of `node` over the dim symbols: one SymbolicValue per output type in `outputs` (the numeric shape
/// function's answer at the hints `hints`, shapes.h infer_types), given `inputs` (one per node input, at least one of
/// them symbolic). Each output's `dims` are expressions; its `elems` are set where its values are expressions the
/// graph's shape arithmetic needs: Shape, Size, and Gather, Slice, Concat, Unsqueeze, Squeeze, Reshape, Cast, Add, Sub,
/// Mul, Div, Neg, Max, Min, Equal, Where on such values. Throws UnsupportedError("node 'n' (Op): <why> for symbolic
/// dims [batch, seq]: bind them with --dim") for an op without a symbolic rule, or whose answer would hold only for
/// some values of the symbols (a broadcast of `batch` with `seq`, a Squeeze of a symbolic dim).
SymbolicResult infer_symbolic(const Node& node, const std::vector<SymbolicInput>& inputs,
                              const std::vector<TensorType>& outputs, int64_t opset, const DimBindings& hints);

/// What infer_data_dependent found for one node: the outputs of an op whose output size depends on its input values.
struct DataDependentOutputs {
  std::vector<DType> dtypes;           // one per output
  std::vector<SymbolicValue> outputs;  // their dims, over the input dims and the data-dependent symbol
  /// The symbol's upper bound over the input dims (NonZero: the element count); nullopt when the input dims give
  /// none (Range's length depends on its values only).
  std::optional<DimExpr> bound;
  std::string counts;  // what the symbol is, of input `input`: "the count of non-zeros"
  size_t input = 0;    // the input whose values decide it
};

/// The outputs of `node`, whose numeric shape function threw DataDependentError, with the data-dependent dim as the
/// fresh symbol `symbol` (docs/shapes.md step 6; torch's unbacked symbols): NonZero ([rank, u], u <= numel), Compress
/// on a computed condition, TopK with a computed k, Unique (with and without axis) and NonMaxSuppression ([u, 3],
/// u <= batch * classes * min(boxes, max_output_boxes_per_class)) and Range on computed limits ([u], no bound), as
/// the ONNX operator specs give their output shapes. nullopt for any other node (a Reshape to a computed shape, control
/// flow whose output shapes depend on a branch): the loader refuses those as before.
std::optional<DataDependentOutputs> infer_data_dependent(const Node& node, const std::vector<SymbolicInput>& inputs,
                                                         int64_t opset, const DimBindings& hints,
                                                         const std::string& symbol);

/// Constant `v` (its elements expressions over the dim symbols, Value::sym->elems) at the sizes `at`: a tensor of v's
/// dtype and shape, for int64, int32, float32, float64 and bool; nullopt for another dtype. Throws InputError for a
/// symbol `at` does not bind (DimExpr::eval), InternalError when the elements do not fill v's shape.
std::optional<Tensor> constant_at(const Value& v, const DimBindings& at);

/// True if infer_symbolic has a rule for (domain, op_type).
bool has_symbolic_rule(const std::string& domain, const std::string& op_type);

}  // namespace gspmd
