#!/usr/bin/python3
"""bench/load.py: load, propagate, partition and run time of this build against a baseline build, measured in one run.

For each model, the two binaries run in turn (A B A B ...), REPS times each. The table gives the medians of the
report's stage times (`compile_time_s`: `load`: parse, ONNX inference, typing and folding, sharding file;
`propagate`; `partition`) and of the host run's wall time (`host.wall_s`), and for each the median of the per-pair
ratios A / B. A ratio above 1 means this build is slower.

    /usr/bin/python3 bench/load.py --baseline OLD/build/bin/gspmd-onnx [--bin build/bin/gspmd-onnx] [--reps 5]

The baseline is any earlier build, e.g. `git worktree add /tmp/before <commit>` and build its gspmd-onnx there.
Models: the GPT-3 175B decoder (96 layers, weights absent: `simulate`, load only), the bundled GPT and BERT (the
`_nofold` export has every shape sub-graph still in it), and torchvision's resnet18 (exported here).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"


def models(work):
    """(name, command args without the binary) of every case; generates the models that are not committed."""
    gpt3 = os.path.join(work, "gpt3")
    if not os.path.exists(os.path.join(gpt3, "gpt3.onnx")):
        subprocess.run([PY, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), "--layers", "96",
                        "--d-model", "12288", "--heads", "96", "--vocab", "50257", "--batch", "64", "--seq", "2048",
                        "--weights", "absent", "--mesh", "4x4", "--out", gpt3, "--name", "gpt3"],
                       check=True, stdout=subprocess.DEVNULL)
    cnn = os.path.join(work, "cnn")
    if not os.path.exists(os.path.join(cnn, "resnet18.onnx")):
        subprocess.run([PY, os.path.join(ROOT, "testdata", "cnn", "export_cnn.py"), "--model", "resnet18",
                        "--batch", "2", "--out", cnn], check=True, stdout=subprocess.DEVNULL)
    t = os.path.join(ROOT, "testdata")
    return [
        ("gpt3-175B 96 layers, simulate 4x4", ["simulate", os.path.join(gpt3, "gpt3.onnx"), "--mesh", "4x4",
                                               "--shardings", os.path.join(gpt3, "gpt3.2d.sharding.json")], False),
        ("gpt opset 17, run 2x2 megatron", ["run", f"{t}/gpt/gpt_opset17.onnx", "--mesh", "2x2", "--shardings",
                                            f"{t}/gpt/gpt.megatron.sharding.json", "--inputs",
                                            f"{t}/gpt/test_data_set_0"], True),
        ("bert opset 13 nofold, run 1", ["run", f"{t}/bert/bert_opset13_nofold.onnx", "--mesh", "1", "--inputs",
                                         f"{t}/bert/test_data_set_0"], True),
        ("resnet18 batch 2, run 1", ["run", os.path.join(cnn, "resnet18.onnx"), "--mesh", "1"], True),
    ]


def one(binary, args, report):
    subprocess.run([binary] + args + ["--report", report], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))
    with open(report) as f:
        r = json.load(f)
    c = r["compile_time_s"]
    return c["load"], c["propagate"], c["partition"], r.get("host", {}).get("wall_s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gspmd-onnx"))
    ap.add_argument("--baseline", required=True, help="the earlier build's gspmd-onnx")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "gspmd-bench-load"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    report = os.path.join(args.work, "report.json")
    stages = ["load", "propagate", "partition", "run"]
    print("| model | " + " | ".join(f"{s} A (s) | {s} B (s) | A/B" for s in stages) + " |")
    print("|---|" + "---:|" * (3 * len(stages)))
    for name, cmd, runs in models(args.work):
        a, b = [], []  # per repetition: the stage times
        for _ in range(args.reps):
            a.append(one(args.bin, cmd, report))
            b.append(one(args.baseline, cmd, report))
        row = f"| {name} |"
        for k, st in enumerate(stages):
            if st == "run" and not runs:
                row += " - | - | - |"
                continue
            xa, xb = [r[k] for r in a], [r[k] for r in b]
            ratio = statistics.median(x / y for x, y in zip(xa, xb) if y)
            row += f" {statistics.median(xa):.4f} | {statistics.median(xb):.4f} | {ratio:.2f} |"
        print(row, flush=True)


if __name__ == "__main__":
    sys.exit(main())
