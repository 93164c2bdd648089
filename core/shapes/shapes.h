// core/shapes: the op shape functions, one per op of the executor's kernel table (backend/kernels), in one file per op
// family as core/rules (core/shapes/<family>.cc). A shape function gives a node's output dtypes and static dims from
// its input types, attributes and constant operands, following the ONNX operator spec (onnx/docs/Operators.md) at the
// node's opset exactly as the kernel implements it: the loader types every value with them (docs/loading.md) and the
// executor's results are what they say, so what loads is what runs.
// Core knowledge, but the output sizes of a few ops are their kernel's result on constant inputs (NonZero, Unique,
// NonMaxSuppression): the caller passes that kernel as a ValueEvaluator (the backend's kernel_evaluator, injected by
// the CLI: cli/wiring.h), so core does not depend on the backend (docs/architecture.md, invariant 6).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// Evaluates one node on constant inputs (one per node input; nullptr for an absent optional input) at the graph's
/// ai.onnx `opset` and returns its outputs: the backend's run_kernel (backend/kernels/kernels.h, kernel_evaluator).
/// The same signature as the loader's ConstantEvaluator (onnx_frontend/frontend.h).
using ValueEvaluator =
    std::function<std::vector<Tensor>(const Node& node, const std::vector<const Tensor*>& inputs, int64_t opset)>;

/// The types of `node`'s outputs (one per output, absent trailing optional outputs may be omitted) from the types of
/// its inputs (`types`, one per node input; nullptr = absent optional input) and the values of its constant inputs
/// (`values`, one per input; nullptr = not known at load). The shape function of the op's kernel, following the ONNX
/// operator spec at `opset`: what the loader infers is what run_kernel produces (the executor checks every result).
/// `evaluate` computes the output sizes that are the kernel's result on constant inputs (NonZero, Unique,
/// NonMaxSuppression, also inside an If / Loop / Scan body); nullptr: none, and those ops throw DataDependentError
/// even when their inputs are constant.
/// Throws DataDependentError when an output shape depends on the values of an input that is not constant (NonZero,
/// Unique, TopK with a computed K, ...), UnsupportedError("node 'n' (Op): no shape function ...") for an op with no
/// kernel, SpecError("node 'n' (Op): ...") for inputs that violate the spec.
std::vector<TensorType> infer_types(const Node& node, const std::vector<const TensorType*>& types,
                                    const std::vector<const Tensor*>& values, int64_t opset,
                                    const ValueEvaluator* evaluate = nullptr);

/// True if infer_types has a shape function for (domain, op_type).
bool has_shape_function(const std::string& domain, const std::string& op_type);

/// What the shape functions know of a body's outputs (a body of If / Loop / Scan, core/ir/control_flow.h).
struct BodyTypes {
  std::vector<std::optional<TensorType>> outputs;  // per body output; nullopt when not static
  std::string why;  // why the first unknown output is not static (a data-dependent shape, an op without a shape
                    // function)
  bool data_dependent = false;  // that reason is a data-dependent shape (else an op without a shape function)
};
/// Types `body`'s values node by node with infer_types (no folding), its inputs typed `inputs` (one per body input)
/// with the constant values `values` (one per body input, nullptr = not constant; may be shorter), and `evaluate` as
/// infer_types's evaluator. A node whose shape is data-dependent, or that has no shape function, leaves its outputs
/// (and what depends on them) unknown; other errors (spec violations) are thrown.
BodyTypes type_body(const Graph& body, const std::vector<TensorType>& inputs, const std::vector<const Tensor*>& values,
                    int64_t opset, const ValueEvaluator* evaluate = nullptr);

namespace shapes {

/// The key of (domain, op_type) in the kernel and shape-function tables: op_type for ai.onnx ("" or "ai.onnx"),
/// "<domain>:<op_type>" for ai.onnx.preview.training (the optimizers) and gspmd.pipeline (the stage shift), "" for
/// any other domain (no kernel).
inline std::string table_key(const std::string& domain, const std::string& op_type) {
  if (domain.empty() || domain == "ai.onnx") return op_type;
  if (domain == "ai.onnx.preview.training" || domain == "gspmd.pipeline") return domain + ":" + op_type;
  return "";
}

}  // namespace shapes
}  // namespace gspmd
