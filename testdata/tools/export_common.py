"""Shared pieces of the testdata export scripts (run with /usr/bin/python3: torch 1.13, onnx 1.12, numpy)."""
import os

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference
import torch
import torch.nn as nn

import np_eval


class Linear(nn.Module):
    """weight is [in, out] so the exported MatMul consumes the parameter directly and the initializer keeps the
    parameter's name (nn.Linear would export a Gemm/MatMul with a transposed copy named "onnx::MatMul_NNN")."""

    def __init__(self, d_in, d_out, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.empty(d_out)) if bias else None

    def forward(self, x):
        y = torch.matmul(x, self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y


def add_model_args(ap, d_model, heads, vocab, batch, seq):
    """The architecture flags shared by the GPT and BERT exporters (defaults differ per model)."""
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=d_model)
    ap.add_argument("--heads", type=int, default=heads)
    ap.add_argument("--mlp", type=int, default=None, help="MLP hidden size (default 4*d_model)")
    ap.add_argument("--vocab", type=int, default=vocab)
    ap.add_argument("--max-pos", type=int, default=None, help="position table size (default = --seq)")
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--std", type=float, default=0.08, help="init std of weights/embeddings")


def add_export_args(ap, name, here):
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opsets", type=int, nargs="+", default=[13, 17],
                    help="exported with do_constant_folding=True -> <name>_opset<N>.onnx")
    ap.add_argument("--nofold-opsets", type=int, nargs="*", default=[13],
                    help="exported with do_constant_folding=False -> <name>_opset<N>_nofold.onnx (keeps the "
                         "position table, the buffers and the constant shape sub-graphs)")
    ap.add_argument("--name", default=name, help="file name prefix")
    ap.add_argument("--out", default=here)
    ap.add_argument("--no-shardings", action="store_true", help="do not write the *.sharding.json sidecars")
    ap.add_argument("--max-mb", type=float, default=5.0, help="fail if an .onnx file exceeds this size")


def export_all(a, model, inputs, output_name, expected_names, may_fold=(), nofold_buffers=None):
    """Export `model` (eval mode, seeded) once per requested opset, verify every file and write test_data_set_0.

    inputs: list of (graph input name, torch tensor), in forward() order.
    expected_names: parameter names that must be initializers with unchanged values in every file.
    may_fold: names of those that constant folding is allowed to fold away (e.g. the position table).
    nofold_buffers: {name: array} buffers that must be initializers in the *_nofold files.
    Returns {file name: sorted op types}."""
    nofold_buffers = nofold_buffers or {}
    with torch.no_grad():
        y = model(*[t for _, t in inputs]).numpy()
    print(f"{output_name} {list(y.shape)} mean {y.mean():.4f} std {y.std():.4f} absmax {np.abs(y).max():.4f}")
    assert np.isfinite(y).all() and y.std() > 0.2, "output degenerate"

    os.makedirs(a.out, exist_ok=True)
    ds = os.path.join(a.out, "test_data_set_0")
    os.makedirs(ds, exist_ok=True)
    feeds = {n: t.numpy() for n, t in inputs}
    files = [(f"input_{i}.pb", t.numpy(), n) for i, (n, t) in enumerate(inputs)] + [("output_0.pb", y, output_name)]
    for fn, arr, nm in files:
        with open(os.path.join(ds, fn), "wb") as f:
            f.write(onnx.numpy_helper.from_array(arr, nm).SerializeToString())
    for fn, arr, nm in files:  # round trip
        t = onnx.load_tensor(os.path.join(ds, fn))
        assert t.name == nm and np.array_equal(onnx.numpy_helper.to_array(t), arr)

    params = {k: v.detach().numpy() for k, v in model.named_parameters()}
    jobs = [(o, True, f"{a.name}_opset{o}.onnx") for o in a.opsets]
    jobs += [(o, False, f"{a.name}_opset{o}_nofold.onnx") for o in a.nofold_opsets]
    in_names = [n for n, _ in inputs]
    inits_by_file, ops_by_file = {}, {}
    for opset, fold, fname in jobs:
        path = os.path.join(a.out, fname)
        torch.onnx.export(model, tuple(t for _, t in inputs), path, opset_version=opset, do_constant_folding=fold,
                          input_names=in_names, output_names=[output_name])
        m = onnx.load(path)
        onnx.checker.check_model(m, full_check=True)
        inf = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
        out_vi = [o for o in inf.graph.output if o.name == output_name][0]
        dims = [d.dim_value for d in out_vi.type.tensor_type.shape.dim]
        assert dims == list(y.shape), dims
        assert [i.name for i in m.graph.input] == in_names, [i.name for i in m.graph.input]
        assert [o.name for o in m.graph.output] == [output_name]

        inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
        must = [n for n in expected_names if not (fold and n in may_fold)]
        if not fold:
            must += list(nofold_buffers)
        missing = [n for n in must if n not in inits]
        assert not missing, f"{fname}: initializers missing (exporter renamed/transposed them?): {missing}"
        for n in must:
            ref = params[n] if n in params else nofold_buffers[n]
            assert np.array_equal(inits[n], ref), f"{fname}: {n} differs from the torch parameter"
        bad = [n for n in inits if n.startswith("onnx::MatMul") or n.startswith("onnx::Gemm")]
        assert not bad, f"{fname}: transposed/copied MatMul weights: {bad}"
        inits_by_file[fname] = inits

        size_mb = os.path.getsize(path) / 2**20
        assert size_mb < a.max_mb, f"{path} is {size_mb:.2f} MB"

        # Cross-check the ONNX graph itself (not only torch) against the expected output.
        got = np_eval.run(m, feeds)[output_name]
        err = np.abs(got - y).max()
        assert err < 1e-4, f"{fname}: numpy evaluation of the ONNX graph differs from torch by {err}"

        ops = sorted({n.op_type for n in m.graph.node})
        ops_by_file[fname] = ops
        print(f"{fname}: {size_mb:.2f} MB, {len(m.graph.node)} nodes, "
              f"{len(m.graph.initializer)} initializers, numpy-eval max |err| {err:.2e}")
        print(f"  op types: {' '.join(ops)}")
        print(f"  initializers: {' '.join(sorted(inits))}")

    # Same weights in every file, so one test_data_set_0 serves all of them.
    names = list(inits_by_file)
    for f in names[1:]:
        for n in expected_names:
            if n in inits_by_file[f] and n in inits_by_file[names[0]]:
                assert np.array_equal(inits_by_file[f][n], inits_by_file[names[0]][n]), f"{n}: {f} != {names[0]}"
    return ops_by_file
