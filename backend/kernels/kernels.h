// backend/kernels: one CPU kernel per ONNX operator (ai.onnx domain), oneDNN primitives where oneDNN has them
// (matmul, eltwise, binary, softmax, layer normalization, reduction, convolution / deconvolution, pooling), plain C++
// otherwise (int64/bool ops, shape ops, indexing, normalizations, Resize, fallbacks for what oneDNN rejects).
// Semantics follow the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
// `gspmd` domain ops are not kernels: backend/pod implements them (they need the partition id and the pod).
// The ai.onnx.preview.training optimizers (Adagrad, Adam, Momentum) are kernels too; other domains are unsupported.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ir/control_flow.h"
#include "core/ir/ir.h"
#include "core/shapes/shapes.h"

namespace gspmd {

/// Runs `node` on `inputs` (one per node input; nullptr for an absent optional input) and returns its outputs
/// in order. `opset` is the graph's ai.onnx opset (for ops whose attributes became inputs).
/// `donated` is empty or has one entry per input: a non-null donated[k] (== inputs[k], made mutable) means the caller
/// no longer needs input k after this call, so the kernel may move its buffer into an output (Reshape, Identity:
/// no copy) or compute in place in it (elementwise ops, Softmax); afterwards the caller must only destroy it.
/// Throws UnsupportedError("node 'n' (OpType): ...") for an op or dtype with no kernel, SpecError for
/// inputs that violate the spec (shape mismatch), InputError for a Loop past kMaxLoopIterations or indices from the
/// data out of range, InternalError for anything else (a bug).
/// `owners` is empty or has one entry per input: a non-null owners[k] owns inputs[k] (== owners[k]->get()) and never
/// changes it while it lives (a model weight): a kernel may cache what it derives from that input (Conv and
/// ConvTranspose keep the weights in oneDNN's blocked layout) until the owner is gone.
std::vector<Tensor> run_kernel(const Node& node, const std::vector<const Tensor*>& inputs, int64_t opset,
                               const std::vector<Tensor*>& donated = {},
                               const std::vector<const std::shared_ptr<const Tensor>*>& owners = {});

/// run_kernel as the evaluator of the shape functions (infer_types, core/shapes/shapes.h): the output types of
/// NonZero, Unique and NonMaxSuppression on constant inputs are their kernel's results.
const ValueEvaluator& kernel_evaluator();

/// Every key of the kernel table, sorted: op types of ai.onnx, "ai.onnx.preview.training:<Op>" for the optimizers.
std::vector<std::string> kernel_op_types();

/// True if run_kernel supports (domain, op_type) for some dtypes ("" or "ai.onnx", and the
/// ai.onnx.preview.training optimizers).
bool has_kernel(const std::string& domain, const std::string& op_type);

}  // namespace gspmd
