#!/usr/bin/python3
"""Rewrite an exported ONNX model so that it lists its weights in one of the other forms real models use.

Run with Debian's interpreter (onnx 1.12, numpy; no torch needed):

    /usr/bin/python3 testdata/tools/weight_forms.py MODEL.onnx -o OUT.onnx [--ir3 | --initializers-as-inputs]
                     [--constant-of-shape] [--set-uniform REGEX=VALUE ...] [--min-elements N]

Forms (combinable; with no form flag only --set-uniform is applied, which gives the reference model for a
--constant-of-shape rewrite with the same overrides):

  --initializers-as-inputs
                        Every initializer is also listed in graph.input (after the model's own inputs, in
                        initializer order, with its type and shape); ir_version is kept. This is what
                        torch.onnx.export(keep_initializers_as_inputs=True) writes.

  --ir3                 The same listing, and ir_version becomes 3. In IR 3 an
                        initializer MUST be a graph input (the value is the input's default), and the onnx 1.12
                        checker enforces exactly that for ir_version <= 3 ("X in initializer but not in graph
                        input"), so passing the checker proves the listing is complete. The checker (and shape
                        inference) of onnx 1.12 does not tie the IR version to the opset version, so ir_version 3
                        is used as is with the model's opset (13 for the CNNs, 17 for the GPT): both are
                        accepted, and gspmd-onnx's loader reads initializers listed as inputs as initializers.
                        (Loaders must run ONNX shape inference at IR >= 4 on such files once they turn Constant
                        nodes into initializers: IR-3 inference types only initializers that are graph inputs. See
                        WeightFormsRepro.Ir3ConstantNodeFeedingAnOp in tests/e2e/weight_forms_test.cc.)

  --constant-of-shape   Every initializer whose elements are all equal (and that has at least --min-elements
                        elements, default 2) is removed and becomes the output of a `ConstantOfShape` node with the
                        same name: its shape is a new int64 initializer "<name>__shape", its `value` attribute the
                        one-element tensor of the same dtype. The nodes come first in graph.node. This is how
                        exporters that do not constant-fold write zero biases and LayerNorm gains of one.

  --set-uniform REGEX=VALUE   (repeatable) BEFORE the rewrite, overwrite every initializer whose name matches
                        REGEX (re.search; the first matching rule wins) with VALUE in all elements. This CHANGES
                        THE MODEL: it is for models whose exporter randomises biases and gains on purpose (the
                        bundled GPT), so that --constant-of-shape has weights to convert. Use values that are not
                        an identity (0.03 rather than 0 for a bias, 1.25 rather than 1 for a gain): a dropped,
                        double-counted or mis-sliced weight must still change the output. Each rule must match at
                        least one initializer. Values are compared against the rewritten model, not against the
                        torch export's test data.

Checks (the script exits non-zero when one fails): onnx.checker.check_model(full_check=True) and strict shape
inference of the result; the graph outputs keep their names, types and shapes; the model's own graph inputs are
unchanged and come first; with --ir3 every initializer is a graph input and ir_version is 3; every ConstantOfShape
node re-materialised with numpy equals, bit for bit, the initializer it replaced; with --constant-of-shape at least
one initializer was converted. The last line printed is a JSON summary:
    {"ir_version": 3, "constant_of_shape": ["h.0.attn.q.bias", ...], "graph_inputs": 39, "initializers": 37,
     "uniform_overrides": {"h.0.attn.q.bias": 0.03, ...}}
"""
import argparse
import json
import re
import sys

import numpy as np
import onnx
import onnx.checker
import onnx.helper
import onnx.numpy_helper
import onnx.shape_inference


def parse_rules(specs):
    rules = []
    for s in specs:
        if "=" not in s:
            sys.exit(f"error: --set-uniform {s!r}: expected REGEX=VALUE")
        rx, val = s.rsplit("=", 1)
        try:
            rules.append((re.compile(rx), float(val), s))
        except (re.error, ValueError) as e:
            sys.exit(f"error: --set-uniform {s!r}: {e}")
    return rules


def set_uniform(graph, rules):
    """Overwrites the matching initializers in place; returns {name: value}."""
    done, used = {}, set()
    for i, t in enumerate(graph.initializer):
        for rx, val, spec in rules:
            if rx.search(t.name):
                a = onnx.numpy_helper.to_array(t)
                if not np.issubdtype(a.dtype, np.floating):
                    sys.exit(f"error: --set-uniform {spec!r} matches {t.name!r} of dtype {a.dtype}, not a float")
                new = onnx.numpy_helper.from_array(np.full(a.shape, val, dtype=a.dtype), t.name)
                graph.initializer[i].CopyFrom(new)
                done[t.name] = val
                used.add(spec)
                break
    unused = [spec for _, _, spec in rules if spec not in used]
    if unused:
        sys.exit(f"error: --set-uniform {unused[0]!r} matches no initializer")
    return done


def uniform_value(a):
    """The common value of all elements of `a` (a 0-d array), or None."""
    if a.size == 0:
        return None
    flat = a.reshape(-1)
    first = flat[:1]
    if np.issubdtype(a.dtype, np.floating) and np.isnan(first[0]):
        return None
    # Bitwise equality, so that -0.0 and 0.0 are not merged.
    if not np.array_equal(flat.view(np.uint8).reshape(flat.size, -1),
                          np.broadcast_to(first.view(np.uint8), (flat.size, a.itemsize))):
        return None
    return first.reshape(())


def to_constant_of_shape(graph, min_elements):
    """Replaces uniform initializers by ConstantOfShape nodes; returns {name: (original array)}."""
    taken = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    for n in graph.node:
        taken.update(n.output)
        taken.update(n.input)
    replaced = {}
    keep, new_inits, new_nodes = [], [], []
    for t in graph.initializer:
        a = onnx.numpy_helper.to_array(t)
        v = uniform_value(a) if a.size >= min_elements else None
        if v is None or a.dtype == np.object_ or a.dtype.kind in "US":
            keep.append(t)
            continue
        shape_name = t.name + "__shape"
        k = 1
        while shape_name in taken:
            shape_name = f"{t.name}__shape{k}"
            k += 1
        taken.add(shape_name)
        new_inits.append(onnx.numpy_helper.from_array(np.array(a.shape, dtype=np.int64), shape_name))
        value = onnx.numpy_helper.from_array(np.array([v], dtype=a.dtype), "value")
        new_nodes.append(onnx.helper.make_node("ConstantOfShape", [shape_name], [t.name],
                                               name=f"{t.name}/ConstantOfShape", value=value))
        replaced[t.name] = a
    del graph.initializer[:]
    graph.initializer.extend(keep + new_inits)
    # A value produced by a node cannot also be a graph input (IR 3 listings of the source model).
    ins = [i for i in graph.input if i.name not in replaced]
    del graph.input[:]
    graph.input.extend(ins)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(new_nodes + nodes)
    return replaced


def list_initializers_as_inputs(graph):
    listed = {i.name for i in graph.input}
    for t in graph.initializer:
        if t.name not in listed:
            graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            listed.add(t.name)


def io_signature(values):
    return [(v.name, v.type.SerializeToString()) for v in values]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--ir3", action="store_true")
    ap.add_argument("--initializers-as-inputs", action="store_true")
    ap.add_argument("--constant-of-shape", action="store_true")
    ap.add_argument("--set-uniform", action="append", default=[], metavar="REGEX=VALUE")
    ap.add_argument("--min-elements", type=int, default=2)
    a = ap.parse_args()
    rules = parse_rules(a.set_uniform)

    m = onnx.load(a.model)
    src_outputs = io_signature(m.graph.output)
    init_names = {t.name for t in m.graph.initializer}
    src_inputs = io_signature([i for i in m.graph.input if i.name not in init_names])

    overrides = set_uniform(m.graph, rules)
    replaced = to_constant_of_shape(m.graph, a.min_elements) if a.constant_of_shape else {}
    if a.constant_of_shape and not replaced:
        sys.exit(f"error: {a.model}: no initializer with at least {a.min_elements} equal elements to convert "
                 "(see --set-uniform)")
    if a.ir3 or a.initializers_as_inputs:
        list_initializers_as_inputs(m.graph)
    if a.ir3:
        m.ir_version = 3

    onnx.checker.check_model(m, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    if io_signature(m.graph.output) != src_outputs:
        sys.exit("error: graph outputs changed")
    if io_signature(inferred.graph.output) != src_outputs:
        sys.exit("error: shape inference gives other output types/shapes than the source model declares")
    inits = [t.name for t in m.graph.initializer]
    ins = [i.name for i in m.graph.input]
    if io_signature(m.graph.input[:len(src_inputs)]) != src_inputs:
        sys.exit("error: the model's own graph inputs changed or moved")
    if (a.ir3 or a.initializers_as_inputs) and not set(inits) <= set(ins):
        sys.exit("error: an initializer is not listed among the graph inputs")
    if a.ir3 and m.ir_version != 3:
        sys.exit("error: ir_version is not 3")
    by_output = {n.output[0]: n for n in m.graph.node if n.op_type == "ConstantOfShape"}
    for name, want in replaced.items():
        n = by_output[name]
        shape = onnx.numpy_helper.to_array([t for t in m.graph.initializer if t.name == n.input[0]][0])
        value = onnx.numpy_helper.to_array(n.attribute[0].t)
        got = np.full(tuple(shape), value[0], dtype=value.dtype)
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            sys.exit(f"error: ConstantOfShape for {name!r} does not reproduce the initializer")

    onnx.save(m, a.out)
    for name in replaced:
        print(f"ConstantOfShape {name} {list(replaced[name].shape)} = {replaced[name].reshape(-1)[0]!r}")
    print(json.dumps({"ir_version": m.ir_version, "constant_of_shape": list(replaced), "graph_inputs": len(ins),
                      "initializers": len(inits), "uniform_overrides": overrides}))


if __name__ == "__main__":
    main()
