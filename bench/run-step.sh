#!/usr/bin/env bash
# The training-step benchmark on the H200 test machine (see shared/CUDA.md), in one call: the tiny device-vs-CPU
# LoRA gradient check, then Wan2.1-1.3B at 480×832×81 (32,760 tokens) ours (manual block backward, then with
# selective checkpointing --keep-attention, and candle's autograd backward when STEP_AUTOGRAD=1) and PyTorch's,
# then 14B with FP8 block-64 block linears (ours), and 14B bf16 PyTorch when STEP_TORCH_14B=1; a table of ratios
# last. STEP_ANCHORS=1 adds PyTorch's 1.3B step with the self-attention kept (selective checkpointing), through
# torch.compile, and both (bench/reference/step.py --checkpointing attention / --compile). STEP_PROFILE=1 adds a
# kernel profile of each 1.3B PyTorch run (one more step under torch.profiler: in-run clocks) and of our per-block
# and kept-attention steps (ncu, each kernel alone), each summed by reference/ncu_summary.py into *.summary.txt;
# the two ncu runs take about 2–3 minutes each, so with STEP_ANCHORS=1 the call needs more than 10 minutes.
# Builds nothing. Usage: bench/run-step.sh [path/to/framesmith-bench] [out-dir]
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${1:-devbin/framesmith-bench}"
LOG="${2:-${OUT:-/tmp/framesmith-bench}}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
source "$(dirname "$0")/device-env.sh"
use_nvidia_libs
REF="$HERE/reference"
SHAPE=(--frames 81 --height 480 --width 832 --rank 32)
run() { local t=$1; shift; echo "+ $*" | tee -a "$LOG/commands.log"; timeout "$t" "$@"; }

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
} 2>&1 | tee "$LOG/env.log"

# profile NAME: the step.py arguments that write NAME's kernel profile when STEP_PROFILE=1.
profile() { [[ "${STEP_PROFILE:-0}" == 1 ]] && echo --profile "$LOG/profile-$1.csv"; }
run 180 "$BIN" step --check --variant t2v-1.3b "${SHAPE[@]}" --warmup 1 --iters 3 2>&1 | tee "$LOG/ours-step-1.3b.log"
run 180 "$BIN" step --check --keep-attention --variant t2v-1.3b "${SHAPE[@]}" --warmup 1 --iters 3 2>&1 \
    | tee "$LOG/ours-step-1.3b-keep.log"
if [[ "${STEP_AUTOGRAD:-0}" == 1 ]]; then
    run 180 "$BIN" step --backward autograd --variant t2v-1.3b "${SHAPE[@]}" --warmup 1 --iters 3 2>&1 \
        | tee "$LOG/ours-step-1.3b-autograd.log"
fi
run 180 python3 "$REF/step.py" --variant t2v-1.3b "${SHAPE[@]}" --warmup 1 --iters 3 $(profile torch-eager) 2>&1 \
    | tee "$LOG/torch-step-1.3b.log"
if [[ "${STEP_ANCHORS:-0}" == 1 ]]; then
    run 180 python3 "$REF/step.py" --variant t2v-1.3b "${SHAPE[@]}" --checkpointing attention --warmup 1 --iters 3 \
        $(profile torch-eager-keep) 2>&1 | tee "$LOG/torch-step-1.3b-keep.log"
    # The first calls compile (minutes); two warm-ups leave no recompilation in the timed ones.
    run 420 python3 "$REF/step.py" --variant t2v-1.3b "${SHAPE[@]}" --compile --warmup 2 --iters 3 \
        $(profile torch-compiled) 2>&1 | tee "$LOG/torch-step-1.3b-compiled.log"
    run 420 python3 "$REF/step.py" --variant t2v-1.3b "${SHAPE[@]}" --checkpointing attention --compile --warmup 2 \
        --iters 3 $(profile torch-keep-compiled) 2>&1 | tee "$LOG/torch-step-1.3b-keep-compiled.log"
fi
if [[ "${STEP_PROFILE:-0}" == 1 ]]; then
    # One step each, weight initialisation included (about 30 ms of kernels at 1.3B).
    for keep in "" --keep-attention; do
        name=ours${keep:+-keep}
        echo "+ ncu ... $BIN step $keep" | tee -a "$LOG/commands.log"
        timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
            "$BIN" step $keep --variant t2v-1.3b "${SHAPE[@]}" --warmup 0 --iters 1 > "$LOG/profile-$name.csv" \
            2> "$LOG/profile-$name.err"
    done
    for f in "$LOG"/profile-*.csv; do python3 "$REF/ncu_summary.py" "$f" > "${f%.csv}.summary.txt" 2>&1; done
fi
if [[ "${STEP_SKIP_14B:-0}" != 1 ]]; then
    run "${STEP_14B_TIMEOUT:-240}" "$BIN" step --variant t2v-14b --fp8 block64 "${SHAPE[@]}" --warmup 1 --iters 2 2>&1 \
        | tee "$LOG/ours-step-14b-fp8.log"
fi
if [[ "${STEP_TORCH_14B:-0}" == 1 ]]; then
    run 180 python3 "$REF/step.py" --variant t2v-14b "${SHAPE[@]}" --warmup 1 --iters 2 2>&1 | tee "$LOG/torch-step-14b.log"
fi

echo "=== summary (ref/ours > 1: ours faster) ==="
grep -h -E '^(ok  |FAIL)' "$LOG"/ours-step-1.3b*.log
grep -h '^BENCH' "$LOG"/*step*.log
python3 "$REF/compare.py" "$LOG"/ours-*.log "$LOG"/torch-*.log | tee "$LOG/summary.txt"
