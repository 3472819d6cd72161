#!/usr/bin/env bash
# After a change that moves code but must not change results (issue 42's family move): the device checks, then
# the rows of bench/RESULTS.md that the move could have changed, each against its PyTorch reference in the same
# call. Builds nothing; BIN_DIR holds framesmith and framesmith-bench.
# Usage: bench/run-recheck.sh BIN_DIR OUT_DIR WORK_DIR PART
#   check    `framesmith-bench check`, then the Wan2.1-1.3B step (480x832x81, rank 32; ours per-block and with the
#            self-attention kept, PyTorch eager per-block).
#   flux     FLUX.1 [dev] 1024² rank 16 through `framesmith train` (bf16, STEPS steps, default 6) against
#            bench/reference/flux_step.py (bench/run-flux.sh's torch and bf16 cases).
#   wan14b   Wan2.1-14B 480x832x81 within 24 GiB through `framesmith train --preset fast-24gb` (ComfyUI scaled-FP8
#            file, STEPS steps) against PyTorch's eager resident bf16 step.
#   kinds    issue 46's adapter kinds: kinds-flux, then kinds-wan14b (about 8 minutes on an H200 with no projects in
#            WORK_DIR yet; run the two as separate calls when a call is limited to 10 minutes).
#   kinds-flux    FLUX.1 [dev] 1024² rank 16, bf16 resident: `framesmith train` once per kind (lora, lokr, loha,
#            dora; STEPS, default 4) and bench/reference/flux_step.py --kind with the same kinds through PEFT
#            (1 warm-up + 2 timed steps each, the weights loaded once).
#   kinds-wan14b  Wan2.1-14B 480x832x81 rank 32 within 24 GiB (`--preset fast-24gb`, ComfyUI scaled-FP8 file):
#            `framesmith train` with lora and with each of WAN_KINDS (comma-separated, default dora; STEPS,
#            default 3), and bench/reference/step.py --kind lora,WAN_KINDS through PEFT (eager, resident bf16,
#            1 + 2 steps). kinds-wan14b-torch and kinds-wan14b-train run one half each (two calls); WAN_BASE=""
#            leaves the plain-LoRA run out of the train half.
# OUT_DIR/summary.txt gets the lines that matter; every log stays under OUT_DIR.
set -uo pipefail
if [[ $# -lt 4 ]]; then
    sed -n '2,21p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")" PART="$4"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
use_nvidia_libs
mkdir -p "$OUT" "$WORK"
SUMMARY="$OUT/summary.txt"
SHAPE=(--frames 81 --height 480 --width 832 --rank 32)
{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
} 2>&1 | tee -a "$SUMMARY"
# run SECONDS NAME COMMAND...: COMMAND into OUT/NAME.log, its lines worth keeping into the summary.
run() {
    local t="$1" name="$2"; shift 2
    echo "+ $*" >> "$SUMMARY"
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    grep -E "passed|failed|FAIL|step time|ms/step|median|peak|loss|VRAM|step [0-9]+|error|Error" "$OUT/$name.log" \
        | tail -12 | sed "s/^/  $name: /" >> "$SUMMARY"
    echo "  $name: exit $rc" >> "$SUMMARY"
}

case "$PART" in
check)
    run 240 check "$BIN/framesmith-bench" check
    run 180 step-1.3b "$BIN/framesmith-bench" step --check --variant t2v-1.3b "${SHAPE[@]}" --warmup 1 --iters 3
    run 180 step-1.3b-keep "$BIN/framesmith-bench" step --keep-attention --variant t2v-1.3b "${SHAPE[@]}" \
        --warmup 1 --iters 3
    run 180 torch-1.3b python3 "$HERE/reference/step.py" --variant t2v-1.3b "${SHAPE[@]}" --warmup 1 --iters 3
    ;;
flux)
    STEPS="${STEPS:-6}" timeout 540 "$HERE/run-flux.sh" "$BIN" "$OUT/flux" "$WORK/flux" torch bf16 \
        > "$OUT/flux.log" 2>&1
    echo "  flux: exit $?" >> "$SUMMARY"
    cat "$OUT/flux/summary.txt" >> "$SUMMARY" 2>/dev/null
    ;;
wan14b)
    run 240 torch-14b python3 "$HERE/reference/step.py" --variant t2v-14b "${SHAPE[@]}" --warmup 1 --iters 2
    timeout 480 "$HERE/run-product.sh" "$BIN" "$OUT/product" t2v-14b fp8-scaled 24 fast-24gb "${STEPS:-4}" \
        "$WORK/wan14b" > "$OUT/product.log" 2>&1
    echo "  product: exit $?" >> "$SUMMARY"
    grep -hE "step [0-9]+|VRAM|peak|blocks|Maximum resident|exit" "$OUT"/product/train-*.log 2>/dev/null \
        | tail -16 | sed "s/^/  train: /" >> "$SUMMARY"
    ;;
kinds|kinds-flux|kinds-wan14b|kinds-wan14b-torch|kinds-wan14b-train)
    if [[ "$PART" == kinds || "$PART" == kinds-flux ]]; then
        STEPS="${STEPS:-4}" TORCH_WARMUP=1 TORCH_ITERS=2 timeout 570 "$HERE/run-flux.sh" "$BIN" "$OUT/flux-kinds" \
            "$WORK/flux" torch-kinds kinds > "$OUT/flux-kinds.log" 2>&1
        echo "  flux-kinds: exit $?" >> "$SUMMARY"
        cat "$OUT/flux-kinds/summary.txt" >> "$SUMMARY" 2>/dev/null
    fi
    kinds="${WAN_KINDS:-${WAN_KIND:-dora}}"
    if [[ "$PART" == kinds || "$PART" == kinds-wan14b || "$PART" == kinds-wan14b-torch ]]; then
        run 420 torch-14b-kinds python3 "$HERE/reference/step.py" --variant t2v-14b "${SHAPE[@]}" --warmup 1 \
            --iters 2 --kind "lora,$kinds"
        grep -E "^(lora|${kinds//,/|}): " "$OUT/torch-14b-kinds.log" | sed "s/^/  PyTorch+PEFT 14B /" >> "$SUMMARY"
    fi
    if [[ "$PART" == kinds || "$PART" == kinds-wan14b || "$PART" == kinds-wan14b-train ]]; then
        P="$WORK/wan14b" STEPS="${STEPS:-3}" LOG="$OUT/wan14b-kinds.log" TIMED_PATTERN="step [0-9]+|VRAM|error|Error"
        export PATH="$BIN:$PATH"
        source "$HERE/train-cases.sh"
        START=$(date +%s%N)
        [[ -f "$P/run.toml" ]] || "$BIN/framesmith-bench" synth-project --variant t2v-14b --dtype fp8-scaled \
            --out "$P" --frames 81 --height 480 --width 832 --steps "$STEPS" > "$OUT/synth-14b.log" 2>&1
        for k in ${WAN_BASE-lora} ${kinds//,/ }; do
            with_kind "$P/run.toml" "$P/kind-$k.toml" "$k"
            sed -i "s/^max_train_steps = .*/max_train_steps = $STEPS/" "$P/kind-$k.toml"
            rm -rf "$P/output"
            train_case "$OUT/wan14b-$k" "$P/kind-$k.toml" "framesmith train 14B fast-24gb, $k" \
                --preset fast-24gb --vram-budget-gb 24
        done
    fi
    ;;
*)
    echo "unknown part: $PART" >&2
    exit 2
    ;;
esac
