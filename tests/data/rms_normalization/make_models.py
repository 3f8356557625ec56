#!/usr/bin/env python3
"""Writes the ONNX RMSNormalization (ai.onnx opset 23) models that tests/autodiff/rms_normalization_test.cc
imports, with numpy references of their outputs (the formula of the ONNX specification, in float64):

  y = x / sqrt(mean(x^2 over the axes [axis, rank)) + epsilon) * scale

  last_axis_f64.onnx   X (2, 3, 8) float64, scale (8,) initializer, axis -1, epsilon 1e-3, stash_type 11 (double)
  two_axes_f32.onnx    X (2, 3, 4) float32, scale (3, 4) initializer, axis 1, epsilon and stash_type left to their
                       defaults (1e-5, float)
  bad_axis.onnx        axis 3 for a rank-3 X (malformed)
  bad_stash_type.onnx  stash_type 7 (int64: not a float type; malformed)
  opset22.onnx         the node in a model that imports ai.onnx opset 22 (RMSNormalization does not exist there)
Inputs and references: <model>.X.npy and <model>.Y.npy. Needs onnx >= 1.18 (knows opset 23) and numpy:
  VENV/bin/python tests/data/rms_normalization/make_models.py
The models are committed; the tests need neither. When onnxruntime is installed, the script also checks that it
agrees with the numpy references (a second, independent implementation).
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def reference(x, scale, axis, epsilon):
    x = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    # epsilon is a FLOAT attribute: the model holds it rounded to float32.
    r = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + float(np.float32(epsilon)))
    return x * r * scale.astype(np.float64)


def model(name, x_dtype, x_shape, scale, attrs, opset=23):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_dtype))
    node = helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], name="/norm/RMSNormalization", **attrs)
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("X", elem, x_shape)],
                              [helper.make_tensor_value_info("Y", elem, x_shape)],
                              initializer=[numpy_helper.from_array(scale, "scale")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxpipe-tests",
                          ir_version=10)
    return m


def save(m, name):
    onnx.save_model(m, os.path.join(HERE, name + ".onnx"))


def main():
    rng = np.random.default_rng(23)
    cases = [
        ("last_axis_f64", np.float64, (2, 3, 8), rng.uniform(0.5, 1.5, (8,)), dict(axis=-1, epsilon=1e-3, stash_type=11),
         -1, 1e-3),
        ("two_axes_f32", np.float32, (2, 3, 4), rng.uniform(0.5, 1.5, (3, 4)), dict(axis=1), 1, 1e-5),
    ]
    for name, dtype, shape, scale, attrs, axis, eps in cases:
        scale = scale.astype(dtype)
        m = model(name, dtype, list(shape), scale, attrs)
        onnx.checker.check_model(m, full_check=True)
        save(m, name)
        x = rng.uniform(-2, 2, shape).astype(dtype)
        y = reference(x, scale, axis, eps)
        np.save(os.path.join(HERE, name + ".X.npy"), x)
        np.save(os.path.join(HERE, name + ".Y.npy"), y)
        try:
            import onnxruntime
        except ImportError:
            continue
        got = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"X": x})[0]
        err = float(np.abs(got.astype(np.float64) - y).max())
        print(f"{name}: onnxruntime against numpy max abs error {err:.3g}")
        assert err < (1e-12 if dtype == np.float64 else 1e-5), err
    scale = np.ones((8,), np.float32)
    save(model("bad_axis", np.float32, [2, 3, 8], scale, dict(axis=3)), "bad_axis")
    save(model("bad_stash_type", np.float32, [2, 3, 8], scale, dict(stash_type=7)), "bad_stash_type")
    save(model("opset22", np.float32, [2, 3, 8], scale, {}, opset=22), "opset22")


if __name__ == "__main__":
    main()
