#!/usr/bin/python3
"""Export a small GPT-style decoder-only model to ONNX (opset 13 and 17) plus test data and sharding sidecars.

Run with Debian's interpreter (it has torch 1.13 / onnx 1.12 / numpy):

    /usr/bin/python3 testdata/gpt/export_gpt.py                      # regenerates testdata/gpt/
    /usr/bin/python3 testdata/gpt/export_gpt.py --layers 3 --d-model 96 --heads 3 --vocab 300 \
        --batch 4 --seq 32 --out /tmp/x                              # same architecture, other sizes

Outputs in --out (default: the directory of this script):
    <name>_opset13.onnx, <name>_opset17.onnx      do_constant_folding=True; same weights, static shapes,
                                                  input `input_ids` int64 [B,S], output `logits` float32 [B,S,V]
    <name>_opset13_nofold.onnx                    do_constant_folding=False (keeps wpe.weight, h.0.attn.mask and
                                                  the constant shape/slice sub-graphs); --nofold-opsets to change
    test_data_set_0/input_0.pb, output_0.pb       ONNX backend-test layout (TensorProto), shared by all files
    <name>.dp.sharding.json                       batch over every device (mesh 2x2)
    <name>.megatron.sharding.json                 Megatron tensor parallel + data parallel (mesh 2x2)
    <name>.2d.sharding.json                       same specs on mesh 4x4
Every file is checked (onnx.checker full_check, strict shape inference, initializer names/values, size) and
evaluated with testdata/tools/np_eval.py against the torch output (max |err| ~3e-6).

Op types of the committed default model (torch 1.13.0a0, onnx 1.12; printed again by every run):
    gpt_opset13.onnx:        Add Constant Div Erf Gather Identity MatMul Mul Pow ReduceMean Reshape Softmax Sqrt Sub
                             Transpose Where
    gpt_opset17.onnx:        Add Constant Div Erf Gather Identity LayerNormalization MatMul Mul Reshape Softmax
                             Transpose Where
    gpt_opset13_nofold.onnx: Add Cast Concat Constant Div Equal Erf Gather Identity MatMul Mul Pow ReduceMean Reshape
                             Slice Softmax Sqrt Sub Transpose Unsqueeze Where
torch 1.13 turns T = input_ids.size(1) into a constant for static shapes, so there is no Shape/Range in any file;
with folding, wpe(arange(T)) becomes an anonymous initializer "onnx::Add_NNN" and the mask "onnx::Where_NNN" (bool).
See testdata/README.md.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.dont_write_bytecode = True
import sharding_json  # noqa: E402
from export_common import Linear, add_export_args, add_model_args, export_all  # noqa: E402


class Attention(nn.Module):
    def __init__(self, d, heads, max_pos):
        super().__init__()
        assert d % heads == 0
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v = Linear(d, d), Linear(d, d), Linear(d, d)
        self.proj = Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(max_pos, max_pos)))

    def forward(self, x):
        B, T, D = x.shape

        def split(t):  # [B,T,D] -> [B,H,T,Dh]
            return t.reshape(B, T, self.h, self.dh).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.dh)
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v)  # [B,H,T,Dh]
        y = y.transpose(1, 2).reshape(B, T, D)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc_in = Linear(d, hidden)
        self.act = nn.GELU()  # exact erf form
        self.fc_out = Linear(hidden, d)

    def forward(self, x):
        return self.fc_out(self.act(self.fc_in(x)))


class Block(nn.Module):
    def __init__(self, d, heads, hidden, max_pos):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, max_pos)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, max_pos, d, heads, hidden, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_pos, d)
        self.h = nn.ModuleList([Block(d, heads, hidden, max_pos) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = Linear(d, vocab, bias=False)

    def forward(self, input_ids):
        T = input_ids.size(1)
        pos = torch.arange(T, dtype=torch.long, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)  # [B,T,D] + [T,D]
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def init_weights(model, std):
    """Deterministic init. Biases and LayerNorm affine params are non-trivial on purpose, so a partitioner that
    drops or mis-shards them produces visibly wrong results."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.05)
            else:
                p.normal_(0.0, std)


def sharding_files(name, layers, out):
    axes = ["data", "model"]
    sharding_json.write(os.path.join(out, f"{name}.dp.sharding.json"), [2, 2], axes,
                        {"input_ids": [["data", "model"], None]})
    t = {"input_ids": ["data", None]}
    t.update(sharding_json.megatron_layer_specs("h.", layers))
    t["wte.weight"] = ["model", None]
    sharding_json.write(os.path.join(out, f"{name}.megatron.sharding.json"), [2, 2], axes, t)
    sharding_json.write(os.path.join(out, f"{name}.2d.sharding.json"), [4, 4], axes, t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap, d_model=128, heads=4, vocab=512, batch=8, seq=64)
    add_export_args(ap, "gpt", HERE)
    a = ap.parse_args()
    hidden = a.mlp or 4 * a.d_model
    max_pos = a.max_pos or a.seq
    assert a.seq <= max_pos

    torch.manual_seed(a.seed)
    model = GPT(a.vocab, max_pos, a.d_model, a.heads, hidden, a.layers).eval()
    init_weights(model, a.std)
    gen = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), dtype=torch.long, generator=gen)

    expected_names = ["wte.weight", "wpe.weight", "lm_head.weight", "ln_f.weight", "ln_f.bias"]
    for i in range(a.layers):
        for m in ("ln_1", "ln_2"):
            expected_names += [f"h.{i}.{m}.weight", f"h.{i}.{m}.bias"]
        for m in ("q", "k", "v", "proj"):
            expected_names += [f"h.{i}.attn.{m}.weight", f"h.{i}.attn.{m}.bias"]
        for m in ("fc_in", "fc_out"):
            expected_names += [f"h.{i}.mlp.{m}.weight", f"h.{i}.mlp.{m}.bias"]
    # With constant folding the exporter folds wpe(arange(T)) (all inputs constant) into an anonymous [T,D]
    # initializer ("onnx::Add_NNN") and mask[:T,:T]==0 into a bool "onnx::Where_NNN"; every other parameter keeps
    # its name. Without folding, h.0.attn.mask is an initializer and later layers' (identical) masks are
    # Identity(h.0.attn.mask).
    export_all(a, model, [("input_ids", ids)], "logits", expected_names, may_fold={"wpe.weight"},
               nofold_buffers={"h.0.attn.mask": model.h[0].attn.mask.numpy()})

    if not a.no_shardings:
        sharding_files(a.name, a.layers, a.out)
    print("ok:", a.out)


if __name__ == "__main__":
    main()
