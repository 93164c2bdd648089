"""Shared helpers for the real-model corpus (testdata/corpus, issue 14).

Every generated model lives in its own cache directory, outside git:

    build/corpus/models/<family>/<name>/
        model.onnx                      the model (external data, if any, next to it)
        test_data_set_0/input_<i>.pb    inputs (graph inputs minus initializers, in graph order)
        test_data_set_0/output_<i>.pb   the primary reference (torch eager, numpy, or ONNX Runtime)
        ref_ort/output_<i>.pb           ONNX Runtime's outputs (written by ort_ref.js, when it runs)
        <plan>.plan.json                sharding files (never named model.sharding.json, so that --mesh 1 runs
                                        without a sidecar)
        meta.json                       what the runner needs: family, opset, dims, plans, references, notes

A directory is complete when meta.json exists (it is written last), so an interrupted generation is redone.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO / "build" / "corpus"


def cache_dir() -> Path:
    return Path(os.environ.get("GSPMD_CORPUS_CACHE", str(DEFAULT_CACHE)))


def model_dir(family: str, name: str) -> Path:
    return cache_dir() / "models" / family / name


def is_done(d: Path) -> bool:
    """meta.json is written last: its presence means the directory is complete (or its failure is recorded)."""
    return (d / "meta.json").is_file()


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# TensorProto .pb files
def write_pb(path: Path, arr: np.ndarray, name: str = ""):
    from onnx import numpy_helper
    arr = np.asarray(arr)
    t = numpy_helper.from_array(arr, name=name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(t.SerializeToString())


def read_pb(path: Path) -> np.ndarray:
    import onnx
    from onnx import numpy_helper
    t = onnx.TensorProto()
    t.ParseFromString(Path(path).read_bytes())
    return numpy_helper.to_array(t)


def write_test_data(d: Path, inputs: list, outputs: list | None, input_names=None, output_names=None,
                    sub: str = "test_data_set_0"):
    td = d / sub
    td.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(inputs):
        write_pb(td / f"input_{i}.pb", a, input_names[i] if input_names else "")
    for i, a in enumerate(outputs or []):
        write_pb(td / f"output_{i}.pb", a, output_names[i] if output_names else "")


# ---------------------------------------------------------------------------------------------------------------------
# ONNX graph inspection
def graph_inputs(model):
    """Graph inputs that are not initializers (the tensors --inputs must give), with shape (ints or dim names)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        dims = [d.dim_param if d.dim_param else d.dim_value for d in tt.shape.dim]
        out.append((i.name, tt.elem_type, dims))
    return out


def symbolic_dims(gin, shapes) -> dict:
    """{dim name: size} for the symbolic dims of the graph inputs, from the actual input shapes (for --dim)."""
    dims = {}
    for (name, _, gd), shape in zip(gin, shapes):
        for k, v in enumerate(gd):
            if isinstance(v, str) and v:
                dims[v] = int(shape[k])
            elif v == 0 and k < len(shape):  # unknown dim without a name
                dims.setdefault(f"?{name}:{k}", int(shape[k]))
    return dims


def initializer_shapes(model) -> dict:
    return {t.name: list(t.dims) for t in model.graph.initializer}


def producers(model) -> dict:
    return {o: n for n in model.graph.node for o in n.output}


def weight_of(model, node_re: str, op_types=("MatMul", "Gemm", "Conv"), input_index: int = 1):
    """(initializer name, shape, node) of the weight operand of every node whose name matches node_re.

    Follows one Identity / Transpose hop back to an initializer (torch sometimes feeds MatMul through those)."""
    inits = initializer_shapes(model)
    prod = producers(model)
    res = []
    for n in model.graph.node:
        if n.op_type not in op_types or not re.search(node_re, n.name):
            continue
        if len(n.input) <= input_index:
            continue
        w = n.input[input_index]
        hops = 0
        while w not in inits and w in prod and prod[w].op_type in ("Identity",) and hops < 2:
            w = prod[w].input[0]
            hops += 1
        if w in inits:
            res.append((w, inits[w], n))
    return res


def conv_weights(model):
    inits = initializer_shapes(model)
    res = []
    for n in model.graph.node:
        if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits:
            res.append((n.input[1], inits[n.input[1]], n))
    return res


# ---------------------------------------------------------------------------------------------------------------------
# Sharding files
def write_plan(d: Path, plan: str, mesh_shape, axes, tensors: dict, rules=None) -> str:
    """Writes d/<plan>.plan.json (one tensor per line) and returns the file name."""
    name = f"{plan}.plan.json"
    lines = ["{", f'  "mesh": {{"shape": {json.dumps(list(mesh_shape))}, "axes": {json.dumps(list(axes))}}},',
             '  "tensors": {']
    items = list(tensors.items())
    for i, (k, v) in enumerate(items):
        lines.append(f"    {json.dumps(k)}: {json.dumps(v)}{',' if i + 1 < len(items) else ''}")
    lines.append("  }" + ("," if rules else ""))
    if rules:
        lines.append('  "rules": [')
        for i, r in enumerate(rules):
            lines.append(f"    {json.dumps(r)}{',' if i + 1 < len(rules) else ''}")
        lines.append("  ]")
    lines.append("}")
    (d / name).write_text("\n".join(lines) + "\n")
    return name


def mesh_str(shape) -> str:
    return "x".join(str(s) for s in shape)


def plan_entry(file, mesh_shape, desc):
    return {"shardings": file, "mesh": mesh_str(mesh_shape), "desc": desc}


def image_plan(d: Path, plan: str, mesh_shape, spec, desc):
    """A plan that annotates only the image input `input` ([N, C, H, W]) with `spec`, on mesh axes x (and y)."""
    axes = ["x", "y"][:len(mesh_shape)]
    return plan_entry(write_plan(d, plan, mesh_shape, axes, {"input": spec}), mesh_shape, desc)


def write_meta(d: Path, meta: dict):
    meta.setdefault("status", "ok")
    tmp = d / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    tmp.replace(d / "meta.json")


def write_failed_meta(d: Path, meta: dict, stage: str, err: BaseException | str):
    d.mkdir(parents=True, exist_ok=True)
    msg = str(err).strip().splitlines()
    meta = dict(meta)
    meta["status"] = f"{stage} failed"
    meta["error"] = f"{type(err).__name__ + ': ' if isinstance(err, BaseException) else ''}" + (msg[0] if msg else "")
    write_meta(d, meta)
    return meta


def file_mb(p: Path) -> float:
    return p.stat().st_size / 1e6 if p.exists() else 0.0


# ---------------------------------------------------------------------------------------------------------------------
# torch export
def parse_gen_args(doc: str, opsets=None):
    """The generators' common flags: --only NAMES (comma-separated model names), --force (redo cached models) and,
    when `opsets` is given, --opsets (default `opsets`). Returns (args, the set of --only names or None)."""
    import argparse
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated model names")
    if opsets is not None:
        ap.add_argument("--opsets", type=int, nargs="+", default=list(opsets))
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    return a, (set(a.only.split(",")) if a.only else None)


def add_torchvision_args(ap, opsets, what: str):
    """The options of the torchvision generators: --models, --opsets, --max-mb, --include-giant, --force, --list."""
    ap.add_argument("--models", default="all", help=f"comma-separated {what} names, or 'all'")
    ap.add_argument("--opsets", type=int, nargs="+", default=opsets)
    ap.add_argument("--max-mb", type=float, default=360.0)
    ap.add_argument("--include-giant", action="store_true", help="ignore --max-mb")
    ap.add_argument("--force", action="store_true", help="regenerate existing directories")
    ap.add_argument("--list", action="store_true", help="print the selected (model, opset) names and exit")


def selected_models(a, names, what: str):
    """The names of --models (all of `names` for 'all'); exits with a one-line error for an unknown one."""
    if a.models == "all":
        return list(names)
    want = a.models.split(",")
    bad = [w for w in want if w not in names]
    if bad:
        sys.exit(f"error: unknown {what} models {bad} (expected {sorted(names)})")
    return want


def selected_cases(a, names, family: str, what: str):
    """The (model, opset) pairs to export: those of --only (`<model>_op<opset>` names), else --models x --opsets,
    without the ones already cached unless --force. Exits with a one-line error for an unknown one, and after
    printing their names with --list."""
    if a.only:
        want = [w.rsplit("_op", 1) for w in a.only.split(",") if w]
        bad = ["_op".join(w) for w in want if len(w) != 2 or w[0] not in names or not w[1].isdigit()]
        if bad:
            sys.exit(f"error: unknown {what} cases {bad} (expected <model>_op<opset>, models {names})")
        pairs = [(n, int(op)) for n, op in want]
    else:
        pairs = [(n, op) for n in selected_models(a, names, what) for op in a.opsets]
    todo = [(n, op) for n, op in pairs if a.force or not is_done(model_dir(family, f"{n}_op{op}"))]
    if a.list:
        print("\n".join(f"{n}_op{op}" for n, op in todo))
        sys.exit(0)
    return todo


class SkipList:
    """build/corpus/models/<family>/skipped.json: the models left out for their size (name -> float32 MB). Saved after
    every change, merged with the file, which another invocation (other opsets) may have updated."""

    def __init__(self, family: str):
        self.path = cache_dir() / "models" / family / "skipped.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.entries = {}  # name -> MB (skipped) or None (kept: removed from the file)

    def build(self, name: str, make, a):
        """(make() under torch.manual_seed(0), its float32 MB); the model is None, logged, when make() fails or the
        model is over --max-mb (a.max_mb, unless a.include_giant)."""
        import torch
        torch.manual_seed(0)
        try:
            model = make()
        except Exception as e:  # noqa: BLE001
            log(f"{name}: construction failed: {e}")
            return None, 0.0
        mb, skip = self.too_large(name, model, a.max_mb, a.include_giant)
        return (None if skip else model), mb

    def too_large(self, name: str, module, max_mb: float, include_giant: bool):
        """(MB of the module's parameters and buffers in float32, whether it is skipped); records and logs it."""
        mb = (sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in module.buffers())) * 4 / 1e6
        skip = mb > max_mb and not include_giant
        self.entries[name] = round(mb, 1) if skip else None
        self.save()
        if skip:
            log(f"{name}: skipped ({mb:.0f} MB > --max-mb {max_mb:.0f}; --include-giant to include)")
        return mb, skip

    def save(self):
        cur = json.loads(self.path.read_text()) if self.path.exists() else {}
        cur.update({k: v for k, v in self.entries.items() if v is not None})
        for k in [k for k, v in self.entries.items() if v is None]:
            cur.pop(k, None)
        self.path.write_text(json.dumps(cur, indent=1, sort_keys=True) + "\n")


def export_torch_case(d: Path, module, args: tuple, opset: int, input_names, output_names, meta: dict,
                      dynamic_axes=None, plans_fn=None, export_kwargs=None):
    """Exports `module(*args)` to d/model.onnx, writes inputs and torch's eager outputs (the first reference), the
    plans returned by plans_fn(onnx_model, d) (a dict plan -> plan_entry) and meta.json. Failures are recorded in
    meta.json (status "export failed" / "eager failed") instead of raised."""
    import shutil
    import time
    import onnx
    import torch
    d.mkdir(parents=True, exist_ok=True)
    # what a previous export left (--force): its meta.json (the mark of a complete directory) and ONNX Runtime's
    # outputs for it, which the runner would otherwise keep using
    (d / "meta.json").unlink(missing_ok=True)
    (d / "ref_ort.error").unlink(missing_ok=True)
    shutil.rmtree(d / "ref_ort", ignore_errors=True)
    meta = dict(meta)
    meta.update({"opset": opset, "dynamic": bool(dynamic_axes), "refs": {}})
    try:
        with torch.no_grad():
            eager = module(*args)
    except Exception as e:  # noqa: BLE001
        return write_failed_meta(d, meta, "eager", e)
    if isinstance(eager, torch.Tensor):
        eager = (eager,)
    eager = [e.detach().numpy() for e in eager]
    t0 = time.time()
    tmp = d / "model.onnx.tmp"
    try:
        # not under no_grad: there, nn.MultiheadAttention takes its fused fast path
        # (aten::_native_multi_head_attention), which has no ONNX export
        torch.onnx.export(module, args, str(tmp), opset_version=opset, input_names=list(input_names),
                          output_names=list(output_names), dynamic_axes=dynamic_axes,
                          do_constant_folding=True, **(export_kwargs or {}))
        tmp.replace(d / "model.onnx")
    except Exception as e:  # noqa: BLE001
        tmp.unlink(missing_ok=True)
        return write_failed_meta(d, meta, "export", e)
    meta["export_s"] = round(time.time() - t0, 2)
    m = onnx.load(str(d / "model.onnx"), load_external_data=False)
    meta["size_mb"] = round(file_mb(d / "model.onnx"), 1)
    meta["nodes"] = len(m.graph.node)
    meta["op_types"] = sorted({n.op_type for n in m.graph.node})
    meta["ir_version"] = m.ir_version
    gin = graph_inputs(m)
    by_name = {n: a for n, a in zip(input_names, args)}
    missing = [g[0] for g in gin if g[0] not in by_name]
    if missing:
        return write_failed_meta(d, meta, "export", f"graph inputs not among the torch inputs: {missing}")
    meta["inputs"] = [{"name": g[0], "elem_type": g[1], "dims": g[2]} for g in gin]
    meta["dims"] = symbolic_dims(gin, [by_name[g[0]].shape for g in gin])
    meta["outputs"] = [o.name for o in m.graph.output]
    if len(meta["outputs"]) != len(eager):
        meta.setdefault("notes", []).append(f"torch gave {len(eager)} outputs, the graph has {len(meta['outputs'])}")
    write_test_data(d, [by_name[g[0]].detach().numpy() for g in gin], eager,
                    [g[0] for g in gin], meta["outputs"])
    meta["refs"]["torch"] = "test_data_set_0"
    try:
        meta["plans"] = plans_fn(m, d) if plans_fn else {}
    except Exception as e:  # noqa: BLE001
        return write_failed_meta(d, meta, "plans", e)
    write_meta(d, meta)
    return meta
