#!/usr/bin/env python3
"""Multi-process CPU ranks against the one-process pipeline: for each K, `onnxpipe train --stages K` (stages on
threads of one process) and `onnxpipe launch --nproc K -- train --stages K` (one process per stage, TCP comm) on the
same model, data and flags, alternating runs. Records whole-process wall time, the step-to-step time (median over
steps after the first, from --metrics), the one process's peak resident set and the largest rank's, and whether the
losses agree bit for bit.

  python3 bench/multiprocess_cpu_bench.py --model models/tiny_gpt.onnx --data models/golden/tiny_gpt/data \\
      --batch 8 --microbatches 4 --steps 30 --stages 2 4 --tag 2-core-cpu-vm -- --logits logits --freeze 'attn\\.mask$'
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs a command and prints the peak resident set (KiB) of the largest process it waited for, and its wall time.
_PEAK = ("import resource, subprocess, sys, time\n"
         "t = time.monotonic(); r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
         "print(r.returncode, time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
         "sys.stderr.write(r.stderr)\n")


def run(cmd):
    r = subprocess.run([sys.executable, "-c", _PEAK, *cmd], capture_output=True, text=True)
    code, wall, peak_kib = r.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return float(wall), int(peak_kib) * 1024


def steps(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if '"step"' in line]
    return rows


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnxpipe", default=os.path.join(ROOT, ".build/main/tools/onnxpipe"))
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tag", default="cpu")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    p.add_argument("--plan", action="store_true",
                   help="run `partition --out PLAN` first and train with --plan PLAN: the ranks build their stages from "
                        "its stage_<k>.program files (the one process from the training graph); the flags after -- "
                        "go to partition too")
    a = p.parse_args(argv)
    base = ["train", a.model, "--data", a.data, "--batch", str(a.batch), "--steps", str(a.steps), "--microbatches",
            str(a.microbatches), "--optimizer", "adamw", "--lr", "1e-3", *extra]
    rows = []
    with tempfile.TemporaryDirectory(prefix="mp_bench_") as work:
        for k in a.stages:
            args = base + ["--stages", str(k)]
            if a.plan:
                plan = os.path.join(work, f"plan_{k}")
                subprocess.run([a.onnxpipe, "partition", a.model, "--stages", str(k), "--batch", str(a.batch),
                                "--microbatches", str(a.microbatches), "--optimizer", "adamw", "--device", "cpu",
                                "--out", plan, *extra], check=True, capture_output=True)
                args = base + ["--plan", plan]
            ways = {"threads": [a.onnxpipe, *args], "processes": [a.onnxpipe, "launch", "--nproc", str(k), "--", *args]}
            got = {w: {"wall_s": [], "step_s": [], "peak_bytes": []} for w in ways}
            losses = {}
            for rep in range(a.repeats):
                for way, cmd in ways.items():
                    metrics = os.path.join(work, f"{way}_{k}_{rep}.jsonl")
                    wall, peak = run(cmd + ["--metrics", metrics])
                    s = steps(metrics)
                    got[way]["wall_s"].append(wall)
                    got[way]["step_s"].append(statistics.median(a.batch / r["samples_per_s"] for r in s[1:]))
                    got[way]["peak_bytes"].append(peak)
                    losses[way] = [(r["loss"], r["grad_norm"]) for r in s]
            row = {"stages": k, "bitwise_equal_losses": losses["threads"] == losses["processes"]}
            for way in ways:
                row[way] = {key: statistics.median(v) for key, v in got[way].items()}
            row["process_step_over_thread_step"] = round(row["processes"]["step_s"] / row["threads"]["step_s"], 4)
            row["largest_rank_peak_over_one_process_peak"] = round(
                row["processes"]["peak_bytes"] / row["threads"]["peak_bytes"], 4)
            rows.append(row)
            print(json.dumps(row))
    result = dict(benchmark="multiprocess_cpu",
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), device=a.tag,
                  model=os.path.basename(a.model), batch=a.batch, microbatches=a.microbatches, steps=a.steps,
                  repeats=a.repeats, command=" ".join(["onnxpipe", *base[:1], os.path.basename(a.model), *base[2:]]),
                  rows=rows)
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.splitext(os.path.basename(a.model))[0]
    path = os.path.join(a.out, f"multiprocess_cpu_{datetime.date.today():%Y%m%d}_{a.tag}_{stem}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
