#!/usr/bin/python3
"""Self-check of models/: the scripts run, the committed files are what they regenerate, and the failure paths fail.

  /usr/bin/python3 models/check_models.py [--quick] [--keep DIR]

Checks (each prints PASS/FAIL; the last line is 'N passed, N failed'; exit status 1 if any failed):
  * make_models.sh into a temporary folder reproduces the committed models (same graph, initializers equal to
    1e-6 relative), sidecars, data (.npy byte-identical) and goldens (float64 numbers to 1e-9, float32 to 1e-5
    relative; exact on the same machine), and every golden's onnx_sha256 matches the committed model;
  * export variants (opset 14 and 17, batch_first and norm_first on/off, sinusoidal/learned positions, tril/additive
    causal masks, fixed shapes, external data) pass onnx.checker and their sidecars are consistent, and
    torch_reference.py --verify maps every initializer of each and trains 2 steps (skipped with --quick);
  * torch_reference.py fails loudly on a model with a renamed initializer; export.py rejects bad arguments;
  * make_text_data.py writes a balanced 80/20 split in both layouts, without overstrike backspaces.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
MODELS = ["tiny_classifier", "tiny_gpt", "tiny_bert"]
VARIANTS = [
    ("classifier", ["--opset", "14", "--no-batch-first", "--norm-first", "--positions", "sinusoidal"]),
    ("classifier", ["--opset", "17", "--batch-first", "--no-norm-first", "--pooling", "first"]),
    ("classifier", ["--opset", "16", "--no-batch-first", "--no-norm-first", "--no-dynamic-axes"]),
    ("gpt", ["--opset", "14", "--no-norm-first", "--causal-mask", "additive"]),
    ("gpt", ["--opset", "17", "--norm-first", "--causal-mask", "additive", "--no-dynamic-axes"]),
    ("bert", ["--opset", "14", "--norm-first"]),
    ("bert", ["--opset", "17", "--external-data"]),
]
results = []


def check(name, fn):
    try:
        fn()
        results.append(True)
        print(f"PASS {name}", flush=True)
    except Exception as e:  # report every failure and go on
        results.append(False)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def compare_onnx(a, b):
    import onnx
    from onnx import numpy_helper
    ma, mb = onnx.load(a), onnx.load(b)
    ia = {t.name: numpy_helper.to_array(t) for t in ma.graph.initializer}
    ib = {t.name: numpy_helper.to_array(t) for t in mb.graph.initializer}
    assert sorted(ia) == sorted(ib), f"{a}: initializer names differ from {b}"
    for n in ia:
        assert ia[n].dtype == ib[n].dtype and ia[n].shape == ib[n].shape, f"{a}: initializer {n} differs"
        if ia[n].dtype.kind == "f":
            finite = np.isfinite(ib[n])
            assert np.array_equal(np.isfinite(ia[n]), finite) and np.allclose(
                ia[n][finite], ib[n][finite], rtol=1e-6, atol=1e-7), f"{a}: initializer {n} values differ"
        else:
            assert np.array_equal(ia[n], ib[n]), f"{a}: initializer {n} values differ"
    for m in (ma, mb):
        del m.graph.initializer[:]
    assert ma.SerializeToString() == mb.SerializeToString(), f"{a}: graph differs from {b}"


def close(a, b, rtol, path):
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys differ"
        for k in a:
            close(a[k], b[k], rtol, f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, rtol, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= rtol * max(abs(b), 1e-6), f"{path}: {a} vs {b}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def compare_golden(a, b):
    ga, gb = json.load(open(a)), json.load(open(b))
    runs_a, runs_b = ga.pop("runs"), gb.pop("runs")
    close(ga, gb, 0.0, os.path.basename(a))
    assert len(runs_a) == len(runs_b), f"{a}: number of runs differs"
    for ra, rb in zip(runs_a, runs_b):
        close(ra, rb, 1e-9 if rb["dtype"] == "float64" else 1e-5, f"{os.path.basename(a)}:{rb['optimizer']}/"
              f"{rb['dtype']}")


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def check_regenerate(tmp):
    out = os.path.join(tmp, "regen")
    run(["bash", os.path.join(HERE, "make_models.sh"), out])
    for m in MODELS:
        compare_onnx(os.path.join(out, m + ".onnx"), os.path.join(HERE, m + ".onnx"))
        sa, sb = (json.load(open(os.path.join(d, m + ".json"))) for d in (out, HERE))
        sa.pop("file_bytes"), sb.pop("file_bytes")
        close(sa, sb, 0.0, m + ".json")
        compare_golden(os.path.join(out, "golden", m + ".json"), os.path.join(HERE, "golden", m + ".json"))
        g = json.load(open(os.path.join(HERE, "golden", m + ".json")))
        assert g["onnx_sha256"] == sha256(os.path.join(HERE, m + ".onnx")), \
            f"golden/{m}.json was made from another {m}.onnx: regenerate with make_models.sh"
        for root, _, files in os.walk(os.path.join(out, "golden", m)):
            for f in files:
                rel = os.path.relpath(os.path.join(root, f), out)
                a, b = np.load(os.path.join(out, rel)), np.load(os.path.join(HERE, rel))
                assert a.dtype == b.dtype and a.shape == b.shape, f"{rel} differs"
                if a.dtype.kind == "f":
                    assert np.allclose(a, b, rtol=1e-9, atol=1e-12), f"{rel} values differ"
                else:
                    assert np.array_equal(a, b), f"{rel} values differ"
    for m in MODELS:
        size = os.path.getsize(os.path.join(HERE, m + ".onnx"))
        assert size < 3 * 2 ** 20, f"{m}.onnx is {size} bytes (limit 3 MiB)"


def check_variant(tmp, i, family, flags):
    import onnx
    path = os.path.join(tmp, f"variant{i}", f"{family}.onnx")
    run([PY, os.path.join(HERE, "export.py"), "--family", family, "--layers", "1", "--out", path] + flags)
    side = json.load(open(os.path.splitext(path)[0] + ".json"))
    onnx.checker.check_model(path)
    model = onnx.load(path)
    opset = int(flags[flags.index("--opset") + 1])
    assert side["opset_import"]["ai.onnx"] == opset == side["opset"], f"opset {side['opset_import']}"
    hist = side["op_histogram"]
    assert ("LayerNormalization" in hist) == (opset >= 17), f"LayerNormalization at opset {opset}: {hist}"
    inits = {t.name for t in model.graph.initializer}
    assert {p["name"] for p in side["parameters"]} | set(side["buffers"]) == inits, "sidecar vs initializers"
    dims = side["inputs"][0]["shape"]
    assert dims == (["B", "S"] if side["dynamic"] else [2, side["seq"]]), f"input dims {dims}"
    if "--external-data" in flags:
        assert side["external_data"] and os.path.exists(os.path.join(os.path.dirname(path), side["external_data"]))
        assert any(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in onnx.load(path, load_external_data=False).graph.initializer), "no external tensor"
    if family == "gpt":
        assert side["tied"] and side["tied"][0]["initializer"] == "tok_emb.weight", side["tied"]
    out = os.path.join(tmp, f"variant{i}", "golden.json")
    run([PY, os.path.join(HERE, "torch_reference.py"), path, "--out", out, "--steps", "2", "--rows", "8",
         "--verify"])
    g = json.load(open(out))
    assert len(g["runs"]) == 4 and all(len(r["losses"]) == 2 and np.isfinite(r["losses"]).all()
                                       for r in g["runs"]), "bad runs"


def check_bad_mapping(tmp):
    import onnx
    src = os.path.join(HERE, "tiny_bert")
    model = onnx.load(src + ".onnx")
    old = model.graph.initializer[3].name
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = "renamed_weight"
    model.graph.initializer[3].name = "renamed_weight"
    bad = os.path.join(tmp, "bad", "tiny_bert.onnx")
    os.makedirs(os.path.dirname(bad))
    onnx.save(model, bad)
    shutil.copy(src + ".json", os.path.join(tmp, "bad", "tiny_bert.json"))
    p = run([PY, os.path.join(HERE, "torch_reference.py"), bad, "--out", os.path.join(tmp, "bad", "g.json")],
            expect_ok=False)
    assert p.returncode != 0 and old in p.stderr and "renamed_weight" in p.stderr, p.stderr[-400:]


def check_bad_args(tmp):
    for args in (["--family", "gpt", "--d-model", "65"], ["--family", "gpt", "--batch-first"],
                 ["--family", "bert", "--opset", "13"], ["--family", "classifier", "--out", "x.pb"]):
        out = [] if "--out" in args else ["--out", os.path.join(tmp, "never.onnx")]
        p = run([PY, os.path.join(HERE, "export.py")] + args + out, expect_ok=False)
        assert p.returncode != 0 and "Traceback" not in p.stderr, f"{args}: rc {p.returncode} {p.stderr[-300:]}"


def check_text_data(tmp):
    out = os.path.join(tmp, "text")
    run([sys.executable, os.path.join(HERE, "make_text_data.py"), "--out", out])
    meta = json.load(open(os.path.join(out, "meta.json")))
    c = meta["counts"]
    assert c["train"]["pos"] == c["train"]["neg"] > 0 and c["test"]["pos"] == c["test"]["neg"] > 0, c
    total = c["train"]["pos"] + c["test"]["pos"]
    assert abs(c["test"]["pos"] - 0.2 * total) <= 1, c
    for split in ("train", "test"):
        rows = open(os.path.join(out, split + ".tsv"), encoding="utf-8").read().splitlines()
        assert len(rows) == c[split]["pos"] + c[split]["neg"], f"{split}.tsv rows"
        assert all(r.split("\t", 1)[0] in ("0", "1") and len(r.split("\t")) == 2 for r in rows), "TSV format"
        for label in ("pos", "neg"):
            files = os.listdir(os.path.join(out, split, label))
            assert len(files) == c[split][label], f"{split}/{label} files"
            for f in files:
                stem, rating = f[:-4].split("_")
                assert f.endswith(".txt") and (7 <= int(rating) <= 10 if label == "pos" else 1 <= int(rating) <= 4)
                assert "\x08" not in open(os.path.join(out, split, label, f), encoding="utf-8").read()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="skip the export variants")
    p.add_argument("--keep", help="work in this folder and keep it (default: a temporary folder)")
    a = p.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="onnxpipe_check_models_")
    os.makedirs(tmp, exist_ok=True)
    try:
        check("regenerate shipped models and goldens", lambda: check_regenerate(tmp))
        if not a.quick:
            for i, (family, flags) in enumerate(VARIANTS):
                check(f"variant {family} {' '.join(flags)}", lambda: check_variant(tmp, i, family, flags))
        check("torch_reference rejects an unmapped initializer", lambda: check_bad_mapping(tmp))
        check("export.py rejects bad arguments", lambda: check_bad_args(tmp))
        check("make_text_data layout and split", lambda: check_text_data(tmp))
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
