#!/usr/bin/python3
"""The bad-input suite (issue 28, docs/errors.md): hundreds of hostile or broken inputs through the real CLI.

    /usr/bin/python3 tests/bad_input/run_bad_inputs.py --bin build/bin/gspmd-onnx [--out DIR] [--seed N]

Every case must end within 20 s with exit 2 or 3 and exactly one line `error: ...` on stderr, and leave no output
behind; or, where the input is legal after all (a byte flip in a weight), exit 0. Never a crash (a signal), a hang,
an internal error (exit 4) or a multi-line error. The kinds:
- model bytes: the bundled GPT truncated at many offsets, and with bytes flipped at many offsets;
- sharding files: JSON truncated at every few bytes, keys and values replaced by wrong types, hostile sizes, deep
  nesting, long names, bad regexes, bad HLO and SBP text;
- flags: bad meshes, dims, seeds, tolerances, targets, output paths.
Prints one line per failing case and a summary; exits 1 when any case breaks the contract.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "testdata/gpt/gpt_opset13.onnx"
MESH = {"shape": [2, 2], "axes": ["data", "model"]}


def model_cases(rng, work: Path):
    data = MODEL.read_bytes()
    cases = []
    for k, cut in enumerate(sorted(rng.sample(range(1, len(data)), 60))):
        p = work / f"trunc_{k}.onnx"
        p.write_bytes(data[:cut])
        cases.append((f"model truncated at {cut}", ["simulate", str(p), "--mesh", "2x2"]))
    for k in range(100):
        b = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 8])):
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256)
        p = work / f"flip_{k}.onnx"
        p.write_bytes(bytes(b))
        cases.append((f"model with flipped bytes #{k}", ["simulate", str(p), "--mesh", "2x2"]))
    return cases


def sharding_cases(rng, work: Path):
    good = {"mesh": MESH, "tensors": {"input_ids": ["data", None], "h.0.mlp.fc_in.weight": [None, "model"]},
            "rules": [{"match": "fc_out\\.weight$", "spec": ["model", None]}]}
    text = json.dumps(good)
    files = []
    for cut in range(1, len(text), 3):  # every third truncation point
        files.append((f"sharding file truncated at {cut}", text[:cut]))
    wrong = [None, 0, -1, 1.5, True, "x", [], {}, [[]], [None], ["data", "data"], 2 ** 62, "z" * 5000]
    for w in wrong:
        for path in (("mesh",), ("mesh", "shape"), ("mesh", "axes"), ("tensors",), ("tensors", "input_ids"),
                     ("rules",), ("rules", 0), ("rules", 0, "match"), ("rules", 0, "spec")):
            doc = json.loads(text)
            node = doc
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = w
            files.append((f"sharding file with {'.'.join(map(str, path))} = {json.dumps(w)[:30]}", json.dumps(doc)))
    hostile = {
        "deep nesting": '{"mesh": ' + "[" * 50000 + "]" * 50000 + "}",
        "huge mesh": json.dumps({"mesh": {"shape": [65536, 65536], "axes": ["a", "b"]}}),
        "long name": json.dumps({"mesh": MESH, "tensors": {"v" * 100000: [None]}}),
        "backtracking rule": json.dumps({"mesh": MESH, "rules": [{"match": "^(.*.*)*X$", "spec": [None, None]}]}),
        "backreference rule": json.dumps({"mesh": MESH, "rules": [{"match": "(a)\\1", "spec": [None]}]}),
        "50,000 alternatives": json.dumps(
            {"mesh": MESH, "rules": [{"match": "|".join(f"w{i}" for i in range(50000)), "spec": [None]}]}),
        "hlo iota of 2^32": json.dumps({"mesh": MESH, "tensors": {"input_ids": {"hlo": "{devices=[1,2]<=[4294967296]}"}}}),
        "bad hlo": json.dumps({"mesh": MESH, "tensors": {"input_ids": {"hlo": "{devices=[2,2]<=[4]T(1,0,7)}"}}}),
        "bad sbp": json.dumps({"mesh": MESH, "tensors": {"input_ids": {"sbp": ["S(9)", "Q"]}}}),
        "not utf-8": b"\xff\xfe{\x00".decode("latin-1"),
        "empty": "",
        "binary": "".join(chr(rng.randrange(256)) for _ in range(200)),
    }
    files += [(f"sharding file: {k}", v) for k, v in hostile.items()]
    cases = []
    for k, (what, body) in enumerate(files):
        p = work / f"s_{k}.json"
        p.write_bytes(body.encode("latin-1") if isinstance(body, str) and any(ord(c) > 127 for c in body[:4])
                      else body.encode("utf-8", "surrogateescape") if isinstance(body, str) else body)
        cases.append((what, ["partition", str(MODEL), "--mesh", "2x2", "--shardings", str(p), "-o",
                             str(work / f"out_s_{k}")]))
    return cases


def flag_cases(work: Path):
    m = str(MODEL)
    bad = [["--mesh", x] for x in ["", "0", "2x0", "-2", "2x", "x2", "2xx2", "99999999999999", "65536x65536", "a"]]
    bad += [["--mesh", "2", "--dim", x] for x in ["=", "batch", "batch=", "batch=-1", "batch=0", "=4", "batch=1e3",
                                                  "batch=2199023255552", "seq=3"]]
    bad += [["--mesh", "2", "--target", x] for x in ["tpu-v9", str(work / "missing.json"), ""]]
    bad += [["--mesh", "2", "--device-order", x] for x in ["q", "x,x", ""]]
    bad += [["--mesh", "2", "--shardings", x] for x in ["", "/dev/null", str(work), "/nonexistent.json"]]
    bad += [["--mesh", "2", "--pipeline", x] for x in ["", "q"]]
    bad += [["--mesh", "2", "--training", "--optimizer", "sgdx"], ["--mesh", "2", "--training", "--trainable", "("],
            ["--mesh", "2", "--training", "--loss", "nope"], ["--mesh", "2", "--remat", "full"],
            ["--mesh", "2", "--memory-limit", "-5"], ["--mesh", "2", "--memory-limit", "lots"]]
    cases = [(f"simulate {' '.join(b)}", ["simulate", m] + b) for b in bad]
    run_bad = [["--seed", "-1"], ["--rtol", "-1", "--check"], ["--atol", "nan", "--check"],
               ["--inputs", "/nonexistent"], ["--expected", "/nonexistent"], ["--outputs", "/proc/x/y"],
               ["--backend", "nope"], ["--program", str(work)], ["--repeat", "3"]]
    cases += [(f"run {' '.join(b)}", ["run", m, "--mesh", "1"] + b) for b in run_bad]
    cases += [("partition -o ''", ["partition", m, "--mesh", "2", "-o", ""]),
              ("partition -o over a file", ["partition", m, "--mesh", "2", "-o", str(MODEL)]),
              ("partition 65536 devices", ["partition", m, "--mesh", "256x256", "-o", str(work / "big")]),
              ("explain --value nope", ["explain", m, "--mesh", "2", "--value", "nope"]),
              ("no command", []), ("unknown command", ["frobnicate", m])]
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    a.bin = str(Path(a.bin).resolve())
    rng = random.Random(a.seed)
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="gspmd_bad_inputs_"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cases = model_cases(rng, work) + sharding_cases(rng, work) + flag_cases(work)
    bad = []
    counts = {}
    for what, args in cases:
        before = set(os.listdir(work))
        try:
            r = subprocess.run([a.bin] + args, capture_output=True, timeout=20, cwd=work,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
        except subprocess.TimeoutExpired:
            bad.append(f"HANG (over 20 s): {what}")
            continue
        err = r.stderr.decode("utf-8", "replace")
        lines = [x for x in err.split("\n") if x]
        counts[r.returncode] = counts.get(r.returncode, 0) + 1
        left = sorted(set(os.listdir(work)) - before)
        if r.returncode < 0:
            bad.append(f"CRASH (signal {-r.returncode}): {what}")
        elif r.returncode in (2, 3):
            if len(lines) != 1 or not lines[0].startswith("error: "):
                bad.append(f"NOT ONE LINE ({len(lines)} lines): {what}: {err[:200]!r}")
            if left:
                bad.append(f"LEFT BEHIND {left}: {what}")
        elif r.returncode != 0:
            bad.append(f"EXIT {r.returncode}: {what}: {err[:200]!r}")
        else:
            for f in left:  # a legal input's outputs are its own
                shutil.rmtree(work / f, ignore_errors=True)
    print(f"bad inputs: {len(cases)} cases, exit codes {dict(sorted(counts.items()))}, {len(bad)} break the contract")
    for b in bad:
        print("  " + b)
    if not a.out:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
