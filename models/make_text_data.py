#!/usr/bin/python3
"""Builds a small, real text-classification data set from Debian's `fortunes` package (the files
/usr/share/games/fortunes/<category>, entries separated by lines holding a single '%'), in two layouts:

  OUT/train/{pos,neg}/<id>_<rating>.txt, OUT/test/{pos,neg}/<id>_<rating>.txt   (aclImdb's layout)
  OUT/train.tsv, OUT/test.tsv                                                (label<TAB>text, label 1=pos 0=neg)
  OUT/meta.json                                                              (categories, counts, settings)

  /usr/bin/python3 models/make_text_data.py --out /tmp/fortunes_imdb
  /usr/bin/python3 models/make_text_data.py --out DIR --pos computers --neg food,drugs --no-balance

Default classes: pos = 'computers', neg = 'food' (clearly different vocabularies). Both classes are cut to the size
of the smaller one (--balance, default on), each class is shuffled with --seed and split 80/20 (--test-fraction),
so the output is deterministic for a given fortunes package. Text is cleaned: backspace overstrikes removed, tabs and
newlines kept in the .txt files and turned into single spaces in the TSV. Ratings imitate aclImdb (pos 7-10,
neg 1-4, derived from the id). Standard library only; needs any python3.
"""
import argparse
import json
import os
import random
import re
import shutil
import sys

FORTUNES_DIR = "/usr/share/games/fortunes"
OVERSTRIKE = re.compile(r"[^\x08]\x08")


def read_category(root, name):
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        hint = "" if os.path.isdir(root) else " (install the Debian package 'fortunes')"
        raise SystemExit(f"make_text_data.py: no fortune file {path}{hint}")
    with open(path, "rb") as fh:
        text = fh.read().decode("utf-8", errors="replace")
    entries, cur = [], []
    for line in text.split("\n") + ["%"]:
        if line.strip() == "%":
            entry = "\n".join(cur).strip()
            while OVERSTRIKE.search(entry):  # "_\bX" and "___\b\b\bXYZ" underline/bold overstrikes
                entry = OVERSTRIKE.sub("", entry)
            entry = entry.replace("\x08", "")
            if len(entry) >= 10:
                entries.append(entry)
            cur = []
        else:
            cur.append(line.rstrip())
    return entries


def load_class(root, spec):
    seen, out = set(), []
    for name in spec.split(","):
        for entry in read_category(root, name.strip()):
            if entry not in seen:  # a few fortunes appear twice
                seen.add(entry)
                out.append(entry)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder (replaced if it holds an earlier output)")
    p.add_argument("--pos", default="computers", help="fortune categories of the positive class, comma-separated")
    p.add_argument("--neg", default="food", help="fortune categories of the negative class, comma-separated")
    p.add_argument("--fortunes-dir", default=FORTUNES_DIR)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--balance", action=argparse.BooleanOptionalAction, default=True,
                   help="cut both classes to the size of the smaller one (default on)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if not 0.0 < a.test_fraction < 1.0:
        p.error("--test-fraction must be in (0, 1)")

    classes = {"pos": load_class(a.fortunes_dir, a.pos), "neg": load_class(a.fortunes_dir, a.neg)}
    overlap = set(classes["pos"]) & set(classes["neg"])
    for label in classes:  # an entry filed under both categories is ambiguous: drop it from both
        classes[label] = [e for e in classes[label] if e not in overlap]
    if a.balance:
        n = min(len(v) for v in classes.values())
        for label in classes:
            random.Random(f"{a.seed}-pick-{label}").shuffle(classes[label])
            classes[label] = classes[label][:n]

    out = os.path.abspath(a.out)
    if os.path.isdir(out):
        if os.listdir(out) and not os.path.exists(os.path.join(out, "meta.json")):
            raise SystemExit(f"make_text_data.py: {out} exists and is not an earlier output; refusing to replace it")
        shutil.rmtree(out)
    counts = {"train": {}, "test": {}}
    tsv = {"train": [], "test": []}
    next_id = 0
    for label, entries in classes.items():
        entries = list(entries)
        random.Random(f"{a.seed}-split-{label}").shuffle(entries)
        n_test = max(1, round(len(entries) * a.test_fraction))
        splits = {"test": entries[:n_test], "train": entries[n_test:]}
        for split, items in splits.items():
            folder = os.path.join(out, split, label)
            os.makedirs(folder, exist_ok=True)
            for text in items:
                rating = (7 + next_id % 4) if label == "pos" else (1 + next_id % 4)
                with open(os.path.join(folder, f"{next_id}_{rating}.txt"), "w", encoding="utf-8") as fh:
                    fh.write(text + "\n")
                tsv[split].append((1 if label == "pos" else 0, " ".join(text.split()), next_id))
                next_id += 1
            counts[split][label] = len(items)
    for split, rows in tsv.items():
        rows.sort(key=lambda r: r[2])  # interleave deterministically: by a seeded shuffle of ids
        random.Random(f"{a.seed}-tsv-{split}").shuffle(rows)
        with open(os.path.join(out, f"{split}.tsv"), "w", encoding="utf-8") as fh:
            for label, text, _ in rows:
                fh.write(f"{label}\t{text}\n")
    meta = dict(source=a.fortunes_dir, pos=a.pos, neg=a.neg, balance=a.balance, seed=a.seed,
                test_fraction=a.test_fraction, counts=counts, labels={"pos": 1, "neg": 0},
                layout="aclImdb: {train,test}/{pos,neg}/<id>_<rating>.txt; TSV: label<TAB>text")
    with open(os.path.join(out, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")
    print(json.dumps(dict(out=a.out, counts=counts)))


if __name__ == "__main__":
    sys.exit(main())
