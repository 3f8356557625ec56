#!/usr/bin/python3
"""Exports the robustness corpus ("zoo"): small transformers of many architectures and export styles (zoo_models.py),
each with the PyTorch references the C++ side is checked against (tests/conformance/zoo_test.py).

  /usr/bin/python3 models/export_zoo.py                      # Debian's torch 1.13: TorchScript exporter, opsets 13-17
  VENV/bin/python models/export_zoo.py                       # a newer torch: TorchScript at 18-20 and dynamo=True
  /usr/bin/python3 models/export_zoo.py --only llama_o17_fixed --out /tmp/zoo

A newer torch lives in a virtual environment outside the repository (CPU is enough; see models/README.md):
  python3 -m venv VENV && VENV/bin/pip install torch onnx onnxscript numpy

Each variant goes to OUT/<name>/ (default OUT: tests/data/zoo):
  model.onnx (+ model.onnx.data with external data)
  zoo.json     what the model is, its inputs (name, dtype, dims), the loss, the freeze regex (float initializers
               that are not parameters: buffers, exporter constants), the forward and training references
  forward/     inputs/<name>.npy and <output>.npy: float64 PyTorch outputs at a batch/sequence other than the
               export's when the axes are dynamic
  train/       <input>.npy per graph input + labels.npy; zoo.json holds the per-step losses of SGD (momentum) and
               AdamW in float64 and float32, dropout-free modules, step k on rows [k*B, (k+1)*B)
The variants a torch cannot export (exporter missing, unsupported option) are skipped with a message; --strict
makes that an error.
"""
import argparse
import copy
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402

FORMAT = "onnxpipe-zoo/1"
IGNORE_INDEX = -100
BASE = dict(vocab=40, d=16, heads=4, kv_heads=2, ffn=32, layers=2, seq=12, classes=3, seed=0)
OPTIMIZERS = {
    "sgd": dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    "adamw": dict(lr=0.003, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01),
}
TORCH_MAJOR = int(torch.__version__.split(".")[0])


def variant(name, arch, opset, exporter="torchscript", dynamic=True, external=False, weights="float32", **cfg):
    return dict(name=name, arch=arch, opset=opset, exporter=exporter, dynamic=dynamic, external=external,
                weights=weights, cfg=dict(BASE, arch=arch, **cfg))


# Which torch exports which variant: "torchscript" below opset 18 needs torch 1.13 (Debian), the rest torch >= 2.
VARIANTS = [
    variant("gpt2_o13_dyn", "gpt2", 13),
    variant("gpt2_o17_fixed", "gpt2", 17, dynamic=False),
    variant("llama_o14_dyn", "llama", 14),
    variant("llama_o17_fixed", "llama", 17, dynamic=False),
    variant("bert_o15_dyn", "bert", 15),
    variant("bert_o17_ext", "bert", 17, external=True),
    variant("encoder_o16_dyn", "encoder", 16),
    variant("encoder_o17_prenorm_fixed", "encoder", 17, dynamic=False, norm_first=True),
    variant("t5_o17_dyn", "t5", 17),
    variant("alibi_o13_fixed", "alibi", 13, dynamic=False),
    variant("alibi_o17_dyn", "alibi", 17),
    variant("seq2seq_o17_dyn", "seq2seq", 17, layers=1),
    # newer torch: TorchScript exporter at opsets 18-20, and the dynamo exporter
    variant("gpt2_ts18_dyn", "gpt2", 18),
    variant("llama_ts20_dyn", "llama", 20),
    variant("bert_ts19_dyn", "bert", 19),
    variant("encoder_ts18_dyn", "encoder", 18),
    variant("seq2seq_ts18_dyn", "seq2seq", 18, layers=1),
    variant("gpt2_dynamo18_dyn", "gpt2", 18, exporter="dynamo"),
    variant("llama_dynamo18_dyn", "llama", 18, exporter="dynamo"),
    variant("bert_dynamo18_fixed", "bert", 18, exporter="dynamo", dynamic=False),
    variant("t5_dynamo20_dyn", "t5", 20, exporter="dynamo"),
    variant("alibi_dynamo21_ext", "alibi", 21, exporter="dynamo", external=True),
    # half-precision weights (and compute) in the file; the references use the same rounded weights in float64
    variant("gpt2_dynamo18_fp16", "gpt2", 18, exporter="dynamo", weights="float16"),
    variant("llama_ts18_bf16", "llama", 18, weights="bfloat16"),
]


def for_this_torch(v):
    if v["exporter"] == "dynamo" or v["opset"] >= 18:
        return TORCH_MAJOR >= 2
    return TORCH_MAJOR < 2


def export(model, v, args, path, train_batch):
    """Writes the ONNX file of v; the traced batch is train_batch (what a fixed export bakes in)."""
    arch = v["arch"]
    names = zoo_models.input_names(arch)
    axes = {}
    if v["dynamic"]:
        axes = {n: {0: "batch", 1: "seq"} for n in names}
        if arch == "seq2seq":
            axes["tgt"] = {0: "batch", 1: "tgt_seq"}
        axes["logits"] = {0: "batch", 1: "seq"} if zoo_models.is_lm(arch) else {0: "batch"}
        if arch == "seq2seq":
            axes["logits"] = {0: "batch", 1: "tgt_seq"}
    kw = dict(input_names=names, output_names=["logits"], opset_version=v["opset"])
    if v["exporter"] == "torchscript":
        if TORCH_MAJOR >= 2:
            kw["dynamo"] = False
        torch.onnx.export(model, args, path, dynamic_axes=axes or None, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING, **kw)
    else:
        shapes = None
        if v["dynamic"]:
            dim = torch.export.Dim
            b, s, t = dim("batch", min=1, max=64), dim("seq", min=2, max=v["cfg"]["seq"]), dim("tgt_seq", min=2,
                                                                                          max=v["cfg"]["seq"])
            shapes = {n: {0: b, 1: (t if n == "tgt" else s)} for n in names}
        prog = torch.onnx.export(model, args, None, dynamo=True, dynamic_shapes=shapes, **kw)
        prog.save(path, external_data=False)
    import onnx

    proto = onnx.load(path)
    if strip_machine_paths(proto):
        onnx.save_model(proto, path)
    if v["external"]:
        onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=256)
        proto = onnx.load(path)  # with the external tensors read back
    return proto


def strip_machine_paths(proto):
    """Drops the dynamo exporter's per-node stack traces: they name the exporting machine's file paths. Returns
    whether anything was dropped."""
    changed = False
    for node in proto.graph.node:
        if not hasattr(node, "metadata_props"):  # onnx < 1.16 has no per-node metadata
            return False
        keep = [p for p in node.metadata_props if "stack_trace" not in p.key]
        if len(keep) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
            changed = True
    return changed


def freeze_list(proto, model):
    """(frozen, lost): the float initializers that are not (bitwise) one of the module's parameters or a
    parameter's transpose (the dynamo exporter folds Linear's weight transpose into a new initializer): buffers and
    exporter constants, which a trainer must not train; and the parameters found in no initializer (an exporter
    folded them into a constant, e.g. a position embedding gathered at fixed positions)."""
    from onnx import numpy_helper

    def same(a, p):
        return a.shape == p.shape and a.dtype == p.dtype and np.array_equal(a, p)

    named = {n: p.detach().numpy() for n, p in model.named_parameters()}
    inits = [(t.name, initializer_as_float32(t)) for t in proto.graph.initializer]
    inits = [(n, a) for n, a in inits if a is not None]
    forms = lambda p: [p, p.T] if p.ndim == 2 else [p]  # noqa: E731
    frozen = [n for n, a in inits if not any(same(a, f) for p in named.values() for f in forms(p))]
    lost = [n for n, p in named.items() if not any(same(a, f) for _, a in inits for f in forms(p))]
    return frozen, lost


def initializer_as_float32(t):
    """A float initializer's values as float32 (float16/bfloat16 widen exactly); None for other types."""
    from onnx import TensorProto, numpy_helper

    if t.data_type == TensorProto.BFLOAT16:
        raw = np.frombuffer(t.raw_data, dtype=np.uint16) if t.raw_data else np.array(t.int32_data, np.uint16)
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(tuple(t.dims))
    a = numpy_helper.to_array(t)
    return a.astype(np.float32) if a.dtype.kind == "f" else None


def runs_in_onnxruntime(path, inputs):
    """False when onnxruntime (if installed) fails on these inputs; True when it runs or is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return True
    try:
        onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, inputs)
        return True
    except Exception:  # noqa: BLE001 - any runtime failure means the export is not valid at these shapes
        return False


def make_labels(arch, cfg, batch, seq, rng):
    if zoo_models.is_lm(arch):
        labels = rng.integers(0, cfg["vocab"], size=(batch, seq), dtype=np.int64)
        labels[rng.random(labels.shape) < 0.2] = IGNORE_INDEX
        labels[:, -1] = IGNORE_INDEX
        return labels
    return rng.integers(0, cfg["classes"], size=(batch,), dtype=np.int64)


def loss_of(arch, logits, labels):
    if zoo_models.is_lm(arch):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    return F.cross_entropy(logits, labels)


def train_losses(v, base, inputs, labels, batch, steps, opt_name, dtype, lost):
    """Per-step losses; the parameters in `lost` (the export folded them away) stay fixed, as they must for a
    trainer of the ONNX file."""
    model = copy.deepcopy(base).to(dtype).train()
    for name, p in model.named_parameters():
        p.requires_grad_(name not in lost)
    h = OPTIMIZERS[opt_name]
    if opt_name == "sgd":
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=h["lr"], momentum=h["momentum"], weight_decay=h["weight_decay"])
    else:
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"],
                                weight_decay=h["weight_decay"])
    names = zoo_models.input_names(v["arch"])
    losses = []
    for k in range(steps):
        rows = slice(k * batch, (k + 1) * batch)
        loss = loss_of(v["arch"], model(*[torch.from_numpy(inputs[n][rows]) for n in names]),
                       torch.from_numpy(labels[rows]))
        opt.zero_grad()
        loss.backward()
        losses.append(float(loss))
        opt.step()
    return dict(optimizer=opt_name, hyperparams=h, dtype=str(dtype).replace("torch.", ""), losses=losses)


def save_npys(folder, arrays):
    os.makedirs(folder, exist_ok=True)
    for name, a in arrays.items():
        np.save(os.path.join(folder, name + ".npy"), a)


def build_variant(v, out_dir, steps):
    cfg, arch = v["cfg"], v["arch"]
    base = zoo_models.build(cfg)
    wdtype = getattr(torch, v["weights"])
    base = base.to(wdtype).float()  # the weights the file holds, as float32 (exact) for the references
    names = zoo_models.input_names(arch)
    batch, seq = (4, cfg["seq"]) if not v["dynamic"] else (2, cfg["seq"])
    rng = np.random.default_rng(1)
    trace = zoo_models.make_inputs(cfg, batch, seq, rng)
    tmp = tempfile.mkdtemp(prefix=v["name"] + ".", dir=os.path.dirname(out_dir))
    try:
        path = os.path.join(tmp, "model.onnx")
        proto = export(copy.deepcopy(base).to(wdtype).train(), v, tuple(torch.from_numpy(trace[n]) for n in names), path,
                       batch)
        # forward reference: float64, other shapes when the axes are dynamic, unless onnxruntime shows that the
        # export only runs at the traced shapes (PyTorch 2's TorchScript export of nn.MultiheadAttention bakes the
        # traced sequence length into a Reshape); then the traced shapes, and the sidecar says so.
        fb, fs = (3, cfg["seq"] - 3) if v["dynamic"] else (batch, seq)
        fwd_in = zoo_models.make_inputs(cfg, fb, fs, rng)
        note = None
        if v["dynamic"] and not runs_in_onnxruntime(path, fwd_in):
            fb, fs = 3, seq
            fwd_in = zoo_models.make_inputs(cfg, fb, fs, rng)
            note = "onnxruntime cannot run this export at a sequence length other than the traced one"
        with torch.no_grad():
            ref = copy.deepcopy(base).double()(*[torch.from_numpy(fwd_in[n]) for n in names]).numpy()
        save_npys(os.path.join(tmp, "forward", "inputs"), fwd_in)
        save_npys(os.path.join(tmp, "forward"), {"logits": ref})
        # training data and losses: train batch 4 at the full sequence length
        tb = 4
        data = zoo_models.make_inputs(cfg, tb * steps, seq, rng)
        labels = make_labels(arch, cfg, tb * steps, seq, rng)
        save_npys(os.path.join(tmp, "train"), dict(data, labels=labels))
        import onnx

        frozen, lost = freeze_list(proto, base)
        runs = [train_losses(v, base, data, labels, tb, steps, o, d, lost)
                for o in ("sgd", "adamw") for d in (torch.float64, torch.float32)]
        sidecar = dict(
            format=FORMAT, name=v["name"], arch=arch, config=cfg, exporter=v["exporter"], opset=v["opset"],
            torch=torch.__version__, onnx=onnx.__version__, dynamic=v["dynamic"], external_data=v["external"],
            weights=v["weights"],
            ir_version=proto.ir_version, nodes=len(proto.graph.node),
            inputs=[dict(name=i.name, elem_type=i.type.tensor_type.elem_type,
                         dims=[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
                    for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}],
            outputs=[o.name for o in proto.graph.output],
            parameters=sum(p.numel() for p in base.parameters()),
            freeze=frozen, lost_parameters=lost, forward_note=note,
            loss=dict(logits="logits", labels="labels", per="token" if zoo_models.is_lm(arch) else "sample",
                      ignore_index=IGNORE_INDEX),
            forward=dict(batch=fb, seq=fs, inputs="forward/inputs", outputs={"logits": "forward/logits.npy"},
                         dtype="float64"),
            train=dict(dir="train", batch=tb, steps=steps, runs=runs))
        with open(os.path.join(tmp, "zoo.json"), "w") as fh:
            json.dump(sidecar, fh, indent=1)
            fh.write("\n")
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs_ in os.walk(out_dir) for f in fs_)
    return size


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "zoo"), help="corpus folder")
    p.add_argument("--only", action="append", help="variant name (repeatable); default: every variant this torch "
                                                   "can export")
    p.add_argument("--steps", type=int, default=3, help="training steps per reference run (default 3)")
    p.add_argument("--strict", action="store_true", help="fail when a variant cannot be exported")
    p.add_argument("--list", action="store_true", help="print the variants and exit")
    a = p.parse_args(argv)
    if a.list:
        for v in VARIANTS:
            print(f"{v['name']:28} {v['arch']:8} opset {v['opset']:2} {v['exporter']:11} "
                  f"{'dynamic' if v['dynamic'] else 'fixed'}{' external' if v['external'] else ''}")
        return
    known = {v["name"] for v in VARIANTS}
    for n in a.only or []:
        if n not in known:
            raise SystemExit(f"export_zoo.py: unknown variant {n!r} (--list shows them)")
    chosen = [v for v in VARIANTS if (n := v["name"]) in (a.only or [n]) and (a.only or for_this_torch(v))]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    failed = 0
    for i, v in enumerate(chosen):
        try:
            size = build_variant(v, os.path.join(a.out, v["name"]), a.steps)
            print(f"[{i + 1}/{len(chosen)}] {v['name']}: {size / 1024:.0f} KiB", flush=True)
        except Exception as e:  # noqa: BLE001 - an exporter failure is reported, not fatal unless --strict
            failed += 1
            print(f"[{i + 1}/{len(chosen)}] {v['name']}: not exported with torch {torch.__version__}: "
                  f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            if a.strict:
                raise
    print(f"{len(chosen) - failed} exported, {failed} failed")


if __name__ == "__main__":
    main()
