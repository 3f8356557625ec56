"""Independent check of `onnxpipe train --save/--eval` with onnxruntime (PyPI; scripts/setup.sh installs it).

  1. The saved model loads in onnxruntime (external data included) and keeps the source model's dtypes, with
     trained (changed) parameter values.
  2. onnxruntime's logits on the test split equal `onnxpipe run`'s on the saved model (fp32 tolerance).
  3. Accuracy and mean cross-entropy computed here by hand from onnxruntime's logits equal the
     {"split": "test", ...} line `--eval` appended to the metrics file.
The test texts are space-separated words, encoded here through the saved vocabulary (unknown -> 1, pad 0).
Exits non-zero with a message on the first mismatch.
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
from onnx import numpy_helper


def fail(msg):
    print("ort_check: " + msg, file=sys.stderr)
    sys.exit(1)


def encode(tsv, vocab_path, seq):
    ids = {t: i for i, t in enumerate(open(vocab_path, encoding="utf-8").read().split("\n")[:-1])}
    rows, labels = [], []
    for line in open(tsv, encoding="utf-8"):
        label, text = line.rstrip("\n").split("\t", 1)
        words = text.split(" ")[:seq]
        rows.append([ids.get(w, 1) for w in words] + [0] * (seq - len(words)))
        labels.append(int(label))
    return np.array(rows, dtype=np.int64), np.array(labels, dtype=np.int64)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    for a in ("--onnxpipe", "--model", "--saved", "--vocab", "--tsv"):
        p.add_argument(a, required=True)
    p.add_argument("--metrics", default="")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--mask-input", default="")
    p.add_argument("--expect-external", action="store_true")
    p.add_argument("--no-eval", action="store_true", help="the run had no --eval: skip step 3")
    a = p.parse_args()

    src = onnx.load(a.model)
    saved = onnx.load(a.saved)  # reads external data from beside the file
    if a.expect_external:
        if not os.path.exists(a.saved + ".data"):
            fail(f"no external data file {a.saved}.data")
        if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.load(a.saved, load_external_data=False).graph.initializer):
            fail("no initializer is stored as external data")
    src_init = {t.name: t for t in src.graph.initializer}
    changed = 0
    for t in saved.graph.initializer:
        if t.name not in src_init:
            fail(f"initializer {t.name} is not in the source model")
        if t.data_type != src_init[t.name].data_type or list(t.dims) != list(src_init[t.name].dims):
            fail(f"initializer {t.name}: dtype/dims {t.data_type} {list(t.dims)} differ from the source's")
        changed += int(not np.array_equal(numpy_helper.to_array(t), numpy_helper.to_array(src_init[t.name])))
    if changed == 0:
        fail("no initializer changed: the saved model holds no trained values")

    tokens, labels = encode(a.tsv, a.vocab, a.seq)
    feeds = {"tokens": tokens}
    sess = ort.InferenceSession(a.saved, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    feeds = {names[0]: tokens}
    if a.mask_input:
        feeds[a.mask_input] = (tokens != 0).astype(np.int64)
    z_ort = sess.run(None, feeds)[0].astype(np.float64)

    with tempfile.TemporaryDirectory() as work:
        os.makedirs(os.path.join(work, "in"))
        for name, value in feeds.items():
            np.save(os.path.join(work, "in", name + ".npy"), value)
        out_name = sess.get_outputs()[0].name
        r = subprocess.run([a.onnxpipe, "run", a.saved, "--inputs", os.path.join(work, "in"), "--out",
                            os.path.join(work, "out")], capture_output=True, text=True)
        if r.returncode != 0:
            fail("onnxpipe run failed: " + r.stderr)
        z_ours = np.load(os.path.join(work, "out", out_name + ".npy")).astype(np.float64)
    if z_ours.shape != z_ort.shape:
        fail(f"logits shapes differ: onnxpipe {z_ours.shape}, onnxruntime {z_ort.shape}")
    diff = np.abs(z_ours - z_ort).max()
    if not np.allclose(z_ours, z_ort, rtol=1e-4, atol=1e-5):
        fail(f"onnxpipe run and onnxruntime logits differ by up to {diff}")

    # Hand-written reference metrics over the logits.
    pred = z_ort.argmax(axis=1)
    accuracy = float((pred == labels).mean())
    zmax = z_ort.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z_ort - zmax).sum(axis=1)) + zmax[:, 0]
    loss = float((lse - z_ort[np.arange(len(labels)), labels]).mean())
    if a.no_eval:
        print(json.dumps({"rows": len(labels), "accuracy": accuracy, "loss": loss, "max_logit_diff": diff,
                          "changed_initializers": changed}))
        return
    evals = [json.loads(l) for l in open(a.metrics) if '"split"' in l]
    if len(evals) != 1 or evals[0].get("split") != "test":
        fail(f"expected one test line in {a.metrics}, found {evals}")
    ev = evals[0]
    if abs(ev["accuracy"] - accuracy) > 0.5 / len(labels):
        fail(f"--eval accuracy {ev['accuracy']} != reference {accuracy}")
    if abs(ev["loss"] - loss) > 1e-4 * max(1.0, abs(loss)):
        fail(f"--eval loss {ev['loss']} != reference {loss}")
    print(json.dumps({"rows": len(labels), "accuracy": accuracy, "loss": loss, "max_logit_diff": diff,
                      "changed_initializers": changed}))


if __name__ == "__main__":
    main()
