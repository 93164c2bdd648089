#!/usr/bin/python3
"""Small models for the `run --training --check` tests (tests/e2e/training_test.cc), exported at test time with
random weights (nothing generated is committed; the tests cache the export under build/e2e-scratch/).

Run with Debian's interpreter (torch 1.13, torchvision 0.14, onnx 1.12, numpy):

    /usr/bin/python3 testdata/training/export_models.py --model vit --out DIR
    /usr/bin/python3 testdata/training/export_models.py --model moe --out DIR
    /usr/bin/python3 testdata/training/export_models.py --model moe4 --out DIR

vit: torchvision.models.vision_transformer.VisionTransformer(image_size 32, patch_size 8, 2 layers, 4 heads,
     hidden 64, MLP 128, 10 classes), input `input` float32 [4, 3, 32, 32], output `logits` [4, 10]; opset 13,
     do_constant_folding=False, so that every parameter keeps its torch name (folding would transpose the Linear
     weights into anonymous initializers). Every parameter gets N(0, 0.05) noise: torch initialises the LayerNorms
     to ones and zeros, and the exporter would dedupe equal initializers into Identity nodes.
     Writes DIR/vit.onnx and two sharding files (mesh 2x2, axes data, model):
       data.plan.json      the batch over (data, model): data parallel over 4 devices
       megatron.plan.json  the batch over data; in every encoder layer the MLP's first Linear (mlp.0, torch weight
                           [out, in]) column-split: weight ["model", null], bias ["model"]; the second (mlp.3)
                           row-split: weight [null, "model"] (Shoeybi et al. 2019)
moe: testdata/corpus/gen_moe.py's GShard top-2 MoE LM (its model code, einsum form) at small sizes: G 4, S 8, M 16,
     H 32, E 4 (C = 2S/E = 4), vocab 32, 2 heads; opset 13. Writes DIR/moe.onnx and gen_moe.plans()'s sharding
     files: expert4.plan.json (plan (a): mesh 4, axis expert: G and E over it, with GShard's dispatch/combine
     annotations), expert_data.plan.json (b), expert_model.plan.json (c), dp2.plan.json.
moe4: the same with 4 blocks (dense, MoE, dense, MoE) and N(0, 0.05) noise on every parameter (as vit), for
     --pipeline (tests/e2e/pipeline_cli_test.cc). Writes DIR/moe4.onnx and stage_expert.plan.json: mesh 2x2 (stage,
     expert), input_ids G over expert, and in every MoE layer wi and wo E over expert with GShard's dispatch and
     combine annotations (plan (a)'s).

Both write DIR/test_data_set_0/input_0.pb (the input) and output_0.pb (torch's output), and print one line.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True
import onnx  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))
import common  # noqa: E402  (testdata/corpus: .pb and sharding-file writers)


def vit(out):
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    layers = 2
    m = VisionTransformer(image_size=32, patch_size=8, num_layers=layers, num_heads=4, hidden_dim=64, mlp_dim=128,
                          num_classes=10)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    m.eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    path = os.path.join(out, "vit.onnx")
    # not under no_grad: there nn.MultiheadAttention takes its fused fast path, which has no ONNX export
    torch.onnx.export(m, (x,), path, opset_version=13, do_constant_folding=False, input_names=["input"],
                      output_names=["logits"])
    with torch.no_grad():
        y = m(x)
    names = {t.name for t in onnx.load(path).graph.initializer}
    megatron = {"input": ["data", None, None, None]}
    for k in range(layers):
        p = f"encoder.layers.encoder_layer_{k}.mlp."
        megatron.update({p + "0.weight": ["model", None], p + "0.bias": ["model"], p + "3.weight": [None, "model"]})
    missing = sorted(set(megatron) - names - {"input"})
    if missing:
        sys.exit(f"error: not initializers of the exported ViT: {missing}")
    common.write_plan(Path(out), "data", [2, 2], ["data", "model"], {"input": [["data", "model"], None, None, None]})
    common.write_plan(Path(out), "megatron", [2, 2], ["data", "model"], megatron)
    return path, "input", x, y


def moe(out, layers=2):
    import gen_moe
    gen_moe.G, gen_moe.S, gen_moe.M, gen_moe.H, gen_moe.E, gen_moe.V, gen_moe.NH = 4, 8, 16, 32, 4, 32, 2
    gen_moe.C = 2 * gen_moe.S // gen_moe.E
    gen_moe.EINSUM = True
    gen_moe.LAYERS = layers
    m, ids = gen_moe.build()
    if layers != 2:  # as vit: no equal LayerNorm initializers for the exporter to dedupe into Identity nodes
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    path = os.path.join(out, "moe.onnx" if layers == 2 else f"moe{layers}.onnx")
    torch.onnx.export(m, (ids,), path, opset_version=13, do_constant_folding=True, input_names=["input_ids"],
                      output_names=["logits"])
    with torch.no_grad():
        y = m(ids)
    if layers == 2:
        gen_moe.plans(onnx.load(path), Path(out))
    else:  # a pipeline over `stage`; in every MoE layer GShard's plan (a) over `expert` (gen_moe.plans)
        moe = {"input_ids": ["expert", None]}
        split = ["expert", None, None, None]
        for k in range(1, layers, 2):
            p = f"/h.{k}/moe/"
            moe.update({f"h.{k}.moe.wi": ["expert", None, None], f"h.{k}.moe.wo": ["expert", None, None],
                        p + "Cast_8_output_0": split, p + "Einsum_1_output_0": split,  # dispatch: G, then E split
                        p + "Add_3_output_0": split, p + "Reshape_1_output_0": split})  # combine: G and E split
        names = {v for n in onnx.load(path).graph.node for v in n.output}
        missing = sorted(v for v in moe if v.startswith("/") and v not in names)
        if missing:
            sys.exit(f"error: not values of the exported MoE LM: {missing}")
        common.write_plan(Path(out), "stage_expert", [2, 2], ["stage", "expert"], moe)
    return path, "input_ids", ids, y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["vit", "moe", "moe4"], required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    path, input_name, x, y = {"vit": vit, "moe": moe, "moe4": lambda out: moe(out, 4)}[a.model](a.out)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    common.write_pb(Path(a.out) / "test_data_set_0" / "input_0.pb", x.numpy(), input_name)
    common.write_pb(Path(a.out) / "test_data_set_0" / "output_0.pb", y.detach().numpy(), "logits")
    print(f"ok: {path} ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
