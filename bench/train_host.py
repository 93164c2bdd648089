#!/usr/bin/python3
"""bench/train_host.py: one training step of the 4-layer d1024 decoder on this host, gspmd-onnx against torch.

    /usr/bin/python3 bench/train_host.py [--batch 4] [--seq 128] [--vocab 1024] [--runs 3] [--bin PATH] [--keep DIR]

Run from anywhere after building (build/bin/gspmd-onnx). It
  1. generates the 4-layer decoder (d_model 1024, d_ff 4096, 16 heads, a 1024-token vocabulary: input_ids [B,S] ->
     embedding -> blocks -> tied LM head -> logits [B,S,V]) with testdata/tools/make_decoder.py --weights random into
     a scratch directory, and random input_ids (the vocabulary gives `--loss mean` a gradient: the mean of a
     LayerNormalization's output, make_decoder's --vocab 0 output, has none);
  2. checks once that both sides compute the same step: `run --training --loss mean --mesh 1 --outputs` against the
     torch step from the same weights and input (the loss, and every updated weight, relative error);
  3. then RUNS times, interleaved: (a) `gspmd-onnx run MODEL --mesh 1 --training --loss mean` (one SGD step, lr
     0.01): the report's host.wall_s, which is the emulated run of the whole step graph (forward, loss, backward,
     update; weight slicing and output assembly included; not loading, building the step or partitioning);
     (b) torch: the median of 3 steps after one warm-up, each `loss = model(x).mean(); loss.backward();
     sgd.step(); zero_grad` with torch.optim.SGD(lr=0.01) over the same parameters (every float weight of more than
     one element, the attention mask included, as gspmd-onnx trains by default), in a fresh python3 process;
  4. prints a markdown table of the medians and of the ratio gspmd / torch.
Threads: OMP_NUM_THREADS (default 2) for gspmd-onnx's oneDNN and executor, torch.set_num_threads and
OPENBLAS_NUM_THREADS for torch.
BLAS: Debian's python3-torch does its float matmuls through the system's libblas.so.3 (BLAS_INFO=generic). Debian's
default is the reference BLAS (package libblas3, about 6 GFLOP/s here), against which any comparison is meaningless;
torch runs on OpenBLAS (package libopenblas0-pthread, about 150 GFLOP/s, put first in its library path) when that is
installed, and otherwise the row says it is not. `--reference-blas` adds a row with the reference BLAS (slow: about
40 s a step at the default size).
The torch model is make_decoder.py's graph written in torch (pre-LN blocks, erf GELU), its parameters read from the
ONNX file's external data; step 2 is the proof that it is the same model.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_weights(model_path):
    import onnx  # Debian's python3-onnx
    from onnx import numpy_helper
    m = onnx.load(model_path)  # external data read from NAME.bin
    return {t.name: numpy_helper.to_array(t).copy() for t in m.graph.initializer}


class Decoder:
    """make_decoder.py's graph (with a vocabulary), in torch."""

    def __init__(self, torch, w, layers, heads):
        self.torch, self.layers, self.heads = torch, layers, heads
        self.p = {k: torch.tensor(v) for k, v in w.items()}
        self.trainable = [k for k, v in w.items() if v.dtype == np.float32 and v.size > 1]
        for k in self.trainable:
            self.p[k].requires_grad_(True)

    def __call__(self, ids):
        F, p, torch = self.torch.nn.functional, self.p, self.torch
        x = p["wte.weight"][ids] + p["wpe.weight"]
        B, S, D = x.shape
        H = self.heads
        Dh = D // H

        def ln(v, name):
            return F.layer_norm(v, (D,), p[name + ".weight"], p[name + ".bias"], eps=1e-5)

        def linear(v, name):
            return torch.matmul(v, p[name + ".weight"]) + p[name + ".bias"]

        for i in range(self.layers):
            h = f"h.{i}."
            a = ln(x, h + "ln_1")
            q = linear(a, h + "attn.q").reshape(B, S, H, Dh).permute(0, 2, 1, 3)
            k = linear(a, h + "attn.k").reshape(B, S, H, Dh).permute(0, 2, 3, 1)
            v = linear(a, h + "attn.v").reshape(B, S, H, Dh).permute(0, 2, 1, 3)
            pr = torch.softmax(torch.matmul(q, k) * (1.0 / math.sqrt(Dh)) + p["attn_mask"], dim=-1)
            ctx = torch.matmul(pr, v).permute(0, 2, 1, 3).reshape(B, S, D)
            x = x + linear(ctx, h + "attn.proj")
            f = linear(ln(x, h + "ln_2"), h + "mlp.fc_in")
            x = x + linear(F.gelu(f), h + "mlp.fc_out")
        return torch.matmul(ln(x, "ln_f"), p["wte.weight"].t())


def torch_step_times(model_dir, x_np, check_dir, steps):
    """Times the torch step (median of `steps` after a warm-up); with check_dir, first compares one step with
    gspmd-onnx's outputs there (the loss and every updated weight, by name). Returns (seconds, check text)."""
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    w = load_weights(os.path.join(model_dir, "dec4.onnx"))
    model = Decoder(torch, w, 4, 16)
    params = [model.p[k] for k in model.trainable]
    sgd = torch.optim.SGD(params, lr=0.01)
    x = torch.tensor(x_np)  # input_ids

    def step():
        loss = model(x).mean()
        loss.backward()
        sgd.step()
        sgd.zero_grad(set_to_none=True)
        return loss

    text = ""
    if check_dir:
        from onnx import numpy_helper, TensorProto
        loss = step().item()
        outs = {}  # output name -> array: the loss, then "<weight>.updated" per weight
        for i in range(1 + len(model.trainable)):
            t = TensorProto()
            t.ParseFromString(open(os.path.join(check_dir, f"output_{i}.pb"), "rb").read())
            outs[t.name] = numpy_helper.to_array(t)
        loss_err = abs(float(outs["loss"]) - loss) / abs(loss)
        worst, worst_abs = 0.0, 0.0  # normwise relative error; absolute where the weight is ~0 (zero-init biases)
        for k in model.trainable:
            ref, got = model.p[k].detach().numpy(), outs[k + ".updated"]
            err, norm = float(np.linalg.norm(got - ref)), float(np.linalg.norm(ref))
            if norm > 1e-6:
                worst = max(worst, err / norm)
            else:
                worst_abs = max(worst_abs, err)
        text = (f"loss rel. error {loss_err:.1e}; updated weights: max normwise rel. error {worst:.1e}, "
                f"{worst_abs:.1e} absolute on the zero-initialized biases")
        if loss_err > 1e-4 or worst > 1e-4 or worst_abs > 1e-6:
            sys.exit(f"train_host.py: torch and gspmd-onnx steps differ: {text}")
        if steps == 0:
            return 0.0, text
        model = Decoder(torch, w, 4, 16)  # fresh weights for the timing
        params = [model.p[k] for k in model.trainable]
        sgd = torch.optim.SGD(params, lr=0.01)
    step()  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), text


OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread"


def torch_worker(scratch, check, steps, blas):
    """torch_step_times in a fresh python3 process whose torch uses `blas` ("openblas" or "reference")."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=os.environ["OMP_NUM_THREADS"])
    if blas == "openblas":
        env["LD_LIBRARY_PATH"] = OPENBLAS + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", scratch, "--steps", str(steps)]
    if check:
        cmd += ["--check", check]
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gspmd-onnx"))
    ap.add_argument("--keep", default="", help="scratch directory to keep (default: a temporary one, removed)")
    ap.add_argument("--reference-blas", action="store_true", help="also time torch on Debian's reference BLAS")
    ap.add_argument("--torch-worker", default="", help=argparse.SUPPRESS)  # internal: SCRATCH of a running bench
    ap.add_argument("--check", default="", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    threads = os.environ["OMP_NUM_THREADS"]
    if args.torch_worker:
        x = np.load(os.path.join(args.torch_worker, "input_ids.npy"))
        t, text = torch_step_times(os.path.join(args.torch_worker, "dec4"), x, args.check, args.steps)
        print(json.dumps({"seconds": t, "check": text}))
        return
    blas = "openblas" if os.path.exists(os.path.join(OPENBLAS, "libblas.so.3")) else "reference"
    scratch = args.keep or tempfile.mkdtemp(prefix="gspmd-train-host.")
    os.makedirs(scratch, exist_ok=True)
    try:
        d = os.path.join(scratch, "dec4")
        subprocess.run([sys.executable, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), "--layers", "4",
                        "--d-model", "1024", "--heads", "16", "--vocab", str(args.vocab), "--batch", str(args.batch), "--seq",
                        str(args.seq), "--weights", "random", "--out", d, "--name", "dec4"],
                       check=True, stdout=subprocess.DEVNULL)
        model = os.path.join(d, "dec4.onnx")
        x = np.random.default_rng(1).integers(0, args.vocab, (args.batch, args.seq), dtype=np.int64)
        np.save(os.path.join(scratch, "input_ids.npy"), x)
        inputs = os.path.join(scratch, "inputs")
        os.makedirs(inputs, exist_ok=True)
        from onnx import numpy_helper
        open(os.path.join(inputs, "input_0.pb"), "wb").write(numpy_helper.from_array(x, "input_ids").SerializeToString())
        cmd = [args.bin, "run", model, "--mesh", "1", "--training", "--loss", "mean", "--inputs", inputs]
        outs = os.path.join(scratch, "outputs")
        subprocess.run(cmd + ["--outputs", outs], check=True, stdout=subprocess.DEVNULL)
        check = torch_worker(scratch, outs, 0, blas)["check"]
        shutil.rmtree(outs)
        g, t, ref = [], [], []
        flops = 0.0
        for r in range(args.runs):
            report = os.path.join(scratch, f"r{r}.json")
            subprocess.run(cmd + ["--report", report], check=True, stdout=subprocess.DEVNULL)
            rep = json.load(open(report))
            g.append(rep["host"]["wall_s"])
            flops = rep["model_flops"]
            t.append(torch_worker(scratch, "", 3, blas)["seconds"])
            if args.reference_blas:
                ref.append(torch_worker(scratch, "", 1, "reference")["seconds"])
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    med = statistics.median
    print(f"| measure (decoder 4L d1024 vocab {args.vocab}, batch {args.batch}, seq {args.seq}; OMP_NUM_THREADS={threads}, "
          f"median of {args.runs}) | value |")
    print("|---|---|")
    print(f"| same step (checked once) | {check} |")
    print(f"| `run --mesh 1 --training --loss mean` host wall | {med(g):.3f} s ({flops / med(g) / 1e9:.1f} GFLOP/s) |")
    version = __import__("torch").__version__
    what = "OpenBLAS" if blas == "openblas" else "the reference BLAS: libopenblas0-pthread is not installed"
    print(f"| torch {version} step (forward, mean, backward, SGD), on {what} | {med(t):.3f} s "
          f"({flops / med(t) / 1e9:.1f} GFLOP/s) |")
    if ref:
        print(f"| torch {version} step on the reference BLAS | {med(ref):.3f} s ({flops / med(ref) / 1e9:.1f} GFLOP/s) |")
    print(f"| gspmd-onnx / torch (median of per-run ratios) | {med(a / b for a, b in zip(g, t)):.2f} |")


if __name__ == "__main__":
    main()
