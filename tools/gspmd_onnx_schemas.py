#!/usr/bin/env python3
"""Checks gspmd-onnx device models with Python's onnx: the `gspmd` domain's schemas for onnx 1.12.

The C++ side registers the eight ops of the `gspmd` domain (version 1) with onnx's schema registry
(onnx_frontend/gspmd_schemas.cc), so onnx::checker::check_model and strict shape inference validate every node of a
device model. onnx 1.12's Python API cannot do that: onnx.defs has no register_schema and onnx.defs.OpSchema has no
constructor (both came later: docs/collectives.md says when), and onnx's checker and strict shape inference skip
the nodes of a domain they have no schema for. So this
module checks the gspmd nodes itself, with the same attribute lists, rules and messages as the C++ schemas, and
leaves every other node to onnx.checker.check_model and onnx.shape_inference.infer_shapes (strict). See
docs/collectives.md, "Validating a device model".

Use:
    python3 tools/gspmd_onnx_schemas.py DIR_OR_MODEL...   # every DIR/device_*.onnx, or the models; exit 1 on a fault
    import gspmd_onnx_schemas; gspmd_onnx_schemas.check_model(model_or_path)
check_model raises onnx.checker.ValidationError (a node's attributes or arity) or onnx.shape_inference.InferenceError
(types and shapes), each with one line of text.
"""

import glob
import os
import sys

import onnx
import onnx.checker
import onnx.shape_inference
from onnx import AttributeProto, TensorProto

DOMAIN = "gspmd"
VERSION = 1

_INT, _INTS, _FLOAT, _STRING = AttributeProto.INT, AttributeProto.INTS, AttributeProto.FLOAT, AttributeProto.STRING
_REDUCTIONS = ("sum", "max", "min", "prod")

# Attributes per op: name -> (type, required). The program's attributes (core/partition/program_ops.h) and the
# exported ones (replica_groups, group_size, source_target_pairs: docs/collectives.md).
_GROUP = {"mesh_axes": (_INTS, True), "replica_groups": (_INTS, False), "group_size": (_INT, False)}
SCHEMAS = {
    "AllReduce": dict(_GROUP, reduction=(_STRING, False)),
    "AllGather": dict(_GROUP, axis=(_INT, True)),
    "ReduceScatter": dict(_GROUP, axis=(_INT, True), reduction=(_STRING, False)),
    "AllToAll": dict(_GROUP, split_axis=(_INT, True), concat_axis=(_INT, True)),
    "CollectivePermute": dict(_GROUP, shift=(_INT, False), target_axes=(_INTS, False), wrap=(_INT, False),
                              source_target_pairs=(_INTS, False)),
    "ShardSlice": {"mesh_axes": (_INTS, True), "axis": (_INT, True), "shard_size": (_INT, True),
                   "base": (_INT, False), "size": (_INT, False)},
    "MaskPad": {"mesh_axes": (_INTS, True), "axis": (_INT, True), "full_size": (_INT, True),
                "value": (_FLOAT, True), "base": (_INT, False), "step": (_INT, False)},
    "PartitionOffset": {"mesh_axes": (_INTS, True), "shard_size": (_INT, True)},
}
COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "AllToAll", "CollectivePermute")


class _ShapeError(Exception):
    """A rule of an op's inference is violated (onnx's fail_shape_inference)."""


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _context(node):
    return "==> Context: Bad node spec for node. Name: %s OpType: %s" % (node.name, node.op_type)


def check_node(node):
    """The checker's part for one gspmd node (onnx's OpSchema::Verify): arity, attribute names, types, presence."""
    schema = SCHEMAS.get(node.op_type)
    if schema is None:
        raise onnx.checker.ValidationError(
            "No Op registered for %s with domain_version of %d %s" % (node.op_type, VERSION, _context(node)))
    n_in = 0 if node.op_type == "PartitionOffset" else 1
    if len(node.input) != n_in:
        raise onnx.checker.ValidationError("Node (%s) has input size %d not in range [min=%d, max=%d]. %s" % (
            node.name, len(node.input), n_in, n_in, _context(node)))
    if len(node.output) != 1:
        raise onnx.checker.ValidationError("Node (%s) has output size %d not in range [min=1, max=1]. %s" % (
            node.name, len(node.output), _context(node)))
    for a in node.attribute:
        if a.type == _INTS and not a.ints:  # onnx's check_attribute: an INTS attribute holds at least one value
            raise onnx.checker.ValidationError(
                "Attribute '%s' is expected to have field 'ints' %s" % (a.name, _context(node)))
        if a.name not in schema:
            raise onnx.checker.ValidationError(
                "Unrecognized attribute: %s for operator %s %s" % (a.name, node.op_type, _context(node)))
        if a.type != schema[a.name][0]:
            raise onnx.checker.ValidationError(
                "Mismatched attribute type in '%s : %s' %s" % (node.name, a.name, _context(node)))
    present = {a.name for a in node.attribute}
    for name, (_, required) in schema.items():
        if required and name not in present:
            raise onnx.checker.ValidationError(
                "Required attribute '%s' is missing. %s" % (name, _context(node)))


def _mesh_axes(attrs, name):
    axes = list(attrs.get(name, []))
    seen = set()
    for a in axes:
        if a < 0:
            raise _ShapeError("%s has the negative mesh axis %d" % (name, a))
        if a in seen:
            raise _ShapeError("%s lists mesh axis %d twice" % (name, a))
        seen.add(a)
    return axes


def _group_size(attrs):
    """group_size after checking mesh_axes, group_size and replica_groups (docs/collectives.md); None when absent."""
    if not _mesh_axes(attrs, "mesh_axes"):
        raise _ShapeError("mesh_axes is empty")
    n = attrs.get("group_size")
    if n is not None and n < 1:
        raise _ShapeError("group_size %d is not positive" % n)
    if "replica_groups" not in attrs:
        return n
    groups = list(attrs["replica_groups"])
    if n is None:
        raise _ShapeError("replica_groups is given without group_size")
    if not groups or len(groups) % n:
        raise _ShapeError("replica_groups has %d entries, not a positive multiple of group_size %d" % (len(groups), n))
    seen = set()
    for d in groups:
        if d < 0 or d >= len(groups):
            raise _ShapeError("replica_groups lists device %d but there are %d devices" % (d, len(groups)))
        if d in seen:
            raise _ShapeError("replica_groups lists device %d twice" % d)
        seen.add(d)
    return n


def _check_reduction(attrs):
    r = attrs.get("reduction")
    if r is not None and r.decode() not in _REDUCTIONS:
        raise _ShapeError("reduction '%s' is not sum, max, min or prod" % r.decode())


def _axis(attrs, name, rank):
    a = attrs.get(name, 0)
    if a < -rank or a >= rank:
        raise _ShapeError("%s %d is out of range for rank %d" % (name, a, rank))
    return a + rank if a < 0 else a


def _divide(dims, axis, n):
    if dims[axis] is None or n is None:
        dims[axis] = None
        return
    if dims[axis] % n:
        raise _ShapeError("dim %d of the input (%d) is not divisible by group_size %d" % (axis, dims[axis], n))
    dims[axis] //= n


def _multiply(dims, axis, n):
    dims[axis] = None if dims[axis] is None or n is None else dims[axis] * n


def infer_node(node, elem_type, dims):
    """The output type of gspmd `node` (checked with check_node) from its input's element type and dims (a list of
    ints and None for unknown dims, or None for an unknown shape): (elem_type, dims). Raises _ShapeError."""
    attrs = _attrs(node)
    op = node.op_type
    if op == "PartitionOffset":
        _mesh_axes(attrs, "mesh_axes")
        return TensorProto.INT64, []
    n = _group_size(attrs) if op in COLLECTIVES else None
    if op not in COLLECTIVES:
        _mesh_axes(attrs, "mesh_axes")
    out = None if dims is None else list(dims)
    rank = 0 if dims is None else len(dims)
    if op == "AllReduce":
        _check_reduction(attrs)
    elif op == "AllGather":
        if out is not None:
            _multiply(out, _axis(attrs, "axis", rank), n)
    elif op == "ReduceScatter":
        _check_reduction(attrs)
        if out is not None:
            _divide(out, _axis(attrs, "axis", rank), n)
    elif op == "AllToAll":
        if out is not None:
            split, concat = _axis(attrs, "split_axis", rank), _axis(attrs, "concat_axis", rank)
            _divide(out, split, n)
            _multiply(out, concat, n)
    elif op == "CollectivePermute":
        if ("shift" in attrs) == ("target_axes" in attrs):
            raise _ShapeError("needs exactly one of 'shift' and 'target_axes'")
        if "target_axes" in attrs:
            target = _mesh_axes(attrs, "target_axes")
            if sorted(target) != sorted(attrs["mesh_axes"]):
                raise _ShapeError("target_axes [%s] is not a permutation of mesh_axes [%s]" % (
                    ",".join(map(str, target)), ",".join(map(str, attrs["mesh_axes"]))))
        pairs = attrs.get("source_target_pairs", [])
        if len(pairs) % 2:
            raise _ShapeError("source_target_pairs has an odd number of entries (%d)" % len(pairs))
    elif op == "ShardSlice":
        shard = attrs.get("shard_size", 0)
        size = attrs.get("size", shard)
        if shard < 0:
            raise _ShapeError("shard_size %d is negative" % shard)
        if size < 0:
            raise _ShapeError("size %d is negative" % size)
        if out is not None:
            out[_axis(attrs, "axis", rank)] = size
    elif op == "MaskPad":
        if out is not None:
            _axis(attrs, "axis", rank)
    return elem_type, out


def _type_of(t):
    """(elem_type, dims) of a TypeProto's tensor type; dims None without a shape, entries None without a value."""
    tt = t.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] if tt.HasField("shape") else None
    return tt.elem_type, dims


def _declared_types(graph):
    types = {}
    for t in graph.initializer:
        types[t.name] = (t.data_type, list(t.dims))
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = _type_of(vi.type)
    return types


def _merge_error(node, inferred, existing):
    """onnx's mergeShapesAndTypes message for an inferred type that contradicts the declared one, or None."""
    (ie, idims), (ee, edims) = inferred, existing
    where = "(op_type:%s, node name: %s): " % (node.op_type, node.name)
    if ie and ee and ie != ee:
        return where + "[TypeInferenceError] Inferred elem type differs from existing elem type: (%s) vs (%s)" % (
            TensorProto.DataType.Name(ie), TensorProto.DataType.Name(ee))
    if idims is None or edims is None:
        return None
    if len(idims) != len(edims):
        return where + "[ShapeInferenceError] Inferred shape and existing shape differ in rank: (%d) vs (%d)" % (
            len(idims), len(edims))
    for i, (a, b) in enumerate(zip(idims, edims)):
        if a is not None and b is not None and a != b:
            return where + "[ShapeInferenceError] Inferred shape and existing shape differ in dimension %d: " \
                           "(%d) vs (%d)" % (i, a, b)
    return None


def _value_info(name, elem_type, dims):
    return onnx.helper.make_tensor_value_info(name, elem_type, None if dims is None else
                                              [d if d is not None else "" for d in dims])


def check_model(model):
    """Validates a device model (an onnx.ModelProto or a path) as the C++ checker with the gspmd schemas does:
    onnx.checker.check_model, every gspmd node's attributes and arity, every gspmd node's output type against the
    type its rules infer from its input's, and strict shape inference of the other nodes. Raises
    onnx.checker.ValidationError or onnx.shape_inference.InferenceError (one line). The gspmd nodes are checked
    first with the declared types (a device model declares every value), so a faulty collective is reported before
    the nodes that read its output, as onnx's node-by-node C++ inference reports it."""
    if isinstance(model, (str, bytes, os.PathLike)):
        model = onnx.load(model)
    onnx.checker.check_model(model)
    pending = [n for n in model.graph.node if n.domain == DOMAIN]
    for node in pending:
        check_node(node)
    m = model
    while True:
        types = _declared_types(m.graph)
        waiting, added = [], []
        for node in pending:
            x = types.get(node.input[0]) if node.input else (TensorProto.UNDEFINED, None)
            if x is None:
                waiting.append(node)
                continue
            try:
                inferred = infer_node(node, *x)
            except _ShapeError as e:
                raise onnx.shape_inference.InferenceError(
                    "[ShapeInferenceError] Shape inference error(s): (op_type:%s, node name: %s): "
                    "[ShapeInferenceError] %s" % (node.op_type, node.name, e))
            existing = types.get(node.output[0])
            if existing is None:
                added.append(_value_info(node.output[0], *inferred))
                continue
            error = _merge_error(node, inferred, existing)
            if error:
                raise onnx.shape_inference.InferenceError("[ShapeInferenceError] " + error)
        if added:
            if m is model:
                m = onnx.ModelProto()
                m.CopyFrom(model)
            m.graph.value_info.extend(added)
        # the other nodes, with the types of the gspmd nodes' outputs
        m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True, data_prop=True)
        if not waiting:
            return
        if len(waiting) == len(pending):
            node = waiting[0]
            raise onnx.shape_inference.InferenceError(
                "[ShapeInferenceError] Shape inference error(s): (op_type:%s, node name: %s): "
                "[TypeInferenceError] Input 0 expected to have type but instead is null" % (node.op_type, node.name))
        pending = waiting


def main(argv):
    paths = []
    for arg in argv:
        paths += sorted(glob.glob(os.path.join(arg, "device_*.onnx"))) if os.path.isdir(arg) else [arg]
    if not paths:
        print("usage: gspmd_onnx_schemas.py DIR_OR_MODEL...", file=sys.stderr)
        return 2
    failed = 0
    for p in paths:
        try:
            check_model(p)
            print("%s: ok" % p)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            print("%s: %s" % (p, " ".join(str(e).split())))
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
