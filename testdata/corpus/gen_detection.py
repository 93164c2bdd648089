#!/usr/bin/python3
"""Family 8: torchvision 0.14 object detection models (torchvision.models.detection: SSD300, SSDlite, RetinaNet, FCOS,
Faster / Mask / Keypoint R-CNN), random init, eval(), two 320x320 images, exported at opsets 11 and 17 (issue 27:
their shapes depend on the data).

    /usr/bin/python3 testdata/corpus/gen_detection.py [--models a,b,...] [--opsets 11 17]
                                                       [--only ssdlite320_mobilenet_v3_large_op17,...] [--max-mb 360]
                                                       [--include-giant] [--force]

Each (model, opset) goes to build/corpus/models/detection/<model>_op<opset>/ (common.py); existing ones are kept.
Models: weights=None, weights_backbone=None, torch.manual_seed(0); the R-CNNs, RetinaNet and FCOS resize to
min_size = max_size = 320 (the image's size: no rescaling); SSD300 resizes to 300x300, SSDlite keeps 320x320.
- Random init makes the activations vanish (MobileNetV3: SSDlite's scores all equal 1/91, a tie) or explode
  (ResNet-50): every BatchNorm's running statistics are set from one eager pass over two other random images (seed 2,
  the model in eval mode but its BatchNorms in training mode, cumulative averages), then everything is eval().
- Random weights score every box alike; each model's score threshold (SCORE_THRESH: `box_score_thresh` for the
  R-CNNs, `score_thresh` for the others) is set so that each image keeps some detections, fewer than the model's cap
  (`detections_per_img`): the number of boxes depends on the image. meta.json `detections` lists them per image.
- torchvision 0.14 exports roi_align (the R-CNNs) at opsets 16 and 17 as a RoiAlign whose default mode is half a
  pixel off torch's: the generator registers an opset-16 symbolic that writes coordinate_transformation_mode
  (register_roi_align_opset16).
Input `input`: U(0,1) float32 [2, 3, 320, 320] (seed 1); a wrapper gives the model the list of its two images and
returns, per image i, the tensors of its dict as outputs boxes_i, scores_i, labels_i (+ masks_i for Mask R-CNN,
keypoints_i and keypoints_scores_i for Keypoint R-CNN). Models whose parameters + buffers exceed --max-mb (float32)
are skipped and listed in build/corpus/models/detection/skipped.json (none is: the largest, Keypoint R-CNN, has
237 MB).

Plans (sharding files; the backbone's input is the model's batch of resized, normalized, padded images, the input of
its first Conv): dp2 (the input's batch and the backbone input's batch over 2), row2 (the backbone input's rows,
dim 2, over 2).
meta.json `data_dependent` (data_dependent_ops) counts by op type the nodes whose output shapes depend on the image's
values (`ops`: NonZero, TopK with a computed k, RoiAlign on the kept boxes, ...) and those where that starts
(`sources`), and lists the op types inside If / Loop bodies (`subgraph_ops`: NonMaxSuppression, ...).
"""
import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

FAMILY = "detection"
OPSETS = [11, 17]
SIZE = 320
BATCH = 2
# score thresholds that keep some of the random-weight detections per image, below each model's cap (see above)
SCORE_THRESH = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": 0.0155, "fasterrcnn_mobilenet_v3_large_fpn": 0.0165,
    "fasterrcnn_resnet50_fpn": 0.033, "fasterrcnn_resnet50_fpn_v2": 0.019, "fcos_resnet50_fpn": 0.135,
    "keypointrcnn_resnet50_fpn": 0.395, "maskrcnn_resnet50_fpn": 0.031, "maskrcnn_resnet50_fpn_v2": 0.021,
    "retinanet_resnet50_fpn": 0.0109, "retinanet_resnet50_fpn_v2": 0.041, "ssd300_vgg16": 0.995,
    "ssdlite320_mobilenet_v3_large": 0.08,
}


def constructor_kwargs(name):
    kw = {"weights": None, "weights_backbone": None}
    if "rcnn" in name:
        kw["box_score_thresh"] = SCORE_THRESH[name]
    else:
        kw["score_thresh"] = SCORE_THRESH[name]
    if not name.startswith("ssd"):
        kw.update(min_size=SIZE, max_size=SIZE)
    return kw


def output_keys(name):
    extra = ("masks",) if name.startswith("maskrcnn") else \
        ("keypoints", "keypoints_scores") if name.startswith("keypointrcnn") else ()
    return ("boxes", "scores", "labels") + extra


def calibrate_batchnorm(model, images):
    """Sets every BatchNorm's running statistics to those of one eager pass over `images` (cumulative averages), with
    the rest of the model in eval mode; leaves the model in eval mode."""
    import torch
    bns = [b for b in model.modules() if isinstance(b, torch.nn.modules.batchnorm._BatchNorm)]
    for b in bns:
        b.reset_running_stats()
        b.momentum = None
        b.train()
    with torch.no_grad():
        model(list(images.unbind(0)))
    model.eval()
    return len(bns)


def register_roi_align_opset16():
    """torchvision 0.14 registers its roi_align symbolic at opset 11 only, and the exporter uses it at every later
    opset: from opset 16 on, a RoiAlign without coordinate_transformation_mode is half_pixel, half a pixel off torch's
    aligned=False (the R-CNNs' MultiScaleRoIAlign), so ONNX Runtime's boxes and counts differ from torch's. Registers
    the opset-16 symbolic of later torchvision releases, which writes the mode."""
    import torch
    from torch.onnx import register_custom_op_symbolic
    from torch.onnx.symbolic_helper import parse_args
    from torch.onnx.symbolic_opset9 import _cast_Long
    from torch.onnx.symbolic_opset11 import select, squeeze

    @parse_args("v", "v", "f", "i", "i", "i", "i")
    def roi_align(g, x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
        def columns(idx):
            return select(g, rois, 1, g.op("Constant", value_t=torch.tensor(idx, dtype=torch.long)))
        return g.op("RoiAlign", x, columns([1, 2, 3, 4]), _cast_Long(g, squeeze(g, columns([0]), 1), False),
                    spatial_scale_f=spatial_scale, output_height_i=pooled_height, output_width_i=pooled_width,
                    sampling_ratio_i=max(sampling_ratio, 0),
                    coordinate_transformation_mode_s="half_pixel" if aligned else "output_half_pixel")

    register_custom_op_symbolic("torchvision::roi_align", roi_align, 16)


def backbone_input(m):
    """The name of the first Conv's input: the backbone's batch of images."""
    return next(n.input[0] for n in m.graph.node if n.op_type == "Conv")


def det_plans(m, d):
    x = backbone_input(m)
    axes = ["x"]
    return {
        "dp2": common.plan_entry(common.write_plan(d, "dp2", [2], axes, {
            "input": ["x", None, None, None], x: ["x", None, None, None]}), [2],
            "input batch and backbone input batch over 2"),
        "row2": common.plan_entry(common.write_plan(d, "row2", [2], axes, {x: [None, None, "x", None]}), [2],
                                  "spatial: backbone input rows over 2"),
    }


# operand positions that hold a shape, sizes, a count or bounds: a computed one makes the output's shape data-dependent
SHAPE_OPERANDS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
                  "Slice": (1, 2, 3, 4), "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1,), "OneHot": (1,),
                  "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,), "If": (0,), "Loop": (0, 1)}
ALWAYS_DATA_DEPENDENT = {"NonZero", "NonMaxSuppression", "Unique", "Compress"}


def data_dependent_ops(m):
    """{"ops": {op: count}, "sources": {op: count}, "subgraph_ops": [op, ...]}: the top-level nodes whose output
    shapes depend on the input's values (not only on its static shape), those among them where that starts (no input
    and no shape operand depends on a data-dependent shape), and the op types inside If / Loop / Scan bodies.
    A value is "known" when it is computed from constants and the shapes of values with static shapes (loading
    folds those); an output's shape is data-dependent when an input's is, when it comes from NonZero,
    NonMaxSuppression, Unique or Compress on values that are not known, or when an operand that sets it (a Reshape's
    shape, TopK's k, Slice's bounds, an If's condition, a Loop's trip count, ...) is not known."""
    known = {t.name for t in m.graph.initializer}
    dd = set()  # values whose shape is data-dependent
    derived = set()  # values computed from a data-dependent shape
    ops, sources, sub = Counter(), Counter(), set()

    def walk(g):
        for n in g.node:
            sub.add(n.op_type)
            for a in n.attribute:
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(sg)

    for n in m.graph.node:
        ins = [i for i in n.input if i]
        for a in n.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                walk(sg)
        in_dd = any(i in dd for i in ins)
        operands = [n.input[k] for k in SHAPE_OPERANDS.get(n.op_type, ()) if k < len(n.input) and n.input[k]]
        if n.op_type in ("Shape", "Size"):
            out_dd, out_known = False, not in_dd
            if in_dd:
                derived.update(n.output)
        else:
            if any(i in derived for i in ins):
                derived.update(n.output)
            out_known = n.op_type == "Constant" or (bool(ins) and all(i in known for i in ins))
            out_dd = in_dd or (n.op_type in ALWAYS_DATA_DEPENDENT and not out_known) or \
                any(o not in known for o in operands)
        if out_known:
            known.update(n.output)
        if out_dd:
            dd.update(n.output)
            ops[n.op_type] += 1
            if not in_dd and not any(o in derived for o in operands):
                sources[n.op_type] += 1
    return {"ops": dict(ops.most_common()), "sources": dict(sources.most_common()), "subgraph_ops": sorted(sub)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_torchvision_args(ap, OPSETS, "torchvision detection")
    ap.add_argument("--only", default="", help="comma-separated <model>_op<opset> names (overrides --models/--opsets)")
    a = ap.parse_args()

    import onnx
    import torch
    import torchvision
    register_roi_align_opset16()
    names = torchvision.models.list_models(module=torchvision.models.detection)
    todo = common.selected_cases(a, names, FAMILY, "torchvision detection")
    skips = common.SkipList(FAMILY)

    class Flat(torch.nn.Module):
        """A batch [N, 3, H, W] -> the detector on the list of its N images -> the tensors of each image's dict."""

        def __init__(self, m, keys):
            super().__init__()
            self.m = m
            self.keys = keys

        def forward(self, images):
            return tuple(o[k] for o in self.m(list(images.unbind(0))) for k in self.keys)

    x = torch.rand(BATCH, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    calib = torch.rand(BATCH, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    for name in dict.fromkeys(n for n, _ in todo):
        t0 = time.time()
        keys = output_keys(name)
        model, mb = skips.build(
            name, lambda: Flat(torchvision.models.get_model(name, **constructor_kwargs(name)), keys).eval(), a)
        if model is None:
            continue
        n_bn = calibrate_batchnorm(model.m, calib)
        with torch.no_grad():
            detections = [len(o["scores"]) for o in model.m(list(x.unbind(0)))]
        for n, op in todo:
            if n != name:
                continue
            d = common.model_dir(FAMILY, f"{name}_op{op}")
            meta = common.export_torch_case(
                d, model, (x,), op, ["input"], [f"{k}_{i}" for i in range(BATCH) for k in keys],
                {"family": FAMILY, "name": f"{name}_op{op}", "model": name, "input_size": SIZE, "batch": BATCH,
                 "param_mb": round(mb, 1), "score_thresh": SCORE_THRESH[name], "detections": detections,
                 "batchnorms_calibrated": n_bn}, plans_fn=det_plans)
            if meta["status"] == "ok":
                m = onnx.load(str(d / "model.onnx"), load_external_data=False)
                meta["data_dependent"] = data_dependent_ops(m)
                common.write_meta(d, meta)
            common.log(f"{name} opset {op}: {meta['status']}"
                       f"{' (' + meta.get('error', '') + ')' if meta['status'] != 'ok' else ''}"
                       f" {meta.get('size_mb', 0)} MB, export {meta.get('export_s', 0)} s, {time.time() - t0:.1f} s,"
                       f" detections {detections}")
        del model


if __name__ == "__main__":
    main()
