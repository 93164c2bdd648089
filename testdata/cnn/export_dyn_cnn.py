#!/usr/bin/python3
"""A small CNN exported by torch with dynamic axes (batch, height, width), for halo windows over symbolic image
dims (issue 27, docs/shapes.md): `partition` of its rows over 2 or 4 needs no --dim, and the device files run at
other image sizes.

    /usr/bin/python3 testdata/cnn/export_dyn_cnn.py [--out testdata/cnn/dyn_cnn]

The net (random init, eval(), opset 17): a ResNet-style stem (7x7 Conv stride 2 pad 3, BatchNorm, ReLU, 3x3 MaxPool
stride 2 pad 1), a 3x3 Conv pad 1, a 3x3 Conv stride 2 pad 1 (its halo depends on the size's parity), a dilated
3x3 Conv (dilation 2, pad 2), a 2x2 AveragePool stride 2 (count_include_pad 0, no padding), a 1x1 Conv, then a global
average and a Linear head. Input `image` float32 [batch, 3, height, width]; output `logits` [batch, 10].
Test data (inputs and torch's outputs): batch 2, 3 x 45 x 38 (`test_data_set_0`); batch 1, 3 x 23 x 30
(`test_data_set_1`); batch 1, 3 x 9 x 12 (`test_data_set_2`: fewer rows than the files partitioned at the hints
serve). Plans: rows2 (the image's rows over `rows`), rows2cols2 (rows x columns, mesh 2x2).
"""
import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                                  nn.ReLU(), nn.Conv2d(16, 16, 3, padding=2, dilation=2), nn.ReLU(),
                                  nn.AvgPool2d(2, stride=2, count_include_pad=False), nn.Conv2d(16, 16, 1))
        self.head = nn.Linear(16, 10)

    def forward(self, image):
        y = self.body(self.stem(image))
        return self.head(y.mean(dim=(2, 3)))


def save_pb(path: Path, name: str, array: np.ndarray):
    t = onnx.numpy_helper.from_array(array, name)
    path.write_bytes(t.SerializeToString())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "dyn_cnn"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        bn = net.stem[1]
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
    example = torch.randn(2, 3, 45, 38)
    torch.onnx.export(net, (example,), str(out / "model.onnx"), input_names=["image"], output_names=["logits"],
                      opset_version=17, dynamic_axes={"image": {0: "batch", 2: "height", 3: "width"},
                                                      "logits": {0: "batch"}})
    for k, shape in enumerate([(2, 3, 45, 38), (1, 3, 23, 30), (1, 3, 9, 12)]):
        d = out / f"test_data_set_{k}"
        d.mkdir(exist_ok=True)
        x = torch.randn(*shape)
        with torch.no_grad():
            y = net(x)
        save_pb(d / "input_0.pb", "image", x.numpy())
        save_pb(d / "output_0.pb", "logits", y.numpy())
    plans = {"rows2": ([2], ["rows"], [None, None, "rows", None]),
             "rows2cols2": ([2, 2], ["rows", "cols"], [None, None, "rows", "cols"])}
    for name, (shape, axes, spec) in plans.items():
        plan = {"mesh": {"shape": shape, "axes": axes}, "tensors": {"image": spec}}
        (out / f"{name}.plan.json").write_text(json.dumps(plan, indent=2) + "\n")


if __name__ == "__main__":
    main()
