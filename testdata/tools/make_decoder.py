#!/usr/bin/python3
"""Build a GPT-style decoder directly with onnx.helper (no torch), at any size, plus sharding sidecars.

Used by the benchmarks (bench/) and tests for models too large to export from torch: GPT-3 175B shapes for
`simulate` (weights as external data that is never written), and the host-speed decoder for `run` (random weights
in an external data file).

    /usr/bin/python3 testdata/tools/make_decoder.py --layers 96 --d-model 12288 --heads 96 --vocab 50257 \
        --batch 8 --seq 2048 --weights absent --out /tmp/gpt3          # GPT-3 175B shapes, no weight bytes
    /usr/bin/python3 testdata/tools/make_decoder.py --layers 4 --d-model 1024 --heads 16 --vocab 0 \
        --batch 4 --seq 256 --weights random --out /tmp/dec4           # 107 GFLOP forward, 201 MB of weights

The graph (opset 17, float32 or --dtype bfloat16, pre-LN, names as testdata/gpt/export_gpt.py so the sidecars carry over):
    vocab > 0:  input_ids int64 [B,S] -> Gather(wte) + wpe -> blocks -> LayerNormalization -> MatMul(wte^T) ->
                logits [B,S,V]
    vocab == 0: x float32 [B,S,D] -> blocks -> LayerNormalization -> y [B,S,D] (no embedding or LM head)
    block i:    h.i.in -> LN -> q/k/v = MatMul + Add -> Reshape [B,S,H,Dh] -> Transpose -> MatMul (QK^T) -> Mul
                (1/sqrt(Dh)) -> Add (causal mask) -> Softmax -> MatMul (PV) -> Transpose -> Reshape -> MatMul (proj)
                -> Add (bias) -> Add (residual) = h.i.attn_out -> LN -> MatMul + Add (fc_in) -> GELU (Erf form) ->
                MatMul + Add (fc_out) -> Add (residual) = h.i.out
Forward FLOPs per block: 2*B*S*(4*D*A + 2*D*F) (the weight matmuls; 24*B*S*D^2 when A = D and F = 4D) +
4*B*S^2*A (attention), where A = heads * head_dim is the attention's inner width.

Options for the GSPMD paper's dense LMs (Lingvo's lm/params/synthetic_packed_input.py; bench/paper.py):
--head-dim Dh gives the heads their own width (A = heads * Dh need not be d_model), --gated multiplies the GELU by a
second projection of the LN output (gated GELU, `mlp.fc_gate`, split as `mlp.fc_in`: one more D x F matmul), and
--no-positions drops the learned position embedding `wpe`.

--dtype bfloat16: every float value (weights, inputs, activations, the mask, the constants) in bfloat16, as the
GSPMD paper's runs train (weights as inputs: `simulate --training --trainable '\.(weight|bias)$'`).

--weights absent: every initializer (and the mask) is external data in NAME.bin, which is not written: the model
is shapes only (`simulate` works, `run` says the file is missing). --weights random: N(0, 0.02) weights written to
NAME.bin (seeded), zero biases, LN scale 1. --weights inputs: weights are graph inputs (variables, as in the GSPMD
paper's training step: stored with their annotated 2D sharding and all-gathered where used), the mask written to
NAME.bin (`run` feeds the weights pseudo-random inputs).

Sidecars written next to the model (mesh axes "data" and "model"; --mesh sets the shape, default 2x2):
    NAME.megatron.sharding.json   Megatron tensor parallel on "model", batch on "data"
    NAME.2d.sharding.json         the GSPMD paper's 2D sharding (Xu et al. 2021, section 5.1): activations
                                  [X,-,Y] (X = data, Y = model) at every block boundary, weights [X,Y] / [Y,X],
                                  the embedding (and tied LM head) [Y,-] over the vocabulary
"""
import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sharding_json  # noqa: E402


def bf16_bytes(a):
    """float32 array -> bfloat16 little-endian bytes, rounded to nearest even (as torch and the tool round)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


class Builder:
    def __init__(self, name, weights, rng, dtype="float32"):
        self.ftype = TensorProto.BFLOAT16 if dtype == "bfloat16" else TensorProto.FLOAT
        self.fbytes = 2 if dtype == "bfloat16" else 4
        self.nodes, self.inits, self.weight_inputs = [], [], []
        self.bin_name, self.weights, self.rng = name + ".bin", weights, rng
        self.offset = 0
        self.params = 0  # float elements of all weights (the mask included)
        self.blob = []  # random mode: the bytes of NAME.bin, in order
        self.counter = 0

    def fresh(self, base):
        self.counter += 1
        return f"{base}_{self.counter}"

    def node(self, op, inputs, out=None, **attrs):
        out = out or self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh("n_" + op), **attrs))
        return out

    def inline(self, name, array):
        if array.dtype == np.float32 and self.ftype == TensorProto.BFLOAT16:
            t = helper.make_tensor(name, TensorProto.BFLOAT16, list(array.shape), bf16_bytes(array), raw=True)
        else:
            t = numpy_helper.from_array(array, name)
        self.inits.append(t)
        return name

    def weight(self, name, shape, kind="normal"):
        """A float weight (--dtype): an initializer with external data in NAME.bin (absent or written), or with
        --weights inputs a graph input (a variable, as in a training step). The mask is always an initializer."""
        n = int(np.prod(shape))
        self.params += n
        if self.weights == "inputs" and kind != "mask":
            self.weight_inputs.append(helper.make_tensor_value_info(name, self.ftype, shape))
            return name
        t = TensorProto()
        t.name, t.data_type = name, self.ftype
        t.dims.extend(shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.bin_name), ("offset", str(self.offset)), ("length", str(self.fbytes * n))):
            e = t.external_data.add()
            e.key, e.value = k, v
        if self.weights == "random" or kind == "mask":
            if kind == "normal":
                a = self.rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
            elif kind == "ones":
                a = np.ones(n, dtype=np.float32)
            elif kind == "mask":
                s = shape[0]
                a = np.triu(np.full((s, s), -1e9, dtype=np.float32), 1).reshape(-1)
            else:
                a = np.zeros(n, dtype=np.float32)
            self.blob.append(bf16_bytes(a) if self.fbytes == 2 else a.astype("<f4").tobytes())
        self.offset += self.fbytes * n
        self.inits.append(t)
        return name


def build(args):
    B, S, D, H, V, L = args.batch, args.seq, args.d_model, args.heads, args.vocab, args.layers
    F = args.mlp or 4 * D
    assert args.head_dim or D % H == 0, "--d-model must be a multiple of --heads (or give --head-dim)"
    Dh = args.head_dim or D // H
    A = H * Dh  # the attention's inner width (q, k, v features; Lingvo's 128B has 128 x 128 against d_model 8192)
    b = Builder(args.name, args.weights, np.random.default_rng(args.seed), args.dtype)
    shape_bshd = b.inline("shape_bshd", np.array([B, S, H, Dh], dtype=np.int64))
    shape_bsa = b.inline("shape_bsa", np.array([B, S, A], dtype=np.int64))
    scale = b.inline("attn_scale", np.array(1.0 / math.sqrt(Dh), dtype=np.float32))
    sqrt2 = b.inline("sqrt2", np.array(math.sqrt(2.0), dtype=np.float32))
    one = b.inline("one", np.array(1.0, dtype=np.float32))
    half = b.inline("half", np.array(0.5, dtype=np.float32))
    mask = b.weight("attn_mask", [S, S], "mask")

    if V > 0:
        inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, S])]
        wte = b.weight("wte.weight", [V, D])
        if args.no_positions:
            x = b.node("Gather", [wte, "input_ids"], "h.0.in")
        else:
            x = b.node("Add", [b.node("Gather", [wte, "input_ids"]), b.weight("wpe.weight", [S, D])], "h.0.in")
    else:
        inputs = [helper.make_tensor_value_info("x", b.ftype, [B, S, D])]
        x = "x"

    def ln(v, p):
        return b.node("LayerNormalization", [v, b.weight(p + ".weight", [D], "ones"), b.weight(p + ".bias", [D], "zero")],
                      axis=-1, epsilon=1e-5)

    def linear(v, p, n_in, n_out):
        return b.node("Add", [b.node("MatMul", [v, b.weight(p + ".weight", [n_in, n_out])]),
                              b.weight(p + ".bias", [n_out], "zero")])

    for i in range(L):
        p = f"h.{i}."
        a = ln(x, p + "ln_1")
        heads = {}
        for m, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            t = b.node("Reshape", [linear(a, p + f"attn.{m}", D, A), shape_bshd])
            heads[m] = b.node("Transpose", [t], perm=perm)
        s = b.node("Mul", [b.node("MatMul", [heads["q"], heads["k"]]), scale])
        pr = b.node("Softmax", [b.node("Add", [s, mask])], axis=-1)
        ctx = b.node("Reshape", [b.node("Transpose", [b.node("MatMul", [pr, heads["v"]])], perm=[0, 2, 1, 3]),
                                 shape_bsa])
        x = b.node("Add", [x, linear(ctx, p + "attn.proj", A, D)], p + "attn_out")
        a = ln(x, p + "ln_2")
        f = linear(a, p + "mlp.fc_in", D, F)
        g = b.node("Mul", [b.node("Mul", [f, half]), b.node("Add", [b.node("Erf", [b.node("Div", [f, sqrt2])]), one])])
        if args.gated:
            g = b.node("Mul", [g, linear(a, p + "mlp.fc_gate", D, F)])
        x = b.node("Add", [x, linear(g, p + "mlp.fc_out", F, D)], p + "out" if i + 1 < L else "h.last")
    y = ln(x, "ln_f")
    if V > 0:
        wte_t = b.node("Transpose", ["wte.weight"], perm=[1, 0])
        out = b.node("MatMul", [y, wte_t], "logits")
        outputs = [helper.make_tensor_value_info("logits", b.ftype, [B, S, V])]
    else:
        out = b.node("Identity", [y], "y")
        outputs = [helper.make_tensor_value_info("y", b.ftype, [B, S, D])]
    del out
    graph = helper.make_graph(b.nodes, args.name, inputs + b.weight_inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_decoder.py")
    model.ir_version = 8
    return model, b, F


def sidecars(args, F):
    L, mesh = args.layers, [int(s) for s in args.mesh.split("x")]
    axes = ["data", "model"]
    first = {"input_ids": ["data", None]} if args.vocab > 0 else {"x": ["data", None, None]}
    meg = dict(first)
    meg.update(sharding_json.megatron_layer_specs("h.", L))
    if args.gated:
        for i in range(L):
            meg[f"h.{i}.mlp.fc_gate.weight"], meg[f"h.{i}.mlp.fc_gate.bias"] = [None, "model"], ["model"]
    sharding_json.write(os.path.join(args.out, args.name + ".megatron.sharding.json"), mesh, axes, meg)
    # The paper's 2D sharding: activations [X, -, Y] at block boundaries, weights split over both axes, X on the
    # model dimension D, Y on the heads / hidden dimension.
    t2 = {}
    if args.vocab > 0:
        t2["input_ids"] = ["data", None]
        t2["wte.weight"] = ["model", None]  # vocab over Y: the embedding and the LM head (logits [X, -, Y])
        t2["h.0.in"] = ["data", None, "model"]
    else:
        t2["x"] = ["data", None, "model"]
    for i in range(L):
        p = f"h.{i}."
        for m in ("q", "k", "v"):
            t2[p + f"attn.{m}.weight"] = ["data", "model"]
            t2[p + f"attn.{m}.bias"] = ["model"]
        t2[p + "attn.proj.weight"] = ["model", "data"]
        t2[p + "mlp.fc_in.weight"] = ["data", "model"]
        t2[p + "mlp.fc_in.bias"] = ["model"]
        if args.gated:
            t2[p + "mlp.fc_gate.weight"], t2[p + "mlp.fc_gate.bias"] = ["data", "model"], ["model"]
        t2[p + "mlp.fc_out.weight"] = ["model", "data"]
        t2[p + "attn_out"] = ["data", None, "model"]
        t2[p + "out" if i + 1 < L else "h.last"] = ["data", None, "model"]
    sharding_json.write(os.path.join(args.out, args.name + ".2d.sharding.json"), mesh, axes, t2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp", type=int, default=0, help="hidden size of the MLP (default 4*d)")
    ap.add_argument("--head-dim", type=int, default=0, help="width of one head (default d / heads)")
    ap.add_argument("--gated", action="store_true", help="gated GELU: gelu(x W_in) * (x W_gate)")
    ap.add_argument("--no-positions", action="store_true", help="no learned position embedding")
    ap.add_argument("--vocab", type=int, default=512, help="0: float input x [B,S,D], no embedding and no head")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--weights", choices=["absent", "random", "inputs"], default="absent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the type of every float value (weights, activations, the mask and constants)")
    ap.add_argument("--mesh", default="2x2", help="mesh shape written into the sidecars")
    ap.add_argument("--name", default="decoder")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, b, F = build(args)
    path = os.path.join(args.out, args.name + ".onnx")
    onnx.save_model(model, path)
    if args.weights != "absent":
        with open(os.path.join(args.out, b.bin_name), "wb") as f:
            for chunk in b.blob:
                f.write(chunk)
        onnx.checker.check_model(path)
    # The checker wants the external file; without it, strict shape inference checks the graph.
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    sidecars(args, F)
    n_params = b.params
    D, S, T = args.d_model, args.seq, args.batch * args.seq
    A = args.heads * (args.head_dim or D // args.heads)
    flops = args.layers * (2 * T * (4 * D * A + (3 if args.gated else 2) * D * F) + 4 * T * S * A)
    if args.vocab > 0:
        flops += 2 * T * D * args.vocab
    print(f"{path}: {len(model.graph.node)} nodes, {n_params / 1e9:.3f} G parameters (mask included), "
          f"{flops / 1e9:.1f} GFLOP forward (matmuls), weights {args.weights}")


if __name__ == "__main__":
    main()
