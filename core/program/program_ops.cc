// core/program/program_ops.cc: names and attributes of the `gspmd` ops (program_ops.h). The op names and the
// collectives' display names appear in this file only.
#include "core/program/program_ops.h"

#include <limits>
#include <ostream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace gspmd {

std::string_view op_name(GspmdOp op) {
  switch (op) {
    case GspmdOp::kAllReduce: return "AllReduce";
    case GspmdOp::kAllGather: return "AllGather";
    case GspmdOp::kReduceScatter: return "ReduceScatter";
    case GspmdOp::kAllToAll: return "AllToAll";
    case GspmdOp::kCollectivePermute: return "CollectivePermute";
    case GspmdOp::kShardSlice: return "ShardSlice";
    case GspmdOp::kMaskPad: return "MaskPad";
    case GspmdOp::kPartitionOffset: return "PartitionOffset";
  }
  throw InternalError("op_name: invalid GspmdOp");
}

std::string_view op_name(Collective c) { return op_name(gspmd_op_of(c)); }

std::optional<GspmdOp> gspmd_op_from_name(std::string_view op_type) {
  for (GspmdOp op : kAllGspmdOps)
    if (op_name(op) == op_type) return op;
  return std::nullopt;
}

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all-reduce";
    case Collective::kAllGather: return "all-gather";
    case Collective::kReduceScatter: return "reduce-scatter";
    case Collective::kAllToAll: return "all-to-all";
    case Collective::kCollectivePermute: return "collective-permute";
  }
  throw InternalError("collective_name: invalid Collective");
}

std::optional<Collective> collective_from_name(std::string_view name) {
  for (Collective c : kAllCollectives)
    if (collective_name(c) == name) return c;
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& os, Collective c) { return os << collective_name(c); }

GspmdOp gspmd_op_of(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return GspmdOp::kAllReduce;
    case Collective::kAllGather: return GspmdOp::kAllGather;
    case Collective::kReduceScatter: return GspmdOp::kReduceScatter;
    case Collective::kAllToAll: return GspmdOp::kAllToAll;
    case Collective::kCollectivePermute: return GspmdOp::kCollectivePermute;
  }
  throw InternalError("gspmd_op_of: invalid Collective");
}

std::optional<Collective> collective_of(GspmdOp op) {
  switch (op) {
    case GspmdOp::kAllReduce: return Collective::kAllReduce;
    case GspmdOp::kAllGather: return Collective::kAllGather;
    case GspmdOp::kReduceScatter: return Collective::kReduceScatter;
    case GspmdOp::kAllToAll: return Collective::kAllToAll;
    case GspmdOp::kCollectivePermute: return Collective::kCollectivePermute;
    case GspmdOp::kShardSlice:
    case GspmdOp::kMaskPad:
    case GspmdOp::kPartitionOffset: return std::nullopt;
  }
  throw InternalError("collective_of: invalid GspmdOp");
}

bool is_collective(GspmdOp op) { return collective_of(op).has_value(); }

std::optional<GspmdOp> gspmd_op(const Node& n) {
  if (n.domain != kGspmdDomain) return std::nullopt;
  return gspmd_op_from_name(n.op_type);
}

std::optional<Collective> collective_of(const Node& n) {
  const std::optional<GspmdOp> op = gspmd_op(n);
  return op ? collective_of(*op) : std::nullopt;
}

bool is_collective(const Node& n) { return collective_of(n).has_value(); }

// ---- attributes -------------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void fail(const Node& n, const std::string& what) {
  throw InternalError(fmt::format("node '{}' ({}): {}", n.name, n.op_type, what));
}

/// Checks that `n` is the gspmd op `want`.
void expect_op(const Node& n, GspmdOp want) {
  if (gspmd_op(n) != want) fail(n, fmt::format("expected a {}.{} node", kGspmdDomain, op_name(want)));
}

int64_t required_int(const Node& n, const char* a) {
  if (!n.has(a)) fail(n, fmt::format("missing attribute '{}'", a));
  return n.i(a);
}

std::optional<int64_t> optional_int(const Node& n, const char* a) {
  if (!n.has(a)) return std::nullopt;
  return n.i(a);
}

std::vector<int> axis_list(const Node& n, const char* a) {
  std::vector<int> axes;
  for (int64_t x : n.ints(a)) {
    if (x < 0 || x > std::numeric_limits<int>::max()) fail(n, fmt::format("{} has the invalid mesh axis {}", a, x));
    axes.push_back(static_cast<int>(x));
  }
  return axes;
}

ReductionKind reduction_attr(const Node& n) {
  if (!n.has("reduction")) return ReductionKind::kSum;
  const std::string r = n.s("reduction");
  for (ReductionKind k : {ReductionKind::kSum, ReductionKind::kMax, ReductionKind::kMin, ReductionKind::kProd})
    if (reduction_name(k) == r) return k;
  fail(n, fmt::format("unknown reduction '{}' (sum, max, min, prod)", r));
}

std::vector<int64_t> ints_of(const std::vector<int>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

Node node_of(GspmdOp op, const std::vector<int>& mesh_axes) {
  Node n;
  n.op_type = op_name(op);
  n.domain = kGspmdDomain;
  n.attrs["mesh_axes"] = ints_of(mesh_axes);
  return n;
}

}  // namespace

std::vector<int> mesh_axes_attr(const Node& n) {
  if (!n.has("mesh_axes")) fail(n, "missing attribute 'mesh_axes'");
  return axis_list(n, "mesh_axes");
}

CollectiveAttrs collective_attrs(const Node& n) {
  const std::optional<Collective> c = collective_of(n);
  if (!c) fail(n, fmt::format("expected a {} collective", kGspmdDomain));
  CollectiveAttrs a;
  a.kind = *c;
  a.mesh_axes = mesh_axes_attr(n);
  switch (*c) {
    case Collective::kAllReduce: a.reduction = reduction_attr(n); break;
    case Collective::kAllGather: a.axis = required_int(n, "axis"); break;
    case Collective::kReduceScatter:
      a.axis = required_int(n, "axis");
      a.reduction = reduction_attr(n);
      break;
    case Collective::kAllToAll:
      a.split_axis = required_int(n, "split_axis");
      a.concat_axis = required_int(n, "concat_axis");
      break;
    case Collective::kCollectivePermute:
      if (!n.has("shift") && !n.has("target_axes")) fail(n, "missing attribute 'shift' or 'target_axes'");
      a.shift = n.i("shift", 0);
      a.wrap = n.i("wrap", 0) != 0;
      a.target_axes = axis_list(n, "target_axes");
      break;
  }
  return a;
}

ShardSliceAttrs shard_slice_attrs(const Node& n) {
  expect_op(n, GspmdOp::kShardSlice);
  ShardSliceAttrs a;
  a.axis = required_int(n, "axis");
  a.mesh_axes = mesh_axes_attr(n);
  a.shard_size = required_int(n, "shard_size");
  a.base = optional_int(n, "base");
  a.size = optional_int(n, "size");
  return a;
}

MaskPadAttrs mask_pad_attrs(const Node& n) {
  expect_op(n, GspmdOp::kMaskPad);
  MaskPadAttrs a;
  a.axis = required_int(n, "axis");
  a.mesh_axes = mesh_axes_attr(n);
  a.full_size = required_int(n, "full_size");
  if (!n.has("value")) fail(n, "missing attribute 'value'");
  a.value = n.f("value");
  a.base = optional_int(n, "base");
  a.step = optional_int(n, "step");
  return a;
}

PartitionOffsetAttrs partition_offset_attrs(const Node& n) {
  expect_op(n, GspmdOp::kPartitionOffset);
  PartitionOffsetAttrs a;
  a.mesh_axes = mesh_axes_attr(n);
  a.shard_size = required_int(n, "shard_size");
  return a;
}

Node gspmd_node(const CollectiveAttrs& a) {
  Node n = node_of(gspmd_op_of(a.kind), a.mesh_axes);
  switch (a.kind) {
    case Collective::kAllReduce: n.attrs["reduction"] = std::string(reduction_name(a.reduction)); break;
    case Collective::kAllGather: n.attrs["axis"] = a.axis; break;
    case Collective::kReduceScatter:
      n.attrs["axis"] = a.axis;
      n.attrs["reduction"] = std::string(reduction_name(a.reduction));
      break;
    case Collective::kAllToAll:
      n.attrs["split_axis"] = a.split_axis;
      n.attrs["concat_axis"] = a.concat_axis;
      break;
    case Collective::kCollectivePermute:
      if (a.target_axes.empty()) {
        n.attrs["shift"] = a.shift;
        if (a.wrap) n.attrs["wrap"] = int64_t{1};
      } else {
        n.attrs["target_axes"] = ints_of(a.target_axes);
      }
      break;
  }
  return n;
}

Node gspmd_node(const ShardSliceAttrs& a) {
  Node n = node_of(GspmdOp::kShardSlice, a.mesh_axes);
  n.attrs["axis"] = a.axis;
  n.attrs["shard_size"] = a.shard_size;
  if (a.base) n.attrs["base"] = *a.base;
  if (a.size) n.attrs["size"] = *a.size;
  return n;
}

Node gspmd_node(const MaskPadAttrs& a) {
  Node n = node_of(GspmdOp::kMaskPad, a.mesh_axes);
  n.attrs["axis"] = a.axis;
  n.attrs["full_size"] = a.full_size;
  n.attrs["value"] = a.value;
  if (a.base) n.attrs["base"] = *a.base;
  if (a.step) n.attrs["step"] = *a.step;
  return n;
}

Node gspmd_node(const PartitionOffsetAttrs& a) {
  Node n = node_of(GspmdOp::kPartitionOffset, a.mesh_axes);
  n.attrs["shard_size"] = a.shard_size;
  return n;
}

}  // namespace gspmd
