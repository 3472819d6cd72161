#!/usr/bin/env bash
# FLUX.1 [dev] LoRA training on the GPU through `framesmith train` only (issue 20's "must show"): rank 16 at the
# dataset's resolution (1024x1024 for the issue), batch 1, three runs from one FLUX.1 dev DiT and one cached image
# dataset — bf16 base (everything resident), FP8 block-64 base, and FP8 within `--vram-budget-gb 12` with
# `blocks_to_swap = "auto"` (the planner's count) and saved inputs in RAM, in each `memory.flux_stream_order`
# (FLUX_ORDERS). Each run logs
# its memory plan, the blocks it streams, per-step times and the VRAM peak next to the plan's prediction.
# The weights and caches come from elsewhere (random weights in the official layout, `framesmith cache latents`
# / `cache text` with FLUX.1's AE, CLIP-L and T5). Builds nothing.
# Usage: bench/run-flux-train.sh BIN_DIR DIT DATASET_TOML OUT_DIR
#   FLUX_STEPS (default 8), FLUX_ORDERS (default "single_first double_first spread"), FLUX_RUNS (default
#   "bf16 fp8 fp8-12gb"), FLUX_STREAMING (pinned or staged, default pinned).
set -uo pipefail
BIN="$(realpath "$1")" DIT="$(realpath "$2")" DATASET="$(realpath "$3")" OUT="$4"
STEPS="${FLUX_STEPS:-8}" ORDERS="${FLUX_ORDERS:-single_first double_first spread}"
RUNS="${FLUX_RUNS:-bf16 fp8 fp8-12gb}" STREAMING="${FLUX_STREAMING:-pinned}"
mkdir -p "$OUT"
OUT="$(realpath "$OUT")"
export PATH="$BIN:$PATH"
source "$(dirname "$0")/device-env.sh"
LD_LIBRARY_PATH="$(nvidia_libs):${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH

# config NAME BASE BLOCKS ORDER ACTIVATIONS: writes $OUT/NAME.toml
config() {
    cat > "$OUT/$1.toml" <<TOML
[model]
dit = "$DIT"
base_dtype = "$2"
fp8_scale = "block64"

[dataset]
config = "$DATASET"

[lora]
rank = 16
alpha = 16.0

[training]
max_train_steps = $STEPS
seed = 42
device = "cuda"
timestep_sampling = "flux_shift"

[memory]
streaming = "$STREAMING"
blocks_to_swap = $3
flux_stream_order = "$4"
activations = "$5"
checkpointing = "blocks"

[output]
output_dir = "$OUT/$1"
output_name = "flux-$1"
TOML
}

# train NAME [framesmith train flags...]: runs one config under /usr/bin/time -v into $OUT/NAME.log
train() {
    local name="$1"; shift
    echo "== $name: framesmith train --config $OUT/$name.toml $* ==" | tee -a "$OUT/summary.log"
    /usr/bin/time -v framesmith train --config "$OUT/$name.toml" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    grep -E "memory plan|streaming [0-9]+ of|s/step|VRAM: peak|Elapsed \(wall|Maximum resident" "$OUT/$name.log" \
        | tail -10 | sed "s/^/   /" | tee -a "$OUT/summary.log"
    echo "   exit $rc" | tee -a "$OUT/summary.log"
}

framesmith inspect "$DIT" 2>&1 | head -20 > "$OUT/inspect.log"
for run in $RUNS; do
    case "$run" in
        bf16) config bf16 bf16 0 single_first device; train bf16 ;;
        fp8) config fp8 fp8 0 single_first device; train fp8 ;;
        fp8-12gb)
            for order in $ORDERS; do
                config "fp8-12gb-$order" fp8 '"auto"' "$order" host
                framesmith plan --config "$OUT/fp8-12gb-$order.toml" --vram-budget-gb 12 \
                    > "$OUT/fp8-12gb-$order.plan.txt" 2>&1
                train "fp8-12gb-$order" --vram-budget-gb 12
            done ;;
        *) echo "unknown run $run (bf16, fp8, fp8-12gb)"; exit 2 ;;
    esac
done
