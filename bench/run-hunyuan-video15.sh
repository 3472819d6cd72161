#!/usr/bin/env bash
# Issue 44's GPU rows through the product's own commands: HunyuanVideo 1.5 T2V LoRA rank 32 at 848x480 x 121 frames,
# batch 1, random weights at the released size (`framesmith-bench synth-project --model hunyuan-video15`: a bf16 DiT
# under the official release's names, one cached clip of random latents [32, 31, 30, 53], a random Qwen2.5-VL
# output and an empty byT5 output, in musubi-tuner's `_hv15` format), trained with `framesmith train`, against a
# PyTorch step of the official transformer (diffusers' HunyuanVideo15Transformer3DModel:
# bench/reference/hunyuan_video15_step.py, SDPA, bf16, its per-block checkpointing, rank 32) on the same bf16
# weights and cached inputs. The PyTorch case needs diffusers importable (carry its wheel).
# Each case writes its logs (with timestamps; peak RAM from /usr/bin/time -v), its metrics.jsonl and an nvidia-smi
# trace under OUT_DIR/CASE; OUT_DIR/summary.txt gets one line per run. Builds nothing.
# Usage: bench/run-hunyuan-video15.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith, framesmith-bench)
#   torch         the PyTorch step on the bf16 file and the project's caches (TORCH_WARMUP, TORCH_ITERS)
#   bf16          `framesmith train`, bf16 base, every block resident
#   fp8           FP8 block-64 base quantised from the bf16 file at load, resident
#   budget-24 / budget-16   `--preset hunyuan-video15-Ngb --vram-budget-gb N` over a config that names only the
#                 files, steps and outputs (so every memory setting is the preset's: FP8 block-64, pinned
#                 streaming, blocks_to_swap = "auto", activations in RAM); `framesmith plan` first.
#   generate-24   `framesmith generate` of one GEN_FRAMES-frame (121) 848x480 clip within `--vram-budget-gb 24`:
#                 GEN_STEPS (4) denoising steps with CFG 6 (the empty negative prompt as its own pass), FP8 block-64
#                 DiT with GEN_SWAP (20) of its 54 blocks streamed, the random VAE, Qwen2.5-VL-7B (scaled FP8) and
#                 byT5 glyph encoder of `synth-project --sample-files` (written when the project lacks them; the
#                 Qwen2.5-VL tokenizer is the hunyuan_video15_text fixture's, whose template crop is 108 like
#                 Qwen's); a quoted word in the prompt runs the glyph encoder. Summary: the per-step times, the
#                 decode time and peak VRAM the generator logs.
#   generate-i2v-24   generate-24 from a start image (a 1280x720 test pattern, so the clip takes its official
#                 480p bucket, 848x480) with --clip a random SigLIP at the released size (so400m-patch14-384, bf16,
#                 under ComfyUI's sigclip_vision_patch14_384.safetensors names; written once into the project).
#                 Summary: the start-image line (729 SigLIP tokens), per-step times, decode time and peak VRAM.
#   cache-i2v     `framesmith cache latents --clip` of one 480x272 image through that SigLIP and the random VAE on
#                 the GPU (bf16) and on the CPU (f32): both caches must hold latents, latents_image and
#                 siglip_float16 [729, 1152]; the summary gives the GPU pass's time and the relative difference of
#                 the two SigLIP features (bf16 against f32: a few 1e-3; above 5e-2 is a failure).
#   samples-i2v-24  (I2V=1) the budget-24 run with samples every STEPS/2 steps: one WIDTHxHEIGHT prompt of
#                 SAMPLE_FRAMES (121) frames and GEN_STEPS (4) steps with CFG, starting from the test pattern (--i)
#                 through the random SigLIP (model.clip) and the VAE, with `framesmith plan` first: the plan's two
#                 phases (training step, sampling with the 729 image tokens) against the VRAM lines the run logs
#                 after each sampling round.
# No CASE: torch bf16 fp8 budget-24 budget-16. STEPS (default 6) optimizer steps per training run; SEED (default 0);
# TEXT_TOKENS (default 128) tokens of the cached Qwen2.5-VL output; WIDTH, HEIGHT, FRAMES (848, 480, 121); I2V=1:
# image-to-video (the project also caches the first frame's latents and 729 SigLIP features; its own WORK folder):
# `I2V=1 … bf16 budget-24 budget-16` are the image-to-video training rows, resident and within 24 and 16 GiB.
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,42p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(torch bf16 fp8 budget-24 budget-16)
STEPS="${STEPS:-6}" SEED="${SEED:-0}" RANK="${RANK:-32}" TEXT_TOKENS="${TEXT_TOKENS:-128}"
WIDTH="${WIDTH:-848}" HEIGHT="${HEIGHT:-480}" FRAMES="${FRAMES:-121}"
TORCH_WARMUP="${TORCH_WARMUP:-2}" TORCH_ITERS="${TORCH_ITERS:-6}" I2V="${I2V:-0}"
GEN_STEPS="${GEN_STEPS:-4}" GEN_SWAP="${GEN_SWAP:-20}" GEN_FRAMES="${GEN_FRAMES:-121}" SAMPLE_FRAMES="${SAMPLE_FRAMES:-121}"
TOKENIZER="$(cd "$(dirname "$0")" && pwd)/../crates/framesmith-models/tests/fixtures/hunyuan_video15_text/tokenizer.json"
I2V_ARGS=()
[[ "$I2V" == 1 ]] && I2V_ARGS=(--i2v)
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
begin_cases hunyuan-video15
TIMED_PATTERN="step [0-9]+.*loss|LoRA:|VRAM|stream|plan|cached|HUNYUAN_VIDEO15_STEP|Error|error|Elapsed \(wall|Maximum resident"
P="$WORK/hunyuan-video15$([[ "$I2V" == 1 ]] && echo -i2v)"
DIT="$P/hunyuanvideo1.5_t2v_official_bf16.safetensors"

# The PyTorch step on the project's bf16 file and caches, and its summary line.
torch_case() { # case-dir label
    local d="$1" label="$2"
    timed "$d" torch python3 "$HERE/reference/hunyuan_video15_step.py" --dit "$DIT" \
        --latent-cache "$(ls "$P"/cache/*_hv15.safetensors | head -1)" \
        --text-cache "$(ls "$P"/cache/*_hv15_te.safetensors | head -1)" \
        --rank "$RANK" --warmup "$TORCH_WARMUP" --iters "$TORCH_ITERS" "${I2V_ARGS[@]}"
    summarise_torch "$d/torch.log" "$label" HUNYUAN_VIDEO15_STEP
}

write_env "$(python3 -c 'import diffusers; print("diffusers", diffusers.__version__)' 2>&1 | tail -1)"
SAMPLE_ARGS=()
[[ " ${CASES[*]} " =~ " "(generate-24|generate-i2v-24|cache-i2v|samples-i2v-24)" " ]] && SAMPLE_ARGS=(--sample-files)
if [[ ! -f "$P/run.toml" || ( ${#SAMPLE_ARGS[@]} -gt 0 && ! -f "$P/byt5_small_glyphxl_fp16.safetensors" ) ]]; then
    timed "$OUT" synth framesmith-bench synth-project --model hunyuan-video15 --out "$P" --height "$HEIGHT" \
        --width "$WIDTH" --frames "$FRAMES" --text-tokens "$TEXT_TOKENS" --rank "$RANK" --steps "$STEPS" \
        --seed "$SEED" "${I2V_ARGS[@]}" "${SAMPLE_ARGS[@]}" || { note "synth failed"; exit 1; }
fi
SIGLIP="$P/sigclip_vision_patch14_384.safetensors" START_IMAGE="$P/start.png"
# A random SigLIP so400m-patch14-384 (bf16, transformers' names) and a 1280x720 RGB test pattern, written once.
i2v_files() {
    [[ -f "$SIGLIP" && -f "$START_IMAGE" ]] && return 0
    python3 - "$SIGLIP" "$START_IMAGE" <<'PY'
import struct, sys, zlib
import torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(5)
d, m, p, n = 1152, 4304, 14, 729
shapes = {"embeddings.patch_embedding.weight": (d, 3, p, p), "embeddings.patch_embedding.bias": (d,),
          "embeddings.position_embedding.weight": (n, d), "post_layernorm.weight": (d,), "post_layernorm.bias": (d,)}
for i in range(27):
    for name, shape in [("self_attn.q_proj", (d, d)), ("self_attn.k_proj", (d, d)), ("self_attn.v_proj", (d, d)),
                        ("self_attn.out_proj", (d, d)), ("mlp.fc1", (m, d)), ("mlp.fc2", (d, m))]:
        shapes[f"encoder.layers.{i}.{name}.weight"] = shape
        shapes[f"encoder.layers.{i}.{name}.bias"] = shape[:1]
    for norm in ("layer_norm1", "layer_norm2"):
        shapes[f"encoder.layers.{i}.{norm}.weight"] = (d,)
        shapes[f"encoder.layers.{i}.{norm}.bias"] = (d,)
def tensor(name, shape):
    if "norm" in name and name.endswith("weight"):
        return torch.ones(shape)
    return torch.randn(shape, generator=g) * 0.02
save_file({f"vision_model.{k}": tensor(k, s).to(torch.bfloat16) for k, s in shapes.items()}, sys.argv[1])
w, h = 1280, 720
rows = b"".join(b"\0" + bytes((x * 255 // w, y * 255 // h, (x ^ y) & 255)[c] for x in range(w) for c in range(3))
                for y in range(h))
chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
open(sys.argv[2], "wb").write(png + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
PY
}

# The SigLIP latent pass on DEVICE into CACHE-DIR over one 480x272 crop of the start image.
cache_i2v() { # case-dir device
    local d="$1" device="$2" data="$1/data-$2"
    mkdir -p "$data/images"
    python3 -c "import shutil,sys; shutil.copy(sys.argv[1], sys.argv[2])" "$START_IMAGE" "$data/images/start.png"
    echo "a test pattern" > "$data/images/start.txt"
    printf '[general]\nresolution = [480, 272]\ncaption_extension = ".txt"\nenable_bucket = false\n\n[[datasets]]\nimage_directory = "images"\ncache_directory = "cache"\n' \
        > "$data/dataset.toml"
    timed "$d" "cache-$device" framesmith cache latents --dataset "$data/dataset.toml" \
        --vae "$P/hunyuanvideo15_vae_fp16.safetensors" --clip "$SIGLIP" --device "$device"
}

for case in "${CASES[@]}"; do
    D="$OUT/$case"
    mkdir -p "$D"
    start_smi "$D"
    case "$case" in
    torch) torch_case "$D" "PyTorch (diffusers, SDPA, bf16)" ;;
    generate-24)
        timed "$D" generate framesmith generate --dit "$DIT" --vae "$P/hunyuanvideo15_vae_fp16.safetensors" \
            --text-encoder "$P/qwen_2.5_vl_7b_fp8_scaled.safetensors" --tokenizer "$TOKENIZER" \
            --prompt 'a neon sign reading "OPEN" flickers above a rainy street at night' \
            --width 848 --height 480 --frames "$GEN_FRAMES" --steps "$GEN_STEPS" --seed 7 --fp8 block64 \
            --blocks-to-swap "$GEN_SWAP" --vram-budget-gb 24 --device cuda --out "$D/clip.mp4"
        grep -hE "step|decode|VRAM|peak|glyph|wrote|rror" "$D/generate.log" | tail -8 | sed "s/^/  generate-24: /" \
            >> "$SUMMARY"
        ;;
    generate-i2v-24)
        i2v_files || { note "i2v files failed"; continue; }
        timed "$D" generate framesmith generate --dit "$DIT" --vae "$P/hunyuanvideo15_vae_fp16.safetensors" \
            --text-encoder "$P/qwen_2.5_vl_7b_fp8_scaled.safetensors" --tokenizer "$TOKENIZER" \
            --image "$START_IMAGE" --clip "$SIGLIP" --prompt 'the pattern slowly turns' \
            --frames "$GEN_FRAMES" --steps "$GEN_STEPS" --seed 7 --fp8 block64 \
            --blocks-to-swap "$GEN_SWAP" --vram-budget-gb 24 --device cuda --out "$D/clip.mp4"
        grep -hE "start image|step|decode|VRAM|peak|wrote|rror" "$D/generate.log" | tail -8 \
            | sed "s/^/  generate-i2v-24: /" >> "$SUMMARY"
        ;;
    cache-i2v)
        i2v_files || { note "i2v files failed"; continue; }
        cache_i2v "$D" cuda
        cache_i2v "$D" cpu
        python3 - "$D" >> "$SUMMARY" 2>&1 <<'PY'
import glob, sys
from safetensors.torch import load_file
gpu, cpu = (load_file(glob.glob(f"{sys.argv[1]}/data-{d}/cache/*_hv15.safetensors")[0]) for d in ("cuda", "cpu"))
a, b = gpu["siglip_float16"].float(), cpu["siglip_float16"].float()
rel = ((a - b).norm() / b.norm()).item()
print(f"  cache-i2v: keys {sorted(gpu)}; siglip {list(a.shape)}; GPU (bf16) vs CPU (f32) relative difference "
      f"{rel:.2e} -> {'PASS' if rel < 5e-2 and list(a.shape) == [729, 1152] else 'FAIL'}")
PY
        grep -hE "Elapsed \(wall|SigLIP|cached" "$D/cache-cuda.log" | tail -3 | sed "s/^/  cache-i2v (cuda): /" >> "$SUMMARY"
        ;;
    samples-i2v-24)
        if [[ "$I2V" != 1 ]]; then
            note "samples-i2v-24 trains image-to-video: run it with I2V=1"
        elif ! i2v_files; then
            note "i2v files failed"
        else
            minimal_config "$P" "$P/samples.toml"
            cp "$TOKENIZER" "$P/tokenizer.json"
            echo "the pattern slowly turns --i $START_IMAGE --w $WIDTH --h $HEIGHT --f $SAMPLE_FRAMES --s $GEN_STEPS --d 7" \
                > "$P/prompts.txt"
            python3 - "$P/samples.toml" "$P" "$STEPS" "$SIGLIP" <<'EOF'
import sys, tomllib
path, p, steps, siglip = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
text = open(path).read().replace("[model]\n", f'[model]\nvae = "{p}/hunyuanvideo15_vae_fp16.safetensors"\n'
    f'text_encoder = "{p}/qwen_2.5_vl_7b_fp8_scaled.safetensors"\nclip = "{siglip}"\n', 1)
text += f'[sampling]\nprompts = "{p}/prompts.txt"\nsample_every_n_steps = {max(1, steps // 2)}\n'
tomllib.loads(text)
open(path, "w").write(text)
EOF
            extra=(--preset hunyuan-video15-24gb --vram-budget-gb 24)
            timed "$D" plan framesmith plan --config "$P/samples.toml" "${extra[@]}"
            grep -hE "peak|Fits|fit:|sampling" "$D/plan.log" | tail -5 \
                | sed -E "s/^ *[0-9.]+ //; s/^/  samples-i2v-24 plan: /" >> "$SUMMARY"
            train_case "$D" "$P/samples.toml" "framesmith train, preset, 24 GiB, I2V samples" "${extra[@]}"
            grep -hE "sampl|start images|VRAM" "$D/train.log" | tail -6 | sed "s/^/  samples-i2v-24: /" >> "$SUMMARY"
        fi
        ;;
    *) memory_case "$case" "$D" hunyuan-video15 || note "unknown case $case" ;;
    esac
    stop_smi "$case" "$D"
done
finish_cases "HunyuanVideo 1.5 $([[ "$I2V" == 1 ]] && echo I2V || echo T2V) LoRA rank $RANK, ${WIDTH}x${HEIGHT}x${FRAMES}, batch 1"
