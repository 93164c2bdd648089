#!/usr/bin/python3
"""Family 4: old-opset graphs built with onnx.helper: IR version 3, opsets 7, 8 and 9, a small conv net.

    /usr/bin/python3 testdata/corpus/gen_oldopset.py [--only convnet_opset7,...] [--force]

Graph (X float32 [2,3,16,16]; every initializer also listed as a graph input, as IR 3 requires):
    c1 = Conv(X, conv1.weight [8,3,3,3], conv1.bias, pads 1)
    b1 = BatchNormalization(c1, bn1.scale, bn1.bias, bn1.mean, bn1.var, epsilon 1e-5, momentum 0.9, spatial 1 (opsets 7/8;
                                                   BatchNormalization-9 dropped the attribute))
    r1 = Relu(b1)
    d1, d1_mask = Dropout(r1, ratio 0.3)          (the mask output is unused)
    p1 = MaxPool(d1, kernel 2, stride 2)
    u1 = Upsample(p1, nearest, scales [1,1,2,2])   (opsets 7/8: `scales` attribute; opset 9: `scales` input, an
                                                   initializer)
    a1 = Add(u1, r1)
    c2 = Conv(a1, conv2.weight [4,8,3,3], conv2.bias, pads 1)
    y  = Gemm(Flatten(GlobalAveragePool(c2)), fc.weight [4,10], fc.bias [10])
Outputs: y [2,10] and u1 [2,8,16,16]. Reference outputs: a float64 numpy evaluation of the ONNX semantics
(test_data_set_0/output_*.pb); ONNX Runtime's are added by the runner when it accepts the model.
Plans: dp2 (X batch over 2), plan4 = sp4 (X H over 4).
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def conv2d(x, w, b, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return y + b[None, :, None, None]


def reference(x, p):
    x = x.astype(np.float64)
    p = {k: v.astype(np.float64) for k, v in p.items()}
    c1 = conv2d(x, p["conv1.weight"], p["conv1.bias"], 1)
    sh = (1, -1, 1, 1)
    b1 = (c1 - p["bn1.mean"].reshape(sh)) / np.sqrt(p["bn1.var"].reshape(sh) + 1e-5) * p["bn1.scale"].reshape(sh) \
        + p["bn1.bias"].reshape(sh)
    r1 = np.maximum(b1, 0)
    d1 = r1  # Dropout at inference: identity
    n, c, h, w = d1.shape
    p1 = d1.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    u1 = p1.repeat(2, axis=2).repeat(2, axis=3)
    a1 = u1 + r1
    c2 = conv2d(a1, p["conv2.weight"], p["conv2.bias"], 1)
    g = c2.mean(axis=(2, 3))
    y = g @ p["fc.weight"] + p["fc.bias"]
    return [y.astype(np.float32), u1.astype(np.float32)]


def build(opset):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    p = {
        "conv1.weight": rng.normal(0, 0.3, (8, 3, 3, 3)), "conv1.bias": rng.normal(0, 0.1, 8),
        "bn1.scale": 1 + rng.normal(0, 0.1, 8), "bn1.bias": rng.normal(0, 0.1, 8),
        "bn1.mean": rng.normal(0, 0.1, 8), "bn1.var": rng.uniform(0.5, 1.5, 8),
        "conv2.weight": rng.normal(0, 0.2, (4, 8, 3, 3)), "conv2.bias": rng.normal(0, 0.1, 4),
        "fc.weight": rng.normal(0, 0.5, (4, 10)), "fc.bias": rng.normal(0, 0.1, 10),
    }
    p = {k: v.astype(np.float32) for k, v in p.items()}
    inits = dict(p)
    if opset >= 9:
        inits["upsample.scales"] = np.array([1, 1, 2, 2], np.float32)
    nodes = [
        helper.make_node("Conv", ["X", "conv1.weight", "conv1.bias"], ["c1"], name="conv1", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"], ["b1"],
                         name="bn1", epsilon=1e-5, momentum=0.9, **({"spatial": 1} if opset < 9 else {})),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Dropout", ["r1"], ["d1", "d1_mask"], name="dropout1", ratio=0.3),
        helper.make_node("MaxPool", ["d1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        (helper.make_node("Upsample", ["p1", "upsample.scales"], ["u1"], name="up1", mode="nearest") if opset >= 9
         else helper.make_node("Upsample", ["p1"], ["u1"], name="up1", mode="nearest", scales=[1.0, 1.0, 2.0, 2.0])),
        helper.make_node("Add", ["u1", "r1"], ["a1"], name="add1"),
        helper.make_node("Conv", ["a1", "conv2.weight", "conv2.bias"], ["c2"], name="conv2", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], name="fc"),
    ]
    x_info = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 16, 16])
    init_infos = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in inits.items()]
    graph = helper.make_graph(
        nodes, f"convnet_opset{opset}", [x_info] + init_infos,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10]),
         helper.make_tensor_value_info("u1", TensorProto.FLOAT, [2, 8, 16, 16])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, producer_name="gspmd-onnx corpus gen_oldopset.py",
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model, p


def plans(d):
    return {
        "dp2": common.plan_entry(common.write_plan(d, "dp2", [2], ["x"], {"X": ["x", None, None, None]}), [2],
                                 "X batch over 2"),
        "plan4": common.plan_entry(common.write_plan(d, "sp4", [4], ["x"], {"X": [None, None, "x", None]}), [4],
                                   "spatial: X H over 4"),
    }


def main():
    a, only = common.parse_gen_args(__doc__)
    import onnx
    for opset in (7, 8, 9):
        name = f"convnet_opset{opset}"
        if only and name not in only:
            continue
        d = common.model_dir("oldopset", name)
        if common.is_done(d) and not a.force:
            continue
        d.mkdir(parents=True, exist_ok=True)
        model, p = build(opset)
        onnx.save(model, str(d / "model.onnx"))
        x = np.random.default_rng(1).normal(0, 1, (2, 3, 16, 16)).astype(np.float32)
        common.write_test_data(d, [x], reference(x, p), ["X"], ["y", "u1"])
        meta = {"family": "oldopset", "name": name, "model": "convnet", "opset": opset, "ir_version": 3,
                "refs": {"numpy": "test_data_set_0"}, "outputs": ["y", "u1"], "dims": {},
                "inputs": [{"name": "X", "elem_type": 1, "dims": [2, 3, 16, 16]}],
                "op_types": sorted({n.op_type for n in model.graph.node}), "nodes": len(model.graph.node),
                "plans": plans(d)}
        common.write_meta(d, meta)
        common.log(f"{name}: ok")


if __name__ == "__main__":
    main()
