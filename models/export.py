#!/usr/bin/python3
"""Exports onnxpipe's test model families (classifier, gpt, bert; see modeling.py) from PyTorch to ONNX with the
legacy TorchScript exporter in training mode (Dropout kept, no constant folding), and writes a JSON sidecar with the
config that the C++ tests read.

  /usr/bin/python3 models/export.py --family classifier --out /tmp/c.onnx
  /usr/bin/python3 models/export.py --family gpt --opset 14 --no-dynamic-axes --out /tmp/g14.onnx
  /usr/bin/python3 models/export.py --family bert --external-data --out /tmp/b/bert.onnx

Writes PATH (.onnx) and PATH with a .json suffix. With --external-data the initializers over 1 KiB go to one side
file PATH.data (the path recorded in the model is relative: just the file name). Weights are deterministic for
--seed. Needs torch (tested with Debian's python3-torch 1.13) and onnx (1.12).
"""
import argparse
import collections
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modeling  # noqa: E402

FAMILY_DEFAULTS = {
    "classifier": dict(vocab=2000, d_model=64, heads=4, ffn=None, layers=2, seq=64, classes=2, dropout=0.1,
                       batch_first=True, norm_first=False),
    "gpt": dict(vocab=512, d_model=64, heads=4, ffn=None, layers=2, seq=32, classes=None, dropout=0.1,
                batch_first=True, norm_first=True),
    "bert": dict(vocab=1000, d_model=64, heads=4, ffn=None, layers=2, seq=32, classes=2, dropout=0.1,
                 batch_first=True, norm_first=False),
}
ONNX_DTYPES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64", 16: "bfloat16"}
FORMAT = "onnxpipe-models-export/1"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=modeling.FAMILIES, required=True)
    p.add_argument("--vocab", type=int, help="vocabulary size (default: classifier 2000, gpt 512, bert 1000)")
    p.add_argument("--d-model", type=int, help="model width (default 64)")
    p.add_argument("--heads", type=int, help="attention heads (default 4)")
    p.add_argument("--ffn", type=int, help="feed-forward width (default 4 * d-model)")
    p.add_argument("--layers", type=int, help="transformer layers (default 2)")
    p.add_argument("--seq", type=int, help="maximum (and traced) sequence length (default: classifier 64, else 32)")
    p.add_argument("--classes", type=int, help="output classes for classifier/bert (default 2)")
    p.add_argument("--dropout", type=float, help="dropout probability (default 0.1)")
    p.add_argument("--opset", type=int, default=17, choices=range(14, 18), metavar="{14..17}",
                   help="ONNX opset (default 17; below 17 LayerNorm is exported decomposed)")
    p.add_argument("--batch-first", action=argparse.BooleanOptionalAction, default=None,
                   help="classifier only: nn.TransformerEncoderLayer(batch_first=...) (default on)")
    p.add_argument("--norm-first", action=argparse.BooleanOptionalAction, default=None,
                   help="pre-LN (on) or post-LN (off) blocks (default: off for classifier/bert, on for gpt)")
    p.add_argument("--positions", choices=["learned", "sinusoidal"], default="learned",
                   help="classifier only: learned (1, seq, d) parameter or sinusoidal buffer (default learned)")
    p.add_argument("--pooling", choices=["mean", "first"], default="mean",
                   help="classifier only: mean over the sequence or the first token (default mean)")
    p.add_argument("--causal-mask", choices=["tril", "additive"], default="tril",
                   help="gpt only: masked_fill with a tril buffer, or an additive -inf triangle buffer")
    p.add_argument("--dynamic-axes", action=argparse.BooleanOptionalAction, default=True,
                   help="batch and sequence as dim_params 'B' and 'S' (default on); off: fixed shapes")
    p.add_argument("--export-batch", type=int, default=2, help="batch of the traced example (fixed shapes use it)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the weights (default 0)")
    p.add_argument("--external-data", action="store_true",
                   help="store initializers over 1 KiB in PATH.data next to the model")
    p.add_argument("--out", required=True, metavar="PATH", help="output .onnx path (sidecar: PATH with .json)")
    a = p.parse_args(argv)
    if a.family != "classifier":
        for flag, val in (("--batch-first", a.batch_first), ("--positions", a.positions != "learned" or None),
                          ("--pooling", a.pooling != "mean" or None)):
            if val is not None:
                p.error(f"{flag} applies to --family classifier only")
    if a.family != "gpt" and a.causal_mask != "tril":
        p.error("--causal-mask applies to --family gpt only")
    if a.family == "gpt" and a.classes is not None:
        p.error("--classes does not apply to --family gpt (its logits are over the vocabulary)")
    if not a.out.endswith(".onnx"):
        p.error(f"--out {a.out}: expected a path ending in .onnx")
    return a


def make_config(a):
    cfg = dict(FAMILY_DEFAULTS[a.family])
    for key in ("vocab", "d_model", "heads", "ffn", "layers", "seq", "classes", "dropout", "batch_first",
                "norm_first"):
        val = getattr(a, key)
        if val is not None:
            cfg[key] = val
    if cfg["ffn"] is None:
        cfg["ffn"] = 4 * cfg["d_model"]
    if cfg["d_model"] % cfg["heads"]:
        raise SystemExit(f"export.py: --d-model {cfg['d_model']} is not divisible by --heads {cfg['heads']}")
    if a.family == "classifier" and a.positions == "sinusoidal" and cfg["d_model"] % 2:
        raise SystemExit("export.py: sinusoidal positions need an even --d-model")
    for key in ("vocab", "d_model", "heads", "ffn", "layers", "seq"):
        if cfg[key] < 1:
            raise SystemExit(f"export.py: --{key.replace('_', '-')} must be positive, got {cfg[key]}")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise SystemExit(f"export.py: --dropout must be in [0, 1), got {cfg['dropout']}")
    cfg.update(family=a.family, opset=a.opset, dynamic=a.dynamic_axes, seed=a.seed)
    if a.family == "classifier":
        cfg.update(positions=a.positions, pooling=a.pooling)
    else:
        cfg["batch_first"] = None  # hand-written blocks always run on (B, S, D)
    if a.family == "gpt":
        cfg["causal_mask"] = a.causal_mask
    return cfg


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def module_names(model):
    """Parameters (with every alias of a shared one) and buffers of the module, in state_dict order."""
    params = collections.OrderedDict()  # id -> [names]
    tensors = {}
    for mod_name, mod in model.named_modules():  # walk _parameters: named_parameters() drops aliases
        for local, p in mod._parameters.items():
            if p is not None:
                params.setdefault(id(p), []).append(f"{mod_name}.{local}" if mod_name else local)
                tensors[id(p)] = p
    buffers = collections.OrderedDict((name, b) for name, b in model.named_buffers())
    return params, tensors, buffers


def export(a):
    import onnx

    cfg = make_config(a)
    model = modeling.build(cfg).train()
    inputs = modeling.example_inputs(cfg, batch=a.export_batch)
    in_names, out_names = modeling.io_names(cfg["family"])
    dyn = None
    if cfg["dynamic"]:
        dyn = {n: {0: "B", 1: "S"} for n in in_names}
        dyn["logits"] = {0: "B", 1: "S"} if cfg["family"] == "gpt" else {0: "B"}
    out = os.path.abspath(a.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onnxpipe_export_") as tmp:
        raw = os.path.join(tmp, "model.onnx")
        torch.onnx.export(model, inputs, raw, input_names=in_names, output_names=out_names, dynamic_axes=dyn,
                          opset_version=cfg["opset"], training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False)
        proto = onnx.load(raw)
    proto.producer_name = "onnxpipe/models/export.py (torch %s)" % torch.__version__
    proto.doc_string = json.dumps({k: cfg[k] for k in sorted(cfg)})

    # Every parameter and buffer must be an initializer under its module name: the training references and the
    # C++ tests map by these names.
    params, tensors, buffers = module_names(model)
    inits = {t.name: t for t in proto.graph.initializer}
    missing = [names[0] for names in params.values() if names[0] not in inits]
    missing += [name for name in buffers if name not in inits]
    if missing:
        raise SystemExit(f"export.py: exported graph lacks initializers for {missing}; it has {sorted(inits)}")
    consumers = collections.defaultdict(list)
    for node in proto.graph.node:
        for name in node.input:
            if name in inits:
                consumers[name].append(node.op_type)
    tied = [dict(initializer=names[0], aliases=names[1:], consumers=consumers[names[0]])
            for names in params.values() if len(names) > 1]
    module_owned = {names[0] for names in params.values()} | set(buffers)
    extra = sorted(set(inits) - module_owned)  # exporter-made constants, if any (not trainable)

    data_file = None
    if a.external_data:
        data_file = os.path.basename(out) + ".data"
        if os.path.exists(os.path.join(os.path.dirname(out), data_file)):
            os.remove(os.path.join(os.path.dirname(out), data_file))  # save_model appends to an existing file
        onnx.save_model(proto, out, save_as_external_data=True, all_tensors_to_one_file=True, location=data_file,
                        size_threshold=1024)
    else:
        onnx.save_model(proto, out)
    onnx.checker.check_model(out)

    def io_entry(vi):
        return dict(name=vi.name, dtype=ONNX_DTYPES.get(vi.type.tensor_type.elem_type, "?"), shape=_dims(vi))

    hist = collections.Counter(n.op_type for n in proto.graph.node)
    buffer_names = list(buffers)
    side = dict(
        format=FORMAT, **{k: cfg[k] for k in ("family", "vocab", "d_model", "heads", "ffn", "layers", "seq",
                                             "classes", "dropout", "opset", "batch_first", "norm_first",
                                             "dynamic", "seed")},
        **{k: cfg[k] for k in ("positions", "pooling", "causal_mask") if k in cfg},
        activation={"classifier": "gelu (erf)", "gpt": "gelu (tanh approximation)", "bert": "gelu (erf)"}[
            cfg["family"]],
        inputs=[io_entry(vi) for vi in proto.graph.input if vi.name not in inits],
        outputs=[io_entry(vi) for vi in proto.graph.output],
        loss=dict(kind="cross_entropy", logits="logits", labels="labels",
                  per="token" if cfg["family"] == "gpt" else "sample", ignore_index=-100),
        parameters=[dict(name=names[0], shape=list(tensors[pid].shape)) for pid, names in params.items()],
        parameter_count=sum(tensors[pid].numel() for pid in params),
        buffers=buffer_names,
        freeze_regex=("^(" + "|".join(n.replace(".", r"\.") for n in buffer_names) + ")$") if buffer_names else None,
        tied=tied, other_initializers=extra,
        external_data=data_file, ir_version=proto.ir_version,
        opset_import={o.domain or "ai.onnx": o.version for o in proto.opset_import},
        nodes=len(proto.graph.node), op_histogram=dict(hist.most_common()),
        torch=torch.__version__, onnx=onnx.__version__, file_bytes=os.path.getsize(out))
    side_path = os.path.splitext(out)[0] + ".json"
    with open(side_path, "w") as fh:
        json.dump(side, fh, indent=1)
        fh.write("\n")
    return out, side_path, side


def main(argv=None):
    a = parse_args(argv)
    out, side_path, side = export(a)
    print(json.dumps(dict(exported=out, sidecar=side_path, nodes=side["nodes"], params=side["parameter_count"],
                          file_bytes=side["file_bytes"], buffers=side["buffers"], tied=side["tied"])))


if __name__ == "__main__":
    main()
