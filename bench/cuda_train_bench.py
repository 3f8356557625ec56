#!/usr/bin/env python3
"""GPU training throughput: `onnxpipe train --backend cuda` against the PyTorch peer on the same model, same GPU, one run.

The peer (shared/bench/torch_peer.py, passed as --peer) builds the DESIGN.md benchmark classifier (TransformerEncoder,
post-LN, GELU, dropout 0.1) and exports the very same seeded model to ONNX; this script then trains that export with
onnxpipe on random tokens (the same vocabulary, sequence length, batch, SGD) and runs the peer's own step loop (eager,
per-layer checkpointing, torch.compile, as asked) in the same command. samples/s: onnxpipe's median step-to-step rate
over the steps after --warmup (its metrics file); samples_s_whole_process: onnxpipe run with warmup + 2 steps (three
times) and warmup + 2 + N steps, batch x N / the difference in wall time (start-up, export load and planning cancel;
N is --steps or --whole-process-steps, whichever is larger; null when start-up's spread between the runs is over 5 %
of the difference: bench/whole_process.py); the peer's from its JSON lines (wall time over its timed steps).
Writes bench/results/cuda_train_<date>_<tag>.json
with every number, the ratios onnxpipe / peer and the host fallbacks onnxpipe printed (ops without a CUDA kernel yet).

  python3 bench/cuda_train_bench.py --peer .dev/torch_peer.py --onnxpipe .build/main/tools/onnxpipe \
      --layers 2 --batch 32 --dtype fp32
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from whole_process import whole_process_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpu_name():
    """GPU 0's name by nvidia-smi, or "unknown GPU" where it cannot say."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown GPU"
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown GPU"


def peer_lines(a, extra):
    extra = [*extra, *(["--no-tf32"] if a.no_tf32 else [])]
    cmd = [sys.executable, a.peer, "--layers", str(a.layers), "--d", str(a.d), "--heads", str(a.heads), "--dhid",
           str(a.dhid), "--seq", str(a.seq), "--vocab", str(a.vocab), "--batch", *map(str, a.batch), "--steps",
           str(a.steps), "--warmup", str(a.warmup), "--optimizer", "sgd", "--lr", str(a.lr), *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def onnxpipe_run(a, model, batch, dtype, work, graphs=True, variant="", extra=()):
    data = os.path.join(work, f"data_b{batch}")
    os.makedirs(data, exist_ok=True)
    rows = batch * 2
    rng = np.random.default_rng(0)
    np.save(os.path.join(data, "tokens.npy"), rng.integers(0, a.vocab, (rows, a.seq), dtype=np.int64))
    np.save(os.path.join(data, "labels.npy"), rng.integers(0, 2, (rows,), dtype=np.int64))
    metrics = os.path.join(work, f"m_b{batch}{'' if graphs else '_no_graphs'}{variant}.jsonl")
    cmd = [a.onnxpipe, "train", model, "--data", data, "--batch", str(batch), "--steps", "STEPS",
           "--optimizer", "sgd", "--lr", str(a.lr), "--backend", "cuda", "--metrics", metrics,
           "--log-every", "1000000", "--dtype", dtype, *([] if a.no_tf32 or dtype != "fp32" else ["--tf32"]),
           "--cuda-graphs" if graphs else "--no-cuda-graphs", *extra]
    plan = {}
    if a.memory_budget:
        plan_dir = os.path.join(work, f"plan_budget_b{batch}")
        pcmd = [a.onnxpipe, "partition", model, "--stages", "1", "--batch", str(batch), "--microbatches",
                str(a.microbatches), "--recompute", "auto", "--device", "auto", "--device-memory", a.memory_budget,
                "--dtype", dtype, "--no-onnx", "--out", plan_dir]
        r = subprocess.run(pcmd, capture_output=True, text=True)
        if r.returncode != 0:
            return dict(error=(r.stderr or r.stdout).strip()[-2000:], command=" ".join(["onnxpipe", *pcmd[1:]]))
        pj = json.load(open(os.path.join(plan_dir, "plan.json")))
        plan = dict(memory_budget=a.memory_budget, microbatches=a.microbatches, recompute="auto",
                    predicted_samples_s=pj["predicted"]["samples_per_s"],
                    predicted_memory_gib=round(pj["stages"][0]["memory"]["total"] / 2**30, 3),
                    command=" ".join(["onnxpipe", *pcmd[1:]]).replace(model, os.path.basename(model))
                    .replace(work, "WORK"))
        cmd += ["--plan", plan_dir, "--microbatches", str(a.microbatches)]
    n1 = a.warmup + 2
    n2 = n1 + max(a.steps, a.whole_process_steps)
    r, whole = whole_process_rate(lambda n: subprocess.run([str(n) if c == "STEPS" else c for c in cmd],
                                                           capture_output=True, text=True), n1, n2, batch)
    cmd = r.args
    if whole is None:
        return dict(error=(r.stderr or r.stdout).strip()[-2000:], command=" ".join(["onnxpipe", *cmd[1:]]))
    steps = [json.loads(l) for l in open(metrics)]
    fallbacks = [l for l in r.stdout.splitlines() if l.startswith("cuda: ran on the host")]
    memory = [l for l in r.stdout.splitlines() if l.startswith("cuda memory:")]
    attention = [l for l in r.stdout.splitlines() if l.startswith("cuda attention:")]
    graphs_line = [l for l in r.stdout.splitlines() if l.startswith("cuda graphs:")]
    return dict(samples_s=statistics.median(s["samples_per_s"] for s in steps[a.warmup:]), **whole,
                losses=[s["loss"] for s in steps], host_fallbacks=fallbacks[0] if fallbacks else "",
                memory=memory[0] if memory else "", attention=attention[0] if attention else "",
                **({"graphs": graphs_line[0]} if graphs_line else {}),
                **({"plan": plan} if plan else {}),
                command=" ".join(["onnxpipe", *cmd[1:]]).replace(model, os.path.basename(model)).replace(work, "WORK"))


def predicted(a, model, batch, dtype, work):
    """`onnxpipe profile --backend cuda` of the training graph, then `partition --profile` of it: the step and stage
    memory the partitioner predicts from the measured per-op times (one stage), and its roofline-only prediction."""
    os.makedirs(a.out, exist_ok=True)  # the profile is kept beside the results: per-op times to read afterwards
    times = os.path.join(a.out, f"cuda_profile_{datetime.date.today():%Y%m%d}_{a.tag}_b{batch}.json")
    tf32 = [] if a.no_tf32 or dtype != "fp32" else ["--tf32"]
    dt = [] if dtype == "fp32" else ["--dtype", dtype]
    r = subprocess.run([a.onnxpipe, "profile", model, "--batch", str(batch), "--backend", "cuda", "--repeats", "3",
                        *dt, *tf32, "--out", times], capture_output=True, text=True)
    if r.returncode != 0:
        return dict(error=(r.stderr or r.stdout).strip()[-2000:])
    out = {}
    # The profiled plan is for the device the profile names (the card it ran on); the roofline's for this GPU too.
    for name, extra in (("profiled", ["--profile", times]), ("roofline", ["--device", "auto"])):
        plan_dir = os.path.join(work, f"plan_{name}_b{batch}")
        r = subprocess.run([a.onnxpipe, "partition", model, "--stages", "1", "--batch", str(batch), "--dtype", dtype,
                            "--no-onnx", "--out", plan_dir, *extra], capture_output=True, text=True)
        if r.returncode != 0:
            out[name] = dict(error=(r.stderr or r.stdout).strip()[-2000:])
            continue
        plan = json.load(open(os.path.join(plan_dir, "plan.json")))
        memory = plan["stages"][0]["memory"]
        out[name] = dict(device=plan["device"]["name"], samples_s=plan["predicted"]["samples_per_s"], step_ms=plan["predicted"]["step_ms"],
                         memory_gib=round(memory["total"] / 2**30, 3),
                         kernel_scratch_counted=plan["config"]["kernel_scratch_counted"],
                         kernel_scratch_mib=round(memory.get("kernel_scratch", 0) / 2**20, 1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", required=True, help="torch_peer.py")
    p.add_argument("--onnxpipe", default=os.path.join(ROOT, ".build/main/tools/onnxpipe"))
    p.add_argument("--model", help="a `torch_peer.py --export-onnx` export of this configuration (default: export one)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dhid", type=int, default=4096)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=20000)
    p.add_argument("--batch", type=int, nargs="+", default=[32])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="both sides' training dtype (bf16: bf16 compute, fp32 master weights)")
    p.add_argument("--no-tf32", action="store_true",
                   help="exact fp32 GEMMs on both sides (default: TF32 on both, PyTorch's peer default)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--whole-process-steps", type=int, default=100,
                   help="onnxpipe's longer run has at least this many steps more than its shorter one (the "
                   "whole-process rate is their difference: too few steps and start-up's variation is the figure)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--memory-budget", help="train under this GPU memory (e.g. 10.7GiB): `partition --recompute auto "
                   "--device-memory BUDGET --microbatches M` plans what to recompute, `train --plan` runs it")
    p.add_argument("--microbatches", type=int, default=1, help="micro-batches per step with --memory-budget")
    p.add_argument("--predict", nargs="*", type=int, metavar="B",
                   help="also profile the training graph on the GPU and record partition's predicted samples/s "
                   "(at these batches; none given: every --batch)")
    p.add_argument("--peers", nargs="*", default=["eager", "compile"], choices=["eager", "ckpt", "compile"],
                   help="PyTorch sides to run in the same command (none: onnxpipe alone)")
    p.add_argument("--tactics-row", action="store_true",
                   help="also run onnxpipe with --gemm-tactics (row key onnxpipe_tactics: GEMM candidates timed in the "
                        "first of its two runs, whose cache the second, timed one, reuses)")
    p.add_argument("--no-graphs-row", action="store_true",
                   help="also run onnxpipe with --no-cuda-graphs (row key onnxpipe_no_graphs; the onnxpipe row runs "
                        "with CUDA graphs, train's default: --warmup >= 2, the first step is eager, the second records)")
    p.add_argument("--device-name", default=gpu_name(),
                   help="the GPU, as recorded (default: nvidia-smi's name of GPU 0)")
    p.add_argument("--tag", help="names the results file (default: from --device-name, e.g. nvidia_h100_80gb_hbm3)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = p.parse_args()
    a.tag = a.tag or re.sub(r"[^a-z0-9]+", "_", a.device_name.lower()).strip("_")
    with tempfile.TemporaryDirectory(prefix="cuda_train_bench_") as work:
        # Exported at a small batch (the export traces on the host: batch 256 runs out of its memory); onnxpipe
        # re-derives the batch.
        model = a.model or os.path.join(work, "enc.onnx")
        export = [{k: os.path.basename(v) if k in ("exported", "sidecar") else v for k, v in e.items()}
                  for e in ([] if a.model else peer_lines(argparse.Namespace(**{**vars(a), "batch": [min(*a.batch, 32)]}),
                                                          ["--export-onnx", model]))]
        onnxpipe = {b: onnxpipe_run(a, model, b, a.dtype, work) for b in a.batch}
        print(json.dumps({"onnxpipe": onnxpipe}, indent=1), flush=True)  # before the peers, which take longest
        no_graphs = ({b: onnxpipe_run(a, model, b, a.dtype, work, graphs=False) for b in a.batch}
                     if a.no_graphs_row else {})
        cache = ["--gemm-tactics", os.path.join(work, "gemm_tactics.json")]
        tactics = ({b: onnxpipe_run(a, model, b, a.dtype, work, variant="_tactics", extra=cache) for b in a.batch}
                   if a.tactics_row else {})
        if a.predict is not None:
            for b in [b for b in a.predict or a.batch if b in onnxpipe]:
                onnxpipe[b]["predicted"] = pred = predicted(a, model, b, a.dtype, work)
                measured = onnxpipe[b].get("samples_s")
                for side in (v for v in pred.values() if isinstance(v, dict) and "samples_s" in v and measured):
                    side["error_vs_measured"] = round(side["samples_s"] / measured - 1, 4)
    peer_flags = {"eager": [], "ckpt": ["--ckpt", "on"], "compile": ["--compile"]}
    peers = {}
    for name in a.peers:
        lines = peer_lines(a, ["--dtype", a.dtype, *peer_flags[name]])
        peers[name] = {l["batch"]: l for l in lines if "batch" in l}
    rows = []
    for b in a.batch:
        row = dict(batch=b, onnxpipe=onnxpipe[b], **({"onnxpipe_no_graphs": no_graphs[b]} if b in no_graphs else {}),
                   **({"onnxpipe_tactics": tactics[b]} if b in tactics else {}))
        for name, by_batch in peers.items():
            pr = by_batch.get(b, {})
            row[name] = pr
            for key, rate, prefix in (("onnxpipe", "samples_s", "ratio"),
                                      ("onnxpipe", "samples_s_whole_process", "ratio_whole_process"),
                                      ("onnxpipe_no_graphs", "samples_s", "ratio_no_graphs"),
                                      ("onnxpipe_tactics", "samples_s", "ratio_tactics"),
                                      ("onnxpipe_tactics", "samples_s_whole_process", "ratio_tactics_whole_process")):
                if row.get(key, {}).get(rate) and pr.get("samples_s"):
                    row[f"{prefix}_vs_{name}"] = round(row[key][rate] / pr["samples_s"], 4)
        rows.append(row)
    result = dict(benchmark="cuda_train", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=a.device_name, dtype=a.dtype, tf32=not a.no_tf32,
                  model=dict(layers=a.layers, d=a.d, heads=a.heads, dhid=a.dhid, seq=a.seq, vocab=a.vocab),
                  steps=a.steps, warmup=a.warmup, export=export, rows=rows)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"cuda_train_{datetime.date.today():%Y%m%d}_{a.tag}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(rows, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
