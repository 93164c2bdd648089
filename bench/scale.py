#!/usr/bin/python3
"""bench/scale.py: partitioner and cost-model time versus layers and devices.

GPT-3 175B shapes (d_model 12288, 96 heads, MLP 49152, vocab 50257, sequence 2048, batch 64), weights as absent
external data, the GSPMD paper's 2D sharding (testdata/tools/make_decoder.py's NAME.2d.sharding.json) on meshes of 4
to 2048 devices. For each (layers, mesh): the best-of-REPS wall time of `gspmd-onnx simulate` and of its stages (the
report's "compile_time_s"), and the ratio to the first row, all measured in one run. Prints a markdown table.

Then the pipeline table: `simulate --pipeline stage --microbatches 16` (GPipe, docs/pipeline.md) of the 96-layer
model at batch 256 on stage x data x model meshes of 16 to 2048 devices (8 stages, Megatron inside each stage): the
pipelined graph is the same at every device count, so the wall time should not grow with it.

Then the training table: `simulate --training --loss mean` (one SGD step: forward, loss, backward, update) against
forward-only `simulate` of the same model and plan, at --training-layers on the smallest and the largest mesh. The two
commands run in turn REPS times (forward, training, forward, ...), and each ratio is the median of the per-pair ratios
of whole-command wall times, so that a drift of the machine's speed moves both sides of a pair.

    /usr/bin/python3 bench/scale.py [--layers 12 24 48 96] [--meshes 2x2 ... 64x32] [--reps 3] [--bin PATH]
                                    [--training-layers 96] [--training-meshes 4x4 64x32] [--training-reps 5]
                                    [--training-only] [--pipeline-meshes 8x1x2 8x16x16] [--pipeline-only]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[12, 24, 48, 96])
    ap.add_argument("--meshes", nargs="+", default=["2x2", "4x4", "8x8", "16x16", "32x32", "64x32"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gspmd-onnx"))
    ap.add_argument("--work", default="")
    ap.add_argument("--training-layers", type=int, nargs="*", default=[96])
    ap.add_argument("--training-meshes", nargs="*", default=["4x4", "64x32"])
    ap.add_argument("--training-reps", type=int, default=5)
    ap.add_argument("--training-only", action="store_true", help="only the training table")
    ap.add_argument("--pipeline-meshes", nargs="*", default=["8x1x2", "8x4x4", "8x16x16"])
    ap.add_argument("--pipeline-only", action="store_true", help="only the pipeline table")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="gspmd-bench-scale.")
    if args.pipeline_only or (not args.training_only and args.pipeline_meshes):
        if not args.pipeline_only:
            scale_table(args, work)
            print("\nA pipeline (simulate --pipeline stage --microbatches 16, 96 layers, batch 256):\n")
        pipeline_table(args, work)
        if args.pipeline_only:
            return
    elif not args.training_only:
        scale_table(args, work)
    if args.training_layers and args.training_meshes:
        if not args.training_only:
            print("\nA training step (simulate --training --loss mean) against forward-only simulate:\n")
        training_table(args, work)


def make_model(work, layers, batch=64, sidecar_kind="2d"):
    """The GPT-3-shaped decoder of `layers` layers (cached in work): (directory, model, the sidecar, nodes)."""
    d = os.path.join(work, f"L{layers}" + ("" if batch == 64 else f"_b{batch}"))
    model = os.path.join(d, "gpt3.onnx")
    if not os.path.exists(model):
        subprocess.run([sys.executable, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), "--layers",
                        str(layers), "--d-model", "12288", "--heads", "96", "--vocab", "50257", "--batch", str(batch),
                        "--seq", "2048", "--weights", "absent", "--out", d, "--name", "gpt3"],
                       check=True, stdout=subprocess.DEVNULL)
    side = json.load(open(os.path.join(d, f"gpt3.{sidecar_kind}.sharding.json")))
    import onnx  # Debian's python3-onnx
    nodes = len(onnx.load(model, load_external_data=False).graph.node)
    return d, model, side, nodes


def sidecar(d, side, mesh):
    """The 2D sidecar on `mesh` ("64x32"), written next to the model; returns its path."""
    side["mesh"]["shape"] = [int(s) for s in mesh.split("x")]
    sfile = os.path.join(d, f"s_{mesh}.json")
    json.dump(side, open(sfile, "w"))
    return sfile


def timed(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def scale_table(args, work):
    print("| layers | nodes | mesh | devices | simulate wall (s) | ratio | load | propagate | partition | cost |"
          " step (s) | utilization | memory/device (GiB) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for layers in args.layers:
        d, model, side, nodes = make_model(work, layers)
        for mesh in args.meshes:
            sfile = sidecar(d, side, mesh)
            report = os.path.join(d, f"r_{mesh}.json")
            best = None
            for _ in range(args.reps):
                t = timed([args.bin, "simulate", model, "--mesh", mesh, "--shardings", sfile, "--report", report])
                best = t if best is None else min(best, t)
            base = base or best
            r = json.load(open(report))
            s, c = r["simulated"], r["compile_time_s"]
            mem = s["per_device"][0]["peak_memory_bytes"] / 2**30
            print(f"| {layers} | {nodes} | {mesh} | {r['devices']} | {best:.3f} | {best / base:.2f} | "
                  f"{c['load']:.3f} | {c['propagate']:.3f} | {c['partition']:.3f} | {c['cost']:.3f} | "
                  f"{s['step_time_s']:.3f} | {100 * s['flops_utilization']:.1f}% | {mem:.1f} |", flush=True)


def pipeline_table(args, work):
    print("| mesh (stage x data x model) | devices | simulate wall (s) | ratio | load | propagate | partition | cost |"
          " iterations | bubble | step (s) | utilization | memory/device (GiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    d, model, side, _ = make_model(work, 96, batch=256, sidecar_kind="megatron")
    side["mesh"]["axes"] = ["stage", "data", "model"]
    base = None
    for mesh in args.pipeline_meshes:
        sfile = sidecar(d, side, mesh)
        report = os.path.join(d, f"rp_{mesh}.json")
        cmd = [args.bin, "simulate", model, "--mesh", mesh, "--shardings", sfile, "--pipeline", "stage",
               "--microbatches", "16", "--report", report]
        best = min(timed(cmd) for _ in range(args.reps))
        base = base or best
        r = json.load(open(report))
        s, c, p = r["simulated"], r["compile_time_s"], r["pipeline"]
        mem = s["per_device"][0]["peak_memory_bytes"] / 2**30
        print(f"| {mesh} | {r['devices']} | {best:.3f} | {best / base:.2f} | {c['load']:.3f} | {c['propagate']:.3f} | "
              f"{c['partition']:.3f} | {c['cost']:.3f} | {p['iterations']} | {100 * p['bubble_fraction']:.1f}% | "
              f"{s['step_time_s']:.3f} | {100 * s['flops_utilization']:.1f}% | {mem:.1f} |", flush=True)


def training_table(args, work):
    print("| layers | nodes | mesh | devices | forward wall (s) | training wall (s) | training / forward |"
          " load f / t (s) | propagate f / t (s) | partition f / t (s) | cost f / t (s) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers in args.training_layers:
        d, model, side, nodes = make_model(work, layers)
        for mesh in args.training_meshes:
            sfile = sidecar(d, side, mesh)
            rf, rt = os.path.join(d, f"rf_{mesh}.json"), os.path.join(d, f"rt_{mesh}.json")
            base = [args.bin, "simulate", model, "--mesh", mesh, "--shardings", sfile]
            tf, tt = [], []
            for _ in range(args.training_reps):
                tf.append(timed(base + ["--report", rf]))
                tt.append(timed(base + ["--training", "--loss", "mean", "--report", rt]))
            ratio = statistics.median(b / a for a, b in zip(tf, tt))
            cf, ct = json.load(open(rf))["compile_time_s"], json.load(open(rt))["compile_time_s"]
            med = statistics.median
            print(f"| {layers} | {nodes} | {mesh} | {json.load(open(rf))['devices']} | {med(tf):.3f} | {med(tt):.3f} | "
                  f"{ratio:.2f} | {cf['load']:.3f} / {ct['load']:.3f} | {cf['propagate']:.3f} / {ct['propagate']:.3f} | "
                  f"{cf['partition']:.3f} / {ct['partition']:.3f} | {cf['cost']:.3f} / {ct['cost']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
