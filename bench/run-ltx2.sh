#!/usr/bin/env bash
# Issue 45's GPU rows through the product's own commands: LTX-2.3 (22B) T2V LoRA rank 32 at 768x512 x 121 frames
# (and the joint audio-video step, case av-bf16),
# batch 1, random weights at the released size (`framesmith-bench synth-project --model ltx2`: the video stream of
# the transformer in bf16 under the official single-file names with the release's `config` metadata, ~26 GB; the
# audio stream, never read for T2V, is left out; one cached clip of random latents [128, 16, 16, 24] and a random
# connector output [1024, 4096] in the `_ltx2` format of musubi-tuner's LTX-2 branch), trained with `framesmith
# train`, against a PyTorch step of the official transformer (ltx-core's LTXModel, video-only, at Lightricks/LTX-2
# @400fd31: bench/reference/ltx2_step.py, bf16, its per-block checkpointing, rank 32 on the same targets) on the
# same bf16 weights and cached inputs. The PyTorch case needs ltx-core and einops importable: build their wheels
# where the network is (`/work/venv-ref/bin/python -m pip wheel --no-deps -w wheels <LTX-2 checkout at
# 400fd31>/packages/ltx-core einops`), carry `wheels/`, and set LTX_WHEELS to it (installed with --no-deps into
# WORK/pydeps, put on PYTHONPATH for the torch case only).
# Disk: the bf16 file is the only DiT (FP8 is quantised from it at load), ~26 GB of the device's 64 GiB.
# Each case writes its logs (with timestamps; peak RAM from /usr/bin/time -v), its metrics.jsonl and an nvidia-smi
# trace under OUT_DIR/CASE; OUT_DIR/summary.txt gets one line per run. Builds nothing.
# Usage: bench/run-ltx2.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith, framesmith-bench)
#   torch         the PyTorch step on the bf16 file and the project's caches (TORCH_WARMUP, TORCH_ITERS)
#   bf16          `framesmith train`, bf16 base, every block resident
#   fp8           FP8 block-64 base quantised from the bf16 file at load, resident
#   budget-24 / budget-16   `--preset ltx2-Ngb --vram-budget-gb N` over a config that names only the files, steps
#                 and outputs (so every memory setting is the preset's: FP8 block-64, pinned streaming,
#                 blocks_to_swap = "auto", activations in RAM); `framesmith plan` first.
#   av-bf16       joint audio-video training at the released size: its own project (`synth-project --audio`: both
#                 streams and the audio-video cross-attentions in bf16, ~37 GB, and the clip's `_ltx2_audio` cache,
#                 audio latents [8, 126, 16] at 121 frames, with the audio connector's output), `framesmith train`,
#                 bf16, every block resident. Disk: run it alone (`bench/run-ltx2.sh BIN OUT WORK av-bf16`), so
#                 the video-only project (~26 GB) is not written beside it.
#   generate-24   `framesmith generate` of one GEN_FRAMES-frame (121) 768x512 clip within `--vram-budget-gb 24`:
#                 GEN_STEPS (4) LTX2Scheduler steps with CFG 3 and the rescale (the default negative prompt as its
#                 own pass), the project's DiT in FP8 block-64 with GEN_SWAP (16) of its 48 blocks streamed, video
#                 stream only; Gemma 3 12B (ComfyUI scaled FP8, random) with the LTX-2.3 text connector of
#                 `synth-project --model ltx2-text` (the LTX-2 text fixture's tokenizer stands in for Gemma's) and
#                 LTX-2.3's video VAE at its released architecture (random bf16, bench/reference/ltx2_vae.py
#                 --write-released: needs torch and ltx-core as the torch case does), the VAE and the connector
#                 joined into one file given as --vae (the DiT file holds neither), written once under
#                 WORK/ltx2-gen (~20 GB more). Summary: the per-step times, the decode time and peak VRAM the
#                 generator logs. Run it after (or without) the training cases: disk.
#   i2v-bf16      as bf16 with `training.first_frame_conditioning_p = 1.0`: every step conditioned on the clip's
#                 clean first frame (per-token AdaLN rows, the first frame out of the loss). The other training
#                 cases are text-to-video on every step (the synth project's p = 0), as the PyTorch step is.
# No CASE: torch bf16 fp8 budget-24 budget-16. STEPS (default 6) optimizer steps per training run; SEED (default 0);
# TEXT_TOKENS (default 1024) tokens of the cached connector output; WIDTH, HEIGHT, FRAMES (768, 512, 121); LAYERS:
# the video-stream project with only the first LAYERS of the 48 blocks (its own folder; a short trial of the step at
# the real width and sequence, for torch and the training cases).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,45p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(torch bf16 fp8 budget-24 budget-16)
STEPS="${STEPS:-6}" SEED="${SEED:-0}" RANK="${RANK:-32}" TEXT_TOKENS="${TEXT_TOKENS:-1024}"
WIDTH="${WIDTH:-768}" HEIGHT="${HEIGHT:-512}" FRAMES="${FRAMES:-121}"
TORCH_WARMUP="${TORCH_WARMUP:-2}" TORCH_ITERS="${TORCH_ITERS:-6}" LTX_WHEELS="${LTX_WHEELS:-}"
GEN_STEPS="${GEN_STEPS:-4}" GEN_SWAP="${GEN_SWAP:-16}" GEN_FRAMES="${GEN_FRAMES:-121}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
begin_cases ltx2
TIMED_PATTERN="step [0-9]+.*loss|LoRA:|VRAM|stream|plan|cached|LTX2_STEP|Error|error|Elapsed \(wall|Maximum resident"
LAYER_ARGS=()
[[ -n "${LAYERS:-}" ]] && LAYER_ARGS=(--layers "$LAYERS")
P="$WORK/ltx2${LAYERS:+-$LAYERS-layers}"
DIT="$P/ltx-2.3-22b-video-stream-synth-bf16.safetensors"
PYDEPS="$WORK/pydeps"
GEMMA_TOKENIZER="$HERE/../crates/framesmith-models/tests/fixtures/ltx2_text/ltx2/gemma/tokenizer.json"

# The PyTorch step on the project's bf16 file and caches, and its summary line.
torch_case() { # case-dir label
    local d="$1" label="$2"
    if [[ -n "$LTX_WHEELS" && ! -d "$PYDEPS" ]]; then
        python3 -m pip install --no-deps --no-index --target "$PYDEPS" "$LTX_WHEELS"/*.whl > "$d/pip.log" 2>&1 \
            || note "installing $LTX_WHEELS failed: see $d/pip.log"
    fi
    (
        export PYTHONPATH="$PYDEPS${PYTHONPATH:+:$PYTHONPATH}"
        timed "$d" torch python3 "$HERE/reference/ltx2_step.py" --dit "$DIT" \
            --latent-cache "$(ls "$P"/cache/*_ltx2.safetensors | head -1)" \
            --text-cache "$(ls "$P"/cache/*_ltx2_te.safetensors | head -1)" \
            --rank "$RANK" --warmup "$TORCH_WARMUP" --iters "$TORCH_ITERS"
    )
    summarise_torch "$d/torch.log" "$label" LTX2_STEP
}

# The joint audio-video case on its own project (both streams), and its summary line.
av_case() { # case-dir
    local d="$1" pa="$WORK/ltx2-av"
    if [[ ! -f "$pa/run.toml" ]]; then
        timed "$d" synth framesmith-bench synth-project --model ltx2 --audio --out "$pa" --height "$HEIGHT" \
            --width "$WIDTH" --frames "$FRAMES" --text-tokens "$TEXT_TOKENS" --rank "$RANK" --steps "$STEPS" \
            --seed "$SEED" || { note "synth --audio failed"; return 1; }
    fi
    local p_video="$P"
    P="$pa"
    config "$pa" "$pa/av-bf16.toml" bf16 off
    train_case "$d" "$pa/av-bf16.toml" "framesmith train, audio+video, bf16, resident"
    P="$p_video"
}

# The files `framesmith generate` takes besides the DiT, written once into WORK/ltx2-gen: Gemma 3 and the
# LTX-2.3 text side (synth-project ltx2-text), the released-architecture VAE, and that VAE with the text side
# joined into one file (as the official checkpoint holds both).
generate_files() { # case-dir
    local d="$1" g="$WORK/ltx2-gen"
    if [[ ! -f "$g/captions.toml" ]]; then
        timed "$d" synth-text framesmith-bench synth-project --model ltx2-text --release ltx23 --out "$g" \
            --captions 1 --seed "$SEED" || return 1
    fi
    if [[ ! -f "$g/vae-and-text.safetensors" ]]; then
        if [[ -n "$LTX_WHEELS" && ! -d "$PYDEPS" ]]; then
            python3 -m pip install --no-deps --no-index --target "$PYDEPS" "$LTX_WHEELS"/*.whl > "$d/pip.log" 2>&1
        fi
        PYTHONPATH="$PYDEPS${PYTHONPATH:+:$PYTHONPATH}" timed "$d" write-vae python3 \
            "$HERE/reference/ltx2_vae.py" --write-released "$g/vae.safetensors" || return 1
        python3 - "$g/vae.safetensors" "$(ls "$g"/ltx-2*-text-synth.safetensors | head -1)" \
            "$g/vae-and-text.safetensors" <<'PY' || return 1
import json, sys
from safetensors import safe_open
from safetensors.torch import save_file
tensors, config = {}, {}
for path in sys.argv[1:3]:
    with safe_open(path, framework="pt") as f:
        config.update(json.loads(f.metadata()["config"]))
        tensors.update({k: f.get_tensor(k) for k in f.keys()})
save_file(tensors, sys.argv[3], metadata={"config": json.dumps(config)})
print(f"joined {len(tensors)} tensors into {sys.argv[3]}")
PY
        rm -f "$g/vae.safetensors"
    fi
}

# `framesmith generate` within 24 GiB, and its summary lines.
generate_case() { # case-dir
    local d="$1" g="$WORK/ltx2-gen"
    generate_files "$d" || { note "generate files failed"; return 1; }
    timed "$d" generate framesmith generate --dit "$DIT" --vae "$g/vae-and-text.safetensors" \
        --text-encoder "$g/gemma_3_12B_it_fp8_scaled.safetensors" --tokenizer "$GEMMA_TOKENIZER" \
        --prompt "a red fox runs through deep snow at dawn, the camera tracking beside it" \
        --width 768 --height 512 --frames "$GEN_FRAMES" --steps "$GEN_STEPS" --seed 7 --fp8 block64 \
        --blocks-to-swap "$GEN_SWAP" --vram-budget-gb 24 --device cuda --out "$d/clip.mp4"
    grep -hE "step|decode|VRAM|peak|Gemma|DiT:|wrote|rror" "$d/generate.log" | tail -10 \
        | sed "s/^/  generate-24: /" >> "$SUMMARY"
}

# `bf16` with every clip conditioned on its first frame, and its summary line.
i2v_case() { # case-dir
    local d="$1" toml="$P/i2v-bf16.toml"
    config "$P" "$toml" bf16 off
    python3 - "$toml" <<'EOF'
import re, sys, tomllib
path = sys.argv[1]
text = re.sub(r"(?m)^first_frame_conditioning_p = .*\n", "", open(path).read())
key = "first_frame_conditioning_p = 1.0"
assert "[training]\n" in text, "run.toml has no [training] table"
text = text.replace("[training]\n", "[training]\n" + key + "\n", 1)
assert tomllib.loads(text)["training"]["first_frame_conditioning_p"] == 1.0
open(path, "w").write(text)
EOF
    train_case "$d" "$toml" "framesmith train, bf16, resident, I2V p=1"
}

write_env "$(PYTHONPATH="$PYDEPS" python3 -c 'import ltx_core; print("ltx-core", ltx_core.__file__)' 2>&1 | tail -1)"
video_cases=0
for case in "${CASES[@]}"; do [[ "$case" == av-* ]] || video_cases=1; done
if [[ $video_cases == 1 && ! -f "$P/run.toml" ]]; then
    df -h "$WORK" | tail -1 | tee -a "$OUT/env.txt"
    timed "$OUT" synth framesmith-bench synth-project --model ltx2 --out "$P" --height "$HEIGHT" \
        --width "$WIDTH" --frames "$FRAMES" --text-tokens "$TEXT_TOKENS" --rank "$RANK" --steps "$STEPS" \
        --seed "$SEED" "${LAYER_ARGS[@]}" || { note "synth failed"; exit 1; }
fi
for case in "${CASES[@]}"; do
    D="$OUT/$case"
    mkdir -p "$D"
    start_smi "$D"
    case "$case" in
    torch) torch_case "$D" "PyTorch (ltx-core LTXModel, bf16)" ;;
    av-bf16) av_case "$D" ;;
    generate-24) generate_case "$D" ;;
    i2v-bf16) i2v_case "$D" ;;
    *) memory_case "$case" "$D" ltx2 || note "unknown case $case" ;;
    esac
    stop_smi "$case" "$D"
done
finish_cases "LTX-2.3 T2V LoRA rank $RANK, ${WIDTH}x${HEIGHT}x${FRAMES}, batch 1"
