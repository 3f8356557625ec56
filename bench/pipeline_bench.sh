#!/usr/bin/env bash
# Pipeline throughput benchmark (not a test): the tiny classifier (models/tiny_classifier.onnx, its
# golden data) trained with 2 pipeline stages against 1, on this machine's CPU backend. Batch 16 in
# 4 micro-batches (1F1B and GPipe), 30 SGD steps; samples/s is 16 / the mean step time over steps
# 5..30 from the --metrics file. Each configuration runs with single-threaded kernels (ONNXPIPE_NUM_THREADS=1,
# OPENBLAS_NUM_THREADS=1: a stage is one core, so two stages can use two) and with the default
# threading, since on a 2-core machine the pipeline competes with the kernels' own threads.
#
#   bench/pipeline_bench.sh [ONNXPIPE_BINARY]      (default: .build/pipe/tools/onnxpipe)
#
# Writes bench/results/pipeline_<date>_<host>.json: the machine (cores, load average at the start,
# which matters on a shared machine), every run's mean samples/s and step time, and the ratios
# 2 stages / 1 stage.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/.build/pipe/tools/onnxpipe}
[ -x "$BIN" ] || { echo "no onnxpipe binary at $BIN (cmake --build .build/pipe --target onnxpipe)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/onnxpipe_pipeline_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
STEPS=30
mkdir -p "$ROOT/bench/results"
out="$ROOT/bench/results/pipeline_$(date +%Y%m%d_%H%M%S)_$(hostname -s).json"
load=$(cut -d' ' -f1-3 /proc/loadavg)

# run NAME THREADS FLAGS...: prints "samples_per_s step_ms"
run() {
  local name=$1 threads=$2
  shift 2
  local env=()
  [ "$threads" = 1 ] && env=(ONNXPIPE_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
  env "${env[@]}" "$BIN" train "$ROOT/models/tiny_classifier.onnx" --data "$ROOT/models/golden/tiny_classifier/data" \
      --batch 16 --steps $STEPS --optimizer sgd --lr 0.01 --momentum 0.9 --freeze '^pos\.table$' \
      --metrics "$WORK/$name.jsonl" "$@" >/dev/null
  /usr/bin/python3 - "$WORK/$name.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][4:]
sec = sum(16 / r["samples_per_s"] for r in rows) / len(rows)  # mean step time
print(f"{16 / sec:.3f} {sec * 1e3:.3f}")
PY
}

json_runs=""
declare -A sps
for threads in 1 default; do
  for cfg in "unpartitioned|" "k1_m4|--stages 1 --microbatches 4" "k2_m4_1f1b|--stages 2 --microbatches 4 --schedule 1f1b" \
             "k2_m4_gpipe|--stages 2 --microbatches 4 --schedule gpipe" "k2_m2_1f1b|--stages 2 --microbatches 2 --schedule 1f1b"; do
    name=${cfg%%|*}
    flags=${cfg#*|}
    # shellcheck disable=SC2086
    read -r s ms < <(run "${name}_$threads" "$threads" $flags)
    sps[${name}_$threads]=$s
    echo "threads=$threads $name: $s samples/s, $ms ms/step"
    json_runs+="${json_runs:+,}{\"threads\": \"$threads\", \"config\": \"$name\", \"flags\": \"$flags\", \"samples_per_s\": $s, \"step_ms\": $ms}"
  done
done
ratio() { /usr/bin/python3 -c "print(round($1 / $2, 4))"; }
cat > "$out" <<JSON
{
 "benchmark": "pipeline: 2 stages vs 1 of tiny_classifier, CPU backend",
 "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
 "host": "$(hostname -s)",
 "cores": $(nproc),
 "loadavg_at_start": "$load",
 "model": "models/tiny_classifier.onnx",
 "batch": 16, "steps": $STEPS, "measured_steps": "5..$STEPS",
 "runs": [$json_runs],
 "ratios": {
  "single_thread_kernels": {"k2_m4_1f1b_over_unpartitioned": $(ratio "${sps[k2_m4_1f1b_1]}" "${sps[unpartitioned_1]}"),
                            "k2_m4_1f1b_over_k1_m4": $(ratio "${sps[k2_m4_1f1b_1]}" "${sps[k1_m4_1]}"),
                            "k2_m4_gpipe_over_k1_m4": $(ratio "${sps[k2_m4_gpipe_1]}" "${sps[k1_m4_1]}")},
  "default_threads": {"k2_m4_1f1b_over_unpartitioned": $(ratio "${sps[k2_m4_1f1b_default]}" "${sps[unpartitioned_default]}"),
                      "k2_m4_1f1b_over_k1_m4": $(ratio "${sps[k2_m4_1f1b_default]}" "${sps[k1_m4_default]}"),
                      "k2_m4_gpipe_over_k1_m4": $(ratio "${sps[k2_m4_gpipe_default]}" "${sps[k1_m4_default]}")}
 }
}
JSON
echo "wrote $out"
cat "$out" | /usr/bin/python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['ratios'], indent=1))"
