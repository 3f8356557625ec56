#!/usr/bin/env python3
"""Decoder LLM training on one GPU: `onnxpipe train --backend cuda` of a Hugging Face transformers model's ONNX
export against PyTorch eager and torch.compile of the very same model (same seeded weights, same batches, bf16
autocast, SGD), in one command.

The bench builds the model from a transformers config (--preset: Llama, Qwen2, Qwen3, Mistral and Gemma 3 shapes of
real checkpoints, and tiny ones that run on the CPU with --backend cpu), exports it with torch's dynamo exporter
(external data), writes next-token data (labels = the tokens shifted left, the last position ignored) and runs:
  onnxpipe   N1 = warmup + 2 steps (three times: the first warms the file cache) and N2 = N1 + steps steps: samples/s
             is the median step-to-step rate after warmup of train's metrics (the whole interval between steps), and
             samples_s_whole_process = batch x (N2 - N1) / (wall2 - mean wall1), null when start-up's spread between
             the N1 runs is over 5 % of that difference (bench/whole_process.py); its losses, peak GPU memory line and
             host fallbacks from the N2 run
  eager      PyTorch, bf16 autocast, the same rows in the same order: samples/s over the steps after warmup
  compile    the same under torch.compile
  onnxpipe_tactics  (--tactics-row) onnxpipe again with --gemm-tactics: the first run times cuBLASLt's candidates for
             each GEMM and fills the cache that the timed runs reuse
MFU = tokens/s x (6 N + 12 L a S) / the card's dense bf16 peak (N the parameters, a tied embedding counted once;
a = heads x head dim, the attention's width).
Writes bench/results/llm_train_<date>_<tag>_<preset>.json.

  python3 bench/llm_train_bench.py --onnxpipe .build/main/tools/onnxpipe --preset llama-426m --batch 8 --tag h100
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from whole_process import whole_process_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def preset(family, layers, hidden, heads, kv_heads, intermediate, vocab, tied, head_dim=None, **extra):
    """A model shape; `extra` goes to the family's config as it is (Gemma 3's sliding window, ...)."""
    return dict(family=family, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, intermediate=intermediate,
                vocab=vocab, tied=tied, head_dim=head_dim or hidden // heads, extra=extra)


PRESETS = {
    "llama-426m": preset("llama", 8, 2048, 16, 4, 5632, 32000, True),  # the Llama-shaped model
    "qwen2-0.5b": preset("qwen2", 24, 896, 14, 2, 4864, 151936, True),  # Qwen2-0.5B's shape
    "qwen3-0.6b": preset("qwen3", 28, 1024, 16, 8, 3072, 151936, True, head_dim=128),  # Qwen3-0.6B's
    "mistral-0.5b": preset("mistral", 8, 2048, 16, 4, 5632, 32000, False),
    "llama-1b": preset("llama", 16, 2048, 32, 8, 8192, 128256, True),  # Llama-3.2-1B's shape
    # Gemma 3 1B's: 5 of every 6 layers attend within a 512-token window, RMSNorm on queries and keys, GeGLU
    "gemma3-1b": preset("gemma3", 26, 1152, 4, 1, 6912, 262144, True, head_dim=256, sliding_window=512,
                        query_pre_attn_scalar=256),
    # CPU smoke tests of the bench itself (--backend cpu)
    "tiny": preset("llama", 2, 128, 4, 2, 256, 512, True),
    "tiny-qwen3": preset("qwen3", 2, 128, 4, 2, 256, 512, True, head_dim=64),
    "tiny-gemma3": preset("gemma3", 3, 128, 4, 1, 256, 512, True, head_dim=64, sliding_window=8,
                          query_pre_attn_scalar=64, layer_types=["sliding_attention", "sliding_attention",
                                                                 "full_attention"]),
}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "mistral": "MistralConfig",
           "gemma3": "Gemma3TextConfig"}


def build(a):
    import torch
    import transformers as tr

    p = PRESETS[a.preset]
    cfg = getattr(tr, CONFIGS[p["family"]])(
        vocab_size=p["vocab"], hidden_size=p["hidden"], num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"], head_dim=p["head_dim"], intermediate_size=p["intermediate"],
        max_position_embeddings=max(a.seq, 2048), tie_word_embeddings=p["tied"], attn_implementation="sdpa",
        attention_dropout=0.0, **p["extra"])
    torch.manual_seed(0)
    model = tr.AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for p in model.parameters())  # shared tensors once
    return model, dict({k: v for k, v in p.items() if k != "extra"}, **p["extra"], parameters=params)


def logits_only(model):
    """forward(input_ids) -> logits: the graph onnxpipe trains (its loss comes from --logits and the labels)."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, use_cache=False).logits

    return LogitsOnly()


def export(model, a, path):
    import torch

    wrapped = logits_only(model).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, a.seq))
    batch = torch.export.Dim("batch", min=1, max=4096)
    prog = torch.onnx.export(wrapped, (ids,), None, dynamo=True, input_names=["input_ids"], output_names=["logits"],
                             dynamic_shapes=({0: batch},), opset_version=18)
    prog.save(path, external_data=True)


def make_data(a, vocab, rows, work):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (rows, a.seq), dtype=np.int64)
    labels = np.concatenate([tokens[:, 1:], np.full((rows, 1), -100, dtype=np.int64)], axis=1)
    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    np.save(os.path.join(data, "input_ids.npy"), tokens)
    np.save(os.path.join(data, "labels.npy"), labels)
    return data, tokens, labels


def onnxpipe_run(a, model, data, work, extra=()):
    n1 = a.warmup + 2
    n2 = n1 + a.steps

    def metrics(n):
        return os.path.join(work, f"m{n}.jsonl")

    def run(n):
        cmd = [a.onnxpipe, "train", model, "--data", data, "--batch", str(a.batch), "--steps", str(n), "--optimizer",
               "sgd", "--lr", str(a.lr), "--backend", a.backend, "--dtype", "bf16", "--logits", "logits", "--metrics",
               metrics(n), "--log-every", "1000000", *a.onnxpipe_flags, *extra]
        return subprocess.run(cmd, capture_output=True, text=True)

    r, whole = whole_process_rate(run, n1, n2, a.batch)
    command = " ".join(["onnxpipe", *r.args[1:]]).replace(work, "WORK")
    if whole is None:
        return dict(error=(r.stderr or r.stdout).strip()[-3000:], command=command)
    lines = r.stdout.splitlines()
    steps = [json.loads(l) for l in open(metrics(n2))]
    return dict(losses=[s["loss"] for s in steps][:a.losses],
                memory=next((l for l in lines if l.startswith("cuda memory:")), ""),
                host_fallbacks=next((l for l in lines if l.startswith("cuda: ran on the host")), ""),
                attention=next((l for l in lines if l.startswith("cuda attention:")), ""), command=command,
                samples_s=statistics.median(s["samples_per_s"] for s in steps[a.warmup:]), **whole)


def onnxpipe_profile(a, model, work, top=20):
    """Kernel time per op kind of one training step (`onnxpipe profile`), the longest first."""
    out = os.path.join(work, "profile.json")
    cmd = [a.onnxpipe, "profile", model, "--backend", a.backend, "--dtype", "bf16", "--batch", str(a.batch),
           "--optimizer", "sgd", "--logits", "logits", "--repeats", "3", "--warmup", "1", "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return dict(error=(r.stderr or r.stdout).strip()[-3000:])
    by_op = {}
    for n in json.load(open(out))["ops"]:
        e = by_op.setdefault(n["op"], [0.0, 0])
        e[0] += n["ms"]
        e[1] += 1
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(total_ms=round(sum(v[0] for v in by_op.values()), 2),
                ops=[dict(op=k, ms=round(v[0], 3), calls=v[1]) for k, v in ranked])


def torch_run(a, tokens, labels, compiled):
    import torch
    import torch.nn.functional as F

    dev = torch.device(a.backend)

    def sync():
        if a.backend == "cuda":
            torch.cuda.synchronize()

    m = build(a)[0].to(dev).train()  # the exported weights again (seeded)
    step_fn = m
    if compiled:
        step_fn = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=a.lr)
    if a.backend == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    rows = tokens.shape[0]
    for k in range(a.warmup + a.steps):
        lo = (k * a.batch) % rows
        ids = torch.from_numpy(tokens[lo:lo + a.batch]).to(dev)
        lab = torch.from_numpy(labels[lo:lo + a.batch]).to(dev)
        sync()
        t = time.monotonic()
        with torch.autocast(a.backend, dtype=torch.bfloat16):
            logits = step_fn(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), lab.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        times.append(time.monotonic() - t)
        losses.append(loss.item())
    peak = dict(peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3)) if a.backend == "cuda" else {}
    return dict(samples_s=a.batch / statistics.median(times[a.warmup:]), losses=losses[:a.losses], **peak)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnxpipe", default=os.path.join(ROOT, ".build/main/tools/onnxpipe"))
    p.add_argument("--preset", default="llama-426m", choices=sorted(PRESETS))
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"],
                   help="where both sides train (cpu: a smoke test of the bench with a tiny preset)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=40, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--losses", type=int, default=3, help="first losses recorded side by side")
    p.add_argument("--peers", nargs="*", default=["eager", "compile"], choices=["eager", "compile"])
    p.add_argument("--onnxpipe-flags", nargs="*", default=[], help="more `onnxpipe train` flags")
    p.add_argument("--tactics-row", action="store_true",
                   help="also run onnxpipe with --gemm-tactics (row key onnxpipe_tactics: GEMM candidates timed in the "
                        "first of its runs, whose cache the timed ones reuse)")
    p.add_argument("--profile", action="store_true",
                   help="also `onnxpipe profile --backend cuda` one training step: the ops that took longest")
    p.add_argument("--device-name", default="")
    p.add_argument("--tag", default="gpu")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = p.parse_args()
    import torch

    device = a.device_name or (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    model, shape = build(a)
    rows = a.batch * (a.warmup + 2 + a.steps)
    result = dict(benchmark="llm_train", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=device, preset=a.preset, model=shape, seq=a.seq, batch=a.batch, dtype="bf16",
                  optimizer=f"sgd lr {a.lr}", steps=a.steps, warmup=a.warmup)
    with tempfile.TemporaryDirectory(prefix="llm_train_bench_") as work:
        path = os.path.join(work, "model.onnx")
        t = time.monotonic()
        export(model, a, path)
        result["export_s"] = round(time.monotonic() - t, 1)
        data, tokens, labels = make_data(a, shape["vocab"], rows, work)
        result["onnxpipe"] = onnxpipe_run(a, path, data, work)
        if a.tactics_row:
            cache = ["--gemm-tactics", os.path.join(work, "gemm_tactics.json")]
            result["onnxpipe_tactics"] = onnxpipe_run(a, path, data, work, extra=cache)
        if a.profile:
            result["onnxpipe_profile"] = onnxpipe_profile(a, path, work)
    for name in a.peers:
        result[name] = torch_run(a, tokens, labels, compiled=name == "compile")
    tokens_per_sample = a.seq
    flops_per_token = 6 * shape["parameters"] + 12 * shape["layers"] * shape["heads"] * shape["head_dim"] * a.seq
    peak = next((v for k, v in PEAK_BF16.items() if k in device), None)
    for name in ["onnxpipe", "onnxpipe_tactics", *a.peers]:
        r = result.get(name, {})
        if "samples_s" not in r:
            continue
        r["tokens_s"] = round(r["samples_s"] * tokens_per_sample, 1)
        if peak:
            r["mfu"] = round(r["tokens_s"] * flops_per_token / peak, 4)
        if name in a.peers:
            for side in ("onnxpipe", "onnxpipe_tactics"):
                if "samples_s" in result.get(side, {}):
                    result[f"{side}_over_{name}"] = round(result[side]["samples_s"] / r["samples_s"], 4)
    os.makedirs(a.out, exist_ok=True)
    out = os.path.join(a.out, f"llm_train_{datetime.date.today():%Y%m%d}_{a.tag}_{a.preset}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("model",)}, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
