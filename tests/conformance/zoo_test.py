#!/usr/bin/python3
"""One model of the export corpus (tests/data/zoo/<name>, written by models/export_zoo.py) through the onnxpipe CLI,
against the PyTorch references stored beside it:

  1. `onnxpipe inspect --check --json` succeeds (every op imported, shapes inferred);
  2. `onnxpipe run` in fp64 and fp32 on forward/inputs equals PyTorch's float64 logits (fp64: 1e-7, fp32: 1e-5,
     relative to the largest |logit|, elementwise; fp64 is not tighter because the graphs hold float32 constants,
     e.g. RMSNorm's eps and attention scales, which move float64 logits by up to ~1e-8; a half-precision export
     holds its constants (GELU's, eps) in half precision, so its fp64 tolerance is fp32's);
  3. the initializers `onnxpipe inspect` reports frozen by the trainable-parameter rule (no regex) are exactly the
     sidecar's `freeze` list (PyTorch's buffers and exporter constants: float initializers that are not one of the
     module's parameters), less those named in the freeze-by-flag file (--freeze-by-flag): exporter constants
     that no graph rule can tell from a parameter, which the training runs freeze with --freeze;
  4. `onnxpipe train` (dropout off, no --freeze but for the freeze-by-flag names) gives PyTorch's per-step losses
     for SGD with momentum and AdamW, 1e-7 relative in fp64 (--fp64-loss-tol) and 1e-4 in fp32;
  5. `onnxpipe inspect` at the training batch and sequence length fuses one Attention per attention block (one per
     layer; an encoder-decoder's decoder layers have two, self and cross) and leaves no Softmax, and lists the fused
     ops per layer with one Attention in each layer that has attention, and, for a rotary family, one Rotary per
     query and key and no Neg left; for a gated-MLP family (SwiGLU, GeGLU), one GatedActivation per layer, listed
     in that layer, and no Sigmoid or Gelu left;
  6. `onnxpipe train --dtype bf16` (mixed precision) with the fp32 AdamW run's settings gives PyTorch's fp32 losses
     within 2e-2 relative (bf16 keeps 8 significant bits);
  7. with --pipeline-stages K (repeatable): the fp64 AdamW run pipelined over K stages (2 micro-batches; 1 for an export with a
     fixed batch) gives the unpartitioned run's losses within 1e-12 relative (micro-batching only reorders sums);
  8. with --backend cuda (on a GPU): instead of 2-7, the fp32 runs of 4 and the bf16 run of 6 on the GPU, to the
     same tolerances, with no node run on the host.

  /usr/bin/python3 tests/conformance/zoo_test.py --onnxpipe BUILD/tools/onnxpipe tests/data/zoo/llama_o17_fixed
Prints one line per check and `N passed, N failed`; exit 1 on any failure. Known failures are listed with their
reason in tests/data/zoo/expected_failures.txt as `<model> <check prefix> <reason>`; such a check counts as passed
only while it still fails (an expected failure that passes is a failure: the list must stay true).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

FORWARD_TOL = {"fp64": 1e-7, "fp32": 1e-5}
LOSS_TOL = {"float64": 1e-7, "float32": 1e-4}
REGEX_SPECIAL = set("\\^$.|?*+()[]{}")


def regex_of_names(names):
    """An ECMAScript regex matching exactly these names."""
    esc = ["".join("\\" + c if c in REGEX_SPECIAL else c for c in n) for n in names]
    return "^(" + "|".join(esc) + ")$"


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def load_expected(path):
    """{(model, check prefix): reason} from the expectations file (tab-separated: model, check prefix, reason)."""
    out = {}
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line and not line.startswith("#"):
                    model, prefix, reason = line.split("\t")
                    out[(model, prefix)] = reason
    return out


class Checker:
    def __init__(self, name, expected):
        self.name, self.passed, self.failed = name, 0, 0
        self.expected = {p: r for (m, p), r in expected.items() if m == name}

    def check(self, what, ok, detail=""):
        reason = next((r for p, r in self.expected.items() if what.startswith(p)), None)
        if reason is not None:
            if ok:
                detail = f"listed as an expected failure ({reason}) but passed: remove it from the list"
                ok = False
            else:
                print(f"XFAIL {self.name}: {what} - {reason}", flush=True)
                self.passed += 1
                return False
        print(f"{'PASS' if ok else 'FAIL'} {self.name}: {what}{(' - ' + detail) if detail else ''}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


def load_freeze_by_flag(path):
    """{model: {initializer: reason}} (tab-separated: model, initializer, why no graph rule finds it)."""
    out = {}
    if path and os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line and not line.startswith("#"):
                    model, name, reason = line.split("\t")
                    out.setdefault(model, {})[name] = reason
    return out


def check_inspect(c, exe, model, side, by_flag):
    rc, out, err = run([exe, "inspect", model, "--check", "--json"])
    if not c.check("inspect --check", rc == 0, err.strip()[-2000:]):
        return
    info = json.loads(out)
    c.check("inspect reports no unsupported op", not info.get("unsupported_ops"), str(info.get("unsupported_ops")))
    frozen = {f["name"]: f["reason"] for f in info["trainable"]["frozen"]}
    want = set(side["freeze"]) - set(by_flag)
    c.check("the rule freezes the sidecar's buffers and constants", set(frozen) == want,
            f"frozen by the rule {sorted(frozen.items())}, PyTorch's buffers/constants {sorted(want)}")
    c.check("the freeze-by-flag names are sidecar buffers the rule trains",
            set(by_flag) <= set(side["freeze"]) and not set(by_flag) & set(frozen), str(sorted(by_flag)))


def check_forward(c, exe, model, side, folder, tmp):
    fwd = side["forward"]
    for dtype, tol in FORWARD_TOL.items():
        if side.get("weights", "float32") != "float32":
            tol = max(tol, FORWARD_TOL["fp32"])
        out = os.path.join(tmp, "fwd_" + dtype)
        rc, _, err = run([exe, "run", model, "--inputs", os.path.join(folder, fwd["inputs"]), "--out", out,
                          "--dtype", dtype])
        if not c.check(f"run --dtype {dtype}", rc == 0, err.strip()[-2000:]):
            continue
        for name, ref_file in fwd["outputs"].items():
            want = np.load(os.path.join(folder, ref_file))
            got_path = os.path.join(out, name + ".npy")
            if not c.check(f"run --dtype {dtype} wrote {name}", os.path.exists(got_path)):
                continue
            got = np.load(got_path).astype(np.float64)
            if not c.check(f"{name} shape ({dtype})", got.shape == want.shape, f"{got.shape} vs {want.shape}"):
                continue
            scale = max(float(np.abs(want).max()), 1e-30)
            err_rel = float(np.abs(got - want).max()) / scale
            c.check(f"{name} equals PyTorch ({dtype}, tol {tol:g})", err_rel <= tol, f"max error {err_rel:.3g}")


# (encoder layers, decoder layers) of the encoder-decoder families models/export_hf.py builds.
HF_ENCODER_DECODER_LAYERS = {"bart": (1, 1), "t5": (1, 1)}
# Families whose layers are one module applied `layers` times (ALBERT shares one layer's weights): every
# application carries that module's scope, so inspect counts all the attention blocks in one layer.
HF_SHARED_LAYER_FAMILIES = {"albert"}


def attention_blocks(side):
    """(attention blocks, attention blocks per layer that has any) of the model a sidecar describes."""
    layers = side["config"]["layers"]
    if side.get("family") in HF_SHARED_LAYER_FAMILIES:
        return layers, {layers}
    if side.get("family") in HF_ENCODER_DECODER_LAYERS:
        enc, dec = HF_ENCODER_DECODER_LAYERS[side["family"]]
        return enc + 2 * dec, {1, 2}
    if side.get("arch") == "seq2seq":  # export_zoo.py: nn.Transformer with `layers` encoder and decoder layers
        return 3 * layers, {1, 2}
    return layers, {1}


# The Hugging Face families whose attention rotates queries and keys in every layer (rotate-half; GPT-NeoX, Phi,
# Phi-3, Nemotron and StableLM partially, GPT-J, CodeGen and GLM interleaved and partially, Cohere interleaved; the
# encoder ModernBERT): the rotary fusion makes each rotation one Rotary. (SmolLM3 and EXAONE 4 leave some layers
# without one: not listed.)
ROTARY_FAMILIES = {"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "olmo", "olmo2", "falcon",
                   "gpt_neox", "phi", "phi3", "stablelm", "gptj", "granite", "starcoder2", "cohere", "nemotron", "glm",
                   "arcee", "helium", "codegen", "modernbert"}


# The Hugging Face families whose MLP is down(act(gate(x)) * up(x)) (SiLU; Gemma's tanh GELU; Phi-3's gate and up
# halves of one projection): the gated activation fusion makes each layer's act(gate) * up one GatedActivation.
GATED_MLP_FAMILIES = {"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "olmo", "olmo2", "stablelm",
                      "phi3", "granite", "cohere", "glm", "smollm3", "exaone4", "helium"}


def check_fusion(c, exe, model, side):
    blocks, per_layer = attention_blocks(side)
    cmd = [exe, "inspect", model, "--json"]
    if side.get("dynamic", True):
        cmd += ["--batch", str(side["train"]["batch"])]
        if any(len(i["dims"]) > 1 and isinstance(i["dims"][1], str) for i in side.get("inputs", [])):
            cmd += ["--seq", str(side["config"]["seq"])]  # not for images: no input has a sequence dim
    rc, out, err = run(cmd)
    if not c.check("inspect at the training shape", rc == 0, err.strip()[-2000:]):
        return
    info = json.loads(out)
    hist = info["fused_op_histogram"]
    c.check(f"one fused Attention per attention block ({blocks})", hist.get("Attention", 0) == blocks,
            f"Attention {hist.get('Attention', 0)}, Softmax {hist.get('Softmax', 0)}")
    c.check("no Softmax left unfused", hist.get("Softmax", 0) == 0, f"Softmax {hist.get('Softmax', 0)}")
    if side.get("family") in ROTARY_FAMILIES:
        c.check(f"one fused Rotary per query and key ({2 * blocks}), no Neg left",
                hist.get("Rotary", 0) == 2 * blocks and hist.get("Neg", 0) == 0,
                f"Rotary {hist.get('Rotary', 0)}, Neg {hist.get('Neg', 0)}")
    if side.get("family") in GATED_MLP_FAMILIES:
        layers = side["config"]["layers"]
        left = {op: hist.get(op, 0) for op in ("Sigmoid", "Gelu")}
        c.check(f"one fused GatedActivation per layer ({layers}), no Sigmoid or Gelu left",
                hist.get("GatedActivation", 0) == layers and not any(left.values()),
                f"GatedActivation {hist.get('GatedActivation', 0)}, {left}")
    counts = [row["ops"].get("Attention", 0) for row in info["fused_per_layer"]]
    c.check("inspect's per-layer fused counts hold the attention blocks",
            sum(counts) == blocks and {n for n in counts if n} <= per_layer, str(info["fused_per_layer"]))
    if side.get("family") in GATED_MLP_FAMILIES:
        gated = [row["ops"].get("GatedActivation", 0) for row in info["fused_per_layer"]]
        c.check("inspect's per-layer fused counts hold one GatedActivation per layer",
                sorted(n for n in gated if n) == [1] * side["config"]["layers"], str(info["fused_per_layer"]))


PIPELINE_TOL = 1e-12
BF16_LOSS_TOL = 2e-2


def train_command(exe, model, side, folder, r, metrics, by_flag, dtype=None):
    tr, loss = side["train"], side["loss"]
    dtype = dtype or ("fp64" if r["dtype"] == "float64" else "fp32")
    h = r["hyperparams"]
    cmd = [exe, "train", model, "--data", os.path.join(folder, tr["dir"]), "--batch", str(tr["batch"]),
           "--steps", str(tr["steps"]), "--optimizer", r["optimizer"], "--lr", repr(h["lr"]),
           "--weight-decay", repr(h["weight_decay"]), "--logits", loss["logits"], "--labels", loss["labels"],
           "--ignore-index", str(loss["ignore_index"]), "--dtype", dtype, "--no-dropout", "--metrics", metrics]
    if r["optimizer"] == "sgd":
        cmd += ["--momentum", repr(h["momentum"])]
    else:
        cmd += ["--beta1", repr(h["betas"][0]), "--beta2", repr(h["betas"][1]), "--eps", repr(h["eps"])]
    if by_flag:
        cmd += ["--freeze", regex_of_names(sorted(by_flag))]
    return cmd


def read_losses(metrics):
    with open(metrics) as fh:
        return [json.loads(line)["loss"] for line in fh if line.strip()]


def check_pipelined(c, exe, model, side, folder, tmp, stage_counts, by_flag):
    """The fp64 AdamW run over each of `stage_counts` stages equals the unpartitioned run."""
    runs = [r for r in side["train"]["runs"] if r["dtype"] == "float64" and r["optimizer"] == "adamw"]
    if not runs:
        return
    got = {}
    for k in [0] + stage_counts:
        metrics = os.path.join(tmp, f"metrics_pipe{k}.jsonl")
        cmd = train_command(exe, model, side, folder, runs[0], metrics, by_flag)
        if k:
            cmd += ["--stages", str(k), "--microbatches", "2" if side.get("dynamic", True) else "1"]
        what = f"train adamw fp64 --stages {k}" if k else "train adamw fp64 (pipeline reference)"
        rc, _, err = run(cmd)
        if not c.check(what, rc == 0, err.strip()[-2000:]):
            if k == 0:
                return
            continue
        got[k] = read_losses(metrics)
        if k:
            ok = len(got[0]) == len(got[k]) and all(abs(a - b) <= PIPELINE_TOL * abs(a) for a, b in zip(got[0], got[k]))
            c.check(f"--stages {k} losses equal the unpartitioned run (rel {PIPELINE_TOL:g})", ok,
                    f"pipelined {got[k]} unpartitioned {got[0]}")


def check_training(c, exe, model, side, folder, tmp, by_flag, backend="cpu"):
    tr = side["train"]
    extra = [] if backend == "cpu" else ["--backend", backend]
    for i, r in enumerate(tr["runs"]):
        dtype = "fp64" if r["dtype"] == "float64" else "fp32"
        if extra and dtype == "fp64":  # a GPU's fp64 is not what it trains in
            continue
        metrics = os.path.join(tmp, f"metrics_{i}.jsonl")
        cmd = train_command(exe, model, side, folder, r, metrics, by_flag) + extra
        what = f"train {r['optimizer']} {dtype}" + (f" --backend {backend}" if extra else "")
        rc, out, err = run(cmd)
        if not c.check(what, rc == 0, err.strip()[-2000:]):
            continue
        if extra:
            fallbacks = [l for l in out.splitlines() if "ran on the host" in l]
            c.check(f"{what}: no node ran on the host", not fallbacks, "; ".join(fallbacks))
        got = read_losses(metrics)
        want = r["losses"]
        tol = LOSS_TOL[r["dtype"]]
        ok = len(got) == len(want) and all(abs(g - w) <= tol * abs(w) for g, w in zip(got, want))
        c.check(f"{what} losses equal PyTorch (rel {tol:g})", ok, f"onnxpipe {got} PyTorch {want}")
    for r in [r for r in tr["runs"] if r["dtype"] == "float32" and r["optimizer"] == "adamw"][:1]:
        metrics = os.path.join(tmp, "metrics_bf16.jsonl")
        rc, _, err = run(train_command(exe, model, side, folder, r, metrics, by_flag, dtype="bf16") + extra)
        if not c.check("train adamw bf16", rc == 0, err.strip()[-2000:]):
            continue
        got, want = read_losses(metrics), r["losses"]
        ok = len(got) == len(want) and all(abs(g - w) <= BF16_LOSS_TOL * abs(w) for g, w in zip(got, want))
        c.check(f"train adamw bf16 losses within {BF16_LOSS_TOL:g} of PyTorch fp32", ok, f"onnxpipe {got} PyTorch {want}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnxpipe", required=True, help="the onnxpipe executable")
    p.add_argument("--fp64-loss-tol", type=float, default=LOSS_TOL["float64"],
                   help=f"relative tolerance of the fp64 losses (default {LOSS_TOL['float64']:g})")
    p.add_argument("--pipeline-stages", type=int, action="append", default=[],
                   help="also check that the fp64 AdamW run over this many stages equals the unpartitioned run "
                        "(repeatable)")
    p.add_argument("--backend", default="cpu",
                   help="train on this backend (cuda: the fp32 and bf16 runs against PyTorch's losses, and no node "
                        "on the host; the other checks are the CPU's)")
    p.add_argument("models", nargs="+", help="zoo folders (each with zoo.json and model.onnx)")
    p.add_argument("--expected", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "zoo",
                                                      "expected_failures.txt"),
                   help="expected failures (default tests/data/zoo/expected_failures.txt)")
    p.add_argument("--freeze-by-flag", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                            "zoo", "freeze_by_flag.txt"),
                   help="initializers trained by the rule that the runs freeze with --freeze (default "
                        "tests/data/zoo/freeze_by_flag.txt)")
    a = p.parse_args(argv)
    LOSS_TOL["float64"] = a.fp64_loss_tol
    expected = load_expected(a.expected)
    freeze_by_flag = load_freeze_by_flag(a.freeze_by_flag)
    passed = failed = 0
    for folder in a.models:
        side_path = os.path.join(folder, "zoo.json")
        with open(side_path) as fh:
            side = json.load(fh)
        c = Checker(side["name"], expected)
        model = os.path.join(folder, "model.onnx")
        by_flag = freeze_by_flag.get(side["name"], {})
        with tempfile.TemporaryDirectory(prefix="zoo_") as tmp:
            check_inspect(c, a.onnxpipe, model, side, by_flag)
            if c.failed == 0 and a.backend != "cpu":
                check_training(c, a.onnxpipe, model, side, folder, tmp, by_flag, a.backend)
            elif c.failed == 0:
                check_fusion(c, a.onnxpipe, model, side)
                check_forward(c, a.onnxpipe, model, side, folder, tmp)
                check_training(c, a.onnxpipe, model, side, folder, tmp, by_flag)
                if a.pipeline_stages:
                    check_pipelined(c, a.onnxpipe, model, side, folder, tmp, a.pipeline_stages, by_flag)
        passed, failed = passed + c.passed, failed + c.failed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
