#!/usr/bin/env bash
# Issue 18's data-parallel rows on a machine of 2+ GPUs, through the product's own command (`framesmith train
# --gpus`): a Wan2.1-14B FP8 (block-64) 480x832x81 LoRA from random weights and latents (`framesmith-bench
# synth-project`), timed on 1 GPU and on N GPUs with the same effective batch; the LoRAs compared; then a rank
# killed mid-run, which must stop the run within the rank timeout and keep the last saved checkpoint.
# Needs a framesmith built with `--features nccl` (and the NCCL library: PyTorch's nvidia-nccl-cu13 wheel).
# Builds nothing. Logs and a summary under OUT_DIR.
# Usage: bench/run-multi-gpu.sh BIN_DIR OUT_DIR WORK_DIR [N_GPUS]
#   COUNTS (default N_GPUS): the GPU counts to time, e.g. "2 4"; every run (1 GPU included) trains the same
#   effective batch of N_GPUS samples per step (accumulation N_GPUS / count). KILL=0 skips the kill test;
#   KILL_ONLY=1 runs only the kill test.
#   STEPS (default 8) optimizer steps per timed run; KILL_AFTER (default 4) steps before rank 1 is killed;
#   RANK_TIMEOUT (default 120) seconds for --rank-timeout; VARIANT (default t2v-14b).
set -uo pipefail
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
N="${4:-2}"
STEPS="${STEPS:-8}" KILL_AFTER="${KILL_AFTER:-4}" RANK_TIMEOUT="${RANK_TIMEOUT:-120}" VARIANT="${VARIANT:-t2v-14b}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH"
source "$HERE/device-env.sh"
use_nvidia_libs
export NCCL_NVLS_ENABLE=0
START=$(date +%s%N)
mkdir -p "$OUT" "$WORK"
LOG="$OUT/multi-gpu.log"
GPUS="$(seq -s, 0 $((N - 1)))"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
( while true; do nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader; sleep 1; done ) \
    > "$OUT/smi.log" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT

P="$WORK/$VARIANT"
if [[ ! -f "$P/dit.safetensors" ]]; then
    note "synth $VARIANT"
    framesmith-bench synth-project --variant "$VARIANT" --dtype fp8-scaled --out "$P" --frames 81 --height 480 \
        --width 832 --steps "$STEPS" --seed 0 2>&1 | stamp > "$OUT/synth.log" || { note "synth failed"; exit 1; }
fi
# config: FP8 block-64 base, STEPS steps, accumulation $2, saving every $3 steps (0: at the end only), output $4.
config() { # out-toml accumulation save-every output-dir
    sed -e 's/^base_dtype = .*/base_dtype = "fp8"/' -e 's/^fp8_scale = .*/fp8_scale = "block64"/' \
        -e "s/^max_train_steps = .*/max_train_steps = $STEPS/" \
        -e "s/^gradient_accumulation_steps = .*/gradient_accumulation_steps = $2/" \
        -e "s|^output_dir = .*|output_dir = \"$4\"|" "$P/run.toml" > "$1"
    if [[ "$3" != 0 ]] && grep -q '^save_every_n_steps = ' "$1"; then
        sed -i "s/^save_every_n_steps = .*/save_every_n_steps = $3/" "$1"
    elif [[ "$3" != 0 ]]; then
        sed -i "/^\[output\]/a save_every_n_steps = $3" "$1"
    fi
}
# The mean step time of the steps after the first (warm-up), from metrics.jsonl.
step_secs() {
    python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if "step_secs" in l]
t=[r["step_secs"] for r in rows[1:]] or [r["step_secs"] for r in rows]
print(sum(t)/len(t))' "$1"
}
# Max |a-b| and max |a| over the tensors of two LoRA files (safetensors read with numpy; f32/bf16/f16).
compare_loras() {
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n]); body = raw[8 + n:]
    out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]; buf = body[a:b]
        if v["dtype"] == "F32": x = np.frombuffer(buf, np.float32)
        elif v["dtype"] == "F16": x = np.frombuffer(buf, np.float16).astype(np.float32)
        elif v["dtype"] == "BF16": x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else: continue
        out[k] = x
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), "different tensors"
diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
scale = max(float(np.abs(a[k]).max()) for k in a)
print(f"tensors {len(a)}  max|a-b| {diff:.3e}  max|a| {scale:.3e}  relative {diff / max(scale, 1e-30):.3e}")
PY
}
lora_of() { ls "$1"/*/*.safetensors "$1"/*.safetensors 2>/dev/null | grep -v -- '-state-' | grep -v -- '-[0-9]\{6\}\.safetensors' | head -1; }
metrics_of() { ls "$1"/*/metrics.jsonl "$1"/metrics.jsonl 2>/dev/null | head -1; }

# 1 GPU, then each count n of COUNTS, every one with the effective batch of N GPUs (accumulation N / n).
COUNTS="${COUNTS:-$N}"
timed_run() { # count
    local n="$1" gpus accum=$((N / $1))
    gpus="$(seq -s, 0 $(($1 - 1)))"
    config "$WORK/run-$n.toml" "$accum" 0 "$WORK/out-$n"
    rm -rf "$WORK/out-$n"
    note "$n GPU(s), accumulation $accum: framesmith train --config run-$n.toml --gpus $gpus"
    /usr/bin/time -v framesmith train --config "$WORK/run-$n.toml" --gpus "$gpus" --rank-timeout "$RANK_TIMEOUT" 2>&1 \
        | stamp > "$OUT/train-${n}gpu.log"
    note "$n GPU(s): exit ${PIPESTATUS[0]}"
    grep -E "error|warning|rank [0-9]+ of|VRAM: peak|Elapsed \(wall|Maximum resident" "$OUT/train-${n}gpu.log" \
        | tail -12 | tee -a "$LOG"
    local m
    m="$(metrics_of "$WORK/out-$n")"
    [[ -n "$m" ]] && cp "$m" "$OUT/metrics-${n}gpu.jsonl"
}
[[ "${KILL_ONLY:-0}" == 1 ]] && COUNTS=""
[[ "${KILL_ONLY:-0}" == 1 ]] || timed_run 1
for n in $COUNTS; do
    [[ "$n" == 1 ]] && continue
    (( N % n == 0 )) || { note "skipping $n GPUs: $N is not a multiple of it"; continue; }
    timed_run "$n"
done
M1="$(metrics_of "$WORK/out-1")" L1="$(lora_of "$WORK/out-1")"
for n in $COUNTS; do
    [[ "$n" == 1 ]] && continue
    MN="$(metrics_of "$WORK/out-$n")"
    if [[ -n "$M1" && -n "$MN" ]]; then
        S1="$(step_secs "$M1")" SN="$(step_secs "$MN")"
        # Every step trains N samples (batch 1 x N micro-batches over the ranks).
        python3 -c "import sys; s1,sn,n,b=float(sys.argv[1]),float(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4])
r1,rn=b/s1,b/sn
print(f'samples/s: 1 GPU {r1:.3f} ({s1:.2f} s/step of {b}), {n} GPUs {rn:.3f} ({sn:.2f} s/step); speed-up {rn/r1:.2f}x = {rn/r1/n:.2f} of linear')" \
            "$S1" "$SN" "$n" "$N" | tee -a "$LOG"
    else
        note "a run left no metrics.jsonl ($n GPUs): see the train logs"
    fi
    LN="$(lora_of "$WORK/out-$n")"
    if [[ -n "$L1" && -n "$LN" ]]; then
        echo "LoRA after $STEPS steps, $n GPUs vs 1 GPU (same effective batch): $(compare_loras "$L1" "$LN")" \
            | tee -a "$LOG"
    fi
done
if [[ "${KILL:-1}" == 0 ]]; then note "done"; exit 0; fi

# A rank killed mid-run: the others must stop within --rank-timeout, keeping the last saved checkpoint.
config "$WORK/kill.toml" 1 2 "$WORK/out-kill"
sed -i "s/^max_train_steps = .*/max_train_steps = 1000/" "$WORK/kill.toml"
rm -rf "$WORK/out-kill"
note "kill test: $N GPUs, rank 1 killed (SIGKILL) after step $KILL_AFTER"
framesmith train --config "$WORK/kill.toml" --gpus "$GPUS" --rank-timeout "$RANK_TIMEOUT" > "$OUT/train-kill.log" 2>&1 &
LAUNCHER=$!
killed=""
for _ in $(seq 1 1800); do
    sleep 1
    M="$(metrics_of "$WORK/out-kill")"
    if [[ -n "$M" ]] && (( $(wc -l < "$M") >= KILL_AFTER )); then
        RANK1="$(pgrep -P "$LAUNCHER" -f -- '--rank 1 ' | head -1)"
        if [[ -n "$RANK1" ]]; then
            KILLED_AT=$(date +%s%N); kill -9 "$RANK1"; killed=1
            note "killed rank 1 (pid $RANK1) after $(wc -l < "$M") steps"
        fi
        break
    fi
    kill -0 "$LAUNCHER" 2>/dev/null || break
done
if [[ -n "$killed" ]]; then
    waited=0
    while kill -0 "$LAUNCHER" 2>/dev/null && (( waited < RANK_TIMEOUT + 60 )); do sleep 1; waited=$((waited + 1)); done
    if kill -0 "$LAUNCHER" 2>/dev/null; then
        note "FAIL: the run still runs $waited s after the kill"; kill -9 "$LAUNCHER"
    else
        wait "$LAUNCHER"; rc=$?
        secs=$(python3 -c "print(f'{($(date +%s%N) - $KILLED_AT) / 1e9:.1f}')")
        note "the launcher exited with $rc, $secs s after the kill (rank timeout $RANK_TIMEOUT s)"
    fi
    tail -8 "$OUT/train-kill.log" | tee -a "$LOG"
    # The LoRA checkpoints rank 0 saved (every 2 steps), and training states where the config saves them.
    echo "kept: $(ls -d "$WORK"/out-kill/*.safetensors "$WORK"/out-kill/*/*.safetensors "$WORK"/out-kill/*-state-* \
        "$WORK"/out-kill/*/*-state-* 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ')" | tee -a "$LOG"
    pgrep -f -- "$WORK/kill.toml" > /dev/null && note "FAIL: a rank process is left over"
else
    note "kill test did not reach step $KILL_AFTER: see train-kill.log"; kill "$LAUNCHER" 2>/dev/null
fi
note "done"
