#!/usr/bin/python3
"""Family 6: torchvision 0.14 semantic segmentation models (torchvision.models.segmentation: FCN, DeepLabV3, LR-ASPP),
random init, eval(), batch 2, exported at opsets 11, 13, 17.

    /usr/bin/python3 testdata/corpus/gen_segmentation.py [--models a,b,...] [--opsets 11 13 17]
                                                          [--only lraspp_mobilenet_v3_large_op17,...] [--max-mb 360]
                                                          [--include-giant] [--force]

Each (model, opset) goes to build/corpus/models/segmentation/<model>_op<opset>/ (common.py); existing ones are kept.
Models: weights=None, weights_backbone=None, default num_classes (21) and aux_loss (off), torch.manual_seed(0). The
model returns a dict; a wrapper returns its "out" tensor (ONNX output `out`, [2, 21, 64, 64]). Input: N(0,1)
float32 [2, 3, 64, 64]. Models whose parameters + buffers exceed --max-mb (float32) are skipped and listed in
build/corpus/models/segmentation/skipped.json.

Plans (sharding files): dp2 (input batch over 2), row2 (input rows, dim 2, over 2), plan4 = rc4 (input rows x
columns over a 2x2 mesh, axes x, y).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

FAMILY = "segmentation"
OPSETS = [11, 13, 17]
SIZE = 64


def seg_plans(m, d):
    plans = {"dp2": common.image_plan(d, "dp2", [2], ["x", None, None, None], "input batch over 2"),
             "row2": common.image_plan(d, "row2", [2], [None, None, "x", None], "spatial: input rows over 2"),
             "plan4": common.image_plan(d, "rc4", [2, 2], [None, None, "x", "y"],
                                        "spatial: input rows over x, columns over y (2x2)")}
    return plans


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_torchvision_args(ap, OPSETS, "torchvision segmentation")
    ap.add_argument("--only", default="", help="comma-separated <model>_op<opset> names (overrides --models/--opsets)")
    a = ap.parse_args()

    import torch
    import torchvision
    names = torchvision.models.list_models(module=torchvision.models.segmentation)
    todo = common.selected_cases(a, names, FAMILY, "torchvision segmentation")
    skips = common.SkipList(FAMILY)

    class Out(torch.nn.Module):
        """The segmentation model's dict output -> its "out" tensor."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x)["out"]

    for name in dict.fromkeys(n for n, _ in todo):
        t0 = time.time()
        model, mb = skips.build(
            name, lambda: Out(torchvision.models.get_model(name, weights=None, weights_backbone=None)).eval(), a)
        if model is None:
            continue
        for n, op in todo:
            if n != name:
                continue
            d = common.model_dir(FAMILY, f"{name}_op{op}")
            g = torch.Generator().manual_seed(1)
            x = torch.randn(2, 3, SIZE, SIZE, generator=g)
            meta = common.export_torch_case(
                d, model, (x,), op, ["input"], ["out"],
                {"family": FAMILY, "name": f"{name}_op{op}", "model": name, "input_size": SIZE,
                 "param_mb": round(mb, 1)}, plans_fn=seg_plans)
            common.log(f"{name} opset {op}: {meta['status']}"
                       f"{' (' + meta.get('error', '') + ')' if meta['status'] != 'ok' else ''}"
                       f" {meta.get('size_mb', 0)} MB, {time.time() - t0:.1f} s")
        del model


if __name__ == "__main__":
    main()
