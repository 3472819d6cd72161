#!/usr/bin/env bash
# `model.fp8_attention` (issue 47) on the GPU test machine: cuDNN's FP8 fused attention against its bf16 kernel, the
# Wan steps with it off and on through `framesmith train` beside PyTorch eager, and a quality run. Builds nothing;
# BIN_DIR holds framesmith and framesmith-bench (CUDA build with cuDNN). Parts, in the order to run them:
#   check      `framesmith-bench attention-fp8` at Wan2.1-1.3B (12 heads) and Wan2.1-14B (40 heads), 32,760 video
#              tokens, head dim 128: self attention, cross attention over 512 text tokens, and padded (120 valid):
#              max / mean relative deviation of O, dQ, dK, dV from the bf16 kernel (lines FP8_DEVIATION), q and k
#              at gain 1 and 3 (sharper attention), then both timed forward and forward+backward. About 2 minutes.
#   step-1.3b  Wan2.1-1.3B 480x832x81 rank 32, bf16, resident, per-block checkpointing: `framesmith train` with
#              fp8_attention off, then on (STEPS, default 6), and PyTorch eager (bench/reference/step.py, 1 + 3
#              steps). About 4 minutes with the project written. FP8_PRODUCTS=1 adds a run with `model.fp8_matmul`
#              on as well (on an FP8 base, which it needs); BF16_ROW=0 leaves the bf16-attention run out.
#   step-14b   Wan2.1-14B 480x832x81 rank 32 within 24 GiB (ComfyUI scaled-FP8 file, `--preset fast-24gb
#              --vram-budget-gb 24`): `framesmith train` off, then on (STEPS, default 3); FP8_PRODUCTS=1 adds a
#              run with `model.fp8_matmul` on as well (PROJECTION=1 one more with `memory.checkpointing =
#              "attention_projection"`); BF16_ROW=0 leaves the off run out, FP8_ROW=0 the FP8-attention-only one.
#              About 7 minutes the first time (the project is written into WORK_DIR), 5 after.
#   torch-14b  PyTorch's eager resident bf16 14B step (bench/reference/step.py, 1 + 2 steps), the reference of the
#              14B goal. About 2 minutes.
#   quality    Wan2.1-1.3B random weights, one cached 480x832x17 clip, QUALITY_STEPS (default 200) steps, rank 32:
#              bf16 attention (A), FP8 attention (B, same seed), bf16 with training.seed = 7 (C: what another draw
#              moves things by). Per-step loss curves (OUT_DIR/quality/loss-curves.csv, from metrics.jsonl) and
#              bench/reference/compare_runs.py (losses, LoRA delta cosine per module) of B and C against A.
#              About 5 minutes.
#   quality-products  the same with A an FP8 base per channel (bf16 products), B that with `model.fp8_matmul`
#              (FP8 forward and input-gradient products), C A with seed 7.
# OUT_DIR/summary.txt collects the lines that matter; each run's log stays under OUT_DIR.
# Usage: bench/run-fp8-attention.sh BIN_DIR OUT_DIR WORK_DIR PART [PART...]
set -uo pipefail
if [[ $# -lt 4 ]]; then
    sed -n '2,28p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
HERE="$(cd "$(dirname "$0")" && pwd)"
export PYTHONUNBUFFERED=1 PATH="$BIN:$PATH"
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
TIMED_PATTERN="step [0-9]+|first step|FP8 attention|VRAM|error|Error"
begin_cases fp8-attention
write_env "$(python3 -c 'import torch; print("cudnn", torch.backends.cudnn.version())' 2>&1)"
cat "$OUT/env.txt" >> "$SUMMARY"
SHAPE=(--frames 81 --height 480 --width 832 --rank 32)

# run SECONDS NAME COMMAND...: COMMAND into OUT/NAME.log; its lines worth keeping into the summary.
run() {
    local t="$1" name="$2"; shift 2
    note "$name: $*"
    echo "+ $*" >> "$SUMMARY"
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    grep -E "FP8_DEVIATION|max rel|^(self|cross)|FP8 attention|ms|loss|peak|error|Error" "$OUT/$name.log" \
        | tail -40 | sed "s/^/  $name: /" >> "$SUMMARY"
    echo "  $name: exit $rc" >> "$SUMMARY"
}

# with_fp8_attention IN OUT: a copy of run config IN with `fp8_attention = true` in [model].
with_fp8_attention() {
    with_model_key "$1" "$2" fp8_attention true
}

# with_model_key IN OUT KEY VALUE: a copy of run config IN with [model] KEY = VALUE (the line replaced where the
# config has one, else added; checked by parsing it back).
with_model_key() {
    with_key "$1" "$2" model "$3" "$4"
}

# with_key IN OUT TABLE KEY VALUE: a copy of run config IN with [TABLE] KEY = VALUE (the table added at the end
# where the config has none).
with_key() {
    python3 - "$@" <<'EOF'
import re, sys, tomllib
src, dst, table, key, value = sys.argv[1:]
text = open(src).read()
line = f"{key} = {value}"
if f"[{table}]\n" not in text:
    text = text.rstrip("\n") + f"\n\n[{table}]\n"
head, sep, rest = text.partition(f"[{table}]\n")
body, nxt, tail = rest.partition("\n[")
pattern = re.compile(rf"(?m)^{re.escape(key)} = .*$")
body = pattern.sub(line, body) if pattern.search(body) else line + "\n" + body
text = head + sep + body + nxt + tail
assert tomllib.loads(text)[table][key] == tomllib.loads(f"v = {value}")["v"]
open(dst, "w").write(text)
EOF
}

# with_seed IN OUT SEED: a copy of run config IN with [training] seed = SEED.
with_seed() {
    python3 - "$1" "$2" "$3" <<'EOF'
import re, sys, tomllib
src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
out, table, done = [], None, False
for line in open(src).read().splitlines():
    m = re.match(r"^\[([A-Za-z_.]+)\]\s*$", line)
    if m:
        table = m.group(1)
    if table == "training" and re.match(r"^seed\s*=", line):
        continue
    out.append(line)
    if m and table == "training":
        out.append(f"seed = {seed}")
        done = True
assert done
text = "\n".join(out) + "\n"
assert tomllib.loads(text)["training"]["seed"] == seed
open(dst, "w").write(text)
EOF
}

# synth DIR VARIANT FORMAT FRAMES STEPS: the random-weight project in DIR, unless it is there already.
synth() {
    [[ -f "$1/run.toml" ]] && return 0
    timed "$OUT" "synth-$2-$4" framesmith-bench synth-project --variant "$2" --dtype "$3" --out "$1" \
        --frames "$4" --height 480 --width 832 --steps "$5"
}

# quality_run NAME TOML: `framesmith train` of TOML with its outputs under OUT/quality/NAME (the log unstamped:
# compare_runs.py reads its `step N/M loss X` lines).
quality_run() {
    local d="$OUT/quality/$1" toml="$2"
    mkdir -p "$d"
    python3 - "$toml" "$d/run.toml" "$d/output" <<'EOF'
import re, sys, tomllib
src, dst, out = sys.argv[1:]
text = re.sub(r'(?m)^output_dir = .*$', f'output_dir = "{out}"', open(src).read())
assert tomllib.loads(text)["output"]["output_dir"] == out
open(dst, "w").write(text)
EOF
    note "quality $1"
    timeout 300 framesmith train --config "$d/run.toml" > "$d/train.log" 2>&1
    echo "  quality $1: exit $?, $(grep -c 'loss' "$d/train.log") loss lines" >> "$SUMMARY"
}

lora_of() { find "$OUT/quality/$1/output" -name '*.safetensors' ! -path '*state*' | sort | tail -1; }

for PART in "$@"; do
    case "$PART" in
    check)
        for v in t2v-1.3b t2v-14b; do
            for gain in 1 3; do
                run 240 "attention-fp8-$v-gain$gain" framesmith-bench attention-fp8 --variant "$v" \
                    --tokens 32760 --iters 10 --qk-gain "$gain"
            done
        done
        ;;
    step-1.3b)
        P="$WORK/step-1.3b" STEPS="${STEPS:-6}"
        synth "$P" t2v-1.3b bf16 81 "$STEPS"
        config "$P" "$P/bf16.toml" bf16 off
        with_fp8_attention "$P/bf16.toml" "$P/fp8-attention.toml"
        [[ "${BF16_ROW:-1}" == 1 ]] && train_case "$OUT/step-1.3b-bf16" "$P/bf16.toml" "1.3B framesmith train, bf16 attention"
        train_case "$OUT/step-1.3b-fp8" "$P/fp8-attention.toml" "1.3B framesmith train, FP8 attention"
        if [[ -n "${FP8_PRODUCTS:-}" ]]; then
            # FP8 products need an FP8 base: the bf16 file quantised at load (per channel), unlike the other rows.
            with_model_key "$P/fp8-attention.toml" "$P/fp8-base.toml" base_dtype '"fp8"'
            with_model_key "$P/fp8-base.toml" "$P/fp8-both.toml" fp8_matmul true
            train_case "$OUT/step-1.3b-fp8-both" "$P/fp8-both.toml" \
                "1.3B framesmith train, FP8 base, FP8 attention and FP8 products"
        fi
        timed "$OUT/torch-1.3b" torch python3 "$HERE/reference/step.py" --variant t2v-1.3b "${SHAPE[@]}" \
            --warmup 1 --iters 3
        grep -E "ms|loss|peak" "$OUT/torch-1.3b/torch.log" | tail -4 | sed "s/^/  PyTorch eager 1.3B: /" >> "$SUMMARY"
        ;;
    step-14b)
        P="$WORK/step-14b" STEPS="${STEPS:-3}"
        synth "$P" t2v-14b fp8-scaled 81 "$STEPS"
        minimal_config "$P" "$P/budget.toml"
        with_fp8_attention "$P/budget.toml" "$P/budget-fp8-attention.toml"
        extra=(--preset fast-24gb --vram-budget-gb 24)
        [[ "${BF16_ROW:-1}" == 1 ]] &&
            train_case "$OUT/step-14b-bf16" "$P/budget.toml" "14B 24 GiB fast-24gb, bf16 attention" "${extra[@]}"
        [[ "${FP8_ROW:-1}" == 1 ]] && train_case "$OUT/step-14b-fp8" "$P/budget-fp8-attention.toml" \
            "14B 24 GiB fast-24gb, FP8 attention" "${extra[@]}"
        if [[ -n "${FP8_PRODUCTS:-}" ]]; then
            # Every FP8 lever at once: FP8 attention and the block linears on FP8 tensor cores (model.fp8_matmul).
            with_model_key "$P/budget-fp8-attention.toml" "$P/budget-fp8-both.toml" fp8_matmul true
            train_case "$OUT/step-14b-fp8-both" "$P/budget-fp8-both.toml" \
                "14B 24 GiB fast-24gb, FP8 attention and FP8 products" "${extra[@]}"
            if [[ -n "${PROJECTION:-}" ]]; then
                # The same with `memory.checkpointing = "attention_projection"` (self_attn.o's output kept too).
                with_key "$P/budget-fp8-both.toml" "$P/budget-fp8-projection.toml" memory checkpointing \
                    '"attention_projection"'
                train_case "$OUT/step-14b-fp8-projection" "$P/budget-fp8-projection.toml" \
                    "14B 24 GiB fast-24gb, FP8 attention and products, projection kept" "${extra[@]}"
            fi
        fi
        ;;
    torch-14b)
        timed "$OUT/torch-14b" torch python3 "$HERE/reference/step.py" --variant t2v-14b "${SHAPE[@]}" \
            --warmup 1 --iters 2
        grep -E "ms|loss|peak" "$OUT/torch-14b/torch.log" | tail -4 | sed "s/^/  PyTorch eager 14B: /" >> "$SUMMARY"
        ;;
    quality | quality-products)
        # quality: A bf16 attention, B FP8 attention. quality-products: A an FP8 base per channel with bf16
        # products, B the same with `fp8_matmul` (FP8 forward and input-gradient products). C: A with seed 7.
        P="$WORK/quality-1.3b" STEPS="${QUALITY_STEPS:-200}"
        synth "$P" t2v-1.3b bf16 17 "$STEPS"
        if [[ "$PART" == quality ]]; then
            names=(a-bf16 b-fp8 c-seed7) label=fp8-attention
            config "$P" "$P/a-bf16.toml" bf16 off
            with_fp8_attention "$P/a-bf16.toml" "$P/b-fp8.toml"
        else
            names=(a-fp8-base b-fp8-products c-seed7) label=fp8-products
            config "$P" "$P/a-block64.toml" fp8 off
            with_model_key "$P/a-block64.toml" "$P/a-fp8-base.toml" fp8_scale '"channel"'
            with_model_key "$P/a-fp8-base.toml" "$P/b-fp8-products.toml" fp8_matmul true
        fi
        with_seed "$P/${names[0]}.toml" "$P/c-seed7.toml" 7
        rm -rf "$OUT/quality"
        for n in "${names[@]}"; do quality_run "$n" "$P/$n.toml"; done
        python3 - "$OUT/quality" "${names[@]}" <<'EOF' >> "$SUMMARY"
import json, pathlib, statistics, sys
root, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
runs = {}
for name in names:
    losses = {}
    for f in (root / name).rglob("metrics.jsonl"):
        for line in f.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "loss" in r and "step" in r:
                losses[int(r["step"])] = float(r["loss"])
    runs[name] = losses
steps = sorted(set.intersection(*(set(v) for v in runs.values()))) if all(runs.values()) else []
with open(root / "loss-curves.csv", "w") as out:
    out.write("step," + ",".join(runs) + "\n")
    for s in steps:
        out.write(f"{s}," + ",".join(f"{runs[n][s]:.6f}" for n in runs) + "\n")
ref_name = names[0]
ref = runs[ref_name]
for name in names[1:]:
    rel = [abs(runs[name][s] - ref[s]) / abs(ref[s]) for s in steps if ref[s]]
    if rel:
        print(f"quality {name} vs {ref_name}: {len(rel)} steps, loss rel. change mean {statistics.mean(rel):.3e}, "
              f"max {max(rel):.3e}; {ref_name} loss mean {statistics.mean(ref[s] for s in steps):.4f}, "
              f"sd {statistics.pstdev([ref[s] for s in steps]):.4f}")
    else:
        print(f"quality {name}: no common steps")
EOF
        python3 "$HERE/reference/compare_runs.py" "$OUT/quality/${names[0]}/train.log" "$(lora_of "${names[0]}")" \
            "$label=$OUT/quality/${names[1]}/train.log=$(lora_of "${names[1]}")" \
            "seed7=$OUT/quality/c-seed7/train.log=$(lora_of c-seed7)" > "$OUT/quality/compare.log" 2>&1
        grep -E "COMPARE|rror" "$OUT/quality/compare.log" | sed "s/^/  /" >> "$SUMMARY"
        ;;
    *)
        echo "unknown part: $PART" >&2
        exit 2
        ;;
    esac
done
finish_cases "FP8 attention: $*"
