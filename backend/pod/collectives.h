// backend/pod: in-process implementations of the `gspmd` ops (semantics in core/program/program_ops.h), on plain
// tensors.
// Collectives take the operands of one replica group in tile order and return one result per member, in the same
// order. Data movement is dtype-agnostic (byte blocks); reductions support float32, float64, int8..int64, uint8..uint64
// and bool (sum/max = or, min/prod = and); other dtypes throw UnsupportedError.
// All functions throw InternalError on operands that violate the op's contract (shape mismatch, bad axis).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd::pod {

/// Every member gets the elementwise reduction of all operands (reduced in tile order, so all members agree bitwise).
/// `acc` (optional) is *ins[0] itself, given up by the caller: the reduction accumulates in its buffer, which becomes
/// member 0's result, instead of in a copy.
std::vector<Tensor> all_reduce(const std::vector<const Tensor*>& ins, ReductionKind k, Tensor* acc = nullptr);
/// Every member gets the operands concatenated along `axis` in tile order.
/// `axis` of a rank-`rank` tensor made non-negative (ONNX negative axes count from the end). Throws
/// InternalError("<what> <axis> out of range for rank <rank>") outside [-rank, rank).
int64_t norm_axis(int64_t axis, size_t rank, const char* what);

std::vector<Tensor> all_gather(const std::vector<const Tensor*>& ins, int64_t axis);
/// Member t gets chunk t (along `axis`, shape[axis] / n long) of the reduction. shape[axis] % n must be 0.
/// `acc` as for all_reduce.
std::vector<Tensor> reduce_scatter(const std::vector<const Tensor*>& ins, int64_t axis, ReductionKind k,
                                   Tensor* acc = nullptr);
/// Member j gets chunk j (along split_axis) of every operand, concatenated along concat_axis in source tile order.
std::vector<Tensor> all_to_all(const std::vector<const Tensor*>& ins, int64_t split_axis, int64_t concat_axis);
/// Member t gets operand sources[t], or zeros where sources[t] is -1 (sources from permute_sources, reshard.h).
std::vector<Tensor> collective_permute(const std::vector<const Tensor*>& ins, const std::vector<int64_t>& sources);

/// x[start : start + size] along axis; positions outside [0, x.shape[axis]) are zero (start may be negative).
Tensor shard_slice(const Tensor& x, int64_t axis, int64_t start, int64_t size);
/// Local element i along axis has global index first_global + i; elements whose global index is outside
/// [0, full_size) are set to `value` (cast to x's dtype; +-inf saturate for integers), in place.
void mask_pad(Tensor& x, int64_t axis, int64_t first_global, int64_t full_size, float value);

/// Splits x along `axis` into n equal chunks (x.shape[axis] divisible by n) and lays them out one after another,
/// chunk j at byte j * x.nbytes() / n: the send buffer of an all-to-all or reduce-scatter over n members (MPI).
std::vector<std::byte> pack_chunks(const Tensor& x, int64_t axis, int64_t n);
/// The inverse: `buf` holds n chunks one after another; chunk j goes to [j * len, (j+1) * len) along `axis` of `y`
/// (len = y.shape[axis] / n).
void unpack_chunks(const std::vector<std::byte>& buf, Tensor& y, int64_t axis, int64_t n);

/// Copies `len` slices along `axis` from src[src_start...] to dst[dst_start...]; src and dst must agree on every dim
/// but `axis` and on dtype.
void copy_along_axis(const Tensor& src, int64_t axis, int64_t src_start, Tensor& dst, int64_t dst_start, int64_t len);

}  // namespace gspmd::pod
