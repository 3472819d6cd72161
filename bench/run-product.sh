#!/usr/bin/env bash
# The product path on the GPU test machine, through the product's own commands: random Wan DiT weights written
# in a checkpoint layout users have (`framesmith-bench synth-project --dtype fp8-scaled|bf16`: a ComfyUI
# scaled-FP8 single file, or the official bf16 layout), a musubi-tuner cache of one clip, then `framesmith plan`
# and `framesmith train` with a preset and a VRAM budget. Records the time from start to the first step, step
# times, the run's own VRAM high-water line (the CUDA pool; nvidia-smi cannot tell it from the budget's
# reservation) and peak RAM (/usr/bin/time). Builds nothing.
# Usage: bench/run-product.sh BIN_DIR OUT_DIR VARIANT FORMAT BUDGET_GB PRESET STEPS [PROJECT_DIR]
set -uo pipefail
BIN="$1" LOG="$2" VARIANT="$3" FORMAT="$4" BUDGET="$5" PRESET="$6" STEPS="$7"
PROJ="${8:-/tmp/framesmith-product-$VARIANT-$FORMAT}"
TAG="$VARIANT-$FORMAT-${BUDGET}g-$PRESET"
mkdir -p "$LOG"
source "$(dirname "$0")/device-env.sh"
use_nvidia_libs

if [[ ! -f "$PROJ/run.toml" ]]; then
    t0=$(date +%s)
    "$BIN/framesmith-bench" synth-project --variant "$VARIANT" --dtype "$FORMAT" --out "$PROJ" \
        --frames 81 --height 480 --width 832 --steps "$STEPS" 2>&1 | tee "$LOG/synth-$VARIANT-$FORMAT.log"
    echo "synth-project took $(($(date +%s) - t0)) s" | tee -a "$LOG/synth-$VARIANT-$FORMAT.log"
fi
"$BIN/framesmith" inspect "$PROJ/dit.safetensors" > "$LOG/inspect-$VARIANT-$FORMAT.log" 2>&1
"$BIN/framesmith" plan --config "$PROJ/run.toml" --preset "$PRESET" --vram-budget-gb "$BUDGET" \
    > "$LOG/plan-$TAG.log" 2>&1
rm -rf "$PROJ/output"
START=$(date +%s%N)
/usr/bin/time -v "$BIN/framesmith" train --config "$PROJ/run.toml" --preset "$PRESET" \
    --vram-budget-gb "$BUDGET" 2>&1 | stamp | tee "$LOG/train-$TAG.log"
echo "exit ${PIPESTATUS[0]}" >> "$LOG/train-$TAG.log"
