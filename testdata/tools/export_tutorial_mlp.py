# docs/tutorial.md's model: four residual MLP blocks and a head, exported by torch as a user would export theirs.
import argparse

import torch


class Block(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.fc_in = torch.nn.Linear(d, 4 * d)
        self.fc_out = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc_out(torch.nn.functional.gelu(self.fc_in(x)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block() for _ in range(4)])
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.blocks(x))


ap = argparse.ArgumentParser()
ap.add_argument("--out", default=".", help="the folder to write mlp.onnx in")
torch.manual_seed(0)
torch.onnx.export(Model().eval(), torch.randn(8, 16, 64), ap.parse_args().out + "/mlp.onnx",
                  input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
