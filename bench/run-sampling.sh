#!/usr/bin/env bash
# Issue 47 item 2: samples during training inside the memory plan. Each part trains with samples every few steps
# under a VRAM budget (blocks_to_swap = "auto"), runs `framesmith plan` on the same config first (its table has the
# training step's and the sampling phase's lines, and the verdict says which binds), and puts into
# OUT_DIR/summary.txt the plan's two peaks beside the run's measured VRAM (the CUDA pool's high-water lines, logged
# after every step and after every sampling round: "VRAM after sampling at step N: peak …"). Builds nothing;
# BIN_DIR holds framesmith and framesmith-bench. Random weights at the real sizes (synth-project), as the scripts
# it calls use.
# Usage: bench/run-sampling.sh BIN_DIR OUT_DIR WORK_DIR [PART...]
#   flux     FLUX.1 [dev] 1024², FP8 block-64, `--vram-budget-gb 12`, a 1024² sample (20 steps) every 2 of 4 steps
#            (bench/run-flux.sh samples-budget-12).
#   qwen     Qwen-Image 1024², `--preset qwen-image-24gb --vram-budget-gb 24`, a 1024² sample (true CFG, GEN_STEPS
#            steps, default 8) every 2 of 4 steps (bench/run-qwen-image.sh samples-24).
#   wan14b   Wan2.1-14B 480x832x81 from the ComfyUI scaled-FP8 file with umT5 and the Wan VAE, `--preset fast-24gb
#            --vram-budget-gb 24`, one 832x480 sample of SAMPLE_FRAMES (default 81) frames, SAMPLE_STEPS (default 4)
#            UniPC steps with CFG, after steps 2 and 4 (the untiled 3-D VAE decode of the whole clip).
# No PART: flux qwen wan14b (about 15 minutes on an H200 with empty WORK_DIR; run one part per call when a call is
# limited to 10 minutes).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,19p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
PARTS=("$@")
[[ ${#PARTS[@]} -eq 0 ]] && PARTS=(flux qwen wan14b)
HERE="$(cd "$(dirname "$0")" && pwd)"
export PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
use_nvidia_libs
mkdir -p "$OUT" "$WORK"
SUMMARY="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$SUMMARY" 2>&1
for part in "${PARTS[@]}"; do
    case "$part" in
    flux)
        STEPS=4 SAMPLE_EVERY=2 timeout 580 "$HERE/run-flux.sh" "$BIN" "$OUT/flux" "$WORK/flux" samples-budget-12 \
            > "$OUT/flux.log" 2>&1
        echo "flux: exit $?" >> "$SUMMARY"
        cat "$OUT/flux/summary.txt" >> "$SUMMARY" 2>/dev/null
        ;;
    qwen)
        STEPS=4 GEN_STEPS="${GEN_STEPS:-8}" timeout 580 "$HERE/run-qwen-image.sh" "$BIN" "$OUT/qwen" "$WORK/qwen" \
            samples-24 > "$OUT/qwen.log" 2>&1
        echo "qwen: exit $?" >> "$SUMMARY"
        cat "$OUT/qwen/summary.txt" >> "$SUMMARY" 2>/dev/null
        ;;
    wan14b)
        P="$WORK/wan14b-samples"
        SPIECE="$HERE/../crates/framesmith-models/testdata/spiece_tiny/tiny_unigram.model"
        if [[ ! -f "$P/run.toml" ]]; then
            "$BIN/framesmith-bench" synth-project --variant t2v-14b --dtype fp8-scaled --encoders "$SPIECE" \
                --out "$P" --frames 81 --height 480 --width 832 --steps 4 > "$OUT/wan14b-synth.log" 2>&1 \
                || { echo "wan14b: synth failed" >> "$SUMMARY"; tail "$OUT/wan14b-synth.log"; continue; }
        fi
        echo "a red fox running through snow --w 832 --h 480 --f ${SAMPLE_FRAMES:-81} --s ${SAMPLE_STEPS:-4} --d 7" \
            > "$P/prompts.txt"
        python3 - "$P" <<'PY'
import re, sys
p = sys.argv[1]
path = f"{p}/run.toml"
text = open(path).read()
text = re.sub(r"(?m)^\[sampling\]\n(?:(?!\[).*\n)*", "", text)
text = re.sub(r"(?m)^max_train_steps = .*$", "max_train_steps = 4", text)
text += f'\n[sampling]\nprompts = "{p}/prompts.txt"\nsample_every_n_steps = 2\n'
open(path, "w").write(text)
PY
        extra=(--preset fast-24gb --vram-budget-gb 24)
        "$BIN/framesmith" plan --config "$P/run.toml" "${extra[@]}" > "$OUT/wan14b-plan.log" 2>&1
        rm -rf "$P/output"
        START=$(date +%s%N)
        timeout 560 /usr/bin/time -v "$BIN/framesmith" train --config "$P/run.toml" "${extra[@]}" 2>&1 | stamp \
            > "$OUT/wan14b-train.log"
        echo "wan14b: exit ${PIPESTATUS[0]}" >> "$SUMMARY"
        grep -hE "peak|Fits|fit:|sampling" "$OUT/wan14b-plan.log" | tail -6 | sed "s/^/  wan14b plan: /" >> "$SUMMARY"
        grep -hE "memory plan|step [0-9]+/|sample|VRAM|Maximum resident|rror" "$OUT/wan14b-train.log" | tail -14 \
            | sed "s/^/  wan14b train: /" >> "$SUMMARY"
        ;;
    *) echo "unknown part: $part" >> "$SUMMARY" ;;
    esac
done
cat "$SUMMARY"
