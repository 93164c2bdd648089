#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<name>/, docs/testing.md "Fuzzing") from testdata/, the ONNX
backend test data (Debian's libonnx-testdata) and the examples of docs/sharding-file.md.

    /usr/bin/python3 fuzz/make_corpus.py        # rewrites the seed files it makes; keeps the others (regressions)

Models name their external data `weights.bin`, the file every fuzz target finds next to its input (fuzz_util.h).
Seeds are small (each model under 4 KiB, the whole corpus well under 1 MB). Regression inputs that the fuzzers found
are kept in the same folders under the name `crash-<what>` and are never rewritten here.
"""
import json
import shutil
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "fuzz/corpus"
NODE = Path("/usr/share/libonnx-testdata/data/node")

# Backend node tests whose inputs become initializers (so the full load folds them with the kernels) and, for the
# ones marked "inputs", also stay as graph inputs (so only the shape functions type them).
NODE_TESTS = {
    "test_loop11": "both", "test_if": "both", "test_scan9_sum": "both", "test_nonzero_example": "both",
    "test_gather_0": "both", "test_einsum_batch_matmul": "const", "test_conv_with_strides_padding": "both",
    "test_resize_upsample_scales_linear": "both", "test_range_float_type_positive_delta": "both",
    "test_sequence_insert_at_back": "inputs", "test_optional_get_element_sequence": "inputs",
    "test_constantofshape_int_zeros": "both", "test_expand_dim_changed": "both", "test_slice_neg_steps": "both",
    "test_split_variable_parts_1d": "const", "test_where_example": "const", "test_reshape_negative_dim": "both",
    "test_lstm_defaults": "const", "test_unique_sorted_with_axis": "both", "test_castlike_FLOAT_to_BFLOAT16": "const",
    "test_softmax_axis_1": "const", "test_layer_normalization_4d_axis0": "const", "test_gathernd_example_int32": "both",
    "test_onehot_with_axis": "both", "test_tile": "both", "test_cumsum_1d": "const", "test_scatternd": "const",
    "test_sequence_map_add_2_sequences": "inputs",
}


def write(folder: str, name: str, data: bytes):
    d = CORPUS / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def model_seeds():
    for f in sorted((REPO / "testdata/frontend").glob("*.onnx")):
        m = onnx.load(str(f), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = "weights.bin"
        data = m.SerializeToString()
        if len(data) <= 4096:
            write("model", f.stem + ".onnx", data)
    for test, how in NODE_TESTS.items():
        d = NODE / test
        if not (d / "model.onnx").exists():
            continue
        m = onnx.load(str(d / "model.onnx"))
        if how in ("inputs", "both"):
            write("model", test + ".onnx", m.SerializeToString())
        if how in ("const", "both"):
            c = onnx.ModelProto()
            c.CopyFrom(m)
            inputs = list(c.graph.input)
            del c.graph.input[:]
            ok = True
            for i, vi in enumerate(inputs):
                pb = d / "test_data_set_0" / f"input_{i}.pb"
                if not vi.type.HasField("tensor_type") or not pb.exists():
                    ok = False
                    break
                t = onnx.TensorProto()
                t.ParseFromString(pb.read_bytes())
                t.name = vi.name
                c.graph.initializer.append(t)
            if ok and len(c.SerializeToString()) <= 4096:
                write("model", test + ".const.onnx", c.SerializeToString())


def tensor_seeds():
    for f in sorted((REPO / "testdata/frontend").glob("*.pb")):
        write("tensor_pb", f.name, f.read_bytes())
    write("tensor_pb", "gpt_input_0.pb", (REPO / "testdata/gpt/test_data_set_0/input_0.pb").read_bytes())
    for test in ("test_sequence_insert_at_back", "test_optional_get_element_sequence", "test_loop11",
                 "test_castlike_FLOAT_to_BFLOAT16", "test_unique_sorted_with_axis"):
        for pb in sorted((NODE / test / "test_data_set_0").glob("*.pb")):
            if pb.stat().st_size <= 1024:
                write("tensor_pb", f"{test}.{pb.name}", pb.read_bytes())
    ext = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[4, 8])
    ext.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin"), ("offset", "64"), ("length", "128")):
        e = ext.external_data.add()
        e.key, e.value = k, v
    write("tensor_pb", "external.pb", ext.SerializeToString())
    seq = onnx.SequenceProto(name="s", elem_type=onnx.SequenceProto.TENSOR)
    seq.tensor_values.append(helper.make_tensor("a", onnx.TensorProto.INT64, [3], [1, 2, 3]))
    seq.tensor_values.append(helper.make_tensor("b", onnx.TensorProto.INT64, [2], [4, 5]))
    write("tensor_pb", "sequence.pb", seq.SerializeToString())
    opt = onnx.OptionalProto(name="o", elem_type=onnx.OptionalProto.TENSOR)
    opt.tensor_value.CopyFrom(helper.make_tensor("t", onnx.TensorProto.FLOAT16, [2], [1.0, 2.0]))
    write("tensor_pb", "optional_tensor.pb", opt.SerializeToString())
    opt_seq = onnx.OptionalProto(name="o", elem_type=onnx.OptionalProto.SEQUENCE)
    opt_seq.sequence_value.CopyFrom(seq)
    write("tensor_pb", "optional_sequence.pb", opt_seq.SerializeToString())
    write("tensor_pb", "optional_empty.pb", onnx.OptionalProto(name="o").SerializeToString())


MESH = {"shape": [2, 2], "axes": ["data", "model"]}
DOCS_EXAMPLE = {
    "mesh": MESH,
    "tensors": {
        "input_ids": ["data", None],
        "h.0.mlp.fc_in.weight": [None, "model"],
        "h.0.attn.qkv": [["data", "model"], None, None],
        "h.0.mlp.out": {"spec": ["data", None], "unreduced": ["model"], "priority": 1},
        "h.0.attn.proj.weight": {"hlo": "{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}"},
        "h.1.mlp.fc_in.weight": {"sbp": ["B", "S(1)"]},
    },
    "rules": [{"match": "mlp\\.fc_in\\.weight$", "spec": [None, "model"]}],
}
SHARDING_FILES = {
    "docs_format.json": DOCS_EXAMPLE,
    "open_dims.json": {"version": 1, "mesh": {"shape": [2, 4], "axes": ["x", "y"]},
                       "tensors": {"x": [{"axes": ["x"], "open": True}, None],
                                   "fc_in.weight": {"spec": [None, "y"], "open": True, "priority": 2}}},
    "sub_axes.json": {"mesh": {"shape": [2, 4], "axes": ["data", "model"]},
                      "tensors": {"x": ["model:(1)2", "data"], "fc_in.weight": ["model:(2)2", "model:(1)2"],
                                  "h": [["model:(1)2", "model:(2)2"], None]}},
    "device_order.json": {"mesh": {"shape": [2, 2], "axes": ["data", "model"], "devices": [0, 2, 1, 3]},
                          "tensors": {"x": {"hlo": "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"},
                                      "y": {"spec": [None, None], "unreduced": "model", "reduction": "max"}}},
    "rules_notations.json": {"mesh": {"axes": ["data", "model"]},
                             "rules": [{"match": "^h\\.\\d+\\.attn\\.[qkv]\\.weight$", "hlo": "{devices=[1,2,2]<=[4] last_tile_dim_replicate}"},
                                       {"match": "bias$", "sbp": ["B", "S(0)"]},
                                       {"match": "(fc_out|proj)\\.weight$", "spec": ["model", None], "partial": []},
                                       {"match": ".", "hlo": "{replicated}", "priority": 3}]},
    "hlo_forms.json": {"mesh": {"shape": [2, 4], "axes": ["x", "y"]},
                       "tensors": {"r2": {"hlo": "{devices=[2,4]<=[2,4]T(1,0)}"},
                                   "r1": {"hlo": "{devices=[4,2]<=[8] last_tile_dim_replicate}"},
                                   "r3": {"hlo": "{devices=[1,2,1,4]<=[8] last_tile_dims={unreduced}}", "reduction": "min"},
                                   "r0": {"hlo": "{devices=[2,4]<=[8] last_tile_dims={replicated, partial} metadata={op_name=\"a\"}}"}}},
    "sbp_forms.json": {"mesh": {"shape": [2, 2, 2], "axes": ["a", "b", "c"]},
                       "tensors": {"r3": {"sbp": ["S(0)", "S(0)", "S(2)"]}, "r2": {"sbp": ["P(max)", "B", "P(max)"]},
                                   "img": {"sbp": ["P", "S(3)", "B"], "priority": 1}}},
}


def sharding_seeds():
    files = [(REPO / "testdata/gpt") / n for n in ("gpt.megatron.sharding.json", "gpt.2d.sharding.json",
                                                  "gpt.pipeline.sharding.json", "gpt.dp.sharding.json")]
    files += [REPO / "testdata/frontend/half_mlp.sharding.json", REPO / "testdata/frontend/if_sharded.sharding.json",
              REPO / "testdata/cnn/resnet18.uneven_spatial.sharding.json", REPO / "testdata/bert/bert.megatron.sharding.json"]
    for f in files:
        write("sharding_json", f.name, f.read_bytes())
    for name, doc in SHARDING_FILES.items():
        write("sharding_json", name, json.dumps(doc, indent=1).encode())
    # HLO and SBP: the first byte picks mesh (bits 0-2), rank (3-5), rule (6), priority/open (7): fuzz/sharding_fuzz.h.
    def sel(mesh, rank, rule=0, extra=0):
        return bytes([mesh | rank << 3 | rule << 6 | extra << 7])
    hlo = [
        (sel(0, 2), "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"),
        (sel(0, 2, 1), "{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}"),
        (sel(1, 2), "{devices=[4,2]<=[8]}"),
        (sel(2, 2), "{devices=[2,4]<=[2,4]T(1,0)}"),
        (sel(3, 1), "{devices=[4]0,3,1,2}"),
        (sel(4, 3, 0, 1), "{devices=[2,1,2,2]<=[2,2,2]T(2,0,1) last_tile_dims={unreduced}}"),
        (sel(5, 1), "{devices=[4]<=[4]}"),
        (sel(6, 2, 1), "{devices=[2,2,4]<=[4,4]T(1,0) last_tile_dims={replicated, unreduced} metadata={op_name=\"x\"}}"),
        (sel(7, 0), "{replicated}"),
        (sel(0, 1), "{maximal device=1}"),
        (sel(0, 1), "{{replicated}, {manual}}"),
    ]
    for i, (b, text) in enumerate(hlo):
        write("sharding_hlo", f"hlo_{i}.txt", b + text.encode())
    sbp = [
        (sel(0, 2), ["S(0)", "B"]), (sel(0, 2, 1), ["B", "S(1)"]), (sel(0, 1), ["S(0)", "S(0)"]),
        (sel(4, 3, 0, 1), ["P(max)", "S(2)", "P(max)"]), (sel(1, 1), ["P"]), (sel(3, 2), ["P(sum)", "S(1)"]),
        (sel(7, 4, 1), ["S(3)", "B"]), (sel(5, 2), ["B", "P(prod)"]),
    ]
    for i, (b, entries) in enumerate(sbp):
        write("sharding_sbp", f"sbp_{i}.txt", b + "\n".join(entries).encode())


def main():
    for folder in ("model", "tensor_pb", "sharding_json", "sharding_hlo", "sharding_sbp"):
        d = CORPUS / folder
        if d.exists():
            for f in d.iterdir():
                if not f.name.startswith("crash-"):
                    f.unlink()
    model_seeds()
    tensor_seeds()
    sharding_seeds()
    total = sum(f.stat().st_size for f in CORPUS.rglob("*") if f.is_file())
    print(f"fuzz corpus: {sum(1 for f in CORPUS.rglob('*') if f.is_file())} files, {total} bytes")


if __name__ == "__main__":
    main()
