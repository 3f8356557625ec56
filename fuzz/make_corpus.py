#!/usr/bin/python3
"""Regenerates the seed corpus of onnx_loader_fuzzer: fuzz/corpus/onnx_loader/.

  valid_<name>.onnx   well-formed models (tests/onnx replays them and requires them to load)
  bad_<name>.onnx     models with one defect each (errors the loader must report)
  trunc_<name>_<n>    prefixes of valid models
  random_<n>          random bytes
  found_<sha1>        inputs that reached new code while fuzzing (libFuzzer -merge=1), kept
  crash_<name>        inputs that crashed the loader once (regressions), kept
usage: fuzz/make_corpus.py   (run from anywhere; rewrites the generated part of the folder)
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "onnx"))
import make_test_models as tm  # noqa: E402

OUT = os.path.join(HERE, "corpus", "onnx_loader")


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if not f.startswith(("crash_", "found_")):  # what fuzzing found stays
            os.remove(os.path.join(OUT, f))
    valid = {}
    valid.update(tm.op_models())
    valid.update(tm.opset_variant_models())
    valid.update(tm.misc_models())
    for name, m in valid.items():
        write(f"valid_{name}.onnx", m.SerializeToString())
    for name, m in tm.bad_models().items():
        write(f"bad_{name}.onnx", m.SerializeToString())
    rng = np.random.default_rng(20240501)
    for name in ["Gemm", "Dropout", "Split_uneven_op18", "dtypes", "Constant"]:
        data = valid[name].SerializeToString()
        for n in sorted({1, len(data) // 3, len(data) // 2, len(data) - 1}):
            write(f"trunc_{name}_{n}", data[:n])
    for i, n in enumerate([0, 1, 16, 256, 4096]):
        write(f"random_{i}", rng.integers(0, 256, n, dtype=np.uint8).tobytes())


if __name__ == "__main__":
    main()
