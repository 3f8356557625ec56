#!/usr/bin/python3
"""PyTorch training references ("goldens") for onnxpipe's shipped models.

  /usr/bin/python3 models/torch_reference.py models/tiny_gpt.onnx            # -> models/golden/tiny_gpt.json
  /usr/bin/python3 models/torch_reference.py models/tiny_bert.onnx --out /tmp/g.json --data-dir /tmp/g_data

For MODEL.onnx with its sidecar MODEL.json (written by export.py) it rebuilds the same torch module (modeling.py),
loads the ONNX initializers into it by name (every parameter and buffer must be covered, with matching shapes, or it
fails), writes deterministic data as .npy files (one per graph input plus labels.npy, row i = sample i), runs 5 steps
of SGD and of AdamW in float64 and in float32, and writes the per-step losses, gradient norms and the final values of
a few small parameters as JSON. It also writes a forward golden (logits of a few rows at a batch and sequence length
different from the export's) for `onnxpipe run`.

Training semantics (the C++ trainer implements exactly these; README.md repeats them):
  * dropout off (the module is rebuilt with p = 0; the C++ trainer's flag for it), train mode otherwise;
  * step k (0-based) uses data rows (k*B + j) mod N, j = 0..B-1;
  * loss = mean cross-entropy over the batch: classifier/bert logits (B, C) vs labels (B,); gpt logits (B, S, V) vs
    labels (B, S) (next tokens), positions whose label is -100 are ignored and the mean is over the others;
  * losses[k] is the loss of step k's batch BEFORE step k's update; grad_norms[k] the global L2 norm over all
    trainable gradients of that loss (before any clipping; none is applied);
  * trainable = the module's parameters, a tied parameter counted once; buffers (sinusoidal table, causal masks)
    are frozen; weight decay applies to every trainable parameter (biases and LayerNorm included);
  * SGD (PyTorch): g' = g + wd*p; buf = g' at the first step, else buf = momentum*buf + g'; p -= lr*buf;
  * AdamW (PyTorch): p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; t = step (1-based);
    p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
"""
import argparse
import copy
import hashlib
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modeling  # noqa: E402

FORMAT = "onnxpipe-torch-reference/1"
IGNORE_INDEX = -100
OPTIMIZERS = {
    "sgd": dict(lr=0.01, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=False),
    "adamw": dict(lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, amsgrad=False),
}
# Small parameters whose final values each run records (whole tensors), per family.
FINAL_PARAMS = {
    "classifier": ["norm.weight", "head.bias", "encoder.layers.0.norm1.bias"],
    "gpt": ["ln_f.weight", "blocks.0.attn.q.bias", "blocks.1.mlp.proj.bias"],
    "bert": ["classifier.bias", "layers.1.out_norm.weight", "emb_norm.bias"],
}


def fail(msg):
    raise SystemExit(f"torch_reference.py: {msg}")


def load_sidecar(onnx_path):
    side_path = os.path.splitext(onnx_path)[0] + ".json"
    if not os.path.exists(side_path):
        fail(f"{onnx_path}: no sidecar {side_path} (export.py writes it)")
    with open(side_path) as fh:
        return json.load(fh)


def load_onnx_weights(model, onnx_path):
    """Copies the ONNX initializers into the module's parameters and buffers by name. Every parameter (a tied one
    under its first name) and every buffer must have an initializer of the same shape; initializers that map to
    nothing are an error too."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(onnx_path)  # also resolves external data next to the model
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    targets = {}  # initializer name -> tensor of the module
    seen = set()
    for name, p in model.named_parameters():  # first name of a shared parameter only
        targets[name] = p
        seen.add(id(p))
    for name, b in model.named_buffers():
        targets[name] = b
    missing = sorted(set(targets) - set(inits))
    unmapped = sorted(set(inits) - set(targets))
    if missing or unmapped:
        fail(f"{onnx_path}: initializer/module mismatch: module tensors without an initializer {missing}, "
             f"initializers without a module tensor {unmapped}")
    with torch.no_grad():
        for name, t in targets.items():
            arr = inits[name]
            if tuple(arr.shape) != tuple(t.shape):
                fail(f"{onnx_path}: initializer {name} has shape {list(arr.shape)}, module expects {list(t.shape)}")
            t.copy_(torch.from_numpy(np.array(arr)).to(t.dtype))
    return proto


def make_data(cfg, rows, seed):
    """Deterministic random data for the family: {input name: array}, labels."""
    rng = np.random.default_rng(seed)
    s, v = cfg["seq"], cfg["vocab"]
    if cfg["family"] == "gpt":
        seqs = rng.integers(0, v, size=(rows, s + 1), dtype=np.int64)
        tokens, labels = seqs[:, :-1].copy(), seqs[:, 1:].copy()
        labels[rng.random(labels.shape) < 0.15] = IGNORE_INDEX  # some ignored positions
        labels[:, -1] = IGNORE_INDEX  # and the last one of every row
        return {"tokens": tokens}, labels
    tokens = rng.integers(1, v, size=(rows, s), dtype=np.int64)
    labels = rng.integers(0, cfg["classes"], size=(rows,), dtype=np.int64)
    if cfg["family"] == "classifier":
        return {"tokens": tokens}, labels
    mask = np.ones((rows, s), dtype=np.int64)
    for i, length in enumerate(rng.integers(s // 4, s + 1, size=rows)):
        mask[i, length:] = 0
    mask[0, :] = 1  # one row without padding
    tokens[mask == 0] = 0  # pad id
    return {"tokens": tokens, "attention_mask": mask}, labels


def loss_fn(cfg, logits, labels):
    if cfg["family"] == "gpt":
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    return F.cross_entropy(logits, labels)


def make_optimizer(name, params):
    h = OPTIMIZERS[name]
    if name == "sgd":
        return torch.optim.SGD(params, lr=h["lr"], momentum=h["momentum"], dampening=h["dampening"],
                               weight_decay=h["weight_decay"], nesterov=h["nesterov"], foreach=False)
    return torch.optim.AdamW(params, lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"],
                             weight_decay=h["weight_decay"], amsgrad=h["amsgrad"], foreach=False)


def train_run(cfg, base, inputs, labels, opt_name, dtype, batch, steps, final_names, tied_rows):
    model = copy.deepcopy(base).to(dtype).train()  # deepcopy keeps tied parameters tied
    params = list(model.parameters())
    opt = make_optimizer(opt_name, params)
    named = dict(model.named_parameters())
    n = labels.shape[0]
    names = modeling.io_names(cfg["family"])[0]
    losses, norms = [], []
    for k in range(steps):
        idx = [(k * batch + j) % n for j in range(batch)]
        args = [torch.from_numpy(inputs[name][idx]) for name in names]
        y = torch.from_numpy(labels[idx])
        loss = loss_fn(cfg, model(*args), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sq = sum(float((p.grad.double() ** 2).sum()) for p in params if p.grad is not None)
        losses.append(float(loss))
        norms.append(sq ** 0.5)
        opt.step()
    final = {name: named[name].detach().double().reshape(-1).tolist() for name in final_names}
    rows = {name: {"rows": r, "values": named[name].detach().double()[r].tolist()} for name, r in tied_rows.items()}
    run = dict(optimizer=opt_name, hyperparams=OPTIMIZERS[opt_name], dtype=str(dtype).replace("torch.", ""),
               losses=losses, grad_norms=norms, final=final)
    if rows:
        run["final_rows"] = rows
    return run


@torch.no_grad()
def _manual_update(opt_name, params, state, t):
    """The documented update rules, written out (t is the 1-based step), to check torch.optim against them."""
    h = OPTIMIZERS[opt_name]
    for i, p in enumerate(params):
        g = p.grad
        if opt_name == "sgd":
            g = g + h["weight_decay"] * p
            state[i] = g.clone() if t == 1 else h["momentum"] * state[i] + g
            p -= h["lr"] * state[i]
        else:
            b1, b2 = h["betas"]
            m, v = state.get(i, (torch.zeros_like(p), torch.zeros_like(p)))
            p *= 1 - h["lr"] * h["weight_decay"]
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            state[i] = (m, v)
            p -= (h["lr"] / (1 - b1 ** t)) * m / (v.sqrt() / (1 - b2 ** t) ** 0.5 + h["eps"])


def verify_semantics(cfg, base, inputs, labels, batch, steps, runs, final_names):
    """Re-runs the float64 runs with _manual_update and fails unless losses, grad norms and final values agree with
    the torch.optim runs to 1e-10 relative: the README's description is what PyTorch does."""
    names = modeling.io_names(cfg["family"])[0]
    for run in runs:
        if run["dtype"] != "float64":
            continue
        model = copy.deepcopy(base).double().train()
        params = list(model.parameters())
        state, losses, norms = {}, [], []
        for k in range(steps):
            idx = [(k * batch + j) % labels.shape[0] for j in range(batch)]
            loss = loss_fn(cfg, model(*[torch.from_numpy(inputs[n][idx]) for n in names]), torch.from_numpy(labels[idx]))
            model.zero_grad(set_to_none=True)
            loss.backward()
            losses.append(float(loss))
            norms.append(float(torch.sqrt(sum((p.grad ** 2).sum() for p in params))))
            _manual_update(run["optimizer"], params, state, k + 1)
        named = dict(model.named_parameters())
        got = losses + norms + [x for n in final_names for x in named[n].detach().reshape(-1).tolist()]
        want = run["losses"] + run["grad_norms"] + [x for n in final_names for x in run["final"][n]]
        err = max(abs(a - b) / max(abs(b), 1e-3) for a, b in zip(got, want))
        if err > 1e-10:
            fail(f"{run['optimizer']} float64: hand-written update rules disagree with torch.optim (rel {err:.3g})")


def forward_golden(cfg, base, out_dir, seed):
    """Logits (float64, dropout off) of a small batch at a batch size and sequence length other than the export's
    (the shipped models have dynamic B and S; fixed-shape models use the export's)."""
    b, s = (3, max(1, cfg["seq"] // 2)) if cfg["dynamic"] else (2, cfg["seq"])
    if cfg["family"] == "gpt" and cfg["dynamic"]:
        b, s = 2, 8  # (B, S, V) logits: keep the file small
    sub = dict(cfg, seq=s)
    inputs, _ = make_data(sub, b, seed + 7)
    model = copy.deepcopy(base).double().eval()
    names = modeling.io_names(cfg["family"])[0]
    with torch.no_grad():
        logits = model(*[torch.from_numpy(inputs[n]) for n in names]).numpy()
    os.makedirs(os.path.join(out_dir, "inputs"), exist_ok=True)
    for n in names:
        np.save(os.path.join(out_dir, "inputs", n + ".npy"), inputs[n])
    np.save(os.path.join(out_dir, "logits.npy"), logits)
    return dict(batch=b, seq=s, inputs_dir="inputs", outputs={"logits": "logits.npy"}, dtype="float64",
                dropout="off")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="MODEL.onnx with its MODEL.json sidecar")
    p.add_argument("--out", help="golden JSON (default: models/golden/<model>.json next to this script)")
    p.add_argument("--data-dir", help="where the .npy data go (default: <out without .json>/data)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rows", type=int, default=20, help="data rows (samples)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--data-seed", type=int, default=1234)
    p.add_argument("--verify", action="store_true",
                   help="also re-run the float64 runs with the documented update rules written out, and fail "
                        "unless they match torch.optim")
    a = p.parse_args(argv)
    if a.batch < 1 or a.rows < 1 or a.steps < 1:
        fail("--batch, --rows and --steps must be positive")
    torch.set_num_threads(1)  # bit-reproducible float32 references
    torch.use_deterministic_algorithms(True)

    stem = os.path.splitext(os.path.basename(a.model))[0]
    here = os.path.dirname(os.path.abspath(__file__))
    out = a.out or os.path.join(here, "golden", stem + ".json")
    root = os.path.splitext(out)[0]
    data_dir = a.data_dir or os.path.join(root, "data")
    cfg = load_sidecar(a.model)
    family = cfg["family"]

    base = modeling.build(dict(cfg, dropout=0.0))  # dropout off: p = 0 everywhere
    load_onnx_weights(base, a.model)
    inputs, labels = make_data(cfg, a.rows, a.data_seed)
    os.makedirs(data_dir, exist_ok=True)
    for name, arr in inputs.items():
        np.save(os.path.join(data_dir, name + ".npy"), arr)
    np.save(os.path.join(data_dir, "labels.npy"), labels)

    named = dict(base.named_parameters())
    final_names = [n for n in FINAL_PARAMS[family] if n in named]
    tied_rows = {}
    for t in cfg.get("tied", []):  # a tied matrix is large: record two rows, one seen in the data, one not
        seen = set(np.unique(inputs["tokens"][: a.batch * a.steps]).tolist())
        unseen = next(i for i in range(cfg["vocab"]) if i not in seen)
        tied_rows[t["initializer"]] = [int(inputs["tokens"][0, 0]), unseen]

    runs = [train_run(cfg, base, inputs, labels, opt, dtype, a.batch, a.steps, final_names, tied_rows)
            for opt in ("sgd", "adamw") for dtype in (torch.float64, torch.float32)]
    if a.verify:
        verify_semantics(cfg, base, inputs, labels, a.batch, a.steps, runs, final_names)
    fwd = forward_golden(cfg, base, os.path.join(root, "forward"), a.data_seed)

    rel = lambda path: os.path.relpath(path, os.path.dirname(out))  # noqa: E731
    golden = dict(
        format=FORMAT, model=stem, onnx=os.path.basename(a.model), onnx_sha256=sha256(a.model), family=family,
        batch=a.batch, steps=a.steps, rows=a.rows, dropout="off",
        data=dict(dir=rel(data_dir), inputs={n: n + ".npy" for n in inputs}, labels="labels.npy",
                  row_order="step k uses rows (k*batch + j) mod rows, j = 0..batch-1", seed=a.data_seed),
        loss=dict(kind="cross_entropy", reduction="mean", logits="logits", labels="labels",
                  per="token" if family == "gpt" else "sample", ignore_index=IGNORE_INDEX),
        trainable=[n for n in named], trainable_count=sum(p.numel() for p in base.parameters()),
        frozen=[n for n, _ in base.named_buffers()], tied=cfg.get("tied", []),
        grad_norm="global L2 norm over all trainable gradients of the step's loss, before the update, no clipping",
        runs=runs, forward=dict(fwd, dir=rel(os.path.join(root, "forward"))),
        torch=torch.__version__)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(golden, fh, indent=1)
        fh.write("\n")
    summary = {r["optimizer"] + "/" + r["dtype"]: [round(x, 6) for x in r["losses"]] for r in runs}
    print(json.dumps(dict(golden=out, data=data_dir, losses=summary)))


if __name__ == "__main__":
    main()
