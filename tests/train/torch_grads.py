#!/usr/bin/python3
"""Per-parameter gradients of one training step in PyTorch, for tests/train/golden_test.cc.

  torch_grads.py MODEL.onnx DATA_DIR --batch B [--step K] [--dtype float64] [--label-smoothing E] [--autocast]

Rebuilds the module of MODEL.onnx the way models/torch_reference.py does (same weights, dropout off), takes the
rows of step K ((K*B + j) mod N), and prints JSON {parameter name: {"norm", "sum", "head": first 8 entries}} of
the gradients of the mean cross-entropy loss (with label smoothing E), and the loss. --autocast runs the forward
under torch.autocast("cpu", torch.bfloat16) (PyTorch's bf16 mixed precision; use it with --dtype float32) and the
loss on the logits cast to float32.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "models"))
import modeling  # noqa: E402
import torch_reference as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--autocast", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ref.load_sidecar(a.model)
    model = modeling.build(dict(cfg, dropout=0.0))
    ref.load_onnx_weights(model, a.model)
    model = model.to(getattr(torch, a.dtype)).train()
    names = modeling.io_names(cfg["family"])[0]
    inputs = {n: np.load(os.path.join(a.data, n + ".npy")) for n in names}
    labels = np.load(os.path.join(a.data, "labels.npy"))
    rows = [(a.step * a.batch + j) % labels.shape[0] for j in range(a.batch)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
        logits = model(*[torch.from_numpy(inputs[n][rows]) for n in names])
    logits = logits.to(getattr(torch, a.dtype))
    y = torch.from_numpy(labels[rows])
    if a.label_smoothing:
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 ignore_index=ref.IGNORE_INDEX,
                                                 label_smoothing=a.label_smoothing)
    else:
        loss = ref.loss_fn(cfg, logits, y)
    loss.backward()
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.double().reshape(-1)
        out[name] = dict(norm=float(g.norm()), sum=float(g.sum()), head=g[:8].tolist())
    print(json.dumps(dict(loss=float(loss), grads=out)))


if __name__ == "__main__":
    main()
