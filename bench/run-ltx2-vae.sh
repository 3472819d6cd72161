#!/usr/bin/env bash
# Issue 45's video VAE rows: LTX-2.3's video VAE at the released architecture (random bf16 weights, ~1 B
# parameters, written by bench/reference/ltx2_vae.py --write-released under the single file's `vae.` names with the
# `config` metadata) at 768x512 x 121 frames: `framesmith cache latents` of a synthetic ffmpeg clip of that size
# (the product's latent pass: the whole-clip encode, `_ltx2` caches; wall time, peak RAM, an nvidia-smi trace) and,
# with `--tiled`, in 512-pixel tiles; against the official ltx-core encode and tiled decode of a random clip in
# PyTorch (bf16; milliseconds after a warm-up and peak GiB above the weights) in the same run. The torch case needs
# ltx-core and einops importable (LTX_WHEELS as in bench/run-ltx2.sh). Builds nothing.
# Usage: bench/run-ltx2-vae.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith)
#   torch       the official encode and tiled decode (LTX2_VAE_TORCH line)
#   cache       framesmith cache latents of one clip, whole frames
#   cache-tiled the same with --tiled
# No CASE: torch cache cache-tiled. WIDTH, HEIGHT, FRAMES (768, 512, 121).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,13p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(torch cache cache-tiled)
WIDTH="${WIDTH:-768}" HEIGHT="${HEIGHT:-512}" FRAMES="${FRAMES:-121}" LTX_WHEELS="${LTX_WHEELS:-}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
use_nvidia_libs
mkdir -p "$OUT" "$WORK"
LOG="$OUT/ltx2-vae.log"
SUMMARY="$OUT/summary.txt"
TIMED_PATTERN="LTX2_VAE_|VAE:|cached|written|Error|error|Elapsed \(wall|Maximum resident"
VAE="$WORK/ltx2_vae_random_bf16.safetensors"
DATA="$WORK/ltx2-vae-data"
PYDEPS="$WORK/pydeps"
if [[ -n "$LTX_WHEELS" && ! -d "$PYDEPS" ]]; then
    python3 -m pip install --no-deps --no-index --target "$PYDEPS" "$LTX_WHEELS"/*.whl > "$OUT/pip.log" 2>&1 \
        || note "installing $LTX_WHEELS failed: see $OUT/pip.log"
fi
export PYTHONPATH="$PYDEPS${PYTHONPATH:+:$PYTHONPATH}"

if [[ ! -f "$VAE" ]]; then
    timed "$OUT" write-vae python3 "$HERE/reference/ltx2_vae.py" --write-released "$VAE" || exit 1
fi

for c in "${CASES[@]}"; do
    case "$c" in
        torch)
            timed "$OUT/torch" torch python3 "$HERE/reference/ltx2_vae.py" --bench "$VAE" "$FRAMES" "$HEIGHT" "$WIDTH"
            grep -h "LTX2_VAE_TORCH" "$OUT/torch/torch.log" | sed 's/^.*LTX2_VAE_TORCH/ltx2-vae torch:/' >> "$SUMMARY"
            ;;
        cache | cache-tiled)
            d="$OUT/$c"
            extra=()
            [[ "$c" == cache-tiled ]] && extra=(--tiled)
            mkdir -p "$d" "$DATA/videos"
            if [[ ! -f "$DATA/videos/clip.mp4" ]]; then
                ffmpeg -v error -f lavfi -i "testsrc2=size=${WIDTH}x${HEIGHT}:rate=24" -frames:v "$FRAMES" \
                    -pix_fmt yuv420p "$DATA/videos/clip.mp4" || exit 1
                echo "a test pattern" > "$DATA/videos/clip.txt"
            fi
            rm -rf "$DATA/cache"
            mkdir -p "$DATA/cache"
            printf '[general]\nresolution = [%s, %s]\ncaption_extension = ".txt"\nenable_bucket = false\n\n[[datasets]]\nvideo_directory = "%s"\ncache_directory = "%s"\ntarget_frames = [%s]\nframe_extraction = "head"\n' \
                "$WIDTH" "$HEIGHT" "$DATA/videos" "$DATA/cache" "$FRAMES" > "$d/dataset.toml"
            nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$d/nvidia-smi.csv" &
            smi=$!
            timed "$d" cache framesmith cache latents --dataset "$d/dataset.toml" --vae "$VAE" "${extra[@]}"
            rc=$?
            kill "$smi" 2>/dev/null
            peak=$(sort -n "$d/nvidia-smi.csv" | tail -1)
            wall=$(grep -E "Elapsed \(wall" "$d/cache.log" | sed 's/.*): //')
            echo "ltx2-vae $c: exit $rc, wall $wall, nvidia-smi peak ${peak} MiB, $(ls "$DATA/cache" 2>/dev/null | tr '\n' ' ')" |
                tee -a "$SUMMARY"
            ;;
        *) echo "unknown case $c" | tee -a "$LOG" ;;
    esac
done
cat "$SUMMARY"
