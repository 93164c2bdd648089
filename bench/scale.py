#!/usr/bin/python3
"""bench/scale.py: partitioner and cost-model time versus layers and devices.

GPT-3 175B shapes (d_model 12288, 96 heads, MLP 49152, vocab 50257, sequence 2048, batch 64), weights as absent
external data, the GSPMD paper's 2D sharding (testdata/tools/make_decoder.py's NAME.2d.sharding.json) on meshes of 4
to 2048 devices. For each (layers, mesh): the best-of-REPS wall time of `gspmd-onnx simulate` and of its stages (the
report's "compile_time_s"), and the ratio to the first row, all measured in one run. Prints a markdown table.

    /usr/bin/python3 bench/scale.py [--layers 12 24 48 96] [--meshes 2x2 ... 64x32] [--reps 3] [--bin PATH]
"""
import argparse
import json
import os
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
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="gspmd-bench-scale.")
    print("| layers | nodes | mesh | devices | simulate wall (s) | ratio | load | propagate | partition | cost |"
          " step (s) | utilization | memory/device (GiB) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for layers in args.layers:
        d = os.path.join(work, f"L{layers}")
        subprocess.run([sys.executable, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), "--layers",
                        str(layers), "--d-model", "12288", "--heads", "96", "--vocab", "50257", "--batch", "64",
                        "--seq", "2048", "--weights", "absent", "--out", d, "--name", "gpt3"],
                       check=True, stdout=subprocess.DEVNULL)
        side = json.load(open(os.path.join(d, "gpt3.2d.sharding.json")))
        model = os.path.join(d, "gpt3.onnx")
        import onnx  # Debian's python3-onnx
        nodes = len(onnx.load(model, load_external_data=False).graph.node)
        for mesh in args.meshes:
            side["mesh"]["shape"] = [int(s) for s in mesh.split("x")]
            sfile = os.path.join(d, f"s_{mesh}.json")
            json.dump(side, open(sfile, "w"))
            report = os.path.join(d, f"r_{mesh}.json")
            best = None
            for _ in range(args.reps):
                t0 = time.perf_counter()
                subprocess.run([args.bin, "simulate", model, "--mesh", mesh, "--shardings", sfile, "--report", report],
                               check=True, stdout=subprocess.DEVNULL)
                t = time.perf_counter() - t0
                best = t if best is None else min(best, t)
            base = base or best
            r = json.load(open(report))
            s, c = r["simulated"], r["compile_time_s"]
            mem = s["per_device"][0]["peak_memory_bytes"] / 2**30
            print(f"| {layers} | {nodes} | {mesh} | {r['devices']} | {best:.3f} | {best / base:.2f} | "
                  f"{c['load']:.3f} | {c['propagate']:.3f} | {c['partition']:.3f} | {c['cost']:.3f} | "
                  f"{s['step_time_s']:.3f} | {100 * s['flops_utilization']:.1f}% | {mem:.1f} |", flush=True)


if __name__ == "__main__":
    main()
