"""Shared by the tests/data/*/make_models.py scripts: writes a hand-built ONNX model with its arrays and numpy
reference output, and checks onnxruntime's output against that reference when onnxruntime is installed."""
import os

import numpy as np
import onnx


def write(folder, name, model, arrays, y, feeds, rtol=0.0, atol=0.0):
    """Saves <folder>/<name>.onnx, <name>.<key>.npy for each of `arrays` and <name>.Y.npy. With onnxruntime, runs the
    model on `feeds` and asserts its first output equals `y` within rtol/atol (exactly by default; bools always)."""
    onnx.save_model(model, os.path.join(folder, name + ".onnx"))
    for n, a in arrays.items():
        np.save(os.path.join(folder, f"{name}.{n}.npy"), a)
    np.save(os.path.join(folder, name + ".Y.npy"), y)
    try:
        import onnxruntime
    except ImportError:
        return
    got = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == y.shape, f"{name}: onnxruntime gives {got.shape}, the reference {y.shape}"
    if y.dtype == np.bool_:
        assert np.array_equal(got, y), name
        err = 0.0
    else:
        np.testing.assert_allclose(got, y, rtol=rtol, atol=atol, err_msg=name)
        err = float(np.abs(got.astype(np.float64) - y).max())
    print(f"{name}: onnxruntime equals numpy (max abs difference {err:.3g})")
