#!/usr/bin/env bash
# Full-size equivalence with PyTorch on the GPU test machine: `framesmith-bench equivalence` runs one LoRA step of
# a Wan DiT of random weights at 480×832×81 and writes its weights, sample, LoRA factors, loss and gradients under
# WORK; bench/reference/equivalence.py runs the same step in PyTorch (bf16 autocast, then f32) and compares.
# Each extra argument after WORK is one more of our modes (`keep-attention`, `autograd`), compared against the
# same PyTorch steps. Builds nothing.
# Usage: bench/run-equivalence.sh BIN OUT WORK [variant] [mode...]
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="$1" LOG="$2" WORK="$3" VARIANT="${4:-t2v-1.3b}"
shift 4 2>/dev/null || shift $#
mkdir -p "$LOG" "$WORK"
export PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
use_nvidia_libs
SHAPE=(--frames 81 --height 480 --width 832 --rank 32)
run() { local t=$1; shift; echo "+ $*" | tee -a "$LOG/commands.log"; timeout "$t" "$@"; }
rc=0
for mode in manual "$@"; do
    case "$mode" in
        manual) flags=() ;;
        keep-attention) flags=(--keep-attention) ;;
        autograd) flags=(--backward autograd) ;;
        *) echo "unknown mode $mode"; exit 2 ;;
    esac
    dir="$WORK/$VARIANT-$mode"
    run 300 "$BIN" equivalence --variant "$VARIANT" "${SHAPE[@]}" "${flags[@]}" --out "$dir" 2>&1 \
        | tee "$LOG/equivalence-$VARIANT-$mode.log" || rc=1
    run 400 python3 "$HERE/reference/equivalence.py" "$dir" --variant "$VARIANT" --rank 32 2>&1 \
        | tee -a "$LOG/equivalence-$VARIANT-$mode.log" || rc=1
    rm -f "$dir/weights.safetensors"
done
exit $rc
