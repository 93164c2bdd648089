"""Minimal numpy evaluator for the ONNX ops our test models use (onnx 1.12 has no onnx.reference and there is no
onnxruntime here). Only used by the export scripts to check that an exported graph reproduces the torch output.
Unsupported ops raise NotImplementedError with the op name."""
import math

import numpy as np
import onnx
from onnx import numpy_helper

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _softmax(x, axis):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _slice(x, starts, ends, axes=None, steps=None):
    axes = list(range(len(starts))) if axes is None else [int(a) % x.ndim for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[a] = slice(int(s), int(e), int(st))
    return x[tuple(sl)]


def run(model, feeds, opset=None):
    if opset is None:
        opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env.update(feeds)
    for n in model.graph.node:
        A = _attrs(n)
        x = [env[i] if i else None for i in n.input]
        op = n.op_type
        if op == "Constant":
            r = numpy_helper.to_array(A["value"])
        elif op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "And", "Or"):
            f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
                 "Equal": np.equal, "Less": np.less, "Greater": np.greater, "And": np.logical_and,
                 "Or": np.logical_or}[op]
            r = f(x[0], x[1])
            if op == "Div" and np.issubdtype(x[0].dtype, np.integer):
                r = np.floor_divide(x[0], x[1])
            if op not in ("Equal", "Less", "Greater", "And", "Or"):
                r = r.astype(x[0].dtype)
        elif op == "Sqrt":
            r = np.sqrt(x[0])
        elif op == "Exp":
            r = np.exp(x[0])
        elif op == "Tanh":
            r = np.tanh(x[0])
        elif op == "Neg":
            r = -x[0]
        elif op == "Not":
            r = np.logical_not(x[0])
        elif op == "Erf":
            r = _erf(x[0]).astype(x[0].dtype)
        elif op == "Cast":
            r = x[0].astype(onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[A["to"]])
        elif op == "MatMul":
            r = np.matmul(x[0], x[1])
        elif op == "Gemm":
            a_, b_ = x[0], x[1]
            if A.get("transA", 0):
                a_ = a_.T
            if A.get("transB", 0):
                b_ = b_.T
            r = A.get("alpha", 1.0) * (a_ @ b_)
            if len(x) > 2 and x[2] is not None:
                r = r + A.get("beta", 1.0) * x[2]
            r = r.astype(x[0].dtype)
        elif op == "Gather":
            r = np.take(x[0], x[1], axis=A.get("axis", 0))
        elif op == "Reshape":
            shape = [int(s) for s in x[1]]
            shape = [x[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
            r = x[0].reshape(shape)
        elif op == "Transpose":
            r = np.transpose(x[0], A.get("perm"))
        elif op == "Softmax":
            r = _softmax(x[0], A.get("axis", -1)).astype(x[0].dtype)
        elif op == "Where":
            r = np.where(x[0], x[1], x[2])
        elif op == "ReduceMean":
            axes = A.get("axes") if opset < 18 else (None if len(x) < 2 else [int(i) for i in x[1]])
            r = np.mean(x[0], axis=tuple(axes) if axes is not None else None, keepdims=bool(A.get("keepdims", 1)))
        elif op == "LayerNormalization":
            axis = A.get("axis", -1) % x[0].ndim
            ax = tuple(range(axis, x[0].ndim))
            mu = x[0].mean(axis=ax, keepdims=True)
            var = ((x[0] - mu) ** 2).mean(axis=ax, keepdims=True)
            r = (x[0] - mu) / np.sqrt(var + A.get("epsilon", 1e-5)) * x[1]
            if len(x) > 2 and x[2] is not None:
                r = r + x[2]
            r = r.astype(x[0].dtype)
        elif op == "Shape":
            r = np.array(x[0].shape, dtype=np.int64)
        elif op == "Unsqueeze":
            axes = A["axes"] if opset < 13 else [int(i) for i in x[1]]
            r = x[0]
            for a_ in sorted(int(a) % (x[0].ndim + len(axes)) for a in axes):
                r = np.expand_dims(r, a_)
        elif op == "Squeeze":
            axes = A.get("axes") if opset < 13 else (None if len(x) < 2 else [int(i) for i in x[1]])
            r = np.squeeze(x[0], axis=tuple(axes) if axes is not None else None)
        elif op == "Concat":
            r = np.concatenate(x, axis=A["axis"])
        elif op == "Slice":
            r = _slice(x[0], x[1], x[2], x[3] if len(x) > 3 else None, x[4] if len(x) > 4 else None)
        elif op == "Range":
            r = np.arange(x[0], x[1], x[2]).astype(x[0].dtype)
        elif op == "Expand":
            r = x[0] * np.ones([int(s) for s in x[1]], dtype=x[0].dtype)
        elif op == "ConstantOfShape":
            v = numpy_helper.to_array(A["value"]) if "value" in A else np.zeros(1, np.float32)
            r = np.full([int(s) for s in x[0]], v.reshape(-1)[0], dtype=v.dtype)
        elif op == "Identity":
            r = x[0]
        else:
            raise NotImplementedError(op)
        env[n.output[0]] = np.asarray(r)
    return {o.name: env[o.name] for o in model.graph.output}
