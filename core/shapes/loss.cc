// Shape functions of ops_loss.cc's kernels: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
#include <fmt/format.h>

#include "core/shapes/geometry.h"
#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// The loss: input [N, C, d1..dk] (input 0), target [N, d1..dk] (input 1), weight [C] (input 2); [N, d1..dk] with
// reduction "none", a scalar otherwise.
TensorType loss_type(const ShapeCtx& c) {
  const TensorType &x = c.type(0), &target = c.type(1);
  check_loss_operands(c, x.shape, target.dtype, target.shape);
  const std::string reduction = c.node.s("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    c.fail(fmt::format("unknown reduction '{}'", reduction));
  if (c.has(2) && (c.dtype(2) != x.dtype || c.shape(2) != Shape{x.shape[1]}))
    c.fail(fmt::format("weight must be {} [{}], got {} {}", dtype_name(x.dtype), x.shape[1], dtype_name(c.dtype(2)),
                       shape_str(c.shape(2))));
  return {x.dtype, reduction == "none" ? target.shape : Shape{}};
}

std::vector<TensorType> nll_types(const ShapeCtx& c) { return {loss_type(c)}; }

// SoftmaxCrossEntropyLoss: the loss, then the optional log_prob (the input's type).
std::vector<TensorType> sce_types(const ShapeCtx& c) {
  std::vector<TensorType> out{loss_type(c)};
  if (c.n_out() > 1) out.push_back(c.type(0));
  return out;
}

}  // namespace

void register_loss_shapes(ShapeTable& t) {
  t["NegativeLogLikelihoodLoss"] = nll_types;
  t["SoftmaxCrossEntropyLoss"] = sce_types;
}

}  // namespace gspmd::shapes
