#!/usr/bin/env bash
# Issue 45's text-caching row through the product's own command: `framesmith cache text` of CAPTIONS captions for
# LTX-2 with Gemma 3 12B at its released size and random weights (`framesmith-bench synth-project --model ltx2-text`:
# Gemma in ComfyUI's scaled-FP8 layout, ~13 GB; the RELEASE's checkpoint holding only its text side at the
# released size, bf16, plus the transformer's embedders that name it LTX-2's; CAPTIONS captioned grey images).
# Every caption is padded to 1024 tokens, as ltx-core pads it, so the work per caption does not depend on the
# tokenizer: the LTX-2 text fixture's small word-level tokenizer.json stands in for Gemma's. LTX-2.3's connector
# sizes are an assumption (see crates/framesmith-bench/src/synth_ltx2_text.rs).
# Each case writes its log (with timestamps; peak RAM from /usr/bin/time -v) and an nvidia-smi trace under
# OUT_DIR/CASE; OUT_DIR/summary.txt gets one line per case: captions cached, wall time, the pass's peak VRAM (the
# budget's hold left out) and how Gemma was kept. Builds nothing.
# Usage: bench/run-ltx2-text.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith, framesmith-bench)
#   text-16 / text-24   `framesmith cache text --vram-budget-gb N`
#   text                no budget
# No CASE: text-16 text-24. RELEASE (ltx23 or ltx2, default ltx23), CAPTIONS (default 100), SEED (default 0).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,16p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(text-16 text-24)
RELEASE="${RELEASE:-ltx23}" CAPTIONS="${CAPTIONS:-100}" SEED="${SEED:-0}"
HERE="$(cd "$(dirname "$0")" && pwd)"
TOKENIZER="$HERE/../crates/framesmith-models/tests/fixtures/ltx2_text/ltx2/gemma/tokenizer.json"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
begin_cases ltx2-text
TIMED_PATTERN="text encoder|VRAM|cached|written|Error|error|Elapsed \(wall|Maximum resident"
P="$WORK/ltx2-text-$RELEASE"

# `framesmith cache text` of the captions, fresh each time, and its summary line.
text_case() { # case-dir label [extra args...]
    local d="$1" label="$2"; shift 2
    rm -rf "$P/captions_cache"
    timed "$d" cache framesmith cache text --dataset "$P/captions.toml" \
        --text-encoder "$P/gemma_3_12B_it_fp8_scaled.safetensors" --tokenizer "$TOKENIZER" \
        --dit "$(ls "$P"/ltx-2*-text-synth.safetensors | head -1)" --device cuda "$@"
    python3 - "$d/cache.log" "$label" "$P/captions_cache" >> "$SUMMARY" <<'PY'
import pathlib, re, sys
log = open(sys.argv[1], errors="replace").read()
files = len(list(pathlib.Path(sys.argv[3]).glob("*_ltx2_te.safetensors")))
wall = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([0-9:.]+)", log)
vram = re.findall(r"VRAM: peak ([0-9.]+) GiB", log)
rss = re.findall(r"Maximum resident set size \(kbytes\): ([0-9]+)", log)
enc = re.findall(r"text encoder: (Gemma 3 \(.*)", log)
out = f"{sys.argv[2]:<34} {files} captions cached"
out += f", wall {wall[-1]}" if wall else ""
out += f", peak VRAM {float(vram[-1]):.2f} GiB" if vram else ", no VRAM line"
out += f", peak RSS {int(rss[-1]) / 2**20:.1f} GiB" if rss else ""
out += f" ({enc[-1].strip()})" if enc else ""
print(out)
PY
}

write_env "LTX-2 text caching, release $RELEASE"
if [[ ! -f "$P/captions.toml" ]]; then
    df -h "$WORK" | tail -1 | tee -a "$OUT/env.txt"
    timed "$OUT" synth framesmith-bench synth-project --model ltx2-text --release "$RELEASE" --out "$P" \
        --captions "$CAPTIONS" --seed "$SEED" || { note "synth failed"; exit 1; }
fi
for case in "${CASES[@]}"; do
    D="$OUT/$case"
    mkdir -p "$D"
    start_smi "$D"
    case "$case" in
    text) text_case "$D" "cache text ($RELEASE), no budget" ;;
    text-24|text-16)
        gb="${case#text-}"
        text_case "$D" "cache text ($RELEASE), $gb GiB" --vram-budget-gb "$gb"
        ;;
    *) note "unknown case $case" ;;
    esac
    stop_smi "$case" "$D"
done
finish_cases "LTX-2 text caching ($RELEASE), $CAPTIONS captions, Gemma 3 12B FP8-scaled file"
