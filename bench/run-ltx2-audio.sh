#!/usr/bin/env bash
# Issue 45's audio rows: LTX-2's audio VAE and vocoder at the released architecture (random bf16 weights written by
# bench/reference/ltx2_audio.py --write-released under the single file's `audio_vae.` / `vocoder.` names with the
# `config` metadata, beside LTX-2.3's video VAE from bench/reference/ltx2_vae.py, as the checkpoint holds both):
#   ours   framesmith-bench ltx2-audio: a 5 s stereo waveform encoded, decoded and vocoded on the GPU (bf16;
#          milliseconds after a warm-up), the GPU's f32 outputs against the CPU's on 1 s (relative error), the sound
#          muxed into an MP4 (LTX2_AUDIO_OURS line)
#   torch  the official encode_audio / decode_audio of the same length in PyTorch (bf16; LTX2_AUDIO_TORCH line;
#          needs ltx-core, einops and torchaudio importable: LTX_WHEELS as in bench/run-ltx2.sh)
#   cache  framesmith cache latents of a 768x512 x 121-frame clip with a stereo 44.1 kHz tone: the `_ltx2` and
#          `_ltx2_audio` caches (wall time, peak RAM, an nvidia-smi trace)
# Builds nothing.
# Usage: bench/run-ltx2-audio.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith, framesmith-bench)
# No CASE: ours torch cache. SECONDS (5), WIDTH, HEIGHT, FRAMES (768, 512, 121).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,15p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(ours torch cache)
SECONDS_LONG="${SECONDS_LONG:-5}" WIDTH="${WIDTH:-768}" HEIGHT="${HEIGHT:-512}" FRAMES="${FRAMES:-121}"
LTX_WHEELS="${LTX_WHEELS:-}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
use_nvidia_libs
mkdir -p "$OUT" "$WORK"
LOG="$OUT/ltx2-audio.log"
SUMMARY="$OUT/summary.txt"
TIMED_PATTERN="LTX2_AUDIO_|audio VAE|VAE:|cached|written|warning|Error|error|Elapsed \(wall|Maximum resident"
VAE="$WORK/ltx2_vae_random_bf16.safetensors"
FILE="$WORK/ltx2_vae_audio_random_bf16.safetensors"
DATA="$WORK/ltx2-audio-data"
PYDEPS="$WORK/pydeps"
if [[ -n "$LTX_WHEELS" && ! -d "$PYDEPS" ]]; then
    python3 -m pip install --no-deps --no-index --target "$PYDEPS" "$LTX_WHEELS"/*.whl > "$OUT/pip.log" 2>&1 \
        || note "installing $LTX_WHEELS failed: see $OUT/pip.log"
fi
export PYTHONPATH="$PYDEPS${PYTHONPATH:+:$PYTHONPATH}"

if [[ ! -f "$FILE" ]]; then
    if [[ ! -f "$VAE" ]]; then
        timed "$OUT" write-vae python3 "$HERE/reference/ltx2_vae.py" --write-released "$VAE" || exit 1
    fi
    timed "$OUT" write-audio python3 "$HERE/reference/ltx2_audio.py" --write-released "$FILE" "$VAE" || exit 1
fi

for c in "${CASES[@]}"; do
    case "$c" in
        ours)
            timed "$OUT/ours" ours framesmith-bench ltx2-audio --file "$FILE" --seconds "$SECONDS_LONG" \
                --out "$OUT/ours"
            grep -h "LTX2_AUDIO_OURS" "$OUT/ours/ours.log" | sed 's/^.*LTX2_AUDIO_OURS/ltx2-audio ours:/' >> "$SUMMARY"
            ;;
        torch)
            timed "$OUT/torch" torch python3 "$HERE/reference/ltx2_audio.py" --bench "$FILE" "$SECONDS_LONG"
            grep -h "LTX2_AUDIO_TORCH" "$OUT/torch/torch.log" | sed 's/^.*LTX2_AUDIO_TORCH/ltx2-audio torch:/' >> "$SUMMARY"
            ;;
        cache)
            d="$OUT/cache"
            mkdir -p "$d" "$DATA/videos"
            if [[ ! -f "$DATA/videos/clip.mp4" ]]; then
                secs=$(python3 -c "print($FRAMES / 24)")
                ffmpeg -v error -f lavfi -i "testsrc2=size=${WIDTH}x${HEIGHT}:rate=24" \
                    -f lavfi -i "sine=frequency=440:sample_rate=44100:duration=$((FRAMES / 24 + 2))" \
                    -t "$secs" -ac 2 -c:a aac -pix_fmt yuv420p "$DATA/videos/clip.mp4" || exit 1
                echo "a test pattern with a tone" > "$DATA/videos/clip.txt"
            fi
            rm -rf "$DATA/cache"
            mkdir -p "$DATA/cache"
            printf '[general]\nresolution = [%s, %s]\ncaption_extension = ".txt"\nenable_bucket = false\n\n[[datasets]]\nvideo_directory = "%s"\ncache_directory = "%s"\ntarget_frames = [%s]\nframe_extraction = "head"\n' \
                "$WIDTH" "$HEIGHT" "$DATA/videos" "$DATA/cache" "$FRAMES" > "$d/dataset.toml"
            nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$d/nvidia-smi.csv" &
            smi=$!
            timed "$d" cache framesmith cache latents --dataset "$d/dataset.toml" --vae "$FILE"
            rc=$?
            kill "$smi" 2>/dev/null
            peak=$(sort -n "$d/nvidia-smi.csv" | tail -1)
            wall=$(grep -E "Elapsed \(wall" "$d/cache.log" | sed 's/.*): //')
            echo "ltx2-audio cache: exit $rc, wall $wall, nvidia-smi peak ${peak} MiB, $(ls "$DATA/cache" 2>/dev/null | tr '\n' ' ')" |
                tee -a "$SUMMARY"
            ;;
        *) echo "unknown case $c" | tee -a "$LOG" ;;
    esac
done
cat "$SUMMARY"
