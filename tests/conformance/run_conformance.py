#!/usr/bin/python3
"""ONNX backend node tests through `onnxpipe run`.

Selects every test under the libonnx-testdata node folder whose model uses only ops onnxpipe
imports, at the opsets onnxpipe accepts (13-23; older models are refused by design, with an error
that says so), runs each test_data_set_* through `onnxpipe run`, and compares every output with the
expected output_<i>.pb (numpy.testing tolerances of the ONNX backend runner: rtol 1e-3, atol 1e-7).
Known failures are listed, with reasons, in expected_failures.txt; the run fails on an unexpected
failure, on a listed test that now passes (the list must stay true), or when fewer than 90% of the
selected tests pass.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

SUPPORTED = {
    "Gather", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg",
    "Exp", "Log", "Erf", "Tanh", "Relu", "Sigmoid", "Softmax", "LogSoftmax", "LayerNormalization",
    "RMSNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "Transpose", "Reshape", "Flatten", "Squeeze",
    "Unsqueeze", "Concat", "Split", "Slice", "Shape", "Constant", "ConstantOfShape", "Cast",
    "Where", "Equal", "Less", "Greater", "Not", "And", "Mod", "Expand", "Identity", "Dropout",
    "Range", "Trilu", "SoftmaxCrossEntropyLoss", "Sin", "Cos", "Abs", "Min", "Max", "Einsum",
    "GreaterOrEqual", "LessOrEqual", "IsNaN", "CumSum", "GatherElements", "GatherND", "ArgMax", "Tile",
    "Sign", "Ceil", "Clip", "Pad", "Softplus", "Softsign", "Mish", "Elu", "Celu", "Selu", "LeakyRelu", "PRelu",
    "ThresholdedRelu", "HardSigmoid", "HardSwish", "Sum", "Mean", "Or", "Xor",
}


def load_expectations(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition(" ")
            out[name] = reason.strip()
    return out


def selected_tests(root):
    for name in sorted(os.listdir(root)):
        model_path = os.path.join(root, name, "model.onnx")
        if not os.path.exists(model_path):
            continue
        model = onnx.load(model_path)
        ops = {n.op_type for n in model.graph.node}
        domains = {n.domain for n in model.graph.node}
        opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
        if ops and ops <= SUPPORTED and domains <= {"", "ai.onnx"} and opset >= 13:
            yield name, model


def run_one(onnxpipe, test_dir, model):
    outputs = [o.name for o in model.graph.output]
    for data_set in sorted(d for d in os.listdir(test_dir) if d.startswith("test_data_set_")):
        ds = os.path.join(test_dir, data_set)
        with tempfile.TemporaryDirectory() as out:
            proc = subprocess.run([onnxpipe, "run", os.path.join(test_dir, "model.onnx"),
                                   "--inputs", ds, "--out", out],
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                return "onnxpipe run failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
            for i, name in enumerate(outputs):
                expected_pb = os.path.join(ds, f"output_{i}.pb")
                if not os.path.exists(expected_pb):
                    continue
                t = onnx.TensorProto()
                with open(expected_pb, "rb") as f:
                    t.ParseFromString(f.read())
                expected = numpy_helper.to_array(t)
                fname = name.replace("/", "_").replace("\\", "_").replace(":", "_") + ".npy"
                got_path = os.path.join(out, fname)
                if not os.path.exists(got_path):
                    return f"output '{name}' not written"
                got = np.load(got_path)
                if got.shape != expected.shape:
                    return f"output '{name}' shape {got.shape}, expected {expected.shape}"
                if expected.dtype.kind in "fc":
                    if got.dtype != expected.dtype:
                        return f"output '{name}' dtype {got.dtype}, expected {expected.dtype}"
                    try:
                        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-7)
                    except AssertionError as e:
                        return f"output '{name}' differs: " + str(e).strip().splitlines()[-1]
                elif not np.array_equal(got.astype(expected.dtype), expected):
                    return f"output '{name}' differs (exact compare, dtype {expected.dtype})"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnxpipe", required=True)
    ap.add_argument("--root", default="/usr/include/onnx/backend/test/data/node")
    ap.add_argument("--expectations", default=os.path.join(os.path.dirname(__file__), "expected_failures.txt"))
    ap.add_argument("--filter", default="", help="only tests whose name contains this")
    args = ap.parse_args()
    if not os.path.isdir(args.root):
        print(f"conformance: {args.root} missing (install libonnx-testdata)", file=sys.stderr)
        return 1
    expected = load_expectations(args.expectations)
    passed, failed, unexpected, stale = [], [], [], []
    for name, model in selected_tests(args.root):
        if args.filter and args.filter not in name:
            continue
        err = run_one(args.onnxpipe, os.path.join(args.root, name), model)
        if err is None:
            passed.append(name)
            if name in expected:
                stale.append(name)
        else:
            failed.append((name, err))
            if name not in expected:
                unexpected.append((name, err))
    total = len(passed) + len(failed)
    for name, err in failed:
        tag = "expected" if name in expected else "UNEXPECTED"
        print(f"FAIL ({tag}) {name}: {err}")
    for name in stale:
        print(f"STALE {name}: passes now; remove it from {os.path.basename(args.expectations)}")
    ratio = len(passed) / total if total else 0.0
    print(f"conformance: {len(passed)}/{total} passed ({100 * ratio:.1f}%), "
          f"{len(failed) - len(unexpected)} expected failures, {len(unexpected)} unexpected")
    if unexpected or stale or (not args.filter and ratio < 0.9) or total == 0:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
