"""Minimal numpy evaluator for the ONNX ops of the exported CNNs (onnx 1.12 has no onnx.reference and there is no
onnxruntime here; testdata/tools/np_eval.py has no Conv). Computes in float64, so its result is a reference for
the float32 torch output. Only used by export_cnn.py. Unsupported ops raise NotImplementedError with the op name."""
import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import numpy_helper


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _windows(x, kernel, strides, pads, dilations, pad_value):
    """x [N,C,H,W] -> [N,C,Ho,Wo,kh,kw] (a view of the padded input where possible)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=pad_value)
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    return win[:, :, ::sh, ::sw, ::dh, ::dw]


def _conv(x, w, b, A):
    kh, kw = w.shape[2:]
    g = A.get("group", 1)
    win = _windows(x, (kh, kw), A.get("strides", [1, 1]), A.get("pads", [0, 0, 0, 0]),
                   A.get("dilations", [1, 1]), 0.0)
    n, c, ho, wo = win.shape[:4]
    m, cg = w.shape[:2]
    assert c == g * cg and m % g == 0, (x.shape, w.shape, g)
    if g == 1:
        y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    elif cg == 1 and m == g:  # depthwise
        y = np.einsum("ncxykl,ckl->ncxy", win, w[:, 0])
    else:
        mg = m // g
        y = np.concatenate([np.tensordot(win[:, i * cg:(i + 1) * cg], w[i * mg:(i + 1) * mg],
                                         axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2) for i in range(g)], 1)
    if b is not None:
        y = y + b[None, :, None, None]
    return y


def run(model, feeds):
    env = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    env.update({k: np.asarray(v, dtype=np.float64) for k, v in feeds.items()})
    for n in model.graph.node:
        A = _attrs(n)
        x = [env[i] if i else None for i in n.input]
        op = n.op_type
        if op == "Constant":
            r = numpy_helper.to_array(A["value"]).astype(np.float64)
        elif op == "Identity":
            r = x[0]
        elif op == "Add":
            r = x[0] + x[1]
        elif op == "Relu":
            r = np.maximum(x[0], 0.0)
        elif op == "Clip":
            lo = x[1] if len(x) > 1 and x[1] is not None else -np.inf
            hi = x[2] if len(x) > 2 and x[2] is not None else np.inf
            r = np.clip(x[0], lo, hi)
        elif op == "Conv":
            assert A.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"), A
            r = _conv(x[0], x[1], x[2] if len(x) > 2 else None, A)
        elif op == "MaxPool":
            assert A.get("ceil_mode", 0) == 0 and len(n.output) == 1, A
            win = _windows(x[0], A["kernel_shape"], A.get("strides", [1, 1]), A.get("pads", [0, 0, 0, 0]),
                           A.get("dilations", [1, 1]), -np.inf)
            r = win.max(axis=(4, 5))
        elif op == "GlobalAveragePool":
            r = x[0].mean(axis=(2, 3), keepdims=True)
        elif op == "Flatten":
            ax = A.get("axis", 1)
            r = x[0].reshape(int(np.prod(x[0].shape[:ax])), -1)
        elif op == "Gemm":
            a_, b_ = x[0], x[1]
            if A.get("transA", 0):
                a_ = a_.T
            if A.get("transB", 0):
                b_ = b_.T
            r = A.get("alpha", 1.0) * (a_ @ b_)
            if len(x) > 2 and x[2] is not None:
                r = r + A.get("beta", 1.0) * x[2]
        else:
            raise NotImplementedError(op)
        env[n.output[0]] = r
    return {o.name: env[o.name] for o in model.graph.output}
