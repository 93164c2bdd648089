#!/usr/bin/python3
"""bench/auto_pod.py: `--auto` at the GSPMD paper's scale, against the paper's hand-written 2D plan.

The paper's dense LMs as Lingvo trains them (bfloat16, weights as graph inputs): 128B on 512 TPU v3 cores (mesh
16x32) and GPT-3 175B on 2048 (64x32), built by testdata/tools/make_decoder.py. For each, forward and training step
(Adafactor, mean loss), the script simulates the hand-written 2D sidecar (the training step under each --remat
policy, the fastest that fits counting) and `--auto` given only the mesh (the search chooses the remat policy and
the weight-update sharding too),
and prints the step and peak memory of both, their ratio, whether --auto's plan fits in the 16 GiB of a v3 core,
and the search's wall time (the report's `auto.search_time_s`; seconds on this machine, which vary between runs).
docs/auto.md, "Scale", discusses the numbers.

    /usr/bin/python3 bench/auto_pod.py [--bin PATH] [--json FILE] [--only 128B|175B]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HBM = 16 << 30  # a TPU v3 core's HBM (docs/cost-model.md)

# name: (make_decoder.py flags, mesh)
MODELS = {
    "128B": (["--layers", "64", "--d-model", "8192", "--heads", "128", "--head-dim", "128", "--mlp", "65536",
              "--vocab", "32000", "--batch", "128", "--seq", "1024", "--gated", "--no-positions"], "16x32"),
    "175B": (["--layers", "96", "--d-model", "12288", "--heads", "96", "--vocab", "50257", "--batch", "128",
              "--seq", "2048"], "64x32"),
}
TRAINING = ["--training", "--trainable", r"\.(weight|bias)$", "--loss", "mean", "--optimizer", "adafactor"]


def simulate(binary, model, mesh, flags, report):
    r = subprocess.run([binary, "simulate", model, "--mesh", mesh, "--report", report] + flags,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"simulate {' '.join(flags)}: {r.stderr.strip()}")
    rep = json.load(open(report))
    per = rep["simulated"]["per_device"][0]
    return {"step_s": rep["simulated"]["step_time_s"], "peak_bytes": per["peak_memory_bytes"],
            "remat": rep.get("training", {}).get("remat", ""),
            "shard_update": rep.get("training", {}).get("shard_update"), "auto": rep.get("auto")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gspmd-onnx"))
    ap.add_argument("--json", help="also write the rows as JSON")
    ap.add_argument("--only", choices=sorted(MODELS), help="one model only")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gspmd-bench-auto-pod.") as work:
        for name, (flags, mesh) in MODELS.items():
            if args.only and name != args.only:
                continue
            d = os.path.join(work, name)
            os.makedirs(d)
            subprocess.run([sys.executable, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), *flags,
                            "--weights", "inputs", "--dtype", "bfloat16", "--mesh", mesh, "--out", d, "--name", "lm"],
                           check=True, stdout=subprocess.DEVNULL)
            model, side = os.path.join(d, "lm.onnx"), os.path.join(d, "lm.2d.sharding.json")
            for step in ("forward", "training"):
                extra = TRAINING if step == "training" else []
                hand = None
                for remat in (["none", "dots", "full"] if extra else [None]):
                    r = simulate(args.bin, model, mesh, ["--shardings", side] + extra +
                                 (["--remat", remat] if remat else []), os.path.join(d, "hand.json"))
                    fits = r["peak_bytes"] <= HBM
                    if hand is None or (fits, -r["step_s"]) > (hand["peak_bytes"] <= HBM, -hand["step_s"]):
                        hand = r
                a = simulate(args.bin, model, mesh, ["--auto"] + extra, os.path.join(d, "auto.json"))
                rows.append({"model": name, "mesh": mesh, "devices": eval(mesh.replace("x", "*")), "step": step,
                             "hand_step_s": hand["step_s"], "hand_peak_bytes": hand["peak_bytes"],
                             "hand_remat": hand["remat"], "auto_step_s": a["step_s"],
                             "auto_peak_bytes": a["peak_bytes"], "auto_remat": a["remat"],
                             "auto_shard_update": a["shard_update"],
                             "ratio": a["step_s"] / hand["step_s"], "fits": a["peak_bytes"] <= HBM,
                             "search_s": a["auto"]["search_time_s"], "plans": a["auto"]["evaluations"],
                             "layer_blocks": a["auto"]["layer_blocks"]})
    print("| model | devices (mesh) | step | 2D plan: step (s) | peak (GiB) | --auto: step (s) | peak (GiB) | "
          "step ratio | fits 16 GiB | search (s) | plans |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        rm = lambda x: f", remat {x}" if x else ""
        print(f"| {r['model']} | {r['devices']} ({r['mesh']}) | {r['step']} | {r['hand_step_s']:.3f}{rm(r['hand_remat'])}"
              f" | {r['hand_peak_bytes'] / 2**30:.2f} | {r['auto_step_s']:.3f}{rm(r['auto_remat'])}"
              f"{', update sharded over ' + r['auto_shard_update'] if r['auto_shard_update'] else ''} | "
              f"{r['auto_peak_bytes'] / 2**30:.2f} | {r['ratio']:.3f} | {'yes' if r['fits'] else 'NO'} | "
              f"{r['search_s']:.1f} | {r['plans']} |")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
