#!/usr/bin/python3
"""Runs the real-model corpus (issue 14) through gspmd-onnx and writes a per-model table.

    /usr/bin/python3 testdata/corpus/run_corpus.py [--families torchvision,transformers,moe,oldopset,npm,segmentation,
        llama,detection]
        [--quick] [--models REGEX] [--no-gen] [--all-plans] [--timeout S] [--bin build/bin/gspmd-onnx]
        [--out build/corpus]

1. Generates the missing models of the chosen families (gen_<family>.py; cached by model and opset under
   build/corpus/models/, see common.py). --no-gen uses only what is cached.
2. Per model: ONNX Runtime's reference (ort_ref.js, cached in ref_ort/), then
   - load:   `gspmd-onnx simulate MODEL --mesh 1` (load, shape inference, folding, propagation, partition);
   - mesh-1: `gspmd-onnx run MODEL --mesh 1 --inputs test_data_set_0 --check --outputs ... --report ...`;
   - dp-2:   the same on --mesh 2 with the data-parallel sharding file (input batch over 2);
   - plan-4: the model-parallel / spatial / expert plan on 4 devices;
   - the family's other plans (segmentation: row2, input rows over 2; detection: row2, the backbone input's rows
     over 2) and, with --all-plans, the extra plans too (CNN channel split; MoE expert x data and expert x model;
     they also run by default for the moe family);
   - train:  one training step (`run --training --loss mean --check`, docs/training.md) under the plan-4 plan (else
     dp-2, else mesh 1): `ok`, `check✗`, `no rule: Op` when an op on the path from a weight to the loss has no
     gradient rule yet, or `data-dep` when the model has data-dependent dims, which training steps do not keep (a
     detector's post-processing); the last two are reported, not failures of --strict.
   Symbolic input dims are bound with --dim NAME=V from the input tensors.
   Every run's outputs are compared with the references (torch eager or numpy in test_data_set_0/, ONNX Runtime in
   ref_ort/): normwise max|a-b| / max|ref| <= --ref-rtol (default 1e-3; the model's meta may loosen it); a detector's as
   detections, in any order among near ties (compare_detections).
3. Writes build/corpus/results.md (the table, the errors grouped by message, the skipped models) and
   build/corpus/results.json; per-run logs and reports under build/corpus/runs/<family>/<model>/.

Cells: `ok` (exit 0, --check passed, outputs match the references, and the collectives are the plan's exact ones
where it names them), `ref✗` (exit 0 and --check passed but the outputs differ from a reference), `coll✗` (other
collectives than the plan's exact ones), `ann✗` (a closed annotation of the plan's sharding file is not exactly
what `partition` writes in shardings.json: annotations are constraints), `check✗` (exit 1: partitioned != unpartitioned), `E2` / `E3` / `E4` (exit codes of
docs/cli.md: bad input / unsupported operator / internal error), `crash` (killed by a signal), `T/O` (timeout),
`-` (not run because loading failed), `heavy` (loaded only; --heavy runs it). `fallbacks`: the largest number of report
warnings over the plans, by kind and op type: R = computed replicated (no sharding rule), G = a split dim gathered
(a conv halo wider than its shard), W = other.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402

FAMILIES = ["torchvision", "transformers", "moe", "oldopset", "npm", "segmentation", "llama", "detection"]
# --quick: a handful of models for CI (< 3 minutes on 2 cores, generation included once torch is imported)
QUICK = {
    "torchvision": ["squeezenet1_0_op13", "mobilenet_v3_small_op17", "mobilenet_v3_small_dyn_op17",
                    "shufflenet_v2_x0_5_op11"],
    "transformers": ["encoder_bf_op13", "decoder_causal_dyn_op17"],
    "moe": ["moe_op17", "moe_mm_op17"],
    "oldopset": ["convnet_opset7", "convnet_opset9"],
    "npm": ["silero_vad"],
    "segmentation": ["lraspp_mobilenet_v3_large_op17"],
    "llama": ["llama_dyn_op17"],
    "detection": ["ssdlite320_mobilenet_v3_large_op17"],
}
# families ("family") or models ("family/model") known to fail, with why: --strict lists their failures as expected,
# and fails when one of them passes (then remove its entry here)
EXPECTED_FAILURES = {}
PLAN_ORDER = ["mesh1", "dp2", "plan4", "tp2", "tp4", "dp2tp2"]


def gen_cmd(family, quick):
    py = "/usr/bin/python3"
    cmd = [py, str(HERE / f"gen_{family}.py")]
    if quick:
        if family == "torchvision":
            names = sorted({n.rsplit("_op", 1)[0].removesuffix("_dyn") for n in QUICK[family]})
            ops = sorted({int(n.rsplit("_op", 1)[1]) for n in QUICK[family]})
            cmd += ["--models", ",".join(names), "--opsets", *map(str, ops)]
        else:
            cmd += ["--only", ",".join(QUICK[family])]
    return cmd


def check_tolerance(fam, d: Path):
    """--check's tolerance. Deep random-init CNNs (torchvision's classifiers and segmentation models) reach outputs of
    1e3-1e4 next to outputs near 0, and a spatial plan sums in another float32 order: rtol 1e-3, and an atol that
    scales with the largest magnitude of torch's outputs (1e-5 of it, at least 1e-4)."""
    if fam not in ("torchvision", "segmentation"):
        return []
    top = max((float(abs(common.read_pb(f)).max(initial=0.0)) for f in (d / "test_data_set_0").glob("output_*.pb")),
              default=0.0)
    return ["--rtol", "1e-3", "--atol", f"{max(1e-4, 1e-5 * top):.3g}"]


def first_error(text: str) -> str:
    text = text.replace(str(common.REPO) + "/", "")
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for l in lines:
        if l.startswith("error") or "Error" in l or "terminate" in l:
            return l
    return lines[-1] if lines else ""


def compare(out_dir: Path, ref_dir: Path, n_out: int):
    """(max normwise rel error over outputs, message) comparing out_dir/output_i.pb with ref_dir/output_i.pb."""
    import numpy as np
    worst = 0.0
    for i in range(n_out):
        rp = ref_dir / f"output_{i}.pb"
        op = out_dir / f"output_{i}.pb"
        if not rp.exists():
            continue
        if not op.exists():
            return float("inf"), f"output_{i}.pb missing"
        r = common.read_pb(rp)
        o = common.read_pb(op)
        if r.shape != o.shape:
            return float("inf"), f"output {i}: shape {list(o.shape)} vs reference {list(r.shape)}"
        if r.dtype.kind in "biu" or o.dtype.kind in "biu":
            bad = int(np.sum(r.astype(np.int64) != o.astype(np.int64)))
            if bad:
                return float("inf"), f"output {i}: {bad} integer elements differ"
            continue
        r = r.astype(np.float64)
        o = o.astype(np.float64)
        if not np.all(np.isfinite(o) == np.isfinite(r)):
            return float("inf"), f"output {i}: non-finite values differ"
        fin = np.isfinite(r)
        if not fin.any():
            continue
        err = float(np.max(np.abs(o[fin] - r[fin]))) / max(float(np.max(np.abs(r[fin]))), 1e-30)
        worst = max(worst, err)
    return worst, ""


def compare_detections(out_dir: Path, ref_dir: Path, names, tol: float):
    """compare() for a detector's outputs (per image i: boxes_i, scores_i, labels_i, and masks_i or keypoints_i ...):
    the same detections in any order among those whose outputs all agree within tol (two scores 1e-6 apart may come
    out in either order: float rounding of a near tie). Matches each reference detection to one of ours near its
    position with equal labels and every float output within tol normwise. (max normwise error, message)."""
    import numpy as np
    images = {}
    for i, n in enumerate(names):
        base, _, img = n.rpartition("_")
        if not img.isdigit():
            return float("inf"), f"output {n} is not per image"
        images.setdefault(img, []).append(i)
    worst = 0.0
    for img, outs in images.items():
        o = [common.read_pb(out_dir / f"output_{i}.pb") for i in outs]
        r = [common.read_pb(ref_dir / f"output_{i}.pb") for i in outs]
        if any(a.shape != b.shape for a, b in zip(o, r)):
            return float("inf"), f"image {img}: shapes differ"
        n = r[0].shape[0] if r[0].ndim else 0
        scale = [max(float(np.max(np.abs(b))), 1e-30) if b.size and b.dtype.kind == "f" else 1.0 for b in r]
        used = set()
        for k in range(n):
            best = None
            for j in range(max(0, k - 8), min(n, k + 9)):
                if j in used:
                    continue
                err, ok = 0.0, True
                for a, b, sc in zip(o, r, scale):
                    if b.dtype.kind in "biu":
                        ok = ok and bool(np.array_equal(a[j], b[k]))
                    else:
                        err = max(err, float(np.max(np.abs(a[j].astype(np.float64) - b[k]), initial=0.0)) / sc)
                if ok and err <= tol and (best is None or err < best[1]):
                    best = (j, err)
            if best is None:
                return float("inf"), f"image {img}: detection {k} has no match"
            used.add(best[0])
            worst = max(worst, best[1])
    return worst, ""


def _norm_entry(e):
    """A sharding-file entry, normalised: per dim the axis names, then the unreduced axes and the reduction."""
    spec = e["spec"] if isinstance(e, dict) else e
    dims = []
    for d in spec:
        if isinstance(d, dict):
            d = d.get("axes")
        dims.append(tuple([d] if isinstance(d, str) else (d or [])))
    unred = []
    if isinstance(e, dict):
        u = e.get("unreduced", e.get("partial", []))
        unred = sorted([u] if isinstance(u, str) else u)
    return dims, unred, (e.get("reduction", "sum") if isinstance(e, dict) and unred else "sum")


def annotations_lost(sfile: Path, written: Path):
    """The closed annotations of sharding file `sfile` (tensors, then rules: first match) that partition's
    shardings.json `written` does not keep exactly (docs/partitioning.md, "Annotations are constraints")."""
    ann = json.loads(sfile.read_text())
    out = json.loads(written.read_text())["tensors"]
    lost = []

    def check(name, e):
        if isinstance(e, dict) and e.get("open"):
            return
        if isinstance(e, dict) and any(isinstance(d, dict) and d.get("open") for d in e["spec"]):
            return
        if isinstance(e, list) and any(isinstance(d, dict) and d.get("open") for d in e):
            return
        if name not in out or _norm_entry(e) != _norm_entry(out[name]):
            lost.append(f"{name}: annotated {json.dumps(e)}, got {json.dumps(out.get(name))}")

    tensors = ann.get("tensors", {})
    for name, e in tensors.items():
        check(name, e)
    for name in out:
        if name in tensors:
            continue
        for rule in ann.get("rules", []):
            if re.search(rule["match"], name):
                check(name, {k: v for k, v in rule.items() if k != "match"})
                break
    return lost


def collective_counts(report):
    """{kind: count} of a run report's collectives."""
    counts = {}
    for c in json.loads(Path(report).read_text()).get("collectives", []):
        counts[c["kind"]] = counts.get(c["kind"], 0) + c["count"]
    return counts


def fallbacks_of(report: Path):
    """(total, Counter of 'kind:OpType') from the report's warnings: kind R = computed replicated (no sharding
    rule), G = a split dim gathered (e.g. a conv halo wider than a shard), W = other."""
    try:
        w = json.loads(report.read_text()).get("warnings", [])
    except Exception:  # noqa: BLE001
        return None
    ops = Counter()
    for s in w:
        m = re.search(r"\(([A-Za-z0-9_]+)\)", s)
        kind = "R" if "computed replicated" in s else "G" if "gathered instead of split" in s else "W"
        ops[f"{kind}:{m.group(1) if m else '?'}"] += 1
    return len(w), ops


def fallback_cell(n, ops):
    return f"{n} ({', '.join(f'{o}×{c}' if c > 1 else o for o, c in ops.most_common(4))})" if n else "0"


class Runner:
    def __init__(self, a):
        self.a = a
        self.bin = Path(a.bin).resolve()
        self.out = Path(a.out).resolve()
        self.env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        self.mpirun = shutil.which("mpirun")  # dynamic models' device files run under it (symbolic_partition)

    def sh(self, cmd, log_base: Path, timeout):
        log_base.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
            rc, so, se = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, so, se = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
                f"timeout after {timeout} s"
        dt = time.time() - t0
        log_base.with_suffix(".cmd").write_text(" ".join(map(str, cmd)) + "\n")
        log_base.with_suffix(".stdout").write_text(so or "")
        log_base.with_suffix(".stderr").write_text(se or "")
        return rc, so or "", se or "", dt

    def ort_ref(self, d: Path, meta):
        ref = d / "ref_ort"
        errf = d / "ref_ort.error"
        if (ref / "output_0.pb").exists():
            return "ok", ""
        if errf.exists():
            return "err", errf.read_text().strip()
        if meta.get("no_ort"):
            return "none", meta["no_ort"]
        cmd = ["node", str(HERE / "ort_ref.js"), str(d / "model.onnx"), str(d / "test_data_set_0"), str(ref)]
        rc, so, se, _ = self.sh(cmd, d / "ref_ort_log", self.a.timeout)
        if rc != 0:
            msg = first_error(se) or f"exit {rc}"
            if "not installed" not in msg:  # a missing onnxruntime-node is not cached as the model's failure
                errf.write_text(msg + "\n")
            return "err", msg
        return "ok", ""

    def run_model(self, d: Path, meta):
        fam, name = meta["family"], meta["name"]
        rdir = self.out / "runs" / fam / name
        row = OrderedDict(family=fam, model=name, opset=meta.get("opset", ""), gen=meta["status"], load="-",
                          plans=OrderedDict(), fallbacks="", ref="", error="", errors=[], time_s=0.0)
        if meta["status"] != "ok":
            row["error"] = f"{meta['status']}: {meta.get('error', '')}"
            row["errors"].append(("gen", row["error"]))
            return row
        t0 = time.time()
        model = d / "model.onnx"
        dims = []
        for k, v in (meta.get("dims") or {}).items():
            if not k.startswith("?"):
                dims += ["--dim", f"{k}={v}"]
        refs = OrderedDict()
        for rname, sub in (meta.get("refs") or {}).items():
            refs[rname] = d / sub
        ort_status, ort_msg = self.ort_ref(d, meta)
        n_out = len(meta.get("outputs", [])) or 1
        if ort_status == "ok":
            refs["ort"] = d / "ref_ort"
            if len(refs) == 1:
                row["refs_agree"] = "ort only"
            # the references against each other (independent of gspmd-onnx)
            for rname, rd in list(refs.items())[:-1]:
                err, msg = compare(d / "ref_ort", rd, n_out)
                row["refs_agree"] = f"ort~{rname} {err:.0e}" if not msg else f"ort≠{rname}: {msg}"
                if msg or err > meta.get("ref_rtol", self.a.ref_rtol):
                    # the exported graph computes something else than eager torch (Mask R-CNN's mask pasting):
                    # ONNX Runtime, which runs the same graph, is the reference
                    del refs[rname]
                    row["refs_agree"] += f" ({rname} not used)"
        else:
            row["refs_agree"] = f"ort✗"
            row["errors"].append(("ort", f"ONNX Runtime: {ort_msg}"))

        rc, so, se, _ = self.sh([self.bin, "simulate", model, "--mesh", "1", *dims], rdir / "load", self.a.timeout)
        row["load"] = "ok" if rc == 0 else self.code(rc)
        row["ref"] = row.get("refs_agree", "")
        if rc != 0:
            row["errors"].append(("load", first_error(se)))
            row["error"] = f"[load] {first_error(se)}"
            row["time_s"] = round(time.time() - t0, 1)
            return row
        if meta.get("heavy") and not self.a.heavy:
            row["plans"] = OrderedDict((k, "heavy") for k in PLAN_ORDER)
            row["time_s"] = round(time.time() - t0, 1)
            return row
        plans = OrderedDict([("mesh1", {"shardings": None, "mesh": "1"})])
        for k, v in (meta.get("plans") or {}).items():
            plans[k] = v
        ref_errs = []
        fb_best = None
        for pname, p in plans.items():
            if p.get("extra") and not (self.a.all_plans or fam == "moe"):
                continue
            od = rdir / f"{pname}.outputs"
            if od.exists():
                for f in od.iterdir():
                    f.unlink()
            rep = rdir / f"{pname}.report.json"
            rep.unlink(missing_ok=True)
            cmd = [self.bin, "run", model, "--mesh", p["mesh"], *dims, "--inputs", d / "test_data_set_0", "--check",
                   "--outputs", od, "--report", rep]
            if p.get("shardings"):
                cmd += ["--shardings", d / p["shardings"]]
            cmd += check_tolerance(fam, d)
            rc, so, se, dt = self.sh(cmd, rdir / pname, self.a.timeout)
            cell = "ok" if rc == 0 else self.code(rc)
            if rc not in (0, 1):
                row["errors"].append((pname, first_error(se)))
            elif rc == 1:
                m = re.search(r"check.*", so)
                row["errors"].append((pname, "check failed: " + (m.group(0) if m else first_error(se))))
            if rc == 0:
                fb = fallbacks_of(rep)
                if fb and (fb_best is None or fb[0] > fb_best[0]):
                    fb_best = fb
                tol = meta.get("ref_rtol", self.a.ref_rtol)
                bad = []
                for rname, rd in refs.items():
                    err, msg = compare(od, rd, n_out)
                    if (msg or err > tol) and fam == "detection":  # the same detections, near ties in either order
                        err, msg = compare_detections(od, rd, meta.get("outputs", []), tol)
                    if pname == "mesh1":
                        ref_errs.append(f"{rname} {err:.1e}" if not msg else f"{rname}: {msg}")
                    if msg or err > tol:
                        bad.append(f"{rname} {msg or f'{err:.1e}'}")
                if bad:
                    cell = "ref✗"
                    row["errors"].append((pname, f"outputs differ from the reference: {', '.join(bad)}"))
                if p.get("shardings"):  # every closed annotation is kept exactly in partition's shardings.json
                    pdir = rdir / f"{pname}.partition"
                    prc, _, pse, _ = self.sh([self.bin, "partition", model, "--mesh", p["mesh"], *dims, "--shardings",
                                              d / p["shardings"], "-o", pdir], rdir / f"{pname}.partition",
                                             self.a.timeout)
                    lost = annotations_lost(d / p["shardings"], pdir / "shardings.json") if prc == 0 else \
                        [f"partition failed: {first_error(pse)}"]
                    if lost:
                        cell = "ann✗"
                        row["errors"].append((pname, f"{len(lost)} annotations not kept, e.g. {lost[0]}"))
                if meta.get("dynamic") and self.mpirun and p.get("shardings"):
                    err = self.symbolic_partition(model, d, p, rdir / f"{pname}.sym", fam)
                    if err:
                        cell = "sym✗"
                        row["errors"].append((pname, err))
                want = p.get("collectives")  # the plan's exact collectives by kind, where known (GShard's MoE)
                if want is not None:
                    got = collective_counts(rep)
                    if got != want:
                        cell = "coll✗"
                        row["errors"].append((pname, f"collectives {got}, expected exactly {want}"))
            row["plans"][pname] = cell
        tplan = next((k for k in ("plan4", "dp2", "mesh1") if k in plans), "mesh1")
        if row["plans"].get(tplan) == "ok":
            p = plans[tplan]
            cmd = [self.bin, "run", model, "--mesh", p["mesh"], *dims, "--inputs", d / "test_data_set_0", "--check",
                   "--training", "--loss", "mean"]
            if p.get("shardings"):
                cmd += ["--shardings", d / p["shardings"]]
            cmd += check_tolerance(fam, d)
            rc, so, se, _ = self.sh(cmd, rdir / "train", self.a.timeout)
            m = re.search(r"no gradient rule for (\S+)", se)
            dd = rc == 2 and "has a data-dependent shape" in se  # training steps keep no data-dependent dims
            row["train"] = "ok" if rc == 0 else f"no rule: {m.group(1)}" if rc == 2 and m else \
                "data-dep" if dd else self.code(rc)
            if rc != 0 and not m and not dd:
                row["errors"].append(("train", first_error(se) if rc != 1 else "training step: check failed"))
        if fb_best is not None:
            n, ops = fb_best
            row["fallbacks"] = fallback_cell(n, ops)
        row["ref"] = "; ".join(ref_errs + ([row["refs_agree"]] if row.get("refs_agree") else []))
        errs = [e for e in row["errors"] if e[0] != "ort"] or row["errors"]
        if errs:
            row["error"] = f"[{errs[0][0]}] {errs[0][1]}"
        row["time_s"] = round(time.time() - t0, 1)
        return row

    def symbolic_partition(self, model: Path, d: Path, p, out: Path, fam):
        """A model with dynamic axes: partition without --dim (the device files keep the symbolic dims, docs/shapes.md),
        then run the device files at the test data's dims under mpirun with --check. Returns "" or the error."""
        ranks = 1
        for k in p["mesh"].split("x"):
            ranks *= int(k)
        rc, _, se, _ = self.sh([self.bin, "partition", model, "--mesh", p["mesh"], "--shardings", d / p["shardings"],
                                "-o", out], out.parent / f"{out.name}_partition", self.a.timeout)
        if rc != 0:
            return f"partition without --dim: {first_error(se)}"
        cmd = [self.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), self.bin, "run", model,
               "--mesh", p["mesh"], "--shardings", d / p["shardings"], "--backend", "mpi", "--program", out,
               "--inputs", d / "test_data_set_0", "--check", *check_tolerance(fam, d)]
        rc, so, se, _ = self.sh(cmd, out.parent / f"{out.name}_run", self.a.timeout)
        if rc != 0:
            return f"device files without --dim: {first_error(se) or 'check failed'}"
        return ""

    @staticmethod
    def code(rc):
        if rc == "timeout":
            return "T/O"
        if rc == 1:
            return "check✗"
        if isinstance(rc, int) and rc < 0:
            return "crash"
        return f"E{rc}"


def signature(msg: str) -> str:
    s = re.sub(r"^\[[^\]]*\] ", "", msg)
    s = re.sub(r"^error: [^:]*model\.onnx: ", "error: MODEL: ", s)
    s = re.sub(r"'[^']*'", "'…'", s)
    s = re.sub(r"\"[^\"]*\"", "\"…\"", s)
    s = re.sub(r"\[[0-9, ]*\]", "[…]", s)
    s = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", s)
    return s[:160]


def esc(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def write_results(rows, out: Path, skipped, elapsed):
    lines = ["# gspmd-onnx real-model corpus", "",
             f"{len(rows)} models, {time.strftime('%Y-%m-%d %H:%M')}, {elapsed:.0f} s. Cells: ok, ref✗ (outputs differ "
             "from torch/numpy/ORT), coll✗ (other collectives), ann✗ (an annotation not kept), check✗ (exit 1), E2/E3/E4 (exit codes), T/O, `-` not run. `ref`: mesh-1 outputs "
             "vs each reference (normwise). See testdata/corpus/README.md.", "",
             "| family | model | opset | load | mesh-1 | dp-2 | plan-4 | extra plans | train | fallbacks | ref (mesh-1) | "
             "first error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["plans"]
        extra = " ".join(f"{k}:{v}" for k, v in p.items() if k not in PLAN_ORDER)
        load = r["load"] if r["gen"] == "ok" else r["gen"].replace(" failed", "✗")
        lines.append("| " + " | ".join(esc(x) for x in [
            r["family"], r["model"], r["opset"], load, p.get("mesh1", "-"), p.get("dp2", "-"), p.get("plan4", "-"),
            extra, r.get("train", "-"), r["fallbacks"], r["ref"], r["error"][:220]]) + " |")
    # summary
    tot = Counter()
    for r in rows:
        tot["models"] += 1
        tot["loads"] += r["load"] == "ok"
        for k in PLAN_ORDER:
            tot[k] += r["plans"].get(k) == "ok"
        tot["train"] += r.get("train") == "ok"
    lines += ["", f"**Summary**: {tot['models']} models; load ok {tot['loads']}; mesh-1 ok {tot['mesh1']}; "
              f"dp-2 ok {tot['dp2']}; plan-4 ok {tot['plan4']}; train ok {tot['train']}.", "", "## First errors, grouped", "",
              "| count | error (names and numbers elided) | models |", "|---|---|---|"]
    groups = OrderedDict()
    for r in rows:
        if r["error"]:
            groups.setdefault(signature(r["error"]), []).append(r)
    for sig, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(x["model"] for x in rs[:8]) + (f", … (+{len(rs) - 8})" if len(rs) > 8 else "")
        lines.append(f"| {len(rs)} | {esc(sig)} | {esc(names)} |")
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {k}: {v}" for k, v in skipped.items()]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--quick", action="store_true", help="the CI subset: " + "; ".join(
        f"{k}: {' '.join(v)}" for k, v in QUICK.items()))
    ap.add_argument("--models", default="", help="only model names matching this regex (search)")
    ap.add_argument("--no-gen", action="store_true", help="do not generate; run what is cached")
    ap.add_argument("--all-plans", action="store_true", help="also the extra plans (e.g. CNN channel split)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per gspmd-onnx / ORT call")
    ap.add_argument("--heavy", action="store_true",
                    help="also run the plans of models marked heavy (IS-Net at 1024x1024: > 10 min per plan); "
                         "by default they are only loaded")
    ap.add_argument("--ref-rtol", type=float, default=1e-3)
    ap.add_argument("--bin", default=str(common.REPO / "build" / "bin" / "gspmd-onnx"))
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 unless every model run loads and every plan is ok (heavy ones: loads), but for the "
                         "families and models known to fail (EXPECTED_FAILURES: " + ", ".join(EXPECTED_FAILURES) +
                         "), which must fail; for CI")
    ap.add_argument("--out", default=str(common.cache_dir()),
                    help="results and run logs (models are cached in $GSPMD_CORPUS_CACHE, default build/corpus)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of the previous results.json that this invocation does not re-run")
    ap.add_argument("--also", nargs="*", default=[], metavar="RESULTS_JSON",
                    help="with --merge: rows of other results.json files too (this run's rows win)")
    ap.add_argument("--retable", action="store_true",
                    help="run nothing: rebuild results.md from results.json (+ --also) and the stored reports")
    ap.add_argument("--gen-args", default="", help="extra arguments for every generator, e.g. '--include-giant'")
    a = ap.parse_args()
    fams = [f for f in a.families.split(",") if f]
    bad = [f for f in fams if f not in FAMILIES]
    if bad:
        sys.exit(f"error: unknown families {bad} (expected {', '.join(FAMILIES)})")
    if a.retable:
        out = Path(a.out)
        rows = json.loads((out / "results.json").read_text())
        for x in a.also:
            have = {(r["family"], r["model"]) for r in rows}
            rows += [r for r in json.loads(Path(x).read_text()) if (r["family"], r["model"]) not in have]
        rows.sort(key=lambda x: (FAMILIES.index(x["family"]) if x["family"] in FAMILIES else 99, x["model"]))
        for r in rows:  # recompute the fallbacks column from the stored reports
            best = None
            for pname, cell in r["plans"].items():
                fb = fallbacks_of(out / "runs" / r["family"] / r["model"] / f"{pname}.report.json") \
                    if cell in ("ok", "ref✗") else None
                if fb and (best is None or fb[0] > best[0]):
                    best = fb
            if best is not None:
                r["fallbacks"] = fallback_cell(*best)
        skipped = {}
        for f in FAMILIES:
            sk = common.cache_dir() / "models" / f / "skipped.json"
            if sk.exists():
                for k, v in json.loads(sk.read_text()).items():
                    skipped[f"{f}/{k}"] = v if isinstance(v, str) else f"{v} MB of float32 weights > --max-mb"
        print(write_results(rows, out, skipped, 0))
        return
    if not Path(a.bin).is_file():
        sys.exit(f"error: {a.bin}: not built (ninja -C build gspmd-onnx)")
    t0 = time.time()
    if not a.no_gen:
        for f in fams:
            cmd = gen_cmd(f, a.quick) + (a.gen_args.split() if a.gen_args else [])
            common.log(f"run_corpus: generating {f}: {' '.join(cmd[1:])}")
            p = subprocess.run(cmd)
            if p.returncode != 0:
                common.log(f"run_corpus: generator for {f} exited with {p.returncode} (continuing)")
    r = Runner(a)
    rows = []
    previous = []
    if a.merge and (Path(a.out) / "results.json").exists():
        previous = json.loads((Path(a.out) / "results.json").read_text())
    for extra in a.also:  # rows of other runs (e.g. one per opset, run side by side with other --out dirs)
        previous += json.loads(Path(extra).read_text())

    def merged(new_rows):
        """with --merge: the previous results.json rows that were not re-run, plus the new ones, in table order."""
        if not a.merge:
            return new_rows
        done = {(x["family"], x["model"]) for x in new_rows}
        allr = [x for x in previous if (x["family"], x["model"]) not in done] + new_rows
        return sorted(allr, key=lambda x: (FAMILIES.index(x["family"]) if x["family"] in FAMILIES else 99, x["model"]))

    rx = re.compile(a.models) if a.models else None
    skipped = {}
    for f in FAMILIES:
        sk = common.cache_dir() / "models" / f / "skipped.json"
        if sk.exists() and (f in fams or a.merge):
            for k, v in json.loads(sk.read_text()).items():
                skipped[f"{f}/{k}"] = v if isinstance(v, str) else f"{v} MB of float32 weights > --max-mb"
    for f in fams:
        fam_dir = common.cache_dir() / "models" / f
        if not fam_dir.is_dir():
            continue
        for d in sorted(p for p in fam_dir.iterdir() if (p / "meta.json").is_file()):
            if a.quick and d.name not in QUICK[f]:
                continue
            if rx and not rx.search(d.name):
                continue
            meta = json.loads((d / "meta.json").read_text())
            common.log(f"run_corpus: {f}/{d.name} ...")
            row = r.run_model(d, meta)
            common.log(f"run_corpus: {f}/{d.name}: load {row['load']} "
                       f"{' '.join(f'{k}:{v}' for k, v in row['plans'].items())} {row['time_s']} s {row['error'][:150]}")
            rows.append(row)
            write_results(merged(rows), Path(a.out), skipped, time.time() - t0)
    text = write_results(merged(rows), Path(a.out), skipped, time.time() - t0)
    print(text)
    if a.strict:
        bad, expected = [], []
        for x in rows:
            failed = x["load"] != "ok" or any(v not in ("ok", "heavy") for v in x["plans"].values()) \
                or not (x.get("train", "ok") in ("ok", "data-dep") or x["train"].startswith("no rule"))
            name = f"{x['family']}/{x['model']}"
            key = name if name in EXPECTED_FAILURES else x["family"]
            why = EXPECTED_FAILURES.get(key)
            if why and failed:
                expected.append(f"{name} ({why}): {x['error'] or 'not ok'}")
            elif why:
                bad.append(f"{name}: passes now; remove '{key}' from EXPECTED_FAILURES in run_corpus.py")
            elif failed:
                bad.append(f"{name}: {x['error'] or 'not ok'}")
        for e in expected:
            print(f"corpus: expected failure {e}")
        for b in bad:
            print(f"corpus: FAILED {b}")
        print(f"{len(rows) - len(bad) - len(expected)} passed, {len(expected)} failed as expected, {len(bad)} failed")
        if bad or not rows:
            sys.exit(1)


if __name__ == "__main__":
    main()
