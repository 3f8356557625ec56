#!/usr/bin/env bash
# The README's main job, on CPU: builds a small real text set from Debian's fortunes (computers vs food, in the
# aclImdb layout; models/make_text_data.py), trains the shipped models/tiny_classifier.onnx on it (falling loss),
# evaluates the test split (accuracy well above the 50% of chance) and saves the trained model as ONNX with its
# vocabulary. Seeded: the same output on every run but the samples/s.   Usage: scripts/main_job.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.build/main_job}
mkdir -p "$out"
/usr/bin/python3 models/make_text_data.py --out "$out/fortunes"
.build/main/tools/onnxpipe train models/tiny_classifier.onnx --data "$out/fortunes" --data-format aclimdb \
  --seq 64 --batch 16 --steps 100 --optimizer adamw --lr 0.002 --weight-decay 0.01 \
  --lr-schedule cosine --warmup-steps 10 --shuffle --seed 0 --freeze '^pos\.table$' --log-every 10 \
  --eval --metrics "$out/metrics.jsonl" --save "$out/tiny_classifier_fortunes.onnx"
