// core/sharding/padding: the padded split dims of a plan (padding.h).
#include "core/sharding/padding.h"

namespace gspmd {

std::vector<PaddedDim> padded_dims(const Graph& g, const std::vector<TensorSharding>& shardings, const DeviceMesh& mesh,
                                   const std::vector<int>& values) {
  std::vector<PaddedDim> out;
  for (int v : values) {
    const Shape& shape = g.values[static_cast<size_t>(v)].shape;
    const TensorSharding& s = shardings[static_cast<size_t>(v)];
    for (int d = 0; d < s.rank() && d < static_cast<int>(shape.size()); ++d) {
      const int64_t k = s.shards(d, mesh), n = shape[static_cast<size_t>(d)];
      if (k <= 1 || n % k == 0) continue;
      out.push_back({v, d, n, k, s.dims[static_cast<size_t>(d)], (n + k - 1) / k});
    }
  }
  return out;
}

std::vector<PaddedDim> padded_interface_dims(const Graph& g, const std::vector<TensorSharding>& shardings,
                                             const DeviceMesh& mesh) {
  std::vector<int> values;
  std::vector<char> seen(g.values.size(), 0);
  auto add = [&](int v) {
    if (v >= 0 && !seen[static_cast<size_t>(v)]) seen[static_cast<size_t>(v)] = 1, values.push_back(v);
  };
  for (int v : g.inputs) add(v);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].is_initializer) add(static_cast<int>(v));
  for (int v : g.outputs) add(v);
  return padded_dims(g, shardings, mesh, values);
}

}  // namespace gspmd
