"""PyTorch reference for tests/autodiff/loss_torch_test.cc: cross-entropy loss and its gradient.

Reads a JSON list of cases (logits, shape, labels, label_shape, ignore_index, label_smoothing,
optional weights) from argv[1]; writes [{"loss": L, "grad": [...]}] to stdout, in float64.
Per-token logits (B, S, V) use PyTorch's class-second layout, cross_entropy(x.permute(0, 2, 1), y).
"""
import json
import sys

import torch


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = []
    for c in cases:
        x = torch.tensor(c["logits"], dtype=torch.float64).reshape(c["shape"]).requires_grad_()
        y = torch.tensor(c["labels"], dtype=torch.int64).reshape(c["label_shape"])
        w = c.get("weights")
        w = torch.tensor(w, dtype=torch.float64) if w else None
        scores = x.permute(0, 2, 1) if x.dim() == 3 else x
        loss = torch.nn.functional.cross_entropy(
            scores, y, weight=w, ignore_index=c["ignore_index"],
            label_smoothing=c["label_smoothing"], reduction="mean")
        loss.backward()
        out.append({"loss": loss.item(), "grad": x.grad.flatten().tolist()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
