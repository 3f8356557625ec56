#!/usr/bin/python3
"""Writes the small ONNX models that tests/onnx/ imports, built with onnx.helper.

usage: make_test_models.py OUT_DIR

Layout of OUT_DIR:
  ops/<name>.onnx        one model per importer case (valid ONNX; opsets <= 17 pass onnx.checker)
  bad/<name>.onnx        invalid models, each with one defect the loader must name
  ext/<case>/model.onnx  external-data cases (weights in side files next to the model)
  tensors/<name>.pb      TensorProto files for LoadTensorProtoFile
  writer/src.onnx        source model for the checkpoint writer test (+ src.onnx.bin)
Everything is deterministic (fixed values), so C++ tests can assert exact numbers.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset=17, ir_version=8, value_info=(),
          extra_opsets=(), name="g", infer=True):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits),
                              value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    m = helper.make_model(graph, opset_imports=opsets, producer_name="onnxpipe-tests",
                          producer_version="1.0")
    m.ir_version = ir_version
    if opset <= 17 and infer:
        # Graph outputs need a shape for onnx.checker: let onnx's inference fill them in.
        try:
            inferred = onnx.shape_inference.infer_shapes(m)
            m.graph.ClearField("output")
            m.graph.output.extend(inferred.graph.output)
        except Exception:  # bad/ models: leave them as they are
            pass
    return m


def const_i64(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def save(m, path, check=True):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if check and m.opset_import[0].version <= 17:
        onnx.checker.check_model(m)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


# ----------------------------------------------------------------------------------------------
# ops/: one case per importer; inputs are x (f32 [2,3,4]) unless a case says otherwise.

def unary(op, elem=F, **attrs):
    return model([helper.make_node(op, ["x"], ["y"], name=f"/blk/{op}", **attrs)],
                 [vi("x", elem, [2, 3, 4])], [vi("y", elem, None)])


def binary(op, elem=F, out_elem=None, **attrs):
    return model([helper.make_node(op, ["a", "b"], ["y"], name=f"/blk/{op}", **attrs)],
                 [vi("a", elem, [2, 3]), vi("b", elem, [3])], [vi("y", out_elem or elem, None)])


def op_models():
    ms = {}
    for op in ["Sqrt", "Reciprocal", "Neg", "Exp", "Log", "Erf", "Tanh", "Relu", "Sigmoid",
               "Identity"]:
        ms[op] = unary(op)
    ms["Not"] = unary("Not", TensorProto.BOOL)
    for op in ["Add", "Sub", "Mul", "Div", "Pow"]:
        ms[op] = binary(op)
    for op in ["Equal", "Less", "Greater"]:
        ms[op] = binary(op, out_elem=TensorProto.BOOL)
    ms["And"] = binary("And", TensorProto.BOOL)
    ms["Mod"] = binary("Mod", TensorProto.INT64, fmod=0)
    ms["Where"] = model([helper.make_node("Where", ["c", "a", "b"], ["y"], name="/blk/Where")],
                        [vi("c", TensorProto.BOOL, [2, 3]), vi("a", F, [2, 3]), vi("b", F, [3])],
                        [vi("y", F, None)])
    ms["Gather"] = model(
        [helper.make_node("Gather", ["x", "idx"], ["y"], name="/emb/Gather", axis=1)],
        [vi("x", F, [2, 3, 4]), vi("idx", TensorProto.INT64, [5])], [vi("y", F, None)])
    ms["MatMul"] = model([helper.make_node("MatMul", ["a", "w"], ["y"], name="/l0/MatMul")],
                         [vi("a", F, ["B", 3, 4])], [vi("y", F, None)],
                         [numpy_helper.from_array(np.ones((4, 5), np.float32), "w")])
    ms["Gemm"] = model(
        [helper.make_node("Gemm", ["a", "w", "c"], ["y"], name="/fc/Gemm", alpha=0.5, transB=1)],
        [vi("a", F, [2, 4])], [vi("y", F, None)],
        [numpy_helper.from_array(np.ones((5, 4), np.float32), "w"),
         numpy_helper.from_array(np.zeros((5,), np.float32), "c")])
    ms["Softmax"] = unary("Softmax", axis=1)
    ms["LogSoftmax"] = unary("LogSoftmax")
    ms["LayerNormalization"] = model(
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="/ln/LayerNorm",
                          epsilon=1e-6)],
        [vi("x", F, [2, 3, 4])], [vi("y", F, None)],
        [numpy_helper.from_array(np.ones(4, np.float32), "s"),
         numpy_helper.from_array(np.zeros(4, np.float32), "b")])
    ms["Transpose"] = unary("Transpose", perm=[2, 0, 1])
    ms["Reshape"] = model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="/r/Reshape")],
                          [vi("x", F, [2, 3, 4])], [vi("y", F, None)], [const_i64("shape", [6, 4])])
    ms["Flatten"] = unary("Flatten", axis=2)
    ms["Concat"] = model([helper.make_node("Concat", ["x", "x"], ["y"], name="/c/Concat", axis=-1)],
                         [vi("x", F, [2, 3, 4])], [vi("y", F, None)])
    ms["Slice"] = model(
        [helper.make_node("Slice", ["x", "st", "en", "", "sp"], ["y"], name="/s/Slice")],
        [vi("x", F, [2, 3, 4])], [vi("y", F, None)],
        [const_i64("st", [0, 1]), const_i64("en", [2, 3]), const_i64("sp", [1, 1])])
    ms["Shape"] = model(
        [helper.make_node("Shape", ["x"], ["y"], name="/s/Shape", start=1)],
        [vi("x", F, [2, 3, 4])], [vi("y", TensorProto.INT64, None)])
    ms["Expand"] = model([helper.make_node("Expand", ["x", "shape"], ["y"], name="/e/Expand")],
                         [vi("x", F, [3, 1])], [vi("y", F, None)], [const_i64("shape", [2, 3, 4])])
    ms["ConstantOfShape"] = model(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="/k/ConstantOfShape",
                          value=numpy_helper.from_array(np.array([7], np.int64)))],
        [vi("shape", TensorProto.INT64, [2])], [vi("y", TensorProto.INT64, None)])
    ms["ConstantOfShapeDefault"] = model(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="/k/ConstantOfShape")],
        [vi("shape", TensorProto.INT64, [2])], [vi("y", F, None)])
    ms["Cast"] = model(
        [helper.make_node("Cast", ["x"], ["y"], name="/c/Cast", to=TensorProto.FLOAT16)],
        [vi("x", F, [2, 3, 4])], [vi("y", TensorProto.FLOAT16, None)])
    ms["Range"] = model([helper.make_node("Range", ["s", "l", "d"], ["y"], name="/r/Range")],
                        [vi("s", TensorProto.INT64, []), vi("l", TensorProto.INT64, []),
                         vi("d", TensorProto.INT64, [])], [vi("y", TensorProto.INT64, None)])
    ms["Trilu"] = model([helper.make_node("Trilu", ["x", "k"], ["y"], name="/t/Trilu", upper=0)],
                        [vi("x", F, [2, 3, 4])], [vi("y", F, None)], [const_i64("k", 1)])
    ms["SoftmaxCrossEntropyLoss"] = model(
        [helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss", "logp"],
                          name="/loss/SCE", reduction="sum", ignore_index=-100)],
        [vi("scores", F, [2, 5]), vi("labels", TensorProto.INT64, [2])],
        [vi("loss", F, None), vi("logp", F, None)])
    ms["Dropout"] = model(
        [helper.make_node("Constant", [], ["ratio"], name="/d/Constant",
                          value=numpy_helper.from_array(np.array(0.25, np.float32))),
         helper.make_node("Constant", [], ["train"], name="/d/Constant_1",
                          value=numpy_helper.from_array(np.array(True))),
         helper.make_node("Dropout", ["x", "ratio", "train"], ["y", "mask"], name="/d/Dropout",
                          seed=7)],
        [vi("x", F, [2, 3, 4])], [vi("y", F, None), vi("mask", TensorProto.BOOL, None)])
    ms["DropoutNoTrainingMode"] = model(
        [helper.make_node("Dropout", ["x", "r"], ["y"], name="/attn/Dropout")],
        [vi("x", F, [2, 3, 4])], [vi("y", F, None)],
        [numpy_helper.from_array(np.array(0.1, np.float32), "r")])
    ms["DropoutDefault"] = unary("Dropout")
    # Constant node forms: value (tensor), value_float, value_floats, value_int, value_ints.
    consts = [("value", numpy_helper.from_array(np.array([[1.5, -2.0]], np.float32))),
              ("value_float", 0.5), ("value_floats", [1.0, 2.0, 3.0]), ("value_int", 42),
              ("value_ints", [4, 5])]
    nodes, outs = [], []
    for i, (attr, v) in enumerate(consts):
        nodes.append(helper.make_node("Constant", [], [f"c{i}"], name=f"/k/Constant_{i}",
                                      **{attr: v}))
        outs.append(vi(f"c{i}", TensorProto.INT64 if "int" in attr else F, None))
    ms["Constant"] = model(nodes, [], outs)
    # ai.onnx Gelu (opset 20) and com.microsoft Gelu both import to the IR's Gelu.
    ms["Gelu_op20"] = model([helper.make_node("Gelu", ["x"], ["y"], name="/f/Gelu",
                                              approximate="tanh")],
                            [vi("x", F, [2, 3])], [vi("y", F, None)], opset=20, ir_version=9)
    ms["Gelu_msft"] = model([helper.make_node("Gelu", ["x"], ["y"], name="/f/Gelu",
                                              domain="com.microsoft")],
                            [vi("x", F, [2, 3])], [vi("y", F, [2, 3])],
                            extra_opsets=[("com.microsoft", 1)])
    return ms


def opset_variant_models():
    """The same computation in the forms of different opsets; they must import to one IR."""
    ms = {}
    x = [vi("x", F, [2, 6, 4])]
    for op in ["ReduceMean", "ReduceMax"]:
        for opset in [14, 17]:
            ms[f"{op}_op{opset}"] = model(
                [helper.make_node(op, ["x"], ["y"], name=f"/r/{op}", axes=[1], keepdims=0)],
                x, [vi("y", F, None)], opset=opset)
        ms[f"{op}_op18"] = model(
            [helper.make_node(op, ["x", "axes"], ["y"], name=f"/r/{op}", keepdims=0)],
            x, [vi("y", F, None)], [const_i64("axes", [1])], opset=18)
    for opset in [14, 17, 18]:
        # axes from a Constant node rather than an initializer
        ms[f"ReduceSum_op{opset}"] = model(
            [helper.make_node("Constant", [], ["axes"], name="/r/Constant",
                              value=numpy_helper.from_array(np.array([1], np.int64))),
             helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="/r/ReduceSum", keepdims=0)],
            x, [vi("y", F, None)], opset=opset, ir_version=8)
    for opset in [14, 17]:
        ms[f"Split_even_op{opset}"] = model(
            [helper.make_node("Split", ["x"], ["p", "q", "r"], name="/s/Split", axis=1)],
            x, [vi(n, F, None) for n in "pqr"], opset=opset)
        ms[f"Split_sizes_op{opset}"] = model(
            [helper.make_node("Split", ["x", "sizes"], ["p", "q"], name="/s/Split", axis=1)],
            x, [vi(n, F, None) for n in "pq"], [const_i64("sizes", [2, 4])], opset=opset)
    ms["Split_even_op18"] = model(
        [helper.make_node("Split", ["x"], ["p", "q", "r"], name="/s/Split", axis=1,
                          num_outputs=3)],
        x, [vi(n, F, None) for n in "pqr"], opset=18)
    ms["Split_sizes_op18"] = model(
        [helper.make_node("Split", ["x", "sizes"], ["p", "q"], name="/s/Split", axis=1)],
        x, [vi(n, F, None) for n in "pq"], [const_i64("sizes", [2, 4])], opset=18)
    # opset 18: uneven num_outputs split of an axis of length 7 -> 3, 3, 1
    ms["Split_uneven_op18"] = model(
        [helper.make_node("Split", ["x"], ["p", "q", "r"], name="/s/Split", axis=1,
                          num_outputs=3)],
        [vi("x", F, [2, 7])], [vi(n, F, None) for n in "pqr"], opset=18)
    for opset in [14, 17, 18, 21]:
        ms[f"SqueezeUnsqueeze_op{opset}"] = model(
            [helper.make_node("Unsqueeze", ["x", "ax"], ["u"], name="/q/Unsqueeze"),
             helper.make_node("Squeeze", ["u", "ax"], ["y"], name="/q/Squeeze")],
            x, [vi("y", F, None)], [const_i64("ax", [0])], opset=opset,
            ir_version=8 if opset <= 17 else 10)
    for opset in [17, 18]:
        ms[f"LayerNorm_op{opset}"] = model(
            [helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="/ln/LN", axis=-1)],
            x, [vi("y", F, None)], [numpy_helper.from_array(np.ones(4, np.float32), "s")],
            opset=opset)
    return ms


# ----------------------------------------------------------------------------------------------
# Initializers of every dtype, raw_data and typed fields.

def dtype_model():
    inits = []
    vals = {
        "f32": np.array([1.5, -2.25, 3.0], np.float32),
        "f64": np.array([[0.1, -0.2]], np.float64),
        "f16": np.array([1.0, -0.5, 65504.0], np.float16),
        "i64": np.array([-(2**40), 7], np.int64),
        "i32": np.array([-5, 2**31 - 1], np.int32),
        "i8": np.array([-128, 127, 3], np.int8),
        "u8": np.array([0, 255], np.uint8),
        "bool": np.array([True, False, True]),
    }
    for k, v in vals.items():
        raw = numpy_helper.from_array(v, f"{k}_raw")  # numpy_helper writes raw_data
        assert raw.HasField("raw_data")
        inits.append(raw)
        # make_tensor stores f16 values as their bit patterns in int32_data
        typed = helper.make_tensor(f"{k}_typed", onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[v.dtype],
                                   v.shape, v.flatten().tolist())
        assert not typed.HasField("raw_data")
        inits.append(typed)
    # bf16: 1.0, -2.0, 0.5 as bit patterns (top 16 bits of the f32)
    bf16_bits = [0x3F80, 0xC000, 0x3F00]
    inits.append(helper.make_tensor("bf16_raw", TensorProto.BFLOAT16, [3],
                                    np.array(bf16_bits, np.uint16).tobytes(), raw=True))
    inits.append(helper.make_tensor("bf16_typed", TensorProto.BFLOAT16, [3], [1.0, -2.0, 0.5]))
    assert list(inits[-1].int32_data) == bf16_bits
    # a scalar and an empty tensor
    inits.append(numpy_helper.from_array(np.array(2.5, np.float32), "scalar"))
    inits.append(numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"))
    outs = [vi(t.name, t.data_type, list(t.dims)) for t in inits]
    nodes = [helper.make_node("Identity", [t.name], [f"id_{t.name}"]) for t in inits[:1]]
    return model(nodes, [], outs + [vi("id_f32_raw", F, [3])], inits)


def misc_models():
    ms = {}
    ms["dtypes"] = dtype_model()
    # Symbolic dims: dim_param -> symbols, missing dims -> unknown; libonnx infers y's shape.
    ms["symbolic"] = model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="/l0/MatMul"),
         helper.make_node("Relu", ["h"], ["y"], name="/l0/Relu")],
        [vi("x", F, ["batch", "seq", 4]), vi("z", F, [None, 3])], [vi("y", F, None)],
        [numpy_helper.from_array(np.ones((4, 8), np.float32), "w")])
    ms["symbolic_op18"] = model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="/l0/MatMul"),
         helper.make_node("Relu", ["h"], ["y"], name="/l0/Relu")],
        [vi("x", F, ["batch", "seq", 4])], [vi("y", F, ["batch", "seq", 8])],
        [numpy_helper.from_array(np.ones((4, 8), np.float32), "w")], opset=18,
        value_info=[vi("h", F, ["batch", "seq", 8])])
    # Old exporters list initializers among the graph inputs too.
    m = model([helper.make_node("Add", ["x", "w"], ["y"], name="/a/Add")],
              [vi("x", F, [4]), vi("w", F, [4])], [vi("y", F, None)],
              [numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")], ir_version=3)
    ms["init_as_input"] = m
    # Nodes not in topological order (acyclic): accepted and sorted.
    ms["unsorted"] = model(
        [helper.make_node("Relu", ["h"], ["y"], name="second"),
         helper.make_node("Neg", ["x"], ["h"], name="first")],
        [vi("x", F, [3])], [vi("y", F, [3])])
    # An unused model-local function is ignored (with a warning).
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [3])],
              [vi("y", F, [3])], extra_opsets=[("local", 1)])
    m.functions.append(helper.make_function(
        "local", "Unused", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])],
        [helper.make_opsetid("", 17)]))
    ms["unused_function"] = m
    return ms


# ----------------------------------------------------------------------------------------------
# bad/: one defect each.

def bad_models():
    ms = {}
    x = [vi("x", F, [3])]
    ms["opset11"] = model([helper.make_node("Relu", ["x"], ["y"])], x, [vi("y", F, None)],
                          opset=11, ir_version=6)
    ms["opset24"] = model([helper.make_node("Relu", ["x"], ["y"])], x, [vi("y", F, None)],
                          opset=24, ir_version=11)
    ms["no_opset"] = model([helper.make_node("Relu", ["x"], ["y"])], x, [vi("y", F, None)])
    del ms["no_opset"].opset_import[:]
    ms["unknown_op"] = model(
        [helper.make_node("Relu", ["x"], ["h"], name="ok_relu"),
         helper.make_node("FancyOp", ["h"], ["g"], name="my_fancy"),
         helper.make_node("Round", ["g"], ["y"], name="my_round")],
        x, [vi("y", F, None)])
    ms["custom_domain"] = model(
        [helper.make_node("Relu", ["x"], ["y"], name="custom_relu", domain="com.example")],
        x, [vi("y", F, None)], extra_opsets=[("com.example", 1)])
    ms["layernorm_op14"] = model(
        [helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="early_ln")],
        x, [vi("y", F, None)], [numpy_helper.from_array(np.ones(3, np.float32), "s")], opset=14)
    ms["dangling"] = model(
        [helper.make_node("Add", ["x", "nowhere"], ["y"], name="dangling_add")],
        x, [vi("y", F, None)])
    for opset in [17, 18]:
        ms[f"cycle_op{opset}"] = model(
            [helper.make_node("Add", ["x", "b"], ["a"], name="cyc_a"),
             helper.make_node("Neg", ["a"], ["b"], name="cyc_b"),
             helper.make_node("Relu", ["a"], ["y"], name="after")],
            x, [vi("y", F, None)], opset=opset, ir_version=8)
    bad = numpy_helper.from_array(np.ones(3, np.float32), "short_w")
    bad.raw_data = bad.raw_data[:8]
    ms["init_raw_size"] = model([helper.make_node("Add", ["x", "short_w"], ["y"])], x,
                                [vi("y", F, None)], [bad])
    few = helper.make_tensor("few_w", F, [3], [1.0, 2.0, 3.0])
    del few.float_data[2]
    ms["init_typed_count"] = model(
        [helper.make_node("Add", ["x", "few_w"], ["y"])], x, [vi("y", F, None)], [few])
    neg = helper.make_tensor("neg_w", F, [3], [1.0, 2.0, 3.0])
    neg.dims[:] = [-3]
    ms["init_negative_dim"] = model([helper.make_node("Add", ["x", "neg_w"], ["y"])], x,
                                    [vi("y", F, None)], [neg])
    huge = helper.make_tensor("huge_w", F, [1], [1.0])
    huge.dims[:] = [2**21, 2**20]
    ms["init_absurd_dims"] = model([helper.make_node("Add", ["x", "huge_w"], ["y"])], x,
                                   [vi("y", F, None)], [huge])
    ms["input_negative_dim"] = model([helper.make_node("Relu", ["x"], ["y"])],
                                     [vi("x", F, [2, -5])], [vi("y", F, None)])
    ms["input_overflow_dims"] = model([helper.make_node("Relu", ["x"], ["y"])],
                                      [vi("x", F, [2**31, 2**31, 2**31])], [vi("y", F, None)])
    ms["dup_node_outputs"] = model(
        [helper.make_node("Relu", ["x"], ["y"], name="first_def"),
         helper.make_node("Neg", ["x"], ["y"], name="second_def")],
        x, [vi("y", F, None)])
    ms["dup_input_node"] = model([helper.make_node("Relu", ["x"], ["x"], name="redefines_x")],
                                 x, [vi("x", F, None)])
    ms["dup_initializers"] = model(
        [helper.make_node("Add", ["x", "w"], ["y"])], x, [vi("y", F, None)],
        [numpy_helper.from_array(np.ones(3, np.float32), "w"),
         numpy_helper.from_array(np.ones(3, np.float32), "w")])
    ms["undefined_output"] = model([helper.make_node("Relu", ["x"], ["y"])], x,
                                   [vi("y", F, None), vi("ghost", F, None)])
    for opset in [17, 18]:
        ms[f"axes_not_constant_op{opset}"] = model(
            [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="dyn_reduce")],
            [vi("x", F, [3]), vi("axes", TensorProto.INT64, [1])], [vi("y", F, [None])],
            opset=opset)
    ms["string_input"] = model([helper.make_node("Identity", ["x"], ["y"], name="str_id")],
                               [vi("x", TensorProto.STRING, [3])],
                               [vi("y", TensorProto.STRING, None)])
    ms["bad_attr_type"] = model(
        [helper.make_node("Softmax", ["x"], ["y"], name="bad_axis", axis=1.5)], x,
        [vi("y", F, None)], opset=18)
    body = helper.make_graph([helper.make_node("Relu", ["a"], ["b"])], "body",
                             [vi("a", F, [3])], [vi("b", F, [3])])
    ms["subgraph_attr"] = model([helper.make_node("Relu", ["x"], ["y"], name="with_body",
                                                  body=body)], x, [vi("y", F, [3])])
    ext_value = helper.make_tensor("v", F, [1], [1.0])
    ext_value.ClearField("float_data")
    ext_value.data_location = TensorProto.EXTERNAL
    e = ext_value.external_data.add()
    e.key, e.value = "location", "../secret.bin"
    ms["attr_tensor_escape"] = model(
        [helper.make_node("Constant", [], ["y"], name="sneaky_const", value=ext_value)], [],
        [vi("y", F, [1])])
    ms["concat_no_axis"] = model([helper.make_node("Concat", ["x", "x"], ["y"], name="cat")], x,
                                 [vi("y", F, None)], opset=18)
    ms["cast_to_string"] = model(
        [helper.make_node("Cast", ["x"], ["y"], name="to_str", to=TensorProto.STRING)], x,
        [vi("y", F, None)], opset=18)
    ms["dropout_dynamic_ratio"] = model(
        [helper.make_node("Dropout", ["x", "r"], ["y"], name="dyn_drop")],
        [vi("x", F, [3]), vi("r", F, [])], [vi("y", F, [3])])
    ms["cumsum_dynamic_axis"] = model(
        [helper.make_node("CumSum", ["x", "ax"], ["y"], name="dyn_cumsum")],
        [vi("x", F, [2, 3]), vi("ax", TensorProto.INT64, [])], [vi("y", F, [2, 3])])
    ms["gathernd_negative_batch_dims"] = model(
        [helper.make_node("GatherND", ["x", "i"], ["y"], name="neg_batch", batch_dims=-1)],
        [vi("x", F, [2, 3]), vi("i", TensorProto.INT64, [2, 1])], [vi("y", F, [2, 3])], opset=18)
    # libonnx 1.12's LayerNormalization inference writes out of bounds for these (found by
    # fuzzing; python's onnx.shape_inference crashes on them too); onnxpipe's guard makes it an
    # error.
    ms["layernorm_axis_below_rank"] = model(
        [helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln_axis",
                          axis=-7)],
        [vi("x", F, [2, 3, 4])], [vi("y", F, [2, 3, 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "s")], infer=False)
    ms["layernorm_scalar"] = model(
        [helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], name="ln_scalar")],
        [vi("x", F, [])], [vi("y", F, [])],
        [numpy_helper.from_array(np.ones(1, np.float32), "s")], infer=False)
    # libonnx's checker rejects this one (opset 17): wrong attribute type
    ms["checker_rejects"] = model(
        [helper.make_node("Softmax", ["x"], ["y"], name="bad_axis17", axis=1.5)], x,
        [vi("y", F, None)])
    ms["gelu_bad_approximate"] = model(
        [helper.make_node("Gelu", ["x"], ["y"], name="gelu_erf", domain="com.microsoft", approximate="erf")],
        x, [vi("y", F, [3])], extra_opsets=[("com.microsoft", 1)])
    return ms


# ----------------------------------------------------------------------------------------------
# ext/: external data.

def ext_model(inits):
    nodes = [helper.make_node("Identity", [t.name], [f"out_{t.name}"]) for t in inits]
    outs = [vi(f"out_{t.name}", t.data_type, list(t.dims)) for t in inits]
    return model(nodes, [], outs, inits)


def external(name, dtype, dims, location, offset=None, length=None):
    t = TensorProto()
    t.name, t.data_type = name, dtype
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in [("location", location), ("offset", offset), ("length", length)]:
        if v is not None:
            e = t.external_data.add()
            e.key, e.value = k, str(v)
    return t


def write_ext(out):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([10, 20, 30], np.int64)
    blob = w.tobytes() + b"\0" * 16 + b.tobytes()
    d = os.path.join(out, "ext")
    cases = {
        "ok": [external("w", F, [3, 4], "weights.bin", 0, 48),
               external("b", TensorProto.INT64, [3], "sub/../weights.bin", 64, 24)],
        "missing": [external("w", F, [3, 4], "no_such_file.bin")],
        "escape": [external("w", F, [3, 4], "../outside.bin")],
        "absolute": [external("w", F, [3, 4], os.path.abspath(os.path.join(d, "outside.bin")))],
        "symlink": [external("w", F, [3, 4], "link.bin")],
        "past_end": [external("w", F, [3, 4], "weights.bin", 80, 48)],
        "length_mismatch": [external("w", F, [3, 4], "weights.bin", 0, 40)],
    }
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "outside.bin"), "wb") as f:
        f.write(blob)
    for case, inits in cases.items():
        cd = os.path.join(d, case)
        os.makedirs(os.path.join(cd, "sub"), exist_ok=True)
        with open(os.path.join(cd, "weights.bin"), "wb") as f:
            f.write(blob)
        save(ext_model(inits), os.path.join(cd, "model.onnx"), check=False)
    link = os.path.join(d, "symlink", "link.bin")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink("../outside.bin", link)


def write_tensors(out):
    d = os.path.join(out, "tensors")
    os.makedirs(d, exist_ok=True)
    arrs = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
            "i64": np.array([3, -1, 4], np.int64), "bool": np.array([[True], [False]])}
    for k, v in arrs.items():
        with open(os.path.join(d, f"{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, k).SerializeToString())


def write_writer_src(out):
    d = os.path.join(out, "writer")
    os.makedirs(d, exist_ok=True)
    big = np.arange(64, dtype=np.float32).reshape(16, 4)   # 256 bytes
    small = np.array([1.0, 2.0], np.float32)               # 8 bytes
    steps = np.array([5], np.int64)
    ext = np.arange(8, dtype=np.float64)                   # 64 bytes, external in the source
    with open(os.path.join(d, "src.onnx.bin"), "wb") as f:
        f.write(ext.tobytes())
    inits = [numpy_helper.from_array(big, "big"), numpy_helper.from_array(small, "small"),
             helper.make_tensor("steps", TensorProto.INT64, [1], [5]),
             external("ext", TensorProto.DOUBLE, [8], "src.onnx.bin", 0, 64)]
    save(ext_model(inits), os.path.join(d, "src.onnx"), check=False)


def main():
    out = sys.argv[1]
    for name, m in op_models().items():
        save(m, os.path.join(out, "ops", f"{name}.onnx"))
    for name, m in opset_variant_models().items():
        save(m, os.path.join(out, "ops", f"{name}.onnx"))
    for name, m in misc_models().items():
        save(m, os.path.join(out, "ops", f"{name}.onnx"), check=name != "unsorted")
    for name, m in bad_models().items():
        save(m, os.path.join(out, "bad", f"{name}.onnx"), check=False)
    d = os.path.join(out, "bad")
    good = op_models()["Gemm"].SerializeToString()
    with open(os.path.join(d, "truncated.onnx"), "wb") as f:
        f.write(good[: len(good) // 2])
    with open(os.path.join(d, "random.onnx"), "wb") as f:
        f.write(np.random.default_rng(1234).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    # An unnamed TensorProto parses as a ModelProto (its fields are unknown there) without graph.
    with open(os.path.join(d, "tensor_not_model.onnx"), "wb") as f:
        f.write(numpy_helper.from_array(np.ones((2, 2), np.float32)).SerializeToString())
    # A named one does not parse: its name (field 8) is read as a malformed opset_import.
    with open(os.path.join(d, "named_tensor.onnx"), "wb") as f:
        f.write(numpy_helper.from_array(np.ones((2, 2), np.float32), "t").SerializeToString())
    write_ext(out)
    write_tensors(out)
    write_writer_src(out)


if __name__ == "__main__":
    main()
