#!/usr/bin/python3
"""Reference training steps from torch autograd, for `run --training` (docs/training.md, tests/e2e/training_test.cc).

Run with Debian's interpreter (torch 1.13, onnx 1.12, numpy):

    /usr/bin/python3 testdata/training/torch_reference.py make DIR [--opset 13|17] [--fold]
                                                              [--optimizer sgd|adam|adafactor] [--variables]
                                                              [--precision autocast|mixed] [--accumulate K]
        exports a small GPT (testdata/gpt/export_gpt.py's architecture) to DIR/model.onnx, its run inputs to
        DIR/inputs/input_0.pb (input_ids) and input_1.pb (labels), and torch's training step to DIR/torch/:
        loss.pb and, per parameter p, p.grad.pb and p.updated.pb (one torch.optim step with lr --lr; torch 1.13
        has no Adafactor: adafactor_step below, in numpy float64 from torch's gradients). With --variables the
        parameters are graph inputs, not initializers (a JAX-style step: params as arguments), and the run inputs
        are input_ids, the parameters in the model's input order, labels, then the optimizer state (zeros, for
        `run --trainable '\.(weight|bias)$'`: per parameter in that order, Adam's m and v). --precision autocast:
        torch's step runs the forward pass under `torch.autocast("cpu", dtype=torch.bfloat16)` (torch's automatic
        mixed precision: float32 parameters, matmuls in bfloat16), the reference for `run --precision autocast`;
        --precision mixed: on a bfloat16 copy of the model whose gradients update the float32 parameters (every
        activation in bfloat16, float32 master weights: Lingvo's and Megatron's mixed precision), the reference for
        `run --precision mixed`. The loss is on the logits cast to float32; the exported model stays float32.
        --accumulate K: the model is exported at batch 4 / K, the reference for `run --accumulate K` (gradient
        accumulation), whose step takes the same batch-4 inputs as K microbatches; torch's step is on all 4 rows.
    /usr/bin/python3 testdata/training/torch_reference.py compare DIR OUT
        compares `run --training --outputs OUT` (output_<i>.pb, named loss / <p>.updated) with DIR/torch: the loss,
        and every updated parameter (sgd: the implied gradient (p - p.updated) / lr against p.grad). Prints one
        line per value and exits 1 when a normwise relative error exceeds --tol (default 1e-4) or a parameter is
        missing. Made with --precision, torch's float32 step is in DIR/torch/float32 too, and each value may differ
        by 4 units of bfloat16's rounding (2^-6) or by twice torch's 16-bit value's normwise distance from its
        float32 one, whichever is larger: `run --check`'s rule for a 16-bit step.
"""
import argparse
import copy
import glob
import os
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpt"))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.dont_write_bytecode = True
from export_gpt import GPT, init_weights  # noqa: E402

VOCAB, D, HEADS, LAYERS, BATCH, SEQ = 64, 32, 2, 2, 4, 8


def save(path, arr, name):
    with open(path, "wb") as f:
        f.write(onnx.numpy_helper.from_array(np.asarray(arr), name).SerializeToString())


def adafactor_step(w, g, lr, eps=1e-30, t=1, clip_threshold=1.0, decay_rate=-0.8):
    """One Adafactor step from zero state, as HF transformers' `Adafactor(lr=lr, scale_parameter=False,
    relative_step=False, warmup_init=False, beta1=None, clip_threshold=1.0, decay_rate=-0.8, eps=(1e-30, 1e-3),
    weight_decay=0.0)` computes it (Shazeer & Stern 2018; factored over the last two dims), in float64."""
    g = g.astype(np.float64)
    beta2t = 1.0 - t ** decay_rate
    sq = g * g + eps
    if g.ndim >= 2:
        row = beta2t * 0.0 + (1.0 - beta2t) * sq.mean(axis=-1)  # the running averages start at zero
        col = beta2t * 0.0 + (1.0 - beta2t) * sq.mean(axis=-2)
        r_factor = 1.0 / np.sqrt(row / row.mean(axis=-1, keepdims=True))
        u = g * r_factor[..., :, None] * (1.0 / np.sqrt(col))[..., None, :]
    else:
        u = g / np.sqrt(beta2t * 0.0 + (1.0 - beta2t) * sq)
    u = u / max(1.0, np.sqrt(np.mean(u * u)) / clip_threshold)
    return w.astype(np.float64) - lr * u


def make(a):
    torch.manual_seed(0)
    model = GPT(VOCAB, SEQ, D, HEADS, 4 * D, LAYERS)
    init_weights(model, 0.2)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), dtype=torch.long, generator=gen)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), dtype=torch.long, generator=gen)
    os.makedirs(os.path.join(a.dir, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(a.dir, "torch"), exist_ok=True)
    model.eval()
    # --accumulate K: the model is exported at the microbatch, BATCH / K rows; torch's step runs on all BATCH rows.
    torch.onnx.export(model, (ids[:BATCH // a.accumulate],), os.path.join(a.dir, "model.onnx"), opset_version=a.opset,
                      do_constant_folding=a.fold, input_names=["input_ids"], output_names=["logits"])
    inputs = [(ids.numpy(), "input_ids"), (labels.numpy(), "labels")]
    if a.variables:
        path = os.path.join(a.dir, "model.onnx")
        m = onnx.load(path)
        params = [t for t in m.graph.initializer if t.name.endswith((".weight", ".bias"))]
        for t in params:
            m.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        values = [(onnx.numpy_helper.to_array(t), t.name) for t in params]
        kept = [t for t in m.graph.initializer if not t.name.endswith((".weight", ".bias"))]
        del m.graph.initializer[:]
        m.graph.initializer.extend(kept)
        onnx.save(m, path)
        state = [] if a.optimizer == "sgd" else [(np.zeros_like(x), n + s) for x, n in values
                                                 for s in (".adam_m", ".adam_v")]
        inputs = inputs[:1] + values + inputs[1:] + state
    for k, (x, name) in enumerate(inputs):
        save(os.path.join(a.dir, "inputs", f"input_{k}.pb"), x, name)

    if a.precision != "f32":  # the same step in float32 too, the anchor of the comparison
        step(a, copy.deepcopy(model), ids, labels, os.path.join(a.dir, "torch", "float32"), "f32")
    loss = step(a, model, ids, labels, os.path.join(a.dir, "torch"), a.precision)
    with open(os.path.join(a.dir, "torch", "optimizer.txt"), "w") as f:
        f.write(f"{a.optimizer} {a.lr} {a.precision}\n")
    print("ok:", a.dir, f"loss {loss:.6f}")


def step(a, model, ids, labels, out, precision):
    """One training step of `model` (cross-entropy on `labels`, --optimizer with --lr) at `precision` (f32; autocast:
    the forward pass under bfloat16 autocast; mixed: forward and backward on a bfloat16 copy, its gradients widened
    onto the float32 parameters); writes to `out` loss.pb and, per parameter p, p.pb (before), p.grad.pb and
    p.updated.pb. Returns the loss."""
    os.makedirs(out, exist_ok=True)
    compute = copy.deepcopy(model).bfloat16() if precision == "mixed" else model
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast"):
        logits = compute(ids)
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))
    loss.backward()
    if compute is not model:
        for p, q in zip(model.parameters(), compute.parameters()):
            p.grad = q.grad.float()
    save(os.path.join(out, "loss.pb"), loss.detach().numpy(), "loss")
    params = dict(model.named_parameters())
    for name, p in params.items():
        save(os.path.join(out, f"{name}.grad.pb"), p.grad.numpy(), f"{name}.grad")
    before = {n: p.detach().clone() for n, p in params.items()}
    if a.optimizer == "adafactor":
        updated = {n: adafactor_step(p.detach().numpy(), p.grad.numpy(), a.lr) for n, p in params.items()}
    else:
        opt = (torch.optim.SGD(model.parameters(), lr=a.lr) if a.optimizer == "sgd" else
               torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8))
        opt.step()
        updated = {n: p.detach().numpy() for n, p in params.items()}
    for name in params:
        save(os.path.join(out, f"{name}.updated.pb"), updated[name], f"{name}.updated")
        save(os.path.join(out, f"{name}.pb"), before[name].numpy(), name)
    return loss.item()


def load(path):
    t = onnx.load_tensor(path)
    return t.name, onnx.numpy_helper.to_array(t).astype(np.float64)


def compare(a):
    optimizer, lr, precision = open(os.path.join(a.dir, "torch", "optimizer.txt")).read().split()
    lr = float(lr)
    half = precision != "f32"
    if a.tol is None:
        a.tol = 4 * 2.0**-8 if half else 1e-4
    f32 = os.path.join(a.dir, "torch", "float32")
    ours = dict(load(p) for p in glob.glob(os.path.join(a.out, "output_*.pb")))
    ref = os.path.join(a.dir, "torch")
    bad, rows = 0, []

    def rel(x, y, floor=1e-30):  # normwise relative error
        return float(np.linalg.norm(x - y) / max(np.linalg.norm(y), floor))

    def limit(name):
        """A 16-bit step: the tolerance, or twice torch's value's distance from its float32 one (`run --check`'s rule
        for a 16-bit step: a result as accurate as torch's is that close to it)."""
        if not half:
            return a.tol
        if name == "loss":
            x, y = (load(os.path.join(d, "loss.pb"))[1] for d in (ref, f32))
        else:
            w = load(os.path.join(f32, name + ".pb"))[1]
            x, y = (w - load(os.path.join(d, name + ".updated.pb"))[1] for d in (ref, f32))
        return max(a.tol, 2 * rel(x, y))

    e = rel(ours["loss"], load(os.path.join(ref, "loss.pb"))[1]) if "loss" in ours else float("inf")
    rows.append(("loss", e, limit("loss")))
    model = onnx.load(os.path.join(a.dir, "model.onnx"))
    weights = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    for path in sorted(glob.glob(os.path.join(ref, "*.updated.pb"))):
        name = os.path.basename(path)[: -len(".updated.pb")]
        grad = load(os.path.join(ref, name + ".grad.pb"))[1]
        w = load(os.path.join(ref, name + ".pb"))[1]
        if name not in weights:  # folded by torch's exporter (wpe(arange(T)) with --fold): not a weight
            print(f"{'skipped':8s} {name:32s} not an initializer or input of the model")
            continue
        zero = np.linalg.norm(grad) < 1e-6 * np.linalg.norm(w)  # 0 in exact arithmetic (attention's key bias)
        if zero and optimizer != "sgd":
            print(f"{'skipped':8s} {name:32s} gradient 0 in exact arithmetic: {optimizer} normalises rounding noise")
            continue
        if name + ".updated" not in ours:
            rows.append((name, float("inf"), a.tol))
            continue
        if optimizer == "sgd":  # the implied gradient
            g = (w - ours[name + ".updated"]) / lr
            # A gradient that is 0 in exact arithmetic is rounding noise on both sides: it must stay below 1e-5 |p|.
            rows.append((name + ".grad", np.linalg.norm(g) / (1e-5 * np.linalg.norm(w) / lr) * a.tol if zero
                         else rel(g, grad), limit(name)))
        else:  # adam's and adafactor's first steps move every weight by about lr: compare the step
            rows.append((name + ".updated", rel(w - ours[name + ".updated"], w - load(path)[1]), limit(name)))
    for name, e, lim in rows:
        flag = e > lim
        bad += flag
        print(f"{'MISMATCH' if flag else 'ok':8s} {name:32s} rel {e:.3e}" + (f" (limit {lim:.3e})" if half else ""))
    print(f"{len(rows) - bad}/{len(rows)} within {a.tol:g}" +
          (f" or twice torch's {precision} distance from float32" if half else ""))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--opset", type=int, default=13)
    m.add_argument("--fold", action="store_true")
    m.add_argument("--optimizer", choices=["sgd", "adam", "adafactor"], default="sgd")
    m.add_argument("--lr", type=float, default=1.0)
    m.add_argument("--variables", action="store_true", help="the parameters as graph inputs")
    m.add_argument("--accumulate", type=int, default=1, choices=[1, 2, 4],
                   help="export the model at batch 4 / K (the inputs and torch's step stay at batch 4)")
    m.add_argument("--precision", choices=["f32", "autocast", "mixed"], default="f32",
                   help="torch's step under bfloat16 autocast, or on a bfloat16 copy with float32 masters")
    c = sub.add_parser("compare")
    c.add_argument("dir")
    c.add_argument("out")
    c.add_argument("--tol", type=float, help="default 1e-4; 2^-6 for a step made with --autocast")
    a = ap.parse_args()
    return make(a) if a.cmd == "make" else compare(a)


if __name__ == "__main__":
    sys.exit(main() or 0)
