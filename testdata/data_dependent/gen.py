#!/usr/bin/python3
"""A detector's post-processing in miniature, with outputs whose sizes depend on the data (docs/shapes.md step 6).

    /usr/bin/python3 testdata/data_dependent/gen.py   # writes model.onnx and test_data_set_{0,1,2}/ here

A linear layer scores 50 anchors per image over 3 classes and regresses their boxes; per image, the scores above a
threshold are kept (NonZero), the kept boxes go through non-maximum suppression (torchvision.ops.nms:
NonMaxSuppression), and the top k = min(4, count) survivors by score are returned (TopK with a computed k) with their
boxes. The test sets scale one input so that no anchor, a few, or many pass the threshold: 0, fewer than k and more
than k per image. Their outputs are torch's.
"""
from pathlib import Path

import numpy as np
import onnx
import torch
import torchvision
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent


class Post(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.score = torch.nn.Linear(8, 3)
        self.box = torch.nn.Linear(8, 4)

    def forward(self, x):  # x [2, 50, 8]
        probs = self.score(x).softmax(-1)[..., 1:]  # [2, 50, 2]
        raw = self.box(x)
        boxes = torch.cat([raw[..., :2], raw[..., :2] + raw[..., 2:].abs()], -1)  # x1 y1 x2 y2, [2, 50, 4]
        outs = []
        for i in range(x.shape[0]):
            best, _ = probs[i].max(-1)  # [50]
            keep = torch.nonzero(best > 0.6).squeeze(1)
            s, b = best[keep], boxes[i][keep]
            kept = torchvision.ops.nms(b, s, 0.3)
            s, b = s[kept], b[kept]
            k = torch.clamp(torch.tensor(s.shape[0]), max=4)
            top, idx = s.topk(k)
            outs += [top, b[idx]]
        return tuple(outs)


def main():
    torch.manual_seed(0)
    m = Post().eval()
    x = torch.randn(2, 50, 8)
    torch.onnx.export(m, (x,), HERE / "model.onnx", opset_version=17, input_names=["x"],
                      output_names=["scores_0", "boxes_0", "scores_1", "boxes_1"])
    onnx.checker.check_model(onnx.load(HERE / "model.onnx"), full_check=True)
    for k, scale in enumerate([0.0, 1.0, 2.0]):
        d = HERE / f"test_data_set_{k}"
        d.mkdir(exist_ok=True)
        xs = x * scale
        (d / "input_0.pb").write_bytes(numpy_helper.from_array(xs.numpy(), "x").SerializeToString())
        with torch.no_grad():
            outs = m(xs)
        for j, o in enumerate(outs):
            (d / f"output_{j}.pb").write_bytes(numpy_helper.from_array(o.numpy()).SerializeToString())
        print(d.name, [tuple(o.shape) for o in outs])


if __name__ == "__main__":
    main()
