#!/usr/bin/env bash
# Issue 19's GPU rows through the product's own commands: random weights at real sizes in the official and ComfyUI
# layouts (`framesmith-bench synth-project`), trained with `framesmith train` from caches of random latents (and,
# for image-to-video models, random image conditioning) or generated with `framesmith generate`. Each case writes
# its logs (with timestamps; peak RAM from /usr/bin/time) and metrics.jsonl under OUT_DIR/CASE. Builds nothing.
# Usage: bench/run-wan-models.sh BIN_DIR OUT_DIR WORK_DIR CASE...
#   i2v-14b      Wan2.1 I2V-14B, 480x832x81, FP8 block-64 base: resident, then `--preset balanced-24gb
#                --vram-budget-gb 24` (blocks streamed as the planner chooses)
#   ti2v-5b      Wan2.2 TI2V-5B at its native 704x1280x121, bf16 base, resident
#   t2v-14b-24   Wan2.1 T2V-14B, 480x832x81, FP8 block-64, within `--vram-budget-gb 24` under `--preset
#                balanced-24gb` (per-block checkpointing) and `--preset fast-24gb` (the kept attention in RAM),
#                after PyTorch's eager resident bf16 step of the same model (bench/reference/step.py)
#   a14b-joint   Wan2.2 T2V-A14B, 480x832x81, both experts (`model.experts = "joint"`) under `--preset balanced-24gb
#                --vram-budget-gb 24`, then the high-noise expert alone under the same preset and budget
#   a14b-2gpu   Wan2.2 T2V-A14B, 480x832x81, both experts (`model.experts` = A14B_MODE, default joint), FP8
#                block-64, every block resident, A14B_STEPS steps: on one GPU (one expert parked in RAM at a time),
#                then with one expert per GPU (`training.low_noise_device = "cuda:1"`); the final LoRAs of the two
#                runs compared (LoRA_DIFF lines) and each step's expert and loss listed (STEP lines). A third run,
#                the low-noise expert alone as `model.dit` (same data, seed and first draw), gives the reference
#                loss of a first step that the pair draws below the boundary. Needs two GPUs.
#   gen-a14b-48 / gen-a14b-24
#                Wan2.2 T2V-A14B `framesmith generate` with both experts at 720x1280x81 (GEN_STEPS steps, default 3)
#                within `--vram-budget-gb 48` (every block resident) or 24 (GEN_SWAP_24 blocks streamed, default
#                39, and tiled decoding); at 48, tiled decoding when the untiled run ran out of memory, or from the
#                start with GEN_TILED=1. Give the 24 GiB case LIMIT=900 or more: its tiled decode takes ~3 min.
#   gen-a14b-2gpu
#                the same clip with one expert per GPU (`--gpus GEN_GPUS`, default 0,1: high-noise expert on the
#                first, low-noise on the second, both resident, nothing parked); GEN_BUDGET sets
#                `--vram-budget-gb` (per card; none by default); compare its seconds per step with gen-a14b-48's
# STEPS (default 8) steps per training run; A14B_STEPS (default 16) for the joint run.
set -uo pipefail
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
STEPS="${STEPS:-8}" A14B_STEPS="${A14B_STEPS:-16}" GEN_STEPS="${GEN_STEPS:-3}" GEN_SWAP_24="${GEN_SWAP_24:-39}"
HERE="$(cd "$(dirname "$0")" && pwd)"
SPIECE="$HERE/../crates/framesmith-models/testdata/spiece_tiny/tiny_unigram.model"
export PATH="$BIN:$PATH"
source "$HERE/device-env.sh"
use_nvidia_libs
START=$(date +%s%N)
mkdir -p "$OUT" "$WORK"
LOG="$OUT/models.log"
TIMED_PATTERN="step [0-9]+.*loss|VRAM: peak|denoised in|streamed|Error|error|Elapsed \(wall|Maximum resident"
synth() { # dir variant dtype frames height width [extra...]
    local dir="$1" variant="$2" dtype="$3" f="$4" h="$5" w="$6"; shift 6
    [[ -f "$dir/dit.safetensors" ]] && return 0
    timed "$OUT" "synth-$(basename "$dir")" framesmith-bench synth-project --variant "$variant" --dtype "$dtype" \
        --out "$dir" --frames "$f" --height "$h" --width "$w" --steps "$STEPS" --seed "${SEED:-0}" "$@"
}
# run.toml of a synth project with FP8 block-64 weights (balanced-24gb's numerics) and a fresh output folder.
fp8_config() { # project-dir out-toml steps
    sed -e 's/^base_dtype = .*/base_dtype = "fp8"/' -e 's/^fp8_scale = .*/fp8_scale = "block64"/' \
        -e "s/^max_train_steps = .*/max_train_steps = $3/" "$1/run.toml" > "$2"
}
# Lets a preset decide the memory keys the synth project wrote out (streaming off, nothing swapped).
budget_config() { # in-toml out-toml
    grep -v -E '^(streaming|blocks_to_swap|activations|checkpointing) = ' "$1" > "$2"
}
# Sets keys of a run TOML in place: set_keys FILE section.key=value... (values are TOML literals).
set_keys() {
    python3 - "$@" <<'EOF2'
import re, sys
path, pairs = sys.argv[1], sys.argv[2:]
lines = open(path).read().splitlines()
for pair in pairs:
    key, value = pair.split("=", 1)
    section, name = key.rsplit(".", 1)
    table, done = None, False
    for i, line in enumerate(lines):
        m = re.match(r"\s*\[([^\]]+)\]", line)
        if m:
            table = m.group(1).strip()
        elif table == section and re.match(rf"\s*{re.escape(name)}\s*=", line):
            lines[i], done = f"{name} = {value}", True
    if not done:
        at = next(i for i, l in enumerate(lines) if l.strip() == f"[{section}]")
        lines.insert(at + 1, f"{name} = {value}")
open(path, "w").write("\n".join(lines) + "\n")
EOF2
}
# The LoRA files a run wrote (not its states) into dir.
keep_loras() { # project-dir dir
    mkdir -p "$2"
    find "$1/output" -name "*.safetensors" -not -path "*state*" -exec cp {} "$2/" \;
}
keep_outputs() { # project-dir case-dir
    cp "$1/output/"*/metrics.jsonl "$2/" 2>/dev/null || cp "$1/output/metrics.jsonl" "$2/" 2>/dev/null
    rm -rf "$1/output"
}

for case in "$@"; do
    D="$OUT/$case"
    mkdir -p "$D"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$D/gpu.txt"
    ( while true; do nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader; sleep 1; done ) > "$D/smi.log" 2>&1 &
    SMI=$!
    case "$case" in
    i2v-14b)
        P="$WORK/i2v-14b"
        synth "$P" i2v-14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        fp8_config "$P" "$P/resident.toml" "$STEPS"
        timed "$D" plan-resident framesmith plan --config "$P/resident.toml"
        timed "$D" train-resident framesmith train --config "$P/resident.toml"
        mkdir -p "$D/resident"; keep_outputs "$P" "$D/resident"
        budget_config "$P/resident.toml" "$P/budget.toml"
        timed "$D" plan-24 framesmith plan --config "$P/budget.toml" --preset balanced-24gb --vram-budget-gb 24
        timed "$D" train-24 framesmith train --config "$P/budget.toml" --preset balanced-24gb --vram-budget-gb 24
        mkdir -p "$D/budget-24"; keep_outputs "$P" "$D/budget-24"
        rm -rf "$P"
        ;;
    ti2v-5b)
        P="$WORK/ti2v-5b"
        synth "$P" ti2v-5b bf16 121 704 1280 || { kill $SMI; continue; }
        sed -e "s/^max_train_steps = .*/max_train_steps = $STEPS/" "$P/run.toml" > "$P/resident.toml"
        timed "$D" plan framesmith plan --config "$P/resident.toml"
        timed "$D" train framesmith train --config "$P/resident.toml"
        keep_outputs "$P" "$D"
        rm -rf "$P"
        ;;
    t2v-14b-24)
        P="$WORK/t2v-14b"
        note "torch-14b: bench/reference/step.py --variant t2v-14b (eager, bf16, resident)"
        timeout "${TORCH_TIMEOUT:-200}" python3 "$HERE/reference/step.py" --variant t2v-14b --frames 81 --height 480 \
            --width 832 --rank 32 --warmup 1 --iters 2 2>&1 | stamp > "$D/torch-14b.log"
        grep -E "BENCH|Error|error" "$D/torch-14b.log" | sed "s/^/   torch-14b: /" | tee -a "$LOG"
        synth "$P" t2v-14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        fp8_config "$P" "$P/resident.toml" "$STEPS"
        budget_config "$P/resident.toml" "$P/budget.toml"
        for preset in balanced-24gb fast-24gb; do
            timed "$D" "plan-$preset" framesmith plan --config "$P/budget.toml" --preset "$preset" --vram-budget-gb 24
            timed "$D" "train-$preset" framesmith train --config "$P/budget.toml" --preset "$preset" \
                --vram-budget-gb 24
            mkdir -p "$D/$preset"; keep_outputs "$P" "$D/$preset"
        done
        ;;
    a14b-joint)
        P="$WORK/t2v-a14b" L="$WORK/t2v-a14b-low"
        synth "$P" t2v-a14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        SEED=1 synth "$L" t2v-a14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        fp8_config "$P" "$P/one.toml" "$STEPS"
        budget_config "$P/one.toml" "$P/one-budget.toml"
        fp8_config "$P" "$P/joint.toml" "$A14B_STEPS"
        budget_config "$P/joint.toml" "$P/joint-budget.toml"
        sed -i -e 's|^variant = .*|variant = "t2v-a14b"|' -e "s|^dit_low_noise = .*|dit_low_noise = \"$L/dit.safetensors\"|" \
            -e 's|^experts = .*|experts = "joint"|' "$P/joint-budget.toml"
        timed "$D" plan-joint framesmith plan --config "$P/joint-budget.toml" --preset balanced-24gb --vram-budget-gb 24
        timed "$D" train-joint framesmith train --config "$P/joint-budget.toml" --preset balanced-24gb \
            --vram-budget-gb 24
        mkdir -p "$D/joint"; keep_outputs "$P" "$D/joint"
        timed "$D" plan-one framesmith plan --config "$P/one-budget.toml" --preset balanced-24gb --vram-budget-gb 24
        timed "$D" train-one framesmith train --config "$P/one-budget.toml" --preset balanced-24gb --vram-budget-gb 24
        mkdir -p "$D/one"; keep_outputs "$P" "$D/one"
        ;;
    a14b-2gpu)
        P="$WORK/t2v-a14b" L="$WORK/t2v-a14b-low"
        synth "$P" t2v-a14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        SEED=1 synth "$L" t2v-a14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        fp8_config "$P" "$P/pair.toml" "$A14B_STEPS"
        set_keys "$P/pair.toml" model.variant='"t2v-a14b"' model.dit_low_noise="\"$L/dit.safetensors\"" \
            model.experts="\"${A14B_MODE:-joint}\"" training.device='"cuda:0"'
        cp "$P/pair.toml" "$P/two.toml"
        set_keys "$P/two.toml" training.low_noise_device='"cuda:1"'
        timed "$D" plan-one framesmith plan --config "$P/pair.toml"
        timed "$D" train-one framesmith train --config "$P/pair.toml"
        keep_loras "$P" "$D/one-loras"; mkdir -p "$D/one"; keep_outputs "$P" "$D/one"
        timed "$D" plan-two framesmith plan --config "$P/two.toml"
        timed "$D" train-two framesmith train --config "$P/two.toml"
        keep_loras "$P" "$D/two-loras"; mkdir -p "$D/two"; keep_outputs "$P" "$D/two"
        cp "$P/pair.toml" "$P/low-alone.toml"
        set_keys "$P/low-alone.toml" model.dit="\"$L/dit.safetensors\"" model.dit_low_noise='""' \
            training.max_train_steps=1
        timed "$D" train-low-alone framesmith train --config "$P/low-alone.toml"
        mkdir -p "$D/low-alone"; keep_outputs "$P" "$D/low-alone"
        for run in one two low-alone; do
            python3 - "$D/$run/metrics.jsonl" "$run" <<'EOF2' | tee -a "$LOG"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r:
        print(f"STEP {sys.argv[2]} {r.get('step')} {r.get('expert', 'one model')} loss {r['loss']!r} {r.get('step_secs', 0):.2f} s")
EOF2
        done
        python3 - "$D/one-loras" "$D/two-loras" <<'EOF2' | tee -a "$LOG"
import pathlib, sys
from safetensors.torch import load_file
one, two = map(pathlib.Path, sys.argv[1:])
for f in sorted(one.glob("*.safetensors")):
    g = two / f.name
    if not g.exists():
        print(f"LoRA_DIFF {f.name}: missing in the two-GPU run"); continue
    a, b = load_file(str(f)), load_file(str(g))
    worst, top, same = 0.0, 0.0, 0
    for k, t in a.items():
        d = (t.float() - b[k].float()).abs().max().item()
        worst, top = max(worst, d), max(top, t.float().abs().max().item())
        same += int(d == 0.0)
    print(f"LoRA_DIFF {f.name}: {len(a)} tensors, {same} bit-identical, max abs diff {worst:.3g} on values up to {top:.3g}")
EOF2
        ;;
    gen-a14b-48|gen-a14b-24|gen-a14b-2gpu)
        # The experts of a14b-joint (made here when missing); umT5 and the Wan2.1 VAE from a small project's
        # --encoders (they do not depend on the DiT).
        P="$WORK/t2v-a14b" L="$WORK/t2v-a14b-low" E="$WORK/encoders"
        synth "$P" t2v-a14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        SEED=1 synth "$L" t2v-a14b fp8-scaled 81 480 832 || { kill $SMI; continue; }
        synth "$E" t2v-1.3b bf16 5 32 32 --encoders "$SPIECE" || { kill $SMI; continue; }
        budget="${case##*-}" swap=0 where=(--device cuda)
        [[ "$budget" == 24 ]] && swap="$GEN_SWAP_24"
        if [[ "$case" == gen-a14b-2gpu ]]; then
            budget="${GEN_BUDGET:-}" where=(--gpus "${GEN_GPUS:-0,1}")
        fi
        gen=(framesmith generate --dit "$P/dit.safetensors" --dit-low-noise "$L/dit.safetensors"
            --text-encoder "$E/umt5_xxl_fp8_e4m3fn_scaled.safetensors" --vae "$E/wan_2.1_vae.safetensors"
            --prompt "a test card with a moving colour bar, bright daylight" --width 1280 --height 720 --frames 81
            --steps "$GEN_STEPS" --seed 42 "${where[@]}" --fp8 block64 --blocks-to-swap "$swap"
            --out "$D/clip.mp4")
        [[ -n "$budget" ]] && gen+=(--vram-budget-gb "$budget")
        [[ -n "${GEN_TILED:-}" || "$budget" == 24 ]] && gen+=(--tiled)
        if ! timed "$D" generate "${gen[@]}" && [[ -z "${GEN_NO_RETRY:-}" ]] && grep -q -i -E "out of memory|out_of_memory" "$D/generate.log"; then
            timed "$D" generate-tiled "${gen[@]}" --tiled
        fi
        rm -rf "$D"/clip_frames
        ;;
    *) note "unknown case $case" ;;
    esac
    kill $SMI 2>/dev/null
done
note "done"
