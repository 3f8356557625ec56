#!/usr/bin/env python3
"""Resident memory of `onnxpipe train` (CPU backend) against the plan: runs `onnxpipe partition --stages 1` for the
run's batch and optimizer, then the training itself, and records the training process's peak resident set
(getrusage of the child) beside plan.json's stage total and the model file's size. The stage executor holds the
parameters and the optimizer state once, in the plan's regions, so the peak should stay within 10% of the plan plus
the model file (the importer reads the file once).

  python3 bench/train_memory_bench.py --model enc24.onnx --data DATA --batch 4 --optimizer adamw --tag 2-core-cpu-vm
DATA: a folder of tokens.npy / labels.npy (`onnxpipe train --data`).
"""
import argparse
import datetime
import json
import os
import resource
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnxpipe", default=os.path.join(ROOT, ".build/main/tools/onnxpipe"))
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--optimizer", default="adamw", choices=["sgd", "adamw"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--tag", default="cpu")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="train_memory_") as work:
        subprocess.run([a.onnxpipe, "partition", a.model, "--stages", "1", "--batch", str(a.batch), "--optimizer",
                        a.optimizer, "--no-onnx", "--out", work], check=True, capture_output=True)
        memory = json.load(open(os.path.join(work, "plan.json")))["stages"][0]["memory"]
    cmd = [a.onnxpipe, "train", a.model, "--data", a.data, "--batch", str(a.batch), "--steps", str(a.steps),
           "--optimizer", a.optimizer, "--lr", "0.001"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"onnxpipe train failed: {r.stderr.strip()[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
    model_bytes = os.path.getsize(a.model)
    bound = memory["total"] + model_bytes
    result = dict(benchmark="train_memory", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=a.tag, model=os.path.basename(a.model), model_bytes=model_bytes, batch=a.batch,
                  optimizer=a.optimizer, plan_memory=memory, plan_total_bytes=memory["total"],
                  peak_resident_bytes=peak, peak_over_plan=round(peak / memory["total"], 4),
                  peak_over_plan_plus_model=round(peak / bound, 4),
                  memory_line=next((l for l in r.stdout.splitlines() if l.startswith("memory:")), ""),
                  command=" ".join(["onnxpipe", *cmd[1:]]).replace(a.model, os.path.basename(a.model))
                  .replace(a.data, "DATA"))
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.splitext(os.path.basename(a.model))[0]
    path = os.path.join(a.out, f"train_memory_{datetime.date.today():%Y%m%d}_{a.tag}_{stem}_{a.optimizer}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("plan_total_bytes", "peak_resident_bytes", "peak_over_plan",
                                             "peak_over_plan_plus_model")}))
    print("wrote", path)


if __name__ == "__main__":
    main()
