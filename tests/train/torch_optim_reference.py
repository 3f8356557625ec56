#!/usr/bin/python3
"""PyTorch reference for onnxpipe's optimizer ops (tests/train/optimizer_test.cc).

Two parameters (shapes (3, 5) and (4,)) and a deterministic sequence of gradients; runs torch.optim.SGD or AdamW
(foreach=False) for --steps steps, optionally clipping with clip_grad_norm_ first, and prints JSON:
  {"params0": [p0, p1], "grads": [[g0, g1] per step], "after": [[p0, p1] per step], "norms": [total norm per step]}
with every tensor flattened row-major.
"""
import argparse
import json

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], required=True)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--clip-norm", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, a.dtype)
    rng = np.random.default_rng(a.seed)
    shapes = [(3, 5), (4,)]
    params = [torch.tensor(rng.standard_normal(s), dtype=dtype, requires_grad=True) for s in shapes]
    params0 = [p.detach().reshape(-1).tolist() for p in params]
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                              weight_decay=a.weight_decay, foreach=False)
    else:
        opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                                weight_decay=a.weight_decay, foreach=False)
    grads, after, norms = [], [], []
    for _ in range(a.steps):
        gs = [torch.tensor(3.0 * rng.standard_normal(s), dtype=dtype) for s in shapes]
        grads.append([g.reshape(-1).tolist() for g in gs])
        for p, g in zip(params, gs):
            p.grad = g.clone()
        norms.append(float(torch.sqrt(sum((g.double() ** 2).sum() for g in gs))))
        if a.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip_norm)
        opt.step()
        after.append([p.detach().reshape(-1).tolist() for p in params])
    print(json.dumps(dict(params0=params0, grads=grads, after=after, norms=norms)))


if __name__ == "__main__":
    main()
