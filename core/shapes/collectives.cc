// Shape functions of the collectives as device files hold them (domain "gspmd", docs/collectives.md): the exported
// form, whose group_size attribute gives the group; the program's own form (mesh axes, no group_size) is typed by
// the partitioner and has none. They follow the gspmd schemas' inference (onnx_frontend/gspmd_schemas.cc), so a
// device file over data-dependent dims (docs/shapes.md step 6) loads typed.
#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

int64_t group_size(const ShapeCtx& c) {
  if (!c.node.has("group_size")) throw UnsupportedError(c.prefix() + "a collective without group_size");
  const int64_t n = c.node.i("group_size", 1);
  if (n < 1) c.fail(fmt::format("group_size {} is not positive", n));
  return n;
}

/// AllReduce, CollectivePermute: y has x's type.
std::vector<TensorType> same_types(const ShapeCtx& c) {
  group_size(c);
  return {c.type(0)};
}

/// AllGather: x's dim `axis` times the group; ReduceScatter: divided by it (it must divide).
std::vector<TensorType> gather_scatter_types(const ShapeCtx& c) {
  const int64_t n = group_size(c);
  TensorType y = c.type(0);
  int64_t& d = y.shape.at(static_cast<size_t>(c.axis(c.node.i("axis", 0), c.rank(0))));
  if (c.node.op_type == "AllGather") {
    d *= n;
  } else {
    if (d % n != 0) c.fail(fmt::format("dim {} is not divisible by group_size {}", d, n));
    d /= n;
  }
  return {y};
}

/// AllToAll: split_axis divided by the group, concat_axis multiplied by it.
std::vector<TensorType> all_to_all_types(const ShapeCtx& c) {
  const int64_t n = group_size(c);
  TensorType y = c.type(0);
  int64_t& s = y.shape.at(static_cast<size_t>(c.axis(c.node.i("split_axis", 0), c.rank(0))));
  if (s % n != 0) c.fail(fmt::format("split dim {} is not divisible by group_size {}", s, n));
  s /= n;
  y.shape.at(static_cast<size_t>(c.axis(c.node.i("concat_axis", 0), c.rank(0)))) *= n;
  return {y};
}

}  // namespace

void register_collective_shapes(ShapeTable& t) {
  t["gspmd:AllReduce"] = same_types;
  t["gspmd:CollectivePermute"] = same_types;
  t["gspmd:AllGather"] = gather_scatter_types;
  t["gspmd:ReduceScatter"] = gather_scatter_types;
  t["gspmd:AllToAll"] = all_to_all_types;
}

}  // namespace gspmd::shapes
