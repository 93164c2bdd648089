// cli: wires the backend's kernels into the frontend's loader (the layering keeps them apart: docs/architecture.md,
// invariant 6).
#pragma once

#include "backend/kernels/kernels.h"
#include "core/shapes/shapes.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

/// LoadOptions whose evaluator is run_kernel and whose shape function is infer_types (core/shapes/shapes.h) with
/// run_kernel as its evaluator (kernel_evaluator), so the loader folds with the executor's kernels and types values
/// with the executor's shape functions.
inline LoadOptions kernel_load_options() {
  LoadOptions lo;
  lo.evaluator = kernel_evaluator();
  lo.shape_function = [](const Node& n, const std::vector<const TensorType*>& types,
                         const std::vector<const Tensor*>& values,
                         int64_t opset) { return infer_types(n, types, values, opset, &kernel_evaluator()); };
  return lo;
}

}  // namespace gspmd::cli
