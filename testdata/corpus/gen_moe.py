#!/usr/bin/python3
"""Family 3: a GShard top-2-gating mixture-of-experts LM (Lepikhin et al. 2020, arXiv:2006.16668, Algorithm 1 and
section 3.2), written in torch, random init, exported at opsets 13 and 17.

    /usr/bin/python3 testdata/corpus/gen_moe.py [--only moe_op13,...] [--opsets 13 17] [--force]

Model: input_ids int64 [G, S] (G groups of S tokens: each group is one sequence); token embedding + learned
positions; block 0 = causal self-attention + dense MLP, block 1 = causal self-attention + MoE layer (GShard
alternates dense and MoE feed-forward layers; LAYERS blocks, even ones dense, odd ones MoE); final LayerNorm; LM head. G 8, S 16, M (d_model) 32, H (expert
hidden) 64, E 4 experts, C = 2*S/E = 8, vocab 64, 4 heads.

MoE layer (inference: no auxiliary loss, no random routing of the second expert, both deterministic):
    gates   = softmax(einsum("gsm,me->gse", x, wg))
    index_1 = argmax(gates); mask_1 = one_hot(index_1, E)
    index_2 = argmax(gates * (1 - mask_1)); mask_2 = one_hot(index_2, E)
    gate_1, gate_2 = sum(gates * mask_k, -1), renormalised by gate_1 + gate_2
    position_in_expert_1 = cumsum(mask_1, dim S) - 1; mask_1 *= position_in_expert_1 < C
    position_in_expert_2 = cumsum(mask_2, dim S) - 1 + sum_S(mask_1); mask_2 *= position_in_expert_2 < C
    combine[g,s,e,c] = gate_1 * mask_1[e] * one_hot(pos_1, C)[c] + gate_2 * mask_2[e] * one_hot(pos_2, C)[c]
    dispatch = combine > 0
    expert_inputs  = einsum("gsec,gsm->egcm", dispatch, x)
    h              = relu(expert_inputs.reshape(E, G*C, M) @ wi)   # experts as batched matmuls: egcm,emh->egch
    expert_outputs = (h @ wo).reshape(E, G, C, M)                  # egch,ehm->egcm
    out            = einsum("gsec,egcm->gsm", combine, expert_outputs)
moe_op<N>: the dispatch, combine and gating contractions are torch.einsum (ONNX Einsum), one_hot is F.one_hot
(ONNX OneHot). moe_mm_op<N>: the same model and weights with those contractions written as matmuls (permute + @,
reshape + @) and one_hot as `index == arange(n)`: no Einsum, no OneHot.

Plans (docs/sharding-file.md):
- dp2:        input_ids G over 2 (mesh 2, axis data).
- plan4 = (a) expert4: groups and experts over the same axis (mesh 4, axis expert): input_ids G over expert, wi and
              wo E over expert; on the einsum form also GShard's annotations (dispatch / combine masks G over
              expert, expert inputs / outputs E over expert): exactly one all-to-all per dispatch and per combine
              einsum, checked by the runner.
- (b) expert_data: mesh 2x2 (data, expert): input_ids G over (data, expert), wi/wo E over expert.
- (c) expert_model: mesh 2x2 (expert, model): input_ids G over expert, wi [E, M, H] as [expert, -, model], wo
      [E, H, M] as [expert, model, -] (Megatron inside each expert).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

G, S, M, H, E, V, NH = 8, 16, 32, 64, 4, 64, 4
C = 2 * S // E
LAYERS = 2  # blocks, alternating dense (even) and MoE (odd)


EINSUM = True


def build():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(M, 3 * M)
            self.proj = nn.Linear(M, M)

        def forward(self, x):
            g, s, _ = x.shape
            q, k, v = self.qkv(x).split(M, dim=-1)
            q, k, v = (t.reshape(g, s, NH, M // NH).transpose(1, 2) for t in (q, k, v))
            # causal mask from aranges (torch exports triu only from opset 14; this must export at 13)
            mask = torch.arange(s)[None, :] > torch.arange(s)[:, None]
            att = (q @ k.transpose(-2, -1)) / (M // NH) ** 0.5
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            return self.proj((att @ v).transpose(1, 2).reshape(g, s, M))

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.wg = nn.Parameter(torch.randn(M, E) * 0.5)
            self.wi = nn.Parameter(torch.randn(E, M, H) * M ** -0.5)
            self.wo = nn.Parameter(torch.randn(E, H, M) * H ** -0.5)

        def forward(self, x):  # x [G, S, M]
            one_hot = F.one_hot if EINSUM else (lambda t, n: (t.unsqueeze(-1) == torch.arange(n)).long())
            gates = (torch.einsum("gsm,me->gse", x, self.wg) if EINSUM else x @ self.wg).softmax(-1)
            index_1 = gates.argmax(-1)
            mask_1 = one_hot(index_1, E).to(x.dtype)
            index_2 = (gates * (1.0 - mask_1)).argmax(-1)
            mask_2 = one_hot(index_2, E).to(x.dtype)
            gate_1 = (gates * mask_1).sum(-1)
            gate_2 = (gates * mask_2).sum(-1)
            denom = gate_1 + gate_2 + 1e-9
            gate_1, gate_2 = gate_1 / denom, gate_2 / denom
            pos_1 = torch.cumsum(mask_1, dim=1) - 1.0
            mask_1 = mask_1 * (pos_1 < C).to(x.dtype)
            pos_1 = (pos_1 * mask_1).sum(-1)
            count_1 = mask_1.sum(dim=1, keepdim=True)
            pos_2 = torch.cumsum(mask_2, dim=1) - 1.0 + count_1
            mask_2 = mask_2 * (pos_2 < C).to(x.dtype)
            pos_2 = (pos_2 * mask_2).sum(-1)
            gate_1 = gate_1 * mask_1.sum(-1)
            gate_2 = gate_2 * mask_2.sum(-1)
            combine = (gate_1[:, :, None, None] * mask_1[:, :, :, None] *
                       one_hot(pos_1.long(), C).to(x.dtype)[:, :, None, :] +
                       gate_2[:, :, None, None] * mask_2[:, :, :, None] *
                       one_hot(pos_2.long(), C).to(x.dtype)[:, :, None, :])  # [G, S, E, C]
            dispatch = (combine > 0).to(x.dtype)
            g, s, _ = x.shape
            if EINSUM:
                expert_inputs = torch.einsum("gsec,gsm->egcm", dispatch, x)
            else:  # the same contraction as batched matmuls: [g,e,c,s] @ [g,1,s,m] -> [g,e,c,m] -> [e,g,c,m]
                expert_inputs = (dispatch.permute(0, 2, 3, 1) @ x.unsqueeze(1)).permute(1, 0, 2, 3)
            # experts as batched matmuls, egcm,emh->egch: [e,g*c,m] @ [e,m,h] (3-D, so that the exporter does not
            # fold an unsqueezed copy of the weight into a new initializer)
            h = torch.relu(expert_inputs.reshape(E, g * C, M) @ self.wi)
            expert_outputs = (h @ self.wo).reshape(E, g, C, M)  # egch,ehm->egcm
            if EINSUM:
                return torch.einsum("gsec,egcm->gsm", combine, expert_outputs)
            # [g,s,e*c] @ [g,e*c,m] -> [g,s,m]
            return combine.reshape(g, s, E * C) @ expert_outputs.permute(1, 0, 2, 3).reshape(g, E * C, M)

    class Block(nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.ln_1 = nn.LayerNorm(M)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(M)
            if moe:
                self.moe = MoE()
            else:
                self.mlp = nn.Sequential(nn.Linear(M, H), nn.ReLU(), nn.Linear(H, M))
            self.is_moe = moe

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            y = self.ln_2(x)
            return x + (self.moe(y) if self.is_moe else self.mlp(y))

    class MoELM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, M)
            self.wpe = nn.Parameter(torch.randn(S, M) * 0.1)
            self.h = nn.ModuleList([Block(k % 2 == 1) for k in range(LAYERS)])
            self.ln_f = nn.LayerNorm(M)
            self.lm_head = nn.Linear(M, V, bias=False)

        def forward(self, input_ids):
            x = self.wte(input_ids) + self.wpe
            for b in self.h:
                x = b(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(0)
    m = MoELM().eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (G, S), generator=g)
    return m, ids


def plans(m, d):
    names = {t.name for t in m.graph.initializer}
    wi, wo = "h.1.moe.wi", "h.1.moe.wo"
    if wi not in names or wo not in names:
        raise RuntimeError(f"expert weights {wi}, {wo} are not initializers of the exported model")
    p = common.plan_entry
    w = common.write_plan
    expert4 = {"input_ids": ["expert", None], wi: ["expert", None, None], wo: ["expert", None, None]}
    # GShard's annotations on the einsum form (arXiv:2006.16668, Algorithm 2): the dispatch and combine masks [G,S,E,C]
    # split by group, the dispatched expert inputs and the expert outputs [E,G,C,M] by expert. The partitioner then
    # makes exactly one all-to-all per dispatch and one per combine einsum (GSPMD's einsum strategies).
    einsums = {n.attribute[0].s.decode(): n for n in m.graph.node if n.op_type == "Einsum"}
    dispatch, combine = einsums.get("gsec,gsm->egcm"), einsums.get("gsec,egcm->gsm")
    if dispatch is not None and combine is not None:
        split_g, split_e = ["expert", None, None, None], ["expert", None, None, None]
        expert4.update({dispatch.input[0]: split_g, dispatch.output[0]: split_e,
                        combine.input[0]: split_g, combine.input[1]: split_e})
    res = {
        "dp2": p(w(d, "dp2", [2], ["data"], {"input_ids": ["data", None]}), [2], "input G over 2"),
        "plan4": p(w(d, "expert4", [4], ["expert"], expert4), [4], "(a) G and E over one axis 'expert' (4)"),
        "expert_data": p(w(d, "expert_data", [2, 2], ["data", "expert"],
                           {"input_ids": [["data", "expert"], None], wi: ["expert", None, None],
                            wo: ["expert", None, None]}), [2, 2], "(b) expert x data 2x2"),
        "expert_model": p(w(d, "expert_model", [2, 2], ["expert", "model"],
                            {"input_ids": ["expert", None], wi: ["expert", None, "model"],
                             wo: ["expert", "model", None]}), [2, 2], "(c) expert x model 2x2 (Megatron in experts)"),
    }
    if dispatch is not None and combine is not None:
        res["plan4"]["collectives"] = {"all-to-all": 2}
    res["expert_data"]["extra"] = True
    res["expert_model"]["extra"] = True
    return res


def main():
    a, only = common.parse_gen_args(__doc__, [13, 17])
    global EINSUM
    for form, op in [(f, o) for f in ("einsum", "mm") for o in a.opsets]:
        name = f"moe_op{op}" if form == "einsum" else f"moe_mm_op{op}"
        if only and name not in only:
            continue
        EINSUM = form == "einsum"
        d = common.model_dir("moe", name)
        if common.is_done(d) and not a.force:
            continue
        m, ids = build()
        meta = common.export_torch_case(d, m, (ids,), op, ["input_ids"], ["logits"],
                                        {"family": "moe", "name": name, "model": f"gshard_moe_lm ({form})",
                                         "config": {"G": G, "S": S, "M": M, "H": H, "E": E, "C": C, "V": V}},
                                        plans_fn=plans)
        common.log(f"{name}: {meta['status']} {meta.get('error', '')}")


if __name__ == "__main__":
    main()
