#!/usr/bin/python3
"""Family `llama`: a Llama-style decoder written in Hugging Face's style (issue 27), random init, eval(), exported
by torch with dynamic axes (batch, seq, past) at opsets 14 and 17.

    /usr/bin/python3 testdata/corpus/gen_llama.py [--only a,b] [--opsets 14 17] [--force]

The model (V 128, d_model 64, 4 query heads, 2 KV heads, head_dim 16, SwiGLU d_ff 96, 2 layers):
- RMSNorm (x * rsqrt(mean(x^2) + eps) * w), no biases;
- rotary position embeddings at positions past .. past + seq - 1, computed in forward from the cache's length;
- grouped-query attention: 2 KV heads repeated for 4 query heads (HF's repeat_kv: expand + reshape);
- a causal mask over past + seq keys, built in forward from the lengths;
- SwiGLU MLP: down(silu(gate(x)) * up(x));
- KV cache in and out: inputs past_key_<l> / past_value_<l> [batch, 2, past, 16], outputs present_key_<l> /
  present_value_<l> [batch, 2, past + seq, 16] (the past and this step's keys, concatenated).
Inputs: input_ids int64 [batch, seq], the 2 x L caches; outputs: logits [batch, seq, 128], the 2 x L caches.
Test data: batch 2, seq 5, past 3 (a decode step with a cache: the prefill is past 0).

Also written: generation.json, a greedy generation of 16 tokens by torch from a 4-token prompt (batch 1): the prefill
runs with an empty cache (past 0), then each step feeds the last token and the grown cache, as a server does; the
file holds the prompt and the 16 tokens, the reference for running the same loop through the partitioned files.

Names: llama_dyn_op<opset>. Plans: tp2 / tp4 (Megatron: q, k, v, gate and up split by output columns, o and down by
input rows, over `model`: over 4 the 2 KV heads are split 4 ways) and dp2tp2 (the batch of every input over `data`,
Megatron over `model`, mesh 2x2).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

V, D, H, KV, HD, FF, L = 128, 64, 4, 2, 16, 96, 2
B, S, P = 2, 5, 3
GEN_PROMPT, GEN_TOKENS = [5, 17, 99, 3], 16


def build():
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(d))
            self.eps = eps

        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(var + self.eps) * self.weight

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def repeat_kv(x, n_rep):
        b, kv, s, hd = x.shape
        x = x[:, :, None, :, :].expand(b, kv, n_rep, s, hd)
        return x.reshape(b, kv * n_rep, s, hd)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(D, H * HD, bias=False)
            self.k_proj = nn.Linear(D, KV * HD, bias=False)
            self.v_proj = nn.Linear(D, KV * HD, bias=False)
            self.o_proj = nn.Linear(H * HD, D, bias=False)

        def forward(self, x, cos, sin, mask, past_k, past_v):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, H, HD).transpose(1, 2)
            k = self.k_proj(x).view(b, s, KV, HD).transpose(1, 2)
            v = self.v_proj(x).view(b, s, KV, HD).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
            kk, vv = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
            w = torch.matmul(q, kk.transpose(2, 3)) / (HD ** 0.5) + mask
            w = torch.softmax(w, dim=-1)
            o = torch.matmul(w, vv).transpose(1, 2).reshape(b, s, H * HD)
            return self.o_proj(o), k, v

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(D, FF, bias=False)
            self.up_proj = nn.Linear(D, FF, bias=False)
            self.down_proj = nn.Linear(FF, D, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(D)
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm(D)
            self.mlp = MLP()

        def forward(self, x, cos, sin, mask, pk, pv):
            a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, pk, pv)
            x = x + a
            return x + self.mlp(self.post_attention_layernorm(x)), k, v

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, D)
            self.layers = nn.ModuleList([Layer() for _ in range(L)])
            self.norm = RMSNorm(D)
            self.lm_head = nn.Linear(D, V, bias=False)
            self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD)))

        def forward(self, input_ids, *past):
            s = input_ids.shape[1]
            p = past[0].shape[2]
            pos = torch.arange(p, p + s, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            # query i (position p + i) sees keys 0 .. p + i
            mask = torch.triu(torch.full((s, p + s), float("-inf")), diagonal=p + 1)
            x = self.embed_tokens(input_ids)
            presents = []
            for i, layer in enumerate(self.layers):
                x, k, v = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
                presents += [k, v]
            return (self.lm_head(self.norm(x)), *presents)

    torch.manual_seed(0)
    m = LlamaForCausalLM().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in m.parameters():  # larger than the default init, so that greedy tokens are well separated
            prm.add_(torch.randn(prm.shape, generator=g) * 0.05)
    return m


def names():
    past = [f"past_{kv}_{i}" for i in range(L) for kv in ("key", "value")]
    present = [f"present_{kv}_{i}" for i in range(L) for kv in ("key", "value")]
    return ["input_ids"] + past, ["logits"] + present


def inputs(batch, seq, past, seed=1):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (batch, seq), generator=g)
    caches = [torch.randn(batch, KV, past, HD, generator=g) for _ in range(2 * L)]
    return (ids, *caches)


def generate(m):
    """Greedy generation through the cache, as a server runs the exported step: prefill (past 0), then one token
    per step."""
    import torch
    ids = torch.tensor([GEN_PROMPT])
    past = [torch.zeros(1, KV, 0, HD) for _ in range(2 * L)]
    out = []
    with torch.no_grad():
        for _ in range(GEN_TOKENS):
            logits, *past = m(ids, *past)
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            ids = torch.tensor([[tok]])
    return out


def specs(m):
    """{weight initializer: spec} for Megatron over `model`: the exported MatMul weights are [in, out]."""
    t = {}
    for part, col in (("q_proj", True), ("k_proj", True), ("v_proj", True), ("o_proj", False), ("gate_proj", True),
                      ("up_proj", True), ("down_proj", False)):
        for w, shape, _ in common.weight_of(m, rf"/{part}/", ("MatMul",)):
            if len(shape) == 2:
                t[w] = [None, "model"] if col else ["model", None]
    return t


def plans(m, d):
    in_names, _ = names()
    mt = specs(m)
    if len(mt) != 7 * L:
        raise RuntimeError(f"found {len(mt)} of {7 * L} projection weights: {sorted(mt)}")
    res = {}
    for n in (2, 4):
        res[f"tp{n}"] = common.plan_entry(common.write_plan(d, f"tp{n}", [n], ["model"], mt), [n],
                                          f"Megatron over {n}: heads, KV heads and d_ff split")
    dp = {k: ["data"] + [None] * (1 if k == "input_ids" else 3) for k in in_names}
    res["dp2tp2"] = common.plan_entry(common.write_plan(d, "dp2tp2", [2, 2], ["data", "model"], {**mt, **dp}),
                                      [2, 2], "batch over data, Megatron over model")
    return res


def main():
    a, only = common.parse_gen_args(__doc__, [14, 17])
    in_names, out_names = names()
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    for n in in_names[1:]:
        dyn[n] = {0: "batch", 2: "past"}
    for n in out_names[1:]:
        dyn[n] = {0: "batch", 2: "total"}
    for op in a.opsets:
        name = f"llama_dyn_op{op}"
        if only and name not in only:
            continue
        d = common.model_dir("llama", name)
        if common.is_done(d) and not a.force:
            continue
        m = build()
        meta = common.export_torch_case(d, m, inputs(B, S, P), op, in_names, out_names,
                                        {"family": "llama", "name": name, "model": "llama"}, dynamic_axes=dyn,
                                        plans_fn=plans)
        if meta.get("status", "ok") == "ok" or "error" not in meta:
            (d / "generation.json").write_text(json.dumps({"prompt": GEN_PROMPT, "tokens": generate(m)}) + "\n")
        common.log(f"{name}: {meta.get('status', 'ok')} {meta.get('error', '')}")


if __name__ == "__main__":
    main()
