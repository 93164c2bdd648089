// backend/kernels: thin float32 wrappers over oneDNN 2.6 primitives (onednn.cc; matmuls in onednn_matmul.cc,
// convolution and pooling in onednn_conv.cc). Only those files include dnnl.hpp (through onednn_impl.h).
// Primitives are cached by (kind, shapes, parameters, the calling thread's OpenMP thread count) in a process-wide
// thread-safe cache, so the emulated devices of an SPMD program (identical local shapes) share one primitive per node;
// one global CPU engine, one stream per calling thread (oneDNN streams are not meant to be shared between threads).
// Callers guarantee non-empty tensors and ranks <= 12; oneDNN failures surface as InternalError.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace gspmd::dnn {

enum class Eltwise { kRelu, kTanh, kExp, kSqrt, kLog, kAbs, kSigmoid, kNeg, kReciprocal };
enum class Binary { kAdd, kSub, kMul, kDiv, kMax, kMin };
enum class Reduce { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare };

/// out[i] = f(in[i]) for n elements (in == out allowed).
void eltwise(Eltwise op, const float* in, float* out, int64_t n);

/// dst = a (op) b where a has shape `dims` (== dst shape) and b has the same rank with some dims 1 (broadcast).
/// Returns false (nothing written) if oneDNN has no implementation for that broadcast pattern.
bool binary(Binary op, const float* a, const float* b, float* dst, const std::vector<int64_t>& dims,
            const std::vector<int64_t>& b_dims);

/// C[batch, M, N] = alpha * op(A) op(B) + beta * C, where A is [a_batch, M, K] (or [a_batch, K, M] if trans_a),
/// B is [b_batch, K, N] (or [b_batch, N, K] if trans_b), a_batch and b_batch are 1 or `batch`.
/// beta == 0 overwrites C (C need not be initialised).
void matmul(const float* a, const float* b, float* c, int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n,
            bool trans_a = false, bool trans_b = false, float alpha = 1.f, float beta = 0.f);

/// One post-op of matmul_fused, applied to the matmul's result in order (oneDNN post-ops).
/// A first kBinary kAdd of dims [1, 1, N] runs as the matmul's own bias and a first kScale as its output scale (both
/// round like the separate op); kScale is only accepted first.
struct PostOp {
  enum class Kind { kBinary, kGeluErf, kScale };
  Kind kind = Kind::kBinary;
  Binary alg = Binary::kAdd;       // kBinary: dst = dst (alg) src1
  std::vector<int64_t> src1_dims;  // kBinary: [batch or 1, M or 1, N or 1]; src1 is broadcast over its 1s
  float value = 1.f;               // kScale: dst = value * dst
};

/// C[batch, M, N] = post(A B): as matmul (no transposes, alpha 1, beta 0), then every post-op in order, in one oneDNN
/// primitive. src1[i] is post[i]'s operand (row-major of its src1_dims; unused for kGeluErf). kGeluErf is
/// 0.5 x (1 + erf(x / sqrt 2)). Returns false (nothing written) when oneDNN has no implementation for that combination.
bool matmul_fused(const float* a, const float* b, float* c, int64_t a_batch, int64_t b_batch, int64_t m, int64_t k,
                  int64_t n, const std::vector<PostOp>& post, const std::vector<const float*>& src1);

/// Whether matmul_fused has an implementation for these dims and post-ops with the calling thread's OpenMP thread
/// count (creates and caches the primitive; runs nothing).
bool matmul_fused_supported(int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n,
                            const std::vector<PostOp>& post);

/// Number of oneDNN primitives created so far by this process (cache misses of the primitive cache; for tests of
/// primitive reuse).
int64_t primitives_created();
/// Number of times conv reordered weights that it then kept (calls with a `wei_owner` whose packed weights were not
/// already kept; for tests of the packed-weight cache).
int64_t packed_weight_reorders();

/// Softmax (or log-softmax) of `in` (shape dims) along `axis`.
void softmax(const float* in, float* out, const std::vector<int64_t>& dims, int axis, bool log);

/// Layer normalization of [outer, inner] rows. scale/bias (length inner) may be null; mean/var (length outer)
/// receive the statistics (variance, not inverse std) when not null.
void layer_norm(const float* in, float* out, int64_t outer, int64_t inner, const float* scale, const float* bias,
                float eps, float* mean, float* var);

/// Reduction of `in` (shape dims) into `out` (shape out_dims: same rank, 1 on reduced dims).
void reduce(Reduce op, const float* in, float* out, const std::vector<int64_t>& dims,
            const std::vector<int64_t>& out_dims);

/// Forward convolution / deconvolution (ConvTranspose) geometry, all in oneDNN's conventions: src [N,C,spatial...],
/// dst [N,OC,spatial...], wei = logical weight dims ([OC,IC,k...], or [G,OC/G,IC/G,k...] when grouped),
/// wei_strides = element strides of the caller's weight buffer for those dims (any permutation is fine),
/// dilations with 0 = dense, pad_r may be negative. 1 to 3 spatial dims.
struct ConvGeom {
  std::vector<int64_t> src, wei, wei_strides, dst;
  std::vector<int64_t> strides, dilations, pad_l, pad_r;
  bool deconv = false;
};

/// dst = conv(src, wei) + bias (bias of length OC, may be null). Plain row-major src/dst. Returns false (nothing
/// written) if oneDNN has no implementation for that geometry. oneDNN computes with the weights in a blocked layout;
/// with `wei_owner` (an owner of `wei` that never changes it while it lives), the reordered weights are kept for
/// later calls with the same weights and geometry, until the owner is gone (at most 1 GiB of them in all; past that
/// those of dead owners are dropped, then all). Without it, every call reorders.
bool conv(const ConvGeom& g, const float* src, const float* wei, const float* bias, float* dst,
          std::shared_ptr<const void> wei_owner = nullptr);

/// dst = src with its dims permuted (ONNX Transpose): dst dim i is src dim perm[i]; src and dst plain row-major.
/// A oneDNN reorder from a strided view of src, bit-exact (elements are moved as s32, f16 or s8 by elem_bytes 4, 2
/// or 1). Returns false (nothing written) for other element sizes or when oneDNN has no reorder for it.
bool transpose(const void* src, void* dst, const std::vector<int64_t>& src_dims, const std::vector<int64_t>& perm,
               int elem_bytes);

enum class Pool { kMax, kAvgInclPad, kAvgExclPad };

/// Pooling of plain row-major src [N,C,spatial...] into dst [N,C,out spatial...] (1 to 3 spatial dims); dilations
/// with 0 = dense. Returns false if oneDNN has no implementation.
bool pool(Pool op, const float* src, float* dst, const std::vector<int64_t>& src_dims,
          const std::vector<int64_t>& dst_dims, const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
          const std::vector<int64_t>& dilations, const std::vector<int64_t>& pad_l, const std::vector<int64_t>& pad_r);

}  // namespace gspmd::dnn
