// core/program/program_ops.h: the `gspmd` op set, the contract between the partitioner and the SPMD program's
// consumers (the cost model, the pod emulator, the MPI backend, the per-device exporter, the CLI).
//
// The SPMD program (spmd.h) is ONE graph on local (per-shard, padded) shapes that every device runs; what differs
// between devices is only the partition id, read by the ops below. They live in the ONNX domain "gspmd", version 1.
// This header is the only place that knows their names: every consumer converts a node with gspmd_op() and switches
// on the enum (without a `default:`, so -Wswitch reports a consumer that misses an op), and reads attributes through
// the typed structs below.
//
// mesh_axes = ints, mesh axis ids, major to minor; the group of a device is the set of devices that differ from it
// only along mesh_axes, ordered by DeviceMesh::tile_index ("tile" below is a device's index in its group).
//   AllReduce(x) -> y           attrs mesh_axes, optional reduction ("sum"|"max"|"min"|"prod", default "sum").
//                               y has x's shape.
//   AllGather(x) -> y           attrs mesh_axes, axis. y = concat over the group, in tile order, along axis.
//   ReduceScatter(x) -> y       attrs mesh_axes, axis, optional reduction. x.shape[axis] % n == 0; y = chunk tile of
//                               the reduction.
//   AllToAll(x) -> y            attrs mesh_axes, split_axis, concat_axis. x.shape[split_axis] % n == 0; chunk j goes
//                               to group member j; received chunks are concatenated along concat_axis in source tile
//                               order.
//   CollectivePermute(x) -> y   attrs mesh_axes and either shift or target_axes (permute_sources in reshard.h).
//                               shift: the device at tile t receives x from tile t - shift of its group; devices with
//                               no source (t - shift outside [0, n)) get zeros (halo exchange); with optional wrap = 1,
//                               from tile (t - shift) mod n (the pipeline's cyclic shift, core/ir/shift_op.h).
//                               target_axes (a permutation of mesh_axes): the device receives from the group member
//                               whose tile index over mesh_axes equals its own tile index over target_axes (a reshard
//                               that moves equal-sized shards between devices, e.g. [x,y] -> [y,x]).
//   ShardSlice(x) -> y          attrs axis, mesh_axes, shard_size, optional base (0) and size (shard_size).
//                               y = x[start : start + size] along axis with start = base + tile*shard_size; positions
//                               outside [0, x.shape[axis]) are zero (padding, or a halo window past the edge).
//   MaskPad(x) -> y             attrs axis, mesh_axes, full_size, value (float), optional base (0) and step
//                               (x.shape[axis]). Local element i has global index base + tile*step + i; elements whose
//                               global index is outside [0, full_size) are set to value (the padding of uneven shards,
//                               or the edges of a halo window, with the reduction's or the op's padding identity).
//   PartitionOffset() -> int64 scalar  attrs mesh_axes, shard_size: tile * shard_size.
// Axes (axis, split_axis, concat_axis) may be negative (counted from the end), as in ONNX.
// The per-device exporter specialises ShardSlice/MaskPad/PartitionOffset into standard ONNX for device k and adds
// replica_groups / group_size / source_target_pairs to collectives (docs/collectives.md).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string_view>
#include <vector>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// The ONNX domain of the ops below (Node::domain).
inline constexpr const char* kGspmdDomain = "gspmd";

/// The five collectives: the ops that move data between devices (a subset of GspmdOp: gspmd_op_of, collective_of).
enum class Collective : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kCollectivePermute };

/// Every op of the `gspmd` domain: the five collectives, then the three per-device ops that read the partition id
/// (computed on each device without communication).
enum class GspmdOp : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kCollectivePermute,
  kShardSlice,
  kMaskPad,
  kPartitionOffset,
};

/// Every GspmdOp / Collective, in declaration order (for tests and tables).
inline constexpr GspmdOp kAllGspmdOps[] = {GspmdOp::kAllReduce, GspmdOp::kAllGather,         GspmdOp::kReduceScatter,
                                           GspmdOp::kAllToAll,  GspmdOp::kCollectivePermute, GspmdOp::kShardSlice,
                                           GspmdOp::kMaskPad,   GspmdOp::kPartitionOffset};
inline constexpr Collective kAllCollectives[] = {Collective::kAllReduce, Collective::kAllGather,
                                                 Collective::kReduceScatter, Collective::kAllToAll,
                                                 Collective::kCollectivePermute};

/// The ONNX op type of `op` (Node::op_type in the program and in exported models): AllReduce, ShardSlice, ...
std::string_view op_name(GspmdOp op);
/// The ONNX op type of a collective: op_name(gspmd_op_of(c)).
std::string_view op_name(Collective c);
/// The op whose ONNX op type is `op_type` (case-sensitive), or nullopt for a name that is not a gspmd op.
std::optional<GspmdOp> gspmd_op_from_name(std::string_view op_type);

/// The display name of a collective in reports, explain and traces: all-reduce, all-gather, reduce-scatter,
/// all-to-all, collective-permute (an external contract: docs/cli.md).
std::string_view collective_name(Collective c);
/// The collective whose display name is `name`, or nullopt.
std::optional<Collective> collective_from_name(std::string_view name);
/// Prints collective_name(c) (gtest and stream messages).
std::ostream& operator<<(std::ostream& os, Collective c);

/// The op of a collective.
GspmdOp gspmd_op_of(Collective c);
/// The collective `op` is, or nullopt for ShardSlice, MaskPad and PartitionOffset.
std::optional<Collective> collective_of(GspmdOp op);
/// True for the five collectives.
bool is_collective(GspmdOp op);

/// The gspmd op `n` is: nullopt when n's domain is not kGspmdDomain, or when it is but the op type is unknown (a
/// consumer that runs the program reports that as an error; test n.domain to tell the two apart).
std::optional<GspmdOp> gspmd_op(const Node& n);
/// The collective `n` is, or nullopt (not a gspmd node, or a per-device gspmd op).
std::optional<Collective> collective_of(const Node& n);
/// True when `n` is one of the five gspmd collectives.
bool is_collective(const Node& n);

// ---- typed attributes ----------------------------------------------------------------------------------------
// Readers take a node of the matching op and throw InternalError naming the node ("node 'x' (AllGather): ...")
// when it is another op, a required attribute is missing, an attribute has the wrong type, or a value is invalid
// (a negative mesh axis, an unknown reduction). They do not check mesh axes against a mesh: the consumer that has
// the mesh does. Builders (gspmd_node) write exactly the attributes that are set, so a node read back gives the same
// struct and an optional attribute left unset stays absent in the program and in exported models. Every field has a
// default member initializer, so designated initializers may name only the fields an op uses.

/// The attributes of a collective node. Fields not used by `kind` are ignored (and not written).
struct CollectiveAttrs {
  Collective kind = Collective::kAllReduce;
  std::vector<int> mesh_axes = {};                // the group's mesh axes, major to minor
  ReductionKind reduction = ReductionKind::kSum;  // kAllReduce, kReduceScatter ("reduction"; absent = sum)
  int64_t axis = 0;                               // kAllGather, kReduceScatter: the tensor axis
  int64_t split_axis = 0;                         // kAllToAll: the axis cut into one chunk per member
  int64_t concat_axis = 0;                        // kAllToAll: the axis received chunks are concatenated along
  int64_t shift = 0;                              // kCollectivePermute, shift form (target_axes empty)
  bool wrap = false;                              // kCollectivePermute, shift form: cyclic ("wrap"; absent = 0)
  std::vector<int> target_axes = {};              // kCollectivePermute, relayout form: a permutation of mesh_axes
};

/// ShardSlice: y = x[start(tile) : start(tile) + length()] along `axis`, zeros outside x.
struct ShardSliceAttrs {
  int64_t axis = 0;
  std::vector<int> mesh_axes = {};
  int64_t shard_size = 0;            // elements between the starts of consecutive tiles
  std::optional<int64_t> base = {};  // start of tile 0 (absent: 0)
  std::optional<int64_t> size = {};  // elements kept (absent: shard_size)
  /// The first element of x that tile `tile` keeps (may be negative or past the end: those positions read zeros).
  int64_t start(int64_t tile) const { return base.value_or(0) + tile * shard_size; }
  /// The number of elements kept: the length of y along `axis`.
  int64_t length() const { return size.value_or(shard_size); }
};

/// MaskPad: local element i along `axis` has global index first(tile, len) + i; those outside [0, full_size) become
/// `value`.
struct MaskPadAttrs {
  int64_t axis = 0;
  std::vector<int> mesh_axes = {};
  int64_t full_size = 0;             // the global dim size
  float value = 0.f;                 // what padding elements are set to
  std::optional<int64_t> base = {};  // global index of tile 0's first element (absent: 0)
  std::optional<int64_t> step = {};  // global distance between consecutive tiles (absent: the local dim size)
  /// The global index of tile `tile`'s first local element, for an operand `local_len` long along `axis`.
  int64_t first(int64_t tile, int64_t local_len) const { return base.value_or(0) + tile * step.value_or(local_len); }
};

/// PartitionOffset: the int64 scalar tile * shard_size.
struct PartitionOffsetAttrs {
  std::vector<int> mesh_axes = {};
  int64_t shard_size = 0;
  /// The value on the device at tile `tile`.
  int64_t offset(int64_t tile) const { return tile * shard_size; }
};

/// The mesh_axes attribute of a gspmd node (required on every gspmd op).
std::vector<int> mesh_axes_attr(const Node& n);
/// Readers (see above): each throws InternalError naming the node unless `n` is that op with its required
/// attributes.
CollectiveAttrs collective_attrs(const Node& n);
ShardSliceAttrs shard_slice_attrs(const Node& n);
MaskPadAttrs mask_pad_attrs(const Node& n);
PartitionOffsetAttrs partition_offset_attrs(const Node& n);

/// Builders: a node with op_type, domain (kGspmdDomain) and attributes set from `a`; the caller sets the name,
/// inputs and outputs. Throw nothing.
Node gspmd_node(const CollectiveAttrs& a);
Node gspmd_node(const ShardSliceAttrs& a);
Node gspmd_node(const MaskPadAttrs& a);
Node gspmd_node(const PartitionOffsetAttrs& a);

}  // namespace gspmd
