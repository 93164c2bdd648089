#!/usr/bin/python3
"""bench/paper.py: the GSPMD paper's dense-Transformer setting, predicted with `gspmd-onnx simulate`.

Xu et al. 2021 (arXiv:2105.04663) report 50% to 62% compute utilization for dense Transformer language models with
2D sharding on 128 to 2048 TPUv3 cores. This script builds a GPT-3-sized decoder (96 layers, d_model 12288, 96
heads, MLP 49152, vocab 50257, sequence 2048, weights as graph inputs as in a training step) with
testdata/tools/make_decoder.py, applies the paper's 2D sharding, and simulates one forward step on tpu-v3 meshes of
128 to 2048 cores, with 2 sequences per data-parallel row (global batch = 2 X). For each mesh it prints the predicted
step, utilization, peak memory per device and the communication broken down by collective and axis, first as the
model is (float32 everywhere), then with --overlap, then with bfloat16 bytes (float32 FLOPs, half the bytes on
every link and HBM access: a target file with doubled bandwidths, which is exactly equivalent in this cost model).
With --training (docs/training.md) it then simulates one training step of the same model (weights as initializers
held in the same 2D sharding, so a weight is all-gathered where it is used and its gradient reduce-scattered; the
causal mask is not trained; mean loss; Adafactor, as GShard and Lingvo train these models): the step, the peak
memory split by kind, and the collectives by phase (forward, backward, update).
With --lingvo it instead simulates the training steps of the six dense-LM configurations of Lingvo's
lm/params/synthetic_packed_input.py, the file the paper's dense-LM runs come from (LINGVO below: the shapes, meshes,
batches, optimizers and the tokens/s each class's comment expects on TPU v3), with --precision mixed and --remat
full, and prints predicted against expected throughput as utilization, and where each step's time goes.
See docs/paper-reproduction.md for the discussion.

    /usr/bin/python3 bench/paper.py [--meshes 8x16 16x16 32x16 32x32 64x32] [--training] [--bin PATH]
    /usr/bin/python3 bench/paper.py --lingvo [--json FILE]
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def simulate(binary, model, mesh, side, report, extra):
    subprocess.run([binary, "simulate", model, "--mesh", mesh, "--shardings", side, "--report", report] + extra,
                   check=True, stdout=subprocess.DEVNULL)
    return json.load(open(report))


def three_ways(args, d, mesh, weights, extra, bf16):
    """Builds the GPT-3-sized decoder for `mesh` (2 sequences per data row, --weights `weights`) in `d` and simulates
    it with the paper's 2D sharding and `extra` flags: as is, with --overlap, and with --overlap and bf16 bytes."""
    x = int(mesh.split("x")[0])
    subprocess.run([sys.executable, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), "--layers",
                    str(args.layers), "--d-model", "12288", "--heads", "96", "--vocab", "50257", "--batch", str(2 * x),
                    "--seq", "2048", "--weights", weights, "--mesh", mesh, "--out", d, "--name", "gpt3"],
                   check=True, stdout=subprocess.DEVNULL)
    model, side = os.path.join(d, "gpt3.onnx"), os.path.join(d, "gpt3.2d.sharding.json")
    return (simulate(args.bin, model, mesh, side, os.path.join(d, "a.json"), extra),
            simulate(args.bin, model, mesh, side, os.path.join(d, "b.json"), extra + ["--overlap"]),
            simulate(args.bin, model, mesh, side, os.path.join(d, "c.json"), extra + ["--overlap", "--target", bf16]))


def table(header, text_columns, rows):
    """Prints a markdown table: `header`, its separator (the first `text_columns` left-aligned, the rest right-aligned)
    and `rows`."""
    n = header.count("|") - 1
    print(header)
    print("|" + "|".join("---" if i < text_columns else "---:" for i in range(n)) + "|")
    print("\n".join(rows))


def group_collectives(report, key):
    """The report's collectives summed per key(c): [count, bytes, time_s]."""
    by = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for c in report["collectives"]:
        e = by[key(c)]
        e[0] += c["count"]
        e[1] += c["count"] * c["bytes"]
        e[2] += c["count"] * c["time_s"]
    return by


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshes", nargs="+", default=["8x16", "16x16", "32x16", "32x32", "64x32"])
    ap.add_argument("--layers", type=int, default=96)
    ap.add_argument("--training", action="store_true", help="also simulate one training step (docs/training.md)")
    ap.add_argument("--lingvo", action="store_true",
                    help="only the training steps of Lingvo's six dense-LM configurations (LINGVO), against their "
                         "expected tokens/s")
    ap.add_argument("--json", help="--lingvo: also write the table's rows here")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gspmd-onnx"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="gspmd-bench-paper.")
    if args.lingvo:
        lingvo(args, work)
        return
    bf16 = os.path.join(work, "tpu-v3-bf16-bytes.json")
    json.dump({"base": "tpu-v3", "name": "tpu-v3 (bf16 bytes)", "hbm_bandwidth": 2 * 450e9,
               "link_bandwidth": 2 * 340e12 / 1024 / 4 / 2}, open(bf16, "w"))
    rows, breakdown = [], []
    for mesh in args.meshes:
        x, y = (int(s) for s in mesh.split("x"))
        plain, over, half = three_ways(args, os.path.join(work, mesh), mesh, "inputs", [], bf16)
        s = plain["simulated"]
        ideal = plain["model_flops"] / (x * y * plain["target_spec"]["peak_flops"])
        rows.append(f"| {mesh} | {x * y} | {2 * x} | {plain['model_flops']:.3g} | {ideal:.3f} | "
                    f"{s['compute_time_s']:.3f} | {s['communication_time_s']:.3f} | {s['step_time_s']:.3f} | "
                    f"{100 * s['flops_utilization']:.1f}% | {100 * over['simulated']['flops_utilization']:.1f}% | "
                    f"{100 * half['simulated']['flops_utilization']:.1f}% | "
                    f"{s['per_device'][0]['peak_memory_bytes'] / 2**30:.2f} |")
        by = group_collectives(plain, lambda c: (c["kind"], ",".join(c["axes"])))
        for (kind, axes), (n, b, t) in sorted(by.items(), key=lambda kv: -kv[1][2]):
            breakdown.append(f"| {mesh} | {kind} | {axes} | {n} | {b / 2**30:.2f} | {t:.3f} | "
                             f"{100 * t / s['communication_time_s']:.0f}% |")
    table("| mesh (X x Y) | cores | batch | model FLOPs | ideal step (s) | compute (s) | communication (s) | step (s) |"
          " utilization | with --overlap | overlap + bf16 bytes | memory/core (GiB) |", 1, rows)
    print()
    table("| mesh | collective | axis | count | GiB per device | time (s) | share of communication |", 3, breakdown)
    if args.training:
        training(args, work, bf16)


def phase(node):
    """The step phase of a collective's global node (docs/training.md names: remat/..., grad/..., update/...)."""
    if node.startswith("update/"):
        return "update"
    if node.startswith("remat/"):
        return "recompute"
    if node.startswith("grad/") and not node.startswith("grad/step/"):
        return "backward"
    return "forward"


def training(args, work, bf16):
    train = ["--training", "--loss", "mean", "--optimizer", "adafactor", "--trainable", r"\.(weight|bias)$"]
    rows, breakdown = [], []
    for mesh in args.meshes:
        x, y = (int(s) for s in mesh.split("x"))
        plain, over, half = three_ways(args, os.path.join(work, "train_" + mesh), mesh, "absent", train, bf16)
        s = plain["simulated"]
        m = s["memory"]["at_peak"]
        gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
        rows.append(f"| {mesh} | {x * y} | {2 * x} | {plain['model_flops']:.3g} | {s['compute_time_s']:.3f} | "
                    f"{s['communication_time_s']:.3f} | {s['step_time_s']:.3f} | "
                    f"{100 * s['flops_utilization']:.1f}% | {100 * over['simulated']['flops_utilization']:.1f}% | "
                    f"{100 * half['simulated']['flops_utilization']:.1f}% | {gib(s['memory']['peak_bytes'])} | "
                    f"{gib(m['weights'])} | {gib(m['gradients'])} | {gib(m['optimizer_state'])} | "
                    f"{gib(m['saved_activations'])} | {gib(m['transient'])} |")
        by = group_collectives(plain, lambda c: (phase(c["node"]), c["kind"], ",".join(c["axes"])))
        for (ph, kind, axes), (n, b, t) in sorted(by.items(), key=lambda kv: (kv[0][0] != "forward", -kv[1][2])):
            breakdown.append(f"| {mesh} | {ph} | {kind} | {axes} | {n} | {b / 2**30:.2f} | {t:.3f} |")
    print()
    table("| mesh (X x Y) | cores | batch | model FLOPs | compute (s) | communication (s) | step (s) | utilization |"
          " with --overlap | overlap + bf16 bytes | peak/core (GiB) | weights | gradients | optimizer state |"
          " saved activations | transient |", 1, rows)
    print()
    table("| mesh | phase | collective | axis | count | GiB per device | time (s) |", 4, breakdown)


# The dense-LM configurations of Lingvo's lingvo/tasks/lm/params/synthetic_packed_input.py (the GSPMD paper's
# dense-LM runs; TPU v3, one device per core): the class, DEVICE_MESH_SHAPE as data x model (axis 0 splits the batch
# and the weights' d_model, axis 1 the heads, the hidden dim and the activations' d_model), NUM_TRANSFORMER_LAYERS,
# MODEL_DIM, NUM_HEADS (of ATTENTION_KEY_VALUE_DIM 128), HIDDEN_DIM, GATED_GELU, POSITIONAL_EMBEDDING,
# SEQUENCE_LENGTH, the global batch (BATCH_DIM_PER_DEVICE x NUM_DEVICES_PER_SPLIT), the optimizer, and the tokens/s
# the class's comment expects ("Expect ~ 3.7k tokens/sec"). VOCAB_SIZE is 32000 in all six.
LINGVO = [
    ("DenseLm128B8x8", "8x16", 64, 8192, 128, 65536, True, False, 1024, 16, "adafactor", 3.7e3),
    ("DenseLm128B16x16", "16x32", 64, 8192, 128, 65536, True, False, 1024, 128, "adafactor", 18e3),
    ("DenseLm128B32x32", "32x64", 64, 8192, 128, 65536, True, False, 1024, 512, "adafactor", 62e3),
    ("DenseLm175B32x32", "64x32", 96, 12288, 96, 49152, False, True, 2048, 1024, "adafactor", 51.53e3),
    ("DenseLm1T16x16", "16x32", 128, 16384, 256, 131072, True, False, 512, 16, "adafactor", 1.4e3),
    ("DenseLm12kWide162BAdam16x16", "16x32", 96, 12288, 96, 49152, False, True, 2048, 64, "adam", 12.5e3),
]
# FLOPs per parameter per token of a training step with full rematerialization: 2 in the forward pass, 2 in its
# recomputation, 4 in the backward pass (two matmuls per weight). Predicted and expected throughput are both turned
# into utilization with it, so their difference in points is a difference in tokens/s.
FLOPS_PER_PARAM_TOKEN = 8


def lingvo(args, work):
    """Simulates one training step of each LINGVO configuration (make_decoder.py's graph with the configuration's
    shapes, weights as variables, the paper's 2D sharding, --precision mixed, --remat full, the class's optimizer),
    with and without --overlap, and prints predicted against expected throughput and where the time goes."""
    rows, time_rows, out = [], [], []
    for (name, mesh, layers, d, heads, ffn, gated, positions, seq, batch, optimizer, expected) in LINGVO:
        x, y = (int(s) for s in mesh.split("x"))
        cores = x * y
        dd = os.path.join(work, name)
        subprocess.run([sys.executable, os.path.join(ROOT, "testdata", "tools", "make_decoder.py"), "--layers",
                        str(layers), "--d-model", str(d), "--heads", str(heads), "--head-dim", "128", "--mlp",
                        str(ffn), "--vocab", "32000", "--batch", str(batch), "--seq", str(seq), "--weights", "inputs",
                        "--mesh", mesh, "--out", dd, "--name", "lm"] + (["--gated"] if gated else []) +
                       ([] if positions else ["--no-positions"]), check=True, stdout=subprocess.DEVNULL)
        model, side = os.path.join(dd, "lm.onnx"), os.path.join(dd, "lm.2d.sharding.json")
        flags = ["--training", "--loss", "mean", "--optimizer", optimizer, "--trainable", r"\.(weight|bias)$",
                 "--precision", "mixed", "--remat", "full"]
        plain = simulate(args.bin, model, mesh, side, os.path.join(dd, "a.json"), flags)
        over = simulate(args.bin, model, mesh, side, os.path.join(dd, "b.json"), flags + ["--overlap"])
        s = plain["simulated"]
        params = plain["training"]["weight_bytes"] / 4  # the float32 master weights of --precision mixed
        tokens = batch * seq
        predicted = tokens / s["step_time_s"]
        util = lambda tps: 100 * tps * FLOPS_PER_PARAM_TOKEN * params / (cores * plain["target_spec"]["peak_flops"])  # noqa: E731
        row = {"configuration": name, "mesh": mesh, "cores": cores, "params": params, "tokens_per_step": tokens,
               "step_time_s": s["step_time_s"], "predicted_tokens_per_s": predicted,
               "expected_tokens_per_s": expected, "predicted_utilization": util(predicted),
               "expected_utilization": util(expected), "difference_points": util(predicted) - util(expected),
               "model_flops_utilization": 100 * s["flops_utilization"], "compute_time_s": s["compute_time_s"],
               "overlap_hides_s": s["step_time_s"] - over["simulated"]["step_time_s"],
               "peak_memory_gib": s["memory"]["peak_bytes"] / 2**30}
        by = group_collectives(plain, lambda c: (phase(c["node"]), c["kind"]))
        row["collectives_s"] = {f"{ph} {kind}": t for (ph, kind), (n, b, t) in by.items()}
        out.append(row)
        rows.append(f"| {name} | {cores} ({mesh}) | {params / 1e9:.1f} B | {tokens} | {s['step_time_s']:.2f} | "
                    f"{predicted / 1e3:.2f}k | {expected / 1e3:.2f}k | {row['predicted_utilization']:.1f}% | "
                    f"{row['expected_utilization']:.1f}% | {row['difference_points']:+.1f} | "
                    f"{row['model_flops_utilization']:.1f}% | {row['peak_memory_gib']:.1f} |")
        t = collections.defaultdict(float)
        for (ph, kind), (n, b, sec) in by.items():
            t[kind if kind == "all-reduce" else ("backward " if ph == "backward" else "forward ") + kind] += sec
        time_rows.append(f"| {name} | {s['step_time_s']:.2f} | {s['compute_time_s']:.2f} | "
                         f"{s['communication_time_s']:.2f} | " +
                         " | ".join(f"{t[k]:.2f}" for k in ("forward all-gather", "forward reduce-scatter",
                                                             "backward all-gather", "backward reduce-scatter",
                                                             "all-reduce")) +
                         f" | {row['overlap_hides_s']:.2f} |")
    table("| configuration | cores (mesh) | parameters | tokens/step | step (s) | predicted tokens/s |"
          " expected tokens/s | predicted | expected | difference (points) | MFU | peak/core (GiB) |", 1, rows)
    print()
    table("| configuration | step (s) | compute | communication | forward all-gather | forward reduce-scatter |"
          " backward all-gather | backward reduce-scatter | all-reduce | --overlap hides |", 1, time_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
