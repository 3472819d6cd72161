#!/usr/bin/env bash
# Block streaming on the H200 test machine (see shared/CUDA.md), in one call: streamed-vs-resident LoRA gradients
# on a tiny config (each mode), copy bandwidths (plain pinned copy vs the streaming path), Wan2.1-14B FP8 block64
# at 480×832×81 resident / pinned / staged with 30 blocks streamed (compute-bound), 512×512 single images with 39
# and 30 blocks streamed (transfer-bound, each with the copy bandwidths of its own process), and budget runs when STREAM_BUDGET is set ("<GB>:<blocks>" pairs).
# Builds nothing. Usage: bench/run-stream.sh [path/to/framesmith-bench] [out-dir]
set -uo pipefail
BIN="${1:-devbin/framesmith-bench}"
LOG="${2:-${OUT:-/tmp/framesmith-bench}}"
mkdir -p "$LOG"
source "$(dirname "$0")/device-env.sh"
use_nvidia_libs
run() { local t=$1; shift; echo "+ $*" | tee -a "$LOG/commands.log"; timeout "$t" "$@"; }
F8=(--variant t2v-14b --fp8 block64 --rank 32)

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader
    free -g | head -2
} 2>&1 | tee "$LOG/env.log"

if [[ "${STREAM_SKIP_MAIN:-0}" != 1 ]]; then
run 420 "$BIN" stream --check --bandwidth "${F8[@]}" --frames 81 --height 480 --width 832 --blocks 30 \
    --modes "${STREAM_MODES:-resident,pinned,staged}" --placement "${STREAM_PLACEMENT:-spread}" --warmup 1 --iters 2 \
    2>&1 | tee "$LOG/stream-480p.log"
# Transfer-bound: 39 blocks with per-block checkpointing (with the copy bandwidths of this process), 30 without
# checkpointing (with 30 of 40 streamed and per-block checkpointing the backward computes as long as it copies).
T512=(--frames 1 --height 512 --width 512 --modes resident,pinned,staged --warmup 2 --iters 5)
run 300 "$BIN" stream --bandwidth "${F8[@]}" "${T512[@]}" --blocks 39 2>&1 | tee "$LOG/stream-512-39.log"
run 300 "$BIN" stream --bandwidth "${F8[@]}" "${T512[@]}" --blocks 30 --no-checkpointing \
    2>&1 | tee "$LOG/stream-512-30.log"
fi
for pair in ${STREAM_BUDGET:-}; do
    gb=${pair%%:*}; rest=${pair#*:}; n=${rest%%:*}; variant=${rest#*:}; [[ "$variant" == "$rest" ]] && variant=t2v-14b
    extra=(--fp8 block64); [[ "$variant" == t2v-1.3b ]] && extra=()
    run 400 "$BIN" stream --variant "$variant" "${extra[@]}" --rank 32 --frames 81 --height 480 --width 832 \
        --blocks "$n" --modes pinned --residual bf16 --host-activations --vram-budget-gb "$gb" --warmup 1 --iters 1 \
        2>&1 | tee "$LOG/stream-budget-$variant-$gb-$n.log"
done

echo "=== summary ==="
grep -h -E '^(ok  |FAIL)|^BANDWIDTH|^STREAMED|^BENCH|step [0-9.]+ ms|rror' "$LOG"/stream-*.log
