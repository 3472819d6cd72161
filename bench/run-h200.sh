#!/usr/bin/env bash
# One run on the H200 test machine (see shared/CUDA.md): device checks first, then attention and linear for the
# 14B and 1.3B shapes, each followed by the PyTorch reference on the same shapes, then a table of ratios.
# Builds nothing. Usage: bench/run-h200.sh [path/to/framesmith-bench] [out-dir]
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${1:-devbin/framesmith-bench}"
LOG="${2:-${OUT:-/tmp/framesmith-bench}}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
# The CUDA libraries on that machine belong to PyTorch's venv.
source "$(dirname "$0")/device-env.sh"
use_nvidia_libs
REF="$HERE/reference"
run() { echo "+ $*" | tee -a "$LOG/commands.log"; timeout 150 "$@"; }

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
    ldd "$BIN" | grep -E 'cuda|cublas|curand|nvrtc|cudnn|not found'
} 2>&1 | tee "$LOG/env.log"

run "$BIN" check 2>&1 | tee "$LOG/check.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || echo "DEVICE CHECKS FAILED"

run "$BIN" attention --variant t2v-14b --iters 10 2>&1 | tee "$LOG/ours-attn-14b.log"
run python3 "$REF/attention.py" --heads 40 --iters 10 2>&1 | tee "$LOG/torch-attn-14b.log"
run python3 "$REF/attention.py" --heads 40 --iters 10 --backend flash 2>&1 | tee "$LOG/torch-flash-attn-14b.log"
run "$BIN" attention --variant t2v-1.3b --iters 10 2>&1 | tee "$LOG/ours-attn-1.3b.log"
run python3 "$REF/attention.py" --heads 12 --iters 10 2>&1 | tee "$LOG/torch-attn-1.3b.log"
run "$BIN" kernels --variant t2v-14b --iters 20 2>&1 | tee "$LOG/ours-kernels-14b.log"
run python3 "$REF/kernels.py" --dim 5120 --ffn 13824 --heads 40 --iters 20 2>&1 | tee "$LOG/torch-kernels-14b.log"
run "$BIN" linear --variant t2v-14b --iters 20 2>&1 | tee "$LOG/ours-linear-14b.log"
run python3 "$REF/linear.py" --dim 5120 --ffn 13824 --iters 20 2>&1 | tee "$LOG/torch-linear-14b.log"
run "$BIN" linear --variant t2v-1.3b --iters 20 2>&1 | tee "$LOG/ours-linear-1.3b.log"
run python3 "$REF/linear.py" --dim 1536 --ffn 8960 --iters 20 2>&1 | tee "$LOG/torch-linear-1.3b.log"

echo "=== summary (ref/ours > 1: ours faster) ==="
grep -h -E '^(ok  |FAIL|checks:)' "$LOG/check.log" | tail -n 3
python3 "$REF/compare.py" "$LOG"/ours-*.log "$LOG"/torch-*.log | tee "$LOG/summary.txt"
