#!/usr/bin/python3
"""CPU training throughput: `onnxpipe train` against PyTorch eager on the same model, in one run.

Both train models/tiny_classifier.onnx's model (PyTorch: models/modeling.py's module built from the sidecar, with
the ONNX initializers loaded) on the same random token data: same batch, sequence length, AdamW, dropout on, the
same number of threads (ONNXPIPE_NUM_THREADS / OPENBLAS_NUM_THREADS for onnxpipe, torch.set_num_threads for
PyTorch). samples/s is the median over the steps after --warmup. Writes bench/results/train_cpu_<date>_<tag>.json.

PyTorch runs with OMP_WAIT_POLICY=PASSIVE unless the environment sets it: Debian's torch uses libgomp, whose
spinning idle threads lose their time slices on a loaded shared VM (measured here: 10 samples/s spinning vs 112
passive for the same step), which would measure the machine's load rather than PyTorch.

  /usr/bin/python3 bench/train_cpu_bench.py --device "2-core CPU VM" --tag vm
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP runtime (see above)
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "models"))
import modeling  # noqa: E402
import torch_reference  # noqa: E402


def onnxpipe_rate(a, model, data_dir, threads):
    metrics = os.path.join(data_dir, "metrics.jsonl")
    cmd = [a.onnxpipe, "train", model, "--data", data_dir, "--batch", str(a.batch), "--steps",
           str(a.warmup + a.steps), "--optimizer", "adamw", "--lr", "0.001", "--freeze", "^pos\\.table$",
           "--seed", "0", "--metrics", metrics, "--log-every", "1000000"]
    env = dict(os.environ, ONNXPIPE_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(metrics)]
    shown = " ".join(cmd).replace(data_dir, "DATA")  # DATA: the temporary folder of random tokens
    return statistics.median(r["samples_per_s"] for r in rows[a.warmup:]), shown


def torch_rate(a, model_path, tokens, labels, threads):
    torch.set_num_threads(threads)
    cfg = torch_reference.load_sidecar(model_path)
    model = modeling.build(cfg)
    torch_reference.load_onnx_weights(model, model_path)
    model.train()  # dropout on, as in onnxpipe's default
    params = [p for n, p in model.named_parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    x, y = torch.from_numpy(tokens), torch.from_numpy(labels)
    rates = []
    n = x.shape[0]
    for k in range(a.warmup + a.steps):
        idx = [(k * a.batch + j) % n for j in range(a.batch)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        rates.append(a.batch / (time.perf_counter() - t0))
    return statistics.median(rates[a.warmup:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnxpipe", default=os.path.join(ROOT, ".build/main/tools/onnxpipe"))
    p.add_argument("--model", default=os.path.join(ROOT, "models/tiny_classifier.onnx"))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", required=True, help='e.g. "2-core CPU VM"')
    p.add_argument("--tag", required=True, help="file name tag, e.g. vm")
    p.add_argument("--notes", default="")
    a = p.parse_args()

    cfg = torch_reference.load_sidecar(a.model)
    rng = np.random.default_rng(0)
    rows = 256
    tokens = rng.integers(2, cfg["vocab"], size=(rows, a.seq), dtype=np.int64)
    labels = rng.integers(0, cfg["classes"], size=(rows,), dtype=np.int64)
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "tokens.npy"), tokens)
        np.save(os.path.join(d, "labels.npy"), labels)
        ours, cmd = onnxpipe_rate(a, a.model, d, a.threads)
    theirs = torch_rate(a, a.model, tokens, labels, a.threads)
    now = datetime.datetime.now(datetime.timezone.utc)
    result = {
        "benchmark": "train_cpu",
        "date": now.isoformat(timespec="seconds"),
        "device": a.device,
        "model": os.path.relpath(a.model, ROOT),
        "batch": a.batch, "seq": a.seq, "optimizer": "adamw", "dropout": True, "threads": a.threads,
        "steps_timed": a.steps, "warmup_steps": a.warmup,
        "onnxpipe_samples_per_s": round(ours, 2),
        "torch_samples_per_s": round(theirs, 2),
        "ratio_onnxpipe_over_torch": round(ours / theirs, 3),
        "torch": torch.__version__,
        "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "onnxpipe_command": cmd.replace(ROOT + "/", ""),
        "command": (f'/usr/bin/python3 bench/train_cpu_bench.py --device "{a.device}" --tag {a.tag} --threads {a.threads} '
                    f"--batch {a.batch} --seq {a.seq} --steps {a.steps} --warmup {a.warmup}"),
        "notes": a.notes,
    }
    out = os.path.join(ROOT, "bench", "results", f"train_cpu_{now.strftime('%Y%m%d_%H%M%S')}_{a.tag}.json")
    with open(out + ".tmp", "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(out + ".tmp", out)
    print(json.dumps(result, indent=1))
    print("wrote", os.path.relpath(out, ROOT))


if __name__ == "__main__":
    main()
