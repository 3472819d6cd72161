#!/usr/bin/env bash
# What the app's VRAM chart is told under a VRAM budget: a Wan2.1-1.3B run (random weights at the real size,
# `framesmith-bench synth-project`, one cached 480x832x81 clip) trained by `framesmith train --events-json
# --vram-budget-gb 24` for 3 steps, with nvidia-smi sampling the card's and the process's memory every 200 ms.
# The summary has the run's `vram_held` event (the GPU's NVML index, the bytes held back, the budget), the card's
# total, the process's largest NVML reading, that reading less the hold (what the chart now shows as the run's),
# and the run's own "VRAM: peak" lines. Builds nothing. Usage: bench/run-vram-hold.sh BIN_DIR OUT_DIR WORK_DIR
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,8p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" PROJ="$(realpath -m "$3")/vram-hold"
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/device-env.sh"
use_nvidia_libs
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
if [[ ! -f "$PROJ/run.toml" ]]; then
    "$BIN/framesmith-bench" synth-project --variant t2v-1.3b --out "$PROJ" --frames 81 --height 480 --width 832 \
        --steps 3 > "$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; exit 1; }
fi
rm -rf "$PROJ/output"
nvidia-smi --query-gpu=index,memory.total,memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/smi-gpu.csv" &
SMI_GPU=$!
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 200 > "$OUT/smi-apps.csv" &
SMI_APPS=$!
"$BIN/framesmith" train --config "$PROJ/run.toml" --vram-budget-gb 24 --events-json > "$OUT/events.jsonl" \
    2> "$OUT/train.log"
echo "train: exit $?" > "$SUMMARY"
kill "$SMI_GPU" "$SMI_APPS" 2>/dev/null
python3 - "$OUT" >> "$SUMMARY" <<'PY'
import json, sys
out = sys.argv[1]
gib = 1 << 30
held = [json.loads(l)["vram_held"] for l in open(f"{out}/events.jsonl") if '"vram_held"' in l]
print("vram_held events:", held)
total = max(int(l.split(",")[1]) for l in open(f"{out}/smi-gpu.csv") if l.strip()) * (1 << 20)
apps = [int(l.split(",")[1]) * (1 << 20) for l in open(f"{out}/smi-apps.csv") if l.strip() and "," in l]
print(f"card total {total / gib:.2f} GiB")
if apps:
    top = max(apps)
    print(f"process NVML peak {top / gib:.2f} GiB")
    if held:
        h = held[0]
        print(f"budget {h['budget_bytes'] / gib:.2f} GiB, held back {h['held_bytes'] / gib:.2f} GiB")
        print(f"process peak less the hold (the chart's Framesmith line) {(top - h['held_bytes']) / gib:.2f} GiB")
PY
grep -E "VRAM: peak|memory plan" "$OUT/train.log" | head -8 >> "$SUMMARY"
cat "$SUMMARY"
