#!/usr/bin/python3
"""Makes the small ONNX models used by tests/frontend (run with Debian's /usr/bin/python3, which has onnx 1.12).

    /usr/bin/python3 testdata/frontend/make_models.py

Every model is tiny and deterministic; the outputs are committed next to this script.
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def save(model, name, **kw):
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, name), **kw)


def reshape_chain():
    """x[batch, 4, 6] -> Shape -> Gather(0) -> Unsqueeze -> Concat([b], [4, 3, 2]) -> Reshape -> MatMul(w) -> y.

    batch is symbolic; w is transposed by a Transpose of an initializer (a foldable weight transpose)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 3, 5])
    w_t = numpy_helper.from_array(np.arange(10, dtype=np.float32).reshape(5, 2), "w_t")
    idx0 = numpy_helper.from_array(np.array(0, dtype=np.int64), "idx0")
    tail = numpy_helper.from_array(np.array([4, 3, 2], dtype=np.int64), "tail")
    axes0 = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes0")
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),  # unnamed on purpose: the loader names it
        helper.make_node("Gather", ["x_shape", "idx0"], ["b"], name="gather_b", axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"], name="unsq_b"),
        helper.make_node("Concat", ["b1", "tail"], ["new_shape"], name="concat_shape", axis=0),
        helper.make_node("Reshape", ["x", "new_shape"], ["x4"], name="reshape"),
        helper.make_node("Transpose", ["w_t"], ["w"], name="transpose_w", perm=[1, 0]),
        helper.make_node("MatMul", ["x4", "w"], ["y"], name="matmul"),
    ]
    g = helper.make_graph(nodes, "reshape_chain", [x], [y], [w_t, idx0, tail, axes0])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py")
    save(m, "reshape_chain.onnx")


def ir3_inputs():
    """IR version 3, opset 9: the initializer 'w' is also listed as a graph input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    w_in = helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    w = numpy_helper.from_array(np.ones((3, 4), dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "ir3", [x, w_in], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], producer_name="make_models.py")
    m.ir_version = 3
    save(m, "ir3_inputs.onnx")


def external_data():
    """A model whose weight lives in external data (external_data.bin), plus a Constant node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])
    w = numpy_helper.from_array(np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 100.0, "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
        helper.make_node("Constant", [], ["c"], name="const_c",
                         value=numpy_helper.from_array(np.full((16,), 0.5, dtype=np.float32))),
        helper.make_node("Add", ["xw", "c"], ["y"], name="add"),
    ]
    g = helper.make_graph(nodes, "external", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_models.py")
    onnx.checker.check_model(m)
    bin_path = os.path.join(HERE, "external_data.bin")
    if os.path.exists(bin_path):
        os.remove(bin_path)  # onnx appends to an existing external-data file
    onnx.save_model(m, os.path.join(HERE, "external_data.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="external_data.bin", size_threshold=64)


def unknown_shape():
    """NonZero's output has a data-dependent shape: loading must fail naming the value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("nz", TensorProto.INT64, [1, "n"])
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero")]
    g = helper.make_graph(nodes, "unknown_shape", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py")
    save(m, "unknown_shape.onnx")


def mlp():
    """x[batch, 8] -> MatMul(fc_in.weight[8, 16]) -> Relu -> MatMul(fc_out.weight[16, 8]) -> y; for sharding files."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w1 = numpy_helper.from_array(np.ones((8, 16), dtype=np.float32), "fc_in.weight")
    w2 = numpy_helper.from_array(np.ones((16, 8), dtype=np.float32), "fc_out.weight")
    nodes = [
        helper.make_node("MatMul", ["x", "fc_in.weight"], ["h"], name="fc_in"),
        helper.make_node("Relu", ["h"], ["h_relu"], name="relu"),
        helper.make_node("MatMul", ["h_relu", "fc_out.weight"], ["y"], name="fc_out"),
    ]
    g = helper.make_graph(nodes, "mlp", [x], [y], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_models.py")
    save(m, "mlp.onnx")


def external_chain():
    """Weights too big to be read when loading shapes only (80 KiB, external), a shape chain reading them and a node
    computing on them:  y = Reshape(MatMul(x, w), Concat([-1], Slice(Shape(w), 1, 2))) + Sum(Neg(w)) (via ReduceSum)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 160])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 128])
    w = numpy_helper.from_array((np.arange(160 * 128, dtype=np.float32) % 7).reshape(160, 128), "w")
    c = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
        helper.make_node("Shape", ["w"], ["w_shape"], name="shape_w"),
        helper.make_node("Slice", ["w_shape", "one", "two"], ["n"], name="slice_n"),
        helper.make_node("Concat", ["minus_one", "n"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["xw", "target"], ["xw2"], name="reshape"),
        helper.make_node("Neg", ["w"], ["neg_w"], name="neg_w"),
        helper.make_node("ReduceSum", ["neg_w", "zero"], ["col"], name="col_sum", keepdims=0),
        helper.make_node("Add", ["xw2", "col"], ["y"], name="add"),
    ]
    g = helper.make_graph(nodes, "external_chain", [x], [y],
                          [w, c("one", [1]), c("two", [2]), c("minus_one", [-1]), c("zero", [0])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py")
    onnx.checker.check_model(m)
    bin_path = os.path.join(HERE, "external_chain.bin")
    if os.path.exists(bin_path):
        os.remove(bin_path)
    onnx.save_model(m, os.path.join(HERE, "external_chain.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="external_chain.bin", size_threshold=1024)


def typed_tensors():
    """TensorProto files with typed fields (not raw_data), for read_tensor_pb."""
    tensors = {
        "typed_float.pb": helper.make_tensor("f", TensorProto.FLOAT, [2, 3], [0.5, 1, 2, 3, 4, -5]),
        "typed_int64.pb": helper.make_tensor("i", TensorProto.INT64, [3], [1, -2, 1 << 40]),
        "typed_int32.pb": helper.make_tensor("i32", TensorProto.INT32, [2], [7, -8]),
        "typed_bool.pb": helper.make_tensor("b", TensorProto.BOOL, [4], [True, False, False, True]),
        "typed_double.pb": helper.make_tensor("d", TensorProto.DOUBLE, [2], [0.25, -1e300]),
        "raw_float.pb": numpy_helper.from_array(np.array([[1.5, 2.5]], dtype=np.float32), "r"),
    }
    for name, t in tensors.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(t.SerializeToString())


def old_opset_dropout():
    """IR 3, opset 7, initializers listed as graph inputs: Conv -> BatchNormalization(spatial=1) -> Dropout whose mask
    output nothing reads (ONNX leaves it untyped) -> Upsample(scales attribute) -> y."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "var")]
    inputs = [x] + [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)) for t in inits]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], name="bn", spatial=1),
        helper.make_node("Dropout", ["bn"], ["d", "mask"], name="dropout", ratio=0.5),
        helper.make_node("Upsample", ["d"], ["y"], name="up", mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]),
    ]
    g = helper.make_graph(nodes, "old_opset_dropout", inputs, [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)], producer_name="make_models.py")
    m.ir_version = 3
    save(m, "old_opset_dropout.onnx")


def class_token():
    """The class-token expansion of torchvision's VisionTransformer as torch exports it: the target shape [b, -1, -1]
    goes through ConstantOfShape -> Mul -> Equal -> Where before Expand, then Concat with the patches."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5, 8])
    cls = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(1, 1, 8), "class_token")
    c = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape_x"),
        helper.make_node("Gather", ["x_shape", "zero"], ["b"], name="gather_b", axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"], name="unsq_b"),
        helper.make_node("Concat", ["b1", "minus_ones"], ["target"], name="concat_target", axis=0),
        helper.make_node("ConstantOfShape", ["three"], ["ones"], name="cos",
                         value=numpy_helper.from_array(np.array([1], dtype=np.int64))),
        helper.make_node("Mul", ["ones", "minus_one"], ["neg_ones"], name="mul"),
        helper.make_node("Equal", ["target", "neg_ones"], ["is_neg"], name="equal"),
        helper.make_node("Where", ["is_neg", "ones", "target"], ["expand_shape"], name="where"),
        helper.make_node("Expand", ["class_token", "expand_shape"], ["cls_b"], name="expand"),
        helper.make_node("Concat", ["cls_b", "x"], ["y"], name="concat_tokens", axis=1),
    ]
    g = helper.make_graph(nodes, "class_token", [x], [y],
                          [cls, c("zero", 0), c("axes0", [0]), c("minus_ones", [-1, -1]), c("three", [3]),
                           c("minus_one", -1)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py")
    save(m, "class_token.onnx")


def big_constant():
    """ConstantOfShape of a constant shape to 128 MiB, reduced to a scalar: over the folding cap, so it stays a node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    nodes = [
        helper.make_node("ConstantOfShape", ["big_shape"], ["big"], name="fill",
                         value=numpy_helper.from_array(np.array([1], dtype=np.float32))),
        helper.make_node("ReduceSum", ["big"], ["total"], name="sum", keepdims=0),
        helper.make_node("Add", ["x", "total"], ["y"], name="add"),
    ]
    g = helper.make_graph(nodes, "big_constant", [x], [y],
                          [numpy_helper.from_array(np.array([4096, 4096, 2], dtype=np.int64), "big_shape")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py")
    save(m, "big_constant.onnx")


def heavy_loop():
    """A Loop of 2^20 iterations on constants, each expanding the carried scalar to 16 MiB and reducing it (found by the
    model fuzzer, docs/testing.md): folding it would run for an hour, so it stays a node."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"], name="keep"),
         helper.make_node("Expand", ["v", "shape"], ["big"], name="expand"),
         helper.make_node("ReduceMax", ["big"], ["v_out"], name="max", keepdims=0)],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array([2048, 2048], dtype=np.int64), "shape")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "v0"], ["v_final"], name="loop", body=body),
         helper.make_node("Add", ["x", "v_final"], ["y"], name="add")],
        "heavy_loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [_scalar("trips", 1 << 20, np.int64), _scalar("cond", True, np.bool_), _scalar("v0", 0.0, np.float32)])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_models.py"),
         "heavy_loop.onnx")


def half_mlp(dtype, name):
    """x[4, 8] -> MatMul -> Add -> Relu -> LayerNormalization -> MatMul -> Softmax -> y, every tensor in `dtype`
    (float16 or bfloat16); with half_mlp.sharding.json it is Megatron-sharded over 2 devices."""
    rng = np.random.default_rng(0)

    def init(n, shape):
        a = rng.standard_normal(shape).astype(np.float32)
        if dtype == TensorProto.FLOAT16:
            return numpy_helper.from_array(a.astype(np.float16), n)
        bits = (a.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16: the top half of the float32 bits
        return helper.make_tensor(n, dtype, shape, bits.flatten().tolist())

    x = helper.make_tensor_value_info("x", dtype, [4, 8])
    y = helper.make_tensor_value_info("y", dtype, [4, 6])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("LayerNormalization", ["r", "g", "beta"], ["ln"], name="ln", axis=-1),
             helper.make_node("MatMul", ["ln", "w2"], ["o"], name="fc2"),
             helper.make_node("Softmax", ["o"], ["y"], name="softmax", axis=-1)]
    inits = [init("w1", [8, 16]), init("b1", [16]), init("g", [16]), init("beta", [16]), init("w2", [16, 6])]
    g = helper.make_graph(nodes, name, [x], [y], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_models.py"),
         name + ".onnx")


def _scalar(name, value, dtype):
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def _branch(name, op, operand, out, const=None):
    """A one-node If branch: out = op(x, operand); `const` (a TensorProto) becomes a Constant node in the body."""
    nodes = [helper.make_node("Constant", [], [const.name], value=const)] if const is not None else []
    nodes.append(helper.make_node(op, ["x", operand], [out], name=f"{name}_{op.lower()}"))
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3])])


def if_const():
    """If on a constant condition (initializer 'flag' = true): then x + 1 (a Constant inside the branch), else x * 2.
    The loader inlines the then branch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    then_g = _branch("then_body", "Add", "one", "y_then", _scalar("one", [1.0], np.float32))
    else_g = _branch("else_body", "Mul", "two", "y_else", _scalar("two", [2.0], np.float32))
    nodes = [helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "if_const", [x], [y], [_scalar("flag", True, np.bool_)])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "if_const.onnx")


def if_computed():
    """y = If(sum(x) > 0): then x + one, else x * two; 'one' and 'two' are outer initializers the branches capture."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["y"], name="branch", then_branch=_branch("then_body", "Add", "one", "y_then"),
                         else_branch=_branch("else_body", "Mul", "two", "y_else")),
    ]
    inits = [_scalar("zero", 0.0, np.float32), _scalar("one", [1.0], np.float32), _scalar("two", [2.0], np.float32)]
    g = helper.make_graph(nodes, "if_computed", [x], [y], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "if_computed.onnx")


def loop_scan(trip_count_input=False):
    """Loop M=4 times (cond true): acc = acc + step + float(i), where 'step' is a graph input the body captures;
    scan output acc * acc per iteration. Outputs: acc_final[3], squares[4, 3].
    trip_count_input: M is a graph input instead (loop_dynamic.onnx: the scan output's length is data-dependent)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    step = helper.make_tensor_value_info("step", TensorProto.FLOAT, [3])
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], name="cast_i", to=TensorProto.FLOAT),
            helper.make_node("Add", ["acc", "step"], ["a1"], name="add_step"),
            helper.make_node("Add", ["a1", "fi"], ["acc_out"], name="add_i"),
            helper.make_node("Mul", ["acc_out", "acc_out"], ["sq"], name="square"),
        ],
        "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("sq", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("Loop", ["M", "go", "x"], ["acc_final", "squares"], name="loop", body=body)]
    outs = [helper.make_tensor_value_info("acc_final", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("squares", TensorProto.FLOAT, ["trips", 3])]
    inits = [_scalar("go", True, np.bool_)]
    ins = [x, step]
    if trip_count_input:
        ins.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        inits.append(_scalar("M", 4, np.int64))
    name = "loop_dynamic" if trip_count_input else "loop_scan"
    g = helper.make_graph(nodes, name, ins, outs, inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         name + ".onnx")


def nested_if_loop():
    """Loop M=3 times: acc = If(sum(acc) > limit): acc - step, else acc + step; scan output -acc. The If's branches
    read 'step' (a graph input) two scopes up and the body reads 'limit' (an initializer)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    step = helper.make_tensor_value_info("step", TensorProto.FLOAT, [2])

    def branch(name, op, out):
        return helper.make_graph([helper.make_node(op, ["acc", "step"], [out], name=name + "_" + op.lower())], name, [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2])])

    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["acc"], ["s"], name="sum", keepdims=0),
            helper.make_node("Greater", ["s", "limit"], ["big"], name="big"),
            helper.make_node("If", ["big"], ["acc_out"], name="clip", then_branch=branch("down", "Sub", "acc_down"),
                             else_branch=branch("up", "Add", "acc_up")),
            helper.make_node("Neg", ["acc_out"], ["neg"], name="neg"),
        ],
        "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("neg", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Loop", ["M", "go", "x"], ["acc_final", "negs"], name="loop", body=body)]
    outs = [helper.make_tensor_value_info("acc_final", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("negs", TensorProto.FLOAT, [3, 2])]
    inits = [_scalar("M", 3, np.int64), _scalar("go", True, np.bool_), _scalar("limit", 4.0, np.float32)]
    g = helper.make_graph(nodes, "nested_if_loop", [x, step], outs, inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "nested_if_loop.onnx")


def if_sharded():
    """h = x @ w; y = If(sum(h) > 0): Relu(h), else Neg(h) (h captured): an If fed by a value that a sharded 'x'
    splits (if_sharded.sharding.json)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])
    w = numpy_helper.from_array((np.arange(36, dtype=np.float32).reshape(6, 6) % 7 - 3) / 4, "w")

    def branch(name, op, out):
        return helper.make_graph([helper.make_node(op, ["h"], [out], name=name + "_" + op.lower())], name, [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4, 6])])

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["y"], name="branch", then_branch=branch("then_body", "Relu", "y_then"),
                         else_branch=branch("else_body", "Neg", "y_else")),
    ]
    g = helper.make_graph(nodes, "if_sharded", [x], [y], [w, _scalar("zero", 0.0, np.float32)])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "if_sharded.onnx")


def scan_axes():
    """Scan (opset 11) over x[2, 3] along axis 1, backwards, summing columns into the state s[2]; the running sums are
    stacked along output axis 1: final[2], sums[2, 3]."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "col"], ["s_out"], name="add"),
         helper.make_node("Neg", ["s_out"], ["neg"], name="neg")],
        "scan_body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("col", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("neg", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Scan", ["s0", "x"], ["final", "sums"], name="scan", body=body, num_scan_inputs=1,
                              scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[-1])]
    ins = [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2]),
           helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    outs = [helper.make_tensor_value_info("final", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("sums", TensorProto.FLOAT, [2, 3])]
    g = helper.make_graph(nodes, "scan_axes", ins, outs)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], producer_name="make_models.py"),
         "scan_axes.onnx")


def if_shapes_differ():
    """y = If(sum(x) > 0): x + one ([2, 3]), else sum(x) keeping dims ([1, 1]): the output's shape depends on which
    branch runs."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "cols"])
    else_g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["y_else"], name="else_sum", keepdims=1)],
                               "else_body", [], [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, [1, 1])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["y"], name="branch", then_branch=_branch("then_body", "Add", "one", "y_then"),
                         else_branch=else_g),
    ]
    inits = [_scalar("zero", 0.0, np.float32), _scalar("one", [1.0], np.float32)]
    g = helper.make_graph(nodes, "if_shapes_differ", [x], [y], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "if_shapes_differ.onnx")


def unsorted_mlp():
    """mlp.onnx with its nodes written in reverse (not topologically sorted; ONNX Runtime accepts such files)."""
    m = onnx.load(os.path.join(HERE, "mlp.onnx"))
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.save(m, os.path.join(HERE, "unsorted_mlp.onnx"))  # the checker rejects unsorted graphs: not checked


def seq_split_concat():
    """Sequences inside one graph: pieces = SplitToSequence(x[4,6], split=2, axis=1) (three [4,2]); seq =
    SequenceInsert(pieces, y[4,2], position 0); stacked = ConcatFromSequence(seq, axis=1, new_axis=1) [4,4,2];
    picked = SequenceAt(seq, k) with k a graph input (a position known only at run time); n = SequenceLength(seq)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [])
    outs = [helper.make_tensor_value_info("stacked", TensorProto.FLOAT, [4, 4, 2]),
            helper.make_tensor_value_info("picked", TensorProto.FLOAT, [4, 2]),
            helper.make_tensor_value_info("n", TensorProto.INT64, [])]
    nodes = [
        helper.make_node("SplitToSequence", ["x", "two"], ["pieces"], name="split", axis=1),
        helper.make_node("SequenceInsert", ["pieces", "y", "zero"], ["seq"], name="insert"),
        helper.make_node("ConcatFromSequence", ["seq"], ["stacked"], name="stack", axis=1, new_axis=1),
        helper.make_node("SequenceAt", ["seq", "k"], ["picked"], name="at"),
        helper.make_node("SequenceLength", ["seq"], ["n"], name="length"),
    ]
    inits = [_scalar("two", 2, np.int64), _scalar("zero", 0, np.int64)]
    g = helper.make_graph(nodes, "seq_split_concat", [x, y, k], outs, inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "seq_split_concat.onnx")


def seq_loop():
    """A Loop (M = 3) carrying a sequence: iteration i appends x * i (a [2,3] tensor); then ConcatFromSequence along
    axis 0 gives out[6,3]. The loader unrolls the loop."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [6, 3])
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], name="cast_i", to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "fi"], ["xi"], name="scale"),
            helper.make_node("SequenceInsert", ["s_in", "xi"], ["s_out"], name="append"),
            helper.make_node("Identity", ["c"], ["c_out"], name="keep_going"),
        ],
        "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_value_info("s_in", seq_t)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_value_info("s_out", seq_t)])
    nodes = [
        helper.make_node("SequenceEmpty", [], ["empty"], name="empty", dtype=TensorProto.FLOAT),
        helper.make_node("Loop", ["M", "go", "empty"], ["seq"], name="loop", body=body),
        helper.make_node("ConcatFromSequence", ["seq"], ["out"], name="concat", axis=0),
    ]
    inits = [_scalar("M", 3, np.int64), _scalar("go", True, np.bool_)]
    g = helper.make_graph(nodes, "seq_loop", [x], [out], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "seq_loop.onnx")


def seq_io():
    """A sequence graph input and output: ys = SequenceMap(xs, b) with body y = x + b ('xs' a sequence of float [N],
    'b' a float [N] tensor)."""
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, ["N"]))
    xs = helper.make_value_info("xs", seq_t)
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N"])
    ys = helper.make_value_info("ys", seq_t)
    body = helper.make_graph([helper.make_node("Add", ["x", "bb"], ["y"], name="add")], "map_body",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"]),
                              helper.make_tensor_value_info("bb", TensorProto.FLOAT, ["N"])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])])
    nodes = [helper.make_node("SequenceMap", ["xs", "b"], ["ys"], name="map", body=body)]
    g = helper.make_graph(nodes, "seq_io", [xs, b], [ys])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_models.py"),
         "seq_io.onnx")


def seq_at_ragged():
    """SequenceAt(SequenceConstruct(a[2], b[3]), k) with k a graph input: the output's shape depends on k."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"], name="construct"),
             helper.make_node("SequenceAt", ["s", "k"], ["y"], name="at")]
    g = helper.make_graph(nodes, "seq_at_ragged", [a, b, k], [y])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "seq_at_ragged.onnx")


def many_counts():
    """A detector's post-processing in small, past what one dim expression holds: for 70 thresholds t_i = i / 70,
    nz_i = NonZero(x > t_i) ([1, c_i], x float [8]); idx = Concat(nz_0..nz_69, axis 1) ([1, c_0 + ... + c_69], 70
    data-dependent counts) and fidx = the same Concat of the nz_i cast to float; keep = If(Size(idx) == 0): an empty
    int64 [0], else Squeeze(NonZero(x > 0.5)) ([n], n <= 8): torchvision's batched NMS, whose branches differ in
    size."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])
    outs = [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, "s"]),
            helper.make_tensor_value_info("fidx", TensorProto.FLOAT, [1, "s"]),
            helper.make_tensor_value_info("keep", TensorProto.INT64, ["k"])]
    nodes, inits, counts, fcounts = [], [_scalar("zero", 0, np.int64), _scalar("half", 0.5, np.float32)], [], []
    for i in range(70):
        inits.append(_scalar(f"t{i}", i / 70, np.float32))
        nodes += [helper.make_node("Greater", ["x", f"t{i}"], [f"m{i}"], name=f"greater_{i}"),
                  helper.make_node("NonZero", [f"m{i}"], [f"nz{i}"], name=f"nonzero_{i}"),
                  helper.make_node("Cast", [f"nz{i}"], [f"fnz{i}"], name=f"cast_{i}", to=TensorProto.FLOAT)]
        counts.append(f"nz{i}")
        fcounts.append(f"fnz{i}")
    empty = helper.make_tensor("empty", TensorProto.INT64, [0], [])
    then_g = helper.make_graph([helper.make_node("Constant", [], ["none"], name="none", value=empty)], "then_body", [],
                               [helper.make_tensor_value_info("none", TensorProto.INT64, [0])])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    else_g = helper.make_graph([
        helper.make_node("Greater", ["x", "half"], ["over"], name="over_half"),
        helper.make_node("NonZero", ["over"], ["kept"], name="kept"),
        helper.make_node("Constant", [], ["axes"], name="axes", value=axes),
        helper.make_node("Squeeze", ["kept", "axes"], ["kept1"], name="squeeze")], "else_body", [],
        [helper.make_tensor_value_info("kept1", TensorProto.INT64, ["n"])])
    nodes += [helper.make_node("Concat", counts, ["idx"], name="concat_idx", axis=1),
              helper.make_node("Concat", fcounts, ["fidx"], name="concat_fidx", axis=1),
              helper.make_node("Size", ["idx"], ["size"], name="size"),
              helper.make_node("Equal", ["size", "zero"], ["none_left"], name="none_left"),
              helper.make_node("If", ["none_left"], ["keep"], name="batched_nms", then_branch=then_g,
                               else_branch=else_g)]
    g = helper.make_graph(nodes, "many_counts", [x], outs, inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "many_counts.onnx")


def growing_loop():
    """A Loop over a data-dependent count whose carried value grows (torchvision's paste-masks loop): n = the count of
    x > 0 (NonZero, x float [4]); res starts float [1, 0] and iteration i appends Cast(NonZero(x > i)) along axis 1,
    so res ends [1, c_0 + ... + c_(n-1)]; its body is untyped at load (a NonZero inside)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    res = helper.make_tensor_value_info("res", TensorProto.FLOAT, [1, "total"])
    body = helper.make_graph([
        helper.make_node("Cast", ["i"], ["fi"], name="fi", to=TensorProto.FLOAT),
        helper.make_node("Greater", ["x", "fi"], ["over"], name="over"),
        helper.make_node("NonZero", ["over"], ["idx"], name="idx"),
        helper.make_node("Cast", ["idx"], ["fidx"], name="fidx", to=TensorProto.FLOAT),
        helper.make_node("Concat", ["acc", "fidx"], ["acc_out"], name="append", axis=1),
        helper.make_node("Identity", ["cond"], ["cond_out"], name="keep_going")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, "a"])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, "b"])])
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["positive"], name="positive"),
        helper.make_node("NonZero", ["positive"], ["nz"], name="nonzero"),
        helper.make_node("Shape", ["nz"], ["nz_shape"], name="nz_shape"),
        helper.make_node("Gather", ["nz_shape", "one"], ["n"], name="n", axis=0),
        helper.make_node("Loop", ["n", "true", "start"], ["res"], name="paste", body=body)]
    inits = [_scalar("zero", 0.0, np.float32), _scalar("one", 1, np.int64), _scalar("true", True, np.bool_),
             numpy_helper.from_array(np.zeros((1, 0), dtype=np.float32), "start")]
    g = helper.make_graph(nodes, "growing_loop", [x], [res], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "growing_loop.onnx")


def scan_count():
    """A Scan over a data-dependent length: the running sums of x's positive entries (x float [6]; NonZero(x > 0)
    picks them, a Scan adds them up). Its outputs are the last sum (a scalar) and all of them ([nonzero_0]): the scan
    length is the NonZero count (tests/e2e/data_dependent_test.cc). scan_count/test_data_set_<k> hold some, no and
    all entries positive with numpy's sums; scan_count/x2.plan.json splits x over 2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])
    body = helper.make_graph([helper.make_node("Add", ["s_in", "e"], ["s_out"], name="add"),
                              helper.make_node("Identity", ["s_out"], ["o"], name="out")], "body",
                             [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, []),
                              helper.make_tensor_value_info("e", TensorProto.FLOAT, [])],
                             [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, []),
                              helper.make_tensor_value_info("o", TensorProto.FLOAT, [])])
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"], name="positive"),
             helper.make_node("NonZero", ["positive"], ["nz"], name="nonzero"),
             helper.make_node("Squeeze", ["nz", "axis0"], ["ids"], name="ids"),
             helper.make_node("Gather", ["x", "ids"], ["picked"], name="picked", axis=0),
             helper.make_node("Scan", ["start", "picked"], ["total", "sums"], name="running_sum", body=body,
                              num_scan_inputs=1)]
    inits = [_scalar("zero", 0.0, np.float32), numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             _scalar("start", 0.0, np.float32)]
    outs = [helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("sums", TensorProto.FLOAT, ["n"])]
    g = helper.make_graph(nodes, "scan_count", [x], outs, inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "scan_count.onnx")
    for k, v in enumerate(([1, -2, 3, 0, 5, -1], [-1, -2, 0, 0, -5, -1], [1, 2, 3, 4, 5, 6])):
        d = os.path.join(HERE, "scan_count", f"test_data_set_{k}")
        os.makedirs(d, exist_ok=True)
        a = np.array(v, np.float32)
        sums = np.cumsum(a[a > 0]).astype(np.float32)
        onnx.save_tensor(numpy_helper.from_array(a, "x"), os.path.join(d, "input_0.pb"))
        onnx.save_tensor(numpy_helper.from_array(np.array(sums[-1] if len(sums) else 0, np.float32), "total"),
                         os.path.join(d, "output_0.pb"))
        onnx.save_tensor(numpy_helper.from_array(sums, "sums"), os.path.join(d, "output_1.pb"))
    with open(os.path.join(HERE, "scan_count", "x2.plan.json"), "w") as f:
        f.write('{"mesh": {"shape": [2], "axes": ["x"]}, "tensors": {"x": ["x"]}}\n')


def mean_rows():
    """y = ReduceMean(x, axes [0], keepdims) over x float [n, 8], n a symbol: the mean over a split symbolic dim
    (tests/e2e/symbolic_test.cc). mean_rows/test_data_set_0 holds n = 5 (uneven over 2) and numpy's mean;
    mean_rows/rows2.plan.json splits the rows over 2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    g = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=[0], keepdims=1)],
                          "mean_rows", [x], [y])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "mean_rows.onnx")
    d = os.path.join(HERE, "mean_rows", "test_data_set_0")
    os.makedirs(d, exist_ok=True)
    a = (np.arange(5 * 8, dtype=np.float32) % 7 - 2).reshape(5, 8)
    onnx.save_tensor(numpy_helper.from_array(a, "x"), os.path.join(d, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(a.mean(0, keepdims=True), "y"), os.path.join(d, "output_0.pb"))
    with open(os.path.join(HERE, "mean_rows", "rows2.plan.json"), "w") as f:
        f.write('{"mesh": {"shape": [2], "axes": ["rows"]}, "tensors": {"x": ["rows", null]}}\n')


def layer_norm_cols():
    """y = LayerNormalization(x, scale, bias, axis -1) over x float [4, n], scale and bias float [n], n a symbol: a
    normalization over a split symbolic dim (tests/e2e/symbolic_test.cc). layer_norm_cols/test_data_set_0 holds n = 5
    (uneven over 2) and numpy's result; layer_norm_cols/cols2.plan.json splits the columns over 2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, "n"])
    scale = helper.make_tensor_value_info("scale", TensorProto.FLOAT, ["n"])
    bias = helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, "n"])
    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], name="ln", axis=-1,
                                            epsilon=1e-5)], "layer_norm_cols", [x, scale, bias], [y])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_models.py"),
         "layer_norm_cols.onnx")
    d = os.path.join(HERE, "layer_norm_cols", "test_data_set_0")
    os.makedirs(d, exist_ok=True)
    a = (np.arange(4 * 5, dtype=np.float32) % 7 - 2).reshape(4, 5) * np.float32(0.5)
    s = np.linspace(0.5, 1.5, 5, dtype=np.float32)
    b = np.linspace(-1, 1, 5, dtype=np.float32)
    mean = a.mean(-1, keepdims=True)
    var = ((a - mean) ** 2).mean(-1, keepdims=True)
    out = ((a - mean) / np.sqrt(var + np.float32(1e-5)) * s + b).astype(np.float32)
    for k, (name, t) in enumerate((("x", a), ("scale", s), ("bias", b))):
        onnx.save_tensor(numpy_helper.from_array(t, name), os.path.join(d, f"input_{k}.pb"))
    onnx.save_tensor(numpy_helper.from_array(out, "y"), os.path.join(d, "output_0.pb"))
    with open(os.path.join(HERE, "layer_norm_cols", "cols2.plan.json"), "w") as f:
        f.write('{"mesh": {"shape": [2], "axes": ["cols"]}, "tensors": {"x": [null, "cols"]}}\n')


def lookup_vocab():
    """y = Gather(table, ids) over table float [vocab, 4], vocab a symbol, and ids int64 [3]: a vocab-parallel lookup
    of a symbolic table (tests/e2e/symbolic_test.cc). lookup_vocab/test_data_set_0 holds vocab = 5 (uneven over 2),
    ids [4, -1, 0] (a negative id counts from the end) and numpy's lookup; test_data_set_1 an id of 5, out of range;
    lookup_vocab/vocab2.plan.json splits the table's rows over 2."""
    table = helper.make_tensor_value_info("table", TensorProto.FLOAT, ["vocab", 4])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup", axis=0)],
                          "lookup_vocab", [table, ids], [y])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "lookup_vocab.onnx")
    t = (np.arange(5 * 4, dtype=np.float32) % 7 - 2).reshape(5, 4)
    for k, i in enumerate((np.array([4, -1, 0], np.int64), np.array([1, 5, 0], np.int64))):
        d = os.path.join(HERE, "lookup_vocab", f"test_data_set_{k}")
        os.makedirs(d, exist_ok=True)
        onnx.save_tensor(numpy_helper.from_array(t, "table"), os.path.join(d, "input_0.pb"))
        onnx.save_tensor(numpy_helper.from_array(i, "ids"), os.path.join(d, "input_1.pb"))
        if k == 0:
            onnx.save_tensor(numpy_helper.from_array(t[i], "y"), os.path.join(d, "output_0.pb"))
    with open(os.path.join(HERE, "lookup_vocab", "vocab2.plan.json"), "w") as f:
        f.write('{"mesh": {"shape": [2], "axes": ["vocab"]}, "tensors": {"table": ["vocab", null]}}\n')


def same_stride2():
    """y = Conv(x, w) with auto_pad SAME_UPPER, strides [1, 2], over x float [1, 2, h, w], h and w symbols: SAME
    padding of a stride-2 dim changes with its size's parity (tests/e2e/symbolic_test.cc). same_stride2/rows2 and
    cols2 plans split x's rows or columns over 2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, "h", "w2"])
    w = numpy_helper.from_array((np.arange(2 * 2 * 3 * 3, dtype=np.float32) % 5 - 2).reshape(2, 2, 3, 3), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", auto_pad="SAME_UPPER",
                                            strides=[1, 2])], "same_stride2", [x], [y], [w])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="make_models.py"),
         "same_stride2.onnx")
    os.makedirs(os.path.join(HERE, "same_stride2"), exist_ok=True)
    for name, spec in (("rows2", '[null, null, "rows", null]'), ("cols2", '[null, null, null, "rows"]')):
        with open(os.path.join(HERE, "same_stride2", name + ".plan.json"), "w") as f:
            f.write('{"mesh": {"shape": [2], "axes": ["rows"]}, "tensors": {"x": ' + spec + '}}\n')


if __name__ == "__main__":
    external_chain()
    typed_tensors()
    reshape_chain()
    ir3_inputs()
    external_data()
    unknown_shape()
    mlp()
    unsorted_mlp()
    old_opset_dropout()
    class_token()
    big_constant()
    heavy_loop()
    half_mlp(TensorProto.FLOAT16, "mlp_float16")
    half_mlp(TensorProto.BFLOAT16, "mlp_bfloat16")
    if_const()
    if_computed()
    loop_scan()
    nested_if_loop()
    if_sharded()
    scan_axes()
    loop_scan(trip_count_input=True)
    if_shapes_differ()
    seq_split_concat()
    seq_loop()
    seq_io()
    seq_at_ragged()
    many_counts()
    growing_loop()
    mean_rows()
    scan_count()
    lookup_vocab()
    same_stride2()
    layer_norm_cols()
