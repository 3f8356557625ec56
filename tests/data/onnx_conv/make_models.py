#!/usr/bin/env python3
"""Writes the ONNX Conv models that tests/autodiff/onnx_conv_test.cc imports, with numpy references of the
specification's sum over each window (float64 loops, rounded to float32):

  patch2d.onnx   X (2, 3, 8, 12), W (5, 3, 4, 4), B (5), strides 4: a ViT patch embedding, Y (2, 5, 2, 3)
  trim2d.onnx    X (2, 3, 9, 10), W (4, 3, 4, 4), no B, strides 4: the last rows and columns fall outside every window
  point1d.onnx   X (2, 6, 7), W (3, 6, 1), B (3): a kernel-1 conv (strides 1)
  patch3d.onnx   X (1, 2, 4, 4, 6), W (3, 2, 2, 2, 3), B (3), strides (2, 2, 3)
  batch2d.onnx   patch2d with a symbolic batch dim
  avgpool2d.onnx AveragePool of X (2, 3, 8, 12), kernel and strides (4, 4): Y (2, 3, 2, 3)
  maxpool1d.onnx MaxPool of X (2, 3, 10), kernel and strides 3 (the last element outside every window): Y (2, 3, 3)
  overlap.onnx, groups.onnx, overlap_pool.onnx: refused by onnxpipe (a 3 x 3 kernel at stride 1 with padding; two
                 groups; a MaxPool of kernel 3 at stride 1)
W and B are initializers. Inputs and references: <model>.<name>.npy, <model>.Y.npy. onnxruntime, when installed, is
checked against the references:
  VENV/bin/python tests/data/onnx_conv/make_models.py
"""
import itertools
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import reference_models  # noqa: E402


def conv(x, w, b, strides):
    """The specification's Conv without padding, dilation or groups, in float64."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    k = w.shape[2:]
    out = [(x.shape[2 + i] - k[i]) // strides[i] + 1 for i in range(len(k))]
    y = np.zeros((x.shape[0], w.shape[0], *out))
    for pos in itertools.product(*[range(o) for o in out]):
        window = tuple(slice(p * s, p * s + kk) for p, s, kk in zip(pos, strides, k))
        patch = x[(slice(None), slice(None), *window)]  # (B, C, k...)
        y[(slice(None), slice(None), *pos)] = np.tensordot(patch, w, axes=(list(range(1, patch.ndim)),
                                                                           list(range(1, w.ndim))))
    if b is not None:
        y += b.reshape(1, -1, *([1] * len(k)))
    return y.astype(np.float32)


def model(name, x_shape, y_shape, initializers, attrs, with_bias=True):
    inputs = ["X", "W"] + (["B"] if with_bias else [])
    node = helper.make_node("Conv", inputs, ["Y"], name="/embed/patch", **attrs)
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(y_shape))],
                              initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpipe-tests",
                             ir_version=9)


def main():
    rng = np.random.default_rng(3)
    f32 = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    cases = [("patch2d", (2, 3, 8, 12), (5, 3, 4, 4), True, (4, 4)),
             ("trim2d", (2, 3, 9, 10), (4, 3, 4, 4), False, (4, 4)),
             ("point1d", (2, 6, 7), (3, 6, 1), True, (1,)),
             ("patch3d", (1, 2, 4, 4, 6), (3, 2, 2, 2, 3), True, (2, 2, 3))]
    for name, xs, ws, bias, strides in cases:
        x, w = f32(*xs), f32(*ws)
        b = f32(ws[0]) if bias else None
        y = conv(x, w, b, strides)
        inits = {"W": w, **({"B": b} if bias else {})}
        attrs = dict(kernel_shape=list(ws[2:]), strides=list(strides))
        reference_models.write(HERE, name, model(name, xs, y.shape, inits, attrs, bias), {"X": x}, y, {"X": x},
                               rtol=1e-5, atol=1e-5)
        if name == "patch2d":
            reference_models.write(HERE, "batch2d", model("batch2d", ("B", *xs[1:]), ("B", *y.shape[1:]), inits, attrs),
                                   {"X": x}, y, {"X": x}, rtol=1e-5, atol=1e-5)
    for name, op, xs, k, reduce in (("avgpool2d", "AveragePool", (2, 3, 8, 12), (4, 4), np.mean),
                                     ("maxpool1d", "MaxPool", (2, 3, 10), (3,), np.max)):
        x = f32(*xs)
        windows = [d // kk for d, kk in zip(xs[2:], k)]
        trimmed = x[(slice(None), slice(None), *[slice(0, o * kk) for o, kk in zip(windows, k)])]
        split = trimmed.astype(np.float64).reshape(xs[0], xs[1], *[v for o, kk in zip(windows, k) for v in (o, kk)])
        y = reduce(split, axis=tuple(3 + 2 * i for i in range(len(k)))).astype(np.float32)
        node = helper.make_node(op, ["X"], ["Y"], name="/embed/patch", kernel_shape=list(k), strides=list(k))
        graph = helper.make_graph([node], name, [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(xs))],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(y.shape))])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpipe-tests",
                              ir_version=9)
        reference_models.write(HERE, name, m, {"X": x}, y, {"X": x}, rtol=1e-6, atol=1e-6)
    node = helper.make_node("MaxPool", ["X"], ["Y"], name="/embed/patch", kernel_shape=[3], strides=[1])
    graph = helper.make_graph([node], "overlap_pool", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 9])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, 7])])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
                    os.path.join(HERE, "overlap_pool.onnx"))
    w = f32(4, 3, 3, 3)
    overlap = model("overlap", (2, 3, 8, 8), (2, 4, 8, 8), {"W": w, "B": f32(4)},
                    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]))
    groups = model("groups", (2, 4, 8, 8), (2, 4, 4, 4), {"W": f32(4, 2, 2, 2), "B": f32(4)},
                   dict(kernel_shape=[2, 2], strides=[2, 2], group=2))
    onnx.save_model(overlap, os.path.join(HERE, "overlap.onnx"))
    onnx.save_model(groups, os.path.join(HERE, "groups.onnx"))


if __name__ == "__main__":
    main()
