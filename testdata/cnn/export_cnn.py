#!/usr/bin/python3
"""Export torchvision CNNs (random init, fixed seed) to ONNX plus test data, and write their sharding sidecars.

Run with Debian's interpreter (torch 1.13, torchvision 0.14 = apt package python3-torchvision, onnx 1.12, numpy):

    /usr/bin/python3 testdata/cnn/export_cnn.py --model resnet18 --out /tmp/r18     # batch 16, 64x64
    /usr/bin/python3 testdata/cnn/export_cnn.py --model all --out /tmp/cnn          # /tmp/cnn/<model>/...
    /usr/bin/python3 testdata/cnn/export_cnn.py --model all --out /tmp/cnn --shardings-out testdata/cnn
                                                     # also regenerates the committed sidecars

The .onnx files are NOT committed (resnet18 is ~45 MB of float32 weights); tests export them into a scratch dir.

Models (--model):
    resnet18       torchvision.models.resnet18(weights=None), input [B,3,S,S] (default B 16, S 64)
    mobilenet_v2   torchvision.models.mobilenet_v2(weights=None), same input
    conv3x3        one Conv2d(8, 16, 3, stride 1, padding 1) with bias, input [B,8,S,S] (default B 1, S 32)
    all            the three, each into --out/<model>/

Outputs (in --out for one model, in --out/<model>/ for --model all):
    <model>.onnx                           opset --opset (default 13), do_constant_folding=True, graph input
                                           `input` float32 [B,C,S,S], output `logits` (`output` for conv3x3)
    test_data_set_0/input_0.pb, output_0.pb  the input and the torch model's output (TensorProto)
    <model>.<kind>.sharding.json           sidecars (--shardings-out, default the same dir; --no-shardings: none)

BatchNorm: in eval mode torch 1.13's exporter folds every Conv+BatchNorm pair into one Conv whose weight and bias
are new anonymous initializers ("onnx::Conv_NNN"). A post-pass renames them to the torch module path of the conv,
"<conv path>.weight" / "<conv path>.bias" (e.g. "layer1.0.conv1.weight", "features.2.conv.1.0.bias"), taking the
path from the Conv node's scope name ("/layer1/layer1.0/conv1/Conv"), so sharding files can name them. Their values
are the folded ones: weight * gamma/sqrt(var+eps) per output channel, and beta - mean*gamma/sqrt(var+eps) as bias.
BatchNorm affine parameters are randomised (1+N(0,0.1), N(0,0.1)) and the running statistics are calibrated on a
random batch, so activations stay O(1) through the network and no two folded biases are equal (equal initializers
would be deduplicated by the exporter into Identity nodes).

Every file is checked: onnx.checker full_check, strict shape inference (output shape), the rename (every Conv2d
module exactly once, no name collisions, no "onnx::" initializer left, folded values equal the torch parameters'
folding), the sidecars (every named tensor exists with the spec's rank, each rule matches exactly the intended
values), and the graph evaluated in float64 by np_cnn_eval.py against the torch output.
"""
import argparse
import json
import os
import re
import sys
import time

sys.dont_write_bytecode = True
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx.numpy_helper  # noqa: E402
import onnx.shape_inference  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import np_cnn_eval  # noqa: E402

try:
    import torchvision  # noqa: E402
except ImportError:
    sys.exit("error: torchvision is missing; install Debian's package: apt-get install -y python3-torchvision "
             "(and run this script with /usr/bin/python3)")

MODELS = ("resnet18", "mobilenet_v2", "conv3x3")
DEFAULTS = {"resnet18": (16, 64), "mobilenet_v2": (16, 64), "conv3x3": (1, 32)}  # (batch, size)

# Conv weights split over "model" by the channel sidecars (regexes are ECMAScript, searched like std::regex_search).
CONV_WEIGHT_RULE = {
    "resnet18": r"^(conv1|layer\d\.\d\.(conv\d|downsample\.0))\.weight$",
    "mobilenet_v2": r"^features\..*\.weight$",
}


class Conv3x3(nn.Module):
    """A single 3x3 convolution, for the spatial (halo exchange) partitioning tests."""

    def __init__(self, c_in=8, c_out=16):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride=1, padding=1)

    def forward(self, x):
        return self.conv(x)


def build(name, seed, batch, size, num_classes):
    """Returns (model in eval mode, input tensor, input channels). Deterministic in `seed`."""
    torch.manual_seed(seed)
    if name == "conv3x3":
        model, c = Conv3x3(), 8
    else:
        model, c = getattr(torchvision.models, name)(weights=None, num_classes=num_classes), 3
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in bns:  # non-trivial affine parameters, so a dropped or mis-sharded bias shows up
            bn.weight.copy_(1.0 + 0.1 * torch.randn_like(bn.weight))
            bn.bias.normal_(0.0, 0.1)
        if bns:  # calibrate the running statistics on one random batch (cumulative average, momentum None)
            for bn in bns:
                bn.reset_running_stats()
                bn.momentum = None
            model.train()
            calib = torch.randn(batch, c, size, size, generator=torch.Generator().manual_seed(seed + 2))
            model(calib)
    model.eval()
    x = torch.randn(batch, c, size, size, generator=torch.Generator().manual_seed(seed + 1))
    return model, x, c


def module_path(node_name):
    """'/features/features.1/conv/conv.0/conv.0.0/Conv' -> 'features.1.conv.0.0'. Each scope component is the
    module's name relative to the previous named scope, which it may extend ('conv' -> 'conv.0')."""
    parts = []
    for comp in node_name.split("/")[1:-1]:
        if parts and comp.startswith(parts[-1] + "."):
            parts[-1] = comp
        else:
            parts.append(comp)
    return ".".join(parts)


def folded_conv_params(model):
    """{conv path: (weight, bias)} as numpy arrays after folding the BatchNorm that follows the conv (if any)."""
    leaves = [(n, m) for n, m in model.named_modules() if not list(m.children())]
    out = {}
    for i, (n, m) in enumerate(leaves):
        if not isinstance(m, nn.Conv2d):
            continue
        w = m.weight.detach().double()
        b = m.bias.detach().double() if m.bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
        bn = leaves[i + 1][1] if i + 1 < len(leaves) else None
        if isinstance(bn, nn.BatchNorm2d):
            assert bn.num_features == w.shape[0], (n, leaves[i + 1][0])
            s = bn.weight.detach().double() / torch.sqrt(bn.running_var.double() + bn.eps)
            w = w * s[:, None, None, None]
            b = (b - bn.running_mean.double()) * s + bn.bias.detach().double()
        elif m.bias is None:
            b = None
        out[n] = (w.numpy(), None if b is None else b.numpy())
    return out


def rename_conv_initializers(m, model):
    """Renames each Conv's weight/bias initializer to '<conv module path>.weight'/'.bias'. Returns the conv paths
    in graph order."""
    g = m.graph
    convs = {n for n, mod in model.named_modules() if isinstance(mod, nn.Conv2d)}
    inits = {t.name for t in g.initializer}
    uses = {}
    for node in g.node:
        for i in node.input:
            uses[i] = uses.get(i, 0) + 1
    rename, paths = {}, []
    for node in g.node:
        if node.op_type != "Conv":
            continue
        path = module_path(node.name)
        assert path in convs, f"Conv node {node.name!r}: {path!r} is not a Conv2d module"
        paths.append(path)
        for idx, suffix in ((1, "weight"), (2, "bias")):
            if idx >= len(node.input) or not node.input[idx]:
                continue
            old, new = node.input[idx], f"{path}.{suffix}"
            assert old in inits, f"{node.name}: input {old!r} is not an initializer"
            assert uses[old] == 1, f"{node.name}: initializer {old!r} is shared by {uses[old]} inputs"
            if old != new:
                rename[old] = new
    assert sorted(paths) == sorted(convs), f"Conv nodes {sorted(paths)} != Conv2d modules {sorted(convs)}"
    targets = list(rename.values())
    assert len(set(targets)) == len(targets), "two initializers would get the same name"
    others = inits | {i.name for i in g.input} | {o.name for o in g.output} | {o for n in g.node for o in n.output}
    clash = set(targets) & (others - set(rename))
    assert not clash, f"new names collide with existing values: {sorted(clash)}"
    for t in g.initializer:
        t.name = rename.get(t.name, t.name)
    for node in g.node:
        for k, i in enumerate(node.input):
            node.input[k] = rename.get(i, i)
    for vi in g.value_info:
        vi.name = rename.get(vi.name, vi.name)
    left = [t.name for t in g.initializer if t.name.startswith("onnx::")]
    assert not left, f"anonymous initializers left: {left}"
    return paths


def sidecars(name):
    """{kind: (mesh shape, mesh axes, tensors, rules)}. Independent of --batch/--size (specs only name ranks)."""
    b = [["data", "model"], None, None, None]
    s = {}
    if name == "conv3x3":
        s["spatial"] = ([4], ["x"], {"input": [None, None, "x", None]}, [])
        return s
    s["data"] = ([2, 2], ["data", "model"], {"input": b}, [])
    s["data16"] = ([16], ["x"], {"input": ["x", None, None, None]}, [])
    rules = [{"match": CONV_WEIGHT_RULE[name], "spec": ["model", None, None, None]}]
    s["channel"] = ([2, 2], ["data", "model"], {"input": ["data", None, None, None]}, rules)
    s["channel16"] = ([4, 4], ["data", "model"], {"input": ["data", None, None, None]}, rules)
    s["spatial"] = ([4], ["x"], {"input": [None, None, "x", None]}, [])
    s["spatial16"] = ([4, 4], ["x", "y"], {"input": [None, None, "x", "y"]}, [])
    s["uneven"] = ([3], ["x"], {"input": ["x", None, None, None]}, [])
    s["uneven_spatial"] = ([3], ["x"], {"input": [None, None, "x", None]}, [])
    return s


def write_sidecar(path, shape, axes, tensors, rules):
    """Like testdata/tools/sharding_json.py (one tensor per line), plus an optional "rules" list."""
    lines = ["{", f'  "mesh": {{"shape": {json.dumps(shape)}, "axes": {json.dumps(axes)}}},', '  "tensors": {']
    items = list(tensors.items())
    for i, (k, v) in enumerate(items):
        lines.append(f"    {json.dumps(k)}: {json.dumps(v)}" + ("," if i + 1 < len(items) else ""))
    lines.append("  }" + ("," if rules else ""))
    if rules:
        lines.append('  "rules": [')
        for i, r in enumerate(rules):
            lines.append(f"    {json.dumps(r)}" + ("," if i + 1 < len(rules) else ""))
        lines.append("  ]")
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    want = {"mesh": {"shape": shape, "axes": axes}, "tensors": tensors}
    if rules:
        want["rules"] = rules
    with open(path) as f:  # must round-trip
        assert json.load(f) == want


def check_sidecar(kind, inferred, shape, axes, tensors, rules, expected_rule_matches):
    ranks = {}
    g = inferred.graph
    for t in g.initializer:
        ranks[t.name] = len(t.dims)
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        ranks.setdefault(vi.name, len(vi.type.tensor_type.shape.dim))
    for name, spec in tensors.items():
        assert name in ranks, f"{kind}: no value {name!r}"
        assert len(spec) == ranks[name], f"{kind}: {name}: spec rank {len(spec)} != {ranks[name]}"
        used = [a for e in spec if e is not None for a in ([e] if isinstance(e, str) else e)]
        assert set(used) <= set(axes) and len(used) == len(set(used)), (kind, name, spec)
    for r in rules:
        hits = sorted(n for n in ranks if re.search(r["match"], n))
        assert hits == sorted(expected_rule_matches), f"{kind}: rule {r['match']!r} matches {hits}"
        assert all(ranks[n] == len(r["spec"]) for n in hits)


def export_one(a, name, out):
    t0 = time.time()
    batch = a.batch or DEFAULTS[name][0]
    size = a.size or DEFAULTS[name][1]
    model, x, _ = build(name, a.seed, batch, size, a.num_classes)
    in_name, out_name = "input", ("output" if name == "conv3x3" else "logits")
    with torch.no_grad():
        y = model(x).numpy()
    print(f"{name}: {out_name} {list(y.shape)} mean {y.mean():.4f} std {y.std():.4f} absmax {np.abs(y).max():.4f}")
    assert np.isfinite(y).all() and y.std() > 0.1, "output degenerate"

    os.makedirs(out, exist_ok=True)
    ds = os.path.join(out, "test_data_set_0")
    os.makedirs(ds, exist_ok=True)
    xn = x.numpy()
    for fn, arr, nm in (("input_0.pb", xn, in_name), ("output_0.pb", y, out_name)):
        p = os.path.join(ds, fn)
        with open(p, "wb") as f:
            f.write(onnx.numpy_helper.from_array(arr, nm).SerializeToString())
        t = onnx.load_tensor(p)
        assert t.name == nm and np.array_equal(onnx.numpy_helper.to_array(t), arr)

    path = os.path.join(out, f"{name}.onnx")
    torch.onnx.export(model, (x,), path, opset_version=a.opset, do_constant_folding=True,
                      input_names=[in_name], output_names=[out_name])
    t_export = time.time() - t0
    m = onnx.load(path)
    paths = rename_conv_initializers(m, model)
    onnx.save(m, path)

    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    inf = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    dims = [d.dim_value for d in inf.graph.output[0].type.tensor_type.shape.dim]
    assert dims == list(y.shape), dims
    assert [i.name for i in m.graph.input] == [in_name] and [o.name for o in m.graph.output] == [out_name]

    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    folded = folded_conv_params(model)
    for p in paths:
        w, b = folded[p]
        assert np.allclose(inits[f"{p}.weight"], w, rtol=1e-5, atol=1e-7), f"{p}.weight: not the folded value"
        if b is not None:
            assert np.allclose(inits[f"{p}.bias"], b, rtol=1e-5, atol=1e-6), f"{p}.bias: not the folded value"
    params = dict(model.named_parameters())
    conv_inits = {f"{p}.{s}" for p in paths for s in ("weight", "bias")}
    for n, v in inits.items():  # the non-conv initializers (classifier) keep torch's name and value
        if n not in conv_inits:
            assert n in params and np.array_equal(v, params[n].detach().numpy()), n

    t1 = time.time()
    got = np_cnn_eval.run(m, {in_name: xn})[out_name]
    t_eval = time.time() - t1
    err = np.abs(got - y).max()
    ref_err = np.abs(got - y) / (1e-4 + 1e-4 * np.abs(got))
    assert err < 1e-4 * max(1.0, np.abs(got).max()), f"{name}: float64 evaluation differs from torch by {err}"

    if not a.no_shardings:
        sdir = a.shardings_out or out
        os.makedirs(sdir, exist_ok=True)
        conv_weights = [f"{p}.weight" for p in paths]
        for kind, (shape, axes, tensors, rules) in sidecars(name).items():
            check_sidecar(kind, inf, shape, axes, tensors, rules, conv_weights)
            write_sidecar(os.path.join(sdir, f"{name}.{kind}.sharding.json"), shape, axes, tensors, rules)

    ops = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    size_mb = os.path.getsize(path) / 2**20
    print(f"{name}.onnx: {size_mb:.1f} MB, {len(m.graph.node)} nodes, {len(m.graph.initializer)} initializers, "
          f"float64-eval max |err| {err:.2e} (max of |err|/(1e-4+1e-4|ref|): {ref_err.max():.3f}); "
          f"export {t_export:.1f} s, float64 eval {t_eval:.1f} s, total {time.time() - t0:.1f} s")
    print("  op types: " + " ".join(f"{k}x{v}" for k, v in sorted(ops.items())))
    print("  initializers: " + " ".join(f"{t.name}{list(t.dims)}" for t in m.graph.initializer))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS + ("all",), default="all")
    ap.add_argument("--batch", type=int, default=None, help="batch (default 16; conv3x3: 1)")
    ap.add_argument("--size", type=int, default=None, help="H = W of the input (default 64; conv3x3: 32)")
    ap.add_argument("--num-classes", type=int, default=1000, help="classifier width (torchvision's default 1000)")
    ap.add_argument("--opset", type=int, default=13)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory (--model all: one sub-directory per model)")
    ap.add_argument("--shardings-out", default=None,
                    help="where to write the sidecars (default: next to each model); testdata/cnn regenerates "
                         "the committed ones")
    ap.add_argument("--no-shardings", action="store_true", help="do not write the *.sharding.json sidecars")
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    names = MODELS if a.model == "all" else (a.model,)
    for name in names:
        export_one(a, name, os.path.join(a.out, name) if a.model == "all" else a.out)
    print("ok:", a.out)


if __name__ == "__main__":
    main()
