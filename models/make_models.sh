#!/usr/bin/env bash
# Regenerates the shipped models, their sidecars and the PyTorch training goldens, deterministically:
#   bash models/make_models.sh [OUT_DIR]   (default OUT_DIR: models/ itself; needs Debian's /usr/bin/python3 with
#                                          python3-torch and python3-onnx; PYTHON=... overrides the interpreter)
# Running it twice gives byte-identical files (check_models.py compares a fresh run with the committed files).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "${1:-$HERE}"
cd "${1:-$HERE}"
PY=${PYTHON:-/usr/bin/python3}
export PYTHONHASHSEED=0 OMP_NUM_THREADS=1

"$PY" "$HERE/export.py" --family classifier --vocab 2000 --d-model 64 --heads 4 --ffn 256 --layers 2 --seq 64 \
  --classes 2 --dropout 0.1 --no-norm-first --batch-first --positions sinusoidal --pooling mean \
  --dynamic-axes --opset 17 --seed 0 --out tiny_classifier.onnx
"$PY" "$HERE/export.py" --family gpt --vocab 512 --d-model 64 --heads 4 --ffn 256 --layers 2 --seq 32 \
  --dropout 0.1 --norm-first --causal-mask tril --dynamic-axes --opset 17 --seed 0 --out tiny_gpt.onnx
"$PY" "$HERE/export.py" --family bert --vocab 1000 --d-model 64 --heads 4 --ffn 256 --layers 2 --seq 32 \
  --classes 2 --dropout 0.1 --no-norm-first --dynamic-axes --opset 17 --seed 0 --out tiny_bert.onnx

for m in tiny_classifier tiny_gpt tiny_bert; do
  "$PY" "$HERE/torch_reference.py" "$m.onnx" --out "golden/$m.json" --batch 4 --rows 20 --steps 5 --verify
done
