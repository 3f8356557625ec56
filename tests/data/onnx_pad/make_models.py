#!/usr/bin/env python3
"""Writes the ONNX Pad models that tests/autodiff/onnx_pad_test.cc imports, with numpy references (np.pad, constant
mode, which is the specification's definition):

  pad_axes.onnx      X (2, 3, 4), opset 18, pads [1, 0, 2, 3] on axes [1, -1], constant_value 2.5
  pad_all.onnx       X (2, 3, 4), opset 13, pads [0, 2, 0, 1, 0, 1] on every axis, zeros
  pad_reflect.onnx, pad_negative.onnx, pad_computed.onnx: refused by onnxpipe (reflect mode, a crop, pads computed
                     in the graph from Shape(X))
Float32 models; inputs and references: <model>.X.npy and <model>.Y.npy. onnxruntime, when installed, is checked
against the references:
  VENV/bin/python tests/data/onnx_pad/make_models.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def model(name, nodes, initializers, y_shape, opset):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)],
                              initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxpipe-tests",
                             ir_version=9)


def write(name, m, x, y):
    onnx.save_model(m, os.path.join(HERE, name + ".onnx"))
    np.save(os.path.join(HERE, name + ".X.npy"), x)
    np.save(os.path.join(HERE, name + ".Y.npy"), y)
    try:
        import onnxruntime
    except ImportError:
        return
    got = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    assert got.shape == y.shape and np.array_equal(got, y), name
    print(f"{name}: onnxruntime equals numpy")


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
    nodes = [helper.make_node("Shape", ["X"], ["dims"], name="/emb/shape"),
             helper.make_node("Concat", ["dims", "dims"], ["six"], name="/emb/concat", axis=0),
             helper.make_node("Sub", ["six", "six"], ["zeros"], name="/emb/sub"),
             helper.make_node("Pad", ["X", "zeros"], ["Y"], name="/emb/pad")]
    onnx.save_model(model("pad_computed", nodes, {}, [2, 3, 4], 13), os.path.join(HERE, "pad_computed.onnx"))


if __name__ == "__main__":
    main()
