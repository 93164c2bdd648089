#!/usr/bin/python3
"""The bad-input suite (issue 28, docs/errors.md): over a thousand hostile or broken inputs through the real CLI.

    /usr/bin/python3 tests/bad_input/run_bad_inputs.py --bin build/bin/gspmd-onnx [--out DIR] [--seed N]

Every case must end within 20 s with exit 2 or 3 and exactly one line `error: ...` on stderr, leave no output
behind and change no file that was there; or, where the input is legal after all (a byte flip in a weight), exit 0.
Never a crash (a signal), a hang, an internal error (exit 4) or a multi-line error. A case may narrow what it
accepts: an input that is broken by the ONNX spec must be refused (exit 0 fails it), a legal one must run (exit 2 or
3 fails it), and exit 1 passes only where a case allows it (--expected against other shapes, or float sums that may
overflow in another order under --check). The kinds:
- model bytes: the bundled GPT truncated at many offsets, and with bytes flipped at many offsets;
- sharding files: JSON truncated at every few bytes, keys and values replaced by wrong types, hostile sizes, deep
  nesting, long names, bad regexes, bad HLO and SBP text;
- flags: bad meshes, dims, seeds, tolerances, targets, output paths, values with a newline;
- graphs: structurally wrong models built with onnx's helper (wrong arity, opsets, attributes of the wrong type or
  value, undefined values, cycles, bad initializers, bodies, hostile sizes, external data leaving the model's folder
  or naming a FIFO, ...), through simulate, run --check and partition;
- input tensors: run --inputs with wrong dtypes, ranks and dims, broken or irregular .pb files, extra and missing
  files, token ids out of range under three plans, NaN and infinite values, --expected of other shapes;
- output paths: unwritable, occupied, irregular and over-long outputs of partition, run and simulate, and over-long
  input paths.
Prints one line per failing case (and its command line), a summary per kind and the time; exits 1 when any case
breaks the contract.
"""
import argparse
import collections
import json
import os
import random
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import AttributeProto, ModelProto, TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "testdata/gpt/gpt_opset13.onnx"
MESH = {"shape": [2, 2], "axes": ["data", "model"]}

ANY = frozenset({0, 2, 3})  # legal after all, or refused
REFUSE = frozenset({2, 3})  # broken by the spec: must be refused
LEGAL = frozenset({0})  # must run
OVERFLOWS = frozenset({0, 1})  # legal, but float sums may overflow in another order under --check
MISMATCH = frozenset({1})  # --expected must report the difference
Case = collections.namedtuple("Case", "what args exits", defaults=[ANY])


def model_cases(rng, work: Path):
    data = MODEL.read_bytes()
    cases = []
    for k, cut in enumerate(sorted(rng.sample(range(1, len(data)), 60))):
        p = work / f"trunc_{k}.onnx"
        p.write_bytes(data[:cut])
        cases.append((f"model truncated at {cut}", ["simulate", str(p), "--mesh", "2x2"]))
    for k in range(100):
        b = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 8])):
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256)
        p = work / f"flip_{k}.onnx"
        p.write_bytes(bytes(b))
        cases.append((f"model with flipped bytes #{k}", ["simulate", str(p), "--mesh", "2x2"]))
    return cases


def sharding_cases(rng, work: Path):
    good = {"mesh": MESH, "tensors": {"input_ids": ["data", None], "h.0.mlp.fc_in.weight": [None, "model"]},
            "rules": [{"match": "fc_out\\.weight$", "spec": ["model", None]}]}
    text = json.dumps(good)
    files = []
    for cut in range(1, len(text), 3):  # every third truncation point
        files.append((f"sharding file truncated at {cut}", text[:cut]))
    wrong = [None, 0, -1, 1.5, True, "x", [], {}, [[]], [None], ["data", "data"], 2 ** 62, "z" * 5000]
    for w in wrong:
        for path in (("mesh",), ("mesh", "shape"), ("mesh", "axes"), ("tensors",), ("tensors", "input_ids"),
                     ("rules",), ("rules", 0), ("rules", 0, "match"), ("rules", 0, "spec")):
            doc = json.loads(text)
            node = doc
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = w
            files.append((f"sharding file with {'.'.join(map(str, path))} = {json.dumps(w)[:30]}", json.dumps(doc)))
    hostile = {
        "deep nesting": '{"mesh": ' + "[" * 50000 + "]" * 50000 + "}",
        "huge mesh": json.dumps({"mesh": {"shape": [65536, 65536], "axes": ["a", "b"]}}),
        "long name": json.dumps({"mesh": MESH, "tensors": {"v" * 100000: [None]}}),
        "backtracking rule": json.dumps({"mesh": MESH, "rules": [{"match": "^(.*.*)*X$", "spec": [None, None]}]}),
        "backreference rule": json.dumps({"mesh": MESH, "rules": [{"match": "(a)\\1", "spec": [None]}]}),
        "50,000 alternatives": json.dumps(
            {"mesh": MESH, "rules": [{"match": "|".join(f"w{i}" for i in range(50000)), "spec": [None]}]}),
        "hlo iota of 2^32": json.dumps({"mesh": MESH, "tensors": {"input_ids": {"hlo": "{devices=[1,2]<=[4294967296]}"}}}),
        "bad hlo": json.dumps({"mesh": MESH, "tensors": {"input_ids": {"hlo": "{devices=[2,2]<=[4]T(1,0,7)}"}}}),
        "bad sbp": json.dumps({"mesh": MESH, "tensors": {"input_ids": {"sbp": ["S(9)", "Q"]}}}),
        "not utf-8": b"\xff\xfe{\x00".decode("latin-1"),
        "empty": "",
        "binary": "".join(chr(rng.randrange(256)) for _ in range(200)),
    }
    files += [(f"sharding file: {k}", v) for k, v in hostile.items()]
    cases = []
    for k, (what, body) in enumerate(files):
        p = work / f"s_{k}.json"
        p.write_bytes(body.encode("latin-1") if isinstance(body, str) and any(ord(c) > 127 for c in body[:4])
                      else body.encode("utf-8", "surrogateescape") if isinstance(body, str) else body)
        cases.append((what, ["partition", str(MODEL), "--mesh", "2x2", "--shardings", str(p), "-o",
                             str(work / f"out_s_{k}")]))
    return cases


def flag_cases(work: Path):
    m = str(MODEL)
    bad = [["--mesh", x] for x in ["", "0", "2x0", "-2", "2x", "x2", "2xx2", "99999999999999", "65536x65536", "a"]]
    bad += [["--mesh", "2", "--dim", x] for x in ["=", "batch", "batch=", "batch=-1", "batch=0", "=4", "batch=1e3",
                                                  "batch=2199023255552", "seq=3"]]
    bad += [["--mesh", "2", "--target", x] for x in ["tpu-v9", str(work / "missing.json"), ""]]
    bad += [["--mesh", "2", "--device-order", x] for x in ["q", "x,x", ""]]
    bad += [["--mesh", "2", "--shardings", x] for x in ["", "/dev/null", str(work), "/nonexistent.json"]]
    bad += [["--mesh", "2", "--pipeline", x] for x in ["", "q"]]
    bad += [["--mesh", "2", "--training", "--optimizer", "sgdx"], ["--mesh", "2", "--training", "--trainable", "("],
            ["--mesh", "2", "--training", "--loss", "nope"], ["--mesh", "2", "--remat", "full"],
            ["--mesh", "2", "--memory-limit", "-5"], ["--mesh", "2", "--memory-limit", "lots"]]
    cases = [(f"simulate {' '.join(b)}", ["simulate", m] + b) for b in bad]
    run_bad = [["--seed", "-1"], ["--rtol", "-1", "--check"], ["--atol", "nan", "--check"],
               ["--inputs", "/nonexistent"], ["--expected", "/nonexistent"], ["--outputs", "/proc/x/y"],
               ["--backend", "nope"], ["--program", str(work)], ["--repeat", "3"]]
    cases += [(f"run {' '.join(b)}", ["run", m, "--mesh", "1"] + b) for b in run_bad]
    cases += [("partition -o ''", ["partition", m, "--mesh", "2", "-o", ""]),
              ("partition -o over a file", ["partition", m, "--mesh", "2", "-o", str(MODEL)]),
              ("partition 65536 devices", ["partition", m, "--mesh", "256x256", "-o", str(work / "big")]),
              ("explain --value nope", ["explain", m, "--mesh", "2", "--value", "nope"]),
              ("no command", []), ("unknown command", ["frobnicate", m])]
    newline = [["--rtol", "1\n2"], ["--atol", "x\ny"], ["--seed", "1\n2"], ["--backend", "a\nb"],
               ["--repeat", "a\nb"], ["--microbatches", "a\nb"], ["--mesh", "2\nx2"], ["--dim", "a\nb=3"],
               ["--target", "a\nb"], ["--frob\nnicate", "1"], ["extra\nargument"]]
    cases += [(f"run {' '.join(b)!r}", ["run", m, "--mesh", "1"] + b) for b in newline]
    cases += [(f"partition {' '.join(b)!r}", ["partition", m, "--mesh", "2", "-o", str(work / "nl")] + b)
              for b in (["--notation", "a\nb"], ["--collectives", "a\nb"])]
    hint = [["--hint", x] for x in ["=", "batch", "batch=0", "batch=-1", "batch=2199023255552", "seq=3", "a\nb=3"]]
    hint += [["--hint", "batch=4", "--dim", "batch=4"], ["--hint", "batch=4", "--hint", "batch=5"],
             ["--hint", "batch=4", "--training"]]
    cases += [(f"partition {' '.join(b)!r}", ["partition", m, "--mesh", "2", "-o", str(work / "hint")] + b)
              for b in hint]
    return cases


F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vinfo(name, dtype=F, shape=(2, 4)):
    return helper.make_tensor_value_info(name, dtype, shape)


def tensor(name, dims, dtype=F, **fields):
    """A TensorProto as given, unchecked: raw_data, float_data, data_location, ... may disagree with the dims."""
    return TensorProto(name=name, dims=dims, data_type=dtype, **fields)


def const(name, value, dtype=None):
    return numpy_helper.from_array(np.array(value, dtype), name)


def node(op, ins, outs=("y",), name=None, **attrs):
    return helper.make_node(op, list(ins), list(outs), name=name or op.lower() or "n", **attrs)


def model(nodes, opset=13, inputs=None, outputs=None, inits=(), imports=(), functions=(), ir=8):
    """A model around `nodes`, unchecked (the point): input x float[2,4] and output y unless given."""
    g = helper.make_graph(nodes, "g", [vinfo("x")] if inputs is None else inputs,
                          [vinfo("y", shape=None)] if outputs is None else outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *imports])
    m.ir_version = ir
    m.functions.extend(functions)
    return m


W = const("w", np.ones((4, 3)), np.float32)
X4 = vinfo("x", shape=[1, 4, 5, 5])
WC = const("wc", np.ones((2, 4, 3, 3)), np.float32)


def one_op(op, ins=("x",), inits=(), inputs=None, **attrs):
    return model([node(op, ins, **attrs)], inits=inits, inputs=inputs)


def with_input(op, value, dtype=np.int64, data="x", **attrs):
    """op(data, c) (op(c) when data is None) with the constant c = value: a shape, repeats, pads, indices, ..."""
    return one_op(op, ["c"] if data is None else [data, "c"], [const("c", value, dtype)], **attrs)


def conv(op="Conv", x=X4, w=WC, **attrs):
    return one_op(op, ["x", "wc"] if op == "Conv" else ["x"], [w] if op == "Conv" else [], [x], **attrs)


def graph_body(nodes, inputs, outputs, name="body"):
    return helper.make_graph(nodes, name, inputs, outputs)


def loop(trip, cond=True, body_out=("c_out", "v_out"), body_reads="v"):
    """Loop(trip, cond, x) with a body that passes its condition on and applies Relu to the carried value."""
    body = graph_body([node("Identity", ["c"], ["c_out"]), node("Relu", [body_reads], ["v_out"])],
                      [vinfo("i", I64, []), vinfo("c", B, []), vinfo("v")],
                      [vinfo(o, B if o == "c_out" else F, [] if o == "c_out" else (2, 4)) for o in body_out])
    inits = [const("cond", cond, np.bool_)] + ([] if trip is None else [const("m", trip, np.int64)])
    return one_op("Loop", ["" if trip is None else "m", "cond", "x"], inits, body=body)


def nested_if(depth):
    """`depth` Ifs, each in the then-branch of the one around it."""
    then = graph_body([node("Identity", ["x"], ["t0"])], [], [vinfo("t0", shape=None)], "t0")
    for k in range(1, depth + 1):
        other = graph_body([node("Identity", ["x"], [f"e{k}"], f"e{k}")], [], [vinfo(f"e{k}", shape=None)], f"e{k}")
        out = "y" if k == depth else f"t{k}"
        then = graph_body([node("If", ["c"], [out], f"if{k}", then_branch=then, else_branch=other)], [],
                          [vinfo(out, shape=None)], out)
    return model(list(then.node), inputs=[vinfo("x"), vinfo("c", B, [])])


def if_model(**branches):
    return model([node("If", ["c"], **branches)], inputs=[vinfo("x"), vinfo("c", B, [])])


def recursive_function():
    f = helper.make_function("local", "f", ["a"], ["b"], [helper.make_node("f", ["a"], ["b"], domain="local")],
                             [helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])
    return model([node("f", ["x"], domain="local")], imports=[helper.make_opsetid("local", 1)], functions=[f])


def not_utf8(m):
    """`m` serialized with its 'NOTUTF8' names made bytes that are not UTF-8."""
    return m.SerializeToString().replace(b"NOTUTF8", b"\xff\xfe" * 3 + b"\xc0")


def structural_models():
    """(what, model, when) for graphs that break ONNX's spec or carry hostile sizes. `when` says which commands
    must refuse it (REFUSED_BY); a model given as bytes is written as is."""
    relu = node("Relu", ["x"])
    branch = graph_body([node("Identity", ["x"], ["b"])], [], [vinfo("b", shape=None)])
    two_outs = graph_body([node("Identity", ["x"], ["b"]), node("Identity", ["x"], ["b2"])], [],
                          [vinfo("b", shape=None), vinfo("b2", shape=None)])
    cases = [
        ("a MatMul with 3 inputs", one_op("MatMul", ["x", "w", "w"], [W]), "load"),
        ("a Relu with 2 outputs", model([node("Relu", ["x"], ["y", "z"])]), "load"),
        ("an unknown attribute", one_op("Relu", alpha=1.0), "load"),
        ("a Relu with a graph attribute", one_op("Relu", body=branch), "load"),
        ("a graph without outputs", model([relu], outputs=[]), "load"),
        ("an empty model file", b"", "load"),
        ("a model without a graph", ModelProto(ir_version=8, opset_import=[helper.make_opsetid("", 13)]), "load"),
        ("no nodes, the input as output", model([], outputs=[vinfo("x")]), "never"),
        ("a node reading an undefined value", one_op("Relu", ["nope"]), "load"),
        ("a graph output nothing computes", model([relu], outputs=[vinfo("nope")]), "load"),
        ("the same graph output twice", model([relu], outputs=[vinfo("y"), vinfo("y")]), "never"),
        ("two nodes writing the same output", model([relu, node("Neg", ["x"])]), "load"),
        ("a node writing a graph input", model([relu, node("Neg", ["y"], ["x"], "neg")]), "load"),
        ("a node writing an initializer", model([node("Neg", ["x"], ["w"]), node("MatMul", ["x", "w"])], inits=[W]),
         "load"),
        ("a cycle", model([node("Relu", ["b"], ["a"], "r"), node("Neg", ["a"], ["b"]), node("Add", ["a", "x"])]),
         "load"),
        ("a node reading its own output", one_op("Add", ["x", "y"]), "load"),
        ("an empty op_type", one_op(""), "load"),
        ("an unknown operator", one_op("Frobnicate"), "load"),
        ("an unknown domain, not imported", model([node("Relu", ["x"], domain="com.evil")]), "load"),
        ("an unknown domain, imported", model([node("Frob", ["x"], domain="com.evil")],
                                              imports=[helper.make_opsetid("com.evil", 1)]), "load"),
        ("a required input left empty", one_op("Add", ["x", ""]), "load"),
        ("an Identity without inputs", one_op("Identity", []), "load"),
        ("a Concat without inputs", one_op("Concat", [], axis=0), "load"),
        ("a Sum of 2000 inputs", one_op("Sum", ["x"] * 2000), "legal"),
        ("a chain of 3000 Relus", model([node("Relu", [f"h{i}"], [f"h{i + 1}"], f"r{i}") for i in range(3000)] +
                                        [node("Identity", ["h3000"])], inputs=[vinfo("h0")]), "legal"),
        ("a node name and value name with a newline", model([node("Relu", ["no\nsuch"], name="n\nm")]), "load"),
        ("value names that are not UTF-8", not_utf8(one_op("Relu", ["NOTUTF8"])), "load"),
        ("duplicate graph input names", model([relu], inputs=[vinfo("x"), vinfo("x")]), "load"),
        ("duplicate initializer names", one_op("MatMul", ["x", "w"], [W, W]), "load"),
        ("an input without a type", model([relu], inputs=[helper.ValueInfoProto(name="x")]), "load"),
        ("an input of element type 0", model([relu], inputs=[vinfo("x", 0)]), "load"),
        ("an input of strings", model([relu], inputs=[vinfo("x", TensorProto.STRING)]), "load"),
        ("an input of dim -3", model([relu], inputs=[vinfo("x", F, [-3, 4])]), "load"),
        ("a sequence input fed to Relu", model([relu], inputs=[helper.make_tensor_sequence_value_info("x", F, [2, 4])]),
         "load"),
        ("an input of 2^40 rows", model([relu], inputs=[vinfo("x", F, [2 ** 40, 4])]), "run"),
        ("an input of 2^93 elements", model([relu], inputs=[vinfo("x", F, [2 ** 31] * 3)]), "load"),
        ("a value_info that contradicts the node", model([relu], outputs=[vinfo("y", I64, [3])]), "never"),
        ("IR version 0", model([relu], ir=0), "never"),
        ("IR version 99", model([relu], ir=99), "never"),
        ("IR version -1", model([relu], ir=-1), "never"),
        # initializers
        ("an initializer with 10 bytes of raw_data for 48", one_op("MatMul", ["x", "w"], [
            tensor("w", [4, 3], raw_data=bytes(10))]), "load"),
        ("an initializer with 100 bytes of raw_data for 48", one_op("MatMul", ["x", "w"], [
            tensor("w", [4, 3], raw_data=bytes(100))]), "load"),
        ("an initializer with 5 floats for 12", one_op("MatMul", ["x", "w"], [
            tensor("w", [4, 3], float_data=[1.0] * 5)]), "load"),
        ("a float initializer holding int64_data", one_op("MatMul", ["x", "w"], [
            tensor("w", [4, 3], int64_data=[1] * 12)]), "load"),
        ("an initializer of dim -4", one_op("MatMul", ["x", "w"], [tensor("w", [-4, 3])]), "load"),
        ("an initializer of 2^80 elements", one_op("ReduceSum", ["w"], [tensor("w", [2 ** 40, 2 ** 40])]), "data"),
        ("an initializer whose dims overflow int64", one_op("ReduceSum", ["w"], [tensor("w", [2 ** 32] * 3)]),
         "load"),
        ("an initializer of element type 0", one_op("MatMul", ["x", "w"], [tensor("w", [4, 3], 0, raw_data=bytes(48))]),
         "load"),
        ("an initializer of element type 99", one_op("MatMul", ["x", "w"], [
            tensor("w", [4, 3], 99, raw_data=bytes(48))]), "load"),
        ("a string initializer into MatMul", one_op("MatMul", ["x", "w"], [
            tensor("w", [4, 3], TensorProto.STRING, string_data=[b"a"] * 12)]), "load"),
        # Constant nodes
        ("a Constant without a value", model([node("Constant", [])]), "load"),
        ("a Constant with two values", model([node("Constant", [], value=const("c", [1.0]), value_float=1.0)]),
         "load"),
        ("a Constant with 3 bytes of raw_data for 16", model([node("Constant", [], value=tensor("c", [4],
                                                                                               raw_data=bytes(3)))]),
         "load"),
        ("a sparse Constant with an index out of range", model([node("Constant", [], sparse_value=(
            helper.make_sparse_tensor(const("v", [1.0, 2.0], np.float32), const("i", [0, 100]), [2, 4])))]), "load"),
        # control flow
        ("a Loop with trip count 2^40", loop(2 ** 40), "run"),
        ("a Loop without a trip count whose condition stays true", loop(None), "run"),
        ("a Loop with trip count 2^40 and a false condition", loop(2 ** 40, cond=False), "never"),
        ("a Loop with trip count -1", loop(-1), "never"),
        ("a Loop body without its condition output", loop(3, body_out=("v_out",)), "load"),
        ("a Loop body reading an undefined value", loop(3, body_reads="nope"), "load"),
        ("an If without an else branch", if_model(then_branch=branch), "load"),
        ("an If whose branches give 1 and 2 outputs", if_model(then_branch=branch, else_branch=two_outs), "load"),
        ("an If on a float condition", model([node("If", ["x"], then_branch=branch, else_branch=branch)]), "load"),
        ("Ifs nested 20 deep", nested_if(20), "never"),
        ("Ifs nested 50 deep (150 messages deep: past protobuf's limit of 100)", nested_if(50), "never"),
        ("a Scan with 5 scan inputs of 1", one_op("Scan", ["x"], num_scan_inputs=5, body=branch), "load"),
        ("a function that calls itself", recursive_function(), "load"),
        # convolutions and pools
        ("a Conv on a rank-2 input", conv(x=vinfo("x")), "load"),
        ("a MaxPool on a rank-2 input", conv("MaxPool", x=vinfo("x"), kernel_shape=[2, 2]), "load"),
        ("a Conv with a rank-3 weight", conv(w=const("wc", np.ones((2, 4, 3)), np.float32)), "load"),
        ("a Conv with a kernel larger than the input", conv(w=const("wc", np.ones((2, 4, 9, 9)), np.float32)), "load"),
        ("a Conv with 4 channels in groups of 3", conv(group=3), "load"),
        ("a Conv with auto_pad 'NOPE'", conv(auto_pad="NOPE"), "load"),
        ("a Conv with kernel_shape 5x5 for a 3x3 weight", conv(kernel_shape=[5, 5]), "load"),
        ("a MaxPool with a 0x0 kernel", conv("MaxPool", kernel_shape=[0, 0]), "load"),
        ("an AveragePool with stride 0", conv("AveragePool", kernel_shape=[2, 2], strides=[0, 0]), "load"),
        ("a Resize to 1e6 x 1e6 per image", one_op("Resize", ["x", "", "s"], [const("s", [1, 1, 1e6, 1e6],
                                                                                    np.float32)], [X4]), "run"),
        # shapes and sizes
        ("a Reshape of 8 elements to [5,5]", with_input("Reshape", [5, 5]), "load"),
        ("a Reshape to [-1,-1]", with_input("Reshape", [-1, -1]), "load"),
        ("a Reshape to [-2,4]", with_input("Reshape", [-2, 4]), "load"),
        ("a Reshape to [3,-1]", with_input("Reshape", [3, -1]), "load"),
        ("a Reshape to [0,0,0]", with_input("Reshape", [0, 0, 0]), "load"),
        ("a Reshape to [2^40,2^40]", with_input("Reshape", [2 ** 40, 2 ** 40]), "load"),
        ("a ConstantOfShape of [2^20,2^20,2^20]", with_input("ConstantOfShape", [2 ** 20] * 3, data=None), "load"),
        ("a ConstantOfShape of [-1]", with_input("ConstantOfShape", [-1], data=None), "load"),
        ("a ConstantOfShape of [2^62]", with_input("ConstantOfShape", [2 ** 62], data=None), "load"),
        ("a ConstantOfShape of [0]", with_input("ConstantOfShape", [0], data=None), "never"),
        ("a Range of 2^50 elements", model([node("Range", ["a", "b", "d"])], inits=[
            const("a", 0), const("b", 2 ** 50), const("d", 1)]), "load"),
        ("a Range with delta 0", model([node("Range", ["a", "b", "d"])], inits=[
            const("a", 0), const("b", 10), const("d", 0)]), "load"),
        ("a Range of 1e60 floats", model([node("Range", ["a", "b", "d"])], inits=[
            const("a", 0, np.float32), const("b", 1e30, np.float32), const("d", 1e-30, np.float32)]), "load"),
        ("an Expand to [2^31,2^31,4]", with_input("Expand", [2 ** 31, 2 ** 31, 4]), "run"),
        ("a Tile by [2^31,2^31] (2^65 elements)", with_input("Tile", [2 ** 31, 2 ** 31]), "load"),
        ("a Pad by 2^40", with_input("Pad", [0, 0, 2 ** 40, 2 ** 40]), "run"),
        ("a Pad by -9", with_input("Pad", [0, -9, 0, 0]), "load"),
        ("a Split of 4 into [3,3]", with_input("Split", [3, 3], outs=["y", "z"], axis=1), "load"),
        ("a Slice with step 0", model([node("Slice", ["x", "s", "e", "a", "st"])], inits=[
            const("s", [0]), const("e", [4]), const("a", [1]), const("st", [0])]), "load"),
        ("a TopK of 99 from 4", with_input("TopK", [99], outs=["y", "i"]), "load"),
        ("a TopK of -1", with_input("TopK", [-1], outs=["y", "i"]), "load"),
        ("a OneHot of depth 2^40", model([node("OneHot", ["i", "d", "v"])], inputs=[vinfo("i", I64, [2])], inits=[
            const("d", 2 ** 40), const("v", [0.0, 1.0], np.float32)]), "run"),
        ("a OneHot of depth -1", model([node("OneHot", ["i", "d", "v"])], inputs=[vinfo("i", I64, [2])], inits=[
            const("d", -1), const("v", [0.0, 1.0], np.float32)]), "load"),
        ("a Concat of [2,4] and [4,3] on axis 0", one_op("Concat", ["x", "w"], [W], axis=0), "load"),
        ("an Add of [2,4] and [3]", with_input("Add", [1, 2, 3], np.float32), "load"),
        ("a MatMul of [2,4] and [3,3]", with_input("MatMul", np.ones((3, 3)), np.float32), "load"),
        ("a Where on a float condition", one_op("Where", ["x", "x", "x"]), "load"),
        ("an Einsum 'ij,jk->q'", one_op("Einsum", ["x", "w"], [W], equation="ij,jk->q"), "load"),
        ("an Einsum 'abc' of a rank-2 input", one_op("Einsum", ["x"], equation="abc"), "load"),
        ("an Einsum ''", one_op("Einsum", ["x"], equation=""), "load"),
        ("a Squeeze of a dim of 4", with_input("Squeeze", [1]), "load"),
        ("an Unsqueeze at axis 0 twice", with_input("Unsqueeze", [0, 0]), "load"),
        ("a Transpose by [0,0]", one_op("Transpose", perm=[0, 0]), "load"),
        ("a BatchNormalization with parameters of 3 for 4 channels", model(
            [node("BatchNormalization", ["x", "p", "p", "p", "p"])], inputs=[X4],
            inits=[const("p", np.ones(3), np.float32)]), "load"),
        ("a LayerNormalization with a scale of 3 for 4", model([node("LayerNormalization", ["x", "p"])], opset=17,
                                                                inits=[const("p", np.ones(3), np.float32)]), "load"),
        ("a SequenceAt 5 of a 1-element sequence", model([node("SequenceConstruct", ["x"], ["s"]),
                                                          node("SequenceAt", ["s", "i"])], inits=[const("i", 5)]),
         "load"),
        # indices
        ("a Gather of constant index 7 from an input of 2 rows", with_input("Gather", [7]), "run"),
        ("a Gather of constant index -3 from an input of 2 rows", with_input("Gather", [-3]), "run"),
        ("a Gather of constant index 7 from a constant of 2 rows", one_op("Gather", ["t", "i"], [
            const("t", np.ones((2, 4)), np.float32), const("i", [7])]), "run"),
        ("a Gather on axis 5", with_input("Gather", [0], axis=5), "load"),
        ("a GatherElements of constant index 9", with_input("GatherElements", [[9, 0, 0, 0]]), "run"),
        ("a ScatterElements to constant index 9", model([node("ScatterElements", ["x", "i", "u"])], inits=[
            const("i", [[9]]), const("u", [[1.0]], np.float32)]), "run"),
        ("a ScatterND to constant index [9,9]", model([node("ScatterND", ["x", "i", "u"])], inits=[
            const("i", [[9, 9]]), const("u", [1.0], np.float32)]), "run"),
    ]
    cases += [(f"opset {v}", model([relu], opset=v), "load") for v in (99, -5, 0, 24, 2 ** 62, -2 ** 63)]
    cases += [(f"a Conv with {k} {v}", conv(**{k: v}), "load") for k, v in [
        ("strides", [0, 1]), ("strides", [-1, 1]), ("strides", [1]), ("kernel_shape", [0, 0]), ("dilations", [0, 1]),
        ("dilations", [-1, 1]), ("pads", [0, 0]), ("group", 0), ("group", -2)]]
    cases.append(("a Conv with pads [-1, 0, 0, 0]", conv(pads=[-1, 0, 0, 0]), "never"))  # ONNX asks >= 0; it crops
    return cases


# The broken graphs also loaded at opset 21, past the installed onnx's own (17): the loader does not check those
# nodes against onnx's schemas, so its own checks and the shape functions meet them alone.
AT_NEWER_OPSET = ("a MatMul with 3 inputs", "a Relu with 2 outputs", "an unknown attribute", "an empty op_type",
                  "a node reading an undefined value", "a Conv on a rank-2 input", "a Conv with strides [0, 1]",
                  "a Reshape of 8 elements to [5,5]", "an Einsum 'abc' of a rank-2 input", "a TopK of 99 from 4",
                  "two nodes writing the same output", "a cycle", "an If without an else branch",
                  "a Loop body without its condition output")

# Which commands must refuse a graph, by when its fault shows: when it loads, when the weights are read (simulate
# costs without them), or when it runs; "never": each may; "legal": each must succeed.
REFUSED_BY = {"load": ("simulate", "run", "partition"), "data": ("run", "partition"), "run": ("run",), "never": (),
              "legal": ()}


def graph_commands(what, path: Path, when, work: Path, commands=("simulate", "run", "partition")):
    """`path` through each of `commands`, on 2 devices (everything replicated)."""
    out = work / f"out_{path.parent.name}_{path.stem}"
    args = {"simulate": ["simulate", str(path), "--mesh", "2"], "run": ["run", str(path), "--mesh", "2", "--check"],
            "partition": ["partition", str(path), "--mesh", "2", "-o", str(out)]}
    exits = lambda c: LEGAL if when == "legal" else REFUSE if c in REFUSED_BY[when] else ANY
    return [Case(f"{what} ({c})", args[c], exits(c)) for c in commands]


def save_model(path: Path, m):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(m if isinstance(m, bytes) else m.SerializeToString())
    return path


def wrong_attributes(name, good):
    """(label, AttributeProto, must_refuse) for attribute `name`: every other type (refused), and values of the right
    type that are out of range or odd (which the op may accept)."""
    kind = helper.make_attribute(name, good).type
    others = {AttributeProto.INT: 1, AttributeProto.FLOAT: 1.5, AttributeProto.INTS: [1, 1],
              AttributeProto.FLOATS: [0.5], AttributeProto.STRING: "s", AttributeProto.STRINGS: ["a"],
              AttributeProto.TENSOR: const("t", [1]), AttributeProto.GRAPH: helper.make_graph([], "e", [], [])}
    odd = {AttributeProto.INT: [2 ** 62, -2 ** 62, 99, -99], AttributeProto.FLOAT: [float("nan"), float("inf"), -1e30],
           AttributeProto.INTS: [[], [2 ** 62, 0], [-99, 99], [0] * 1000]}
    r = [(f"of type {AttributeProto.AttributeType.Name(t)}", helper.make_attribute(name, v), True)
         for t, v in others.items() if t != kind]
    r.append(("of no type (UNDEFINED)", AttributeProto(name=name), True))
    shown = lambda v: json.dumps(v) if len(json.dumps(v)) < 30 else f"{len(v)} zeros"
    r += [(f"= {shown(v)}", helper.make_attribute(name, v), False) for v in odd.get(kind, [])]
    return r


# Ops whose every attribute is set to every wrong type and to odd values: (op, inputs, initializers, attributes).
ATTRIBUTE_OPS = [
    ("Softmax", ["x"], [], {"axis": 1}),
    ("Transpose", ["x"], [], {"perm": [1, 0]}),
    ("Concat", ["x", "x"], [], {"axis": 0}),
    ("Flatten", ["x"], [], {"axis": 1}),
    ("LeakyRelu", ["x"], [], {"alpha": 0.1}),
    ("Cast", ["x"], [], {"to": TensorProto.DOUBLE}),
    ("Gemm", ["x", "w"], [W], {"alpha": 1.0, "transB": 0}),
    ("ReduceMean", ["x"], [], {"axes": [1], "keepdims": 1}),
    ("Gather", ["x", "i"], [const("i", [1])], {"axis": 0}),
    ("ArgMax", ["x"], [], {"axis": 1}),
]


def attribute_models():
    """(what, model, when): each attribute of ATTRIBUTE_OPS replaced by a wrong one, the others as given."""
    cases = []
    for op, ins, inits, good in ATTRIBUTE_OPS:
        for name in good:
            for label, attr, refuse in wrong_attributes(name, good[name]):
                n = node(op, ins, **{k: v for k, v in good.items() if k != name})
                n.attribute.append(attr)
                what = f"{'an' if op[0] in 'AEIOU' else 'a'} {op} with {name} {label}"
                cases.append((what, model([n], inits=inits), "load" if refuse else "never"))
    cases.append(("a Cast to element type 0", one_op("Cast", to=0), "load"))
    cases.append(("a Cast to element type 99", one_op("Cast", to=99), "load"))
    return cases


def at_opset(m, opset):
    r = type(m)()
    r.CopyFrom(m)
    r.opset_import[0].version = opset
    return r


def graph_cases(work: Path):
    cases = []
    for k, (what, m, when) in enumerate(structural_models()):
        cases += graph_commands(what, save_model(work / "graphs" / f"g{k}.onnx", m), when, work)
        if what in AT_NEWER_OPSET:
            cases += graph_commands(f"{what} at opset 21", save_model(work / "graphs" / f"g{k}_21.onnx",
                                                                      at_opset(m, 21)), when, work)
    for k, (what, m, when) in enumerate(attribute_models()):  # run --check loads, partitions and runs
        cases += graph_commands(what, save_model(work / "graphs" / f"a{k}.onnx", m), when, work, ("run",))
    return cases + external_data_cases(work)


DIR, FIFO = "<dir>", "<fifo>"  # place(): a folder, a FIFO


class Link(str):
    """place(): a symlink to this target."""


def place(path: Path, what):
    """Makes `path` what is asked (bytes, a TensorProto, DIR, FIFO or a Link) and returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(what, Link):
        path.symlink_to(what)
    elif what is DIR:
        path.mkdir()
    elif what is FIFO:
        os.mkfifo(path)
    else:
        path.write_bytes(what if isinstance(what, bytes) else what.SerializeToString())
    return path


WEIGHTS = np.ones(12, np.float32).tobytes()  # the external w [4,3]


def external(location, raw_data=b"", data_location=TensorProto.EXTERNAL, **entries):
    """The tensor w [4,3] with its data in `location` (no location entry when None) and the given entries."""
    w = tensor("w", [4, 3], data_location=data_location)
    if raw_data:
        w.raw_data = raw_data
    for key, value in {**({} if location is None else {"location": location}), **entries}.items():
        w.external_data.add(key=key, value=str(value))
    return w


def external_data_cases(work: Path):
    """MatMul(x, w) with w's external data in hostile places; each model in its own folder."""
    good = {"w.bin": WEIGHTS}
    specs = [  # (what, w, files in the model's folder, when)
        ("weights next to the model", external("w.bin"), good, "legal"),
        ("location 'sub/../w.bin'", external("sub/../w.bin"), good, "legal"),
        ("a symlink to a file inside the folder", external("w.bin"), {"w.bin": Link("data/real.bin"),
                                                                      "data/real.bin": WEIGHTS}, "legal"),
        ("location '../../../../etc/passwd'", external("../../../../etc/passwd"), {}, "load"),
        ("location '/etc/passwd'", external("/etc/passwd"), {}, "load"),
        ("a symlink to /etc/passwd", external("w.bin"), {"w.bin": Link("/etc/passwd")}, "load"),
        ("a symlink to /dev/zero", external("w.bin"), {"w.bin": Link("/dev/zero")}, "load"),
        ("a symlink to a file beside the folder", external("w.bin"), {"w.bin": Link("../outside.bin")}, "load"),
        ("a symlinked folder leaving the folder", external("up/outside.bin"), {"up": Link("..")}, "load"),
        ("a location through a symlink loop", external("loop/w.bin"), {"loop": Link("loop")}, "load"),
        ("location naming a folder", external("sub"), {"sub": DIR}, "load"),  # even for simulate: docs/loading.md
        ("location '.'", external("."), {}, "load"),
        ("location naming a FIFO", external("fifo.bin"), {"fifo.bin": FIFO}, "load"),
        ("location naming a dangling symlink", external("w.bin"), {"w.bin": Link("nowhere.bin")}, "data"),
        ("a missing file", external("nope.bin"), {}, "data"),
        ("a file of 20 bytes for 48", external("w.bin"), {"w.bin": WEIGHTS[:20]}, "data"),
        ("offset past the file's end", external("w.bin", offset=1000), good, "data"),
        ("offset 2^63-1", external("w.bin", offset=2 ** 63 - 1), good, "data"),
        ("offset -1", external("w.bin", offset=-1), good, "data"),
        ("offset 'abc'", external("w.bin", offset="abc"), good, "data"),
        ("offset ''", external("w.bin", offset=""), good, "data"),
        ("offset 10^20", external("w.bin", offset=10 ** 20), good, "data"),
        ("length past the file's end", external("w.bin", length=1000), good, "data"),
        ("length 8 for 48 bytes", external("w.bin", length=8), good, "data"),
        ("length -5", external("w.bin", length=-5), good, "never"),
        ("the model file itself as the weights", external("model.onnx", offset=0, length=48), {}, "never"),
        ("location with a newline", external("w\n.bin"), good, "load"),
        ("location with a NUL", external("\x00w.bin"), good, "load"),
        ("location ''", external(""), good, "load"),
        ("no location entry", external(None), good, "load"),
        ("a 5000-character location", external("a" * 5000), {}, "load"),
        ("both raw_data and external data", external("w.bin", raw_data=WEIGHTS), good, "never"),
        ("a location but data_location DEFAULT", external("w.bin", data_location=TensorProto.DEFAULT), good, "load"),
    ]
    place(work / "ext" / "outside.bin", WEIGHTS)
    cases = []
    for k, (what, w, files, when) in enumerate(specs):
        for name, what_file in files.items():
            place(work / "ext" / str(k) / name, what_file)
        path = save_model(work / "ext" / str(k) / "model.onnx", one_op("MatMul", ["x", "w"], [w]))
        cases += graph_commands(f"external data: {what}", path, when, work)
    leaving = model([node("Constant", [], ["c"], value=external("../../../../etc/passwd")), node("MatMul", ["x", "c"])])
    cases += graph_commands("external data: a Constant's value leaving the folder",
                            save_model(work / "ext" / "constant" / "model.onnx", leaving), "load", work)
    return cases


GPT_DATA = REPO / "testdata/gpt/test_data_set_0"
GPT_PLANS = {  # the plans token ids go through: a vocab-parallel lookup must refuse what one device refuses
    "one device": ["--mesh", "1"],
    "data parallel": ["--mesh", "2x2", "--shardings", str(REPO / "testdata/gpt/gpt.dp.sharding.json")],
    "Megatron": ["--mesh", "2x2", "--shardings", str(REPO / "testdata/gpt/gpt.megatron.sharding.json")],
}


def folder(path: Path, files):
    """The folder `path` holding `files` (name -> what place() makes)."""
    path.mkdir(parents=True)
    for name, what in files.items():
        place(path / name, what)
    return path


def ids_pb(values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype), "input_ids")


def broken_input_files(rng, ids, good_pb):
    """(what, files of --inputs DIR) that the GPT must refuse: wrong dtypes, shapes, bytes and layouts."""
    cases = [(f"ids as {np.dtype(t).name}", ids_pb(ids, t))
             for t in (np.int32, np.int16, np.int8, np.uint8, np.uint64, np.float16, np.float32, np.float64, np.bool_)]
    cases += [(f"ids of shape {list(s)}", ids_pb(np.resize(ids, s))) for s in
              [(512,), (8, 64, 1), (), (8, 65), (4, 64), (16, 64), (0, 64), (8, 0), (1, 8, 64)]]
    cases += [(f"input_0.pb truncated at {c}", good_pb[:c]) for c in (1, 2, 5, 10, 20, 100, 1000, len(good_pb) - 1)]
    cases += [(f"input_0.pb of {n} random bytes", bytes(rng.randrange(256) for _ in range(n))) for n in (7, 4096)]
    cases += [
        ("an empty input_0.pb", b""),
        ("the model as input_0.pb", MODEL.read_bytes()),
        ("the expected logits as input_0.pb", (GPT_DATA / "output_0.pb").read_bytes()),
        ("a SequenceProto of the ids", helper.make_sequence("input_ids", 1, [ids_pb(ids)])),
        ("string ids", tensor("input_ids", [8, 64], TensorProto.STRING, string_data=[b"1"] * 512)),
        ("ids with 10 bytes of raw_data", tensor("input_ids", [8, 64], I64, raw_data=bytes(10))),
        ("ids with 5 of 512 int64_data", tensor("input_ids", [8, 64], I64, int64_data=[1] * 5)),
        ("ids of dim -8", tensor("input_ids", [-8, 64], I64)),
        ("ids of 2^80 elements", tensor("input_ids", [2 ** 40, 2 ** 40], I64)),
        ("ids whose dims overflow int64", tensor("input_ids", [2 ** 32] * 3, I64)),
        ("ids of element type 0", tensor("input_ids", [8, 64], 0, raw_data=ids.tobytes())),
        ("ids of element type 99", tensor("input_ids", [8, 64], 99, raw_data=ids.tobytes())),
        ("segmented ids", tensor("input_ids", [8, 64], I64, raw_data=ids.tobytes(),
                                 segment=TensorProto.Segment(begin=0, end=1))),
    ]
    for location in ("../../../../etc/passwd", "/etc/passwd", "fifo.bin"):
        t = tensor("input_ids", [8, 64], I64, data_location=TensorProto.EXTERNAL)
        t.external_data.add(key="location", value=location)
        cases.append((f"ids in external data at '{location}'", {"input_0.pb": t, "fifo.bin": FIFO}))
    cases = [(what, files if isinstance(files, dict) else {"input_0.pb": files}) for what, files in cases]
    return cases + [
        ("an extra input_1.pb", {"input_0.pb": good_pb, "input_1.pb": good_pb}),
        ("an extra input_999999999.pb", {"input_0.pb": good_pb, "input_999999999.pb": b""}),
        ("no input_0.pb", {}),
        ("input_0.pb a folder", {"input_0.pb": DIR}),
        ("input_0.pb a FIFO", {"input_0.pb": FIFO}),
        ("input_0.pb a symlink to /dev/zero", {"input_0.pb": Link("/dev/zero")}),
        ("input_0.pb a symlink to /etc/passwd", {"input_0.pb": Link("/etc/passwd")}),
        ("input_0.pb a dangling symlink", {"input_0.pb": Link("nowhere.pb")}),
        ("input_0.pb a symlink loop", {"input_0.pb": Link("input_0.pb")}),
    ]


def token_id_cases(ids, work: Path):
    """Ids out of the vocabulary of 512 (refused, the same way under every plan) and negative ids inside it (legal:
    Gather counts them from the end, and the partitioned run must agree with one device)."""
    cases = []
    for plan, flags in GPT_PLANS.items():
        for k, (v, legal) in enumerate([(512, False), (-513, False), (2 ** 40, False), (-2 ** 40, False),
                                        (2 ** 63 - 1, False), (-2 ** 63, False), (-1, True), (-512, True),
                                        (0, True), (511, True)]):
            bad = ids.copy()
            bad.flat[[(k * 97 + j * 61) % bad.size for j in range(1 if not legal else 10)]] = v
            d = folder(work / "ids" / f"{plan.replace(' ', '_')}_{k}", {"input_0.pb": ids_pb(bad)})
            cases.append(Case(f"token id {v} under {plan}", ["run", str(MODEL), *flags, "--inputs", str(d), "--check"],
                              LEGAL if legal else REFUSE))
        cases.append(Case(f"the test data under {plan}", ["run", str(MODEL), *flags, "--inputs", str(GPT_DATA),
                                                           "--check", "--expected", str(GPT_DATA)], LEGAL))
    return cases


def mlp_model():
    r = np.random.RandomState(0)
    w = lambda name, *shape: const(name, r.randn(*shape) / 4, np.float32)
    return model([node("MatMul", ["x", "w1"], ["a"], "mm1"), node("Add", ["a", "b1"], ["h"], "add1"),
                  node("Relu", ["h"], ["r"]), node("MatMul", ["r", "w2"], ["o"], "mm2"), node("Add", ["o", "b2"])],
                 inputs=[vinfo("x", F, [8, 16])], inits=[w("w1", 16, 32), w("b1", 32), w("w2", 32, 16), w("b2", 16)])


def nonfinite_cases(work: Path):
    """NaN and infinite inputs of a small MLP under --check, on one device, data parallel and Megatron-style: legal,
    and a check compares NaN and infinities equal when both runs have them (docs/cli.md, the report's warnings).
    Only finite sums that overflow may differ in another order: there exit 1 is allowed."""
    d = folder(work / "mlp", {"mlp.onnx": mlp_model()})
    plans = {"one device": ["--mesh", "1"]}
    for plan, tensors in [("data parallel", {"x": ["data", None]}),
                          ("Megatron", {"w1": [None, "data"], "b1": ["data"], "w2": ["data", None]})]:
        (d / f"{plan[0]}.json").write_text(json.dumps({"mesh": {"shape": [2], "axes": ["data"]}, "tensors": tensors}))
        plans[plan] = ["--mesh", "2", "--shardings", str(d / f"{plan[0]}.json")]
    x = np.random.RandomState(1).randn(8, 16).astype(np.float32)
    inputs = {"NaN everywhere": (np.full_like(x, np.nan), LEGAL), "one NaN": (np.where(x > 2, np.nan, x), LEGAL),
              "+Inf in one element": (np.where(x > 2, np.inf, x), LEGAL), "-0.0 everywhere": (-np.zeros_like(x), LEGAL),
              "+Inf and -Inf in a row": (np.where(x > 1.5, np.inf, np.where(x < -1.5, -np.inf, x)), LEGAL),
              "denormals": (x * np.float32(1e-40), LEGAL), "3e38 everywhere": (np.full_like(x, 3e38), OVERFLOWS)}
    cases = []
    for k, (what, (value, exits)) in enumerate(inputs.items()):
        pb = folder(d / f"in_{k}", {"input_0.pb": numpy_helper.from_array(value, "x")})
        cases += [Case(f"MLP input with {what} under {plan}", ["run", str(d / "mlp.onnx"), *flags, "--inputs", str(pb),
                                                              "--check"], exits) for plan, flags in plans.items()]
    return cases


def expected_cases(rng, work: Path):
    """run --expected DIR against logits of other shapes and values (a mismatch, exit 1: the report's errors are
    null) and against broken files (bad input, exit 2)."""
    logits = numpy_helper.to_array(TensorProto.FromString((GPT_DATA / "output_0.pb").read_bytes()))
    as_pb = lambda a: numpy_helper.from_array(np.asarray(a), "logits")
    differ = {"logits of shape [8,64,511]": np.resize(logits, (8, 64, 511)), "logits of shape [8,64]": logits[..., 0],
              "scalar logits": logits.flat[0], "float64 logits": logits.astype(np.float64),
              "int64 logits": logits.astype(np.int64), "logits + 1": logits + 1, "NaN logits": logits * np.nan}
    broken = {"output_0.pb truncated": as_pb(logits).SerializeToString()[:999],
              "output_0.pb of random bytes": bytes(rng.randrange(256) for _ in range(64)),
              "an empty output_0.pb": b"", "logits of 2^80 elements": tensor("logits", [2 ** 40, 2 ** 40]),
              "output_0.pb a folder": DIR, "output_0.pb a FIFO": FIFO}
    files = [(what, {"output_0.pb": as_pb(a)}, MISMATCH) for what, a in differ.items()]
    files += [("the logits themselves", {"output_0.pb": as_pb(logits)}, LEGAL)]
    files += [(what, {"output_0.pb": f}, REFUSE) for what, f in broken.items()]
    files += [("an extra output_1.pb", {"output_0.pb": as_pb(logits), "output_1.pb": as_pb(logits)}, REFUSE),
              ("no output_0.pb", {}, REFUSE)]
    run = ["run", str(MODEL), "--mesh", "1", "--inputs", str(GPT_DATA), "--expected"]
    cases = [Case(f"--expected with {what}", run + [str(folder(work / "expected" / str(k), f))], exits)
             for k, (what, f, exits) in enumerate(files)]
    return cases + [Case("--expected naming a file", run + [str(GPT_DATA / "output_0.pb")], REFUSE)]


def input_cases(rng, work: Path):
    good_pb = (GPT_DATA / "input_0.pb").read_bytes()
    ids = numpy_helper.to_array(TensorProto.FromString(good_pb))
    run = ["run", str(MODEL), "--mesh", "1", "--inputs"]
    cases = [Case(f"--inputs with {what}", run + [str(folder(work / "inputs" / str(k), files))], REFUSE)
             for k, (what, files) in enumerate(broken_input_files(rng, ids, good_pb))]
    cases.append(Case("--inputs naming a file", run + [str(GPT_DATA / "input_0.pb")], REFUSE))
    return cases + token_id_cases(ids, work) + nonfinite_cases(work) + expected_cases(rng, work)


def path_cases(work: Path):
    """Outputs that cannot or may not be written (read-only, occupied, irregular, inside a file, in /proc, past
    NAME_MAX or PATH_MAX), and input paths past those limits. A refusal must leave everything as it was."""
    m = str(MODEL)
    p = lambda name: str(work / name)
    fifo = lambda name: str(place(work / "fifos" / name, FIFO))  # one each: a case that replaces it spoils no other
    place(work / "victim.txt", b"keep me")
    place(work / "victim2.txt", b"keep me too")
    folder(work / "foreign", {"keep.txt": b"keep me"})
    folder(work / "odd_out", {"device_0.onnx": DIR})
    folder(work / "odd_outputs", {"output_0.pb": DIR})
    folder(work / "empty_out", {})
    for name, what in [("to_foreign", Link("foreign")), ("loop", Link("loop")), ("ro", DIR)]:
        place(work / name, what)
    (work / "ro").chmod(0o555)
    ro = ANY if os.access(work / "ro", os.W_OK) else REFUSE  # root writes it anyway
    long, deep = "n" * 300, "d/" * 2100 + "x"  # past NAME_MAX (255) and PATH_MAX (4096)
    unwritable = {"under a read-only folder": (p("ro/x"), ro), "in /proc/self": ("/proc/self/gspmd-x", REFUSE),
                  "inside a file": (p("victim.txt/x"), REFUSE), "inside a symlink loop": (p("loop/x"), REFUSE),
                  "a 300-character name": (p(long), REFUSE), "past PATH_MAX": (p(deep), REFUSE)}
    cases = []
    for what, (path, exits) in unwritable.items():
        cases += [Case(f"partition -o {what}", ["partition", m, "--mesh", "2", "-o", path], exits),
                  Case(f"partition --annotated-model {what}",
                       ["partition", m, "--mesh", "2", "-o", p("out_a"), "--annotated-model", path], exits),
                  Case(f"run --outputs {what}", ["run", m, "--mesh", "1", "--outputs", path], exits),
                  Case(f"run --report {what}", ["run", m, "--mesh", "1", "--report", path], exits),
                  Case(f"simulate --trace {what}", ["simulate", m, "--mesh", "2", "--trace", path], exits)]
    part = lambda what, exits, *flags: Case(f"partition {what}", ["partition", m, "--mesh", "2", *flags], exits)
    cases += [
        part("-o an existing file", REFUSE, "-o", p("victim.txt")),
        part("-o a folder holding another file", REFUSE, "-o", p("foreign")),
        part("-o a folder holding a folder named device_0.onnx", REFUSE, "-o", p("odd_out")),
        part("-o a symlink to a folder holding another file", REFUSE, "-o", p("to_foreign")),
        part("-o a symlink loop", REFUSE, "-o", p("loop")),
        part("-o a FIFO", REFUSE, "-o", fifo("o")),
        part("-o the current folder", REFUSE, "-o", "."),
        part("-o an empty folder", LEGAL, "-o", p("empty_out")),
        part("-o a name with a newline", LEGAL, "-o", p("new\nline")),
        part("--annotated-model in a missing folder", REFUSE, "-o", p("out_a"), "--annotated-model", p("no/a.onnx")),
        part("--annotated-model inside -o", REFUSE, "-o", p("out_a"), "--annotated-model", p("out_a/a.onnx")),
        part("--annotated-model naming -o", REFUSE, "-o", p("out_a"), "--annotated-model", p("out_a")),
        part("--annotated-model naming a folder", REFUSE, "-o", p("out_a"), "--annotated-model", p("foreign")),
        part("--annotated-model naming a FIFO", ANY, "-o", p("out_a"), "--annotated-model", fifo("annotated")),
        part("--annotated-model naming an existing file", ANY, "-o", p("out_a"), "--annotated-model", p("victim2.txt")),
    ]
    run = lambda what, exits, *flags: Case(f"run {what}", ["run", m, "--mesh", "1", *flags], exits)
    sim = lambda what, exits, *flags: Case(f"simulate {what}", ["simulate", m, "--mesh", "2", *flags], exits)
    cases += [
        run("--outputs naming a file", REFUSE, "--outputs", p("victim.txt")),
        run("--outputs a FIFO", REFUSE, "--outputs", fifo("outputs")),
        run("--outputs a symlink loop", REFUSE, "--outputs", p("loop")),
        run("--outputs a folder holding a folder named output_0.pb", REFUSE, "--outputs", p("odd_outputs")),
        run("--outputs a name with a newline", LEGAL, "--outputs", p("new\nline")),
        run("--outputs fine, --report in a missing folder", REFUSE, "--outputs", p("o1"), "--report", p("no/r.json")),
        run("--report fine, --trace in a missing folder", REFUSE, "--report", p("r.json"), "--trace", p("no/t.json")),
        run("--report naming a folder", REFUSE, "--report", p("foreign")),
        run("--trace naming a folder", REFUSE, "--trace", p("foreign")),
        sim("--report in a missing folder", REFUSE, "--report", p("no/r.json")),
        sim("--report a FIFO", REFUSE, "--report", fifo("report")),
        sim("--report fine, --trace naming a folder", REFUSE, "--report", p("r.json"), "--trace", p("foreign")),
    ]
    for what, path in [("a 300-character name", p(long)), ("past PATH_MAX", p(deep)), ("a symlink loop", p("loop")),
                       ("a FIFO", fifo("read")), ("a folder", p("foreign"))]:  # paths read
        cases += [Case(f"simulate MODEL {what}", ["simulate", path, "--mesh", "2"], REFUSE),
                  sim(f"--shardings {what}", REFUSE, "--shardings", path),
                  sim(f"--target {what}", REFUSE, "--target", path),
                  run(f"--inputs {what}", REFUSE, "--inputs", path),
                  run(f"--expected {what}", REFUSE, "--expected", path),
                  run(f"--program {what}", REFUSE, "--program", path)]
    return cases


def snapshot(root: Path):
    """Every path under `root`, symlinks not followed: its type, and a file's size and modification time."""
    seen, folders = {}, [str(root)]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for e in entries:
                st = e.stat(follow_symlinks=False)
                seen[e.path] = (stat.S_IFMT(st.st_mode),) + ((st.st_size, st.st_mtime_ns) if e.is_file(
                    follow_symlinks=False) else ())
                if e.is_dir(follow_symlinks=False):
                    folders.append(e.path)
    return seen


def remove(paths):
    for path in sorted(paths, key=len):  # a folder before what it held
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


EXITS = {0: "ACCEPTED (exit 0)", 1: "MISMATCH (exit 1)", 2: "REFUSED (exit 2)", 3: "REFUSED (exit 3)",
         4: "INTERNAL ERROR (exit 4)"}


def broken(case, r, before, after, work: Path):
    """How a finished case broke the contract (empty: it kept it)."""
    rc = r.returncode
    if rc < 0:
        return [f"CRASH (signal {-rc})"]
    err = r.stderr.decode("utf-8", "replace")
    found = []
    if rc not in case.exits:
        said = err or r.stdout.decode("utf-8", "replace").strip().split("\n")[-1]
        found.append(f"{EXITS.get(rc, f'EXIT {rc}')}, allowed {sorted(case.exits)}: {said[:300]!r}")
    if rc in (2, 3):
        lines = [x for x in err.split("\n") if x]
        if len(lines) != 1 or not lines[0].startswith("error: "):
            found.append(f"NOT ONE LINE ({len(lines)} lines): {err[:300]!r}")
        shown = lambda paths: [os.path.relpath(x, work) for x in sorted(paths)][:5]
        if left := set(after) - set(before):
            found.append(f"LEFT BEHIND {shown(left)}")
        if changed := [x for x in before if after.get(x) != before[x]]:
            found.append(f"CHANGED OR REMOVED {shown(changed)}")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    a.bin = str(Path(a.bin).resolve())
    rng = random.Random(a.seed)
    work = Path(a.out).resolve() if a.out else Path(tempfile.mkdtemp(prefix="gspmd_bad_inputs_"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    kinds = {"model bytes": model_cases(rng, work), "sharding files": sharding_cases(rng, work),
             "flags": flag_cases(work), "graphs": graph_cases(work), "input tensors": input_cases(rng, work),
             "output paths": path_cases(work)}
    start = time.monotonic()
    bad, summary, broken_cases = [], [], 0
    for kind, cases in kinds.items():
        counts, kind_bad = {}, 0
        for case in (Case(*c) for c in cases):
            before = snapshot(work)
            try:
                r = subprocess.run([a.bin] + case.args, capture_output=True, timeout=20, cwd=work,
                                   env=dict(os.environ, OMP_NUM_THREADS="1"))
            except subprocess.TimeoutExpired:
                r = None
            after = snapshot(work)
            found = broken(case, r, before, after, work) if r else ["HANG (over 20 s)"]
            rc = r.returncode if r else "hang"
            remove(set(after) - set(before))  # a legal input's outputs, or what a broken case left
            counts[rc] = counts.get(rc, 0) + 1
            kind_bad += bool(found)
            broken_cases += bool(found)
            bad += [f"{f}: {kind}: {case.what}\n      $ gspmd-onnx {shlex.join(case.args)}" for f in found]
        summary.append(f"  {kind:15} {len(cases):4} cases, exit codes {dict(sorted(counts.items(), key=str))}, "
                       f"{kind_bad} break the contract")
    print(f"bad inputs: {sum(len(c) for c in kinds.values())} cases in {time.monotonic() - start:.0f} s, "
          f"{broken_cases} break the contract")
    print("\n".join(summary))
    for b in bad:
        print("  " + b)
    if not a.out:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
