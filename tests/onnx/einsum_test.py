#!/usr/bin/python3
"""Einsum through `onnxpipe run` against numpy.einsum (the importer lowers it to Transpose/Unsqueeze/Mul/ReduceSum).

  /usr/bin/python3 tests/onnx/einsum_test.py --onnxpipe BUILD/tools/onnxpipe
Explicit and implicit equations with one and two operands (outer product, batched matmul, attention scores,
transpose, full and partial sums, broadcast-free contractions) in float32 and float64, ellipses (in explicit and
implicit outputs, their dims broadcast), and the refused forms (a repeated label within one operand, an explicit
output without the ellipsis's dims) failing with an error that names the node and the equation.
Prints `N passed, N failed`; exit 1 on any failure.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

CASES = [  # equation, operand shapes
    ("i,j->ij", [(5,), (3,)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ijk->ki", [(2, 3, 4)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("ij,jk", [(3, 4), (4, 2)]),  # implicit output: "ik"
    ("ba,ca->bc", [(3, 2), (4, 2)]),
    ("i,i", [(6,), (6,)]),  # implicit: inner product, scalar
    ("...qhd,...khd->...hqk", [(2, 5, 2, 4), (2, 6, 2, 4)]),  # LongT5's local attention scores
    ("...ij->...ji", [(2, 3, 4)]),
    ("...ij,...jk", [(2, 1, 3, 4), (2, 5, 4, 2)]),  # implicit "...ik"; the ellipses' dims broadcast
    ("i...->...", [(3, 2, 4)]),
    ("a...,b->...ab", [(3,), (2,)]),  # an ellipsis of no dims
]
REFUSED = [("ii->i", [(3, 3)], "repeats within one operand"),
           ("b...d,b...d->b", [(2, 3, 4), (2, 3, 4)], "leaves out the 1 dims of the ellipsis")]


def out_shape(equation, shapes):
    try:
        return list(np.einsum(equation, *[np.zeros(s) for s in shapes]).shape)
    except ValueError:  # numpy refuses it too (the refused forms below have 1-D outputs): onnxpipe must say why
        return ["n"]


def write_model(path, equation, shapes, elem):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], name="/blk/Einsum", equation=equation)
    graph = helper.make_graph([node], "einsum",
                              [helper.make_tensor_value_info(n, elem, s) for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("y", elem, out_shape(equation, shapes))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return names


def run(exe, model, inputs_dir, out_dir, dtype):
    return subprocess.run([exe, "run", model, "--inputs", inputs_dir, "--out", out_dir, "--dtype", dtype],
                          capture_output=True, text=True, timeout=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnxpipe", required=True)
    a = ap.parse_args()
    passed = failed = 0
    rng = np.random.default_rng(0)

    def report(ok, what):
        nonlocal passed, failed
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        passed, failed = passed + ok, failed + (not ok)

    with tempfile.TemporaryDirectory() as tmp:
        for k, (eq, shapes) in enumerate(CASES):
            for np_dtype, elem, dtype, tol in ((np.float32, TensorProto.FLOAT, "fp32", 1e-5),
                                               (np.float64, TensorProto.DOUBLE, "fp64", 1e-12)):
                case = os.path.join(tmp, f"c{k}_{dtype}")
                os.makedirs(os.path.join(case, "in"))
                names = write_model(os.path.join(case, "m.onnx"), eq, shapes, elem)
                xs = [rng.standard_normal(s).astype(np_dtype) for s in shapes]
                for n, x in zip(names, xs):
                    np.save(os.path.join(case, "in", n + ".npy"), x)
                p = run(a.onnxpipe, os.path.join(case, "m.onnx"), os.path.join(case, "in"),
                        os.path.join(case, "out"), dtype)
                if p.returncode != 0:
                    report(False, f"{eq} {dtype}: {p.stderr.strip()[-500:]}")
                    continue
                got = np.load(os.path.join(case, "out", "y.npy")).astype(np.float64)
                want = np.einsum(eq, *[x.astype(np.float64) for x in xs])
                ok = got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol)
                report(ok, f"{eq} {dtype}: shape {got.shape} vs numpy {want.shape}")
        for k, (eq, shapes, expect) in enumerate(REFUSED):
            case = os.path.join(tmp, f"r{k}")
            os.makedirs(os.path.join(case, "in"))
            names = write_model(os.path.join(case, "m.onnx"), eq, shapes, TensorProto.FLOAT)
            for n, s in zip(names, shapes):
                np.save(os.path.join(case, "in", n + ".npy"), np.zeros(s, np.float32))
            p = run(a.onnxpipe, os.path.join(case, "m.onnx"), os.path.join(case, "in"), os.path.join(case, "out"),
                    "fp32")
            ok = p.returncode != 0 and "/blk/Einsum" in p.stderr and expect in p.stderr and eq in p.stderr
            report(ok, f"{eq} refused naming the node and the equation: {p.stderr.strip()[-300:]}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
