// The `gspmd` domain's schemas for onnx's registry (gspmd_schemas.h). Semantics: core/program/program_ops.h;
// exported attributes: docs/collectives.md. tools/gspmd_onnx_schemas.py mirrors every check and message here.
#include "onnx_frontend/gspmd_schemas.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/defs/shape_inference.h>
#include <onnx/shape_inference/implementation.h>

#include "core/program/program_ops.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd {
namespace {

using onnx::AttributeProto;
using onnx::InferenceContext;
using onnx::OpSchema;
using onnx::TensorShapeProto;

std::optional<int64_t> int_attr(const InferenceContext& ctx, const char* name) {
  const AttributeProto* a = ctx.getAttribute(name);
  if (!a) return std::nullopt;
  return a->i();
}

std::vector<int64_t> ints_attr(const InferenceContext& ctx, const char* name) {
  const AttributeProto* a = ctx.getAttribute(name);
  if (!a) return {};
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::string list_str(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ",")); }

/// `name`, a list of mesh axis ids: non-negative and distinct (program_ops.h). `empty_ok` for target_axes' absence.
std::vector<int64_t> check_mesh_axes(const InferenceContext& ctx, const char* name) {
  std::vector<int64_t> axes = ints_attr(ctx, name);
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    if (a < 0) fail_shape_inference(name, " has the negative mesh axis ", a);
    if (!seen.insert(a).second) fail_shape_inference(name, " lists mesh axis ", a, " twice");
  }
  return axes;
}

/// The exported group description (docs/collectives.md): group_size >= 1 and replica_groups a partition of the
/// devices 0..N-1 into groups of group_size. Returns group_size, or nullopt in the program's form (no attribute).
std::optional<int64_t> check_groups(const InferenceContext& ctx) {
  if (check_mesh_axes(ctx, "mesh_axes").empty()) fail_shape_inference("mesh_axes is empty");
  const std::optional<int64_t> n = int_attr(ctx, "group_size");
  if (n && *n < 1) fail_shape_inference("group_size ", *n, " is not positive");
  if (!ctx.getAttribute("replica_groups")) return n;
  const std::vector<int64_t> groups = ints_attr(ctx, "replica_groups");
  if (!n) fail_shape_inference("replica_groups is given without group_size");
  if (groups.empty() || groups.size() % static_cast<size_t>(*n) != 0)
    fail_shape_inference("replica_groups has ", groups.size(), " entries, not a positive multiple of group_size ", *n);
  std::vector<char> seen(groups.size(), 0);
  for (int64_t d : groups) {
    if (d < 0 || d >= static_cast<int64_t>(groups.size()))
      fail_shape_inference("replica_groups lists device ", d, " but there are ", groups.size(), " devices");
    if (seen[static_cast<size_t>(d)]++) fail_shape_inference("replica_groups lists device ", d, " twice");
  }
  return n;
}

void check_reduction(const InferenceContext& ctx) {
  const AttributeProto* a = ctx.getAttribute("reduction");
  if (!a) return;
  for (ReductionKind k : {ReductionKind::kSum, ReductionKind::kMax, ReductionKind::kMin, ReductionKind::kProd})
    if (a->s() == reduction_name(k)) return;
  fail_shape_inference("reduction '", a->s(), "' is not sum, max, min or prod");
}

/// `axis` normalised against `rank` (ONNX's negative axes), or fail naming the attribute.
int normalized_axis(const char* name, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) fail_shape_inference(name, " ", axis, " is out of range for rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

/// y's shape: x's with dim `axis` changed by `f` (dims without a value stay unknown).
struct OutputShape {
  InferenceContext& ctx;
  TensorShapeProto shape;
  bool known = false;
  explicit OutputShape(InferenceContext& c) : ctx(c) {
    if (!onnx::hasInputShape(ctx, 0)) return;
    shape = onnx::getInputShape(ctx, 0);
    known = true;
  }
  int rank() const { return shape.dim_size(); }
  int axis(const char* name) {
    const std::optional<int64_t> a = int_attr(ctx, name);
    return normalized_axis(name, a.value_or(0), rank());
  }
  void multiply(int axis, std::optional<int64_t> n) {
    auto* d = shape.mutable_dim(axis);
    if (d->has_dim_value() && n)
      d->set_dim_value(d->dim_value() * *n);
    else
      d->Clear();
  }
  void divide(int axis, std::optional<int64_t> n) {
    auto* d = shape.mutable_dim(axis);
    if (!d->has_dim_value() || !n) {
      d->Clear();
      return;
    }
    if (d->dim_value() % *n != 0)
      fail_shape_inference("dim ", axis, " of the input (", d->dim_value(), ") is not divisible by group_size ", *n);
    d->set_dim_value(d->dim_value() / *n);
  }
  void set(int axis, int64_t v) { shape.mutable_dim(axis)->set_dim_value(v); }
  void write() {
    if (known) *ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape() = shape;
  }
};

void infer(InferenceContext& ctx, GspmdOp op) {
  if (op == GspmdOp::kPartitionOffset) {
    check_mesh_axes(ctx, "mesh_axes");
    onnx::updateOutputElemType(ctx, 0, onnx::TensorProto::INT64);
    ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape()->clear_dim();  // a scalar
    return;
  }
  onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
  std::optional<int64_t> n;
  if (is_collective(op))
    n = check_groups(ctx);
  else
    check_mesh_axes(ctx, "mesh_axes");
  OutputShape y(ctx);
  switch (op) {
    case GspmdOp::kAllReduce: check_reduction(ctx); break;
    case GspmdOp::kAllGather:
      if (y.known) y.multiply(y.axis("axis"), n);
      break;
    case GspmdOp::kReduceScatter:
      check_reduction(ctx);
      if (y.known) y.divide(y.axis("axis"), n);
      break;
    case GspmdOp::kAllToAll:
      if (y.known) {
        const int split = y.axis("split_axis"), concat = y.axis("concat_axis");
        y.divide(split, n);
        y.multiply(concat, n);
      }
      break;
    case GspmdOp::kCollectivePermute: {
      const bool shift = ctx.getAttribute("shift"), target = ctx.getAttribute("target_axes");
      if (shift == target) fail_shape_inference("needs exactly one of 'shift' and 'target_axes'");
      if (target) {
        std::vector<int64_t> t = check_mesh_axes(ctx, "target_axes"), m = ints_attr(ctx, "mesh_axes");
        const std::vector<int64_t> given = t;
        std::sort(t.begin(), t.end());
        std::sort(m.begin(), m.end());
        if (t != m)
          fail_shape_inference("target_axes ", list_str(given), " is not a permutation of mesh_axes ",
                               list_str(ints_attr(ctx, "mesh_axes")));
      }
      if (ints_attr(ctx, "source_target_pairs").size() % 2 != 0)
        fail_shape_inference("source_target_pairs has an odd number of entries (",
                             ints_attr(ctx, "source_target_pairs").size(), ")");
      break;
    }
    case GspmdOp::kShardSlice: {
      const int64_t shard = int_attr(ctx, "shard_size").value_or(0);
      const int64_t size = int_attr(ctx, "size").value_or(shard);
      if (shard < 0) fail_shape_inference("shard_size ", shard, " is negative");
      if (size < 0) fail_shape_inference("size ", size, " is negative");
      if (y.known) y.set(y.axis("axis"), size);
      break;
    }
    case GspmdOp::kMaskPad:
      if (y.known) y.axis("axis");
      break;
    case GspmdOp::kPartitionOffset: break;
  }
  y.write();
}

const char* doc(GspmdOp op) {
  switch (op) {
    case GspmdOp::kAllReduce: return "y = the reduction of x over the group; same shape.";
    case GspmdOp::kAllGather:
      return "y = concat of the group's x along axis in tile order; y.shape[axis] = group_size * x.shape[axis].";
    case GspmdOp::kReduceScatter:
      return "y = chunk (tile) of the reduction of x over the group along axis; y.shape[axis] = x.shape[axis] / "
             "group_size.";
    case GspmdOp::kAllToAll:
      return "x is cut into group_size chunks along split_axis, chunk j goes to member j; received chunks are "
             "concatenated along concat_axis in source tile order.";
    case GspmdOp::kCollectivePermute:
      return "Each device receives x from one group member (shift: tile t - shift, zeros when outside the group; "
             "target_axes: the member whose tile over mesh_axes is its tile over target_axes); same shape.";
    case GspmdOp::kShardSlice:
      return "y = x[base + tile*shard_size : + size] along axis, zeros outside x; y.shape[axis] = size "
             "(default shard_size).";
    case GspmdOp::kMaskPad:
      return "Elements whose global index (base + tile*step + i) is outside [0, full_size) along axis become "
             "value; same shape.";
    case GspmdOp::kPartitionOffset: return "The int64 scalar tile * shard_size.";
  }
  return "";
}

OpSchema schema_of(GspmdOp op) {
  const std::string name(op_name(op));
  OpSchema s(name, __FILE__, __LINE__);
  s.SetDomain(kGspmdDomain)
      .SinceVersion(1)
      .SetDoc(fmt::format("{} (core/program/program_ops.h, docs/collectives.md): {}", name, doc(op)));
  s.Attr("mesh_axes", "mesh axis ids the op's group spans, major to minor", AttributeProto::INTS, true);
  auto optional = [&](const char* a, const char* what, AttributeProto::AttributeType t) {
    s.Attr(a, what, t, onnx::OPTIONAL_VALUE);
  };
  auto required = [&](const char* a, const char* what, AttributeProto::AttributeType t) { s.Attr(a, what, t, true); };
  if (is_collective(op)) {
    optional("replica_groups", "every group's device ids, flattened (exported form)", AttributeProto::INTS);
    optional("group_size", "devices per group (exported form)", AttributeProto::INT);
  }
  switch (op) {
    case GspmdOp::kAllReduce:
      s.Attr("reduction", "sum, max, min or prod", AttributeProto::STRING, std::string("sum"));
      break;
    case GspmdOp::kAllGather: required("axis", "the gathered axis", AttributeProto::INT); break;
    case GspmdOp::kReduceScatter:
      required("axis", "the scattered axis", AttributeProto::INT);
      s.Attr("reduction", "sum, max, min or prod", AttributeProto::STRING, std::string("sum"));
      break;
    case GspmdOp::kAllToAll:
      required("split_axis", "the axis cut into one chunk per member", AttributeProto::INT);
      required("concat_axis", "the axis received chunks are concatenated along", AttributeProto::INT);
      break;
    case GspmdOp::kCollectivePermute:
      optional("shift", "tile t receives from tile t - shift", AttributeProto::INT);
      optional("wrap", "1: tile t receives from tile (t - shift) mod n (cyclic)", AttributeProto::INT);
      optional("target_axes", "a permutation of mesh_axes (relayout)", AttributeProto::INTS);
      optional("source_target_pairs", "[src, dst, ...] device ids, all groups (exported form)", AttributeProto::INTS);
      break;
    case GspmdOp::kShardSlice:
      required("axis", "the sliced axis", AttributeProto::INT);
      required("shard_size", "elements between consecutive tiles' starts", AttributeProto::INT);
      optional("base", "start of tile 0 (default 0)", AttributeProto::INT);
      optional("size", "elements kept (default shard_size)", AttributeProto::INT);
      break;
    case GspmdOp::kMaskPad:
      required("axis", "the masked axis", AttributeProto::INT);
      required("full_size", "the global dim size", AttributeProto::INT);
      required("value", "what padding elements become", AttributeProto::FLOAT);
      optional("base", "global index of tile 0's first element (default 0)", AttributeProto::INT);
      optional("step", "global distance between tiles (default the local dim)", AttributeProto::INT);
      break;
    case GspmdOp::kPartitionOffset: required("shard_size", "the offset of tile 1", AttributeProto::INT); break;
  }
  if (op == GspmdOp::kPartitionOffset) {
    s.Output(0, "y", "int64 scalar", "tensor(int64)");
  } else {
    s.Input(0, "x", "the local operand", "T");
    s.Output(0, "y", "the local result", "T");
    s.TypeConstraint("T", OpSchema::all_tensor_types_with_bfloat(), "any tensor type; y has x's");
  }
  s.TypeAndShapeInferenceFunction([op](InferenceContext& ctx) { infer(ctx, op); });
  return s;
}

/// onnx's messages span lines ("...\n\n==> Context: ..."): one line, single spaces.
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool space = c == '\n' || c == '\r' || c == ' ' || c == '\t';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

void register_gspmd_schemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance();
    if (!ranges.Map().count(kGspmdDomain)) ranges.AddDomainToVersion(kGspmdDomain, 1, 1);
    for (GspmdOp op : kAllGspmdOps)
      if (!onnx::OpSchemaRegistry::Schema(std::string(op_name(op)), 1, kGspmdDomain))
        onnx::RegisterSchema(schema_of(op));
  });
}

namespace frontend {

void validate_model(onnx::ModelProto& m, const std::string& what) {
  register_gspmd_schemas();
  try {
    // The checker passes a node of a domain other than ai.onnx it has no schema for; in `gspmd` that is a fault.
    for (const auto& n : m.graph().node())
      if (n.domain() == kGspmdDomain && !gspmd_op_from_name(n.op_type()))
        throw InputError(fmt::format(
            "No Op registered for {} with domain_version of 1 ==> Context: Bad node spec for node. Name: {} OpType: {}",
            n.op_type(), n.name(), n.op_type()));
    onnx::checker::check_model(m);
    const onnx::ShapeInferenceOptions options(/*check_type=*/true, /*strict_mode=*/1, /*data_prop=*/true);
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), options);
  } catch (const std::exception& e) {
    throw InputError(fmt::format("{}: {}", what, one_line(e.what())));
  }
}

}  // namespace frontend

void check_onnx_model(const std::string& path) {
  onnx::ModelProto m;
  frontend::parse_model_file(path, &m);
  frontend::validate_model(m, path);
}

}  // namespace gspmd
