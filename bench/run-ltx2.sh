#!/usr/bin/env bash
# Issue 45's GPU rows through the product's own commands: LTX-2.3 (22B) T2V LoRA rank 32 at 768x512 x 121 frames,
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
# No CASE: torch bf16 fp8 budget-24 budget-16. STEPS (default 6) optimizer steps per training run; SEED (default 0);
# TEXT_TOKENS (default 1024) tokens of the cached connector output; WIDTH, HEIGHT, FRAMES (768, 512, 121).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,25p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(torch bf16 fp8 budget-24 budget-16)
STEPS="${STEPS:-6}" SEED="${SEED:-0}" RANK="${RANK:-32}" TEXT_TOKENS="${TEXT_TOKENS:-1024}"
WIDTH="${WIDTH:-768}" HEIGHT="${HEIGHT:-512}" FRAMES="${FRAMES:-121}"
TORCH_WARMUP="${TORCH_WARMUP:-2}" TORCH_ITERS="${TORCH_ITERS:-6}" LTX_WHEELS="${LTX_WHEELS:-}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
use_nvidia_libs
START=$(date +%s%N)
mkdir -p "$OUT" "$WORK"
LOG="$OUT/ltx2.log"
SUMMARY="$OUT/summary.txt"
TIMED_PATTERN="step [0-9]+.*loss|LoRA:|VRAM|stream|plan|cached|LTX2_STEP|Error|error|Elapsed \(wall|Maximum resident"
TIMED_LINES=16
P="$WORK/ltx2"
DIT="$P/ltx-2.3-22b-video-stream-synth-bf16.safetensors"
PYDEPS="$WORK/pydeps"

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
    python3 - "$d/torch.log" "$label" >> "$SUMMARY" <<'EOF'
import json, sys
label = sys.argv[2]
lines = [l.split("LTX2_STEP ", 1)[1] for l in open(sys.argv[1], errors="replace") if "LTX2_STEP " in l]
if lines:
    r = json.loads(lines[-1])
    print(f"{label:<34} step {r['ms_mean'] / 1e3:7.3f} s (mean of {r['steps_timed']}, "
          f"median {r['ms_median'] / 1e3:.3f}), peak allocated {r['peak_allocated_gib']:.2f} GiB "
          f"(reserved {r['peak_reserved_gib']:.2f}), {r['img_tokens']}+{r['txt_tokens']} tokens, "
          f"{r['lora_modules']} LoRA modules, {r['lora_parameters']} LoRA parameters, loss {r['loss']:.4f}")
else:
    print(f"{label:<34} failed: see {sys.argv[1]}")
EOF
}

# The project's run.toml cut down to its files, steps, seed, device, LoRA size and outputs: a preset given on the
# command line sets everything else (a key the config spells would win over the preset's).
minimal_config() { # project-dir out-toml
    python3 - "$1/run.toml" "$2" "$STEPS" <<'EOF'
import json, sys, tomllib
src, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = tomllib.load(open(src, "rb"))
keep = {"model": ["dit"], "dataset": ["config"], "training": ["seed", "device", "mode"], "lora": ["rank", "alpha"],
        "output": ["output_dir", "output_name", "save_every_n_steps", "save_every_n_epochs", "save_state"]}
lines = []
for table, keys in keep.items():
    lines.append(f"[{table}]")
    lines += [f"{k} = {json.dumps(cfg[table][k])}" for k in keys if k in cfg.get(table, {})]
    if table == "training":
        lines.append(f"max_train_steps = {steps}")
text = "\n".join(lines) + "\n"
tomllib.loads(text)
open(out, "w").write(text)
EOF
}

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    PYTHONPATH="$PYDEPS" python3 -c 'import ltx_core; print("ltx-core", ltx_core.__file__)' 2>&1 | tail -1
    framesmith --version 2>&1 | head -1
    free -g | head -2; nproc
} > "$OUT/env.txt" 2>&1
if [[ ! -f "$P/run.toml" ]]; then
    df -h "$WORK" | tail -1 | tee -a "$OUT/env.txt"
    timed "$OUT" synth framesmith-bench synth-project --model ltx2 --out "$P" --height "$HEIGHT" \
        --width "$WIDTH" --frames "$FRAMES" --text-tokens "$TEXT_TOKENS" --rank "$RANK" --steps "$STEPS" \
        --seed "$SEED" || { note "synth failed"; exit 1; }
fi
for case in "${CASES[@]}"; do
    D="$OUT/$case"
    mkdir -p "$D"
    ( while true; do nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader; sleep 1; done ) > "$D/smi.log" 2>&1 &
    SMI=$!
    case "$case" in
    torch) torch_case "$D" "PyTorch (ltx-core LTXModel, bf16)" ;;
    bf16)
        config "$P" "$P/bf16.toml" bf16 off
        train_case "$D" "$P/bf16.toml" "framesmith train, bf16, resident"
        ;;
    fp8)
        config "$P" "$P/fp8.toml" fp8 off
        train_case "$D" "$P/fp8.toml" "framesmith train, FP8 b64, resident"
        ;;
    budget-24|budget-16)
        gb="${case#budget-}"
        minimal_config "$P" "$P/budget.toml"
        extra=(--preset "ltx2-${gb}gb" --vram-budget-gb "$gb")
        timed "$D" plan framesmith plan --config "$P/budget.toml" "${extra[@]}"
        train_case "$D" "$P/budget.toml" "framesmith train, preset, $gb GiB" "${extra[@]}"
        ;;
    *) note "unknown case $case" ;;
    esac
    kill $SMI 2>/dev/null
    awk -F', ' -v c="$case" '$2 ~ /MiB/ { v = $2 + 0; if (v > m) m = v } END { if (m) printf "%-34s nvidia-smi memory.used max %d MiB\n", "  (" c ")", m }' \
        "$D/smi.log" >> "$SUMMARY"
done
note "done"
{
    echo "== LTX-2.3 T2V LoRA rank $RANK, ${WIDTH}x${HEIGHT}x${FRAMES}, batch 1 ($(head -2 "$OUT/env.txt" | tail -1)) =="
    cat "$SUMMARY" 2>/dev/null
} | tee "$OUT/summary-final.txt"
