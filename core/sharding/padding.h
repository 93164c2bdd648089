// core/sharding/padding: which split dims of a plan are padded, and by how much (docs/cli.md, the summary's padding
// warnings). As GSPMD does (Xu et al. 2021), a dim that does not divide into its shards is padded: every shard has
// ceil(size / shards) elements, the last ones padding, masked where it could change a result (docs/partitioning.md).
// The results stay exact, but padded elements are work and memory no device needs, and a shard that holds only
// padding is a device with nothing to do. JAX refuses such shardings; DTensor shows each shard's range; we allow
// them and say so.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// One split dim whose shards are padded.
struct PaddedDim {
  int value = -1;         // value id
  int dim = -1;           // tensor dim
  int64_t size = 0;       // the dim's global size (elements)
  int64_t shards = 0;     // how many shards split it (the product of its mesh axes' sizes)
  std::vector<int> axes;  // those mesh axes (ids of the plan's mesh)
  int64_t per_shard = 0;  // ceil(size / shards): every shard's (padded) size
  /// Padding elements along the dim, over all shards: per_shard * shards - size.
  int64_t padding() const { return per_shard * shards - size; }
  /// Shards that hold only padding: shards - ceil(size / per_shard).
  int64_t empty_shards() const { return shards - (size + per_shard - 1) / per_shard; }
};

/// The padded split dims of `values` (ids of `g`) under `shardings` (one per value of `g`, on `mesh`), in the order
/// of `values` and then of dims. O(total rank of `values`).
std::vector<PaddedDim> padded_dims(const Graph& g, const std::vector<TensorSharding>& shardings, const DeviceMesh& mesh,
                                   const std::vector<int>& values);

/// padded_dims() of what the user names and provides: the graph inputs, then the initializers (weights), then the
/// graph outputs, each once. The report's "padding" list and the summary's padding warnings (docs/cli.md).
std::vector<PaddedDim> padded_interface_dims(const Graph& g, const std::vector<TensorSharding>& shardings,
                                             const DeviceMesh& mesh);

}  // namespace gspmd
