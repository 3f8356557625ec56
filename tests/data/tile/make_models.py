#!/usr/bin/env python3
"""Writes the ONNX Tile models that tests/autodiff/tile_test.cc imports (the importer lowers Tile to
Reshape/Expand/Reshape), with numpy.tile references of their outputs:

  const_f64.onnx    X (2, 3) float64, repeats the initializer [3, 2] -> Y (6, 6)
  dynamic_f32.onnx  X (2, 1, 3) float32 and R (4,) float32; repeats = Concat(Shape(R), [1, 2]) = [4, 1, 2], computed in
                    the graph as GPT-J's TorchScript export computes its repeat_interleave counts -> Y (8, 1, 6)
Inputs and references: <model>.X.npy (and .R.npy) and <model>.Y.npy. Needs onnx and numpy:
  VENV/bin/python tests/data/tile/make_models.py
The models are committed; the tests need neither. When onnxruntime is installed, the script also checks that it
agrees with the numpy references (a second, independent implementation).
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def save(name, nodes, inputs, y_shape, elem, initializers, feeds, y):
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info("Y", elem, y_shape)],
                              initializer=initializers)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpipe-tests",
                          ir_version=8)
    onnx.checker.check_model(m)
    onnx.save_model(m, os.path.join(HERE, name + ".onnx"))
    for k, v in feeds.items():
        np.save(os.path.join(HERE, f"{name}.{k}.npy"), v)
    np.save(os.path.join(HERE, f"{name}.Y.npy"), y)
    try:
        import onnxruntime as ort
    except ImportError:
        return
    got = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    assert np.array_equal(got, y), name


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3))
    save("const_f64", [helper.make_node("Tile", ["X", "repeats"], ["Y"], name="/blk/Tile")],
         [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [2, 3])], [6, 6], TensorProto.DOUBLE,
         [numpy_helper.from_array(np.array([3, 2], np.int64), "repeats")], {"X": x}, np.tile(x, (3, 2)))
    x = rng.standard_normal((2, 1, 3)).astype(np.float32)
    r = rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Shape", ["R"], ["r_len"], name="/blk/Shape"),
             helper.make_node("Concat", ["r_len", "tail"], ["repeats"], name="/blk/Concat", axis=0),
             helper.make_node("Tile", ["X", "repeats"], ["Y"], name="/blk/Tile")]
    save("dynamic_f32", nodes,
         [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 1, 3]),
          helper.make_tensor_value_info("R", TensorProto.FLOAT, [4])], [8, 1, 6], TensorProto.FLOAT,
         [numpy_helper.from_array(np.array([1, 2], np.int64), "tail")], {"X": x, "R": r}, np.tile(x, (4, 1, 2)))


if __name__ == "__main__":
    main()
