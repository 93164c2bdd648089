#!/usr/bin/python3
"""Export a small BERT-style encoder to ONNX (opset 13 and 17) plus test data and a Megatron sharding sidecar.

Run with Debian's interpreter (it has torch 1.13 / onnx 1.12 / numpy):

    /usr/bin/python3 testdata/bert/export_bert.py                    # regenerates testdata/bert/
    /usr/bin/python3 testdata/bert/export_bert.py --layers 3 --d-model 48 --heads 3 --out /tmp/b

Graph inputs (all int64 [B,S]): input_ids, attention_mask (1 = attend, 0 = padding), token_type_ids.
Graph output: last_hidden_state float32 [B,S,D].
Architecture: wte + wpe(arange(S)) + wtt(token_type_ids) -> ln_emb; N post-LayerNorm blocks
    x = ln_1(x + attn(x));  x = ln_2(x + fc_out(gelu(fc_in(x))))
bidirectional attention with BERT's additive mask (1 - mask[:,None,None,:]) * -10000.
The mask is data (a graph input), so its Unsqueeze/Cast/Sub/Mul chain is NOT constant-folded.

Outputs in --out: <name>_opset13.onnx, <name>_opset17.onnx (do_constant_folding=True), <name>_opset13_nofold.onnx,
test_data_set_0/input_{0,1,2}.pb + output_0.pb, <name>.megatron.sharding.json (mesh 2x2 data/model).
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
    def __init__(self, d, heads):
        super().__init__()
        assert d % heads == 0
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v = Linear(d, d), Linear(d, d), Linear(d, d)
        self.proj = Linear(d, d)

    def forward(self, x, add_mask):
        B, T, D = x.shape

        def split(t):  # [B,T,D] -> [B,H,T,Dh]
            return t.reshape(B, T, self.h, self.dh).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.dh) + add_mask  # + [B,1,1,T]
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, D)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc_in = Linear(d, hidden)
        self.act = nn.GELU()  # exact erf form
        self.fc_out = Linear(hidden, d)

    def forward(self, x):
        return self.fc_out(self.act(self.fc_in(x)))


class Layer(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.attn = Attention(d, heads)
        self.ln_1 = nn.LayerNorm(d, eps=1e-12)
        self.mlp = MLP(d, hidden)
        self.ln_2 = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, add_mask):
        x = self.ln_1(x + self.attn(x, add_mask))
        x = self.ln_2(x + self.mlp(x))
        return x


class Bert(nn.Module):
    def __init__(self, vocab, max_pos, type_vocab, d, heads, hidden, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_pos, d)
        self.wtt = nn.Embedding(type_vocab, d)
        self.ln_emb = nn.LayerNorm(d, eps=1e-12)
        self.layer = nn.ModuleList([Layer(d, heads, hidden) for _ in range(layers)])

    def forward(self, input_ids, attention_mask, token_type_ids):
        T = input_ids.size(1)
        pos = torch.arange(T, dtype=torch.long, device=input_ids.device)
        x = self.ln_emb(self.wte(input_ids) + self.wpe(pos) + self.wtt(token_type_ids))
        add_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for blk in self.layer:
            x = blk(x, add_mask)
        return x


def init_weights(model, std):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln" in name or name.startswith("ln"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.05)
            else:
                p.normal_(0.0, std)


def sharding_files(name, layers, out):
    t = {"input_ids": ["data", None], "attention_mask": ["data", None], "token_type_ids": ["data", None]}
    t.update(sharding_json.megatron_layer_specs("layer.", layers))
    t["wte.weight"] = ["model", None]
    sharding_json.write(os.path.join(out, f"{name}.megatron.sharding.json"), [2, 2], ["data", "model"], t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap, d_model=64, heads=2, vocab=256, batch=4, seq=32)
    ap.add_argument("--type-vocab", type=int, default=2)
    add_export_args(ap, "bert", HERE)
    a = ap.parse_args()
    hidden = a.mlp or 4 * a.d_model
    max_pos = a.max_pos or a.seq
    assert a.seq <= max_pos

    torch.manual_seed(a.seed)
    model = Bert(a.vocab, max_pos, a.type_vocab, a.d_model, a.heads, hidden, a.layers).eval()
    init_weights(model, a.std)
    g = torch.Generator().manual_seed(a.seed + 1)
    B, S = a.batch, a.seq
    ids = torch.randint(0, a.vocab, (B, S), dtype=torch.long, generator=g)
    # Right padding; row 0 unpadded, the others keep between S/2 and S-1 tokens (no all-masked rows).
    lens = [S] + torch.randint(S // 2, S, (B - 1,), generator=g).tolist()
    mask = torch.zeros(B, S, dtype=torch.long)
    types = torch.zeros(B, S, dtype=torch.long)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
        types[b, n // 2:n] = 1 if a.type_vocab > 1 else 0  # second "segment"
    print("valid lengths:", lens)

    expected_names = ["wte.weight", "wpe.weight", "wtt.weight", "ln_emb.weight", "ln_emb.bias"]
    for i in range(a.layers):
        for m in ("ln_1", "ln_2"):
            expected_names += [f"layer.{i}.{m}.weight", f"layer.{i}.{m}.bias"]
        for m in ("q", "k", "v", "proj"):
            expected_names += [f"layer.{i}.attn.{m}.weight", f"layer.{i}.attn.{m}.bias"]
        for m in ("fc_in", "fc_out"):
            expected_names += [f"layer.{i}.mlp.{m}.weight", f"layer.{i}.mlp.{m}.bias"]
    export_all(a, model, [("input_ids", ids), ("attention_mask", mask), ("token_type_ids", types)],
               "last_hidden_state", expected_names, may_fold={"wpe.weight"})
    if not a.no_shardings:
        sharding_files(a.name, a.layers, a.out)
    print("ok:", a.out)


if __name__ == "__main__":
    main()
