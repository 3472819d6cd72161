#!/usr/bin/env bash
# Time from start to the end of the first step of a Wan2.1-14B run with samples, twice into one output folder:
# the first start encodes the sample prompt with umT5 (loading it), the second finds the embedding in the output
# folder's prompt cache and loads no text encoder. Random weights at the real sizes (`framesmith-bench
# synth-project --variant t2v-14b --dtype fp8-scaled --encoders`: the ComfyUI scaled-FP8 DiT, the scaled-FP8
# umT5-XXL and the Wan VAE), one cached clip, `--preset fast-24gb --vram-budget-gb 24`, one step, no save.
# The summary keeps each start's breakdown lines (the model build's parts, the activation buffers page-locked
# beside the setup, the first step's parts) and the seconds from the process start to the end of step 1.
# Builds nothing. Usage: bench/run-first-step.sh BIN_DIR OUT_DIR WORK_DIR
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,9p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" PROJ="$(realpath -m "$3")/first-step"
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/device-env.sh"
use_nvidia_libs
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
SPIECE="$HERE/../crates/framesmith-models/testdata/spiece_tiny/tiny_unigram.model"
if [[ ! -f "$PROJ/run.toml" ]]; then
    "$BIN/framesmith-bench" synth-project --variant t2v-14b --dtype fp8-scaled --encoders "$SPIECE" --out "$PROJ" \
        --frames 81 --height 480 --width 832 --steps 1 > "$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; exit 1; }
fi
echo "a red fox running through snow --w 832 --h 480 --f 81 --s 20 --d 7" > "$PROJ/prompts.txt"
python3 - "$PROJ" <<'EOF'
import re, sys
p = sys.argv[1]
path = f"{p}/run.toml"
text = open(path).read()
text = re.sub(r"(?m)^\[sampling\]\n(?:(?!\[).*\n)*", "", text)
text += f'\n[sampling]\nprompts = "{p}/prompts.txt"\nsample_every_n_steps = 1000\n'
open(path, "w").write(text)
EOF
rm -rf "$PROJ/output"
for run in 1 2; do
    START=$(date +%s%N)
    "$BIN/framesmith" train --config "$PROJ/run.toml" --preset fast-24gb --vram-budget-gb 24 2>&1 | stamp \
        > "$OUT/train-$run.log"
    echo "run $run: exit ${PIPESTATUS[0]}" >> "$SUMMARY"
    grep -E "sample prompts|text encoder|model: |model built|activation buffers|streaming|step 1/|first step done" \
        "$OUT/train-$run.log" | sed "s/^/  run $run: /" >> "$SUMMARY"
    # The stamp of the first-step line: seconds from the process start to the end of step 1, measured outside.
    awk '/first step done/ { printf "  run %s: start -> end of step 1: %.1f s (stamped)\n", run, $1; exit }' \
        run="$run" "$OUT/train-$run.log" >> "$SUMMARY"
done
cat "$SUMMARY"
