// core/ir: the numeric precision of a whole model (`--precision`, docs/training.md "Precision"): every floating-point
// value retyped to bfloat16 or float32, as mixed-precision training runs a model (Micikevicius et al. 2018; Lingvo's
// fprop_dtype bfloat16 with float32 variables, which the GSPMD paper's runs use; torch's autocast).
#pragma once

#include <functional>
#include <string_view>

#include "core/ir/ir.h"

namespace gspmd {

/// How a model's floating-point values are typed.
enum class Precision {
  kAsLoaded,  // as the model declares them
  kF32,       // float32 everywhere
  kBF16,      // bfloat16 everywhere: weights, activations, gradients (and the optimizer's 16-bit-weight rule:
              // Adam's and Adafactor's state and arithmetic in float32, core/autodiff)
  kMixed,     // bfloat16 activations and gradients; the weights (`master`) are float32 variables, each Cast to
              // bfloat16 where it is read, so their gradients, updates and optimizer state are float32
  kAutocast,  // torch's automatic mixed precision (torch.autocast, bfloat16): contractions compute in bfloat16
              // (their floating-point inputs Cast where read), every other op in the widest floating-point type
              // among its inputs; weights and what is computed from them outside contractions stay float32
};

/// "as-loaded", "f32", "bf16", "mixed", "autocast".
std::string_view precision_name(Precision p);

/// Retypes `g` (a loaded graph: every node typed) to precision `p`; kAsLoaded changes nothing. Every value of a
/// floating-point type (float16, bfloat16, float32, float64) becomes the compute type (bfloat16 for kBF16 and kMixed,
/// float32 for kF32), its data converted (rounded to nearest even); the attributes that name an output's element
/// type (Cast's `to`, ConstantOfShape's `value`, `dtype` of EyeLike and the Random ops) follow their output. Under
/// kMixed, a value for which `master` is true (an initializer or graph input: the weights) stays float32 and every
/// node that reads it reads its own Cast of it to bfloat16, named "<w>.bf16" (made unique), inserted right before
/// it: a copy shared by distant readers (a tied embedding and LM head) would live across the forward pass and leave
/// --remat no cut between them. Softmax and LogSoftmax
/// run in float32 between Casts (attention logits and the loss in float32, as Lingvo's attention_logits_dtype and
/// torch's autocast do); LayerNormalization computes in float32 by its spec (stash_type 1) and every kernel
/// accumulates 16-bit operands in float32 (backend/kernels), so only those two are cast. `shapes` retypes each node:
/// a node whose output type does not follow (an op without a 16-bit form) throws UnsupportedError("--precision
/// bf16: node 'n' (Op) gives float32 where bfloat16 was set"). kAutocast retypes no value up front: in graph order,
/// each MatMul, Gemm, Einsum, Conv and ConvTranspose reads its own Cast to bfloat16 of each floating-point input (as
/// torch's autocast casts linear, matmul and convolution operands, `<v>.bf16`), any other node whose floating-point
/// inputs differ in type reads Casts of its 16-bit ones to the widest (torch's type promotion, `<v>.f32`), and each
/// node's outputs take the types `shapes` gives (a contraction's bfloat16, a bias Add of it float32). O(values +
/// nodes).
void set_precision(Graph& g, Precision p, const std::function<bool(const Value&)>& master, const ShapeFunction& shapes);

}  // namespace gspmd
