// core/sharding: the device mesh and tensor shardings (GSPMD paper §3.1; Shardy's named-axis shardings;
// OneFlow SBP's split / broadcast / partial).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// The most devices a mesh may have (docs/cli.md#limits): 2^20, far above any pod (the GSPMD paper's largest runs use
/// 2,048 TPU v3 cores); `simulate` and `--auto` cost a mesh of this size in about the time of 4 devices.
inline constexpr int64_t kMaxDevices = int64_t{1} << 20;
/// The product of `sizes` when every size is >= 1 and the product is at most kMaxDevices, else nullopt (it never
/// overflows, whatever the sizes).
std::optional<int64_t> device_count(const std::vector<int64_t>& sizes);

/// A logical N-D mesh of devices with named axes (docs/sharding-file.md). Devices are numbered 0..N-1; by default
/// device k sits at the mesh position with row-major index k (coordinate unravel(k, shape)). `devices` gives another
/// order, like the device array of jax.sharding.Mesh or Shardy's device_ids: the device id at each mesh position,
/// row-major over `shape`. Every function below that maps devices to coordinates (coords, tile_index,
/// replica_groups, TensorSharding::to_hlo, shard_tensor) follows it.
struct DeviceMesh {
  std::vector<int64_t> shape;     // size of each mesh axis, each >= 1
  std::vector<std::string> axes;  // unique axis names, same length as shape
  /// devices[p] = id of the device at row-major mesh position p, a permutation of 0..N-1; empty = the identity
  /// (0, 1, ..., N-1). A refined mesh keeps its user mesh's order (refining splits axes row-major).
  std::vector<int64_t> devices = {};

  /// Sub-axes (Shardy's "x:(pre)size"). A refined mesh splits some of the user's axes into consecutive parts so
  /// that a reshape can give each part of a merged dim its own part of an axis ([8] over x=4 -> [2,4] over
  /// x:(1)2 and x:(2)2). Devices keep their numbers: the parts of x, major to minor, index exactly as x did.
  struct SubAxis {
    int parent = -1;  // the user's axis this one is a part of
    int64_t pre = 1;  // product of the sizes of the parent's more major parts
  };
  std::vector<SubAxis> sub = {};         // per axis of a refined mesh; empty for a mesh as the user gave it
  std::vector<int64_t> user_shape = {};  // the user's mesh (refined meshes only)
  std::vector<std::string> user_axes = {};

  /// Parses "4x4", "16", "2x2x4"; axes are named x, y, z, w, then a4, a5, ...
  /// Throws InputError("--mesh: 'abc' is not a mesh shape like 4x4") on bad text or a zero/negative size.
  static DeviceMesh parse(std::string_view text);
  int64_t num_devices() const;
  int rank() const { return static_cast<int>(shape.size()); }
  /// Index of a named axis, or -1.
  int axis_index(std::string_view name) const;
  /// Id of the device at row-major mesh position `pos` (0 <= pos < num_devices()): devices[pos], or pos.
  int64_t device_at(int64_t pos) const;
  /// Row-major mesh position of `device` (the inverse of device_at). O(N) when `devices` is given, O(1) otherwise.
  /// Throws std::out_of_range for a device not on the mesh.
  int64_t position_of(int64_t device) const;
  /// Mesh coordinate of device k (0 <= k < num_devices()): unravel(position_of(k), shape).
  std::vector<int64_t> coords(int64_t device) const;
  /// Checks `devices`: empty, or a permutation of 0..N-1. Throws std::invalid_argument with the problem ("has 3
  /// entries but the mesh {data=2, model=2} has 4 devices", "entry 2 is 7, not a device id 0..3", "device 1 appears
  /// twice").
  void check_devices() const;
  /// True when `devices` is given and differs from the identity.
  bool has_device_order() const;
  /// Product of the sizes of `mesh_axes` (1 for none).
  int64_t axes_size(const std::vector<int>& mesh_axes) const;
  /// The tile index of `device` along `mesh_axes`, major to minor: index_a * size_b + index_b.
  int64_t tile_index(int64_t device, const std::vector<int>& mesh_axes) const;
  /// Replica groups for a collective over `mesh_axes`: one group per coordinate of the other axes, each group
  /// listing its devices ordered by tile_index over `mesh_axes` (as XLA's replica_groups / iota groups).
  /// Groups are ordered by their smallest device. Cost O(N) (O(N log N) with a device order).
  std::vector<std::vector<int64_t>> replica_groups(const std::vector<int>& mesh_axes) const;
  /// "{x=2, y=2}" (a refined mesh prints the user's axes).
  std::string str() const;

  /// The user's mesh refined at `cuts`: cuts[u] holds positions 1 < c < size of user axis u where a part ends (its
  /// `pre` values); each part is named "x:(pre)size". Cuts that do not divide the axis, and existing refinement,
  /// are handled: the result is built from the user's mesh, with the union of `cuts` and this mesh's own cuts.
  /// Throws std::invalid_argument when a cut is not a divisor of the axis size or two cuts do not nest.
  DeviceMesh refine(const std::vector<std::vector<int64_t>>& cuts) const;
  /// This mesh's cut points per user axis (empty lists when not refined).
  std::vector<std::vector<int64_t>> cuts() const;
  /// The user's mesh (this mesh when it is not refined).
  DeviceMesh user() const;
  /// Axes of this mesh covering positions [lo, hi) of user axis u (lo = pre, hi = pre * size of a sub-axis; a
  /// whole axis is [1, size)). Throws std::invalid_argument when the range does not fall on this mesh's cuts.
  std::vector<int> parts_between(int u, int64_t lo, int64_t hi) const;
  bool is_refined() const { return !sub.empty(); }
  /// The user axis that axis a belongs to (a itself on a mesh that is not refined).
  int user_axis(int a) const { return sub.empty() ? a : sub.at(a).parent; }
  /// The axes of this mesh that make up user axis u, major to minor.
  std::vector<int> parts_of(int u) const;
  /// Display names of `mesh_axes`: complete runs of a user axis' parts, in order, print as the user axis ("x");
  /// other parts keep their sub-axis names ("x:(1)2").
  std::vector<std::string> axis_names(const std::vector<int>& mesh_axes) const;
};

/// A sub-axis name "x:(pre)size" (Shardy's notation, DeviceMesh::SubAxis): the parent axis' name, pre and size.
struct SubAxisName {
  std::string parent;
  int64_t pre = 1;
  int64_t size = 1;
};
/// The parts of `name` when it reads "<parent>:(<pre>)<size>" with a non-empty parent and 1 to 12 digits each; else
/// nullopt. Linear in the name, without recursion (any length of user text).
std::optional<SubAxisName> parse_sub_axis_name(std::string_view name);

/// How a partial (unreduced) value combines across devices.
enum class ReductionKind { kSum, kMax, kMin, kProd };
std::string_view reduction_name(ReductionKind k);  // "sum", "max", "min", "prod"

/// The sharding of one tensor over a mesh: for each tensor dim, the mesh axes that split it (major to minor);
/// axes not used by any dim are replicated, except `unreduced` axes, over which the tensor holds a partial
/// result still to be combined with `reduction` (DTensor Partial, SBP P).
///
/// Uneven dims are normal: a dim of size d split over axes with product T has shards of ceil(d/T) elements;
/// tile t holds global elements [t*s, min(d, (t+1)*s)) and its tail is padding (GSPMD §3.3).
struct TensorSharding {
  std::vector<std::vector<int>> dims;  // dims[i] = mesh axis ids splitting tensor dim i
  std::vector<int> unreduced;          // sorted mesh axis ids
  ReductionKind reduction = ReductionKind::kSum;

  /// Fully replicated sharding of a rank-r tensor.
  static TensorSharding replicated(int rank);
  int rank() const { return static_cast<int>(dims.size()); }
  bool is_replicated() const;  // no dim split and nothing unreduced
  bool is_tiled() const;       // some dim split
  /// All mesh axes used by dims (not unreduced), in dim order.
  std::vector<int> tiled_axes() const;
  /// Number of shards of dim i (product of its axes' sizes).
  int64_t shards(int dim, const DeviceMesh& mesh) const;
  /// Per-device (padded) shape: ceil(global[i] / shards(i)).
  Shape local_shape(const Shape& global, const DeviceMesh& mesh) const;
  /// Global offset of `device`'s shard along dim i (tile_index * shard size).
  int64_t offset(int dim, const Shape& global, const DeviceMesh& mesh, int64_t device) const;
  /// Number of real (non-padding) elements of `device`'s shard along dim i: clamp(d - offset, 0, shard).
  int64_t valid(int dim, const Shape& global, const DeviceMesh& mesh, int64_t device) const;
  /// True when some dim has padding on some device (d % shards != 0).
  bool is_uneven(const Shape& global, const DeviceMesh& mesh) const;
  bool operator==(const TensorSharding& o) const = default;

  /// Checks rank, axis ids in range, each axis used at most once across dims and unreduced.
  /// Throws std::invalid_argument with the problem ("axis 'x' is used twice").
  void verify(const DeviceMesh& mesh, int tensor_rank) const;

  /// PartitionSpec notation: ["data", null, ["x", "y"]] (+ " unreduced={data}" when partial). Valid JSON for the spec.
  std::string to_partition_spec(const DeviceMesh& mesh) const;
  /// GSPMD / HLO notation: "{replicated}" or "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}". HLO has no
  /// partial sharding; unreduced axes get their own trailing tile dim: "{devices=[2,1,2]0,2,1,3
  /// last_tile_dims={unreduced}}" (with both: "last_tile_dims={unreduced, replicated}"). The device ids follow the
  /// mesh's device order. `iota`: XLA's compact form for a mesh without a device order, the mesh positions
  /// transposed into tile order ("{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}").
  std::string to_hlo(const DeviceMesh& mesh, bool iota = false) const;
  /// SBP notation, one entry per mesh axis: "(S(0), B)"; P for unreduced (P(max) etc. for non-sum).
  std::string to_sbp(const DeviceMesh& mesh) const;
};

/// A sharding read from a notation (docs/sharding-file.md) together with the mesh its axis ids refer to.
struct ParsedSharding {
  TensorSharding sharding;  // on `mesh`
  DeviceMesh mesh;          // the given mesh's user mesh, refined by the sub-axes the sharding needs (if any)
  bool any_rank = false;    // "{replicated}": replicated at whatever rank the tensor has (`sharding` has rank 0)
};

/// Reads XLA's HLO sharding text (core/sharding/notation.cc, docs/sharding-file.md): "{replicated}", or
/// "{devices=[t0,t1,...]<ids>}" with an explicit device list or XLA's iota form "<=[8]" / "<=[2,4]T(1,0)" (iota over
/// the reshape dims, transposed by T, reshaped to the tile dims), optionally "last_tile_dim_replicate" or
/// "last_tile_dims={replicated, unreduced, ...}" (trailing tile dims that replicate, or hold partial values: they
/// become `unreduced` axes with reduction sum); "metadata={...}" is ignored. The tile assignment is read against
/// `mesh`'s device order: the result is the named-axis sharding (which axes split which dim, major to minor, which
/// are unreduced) whose device assignment equals the given one, using sub-axes "x:(pre)size" where a dim takes part
/// of an axis. The tensor's rank is the number of tile dims minus the trailing ones.
/// Throws std::invalid_argument with a one-line problem: malformed text, "{maximal device=N}" and "{manual}" (not
/// supported), a tile assignment over another device count, or one no named-axis sharding of the mesh can express
/// ("... cannot be expressed on mesh {data=2, model=2}: ...").
ParsedSharding sharding_from_hlo(std::string_view text, const DeviceMesh& mesh);

/// Reads OneFlow's nd-SBP: one entry per axis of the (user) mesh, in mesh-axis order: "S(d)" splits tensor dim d
/// over that axis, "B" broadcasts (replicated), "P" holds partial sums ("P(max)", "P(min)", "P(prod)", "P(sum)": the
/// reduction, the same for every P). Several axes splitting one dim are major to minor in mesh-axis order. The result
/// is on `mesh` (a refined mesh gives each axis all its parts) and has the smallest rank its splits need (1 + the
/// largest d; 0 without S): pad it with unsplit dims to the tensor's rank. Throws std::invalid_argument
/// ("has 3 entries but the mesh has 2 axes (data, model)", "entry 1 is \"Q\"; expected S(dim), B, P or ...", ...).
TensorSharding sharding_from_sbp(const std::vector<std::string>& sbp, const DeviceMesh& mesh);

/// The same sharding expressed on `to`, a refinement (or the user's mesh) of `from`'s user mesh: every axis becomes
/// the axes of `to` that cover it. Throws std::invalid_argument when `to` is coarser than an axis used.
TensorSharding remap(const TensorSharding& s, const DeviceMesh& from, const DeviceMesh& to);

/// Slices `device`'s shard out of a full (global) tensor, zero-padding the tail of uneven shards.
/// `full.shape` must have rank == sharding.rank(). Unreduced axes: the device at tile 0 of the unreduced axes holds
/// the full value, the others hold the reduction identity (0 for sum), so that reducing gives the value back.
Tensor shard_tensor(const Tensor& full, const TensorSharding& sharding, const DeviceMesh& mesh, int64_t device);

/// Inverse of shard_tensor: assembles the global tensor of `global_shape` from every device's local shard
/// (shards.size() == mesh.num_devices()), dropping padding and combining unreduced axes with the reduction.
Tensor assemble_tensor(const std::vector<const Tensor*>& shards, const TensorSharding& sharding, const DeviceMesh& mesh,
                       const Shape& global_shape);

}  // namespace gspmd
