#!/usr/bin/env python3
"""Where a training step's GPU time goes, from Nsight Compute's per-kernel durations.

Reads the CSV that

  ncu --metrics gpu__time_duration.sum --csv --print-units base [--launch-count N] onnxpipe train ... --no-cuda-graphs

prints (the program's own output lines around the CSV are skipped) and writes the kernels grouped by name (the
function's name without namespaces, template arguments or parameters: NormBackwardKernel, MapKernel, or cuBLASLt's
and cuDNN's kernel names as they are) and by family (GEMM, attention, onnxpipe's own kernels, other), in ms, the
longest first. ncu serialises kernels and runs them at base clocks unless told otherwise, so the total exceeds the
step's real time; the shares are what this summary is for.

  python3 bench/ncu_summary.py ncu.csv --device "NVIDIA H100 80GB HBM3" --command "..." --out summary.json
"""
import argparse
import csv
import datetime
import json
import re
import sys

UNIT_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3,
           "s": 1e3}

FAMILIES = (  # first match wins
    ("gemm (cuBLASLt)", re.compile(r"^(nvjet|sm\d+_xmma|cutlass|ampere_|hopper_|gemm|gemv|splitKreduce)", re.I)),
    ("attention", re.compile(r"^cudnn|sdpa|fmha|flash", re.I)),
    ("onnxpipe kernels", re.compile(r"^onnxpipe::")),
)


def base_name(kernel):
    """The kernel function's qualified name without template arguments, parameters or a leading return type."""
    name = kernel.replace("(anonymous namespace)", "").strip()
    if name.startswith("void "):
        name = name[5:]
    depth, end = 0, len(name)
    for i, c in enumerate(name):  # the first '<' or '(' outside template arguments ends the name
        if c in "<(" and depth == 0:
            end = i
            break
    name = name[:end]
    return re.sub(r"::+", "::", name).strip(":")


def family(qualified):
    for label, pattern in FAMILIES:
        if pattern.search(qualified):
            return label
    return "other"


def read_rows(lines):
    """(kernel name, ms) for every gpu__time_duration.sum row of ncu's CSV within `lines`."""
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID","Process ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (\"ID\",\"Process ID\",...) found: was ncu run with --csv?")
    header = next(csv.reader([lines[start]]))
    need = ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
    missing = [c for c in need if c not in header]
    if missing:
        raise ValueError(f"ncu CSV header lacks {missing}")
    col = {c: header.index(c) for c in need}
    rows = []
    for n, fields in enumerate(csv.reader(l for l in lines[start + 1:] if l.startswith('"')), start + 2):
        if len(fields) != len(header) or fields[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        unit = fields[col["Metric Unit"]]
        if unit not in UNIT_MS:
            raise ValueError(f"line {n}: unknown time unit {unit!r}")
        value = float(fields[col["Metric Value"]].replace(",", ""))
        rows.append((fields[col["Kernel Name"]], value * UNIT_MS[unit]))
    return rows


def summarise(rows):
    by_name, families = {}, {}
    for kernel, ms in rows:
        qualified = base_name(kernel)
        short = qualified.rsplit("::", 1)[-1]
        entry = by_name.setdefault(short, {"kernel": short, "family": family(qualified), "calls": 0, "ms": 0.0})
        entry["calls"] += 1
        entry["ms"] += ms
        families[entry["family"]] = families.get(entry["family"], 0.0) + ms
    kernels = sorted(by_name.values(), key=lambda e: -e["ms"])
    for e in kernels:
        e["ms"] = round(e["ms"], 4)
    return dict(kernels=len(rows), total_ms=round(sum(ms for _, ms in rows), 4),
                families_ms={k: round(v, 4) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
                kernels_ms=kernels)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="ncu's output (stdout of the ncu command)")
    p.add_argument("--device", default="", help="the GPU, for the record")
    p.add_argument("--command", default="", help="the profiled command, for the record")
    p.add_argument("--out", help="write the summary here (default: print it)")
    a = p.parse_args(argv)
    try:
        with open(a.csv, errors="replace") as f:
            lines = f.read().splitlines()
        summary = summarise(read_rows(lines))
    except (OSError, ValueError) as e:
        print(f"ncu_summary: {a.csv}: {e}", file=sys.stderr)
        return 1
    result = dict(benchmark="ncu_summary", date=datetime.date.today().isoformat(), device=a.device,
                  command=a.command, **summary)
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
