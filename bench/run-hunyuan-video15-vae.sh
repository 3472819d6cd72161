#!/usr/bin/env bash
# Issue 44's VAE rows: HunyuanVideo 1.5's 3-D causal VAE encoding a 121-frame 848x480 clip, random weights at the
# released size (bf16, official names, drawn by bench/reference/hunyuan_video15_vae.py --write-released), through
# the product's own `framesmith cache latents` (a synthetic ffmpeg testsrc clip, musubi-tuner dataset TOML) within
# `--vram-budget-gb 24` (whole frames) and 16 (--tiled, 128-pixel tiles), against the official PyTorch encode and
# decode (bf16, the official spatial tiling 256/0.125, whole clip) in the same run. Peak VRAM of framesmith from an
# nvidia-smi trace (memory.used, 100 ms), wall time and peak RAM from /usr/bin/time -v; the PyTorch line
# (HV15_VAE_TORCH) from torch.cuda.max_memory_allocated. Builds nothing; needs ffmpeg, torch, safetensors, einops
# and diffusers importable (carry their wheels) and the official VAE file: the script reads
# bench/reference/hunyuan_video15_vae.official.py when present (a copy of hyvideo/models/autoencoders/
# hunyuanvideo_15_vae.py at commit 60783e704160023913bee78f0b47036d393d4dfa), else the mirror.
# Usage: bench/run-hunyuan-video15-vae.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith)
#   torch      the official encode and decode (TILE, OVERLAP: 256, 0.125)
#   budget-24  framesmith cache latents --vram-budget-gb 24 (whole frames, temporal chunks)
#   budget-16  framesmith cache latents --vram-budget-gb 16 --tiled
# No CASE: torch budget-24 budget-16. WIDTH, HEIGHT, FRAMES (848, 480, 121).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,17p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(torch budget-24 budget-16)
WIDTH="${WIDTH:-848}" HEIGHT="${HEIGHT:-480}" FRAMES="${FRAMES:-121}" TILE="${TILE:-256}" OVERLAP="${OVERLAP:-0.125}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
[[ -f "$HERE/reference/hunyuan_video15_vae.official.py" ]] &&
    export HV15_VAE_SOURCE="$HERE/reference/hunyuan_video15_vae.official.py"
source "$HERE/device-env.sh"
use_nvidia_libs
START=$(date +%s%N)
mkdir -p "$OUT" "$WORK"
LOG="$OUT/hunyuan-video15-vae.log"
SUMMARY="$OUT/summary.txt"
TIMED_PATTERN="HV15_VAE_TORCH|VAE:|cached|written|Error|error|Elapsed \(wall|Maximum resident"
VAE="$WORK/hunyuanvideo15_vae_random_bf16.safetensors"
DATA="$WORK/hv15-vae-data"

if [[ ! -f "$VAE" ]]; then
    timed "$OUT" write-vae python3 "$HERE/reference/hunyuan_video15_vae.py" --write-released "$VAE" || exit 1
fi
if [[ ! -f "$DATA/videos/clip.mp4" ]]; then
    mkdir -p "$DATA/videos"
    ffmpeg -v error -f lavfi -i "testsrc2=size=${WIDTH}x${HEIGHT}:rate=24" -frames:v "$FRAMES" -pix_fmt yuv420p \
        "$DATA/videos/clip.mp4" || exit 1
    echo "a test pattern" > "$DATA/videos/clip.txt"
fi

# framesmith cache latents into a fresh cache folder, with an nvidia-smi trace; one summary line.
cache_case() { # case budget-gb [extra args...]
    local name="$1" budget="$2"; shift 2
    local d="$OUT/$name"
    mkdir -p "$d"
    rm -rf "$DATA/cache-$name"
    printf '[general]\nresolution = [%s, %s]\ncaption_extension = ".txt"\nenable_bucket = false\n\n[[datasets]]\nvideo_directory = "%s"\ncache_directory = "%s"\ntarget_frames = [%s]\nframe_extraction = "head"\n' \
        "$WIDTH" "$HEIGHT" "$DATA/videos" "$DATA/cache-$name" "$FRAMES" > "$d/dataset.toml"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$d/nvidia-smi.csv" &
    local smi=$!
    timed "$d" cache framesmith cache latents --dataset "$d/dataset.toml" --vae "$VAE" \
        --vram-budget-gb "$budget" "$@"
    local rc=$?
    kill "$smi" 2>/dev/null
    local peak wall
    peak=$(sort -n "$d/nvidia-smi.csv" | tail -1)
    wall=$(grep -E "Elapsed \(wall" "$d/cache.log" | sed 's/.*): //')
    echo "hv15-vae $name: exit $rc, wall $wall, nvidia-smi peak ${peak} MiB (whole card, the budget's hold included), $(ls "$DATA/cache-$name" 2>/dev/null | tr '\n' ' ')" | tee -a "$SUMMARY"
}

for c in "${CASES[@]}"; do
    case "$c" in
        torch)
            timed "$OUT/torch" torch python3 "$HERE/reference/hunyuan_video15_vae.py" --bench "$VAE" \
                --frames "$FRAMES" --height "$HEIGHT" --width "$WIDTH" --tile "$TILE" --overlap "$OVERLAP"
            grep -h "HV15_VAE_TORCH" "$OUT/torch/torch.log" | sed 's/^ *[0-9.]* //' | sed 's/^/hv15-vae torch: /' >> "$SUMMARY"
            ;;
        budget-24) cache_case budget-24 24 ;;
        budget-16) cache_case budget-16 16 --tiled ;;
        *) echo "unknown case $c" | tee -a "$LOG" ;;
    esac
done
cat "$SUMMARY"
