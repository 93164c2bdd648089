// Shared by the mesh and sharding tests (sharding_test.cc, notation_test.cc): the 2x2 mesh and a sharding builder.
#pragma once

#include <utility>
#include <vector>

#include "core/sharding/sharding.h"

namespace gspmd::testing {

/// The mesh {data=2, model=2}, with an optional device order.
inline DeviceMesh mesh2x2(std::vector<int64_t> devices = {}) {
  return DeviceMesh{{2, 2}, {"data", "model"}, std::move(devices)};
}

/// A TensorSharding from its dims' mesh axes, unreduced axes and reduction.
inline TensorSharding ts(std::vector<std::vector<int>> dims, std::vector<int> unreduced = {},
                         ReductionKind k = ReductionKind::kSum) {
  TensorSharding s;
  s.dims = std::move(dims);
  s.unreduced = std::move(unreduced);
  s.reduction = k;
  return s;
}

}  // namespace gspmd::testing
