#!/usr/bin/env python3
"""bf16 attention speed: onnxpipe's attention kernels against PyTorch's bf16 SDPA, same GPU, one run.

Runs `attention_bench ITER flash-bf16` (the flash kernels through flash_attention.h, B 256, S 256, head dims 64 and
128; plain, causal, dropout 0.1) and `attention_bench ITER bf16` (cuDNN SDPA through attention.h: the encoder shape
and the causal Llama shapes, grouped-query and (B, S, H, D)-strided; `--which` picks) and collects their
`json {...}` lines, then times
torch.nn.functional.scaled_dot_product_attention on bf16 CUDA tensors of the same shapes, forward and
forward+backward, with each SDPA backend PyTorch offers for the case (flash, cuDNN, efficient; default selection
too). Milliseconds are CUDA-event means over ITER calls after as many warm-up calls, as attention_bench times.
Writes bench/results/attention_bf16_<date>_<tag>.json with every number and the ratios onnxpipe / best PyTorch.

  python3 bench/attention_bench.py --bench .build/main/bench/attention_bench --tag h200
"""
import argparse
import datetime
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def onnxpipe_cases(bench, iterations, which):
    cases = []
    for mode in which:
        out = subprocess.run([bench, str(iterations), mode], check=True, capture_output=True, text=True).stdout
        print(out, end="")
        cases += [json.loads(line[len("json "):]) for line in out.splitlines() if line.startswith("json ")]
    return cases


def torch_times(case, iterations):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    b, h, s, d = case["b"], case["h"], case["s"], case["d"]
    hkv = case.get("hkv", h)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def operand(heads):  # (B, H, S, D), through (B, S, H, D) memory where the case says so
        shape = (b, s, heads, d) if case.get("bshd") else (b, heads, s, d)
        t = torch.empty(shape, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
        return (t.transpose(1, 2) if case.get("bshd") else t).detach().requires_grad_(True)

    q, k, v, d_o = operand(h), operand(hkv), operand(hkv), operand(h).detach()
    gqa = {"enable_gqa": True} if hkv != h else {}

    def forward():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=case["dropout"], is_causal=case["causal"], **gqa)

    def forward_backward():
        o = forward()
        torch.autograd.backward(o, d_o, inputs=[q, k, v])

    def time_ms(f):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = 0.0
        for _ in range(2):  # the first pass warms up
            start.record()
            for _ in range(iterations):
                f()
            stop.record()
            stop.synchronize()
            ms = start.elapsed_time(stop) / iterations
        return ms

    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    results = {}
    for name, backend in backends.items():
        try:
            if backend is None:
                results[name] = {"forward_ms": time_ms(forward), "forward_backward_ms": time_ms(forward_backward)}
            else:
                with sdpa_kernel(backend):
                    results[name] = {"forward_ms": time_ms(forward), "forward_backward_ms": time_ms(forward_backward)}
        except RuntimeError as e:  # the backend does not take this case (e.g. cuDNN with dropout)
            results[name] = {"error": str(e).splitlines()[0][:200]}
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=os.path.join(ROOT, ".build/main/bench/attention_bench"))
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--which", default="flash-bf16,bf16",
                    help="attention_bench modes, comma-separated: flash-bf16 (flash kernels), bf16 (cuDNN)")
    ap.add_argument("--out", help="JSON path (default bench/results/attention_bf16_<date>_<tag>.json)")
    a = ap.parse_args()

    cases = onnxpipe_cases(a.bench, a.iterations, a.which.split(","))
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    for case in cases:
        if torch_version is None:
            break
        case["torch"] = torch_times(case, a.iterations)
        best = min((r["forward_backward_ms"] for r in case["torch"].values() if "forward_backward_ms" in r),
                   default=None)
        if best:
            case["onnxpipe_over_best_torch_forward_backward"] = case["forward_backward_ms"] / best
        print(json.dumps(case))

    result = {"date": datetime.date.today().isoformat(), "tag": a.tag, "iterations": a.iterations,
              "torch": torch_version, "gpu": torch.cuda.get_device_name() if torch_version else None, "cases": cases}
    out = a.out or os.path.join(ROOT, "bench", "results",
                                f"attention_bf16_{datetime.date.today().strftime('%Y%m%d')}_{a.tag}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
