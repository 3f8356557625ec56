#!/usr/bin/env python3
"""Writes the ONNX activation and logic models that tests/autodiff/onnx_activation_test.cc imports, with numpy
references computed from the operator specification's formulas (float64, rounded to float32):

  <op>.onnx     Y = <op>(X, ...) for Softplus, Softsign, Elu, Celu, Selu, LeakyRelu, ThresholdedRelu, HardSigmoid,
                HardSwish (opset 17), Mish (opset 18), PRelu (slope an initializer, broadcast over X), Sum and Mean
                (X and two initializers, one broadcast); X (2, 3, 4) float32 with values from -100 to 100, none within
                0.01 of a kink, so that central differences apply everywhere
  or.onnx, xor.onnx   bool A (2, 3, 4) with bool B (3, 4) broadcast
Inputs and references: <model>.<input>.npy, <model>.Y.npy. onnxruntime, when installed, is checked against the
references:
  VENV/bin/python tests/data/onnx_activations/make_models.py
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import reference_models  # noqa: E402
SHAPE = (2, 3, 4)


def softplus(x):
    return np.logaddexp(0.0, x)


def hard_sigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0.0, 1.0)


# op -> (attributes, reference of float64 x); attributes as the node gets them (absent ones take the defaults)
UNARY = {
    "Softplus": ({}, softplus, 17),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x)), 17),
    "Mish": ({}, lambda x: x * np.tanh(softplus(x)), 18),
    "Elu": ({"alpha": 0.7}, lambda x: np.where(x < 0, 0.7 * np.expm1(np.minimum(x, 0)), x), 17),
    "Celu": ({"alpha": 2.0}, lambda x: np.maximum(x, 0) + np.minimum(0, 2.0 * np.expm1(np.minimum(x, 0) / 2.0)), 17),
    "Selu": ({}, lambda x: np.float32(1.05070102214813232421875) * np.where(
        x > 0, x, np.float32(1.67326319217681884765625) * np.expm1(np.minimum(x, 0))), 17),
    "LeakyRelu": ({"alpha": 0.1}, lambda x: np.where(x >= 0, x, 0.1 * x), 17),
    "ThresholdedRelu": ({"alpha": 0.5}, lambda x: np.where(x > 0.5, x, 0.0), 17),
    "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda x: hard_sigmoid(x, 0.3, 0.4), 17),
    "HardSwish": ({}, lambda x: x * hard_sigmoid(x, 1 / 6, 0.5), 17),
}


def away_from_kinks(rng, shape):
    """Values over [-60, 60] with every one at least 0.01 from the ops' kinks (0, 0.5, and HardSigmoid's and
    HardSwish's corners -4/3, 2, -3, 3)."""
    kinks = np.array([0.0, 0.5, -4 / 3, 2.0, -3.0, 3.0])
    x = rng.uniform(-4, 4, size=int(np.prod(shape)))
    x[:4] = [-100.0, 100.0, -25.0, 25.0]  # exp(100) overflows float32: a lowering must not take exp of |x|
    for i in range(x.size):
        while np.min(np.abs(kinks - x[i])) < 0.01:
            x[i] += 0.02
    return x.reshape(shape).astype(np.float32)


def tensor_info(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def save(name, nodes, inputs, initializers, y_dtype, opset, feeds, y):
    graph = helper.make_graph(nodes, name, [tensor_info(n, d, a.shape) for n, d, a in inputs],
                              [tensor_info("Y", y_dtype, y.shape)],
                              initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxpipe-tests",
                              ir_version=9)
    reference_models.write(HERE, name, model, {**feeds, **initializers}, y, feeds, rtol=2e-6, atol=1e-6)


def main():
    rng = np.random.default_rng(5)
    x = away_from_kinks(rng, SHAPE)
    for op, (attrs, ref, opset) in UNARY.items():
        node = helper.make_node(op, ["X"], ["Y"], name=f"/act/{op}", **attrs)
        y = ref(x.astype(np.float64)).astype(np.float32)
        save(op.lower(), [node], [("X", TensorProto.FLOAT, x)], {}, TensorProto.FLOAT, opset, {"X": x}, y)
    slope = rng.uniform(0.05, 0.5, size=(3, 1)).astype(np.float32)
    node = helper.make_node("PRelu", ["X", "slope"], ["Y"], name="/act/PRelu")
    y = np.where(x >= 0, x, slope.astype(np.float64) * x).astype(np.float32)
    save("prelu", [node], [("X", TensorProto.FLOAT, x)], {"slope": slope}, TensorProto.FLOAT, 17, {"X": x}, y)
    a = rng.normal(size=SHAPE).astype(np.float32)
    b = rng.normal(size=(3, 4)).astype(np.float32)
    for op in ("Sum", "Mean"):
        node = helper.make_node(op, ["X", "A", "B"], ["Y"], name=f"/act/{op}")
        total = x.astype(np.float64) + a + b
        y = (total / 3 if op == "Mean" else total).astype(np.float32)
        save(op.lower(), [node], [("X", TensorProto.FLOAT, x)], {"A": a, "B": b}, TensorProto.FLOAT, 17, {"X": x}, y)
    p = rng.random(SHAPE) < 0.5
    q = rng.random((3, 4)) < 0.5
    for op, ref in (("Or", np.logical_or), ("Xor", np.logical_xor)):
        node = helper.make_node(op, ["X", "B"], ["Y"], name=f"/act/{op}")
        save(op.lower(), [node], [("X", TensorProto.BOOL, p), ("B", TensorProto.BOOL, q)], {}, TensorProto.BOOL, 17,
             {"X": p, "B": q}, ref(p, q))


if __name__ == "__main__":
    main()
