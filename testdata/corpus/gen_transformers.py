#!/usr/bin/python3
"""Family 2: torch's own transformer modules, random init, eval(), exported at opsets 13 and 17, each with static
shapes and with dynamic_axes (the runner binds the symbolic dims with --dim NAME=V).

    /usr/bin/python3 testdata/corpus/gen_transformers.py [--only a,b] [--opsets 13 17] [--force]

Models (parameters perturbed so no two layers are equal; d_model 64, 4 heads, d_ff 128, 2 layers, dropout 0, batch 4):
- encoder_bf / encoder_sf: nn.TransformerEncoder, batch_first True / False; src [4,16,64] / [16,4,64].
- transformer_bf / transformer_sf: nn.Transformer (2 encoder + 2 decoder layers), src 16 and tgt 8 tokens.
- decoder_causal: a decoder-only LM: Embedding(100) + learned positions, nn.TransformerEncoder (norm_first) with the
  causal mask torch.triu(full((S,S), -inf), 1) built in forward from the input length, Linear head;
  input_ids int64 [4,16]. torch 1.13 exports triu from opset 14 only, so this one is also exported at 14.
Names: <model>[_dyn]_op<opset>. Plans: dp2 (batch dim of every input over 2), plan4 = Megatron MLP over 4 (each
layer's linear1 weight split on d_ff columns, linear2 on d_ff rows; found from the exported MatMul/Gemm nodes).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

D, H, FF, L, B, S, T, V = 64, 4, 128, 2, 4, 16, 8, 100


def perturb(m):
    """nn.TransformerEncoder/Decoder deep-copy one layer, so all layers start equal (and the exporter dedupes their
    weights into Identity nodes): add seeded N(0, 0.05) noise to every parameter so that no two are equal."""
    import torch
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return m


def build(kind):
    m, *rest = _build(kind)
    return (perturb(m), *rest)


def _build(kind):
    import torch
    from torch import nn
    torch.manual_seed(0)
    if kind in ("encoder_bf", "encoder_sf"):
        bf = kind.endswith("bf")
        m = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=bf), L,
                                  enable_nested_tensor=False)
        g = torch.Generator().manual_seed(1)
        src = torch.randn((B, S, D) if bf else (S, B, D), generator=g)
        bd = 0 if bf else 1
        return m.eval(), (src,), ["src"], ["out"], {"src": bd}, {"src": {bd: "batch", 1 - bd: "seq"},
                                                               "out": {bd: "batch", 1 - bd: "seq"}}
    if kind in ("transformer_bf", "transformer_sf"):
        bf = kind.endswith("bf")
        m = nn.Transformer(D, H, L, L, FF, dropout=0.0, batch_first=bf)
        g = torch.Generator().manual_seed(1)
        src = torch.randn((B, S, D) if bf else (S, B, D), generator=g)
        tgt = torch.randn((B, T, D) if bf else (T, B, D), generator=g)
        bd = 0 if bf else 1
        return m.eval(), (src, tgt), ["src", "tgt"], ["out"], {"src": bd, "tgt": bd}, {
            "src": {bd: "batch", 1 - bd: "src_len"}, "tgt": {bd: "batch", 1 - bd: "tgt_len"},
            "out": {bd: "batch", 1 - bd: "tgt_len"}}
    if kind == "decoder_causal":
        class CausalLM(nn.Module):
            def __init__(self):
                super().__init__()
                self.wte = nn.Embedding(V, D)
                self.wpe = nn.Parameter(torch.randn(64, D) * 0.1)
                self.blocks = nn.TransformerEncoder(
                    nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=True), L,
                    enable_nested_tensor=False)
                self.head = nn.Linear(D, V)

            def forward(self, input_ids):
                n = input_ids.shape[1]
                mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
                x = self.wte(input_ids) + self.wpe[:n]
                return self.head(self.blocks(x, mask=mask))

        m = CausalLM()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, V, (B, S), generator=g)
        return m.eval(), (ids,), ["input_ids"], ["logits"], {"input_ids": 0}, {
            "input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    raise ValueError(kind)


def megatron_weights(m):
    """{initializer: spec} splitting linear1 on d_ff (output) and linear2 on d_ff (input) over 'model'."""
    import onnx.helper
    t = {}
    for part, out_side in (("linear1", True), ("linear2", False)):
        for w, shape, node in common.weight_of(m, rf"/{part}/", ("MatMul", "Gemm")):
            if len(shape) != 2:
                continue
            trans_b = node.op_type == "Gemm" and any(a.name == "transB" and onnx.helper.get_attribute_value(a)
                                                     for a in node.attribute)
            # MatMul / Gemm without transB: weight [in, out]; Gemm transB: [out, in]
            split_dim = (1 if out_side else 0) if not trans_b else (0 if out_side else 1)
            spec = [None, None]
            spec[split_dim] = "model"
            t[w] = spec
    return t


def make_plans(batch_dims):
    def plans(m, d):
        gin = common.graph_inputs(m)
        dp = {n: ["x" if k == batch_dims.get(n) else None for k in range(len(dims))] for n, _, dims in gin}
        res = {"dp2": common.plan_entry(common.write_plan(d, "dp2", [2], ["x"], dp), [2], "batch over 2")}
        mt = megatron_weights(m)
        if mt:
            res["plan4"] = common.plan_entry(common.write_plan(d, "megatron4", [4], ["model"], mt), [4],
                                             f"Megatron MLP: {len(mt)} weights over 4")
        return res
    return plans


KINDS = ["encoder_bf", "encoder_sf", "transformer_bf", "transformer_sf", "decoder_causal"]


def main():
    a, only = common.parse_gen_args(__doc__, [13, 17])
    for kind in KINDS:
        # torch exports triu only from opset 14 (Trilu): the decoder also gets opset 14, and its opset-13 export
        # failure stays in the table
        opsets = sorted(set(a.opsets) | {14}) if kind == "decoder_causal" else a.opsets
        for dyn in (False, True):
            for op in opsets:
                name = f"{kind}{'_dyn' if dyn else ''}_op{op}"
                if only and name not in only:
                    continue
                d = common.model_dir("transformers", name)
                if common.is_done(d) and not a.force:
                    continue
                m, args, in_names, out_names, bdims, dyn_axes = build(kind)
                meta = common.export_torch_case(
                    d, m, args, op, in_names, out_names,
                    {"family": "transformers", "name": name, "model": kind},
                    dynamic_axes=dyn_axes if dyn else None, plans_fn=make_plans(bdims))
                common.log(f"{name}: {meta['status']} {meta.get('error', '')}")


if __name__ == "__main__":
    main()
