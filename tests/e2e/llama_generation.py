#!/usr/bin/python3
"""Greedy generation through partitioned device files (issue 27, docs/shapes.md "One partition, every step").

    /usr/bin/python3 tests/e2e/llama_generation.py --gspmd BUILD/bin/gspmd-onnx --plan tp2|tp4|dp2tp2
                     [--tokens 16] [--work DIR]

ctest runs it as mpi.llama_generation_tp2, _tp4 and _dp2tp2 (when the MPI backend is built), and with --emulator
(`run --program` on the emulator: one thread per device, no mpirun) as llama_generation_emulator_dp2tp2. Under dp2tp2 the
batch of 1 is split over 2 devices: one of them holds only padding, and the device files learn the batch from their
gspmd_dims input.

Partitions testdata/llama/model.onnx (a Llama-style decoder exported by torch with dynamic batch, seq and past) ONCE,
with <plan>.plan.json and no --dim, then runs the prefill (the 4-token prompt, an empty KV cache:
past 0) and one decode step per new token (the last token, the grown cache: past 4, 5, ...) with
`mpirun -np N gspmd-onnx run ... --backend mpi --program DIR` (or `run ... --program DIR` on the emulator), every step
on the same device files. Each step's
logits pick the next token (argmax of the last position) and its present_* outputs are the next step's past_*
inputs, as a server's loop does. The tokens must equal generation.json's, torch's own greedy generation.
Exit 0 when they do; 1 with the first difference otherwise.
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parents[2] / "testdata" / "llama"
LAYERS, KV, HD = 2, 2, 16


def write(path: Path, arr, name):
    path.write_bytes(numpy_helper.from_array(np.ascontiguousarray(arr), name=name).SerializeToString())


def read(path: Path):
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gspmd", required=True)
    ap.add_argument("--plan", required=True, choices=["tp2", "tp4", "dp2tp2"])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--work", default="")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--emulator", action="store_true", help="run the device files on the emulator, not under mpirun")
    a = ap.parse_args()
    ref = json.loads((HERE / "generation.json").read_text())
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="gspmd_generate_"))
    work.mkdir(parents=True, exist_ok=True)
    mesh = {"tp2": "2", "tp4": "4", "dp2tp2": "2x2"}[a.plan]
    model, plan, n = HERE / "model.onnx", HERE / f"{a.plan}.plan.json", {"tp2": 2, "tp4": 4, "dp2tp2": 4}[a.plan]
    program = work / "program"
    shutil.rmtree(program, ignore_errors=True)
    subprocess.run([a.gspmd, "partition", str(model), "--mesh", mesh, "--shardings", str(plan), "-o", str(program)],
                   check=True, stdout=subprocess.DEVNULL)
    past_names = [f"past_{kv}_{i}" for i in range(LAYERS) for kv in ("key", "value")]
    ids = np.array([ref["prompt"]], dtype=np.int64)
    past = [np.zeros((1, KV, 0, HD), dtype=np.float32) for _ in past_names]
    tokens = []
    for step in range(a.tokens):
        d_in, d_out = work / f"step{step}_in", work / f"step{step}_out"
        for d in (d_in, d_out):
            shutil.rmtree(d, ignore_errors=True)
        d_in.mkdir()
        write(d_in / "input_0.pb", ids, "input_ids")
        for i, (name, p) in enumerate(zip(past_names, past)):
            write(d_in / f"input_{i + 1}.pb", p, name)
        launch = [] if a.emulator else [a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n)]
        cmd = [*launch, a.gspmd, "run", str(model), "--mesh", mesh, "--shardings", str(plan), "--program",
               str(program), "--inputs", str(d_in), "--outputs", str(d_out), *([] if a.emulator else ["--backend", "mpi"])]
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            sys.exit(f"step {step}: the run did not finish in 120 s")
        if r.returncode != 0:
            sys.exit(f"step {step} (past {past[0].shape[2]}): exit {r.returncode}\n{r.stdout}")
        logits = read(d_out / "output_0.pb")
        past = [read(d_out / f"output_{i + 1}.pb") for i in range(len(past_names))]
        tok = int(logits[0, -1].argmax())
        tokens.append(tok)
        ids = np.array([[tok]], dtype=np.int64)
    want = ref["tokens"][:a.tokens]
    last_past = a.tokens - 1 + len(ref["prompt"]) - 1
    print(f"{a.plan} on {n} {'emulated devices' if a.emulator else 'ranks'}, one partition, {a.tokens} steps (past 0 to {last_past}): {tokens}")
    if tokens != want:
        k = next(i for i, (x, y) in enumerate(zip(tokens, want)) if x != y)
        sys.exit(f"token {k} is {tokens[k]}, torch's is {want[k]} (torch: {want})")
    print("matches torch's greedy generation")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
