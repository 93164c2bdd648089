// onnx_frontend: the `gspmd` domain's operator schemas in ONNX's C++ schema registry, so that onnx's checker and
// strict shape inference validate the device models export_device writes (docs/collectives.md, "Validating a device
// model"). The ops, their attributes and semantics are core/program/program_ops.h; the exported attributes
// (replica_groups, group_size, source_target_pairs) are docs/collectives.md. tools/gspmd_onnx_schemas.py checks the
// same rules for Python's onnx.
#pragma once

#include <string>

namespace onnx {
class ModelProto;
}

namespace gspmd {

/// Registers the schemas of the eight `gspmd` ops (domain "gspmd", version 1: AllReduce, AllGather, ReduceScatter,
/// AllToAll, CollectivePermute, ShardSlice, MaskPad, PartitionOffset) with onnx::OpSchemaRegistry, after declaring
/// the domain's version range [1, 1] with DomainToVersionRange. Each schema lists the program's attributes
/// (core/program/program_ops.h) and the exported ones (docs/collectives.md), one type constraint T over every
/// tensor type (y has x's element type) and a type and shape inference function that computes y's shape as the
/// program does: AllGather multiplies the gathered dim by `group_size`, ReduceScatter divides it, AllToAll divides
/// `split_axis` and multiplies `concat_axis`, ShardSlice's dim is `size` (default `shard_size`), PartitionOffset is
/// an int64 scalar, the others keep x's shape. Without `group_size` (the program's form, where the group size
/// depends on the mesh) the changed dim is left unknown. The functions reject inconsistent attributes (an axis out
/// of range, a dim not divisible by the group, replica_groups that are not a partition of the devices into groups
/// of `group_size`, ...) with fail_shape_inference. Idempotent and thread-safe: the first call registers, later
/// calls (and a registry that already holds the schemas) do nothing. load_model and export_device call it.
void register_gspmd_schemas();

namespace frontend {

/// Validates `m` as another ONNX tool would: onnx::checker::check_model, then onnx::shape_inference::InferShapes with
/// type checks, strict errors and data propagation, with the gspmd schemas registered. Inference may add value_info
/// for values that have none (export_device's models have one for every value). Throws InputError("WHAT: <onnx's
/// message on one line>").
void validate_model(onnx::ModelProto& m, const std::string& what);

}  // namespace frontend

/// validate_model on the file at `path`. Throws InputError("PATH: ...") for a file that cannot be read or parsed, or
/// that the checker or strict shape inference rejects, e.g.
///   d/device_0.onnx: [ShapeInferenceError] (op_type:AllGather, node name: g): [ShapeInferenceError] Inferred shape
///   and existing shape differ in dimension 0: (8) vs (4)
void check_onnx_model(const std::string& path);

}  // namespace gspmd
