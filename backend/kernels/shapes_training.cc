// Shape functions of ops_training.cc's kernels: the ai.onnx.preview.training optimizers Adagrad, Adam, Momentum.
#include <fmt/format.h>

#include "backend/kernels/shape_util.h"

namespace gspmd::kern {
namespace {

// Inputs R, T, then `groups` lists of n tensors of matching types (X, G, states); outputs X_new and the new states:
// (groups - 1) lists, output g*n + k of X_k's type.
template <size_t groups>
std::vector<TensorType> optimizer_types(const ShapeCtx& c) {
  if (c.n_in() < 2 || (c.n_in() - 2) % groups != 0)
    c.fail(fmt::format("expects R, T and {} lists of the same length, got {} inputs", groups, c.n_in()));
  const size_t n = (c.n_in() - 2) / groups;
  for (size_t k = 0; k < n; ++k)
    for (size_t g = 1; g < groups; ++g) {
      const TensorType &a = c.type(2 + k), &b = c.type(2 + g * n + k);
      if (a != b)
        c.fail(fmt::format("input {} ({} {}) does not match input {} ({} {})", 2 + g * n + k, dtype_name(b.dtype),
                           shape_str(b.shape), 2 + k, dtype_name(a.dtype), shape_str(a.shape)));
    }
  for (size_t i : {0, 1})
    if (num_elements(c.shape(i)) != 1) c.fail(fmt::format("input {} must be a scalar", i));
  std::vector<TensorType> out;
  for (size_t g = 0; g + 1 < groups; ++g)
    for (size_t k = 0; k < n; ++k) out.push_back(c.type(2 + k));
  return out;
}

}  // namespace

void register_training_shapes(ShapeTable& t) {
  t["ai.onnx.preview.training:Adagrad"] = optimizer_types<3>;
  t["ai.onnx.preview.training:Adam"] = optimizer_types<4>;
  t["ai.onnx.preview.training:Momentum"] = optimizer_types<3>;
}

}  // namespace gspmd::kern
