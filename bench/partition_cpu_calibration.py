#!/usr/bin/python3
"""CPU cost-model benchmark (not a test): how far the partitioner's prediction for the CPU backend is
from a measured pipelined run of the same plan.

1. Calibration: `onnxpipe profile` measures every node of one model's training graph (a classifier,
   d 256, 4 layers) and fits the roofline to it (--device-out, partitioner/calibrate.h).
2. Validation, on other architectures and shapes than the calibration model (a GPT with a tied
   embedding, a BERT with a padding mask, a wider classifier): `onnxpipe partition --device cpu`
   (the built-in profile) and `--device <calibrated file>` predict each stage's forward and backward
   time per micro-batch; `onnxpipe train --plan --report` runs the plan on the CPU backend and
   measures them. The ratio measured / predicted per stage, and of the step, is the result.

The pipelined executor runs its stages as threads of one process on the same cores, while the
prediction assumes one device per stage; with 2 stages on a 2-core machine each stage has about one
core, so the K = 1 rows compare one stage with the whole machine, the K = 2 rows the split.

    bench/partition_cpu_calibration.py [--bin ONNXPIPE] [--device-label "2-core CPU VM"] [--work DIR]

Writes bench/results/cpu_calibration_<date>_<label>.json.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"

CALIBRATION = ("cls256", "--family classifier --layers 4 --d-model 256 --heads 4 --seq 64 --vocab 2000")
VALIDATION = [
    ("gpt192", "--family gpt --layers 4 --d-model 192 --heads 4 --seq 64 --vocab 1024"),
    ("bert128", "--family bert --layers 3 --d-model 128 --heads 4 --seq 64 --vocab 1000"),
    ("cls384", "--family classifier --layers 2 --d-model 384 --heads 6 --seq 64 --vocab 4000"),
]
BATCH, MICROBATCHES, SEQ, STEPS = 16, 4, 64, 4


def run(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {cmd}\n{r.stderr}")
    return r.stdout


def export(work, name, flags):
    model = os.path.join(work, name + ".onnx")
    if not os.path.exists(model):
        run(f"{PY} {ROOT}/models/export.py {flags} --out {model}")
    return model, json.load(open(os.path.join(work, name + ".json")))


def write_data(folder, sidecar, rows):
    """Random token ids, all-ones masks, and labels shaped by the loss (per token or per sample)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for inp in sidecar["inputs"]:
        if "mask" in inp["name"]:
            data = np.ones((rows, SEQ), dtype=np.int64)
        else:
            data = rng.integers(0, sidecar["vocab"], size=(rows, SEQ), dtype=np.int64)
        np.save(os.path.join(folder, inp["name"] + ".npy"), data)
    classes = sidecar["vocab"] if sidecar["loss"]["per"] == "token" else sidecar["classes"]
    shape = (rows, SEQ) if sidecar["loss"]["per"] == "token" else (rows,)
    np.save(os.path.join(folder, "labels.npy"), rng.integers(0, classes, size=shape, dtype=np.int64))


def compare(args, work, name, model, sidecar, device, stages):
    tag = f"{name}_{os.path.basename(device).replace('.json', '')}_k{stages}"
    plan_dir, report = os.path.join(work, "plan_" + tag), os.path.join(work, "report_" + tag)
    freeze = f" --freeze '{sidecar['freeze_regex']}'" if sidecar.get("freeze_regex") else ""
    run(f"{args.bin} partition {model} --stages {stages} --batch {BATCH} --microbatches {MICROBATCHES} "
        f"--seq {SEQ} --schedule 1f1b --device {device} --no-onnx{freeze} --out {plan_dir}")
    data = os.path.join(work, "data_" + name)
    write_data(data, sidecar, BATCH * STEPS)
    run(f"{args.bin} train {model} --data {data} --batch {BATCH} --steps {STEPS} --optimizer sgd --lr 0.01"
        f"{freeze} --plan {plan_dir} --report {report}")
    plan = json.load(open(os.path.join(plan_dir, "plan.json")))
    measured = json.load(open(os.path.join(report, "measured.json")))
    rows = []
    for s, ps in zip(measured["stages"], plan["stages"]):
        meas = s["measured"]["forward_ms"] + s["measured"]["backward_ms"] + s["measured"]["recompute_ms"]
        pred = ps["predicted"]["forward_ms"] + ps["predicted"]["backward_ms"] + ps["predicted"]["recompute_ms"]
        rows.append({"stage": s["index"], "measured_ms": round(meas, 3), "predicted_ms": round(pred, 3),
                     "ratio": round(meas / pred, 3)})
    step_s = statistics.median(x["seconds"] for x in measured["steps"][1:])  # the first step warms up
    return {"model": name, "device": os.path.basename(device), "stages": stages,
            "per_microbatch_compute": rows,
            "step": {"measured_ms": round(step_s * 1e3, 2), "predicted_ms": round(plan["predicted"]["step_ms"], 2),
                     "ratio": round(step_s * 1e3 / plan["predicted"]["step_ms"], 3)}}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, ".build/main/tools/onnxpipe"))
    p.add_argument("--device-label", default=f"{os.cpu_count()}-core CPU",
                   help="what the machine is, for the results file (no host names)")
    p.add_argument("--work", default="/tmp/onnxpipe_cpu_calibration")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)

    model, _ = export(args.work, *CALIBRATION)
    calibrated = os.path.join(args.work, "cpu_calibrated.json")
    out = run(f"{args.bin} profile {model} --batch 8 --seq {SEQ} --repeats 3 --out "
              f"{os.path.join(args.work, 'times.json')} --device-out {calibrated}")
    line = next(l for l in out.splitlines() if l.startswith("calibrated roofline"))
    print(line)

    results = []
    for name, flags in VALIDATION:
        model, sidecar = export(args.work, name, flags)
        for device in ("cpu", calibrated):
            for stages in (1, 2):
                r = compare(args, args.work, name, model, sidecar, device, stages)
                print(json.dumps(r))
                results.append(r)

    ratios = {}
    for r in results:
        ratios.setdefault(r["device"], []).extend(x["ratio"] for x in r["per_microbatch_compute"])
    summary = {d: {"median": round(statistics.median(v), 3), "min": min(v), "max": max(v)} for d, v in ratios.items()}
    print("measured / predicted stage compute:", json.dumps(summary))
    label = re.sub(r"[^a-z0-9]+", "-", args.device_label.lower()).strip("-")
    path = os.path.join(ROOT, "bench", "results",
                        f"cpu_calibration_{datetime.datetime.utcnow():%Y%m%d}_{label}.json")
    doc = {
        "benchmark": "partitioner CPU cost model: predicted vs measured per-stage compute and step",
        "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": run(f"git -C {ROOT} rev-parse --short HEAD").strip(),
        "device": args.device_label, "cores": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
        "config": {"batch": BATCH, "microbatches": MICROBATCHES, "seq": SEQ, "schedule": "1f1b", "steps": STEPS},
        "calibration_model": CALIBRATION[1], "calibration": line,
        "validation_models": dict(VALIDATION),
        "summary_measured_over_predicted": summary, "runs": results,
    }
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print("wrote", path)


if __name__ == "__main__":
    main()
