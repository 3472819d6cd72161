#!/usr/bin/env bash
# The product path of issue 21 end to end on a GPU machine, through the product's own commands only:
# random Wan2.1-14B weights in ComfyUI's single-file layouts at their real sizes (`framesmith-bench synth-project
# --dtype fp8-scaled --encoders`: the scaled-FP8 DiT, the scaled-FP8 umT5-XXL with its tokenizer embedded, the
# Wan 2.1 VAE), a real dataset made with ffmpeg (bench/make-dataset.sh: videos of several sizes and lengths,
# images, captions), then `framesmith doctor`, `dataset check`, `cache latents` and `cache text` on the GPU,
# `plan`, and `train --preset balanced-24gb --vram-budget-gb 24` with samples and saves, killed with SIGKILL
# after its step-4 save and resumed to the end. Logs with timestamps; peak RAM from /usr/bin/time. Builds nothing.
# Usage: bench/run-e2e.sh BIN_DIR DATA_DIR OUT_DIR [WORK_DIR]   (E2E_PREPARE_ONLY=1: stop after the plan;
#   E2E_VARIANT=i2v-a14b: Wan2.2 I2V-A14B, image-to-video caches and samples from a start image;
#   E2E_EXPERTS=joint|split with an A14B variant: both experts in one run, the low-noise one synthesised with
#   another seed)
#   E2E_VARIANT=ti2v-5b: Wan2.2 TI2V-5B with the Wan2.2 VAE, trained with training.mode = E2E_MODE (default
#   image_to_video; text_to_video also works), samples text-to-video and from a start image)
#   BIN_DIR holds framesmith, framesmith-bench and (where the machine has none) ffmpeg and ffprobe.
set -uo pipefail
BIN="$(realpath "$1")" DATA="$(realpath "$2")" LOG="$3" WORK="${4:-/tmp/framesmith-e2e}"
STEPS="${E2E_STEPS:-6}" KILL_AFTER="${E2E_KILL_AFTER:-4}" VARIANT="${E2E_VARIANT:-t2v-14b}"
MODE="auto" VAE_FILE="wan_2.1_vae.safetensors"
[[ "$VARIANT" == ti2v-* ]] && MODE="${E2E_MODE:-image_to_video}" VAE_FILE="wan2.2_vae.safetensors"
mkdir -p "$LOG" "$WORK"
export PATH="$BIN:$PATH"
source "$(dirname "$0")/device-env.sh"
use_nvidia_libs
START=$(date +%s%N)
step() { echo "== $* ==" | stamp | tee -a "$LOG/e2e.log"; }
timed() { # name, command...: runs under /usr/bin/time -v into $LOG/name.log
    local name="$1"; shift
    step "$name: $*"
    /usr/bin/time -v "$@" 2>&1 | stamp > "$LOG/$name.log"
    local rc=${PIPESTATUS[0]}
    grep -E "Elapsed \(wall|Maximum resident" "$LOG/$name.log" | sed "s/^/   $name: /" | tee -a "$LOG/e2e.log"
    echo "   $name: exit $rc" | tee -a "$LOG/e2e.log"
    return "$rc"
}

MODELS="$WORK/models"
SPIECE="$(dirname "$0")/../crates/framesmith-models/testdata/spiece_tiny/tiny_unigram.model"
if [[ ! -f "$MODELS/run.toml" ]]; then
    timed synth framesmith-bench synth-project --variant "$VARIANT" --dtype fp8-scaled --encoders "$SPIECE" \
        --out "$MODELS" --frames 81 --height 480 --width 832 --steps "$STEPS" || exit 1
fi
EXPERTS="${E2E_EXPERTS:-}" LOW="$WORK/models-low"
if [[ -n "$EXPERTS" && ! -f "$LOW/dit.safetensors" ]]; then
    timed synth-low framesmith-bench synth-project --variant "$VARIANT" --dtype fp8-scaled --seed 1 --out "$LOW" \
        --frames 81 --height 480 --width 832 --steps "$STEPS" || exit 1
fi
DIT="$MODELS/dit.safetensors" VAE="$MODELS/$VAE_FILE"
T5="$MODELS/umt5_xxl_fp8_e4m3fn_scaled.safetensors"
ls -la "$MODELS" | tee -a "$LOG/e2e.log"
rm -rf "$WORK/data" && cp -r "$DATA" "$WORK/data" && rm -rf "$WORK/data/cache"

timed doctor framesmith doctor
for f in "$DIT" "$T5" "$VAE"; do framesmith inspect "$f" 2>&1 | head -20 >> "$LOG/inspect.log"; done
timed check-before framesmith dataset check "$WORK/data/dataset.toml"
# `--dit` makes the image-to-video parts (first-frame mask and latents) for an I2V DiT.
timed cache-latents framesmith cache latents --dataset "$WORK/data/dataset.toml" --vae "$VAE" --dit "$DIT" \
    --device cuda || exit 1
timed cache-text framesmith cache text --dataset "$WORK/data/dataset.toml" --text-encoder "$T5" --device cuda || exit 1
timed check-after framesmith dataset check "$WORK/data/dataset.toml"
find "$WORK/data/cache" -type f | sort | xargs ls -la >> "$LOG/caches.log"

# Image-to-video samples start from an image (`--i`); TI2V-5B samples both ways; text-to-video ones take none.
START_IMAGE=""
[[ "$VARIANT" == i2v-* || "$VARIANT" == ti2v-* ]] && START_IMAGE=" --i $WORK/data/images/fractal.jpg"
cat > "$WORK/prompts.txt" <<TXT
a test card with a moving colour bar, bright daylight --w 832 --h 480 --f 21 --s 4 --d 42$START_IMAGE
TXT
MODEL_EXTRA=""
[[ -n "$EXPERTS" ]] && MODEL_EXTRA="variant = \"$VARIANT\"
dit_low_noise = \"$LOW/dit.safetensors\"
experts = \"$EXPERTS\""
[[ "$VARIANT" == ti2v-* ]] && echo "a test card with a moving colour bar --w 832 --h 480 --f 21 --s 4 --d 7" >> "$WORK/prompts.txt"
cat > "$WORK/run.toml" <<TOML
[model]
dit = "$DIT"
vae = "$VAE"
text_encoder = "$T5"
$MODEL_EXTRA

[dataset]
config = "$WORK/data/dataset.toml"

[lora]
rank = 32
alpha = 32.0

[training]
mode = "$MODE"
max_train_steps = $STEPS
seed = 42
device = "cuda"

[output]
output_dir = "$WORK/output"
output_name = "e2e"
save_every_n_steps = 2
save_state = true

[sampling]
prompts = "$WORK/prompts.txt"
sample_every_n_steps = 3
TOML
cp "$WORK/run.toml" "$LOG/run.toml"
train_args=(--config "$WORK/run.toml" --preset balanced-24gb --vram-budget-gb 24)
timed plan framesmith plan "${train_args[@]}"
[[ -n "${E2E_PREPARE_ONLY:-}" ]] && { step "prepared (E2E_PREPARE_ONLY)"; exit 0; }
rm -rf "$WORK/output"

if (( KILL_AFTER >= STEPS )); then
    # E2E_KILL_AFTER at or past the last step: one uninterrupted run.
    timed train framesmith train "${train_args[@]}"
    grep -E "step .*loss|VRAM|sample|saved|Sample|Saved|expert" "$LOG/train.log" | head -40 >> "$LOG/e2e.log"
else
    step "train (killed with SIGKILL once e2e-state-$(printf %06d "$KILL_AFTER") is saved)"
    /usr/bin/time -v framesmith train "${train_args[@]}" > >(stamp > "$LOG/train-1.log") 2>&1 &
    TRAIN=$!
    state="$WORK/output/e2e-state-$(printf %06d "$KILL_AFTER")"
    for _ in $(seq 1 1200); do
        [[ -d "$state" ]] && break
        kill -0 "$TRAIN" 2>/dev/null || break
        sleep 0.5
    done
    sleep 4
    pkill -9 -x framesmith
    wait "$TRAIN"; echo "   train-1: killed (exit $?), state folders: $(ls "$WORK/output" | tr '\n' ' ')" | tee -a "$LOG/e2e.log"
    timed train-2-resume framesmith train "${train_args[@]}" --resume "$WORK/output"
    grep -E "resumed|step .*loss|VRAM|sample|saved|Sample|Saved" "$LOG/train-2-resume.log" | head -40 >> "$LOG/e2e.log"
fi
cp "$WORK/output/metrics.jsonl" "$LOG/" 2>/dev/null
find "$WORK/output" -maxdepth 3 | sort >> "$LOG/outputs.log"
sample=$(find "$WORK/output/samples" -name '*.mp4' | sort | tail -1)
[[ -n "$sample" ]] && cp "$sample" "$LOG/last-sample.mp4" && ffprobe -v error -show_entries stream=codec_name,width,height,nb_frames -of compact "$sample" | tee -a "$LOG/e2e.log"
step "done"
