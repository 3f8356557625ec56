#!/usr/bin/env python3
"""The seed's table (the IDRIS PyTorch Pipe benchmark): K stages x batch x chunks (micro-batches), the time of an
epoch of 25,000 samples and the peak memory of each stage, predicted and measured side by side, OOM marked; the
PyTorch peer on the same grid in the same command. Writes bench/results/seed_sweep_<date>_<tag>.csv and .html.

For each K:
  predicted  `onnxpipe partition --sweep` (one command for the grid): step time, per-stage memory, fits or not
  onnxpipe   `onnxpipe partition --stages K --microbatches C --out PLAN` (the predicted row's plan), then
             `onnxpipe launch --nproc K -- train --plan PLAN --report DIR`: one process per stage;
             the step time is the median step-to-step interval after --warmup (--metrics), the memory per stage
             what the report measured (arena, accumulators, kernel scratch) plus its parameters and optimizer state
  gpipe, 1f1b  torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B over K processes (gloo on CPU, NCCL
             with one GPU per rank) with per-layer checkpointing, as Pipe did; the median step after --warmup; the
             peak memory per stage (CPU: each rank's peak resident set, torch's runtime included, about 0.7 GB;
             GPU: torch.cuda.max_memory_allocated). Schedule1F1B needs at least K chunks (a failure otherwise)
The model is the peer's classifier (torch_peer.py: TransformerEncoder, post-LN, GELU, dropout 0.1), exported by the
peer with the same seeded weights; SGD, fp32. A failed run (out of memory or otherwise) is marked with its reason.

  .build/venv/bin/python3 bench/seed_sweep.py --peer PATH/torch_peer.py --layers 4 --d 128 --heads 4 --dhid 512 \\
      --seq 64 --vocab 2000 --stages 2 4 --batch 32 64 --chunks 1 2 4 --tag 2-core-cpu-vm
"""
import argparse
import csv
import datetime
import html
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCH = 25000


def load_peer(path):
    spec = importlib.util.spec_from_file_location("torch_peer", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    return peer


def predicted(a, model, work):
    out = os.path.join(work, "sweep")
    grid = (f"batch={','.join(map(str, a.batch))} microbatches={','.join(map(str, a.chunks))} "
            f"stages={','.join(map(str, a.stages))}")
    r = subprocess.run([a.onnxpipe, "partition", model, "--device", a.device, "--sweep", grid, "--out", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"partition --sweep failed:\n{r.stderr[-2000:]}")
    rows = {}
    with open(os.path.join(out, "sweep.csv")) as f:
        for row in csv.DictReader(f):
            key = (int(row["stages"]), int(row["batch"]), int(row["microbatches"]))
            rows[key] = dict(status=row["status"], step_s=float(row["step_ms"]) / 1e3 if row["step_ms"] else None,
                             stage_bytes=[int(x) for x in row["stage_memory_bytes"].split(";") if x])
    return rows


def onnxpipe_run(a, model, data, k, batch, chunks, work):
    """The plan the prediction is of (`partition --out`, the sweep's search for this row), run as written."""
    tag = f"k{k}_b{batch}_c{chunks}"
    metrics, report, plan = (os.path.join(work, tag + s) for s in (".jsonl", "_report", "_plan"))
    r = subprocess.run([a.onnxpipe, "partition", model, "--device", a.device, "--stages", str(k), "--batch", str(batch),
                        "--microbatches", str(chunks), "--out", plan], capture_output=True, text=True)
    if r.returncode != 0:
        return dict(status="OOM" if "does not fit" in r.stderr else "failed", error=(r.stderr or r.stdout)[-500:])
    cmd = [a.onnxpipe, "launch", "--nproc", str(k), "--", "train", model, "--data", data, "--batch", str(batch),
           "--steps", str(a.warmup + a.steps), "--optimizer", "sgd", "--lr", "1e-3", "--plan", plan,
           "--metrics", metrics, "--report", report, "--log-every", "1000000", *a.onnxpipe_flags]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        reason = "OOM" if "out of memory" in (r.stderr + r.stdout) else "failed"
        return dict(status=reason, error=(r.stderr or r.stdout).strip()[-500:])
    steps = [json.loads(l) for l in open(metrics) if '"step"' in l]
    step_s = statistics.median(batch / s["samples_per_s"] for s in steps[a.warmup:])
    measured = json.load(open(os.path.join(report, "measured.json")))
    stage_bytes = []
    for s in measured["stages"]:
        m, p = s["measured"]["memory"], s["predicted"]["memory"]
        stage_bytes.append(m["arena"] + m["accumulators"] + m["kernel_scratch"] + p["parameters"] + p["optimizer_state"])
    return dict(status="ok", step_s=step_s, stage_bytes=stage_bytes)


def torch_rank(rank, a, k, batch, chunks, schedule, tokens, labels, port, out):
    """One rank of the peer: stage `rank` of the classifier, its schedule's steps, its timings and peak memory."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.utils.checkpoint import checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gpu = a.backend == "cuda"
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=k)
    torch.set_num_threads(max(1, os.cpu_count() // k))
    peer = load_peer(a.peer)
    full = peer.build(argparse.Namespace(**vars(a), classes=2, seed=0))
    per = [len(full.layers) // k + (1 if s < len(full.layers) % k else 0) for s in range(k)]
    first = sum(per[:rank])

    class Part(torch.nn.Module):  # the stage's layers; the first adds the embeddings, the last the head
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(full.layers[first:first + per[rank]])
            self.emb, self.pos = (full.emb, full.pos) if rank == 0 else (None, None)
            self.norm, self.head = (full.norm, full.head) if rank == k - 1 else (None, None)

        def forward(self, h):
            if self.emb is not None:
                h = self.emb(h) * (self.emb.embedding_dim ** 0.5) + self.pos
            for layer in self.layers:
                h = checkpoint(layer, h, use_reentrant=False)
            return self.head(self.norm(h).mean(1)) if self.head is not None else h

    part = Part().to(dev).train()
    stage = PipelineStage(part, rank, k, dev)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=chunks, loss_fn=torch.nn.functional.cross_entropy)
    opt = torch.optim.SGD(part.parameters(), lr=1e-3)
    times = []
    for step in range(a.warmup + a.steps):
        rows = slice(step * batch % len(tokens), step * batch % len(tokens) + batch)
        if gpu:
            torch.cuda.synchronize()
        dist.barrier()
        t = time.monotonic()
        opt.zero_grad()
        if rank == 0:
            sched.step(torch.from_numpy(tokens[rows]).to(dev))
        elif rank == k - 1:
            sched.step(target=torch.from_numpy(labels[rows]).to(dev))
        else:
            sched.step()
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        dist.barrier()
        times.append(time.monotonic() - t)
    peak = torch.cuda.max_memory_allocated() if gpu else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(dict(step_s=statistics.median(times[a.warmup:]), peak_bytes=peak), f)
    dist.destroy_process_group()


def torch_run(a, k, batch, chunks, schedule, tokens, labels, work, port):
    import torch.multiprocessing as mp

    out = tempfile.mkdtemp(dir=work)
    try:
        mp.start_processes(torch_rank, args=(a, k, batch, chunks, schedule, tokens, labels, port, out), nprocs=k,
                           join=True, start_method="spawn")
    except Exception as e:  # noqa: BLE001 (a rank's failure: recorded in the row)
        text = str(e)
        return dict(status="OOM" if "out of memory" in text.lower() else "failed", error=text[-500:])
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(k)]
    return dict(status="ok", step_s=max(r["step_s"] for r in ranks), stage_bytes=[r["peak_bytes"] for r in ranks])


def write_html(path, rows, a):
    def cell(r, side):
        if r.get(f"{side}_status") != "ok":
            return f"<td class=x>{html.escape(str(r.get(f'{side}_status', '')))}</td>"
        return f"<td>{r[f'{side}_epoch_s']:.1f} s<br><small>{r[f'{side}_max_stage_mib']:.0f} MiB</small></td>"

    sides = ["predicted", "onnxpipe", *a.peers]
    body = "".join(f"<tr><td>{r['stages']}</td><td>{r['batch']}</td><td>{r['chunks']}</td>"
                   + "".join(cell(r, s) for s in sides) + "</tr>" for r in rows)
    best = {}
    for r in rows:
        if r.get("onnxpipe_status") == "ok":
            best[r["stages"]] = min(best.get(r["stages"], 1e30), r["onnxpipe_epoch_s"])
    bars = "".join(f"<div>K={k}: fastest onnxpipe epoch {v:.1f} s</div>" for k, v in sorted(best.items()))
    with open(path, "w") as f:
        f.write("<!doctype html><meta charset=utf-8><title>seed sweep</title><style>td,th{padding:2px 8px;"
                "border:1px solid #ccc;text-align:right}.x{color:#b00}</style><h2>Time per epoch of 25,000 samples and "
                "the largest stage's memory</h2>" + bars + "<table><tr><th>K</th><th>batch</th><th>chunks</th>"
                + "".join(f"<th>{s}</th>" for s in sides) + "</tr>" + body + "</table>")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", required=True, help="torch_peer.py (the model and its export)")
    p.add_argument("--onnxpipe", default=os.path.join(ROOT, ".build/main/tools/onnxpipe"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dhid", type=int, default=512)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--peers", nargs="*", default=["gpipe", "1f1b"], choices=["gpipe", "1f1b"])
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--device", default="cpu", help="partition's device profile (cpu, h100-80gb, ...)")
    p.add_argument("--onnxpipe-flags", nargs="*", default=[])
    p.add_argument("--tag", default="cpu")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = p.parse_args()
    if a.backend == "cuda":
        a.onnxpipe_flags = ["--backend", "cuda", "--device", "0", *a.onnxpipe_flags]
    rows = []
    with tempfile.TemporaryDirectory(prefix="seed_sweep_") as work:
        model = os.path.join(work, "enc.onnx")
        subprocess.run([sys.executable, a.peer, "--layers", str(a.layers), "--d", str(a.d), "--heads", str(a.heads),
                        "--dhid", str(a.dhid), "--seq", str(a.seq), "--vocab", str(a.vocab), "--export-onnx", model],
                       check=True, capture_output=True)
        rng = np.random.default_rng(0)
        rows_needed = max(a.batch) * (a.warmup + a.steps)
        tokens = rng.integers(0, a.vocab, (rows_needed, a.seq), dtype=np.int64)
        labels = rng.integers(0, 2, (rows_needed,), dtype=np.int64)
        data = os.path.join(work, "data")
        os.makedirs(data)
        np.save(os.path.join(data, "tokens.npy"), tokens)
        np.save(os.path.join(data, "labels.npy"), labels)
        pred = predicted(a, model, work)
        port = 29600
        for k in a.stages:
            for batch in a.batch:
                for chunks in a.chunks:
                    if batch % chunks:
                        continue
                    row = dict(stages=k, batch=batch, chunks=chunks)
                    results = dict(predicted=pred.get((k, batch, chunks), dict(status="missing")),
                                   onnxpipe=onnxpipe_run(a, model, data, k, batch, chunks, work))
                    for s in a.peers:
                        port += 1
                        results[s] = torch_run(a, k, batch, chunks, s, tokens, labels, work, port)
                    for side, r in results.items():
                        row[f"{side}_status"] = r["status"]
                        if r.get("error"):
                            row[f"{side}_error"] = " ".join(r["error"].split())[-200:]
                        if r["status"] == "ok" and r.get("step_s"):
                            row[f"{side}_epoch_s"] = round(r["step_s"] * EPOCH / batch, 2)
                            row[f"{side}_stage_mib"] = ";".join(f"{b / 2**20:.1f}" for b in r["stage_bytes"])
                            row[f"{side}_max_stage_mib"] = round(max(r["stage_bytes"]) / 2**20, 1)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    write_files(rows, a)  # after every row: a run cut short keeps what it measured


def write_files(rows, a):
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"seed_sweep_{datetime.date.today():%Y%m%d}_{a.tag}")
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("stages", "batch", "chunks"), k))
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    write_html(stem + ".html", rows, a)


if __name__ == "__main__":
    main()
