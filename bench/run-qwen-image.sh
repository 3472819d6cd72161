#!/usr/bin/env bash
# Issue 43's GPU rows through the product's own commands: Qwen-Image LoRA rank 16 at 1024x1024, batch 1, random
# weights at the released size (`framesmith-bench synth-project --model qwen-image --sample-files`: a bf16
# `qwen_image_bf16.safetensors` under diffusers' names, one cached image of random latents and a random
# Qwen2.5-VL output, and a random Qwen2.5-VL-7B in ComfyUI's scaled-FP8 layout with CAPTIONS captioned images),
# trained with `framesmith train`, against a PyTorch step of the official transformer (diffusers'
# QwenImageTransformer2DModel: bench/reference/qwen_image_step.py, SDPA, bf16, its per-block checkpointing, rank 16)
# on the same bf16 weights and cached inputs. The PyTorch case needs diffusers importable (carry its wheel).
# Each case writes its logs (with timestamps; peak RAM from /usr/bin/time -v), its metrics.jsonl and an nvidia-smi
# trace under OUT_DIR/CASE; OUT_DIR/summary.txt gets one line per run. Builds nothing.
# Usage: bench/run-qwen-image.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith and framesmith-bench)
#   torch         the PyTorch step on the bf16 file and the project's caches (TORCH_WARMUP, TORCH_ITERS)
#   bf16          `framesmith train`, bf16 base, every block resident
#   fp8           FP8 block-64 base quantised from the bf16 file at load, resident
#   budget-24 / budget-16   `--preset qwen-image-Ngb --vram-budget-gb N` over a config that names only the files,
#                 steps and outputs (so every memory setting is the preset's: FP8 block-64, pinned streaming,
#                 blocks_to_swap = "auto", for 16 GB activations in RAM); `framesmith plan` first.
#   text / text-24 / text-16   `framesmith cache text` of the CAPTIONS captions with the Qwen2.5-VL file (the
#                 fixture's small tokenizer: more tokens per caption than Qwen's own), without a budget or under
#                 `--vram-budget-gb N`.
#   generate-24   `framesmith generate` of one 1024² image (GEN_STEPS denoising steps, true CFG, FP8 block-64 DiT
#                 with GEN_SWAP blocks streamed) within `--vram-budget-gb 24`: time per step, decode, peak VRAM.
#   samples-24    the budget-24 run with samples every STEPS/2 steps (one 1024² prompt, GEN_STEPS steps), with
#                 `framesmith plan` first: the plan's two phases (training step, sampling) against the VRAM lines
#                 the run logs after each sampling round (issue 47 item 2).
#   edit / edit-fp8 / edit-budget-24 / edit-budget-16   a Qwen-Image-Edit edit LoRA (synth-project --controls
#                 CONTROLS, default 1; 2 or 3 for Edit-2509: the image cached with that many SIZExSIZE control images,
#                 so a step runs (1 + CONTROLS)x the image tokens), bf16 resident, FP8 b64 resident, or the
#                 qwen-image-Ngb preset under `--vram-budget-gb N` (`framesmith plan` first). The text cache is
#                 Qwen-Image's (random), as the edit prompt encoding does not change the step's shapes.
# No CASE: torch bf16 fp8 budget-24 budget-16 text-24 text-16. STEPS (default 8) optimizer steps per training
# run; SEED (default 0); TEXT_TOKENS (default 128) tokens of the cached text.
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,31p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(torch bf16 fp8 budget-24 budget-16 text-24 text-16)
STEPS="${STEPS:-8}" SEED="${SEED:-0}" SIZE="${SIZE:-1024}" RANK="${RANK:-16}" CAPTIONS="${CAPTIONS:-100}"
CONTROLS="${CONTROLS:-1}" TEXT_TOKENS="${TEXT_TOKENS:-128}" TORCH_WARMUP="${TORCH_WARMUP:-2}" TORCH_ITERS="${TORCH_ITERS:-8}"
GEN_STEPS="${GEN_STEPS:-8}" GEN_SWAP="${GEN_SWAP:-20}"
HERE="$(cd "$(dirname "$0")" && pwd)"
TOKENIZER="$HERE/../crates/framesmith-models/tests/fixtures/qwen25vl/tokenizer.json"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
begin_cases qwen-image
TIMED_PATTERN="step [0-9]+.*loss|LoRA:|VRAM|stream|plan|text encoder|cached|QWEN_IMAGE_STEP|Error|error|Elapsed \(wall|Maximum resident"
P="$WORK/qwen-image"

# The PyTorch step on the project's bf16 file and caches, and its summary line.
torch_case() { # case-dir label
    local d="$1" label="$2"
    timed "$d" torch python3 "$HERE/reference/qwen_image_step.py" --dit "$P/qwen_image_bf16.safetensors" \
        --latent-cache "$(ls "$P"/cache/*_qi.safetensors | head -1)" \
        --text-cache "$(ls "$P"/cache/*_qi_te.safetensors | head -1)" \
        --rank "$RANK" --warmup "$TORCH_WARMUP" --iters "$TORCH_ITERS"
    summarise_torch "$d/torch.log" "$label" QWEN_IMAGE_STEP
}

# `framesmith cache text` of the captions, fresh each time, and its summary line (wall time, VRAM peak, RSS).
text_case() { # case-dir label [extra args...]
    local d="$1" label="$2"; shift 2
    rm -rf "$P/captions_cache"
    timed "$d" cache framesmith cache text --dataset "$P/captions.toml" \
        --text-encoder "$P/qwen_2.5_vl_7b_fp8_scaled.safetensors" --tokenizer "$TOKENIZER" --device cuda "$@"
    python3 - "$d/cache.log" "$label" "$P/captions_cache" >> "$SUMMARY" <<'EOF'
import pathlib, re, sys
log = open(sys.argv[1], errors="replace").read()
files = len(list(pathlib.Path(sys.argv[3]).glob("*_qi_te.safetensors")))
wall = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([0-9:.]+)", log)
vram = re.findall(r"VRAM: peak ([0-9.]+) GiB", log)
rss = re.findall(r"Maximum resident set size \(kbytes\): ([0-9]+)", log)
enc = re.findall(r"text encoder: (.*)", log)
out = f"{sys.argv[2]:<34} {files} captions cached"
out += f", wall {wall[-1]}" if wall else ""
out += f", peak VRAM {float(vram[-1]):.2f} GiB" if vram else ", no VRAM line"
out += f", peak RSS {int(rss[-1]) / 2**20:.1f} GiB" if rss else ""
out += f" ({enc[-1].strip()})" if enc else ""
print(out)
EOF
}

write_env "$(python3 -c 'import diffusers; print("diffusers", diffusers.__version__)' 2>&1 | tail -1)"
# The base project only for the cases that use it (the edit cases make their own: two 38 GiB files may not fit).
needs_base=0
for case in "${CASES[@]}"; do [[ "$case" != edit* ]] && needs_base=1; done
if [[ $needs_base == 1 && ! -f "$P/run.toml" ]]; then
    timed "$OUT" synth framesmith-bench synth-project --model qwen-image --out "$P" --height "$SIZE" \
        --width "$SIZE" --text-tokens "$TEXT_TOKENS" --rank "$RANK" --steps "$STEPS" --seed "$SEED" \
        --sample-files --captions "$CAPTIONS" || { note "synth failed"; exit 1; }
fi
for case in "${CASES[@]}"; do
    D="$OUT/$case"
    mkdir -p "$D"
    start_smi "$D"
    case "$case" in
    torch) torch_case "$D" "PyTorch (diffusers, SDPA, bf16)" ;;
    edit|edit-fp8|edit-budget-24|edit-budget-16)
        PE="$WORK/qwen-image-edit-$CONTROLS"
        if [[ ! -f "$PE/run.toml" ]]; then
            timed "$D" synth framesmith-bench synth-project --model qwen-image --out "$PE" --height "$SIZE" \
                --width "$SIZE" --text-tokens "$TEXT_TOKENS" --rank "$RANK" --steps "$STEPS" --seed "$SEED" \
                --controls "$CONTROLS" || { kill "$SMI"; continue; }
        fi
        extra=()
        case "$case" in
        edit) config "$PE" "$PE/run-$case.toml" bf16 off; label="bf16, resident" ;;
        edit-fp8) config "$PE" "$PE/run-$case.toml" fp8 off; label="FP8 b64, resident" ;;
        *) gb="${case#edit-budget-}"
           minimal_config "$PE" "$PE/run-$case.toml" "seed device"
           extra=(--preset "qwen-image-${gb}gb" --vram-budget-gb "$gb"); label="preset, $gb GiB"
           timed "$D" plan framesmith plan --config "$PE/run-$case.toml" "${extra[@]}" ;;
        esac
        # train_case keeps the outputs of the project in $P.
        ( P="$PE"; train_case "$D" "$PE/run-$case.toml" \
            "framesmith train, edit x$CONTROLS, $label" "${extra[@]}" )
        ;;
    text) text_case "$D" "cache text, no budget" ;;
    generate-24)
        timed "$D" generate framesmith generate --dit "$P/qwen_image_bf16.safetensors" \
            --vae "$P/qwen_image_vae.safetensors" --text-encoder "$P/qwen_2.5_vl_7b_fp8_scaled.safetensors" \
            --tokenizer "$TOKENIZER" --prompt "a red fox running through snow" --negative "blurry" \
            --width "$SIZE" --height "$SIZE" --steps "$GEN_STEPS" --seed 7 --fp8 block64 \
            --blocks-to-swap "$GEN_SWAP" --vram-budget-gb 24 --device cuda --out "$D/image.png"
        grep -hE "step|decode|VRAM|peak|wrote|rror" "$D/generate.log" | tail -6 | sed "s/^/  generate-24: /" \
            >> "$SUMMARY"
        ;;
    samples-24)
        minimal_config "$P" "$P/samples.toml" "seed device"
        cp "$TOKENIZER" "$P/tokenizer.json"
        echo "a red fox running through snow --w $SIZE --h $SIZE --s $GEN_STEPS --d 7" > "$P/prompts.txt"
        python3 - "$P/samples.toml" "$P" "$STEPS" <<'EOF'
import sys
path, p, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path).read().replace("[model]\n", f'[model]\nvae = "{p}/qwen_image_vae.safetensors"\n'
    f'text_encoder = "{p}/qwen_2.5_vl_7b_fp8_scaled.safetensors"\n', 1)
text += f'[sampling]\nprompts = "{p}/prompts.txt"\nsample_every_n_steps = {max(1, steps // 2)}\n'
open(path, "w").write(text)
EOF
        extra=(--preset qwen-image-24gb --vram-budget-gb 24)
        timed "$D" plan framesmith plan --config "$P/samples.toml" "${extra[@]}"
        grep -hE "peak|Fits|fit:|sampling" "$D/plan.log" | tail -5 | sed -E "s/^ *[0-9.]+ //; s/^/  samples-24 plan: /" \
            >> "$SUMMARY"
        train_case "$D" "$P/samples.toml" "framesmith train, preset, 24 GiB, samples" "${extra[@]}"
        grep -hE "sampl|VRAM" "$D/train.log" | tail -6 | sed "s/^/  samples-24: /" >> "$SUMMARY"
        ;;
    text-24|text-16)
        gb="${case#text-}"
        text_case "$D" "cache text, $gb GiB" --vram-budget-gb "$gb"
        ;;
    *) memory_case "$case" "$D" qwen-image "seed device" || note "unknown case $case" ;;
    esac
    stop_smi "$case" "$D"
done
finish_cases "Qwen-Image LoRA rank $RANK, ${SIZE}x${SIZE}, batch 1"
