// The partitioner's constraints (docs/partitioning.md, "Annotations are constraints"): an annotated value has exactly
// its annotated sharding in the program. Its producer's result is resharded to it (constrain_results); a whole value
// annotated partial becomes partial locally (make_partial, first_tile_only). Annotated weights are held sharded by
// get() in partition.cc.
#include <algorithm>

#include <fmt/format.h>

#include "core/partition/partitioner.h"

namespace gspmd::partition_internal {

int Partitioner::make_partial(int gv, int x, const TensorSharding& cur, const TensorSharding& want,
                              const std::vector<int>& extra, const std::string& for_node, const std::string& why,
                              TensorSharding& partial) {
  const Value& v = g_.values[gv];
  if (!cur.unreduced.empty() && cur.reduction != want.reduction)
    throw InternalError(fmt::format("'{}' is unreduced ({}) and cannot be made unreduced ({}) too", v.name,
                                    reduction_name(cur.reduction), reduction_name(want.reduction)));
  partial = cur;  // first gather the axes out of the dims they split
  for (auto& axes : partial.dims) std::erase_if(axes, [&](int a) { return contains(extra, a); });
  if (!(partial == cur)) x = reshard(gv, x, cur, partial, for_node, why);
  // Whole over `extra`: every device holds the value. A max or min of copies is the value; a sum or product keeps
  // it on the first tile of `extra` and the identity elsewhere.
  if (want.reduction == ReductionKind::kSum || want.reduction == ReductionKind::kProd)
    x = first_tile_only(x, extra, reduction_identity(want.reduction), v.name);
  partial.unreduced.insert(partial.unreduced.end(), extra.begin(), extra.end());
  std::sort(partial.unreduced.begin(), partial.unreduced.end());
  partial.reduction = want.reduction;
  return x;
}

bool Partitioner::constrained(int gv) const {
  return static_cast<size_t>(gv) < plan_.origins.size() && plan_.origins[gv].constrained();
}

TensorSharding Partitioner::constraint(int gv) const {
  TensorSharding s = plan_.shardings[gv];
  if (s.unreduced.empty()) s.reduction = ReductionKind::kSum;
  return s;
}

void Partitioner::constrain_results(int n) {
  const Node& node = g_.nodes[n];
  for (int gv : node.outputs) {
    if (gv < 0 || !constrained(gv) || avail_[gv].empty()) continue;
    const TensorSharding want = constraint(gv);
    if (avail_[gv].front().sharding == want) continue;
    const Value& v = g_.values[gv];
    const std::string spec = want.to_partition_spec(mesh_);
    int lv = -1;
    try {
      lv = get(gv, want, node.name,
               fmt::format("'{}' is annotated {} ({}): a sharding constraint", v.name, spec, plan_.origins[gv].source));
    } catch (const std::logic_error& e) {
      throw InputError(fmt::format("{}: '{}' cannot have its annotated sharding {}: {}", plan_.origins[gv].source,
                                   v.name, spec, e.what()));
    }
    // The constrained representation becomes the value's primary one: its consumers reshard from it.
    auto it = std::find_if(avail_[gv].begin(), avail_[gv].end(), [&](const Local& l) { return l.id == lv; });
    std::rotate(avail_[gv].begin(), it, it + 1);
    out_.final_shardings[gv] = want;
  }
}

int Partitioner::first_tile_only(int x, const std::vector<int>& axes, float identity, const std::string& name) {
  const DType dt = P().values[x].dtype;
  const Shape shape = P().values[x].shape;
  if (shape.empty()) {  // a scalar: mask it as a [1]
    const int one = emit("Reshape", {x, int64_const("shape", {1})}, name + "/first_tile", dt, {1});
    return emit("Reshape", {first_tile_only(one, axes, identity, name), int64_const("shape", {})}, name, dt, {});
  }
  const int64_t rows = shape[0];
  return emit(gspmd_node(MaskPadAttrs{
                  .axis = 0, .mesh_axes = axes, .full_size = rows, .value = identity, .base = 0, .step = rows}),
              {x}, name + "/first_tile", dt, shape);
}

}  // namespace gspmd::partition_internal
