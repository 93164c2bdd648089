#!/usr/bin/python3
"""bench/auto_gpus.py: `--auto` on GPT models of 1.3B to 175B over 8 to 2048 devices, against the classical plans.

Each model is a shapes-only GPT decoder from testdata/tools/make_decoder.py (bfloat16, weights as graph inputs, as
in a JAX step), simulated as one training step (Adam, mean loss) on `dgx-h100` (8 GPUs per node, NVLink inside,
InfiniBand between) and on `tpu-v4`, on a mesh `data x model` with the model axis of 8 inside a node (a row of the
TPU slice). `--auto` is given only the mesh and chooses the shardings, the remat policy and whether the weight update
is sharded over the data axis (ZeRO-1/2); its report also holds every
classical plan it started from (data parallel, FSDP, Megatron + data, Megatron with sequence parallelism, the GSPMD
paper's 2D plan), each costed under its best remat policy (estimated from one and two layers; the chosen plan is
costed on the whole model). The table prints the chosen plan's step and peak, each classical plan's step (or "-"
where it does not fit the device's memory), the ratio of the best classical plan that fits to --auto, and the
search's wall time on this machine.

The 1.3B to 39B rows are Alpa's GPT weak-scaling settings (Zheng et al., OSDI'22; the shapes, device counts, global
batch 1024 and sequence 1024 from alpa-projects/alpa, benchmark/alpa/paper_auto_gpt_suite.py; Alpa runs 1.3B on 4
devices, here on 8): same models, same device counts, same global batch, trained as 16 microbatches of 64 sequences
with gradient accumulation (`--accumulate 16`: the model is made at batch 64; Alpa's suite searches 32 to 1024
microbatches for these settings, with pipeline stages). The comparison is of the settings and the plans, not of
throughputs on other hardware.

    /usr/bin/python3 bench/auto_gpus.py [--bin PATH] [--targets dgx-h100 tpu-v4] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (layers, d_model, heads, vocab, seq, global batch, devices, microbatches). Alpa's suite: S, H, L, heads,
# V = 51200.
MODELS = [
    ("1.3B", 24, 2048, 32, 51200, 1024, 1024, 8, 16),
    ("2.6B", 32, 2560, 32, 51200, 1024, 1024, 8, 16),
    ("6.7B", 32, 4096, 32, 51200, 1024, 1024, 16, 16),
    ("15B", 48, 5120, 40, 51200, 1024, 1024, 32, 16),
    ("39B", 48, 8192, 64, 51200, 1024, 1024, 64, 16),
    # GPT-3 175B (Brown et al. 2020: 96 layers, d_model 12288, 96 heads, sequence 2048), batch 1536 sequences.
    ("175B", 96, 12288, 96, 51200, 2048, 1536, 1024, 1),
    ("175B", 96, 12288, 96, 51200, 2048, 2048, 2048, 1),
]
TRAINING = ["--training", "--trainable", r"\.(weight|bias)$", "--loss", "mean", "--optimizer", "adam"]
CLASSICAL = ["data-parallel", "fsdp", "megatron+data", "megatron-sp", "2d"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gspmd-onnx"))
    ap.add_argument("--targets", nargs="+", default=["dgx-h100", "tpu-v4"])
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gspmd-bench-auto-gpus.") as work:
        for name, layers, d, heads, vocab, seq, batch, devices, micro in MODELS:
            mesh = f"{devices // 8}x8"  # the model axis inside a node (8 GPUs)
            out = os.path.join(work, f"{name}_{devices}")
            os.makedirs(out)
            subprocess.run([sys.executable, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), "--layers",
                            str(layers), "--d-model", str(d), "--heads", str(heads), "--vocab", str(vocab), "--batch",
                            str(batch // micro), "--seq", str(seq), "--weights", "inputs", "--dtype", "bfloat16", "--mesh",
                            mesh, "--out", out, "--name", "lm"], check=True, stdout=subprocess.DEVNULL)
            for target in args.targets:
                report = os.path.join(out, f"{target}.json")
                r = subprocess.run([args.bin, "simulate", os.path.join(out, "lm.onnx"), "--mesh", mesh, "--target",
                                    target, "--auto", "--report", report, "--accumulate", str(micro)] + TRAINING,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                row = {"model": name, "devices": devices, "mesh": mesh, "target": target, "batch": batch,
                       "microbatches": micro, "seq": seq}
                if r.returncode != 0:
                    row["error"] = r.stderr.strip()
                    rows.append(row)
                    continue
                rep = json.load(open(report))
                a = rep["auto"]
                row.update({"auto_step_s": a["chosen"]["step_time_s"],
                            "auto_peak_bytes": a["chosen"]["peak_memory_bytes"],
                            "remat": rep["training"]["remat"], "shard_update": rep["training"]["shard_update"],
                            "search_s": a["search_time_s"],
                            "mfu": rep["simulated"]["flops_utilization"],
                            "plans": a["evaluations"], "classical": {}})
                for b in a["baselines"]:
                    if b["name"] in CLASSICAL and b.get("valid"):
                        row["classical"][b["name"]] = {"step_s": b["step_time_s"], "fits": b["fits"],
                                                       "peak_bytes": b["peak_memory_bytes"]}
                fitting = [c["step_s"] for c in row["classical"].values() if c["fits"]]
                row["best_classical_over_auto"] = min(fitting) / row["auto_step_s"] if fitting else None
                rows.append(row)
    print("| model | devices (mesh) | batch | target | --auto step (s) | MFU | peak (GiB) | remat, update | " +
          " | ".join(CLASSICAL) + " | best classical / --auto | search (s) |")
    print("|---|---:|---|---|---:|---:|---:|---|" + "---:|" * len(CLASSICAL) + "---:|---:|")
    for r in rows:
        batch = f"{r['batch']}" + (f" = {r['microbatches']} x {r['batch'] // r['microbatches']}"
                                   if r["microbatches"] > 1 else "")
        if "error" in r:
            print(f"| {r['model']} | {r['devices']} ({r['mesh']}) | {batch} | {r['target']} | {r['error']} |")
            continue
        cells = []
        for c in CLASSICAL:
            x = r["classical"].get(c)
            cells.append(f"{x['step_s']:.3f}" if x and x["fits"] else "-")
        best = r["best_classical_over_auto"]
        print(f"| {r['model']} | {r['devices']} ({r['mesh']}) | {batch} | {r['target']} | {r['auto_step_s']:.3f} | "
              f"{100 * r['mfu']:.0f}% | "
              f"{r['auto_peak_bytes'] / 2**30:.1f} | {r['remat']}"
              f"{', sharded over ' + r['shard_update'] if r['shard_update'] else ''} | " + " | ".join(cells) +
              f" | {'%.2f' % best if best else 'none fits'} | {r['search_s']:.1f} |")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
