#!/usr/bin/python3
"""The stage files of a fused graph against the export itself, both in onnxruntime (an independent runtime):

  1. `onnxpipe inspect` at batch 2, seq 12 fuses the ops named by --expect-fused (e.g. Rotary: the rotary fusion
     fired on the export);
  2. `onnxpipe partition --stages 2` writes stage_0.onnx and stage_1.onnx, where the fused ops are written back as
     standard ONNX (Rotary as the exporters' arithmetic, GatedActivation as Mul(gate, Sigmoid(gate)) * up or the
     GELU's arithmetic times up: some stage must hold that activation when GatedActivation is expected);
  3. onnxruntime runs each stage on the first two training rows, a later stage's inputs being onnxruntime's values
     of the same names in the export (exposed as extra outputs): stage 0's outputs, and the export's outputs that
     the last stage computes before its loss (the logits), equal the export's values within 1e-5 of their largest
     magnitude.

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

BATCH, SEQ, TOL, STAGES = 2, 12, 1e-5, 2


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
        run([a.onnxpipe, "partition", model, "--stages", str(STAGES), "--batch", str(BATCH), "--seq", str(SEQ),
             "--device", "cpu", "--out", tmp])
        stages = [onnx.load(os.path.join(tmp, f"stage_{k}.onnx")) for k in range(STAGES)]
    stage_ops = {n.op_type for st in stages for n in st.graph.node}
    if "GatedActivation" in a.expect_fused and not stage_ops & {"Sigmoid", "Tanh", "Erf"}:
        fail(f"no stage holds the gated activation written back (Sigmoid, Tanh or Erf): {sorted(stage_ops)}")
    export = onnx.load(model)
    export_values = {o for n in export.graph.node for o in n.output} | {o.name for o in export.graph.output}
    export_inputs = {i.name for i in export.graph.input}

    def train_data(name):
        return np.load(os.path.join(a.model_dir, "train", name + ".npy"))[:BATCH]

    # What each stage is checked on: its outputs that the export computes too (stage 0: the values crossing the
    # cut), and the export's outputs it computes inside (the last stage: the logits before the loss).
    checked = []
    for st in stages:
        made = {o for n in st.graph.node for o in n.output}
        names = [o.name for o in st.graph.output if o.name in export_values]
        names += [o.name for o in export.graph.output if o.name in made and o.name not in names]
        checked.append(names)
    # The export's values of every checked name and of every stage input the export computes (the others, the
    # export's inputs and the loss's labels, come from the training data).
    needed = sorted({n for names in checked for n in names} |
                    {i.name for st in stages for i in st.graph.input if i.name in export_values})
    for n in needed:
        if n not in {o.name for o in export.graph.output}:
            export.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    export_feeds = {n: train_data(n) for n in export_inputs}
    want = dict(zip(needed, ort.InferenceSession(export.SerializeToString(),
                                                 providers=["CPUExecutionProvider"]).run(needed, export_feeds)))
    total = 0
    for k, (st, names) in enumerate(zip(stages, checked)):
        if not names:
            fail(f"stage {k} computes nothing the export computes")
        outputs = {o.name for o in st.graph.output}
        for n in names:
            if n not in outputs:
                st.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
        feeds = {i.name: want[i.name] if i.name in want else train_data(i.name) for i in st.graph.input}
        got = ort.InferenceSession(st.SerializeToString(), providers=["CPUExecutionProvider"]).run(names, feeds)
        for n, g in zip(names, got):
            w = want[n]
            if g.shape != w.shape or g.dtype != w.dtype:
                fail(f"{n}: stage {k} {g.dtype}{g.shape}, export {w.dtype}{w.shape}")
            if g.dtype == np.bool_ or np.issubdtype(g.dtype, np.integer):
                ok, err = bool((g == w).all()), 0.0
            else:
                err = float(np.max(np.abs(g.astype(np.float64) - w)) / max(1e-30, float(np.max(np.abs(w)))))
                ok = err <= TOL
            if not ok:
                fail(f"{n}: stage {k} differs from the export by {err} (relative to its largest value)")
            print(f"PASS stage {k} {n} {g.dtype}{g.shape}: {err:.3g}")
            total += 1
    print(f"{total} passed, 0 failed")

if __name__ == "__main__":
    main()
