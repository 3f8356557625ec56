#!/usr/bin/env python3
"""bench/ncu_summary.py on a CSV laid out as ncu prints it (the program's own lines and ncu's ==PROF== lines around
it, kernel names with commas inside template arguments, durations in several units), against hand-summed totals."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "ncu_summary.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, kernel, unit, value, metric="gpu__time_duration.sum"):
    return (f'"{i}","7","onnxpipe","127.0.0.1","{kernel}","1","13","(128, 1, 1)","(512, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


NORM = ("void onnxpipe::cuda::(anonymous namespace)::NormBackwardKernel<__nv_bfloat16, 8, 1, 0>"
        "(onnxpipe::cuda::NormBackwardArgs<__nv_bfloat16>, long, onnxpipe::cuda::(anonymous namespace)::RowDropout)")
MAP = "void onnxpipe::cuda::MapKernel<8, onnxpipe::cuda::GeluFn<false>, __nv_bfloat16>(long, float)"
GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0"
CUB = "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, long, unsigned int>::Policy900>(int)"

LINES = [
    "==PROF== Connected to process 7 (onnxpipe)",
    "step 1/1 loss 0.693",
    "==PROF== Profiling \"NormBackwardKernel\": 0%....50%....100% - 1 pass",
    HEADER,
    row(0, NORM, "nsecond", "250,000"),
    row(1, MAP, "usecond", "600.5"),
    row(2, NORM, "nsecond", "260000"),
    row(3, GEMM, "msecond", "1.25"),
    row(4, SDPA, "nsecond", "500000"),
    row(5, CUB, "nsecond", "4000"),
    row(6, GEMM, "nsecond", "1000000", metric="sm__cycles_elapsed.avg"),  # another metric: not a duration
    "cuda memory: peak 52.7 GiB",
]


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as work:
        csv_path = os.path.join(work, "ncu.csv")
        with open(csv_path, "w") as f:
            f.write("\n".join(LINES) + "\n")
        out = os.path.join(work, "summary.json")
        r = run(csv_path, "--device", "GPU", "--out", out)
        assert r.returncode == 0, r.stderr
        s = json.load(open(out))
        assert s["kernels"] == 6, s
        # 0.25 + 0.6005 + 0.26 + 1.25 + 0.5 + 0.004 ms
        assert abs(s["total_ms"] - 2.8645) < 1e-9, s["total_ms"]
        by = {k["kernel"]: k for k in s["kernels_ms"]}
        assert set(by) == {"NormBackwardKernel", "MapKernel", GEMM, SDPA, "DeviceRadixSortOnesweepKernel"}, by
        assert by["NormBackwardKernel"]["calls"] == 2 and abs(by["NormBackwardKernel"]["ms"] - 0.51) < 1e-9
        assert by["NormBackwardKernel"]["family"] == "onnxpipe kernels"
        assert by["MapKernel"]["family"] == "onnxpipe kernels" and abs(by["MapKernel"]["ms"] - 0.6005) < 1e-9
        assert by[GEMM]["family"] == "gemm (cuBLASLt)" and by[GEMM]["calls"] == 1
        assert by[SDPA]["family"] == "attention"
        assert by["DeviceRadixSortOnesweepKernel"]["family"] == "other"
        assert list(s["families_ms"]) == ["gemm (cuBLASLt)", "onnxpipe kernels", "attention", "other"], s
        assert abs(s["families_ms"]["onnxpipe kernels"] - 1.1105) < 1e-9
        assert [k["kernel"] for k in s["kernels_ms"]][0] == GEMM  # longest first

        # Not ncu's CSV, a missing file, an unknown unit: errors naming the file and the problem.
        bad = os.path.join(work, "bad.csv")
        with open(bad, "w") as f:
            f.write("step 1/1 loss 0.693\n")
        r = run(bad)
        assert r.returncode == 1 and "bad.csv" in r.stderr and "--csv" in r.stderr, r.stderr
        r = run(os.path.join(work, "absent.csv"))
        assert r.returncode == 1 and "absent.csv" in r.stderr, r.stderr
        with open(bad, "w") as f:
            f.write("\n".join([HEADER, row(0, MAP, "furlong", "1")]) + "\n")
        r = run(bad)
        assert r.returncode == 1 and "furlong" in r.stderr and "line 2" in r.stderr, r.stderr
    print("ncu_summary_test: ok")


if __name__ == "__main__":
    main()
