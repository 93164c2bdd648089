#!/usr/bin/python3
"""Family 1: torchvision 0.14 classification models, random init, eval(), batch 2, exported at opsets 11, 13, 17.

    /usr/bin/python3 testdata/corpus/gen_torchvision.py [--models a,b,...] [--opsets 11 13 17] [--max-mb 360]
                                                         [--include-giant] [--force]

Each (model, opset) goes to build/corpus/models/torchvision/<model>_op<opset>/ (common.py); existing ones are kept.
Input: N(0,1) float32 [2, 3, S, S] with S the smallest size the architecture takes (64 for most; ViTs are built with
image_size=64; inception_v3 75; maxvit_t 224; when an export or the eager run fails at one size the next of
SIZES[model] is tried). Models whose parameters + buffers exceed --max-mb (float32) are skipped and listed in
build/corpus/models/torchvision/skipped.json.

Plans (sharding files): dp2 (input batch over 2), plan4 = sp4 (input H over 4: spatial), and the extra plan ch4
(output channels of the first three conv weights whose count divides by 4, over 4).

At opset 17 each model is also exported with a dynamic batch (`dynamic_axes`), as <model>_dyn_op17, with a batch of
3 in its test data: the runner partitions it without --dim (the batch split over 2 is ceil(batch / 2), uneven at 3)
and runs its device files (docs/shapes.md).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

OPSETS = [11, 13, 17]
SIZES = {"inception_v3": [75, 299], "maxvit_t": [224], "alexnet": [64, 224]}
CTOR_KW = {"vit_b_16": {"image_size": 64}, "vit_b_32": {"image_size": 64}, "vit_l_16": {"image_size": 64},
           "vit_l_32": {"image_size": 64}, "vit_h_14": {"image_size": 70},
           "inception_v3": {"aux_logits": True, "init_weights": True}, "googlenet": {"init_weights": True}}
DEFAULT_SIZES = [64, 224]


def cnn_plans(m, d):
    plans = {"dp2": common.image_plan(d, "dp2", [2], ["x", None, None, None], "input batch over 2"),
             "plan4": common.image_plan(d, "sp4", [4], [None, None, "x", None], "spatial: input H over 4")}
    convs = [(n, s) for n, s, _ in common.conv_weights(m) if s[0] % 4 == 0][:3]
    if convs:
        plans["ch4"] = common.plan_entry(
            common.write_plan(d, "ch4", [4], ["x"], {n: ["x"] + [None] * (len(s) - 1) for n, s in convs}), [4],
            f"channel: out-channels of {len(convs)} conv weights over 4")
        plans["ch4"]["extra"] = True
    return plans


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_torchvision_args(ap, OPSETS, "torchvision")
    a = ap.parse_args()

    import torch
    import torchvision
    names = common.selected_models(a, torchvision.models.list_models(module=torchvision.models), "torchvision")
    skips = common.SkipList("torchvision")

    variants = [(n, op, dyn) for n in names for op in a.opsets for dyn in ((False, True) if op == 17 else (False,))]
    todo = [(n, op, dyn) for n, op, dyn in variants
            if a.force or not common.is_done(common.model_dir("torchvision", f"{n}{'_dyn' if dyn else ''}_op{op}"))]
    todo_models = [n for n in names if any(t[0] == n for t in todo)]
    if a.list:
        print("\n".join(f"{n}{'_dyn' if dyn else ''}_op{op}" for n, op, dyn in todo))
        return
    for name in todo_models:
        t0 = time.time()
        model, mb = skips.build(
            name, lambda: torchvision.models.get_model(name, weights=None, **CTOR_KW.get(name, {})).eval(), a)
        if model is None:
            continue
        for _, op, dyn in [t for t in todo if t[0] == name]:
            full = f"{name}{'_dyn' if dyn else ''}_op{op}"
            d = common.model_dir("torchvision", full)
            meta = None
            attempts = []
            for size in SIZES.get(name, DEFAULT_SIZES):
                g = torch.Generator().manual_seed(1)
                x = torch.randn(3 if dyn else 2, 3, size, size, generator=g)
                meta = common.export_torch_case(
                    d, model, (x,), op, ["input"], ["logits"],
                    {"family": "torchvision", "name": full, "model": name, "input_size": size,
                     "param_mb": round(mb, 1)}, plans_fn=cnn_plans,
                    dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}} if dyn else None)
                if meta["status"] == "ok":
                    break
                attempts.append(f"size {size}: {meta['status']}: {meta.get('error', '')}")
                common.log(f"{name} opset {op}: {attempts[-1]}")
            if attempts and meta["status"] == "ok":
                meta.setdefault("notes", []).extend(attempts)
                common.write_meta(d, meta)
            common.log(f"{full}: {meta['status']}{' (' + meta.get('error', '') + ')' if meta['status'] != 'ok' else ''}"
                        f" size {meta.get('input_size')} {meta.get('size_mb', 0)} MB, {time.time() - t0:.1f} s")
        del model


if __name__ == "__main__":
    main()
