#!/usr/bin/env bash
# Partition-time benchmark (not a test): the benchmark classifier of ../shared/DESIGN.md (vocab 20000,
# d 1024, 16 heads, FFN 4096, seq 256, post-LN, GELU) at 24 and 96 layers, partitioned into 4 stages
# for batch 256 in 8 micro-batches on H200s (bf16, SGD, 1F1B). Targets: 24 layers < 2 s, 96 < 10 s.
#
#   DEVICE_LABEL="2-core CPU VM" bench/partition_bench.sh [ONNXPIPE_BINARY] [LAYERS ...]
#                                              (default: .build/main/tools/onnxpipe, 24 96)
#
# The models are exported at bench time into $WORK (default /tmp/onnxpipe_partition_bench; kept
# between runs, never committed); the 96-layer one (4.9 GB of weights) as external data. The export
# needs about 7x the weights in RAM (8.6 GB peak for 24 layers), so the 96-layer model only exports
# on a machine with ~40 GB free: results/partition_*_h200-machine.json was measured on the GPU
# machine's CPU with ../shared/bench/torch_peer.py's export of the same model. Writes
# bench/results/partition_<date>_<device label>.json with the machine, the phases' times (the onnxpipe
# partition "time:" line: import = ONNX load + checker + shape inference, training graph = bind,
# fold, fuse, loss, autodiff, optimizer; partition = phases 1-6; write = the report files) and the
# plan's search statistics.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/.build/main/tools/onnxpipe}
DEVICE_LABEL=${DEVICE_LABEL:-"$(nproc)-core CPU"}
shift || true
LAYERS=("$@")
[ ${#LAYERS[@]} -eq 0 ] && LAYERS=(24 96)
WORK=${WORK:-/tmp/onnxpipe_partition_bench}
PY=/usr/bin/python3
mkdir -p "$WORK" "$ROOT/bench/results"
[ -x "$BIN" ] || { echo "no onnxpipe binary at $BIN (build it: cmake --build .build/main --target onnxpipe)" >&2; exit 1; }

runs=()
for L in "${LAYERS[@]}"; do
  model="$WORK/classifier_$L.onnx"
  ext=()
  [ "$L" -gt 32 ] && ext=(--external-data)
  if [ ! -f "$model" ]; then
    echo "exporting the $L-layer benchmark model to $model ..."
    start=$(date +%s.%N)
    $PY "$ROOT/models/export.py" --family classifier --layers "$L" --d-model 1024 --heads 16 --ffn 4096 \
        --seq 256 --vocab 20000 --classes 2 "${ext[@]}" --out "$model" >/dev/null
    echo "  exported in $(echo "$(date +%s.%N) - $start" | bc) s"
  fi
  out="$WORK/plan_$L"
  rm -rf "$out"
  start=$(date +%s.%N)
  log=$(/usr/bin/time -f 'maxrss_kb %M' "$BIN" partition "$model" --stages 4 --batch 256 --microbatches 8 --seq 256 \
        --device h200 --dtype bf16 --optimizer sgd --schedule 1f1b --no-onnx --out "$out" 2>&1)
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  echo "$log" | tail -n 4
  times=$(echo "$log" | grep '^time:')
  rss=$(echo "$log" | awk '/maxrss_kb/ {print $2}')
  runs+=("$($PY - "$out/plan.json" "$L" "$wall" "$times" "$rss" "$model" <<'EOF'
import json, os, re, sys
plan = json.load(open(sys.argv[1]))
t = dict((k.strip().replace(" ", "_"), float(v)) for k, v in re.findall(r"([a-z ]+) ([0-9.]+) s", sys.argv[4]))
print(json.dumps({
    "layers": int(sys.argv[2]), "model_bytes": os.path.getsize(sys.argv[6]),
    "wall_s": float(sys.argv[3]), "max_rss_mb": int(sys.argv[5]) // 1024,
    "import_s": t.get("import"), "training_graph_s": t.get("training_graph"),
    "partition_s": t.get("partition"), "write_s": t.get("write"),
    "search_s": plan["search"]["seconds"], "positions": plan["search"]["positions"],
    "cut_candidates": plan["search"]["cut_candidates"], "units": plan["search"]["units"],
    "dp_runs": plan["search"]["dp_runs"], "verify_rounds": plan["search"]["verify_rounds"],
    "stages_planned": plan["search"]["stages_planned"],
    "predicted_step_ms": plan["predicted"]["step_ms"], "samples_per_s": plan["predicted"]["samples_per_s"],
    "bubble_fraction": plan["predicted"]["bubble_fraction"],
    "stage_memory_gib": [round(s["memory"]["total"] / 2**30, 2) for s in plan["stages"]],
    "stage_layers": [s["layers"] for s in plan["stages"]],
}))
EOF
)")
done

label=$(echo "$DEVICE_LABEL" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
stamp=$(date -u +%Y-%m-%dT%H:%M:%SZ)
result="$ROOT/bench/results/partition_$(date -u +%Y%m%d)_${label}.json"
$PY - "$result" "$stamp" "$(git -C "$ROOT" rev-parse --short HEAD)" "$DEVICE_LABEL" "${runs[@]}" <<'EOF'
import json, os, platform, sys
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = next((int(l.split()[1]) // 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
doc = {
    "benchmark": "onnxpipe partition time, benchmark classifier (d 1024, 16 heads, ffn 4096, seq 256, vocab 20000)",
    "command": "partition --stages 4 --batch 256 --microbatches 8 --seq 256 --device h200 --dtype bf16 "
               "--optimizer sgd --schedule 1f1b --no-onnx",
    "targets": {"24": "partition < 2 s", "96": "partition < 10 s"},
    "date": sys.argv[2], "commit": sys.argv[3],
    "machine": {"device": sys.argv[4], "cpu": cpu, "cores": os.cpu_count(), "memory_mb": mem,
                "load_average_1m": os.getloadavg()[0], "kernel": platform.release()},
    "runs": [json.loads(r) for r in sys.argv[5:]],
}
json.dump(doc, open(sys.argv[1], "w"), indent=1)
print("wrote", sys.argv[1])
EOF
