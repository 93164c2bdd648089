// Shape functions of ops_training.cc's kernels: the ai.onnx.preview.training optimizers Adagrad, Adam, Momentum.
#include <fmt/format.h>

#include "core/shapes/geometry.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// Inputs R, T, then `groups` lists of n tensors of matching types (X, G, states); outputs X_new and the new states:
// (groups - 1) lists, output g*n + k of X_k's type.
template <size_t groups>
std::vector<TensorType> optimizer_types(const ShapeCtx& c) {
  const size_t n = optimizer_arity(c, c.n_in(), groups, [&](size_t i) { return c.type(i); });
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

}  // namespace gspmd::shapes
