#!/usr/bin/env python3
"""Writes the ONNX Pad models that tests/autodiff/onnx_pad_test.cc imports, with numpy references (np.pad, constant
mode, which is the specification's definition):

  pad_axes.onnx      X (2, 3, 4), opset 18, pads [1, 0, 2, 3] on axes [1, -1], constant_value 2.5
  pad_all.onnx       X (2, 3, 4), opset 13, pads [0, 2, 0, 1, 0, 1] on every axis, zeros
  pad_traced.onnx    X (B, 3, 4), opset 17, F.pad(X, (1, 2, 0, 3)) as the TorchScript exporter writes it: the pads
                     computed in the graph from the list (zeros for the leading axes from Shape of the list, Concat,
                     Reshape to pairs, the pairs reversed by a Slice of step -1, Transpose, Reshape, Cast)
  pad_dynamic.onnx   X (B, 3, 4), opset 15, pads computed at run time from X's dims: B rows before axis 0 and
                     4 - (3 mod 4) = 1 column after axis 2 (with X (2, 3, 4): Y (4, 3, 5))
  pad_reflect.onnx, pad_negative.onnx: refused by onnxpipe (reflect mode, a crop)
Float32 models; inputs and references: <model>.X.npy and <model>.Y.npy. onnxruntime, when installed, is checked
against the references:
  VENV/bin/python tests/data/onnx_pad/make_models.py
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import reference_models  # noqa: E402


def model(name, nodes, initializers, y_shape, opset, x_shape=(2, 3, 4)):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)],
                              initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxpipe-tests",
                             ir_version=9)


def write(name, m, x, y):
    reference_models.write(HERE, name, m, {"X": x}, y, {"X": x})


def main():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    pads, axes, value = np.array([1, 0, 2, 3], np.int64), np.array([1, -1], np.int64), np.array(2.5, np.float32)
    node = helper.make_node("Pad", ["X", "pads", "value", "axes"], ["Y"], name="/emb/pad")
    write("pad_axes", model("pad_axes", [node], {"pads": pads, "value": value, "axes": axes}, [2, 6, 7], 18), x,
          np.pad(x, [(0, 0), (1, 2), (0, 3)], constant_values=2.5))
    node = helper.make_node("Pad", ["X", "pads"], ["Y"], name="/emb/pad")
    write("pad_all", model("pad_all", [node], {"pads": np.array([0, 2, 0, 1, 0, 1], np.int64)}, [3, 5, 5], 13), x,
          np.pad(x, [(0, 1), (2, 0), (0, 1)]))
    node = helper.make_node("Pad", ["X", "pads"], ["Y"], name="/emb/pad", mode="reflect")
    onnx.save_model(model("pad_reflect", [node], {"pads": np.array([0, 1, 0, 0, 1, 0], np.int64)}, [2, 5, 4], 13),
                    os.path.join(HERE, "pad_reflect.onnx"))
    node = helper.make_node("Pad", ["X", "pads"], ["Y"], name="/emb/pad")
    onnx.save_model(model("pad_negative", [node], {"pads": np.array([0, -1, 0, 0, 0, 0], np.int64)}, [2, 2, 4], 13),
                    os.path.join(HERE, "pad_negative.onnx"))
    write("pad_traced", model("pad_traced", traced_pad_nodes([1, 2, 0, 3], rank=3), {}, ["B", 6, 7], 17,
                              x_shape=("B", 3, 4)), x, np.pad(x, [(0, 0), (0, 3), (1, 2)]))
    # pads from the dynamic batch dim (B rows before axis 0; after axis 2, 4 - S % 4 with S = 3: a last axis padded
    # to the next multiple of 4, plus one), only known at run time
    nodes = [helper.make_node("Shape", ["X"], ["dims"], name="/emb/shape", start=0, end=1),
             helper.make_node("Shape", ["X"], ["width"], name="/emb/width", start=1, end=2),
             helper.make_node("Mod", ["width", "four"], ["rest"], name="/emb/mod"),
             helper.make_node("Sub", ["four", "rest"], ["to_multiple"], name="/emb/sub"),
             helper.make_node("Concat", ["dims", "four_zeros", "to_multiple"], ["six"], name="/emb/concat", axis=0),
             helper.make_node("Pad", ["X", "six"], ["Y"], name="/emb/pad")]
    inits = {"four": np.array([4], np.int64), "four_zeros": np.zeros(4, np.int64)}
    write("pad_dynamic", model("pad_dynamic", nodes, inits, ["Y0", 3, 5], 15, x_shape=("B", 3, 4)), x,
          np.pad(x, [(2, 0), (0, 0), (0, 1)]))


def traced_pad_nodes(torch_pads, rank):
    """F.pad's list (last axis first, (before, after) pairs) turned into ONNX's pads in the graph, the way the
    TorchScript exporter does it."""
    def const(name, value):
        return helper.make_node("Constant", [], [name], name=f"/emb/{name}",
                                value=numpy_helper.from_array(np.array(value, np.int64)))

    return [const("list", torch_pads), const("two", 2), const("rank", rank), const("first", [0]),
            helper.make_node("Shape", ["list"], ["list_len"], name="/emb/shape"),
            helper.make_node("Gather", ["list_len", "first"], ["n"], name="/emb/gather", axis=0),
            helper.make_node("Mul", ["rank", "two"], ["all"], name="/emb/mul"),
            helper.make_node("Sub", ["all", "n"], ["rest"], name="/emb/sub"),
            helper.make_node("ConstantOfShape", ["rest"], ["zeros"], name="/emb/zeros",
                             value=numpy_helper.from_array(np.zeros(1, np.int64))),
            helper.make_node("Concat", ["list", "zeros"], ["full"], name="/emb/concat", axis=0),
            const("pairs_shape", [-1, 2]),
            helper.make_node("Reshape", ["full", "pairs_shape"], ["pairs"], name="/emb/pairs"),
            const("start", [-1]), const("end", [-(2**63 - 1)]), const("axis", [0]), const("step", [-1]),
            helper.make_node("Slice", ["pairs", "start", "end", "axis", "step"], ["reversed"], name="/emb/reverse"),
            helper.make_node("Transpose", ["reversed"], ["columns"], name="/emb/transpose", perm=[1, 0]),
            const("flat", [-1]),
            helper.make_node("Reshape", ["columns", "flat"], ["flat_pads"], name="/emb/flatten"),
            helper.make_node("Cast", ["flat_pads"], ["pads"], name="/emb/cast", to=TensorProto.INT64),
            helper.make_node("Pad", ["X", "pads"], ["Y"], name="/emb/pad", mode="constant")]


if __name__ == "__main__":
    main()
