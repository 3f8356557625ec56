#!/usr/bin/python3
"""The stage files of a fused graph against the export itself, both in onnxruntime (an independent runtime):

  1. `onnxpipe inspect` at batch 2, seq 12 fuses the ops named by --expect-fused (e.g. Rotary: the rotary fusion
     fired on the export);
  2. `onnxpipe partition --stages 2` writes stage_0.onnx, where the fused ops are written back as standard ONNX
     (Rotary as the exporters' arithmetic, GatedActivation as Mul(gate, Sigmoid(gate)) * up or the GELU's
     arithmetic times up: stage 0 must hold that activation when GatedActivation is expected);
  3. onnxruntime's values of stage 0's outputs on the first two training rows equal onnxruntime's values of the
     same names in the export (exposed as extra outputs), within 1e-5 of their largest magnitude.

  .build/venv/bin/python3 tests/conformance/stage_ort_test.py --onnxpipe BUILD/tools/onnxpipe --expect-fused Rotary \\
      models/hf/llama_ts17_eager_dyn
Exits non-zero with a message on the first failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

BATCH, SEQ, TOL = 2, 12, 1e-5


def fail(msg):
    print("stage_ort_test: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onnxpipe", required=True)
    ap.add_argument("--expect-fused", action="append", default=[])
    ap.add_argument("model_dir")
    a = ap.parse_args()
    model = os.path.join(a.model_dir, "model.onnx")
    hist = json.loads(run([a.onnxpipe, "inspect", model, "--json", "--batch", str(BATCH), "--seq", str(SEQ)]))[
        "fused_op_histogram"]
    for op in a.expect_fused:
        if hist.get(op, 0) == 0:
            fail(f"no {op} in the fused graph: {hist}")
    with tempfile.TemporaryDirectory() as tmp:
        run([a.onnxpipe, "partition", model, "--stages", "2", "--batch", str(BATCH), "--seq", str(SEQ), "--device",
             "cpu", "--out", tmp])
        stage = onnx.load(os.path.join(tmp, "stage_0.onnx"))
    stage_ops = {n.op_type for n in stage.graph.node}
    if "GatedActivation" in a.expect_fused and not stage_ops & {"Sigmoid", "Tanh", "Erf"}:
        fail(f"stage 0 holds no gated activation written back (Sigmoid, Tanh or Erf): {sorted(stage_ops)}")
    names = [o.name for o in stage.graph.output]
    feeds = {i.name: np.load(os.path.join(a.model_dir, "train", i.name + ".npy"))[:BATCH] for i in stage.graph.input}
    got = ort.InferenceSession(stage.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    export = onnx.load(model)
    for n in names:
        export.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    export_feeds = {i.name: np.load(os.path.join(a.model_dir, "train", i.name + ".npy"))[:BATCH]
                    for i in export.graph.input}
    want = ort.InferenceSession(export.SerializeToString(), providers=["CPUExecutionProvider"]).run(names, export_feeds)
    for n, g, w in zip(names, got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            fail(f"{n}: stage {g.dtype}{g.shape}, export {w.dtype}{w.shape}")
        if g.dtype == np.bool_ or np.issubdtype(g.dtype, np.integer):
            ok, err = bool((g == w).all()), 0.0
        else:
            err = float(np.max(np.abs(g.astype(np.float64) - w)) / max(1e-30, float(np.max(np.abs(w)))))
            ok = err <= TOL
        if not ok:
            fail(f"{n}: stage 0 differs from the export by {err} (relative to its largest value)")
        print(f"PASS {n} {g.dtype}{g.shape}: {err:.3g}")
    print(f"{len(names)} passed, 0 failed")


if __name__ == "__main__":
    main()
