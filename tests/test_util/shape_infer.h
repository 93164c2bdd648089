// Shared helpers for the shape-function tests (tests/backend/shape_functions_*_test.cc): infer_types on the types of
// given tensors, the kernel's results checked against it, and the errors it throws.
// Header-only; depends on core/shapes/shapes.h, backend/kernels/kernels.h and gtest.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "core/shapes/shapes.h"

namespace gspmd::testing {

/// infer_types on the types of `ins` (nullptr = absent), with their values known when `known`, else only those of the
/// inputs in `constant`; run_kernel is its evaluator.
inline std::vector<TensorType> infer(const Node& n, const std::vector<const Tensor*>& ins, bool known = true,
                                     int64_t opset = 17, const std::vector<size_t>& constant = {}) {
  std::vector<TensorType> types(ins.size());
  std::vector<const TensorType*> tp(ins.size(), nullptr);
  std::vector<const Tensor*> vp(ins.size(), nullptr);
  for (size_t i = 0; i < ins.size(); ++i)
    if (ins[i]) {
      types[i] = {ins[i]->dtype, ins[i]->shape};
      tp[i] = &types[i];
      if (known) vp[i] = ins[i];
    }
  for (size_t i : constant) vp[i] = ins[i];
  return infer_types(n, tp, vp, opset, &kernel_evaluator());
}

/// Runs the kernel, expects its output types to equal infer()'s (values known), and returns them.
inline std::vector<TensorType> agree(const Node& n, const std::vector<const Tensor*>& ins, int64_t opset = 17) {
  std::vector<TensorType> got;
  for (const Tensor& t : run_kernel(n, ins, opset)) got.push_back({t.dtype, t.shape});
  EXPECT_EQ(infer(n, ins, true, opset), got) << n.op_type;
  return got;
}

/// The message of the E (std::runtime_error or a subclass) that infer() throws, "no error" if none.
template <class E = std::runtime_error>
std::string error_of(const Node& n, const std::vector<const Tensor*>& ins, bool known = true, int64_t opset = 17) {
  try {
    infer(n, ins, known, opset);
  } catch (const E& e) {
    return e.what();
  }
  return "no error";
}

/// The message of the DataDependentError infer() throws with only the inputs in `constant` known,
/// "no DataDependentError" if none.
inline std::string data_dependent(const Node& n, const std::vector<const Tensor*>& ins,
                                  const std::vector<size_t>& constant, int64_t opset = 17) {
  try {
    infer(n, ins, false, opset, constant);
  } catch (const DataDependentError& e) {
    return e.what();
  }
  return "no DataDependentError";
}

}  // namespace gspmd::testing
