#!/usr/bin/env bash
# Issue 20's GPU rows through the product's own commands: FLUX.1 [dev] LoRA rank 16 at 1024x1024, batch 1, random
# weights at the real size in the official layout (`framesmith-bench synth-project --model flux-dev`: bf16
# `flux1-dev.safetensors` and a ComfyUI scaled-FP8 file, one cached image of random latents and random T5 / CLIP-L
# features), trained with `framesmith train`, against a PyTorch step of the official architecture on the same bf16
# weights and the same cached inputs (bench/reference/flux_step.py: SDPA, bf16, per-block checkpointing, rank 16).
# Each case writes its logs (with timestamps; peak RAM from /usr/bin/time -v), its metrics.jsonl and an nvidia-smi
# trace under OUT_DIR/CASE; OUT_DIR/summary.txt gets one line per run (mean step time of steps 2..N, peak VRAM).
# Builds nothing.
# Usage: bench/run-flux.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]   (BIN_DIR holds framesmith and framesmith-bench)
#   torch         bench/reference/flux_step.py on the bf16 file and the project's caches (TORCH_WARMUP, TORCH_ITERS)
#   bf16          `framesmith train`, bf16 base, every block resident
#   fp8           FP8 block-64 base quantised from the bf16 file at load (balanced-24gb's numerics), resident
#   fp8-file      FP8 base from the ComfyUI scaled-FP8 file (its per-tensor scales), resident
#   budget-12     the fp8 case under `--vram-budget-gb 12`: pinned streaming, blocks_to_swap = "auto" (the planner's
#                 count), activations in RAM; `framesmith plan` first. BUDGET_PRESET=name adds `--preset name`.
#   budget-12-single_first / -double_first / -spread   the same with that memory.flux_stream_order.
#   bf16-attention / bf16-off   the bf16 case with memory.checkpointing = "attention" (each block's attention
#                 output and LSE kept) or "off" (nothing recomputed); torch-none: the PyTorch step without
#                 checkpointing.
#   profile-bf16 / profile-torch   one kernel profile (Nsight Compute, `--clock-control none`, kernel durations
#                 only) of the bf16 case (PROFILE_STEPS steps, default 2; the load's few kernels count in; ncu is
#                 stopped after PROFILE_LIMIT seconds, default 600) or of the PyTorch step (1 warm-up + 1),
#                 summarised per step by kernel class into CASE/kernels.txt (bench/reference/ncu_summary.py).
#   samples       the fp8 case sampling a SIZExSIZE image (20 steps, guidance 3.5) every SAMPLE_EVERY (default 4)
#                 steps, with random ae / CLIP-L / T5-XXL files of the released sizes (synth-project --sample-files);
#                 samples-budget-12 the same under the budget-12 settings (blocks_to_swap = "auto"). Each sample's
#                 seconds, the plan's two phases (training step, sampling) and the VRAM after sampling go to the summary.
#   kontext / kontext-fp8 / kontext-budget-12   a FLUX.1 Kontext [dev] edit LoRA (synth-project --controls 1: the
#                 DiT named flux1-kontext-dev.safetensors, the image cached with one SIZExSIZE control image, so a
#                 step runs 2x the image tokens), bf16 resident, FP8 b64 resident, or FP8 under `--vram-budget-gb 12`.
#   kinds         `framesmith train`, bf16, resident, once per adapter kind (KINDS, default "lora lokr loha dora";
#                 `[lora] kind` set, the kinds' defaults otherwise), one summary line each.
#   torch-kinds   bench/reference/flux_step.py --kind over the same kinds through PEFT (LoraConfig, LoKrConfig,
#                 LoHaConfig, use_dora) on the weights loaded once, one summary line each.
# No CASE: torch bf16 fp8 budget-12. STEPS (default 8) optimizer steps per training run; SEED (default 0).
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,35p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" WORK="$(realpath -m "$3")"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(torch bf16 fp8 budget-12)
STEPS="${STEPS:-8}" SEED="${SEED:-0}" SIZE="${SIZE:-1024}" RANK="${RANK:-16}"
TORCH_WARMUP="${TORCH_WARMUP:-2}" TORCH_ITERS="${TORCH_ITERS:-8}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
begin_cases flux
TIMED_PATTERN="step [0-9]+.*loss|LoRA:|VRAM: peak|stream|plan|sample|FLUX_STEP|Error|error|Elapsed \(wall|Maximum resident"
synth() { # dir dtype
    local dir="$1" dtype="$2" file
    case "$dtype" in bf16) file=flux1-dev.safetensors ;; fp8-scaled) file=flux1-dev-fp8-scaled.safetensors ;; esac
    [[ -f "$dir/$file" && -f "$dir/run.toml" && ( -z "${SAMPLE_FILES:-}" || -f "$dir/prompts.txt" ) ]] && return 0
    timed "$OUT" "synth-$(basename "$dir")" framesmith-bench synth-project --model flux-dev --dtype "$dtype" \
        --out "$dir" --height "$SIZE" --width "$SIZE" --text-tokens 512 --rank "$RANK" --steps "$STEPS" --seed "$SEED" \
        ${SAMPLE_FILES:+--sample-files}
}
# The Kontext project in $1: the same random sizes with one control image per item.
synth_kontext() { # dir
    local dir="$1"
    [[ -f "$dir/flux1-kontext-dev.safetensors" && -f "$dir/run.toml" ]] && return 0
    timed "$OUT" "synth-$(basename "$dir")" framesmith-bench synth-project --model flux-dev --dtype bf16 \
        --out "$dir" --height "$SIZE" --width "$SIZE" --text-tokens 512 --rank "$RANK" --steps "$STEPS" --seed "$SEED" \
        --controls 1
}
# Adds the sample files of project $1 and a [sampling] section (every SAMPLE_EVERY steps) to the config $2.
with_samples() {
    python3 - "$1" "$2" "${SAMPLE_EVERY:-4}" <<'EOF'
import re, sys, tomllib
p, path, every = sys.argv[1:]
text = open(path).read()
# The project's run.toml already spells these keys (empty) and may hold a [sampling] table: set them in place.
sets = {"model": {"vae": f"{p}/ae.safetensors", "text_encoder": f"{p}/t5/t5xxl_fp16.safetensors",
                  "clip": f"{p}/clip/clip_l.safetensors"},
        "sampling": {"prompts": f"{p}/prompts.txt", "sample_every_n_steps": int(every)}}
drop = {name: set(keys) for name, keys in sets.items()}
lines, table = [], None
for line in text.splitlines():
    m = re.match(r"^\[([A-Za-z_.]+)\]\s*$", line)
    if m:
        table = m.group(1)
    key = re.match(r"^([A-Za-z_]+)\s*=", line)
    if key and table in drop and key.group(1) in drop[table]:
        continue
    lines.append(line)
    if m and table in sets:
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in sets[table].items()]
        sets[table] = {}
for name, rest in sets.items():
    if rest:
        lines += ["", f"[{name}]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in rest.items()]
text = "\n".join(lines) + "\n"
tomllib.loads(text)  # fail here, naming the problem, rather than in framesmith
open(path, "w").write(text)
EOF
}
# The summary line of a sampled run: each sample's seconds (from the line before it, a step or a sample, to its own).
summarise_samples() { # case-dir log-name label
    python3 - "$1/$2.log" "$3" >> "$SUMMARY" <<'EOF'
import re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
last, secs = None, []
for line in lines:
    m = re.match(r"\s*([0-9.]+) (.*)", line)
    if not m:
        continue
    t, text = float(m.group(1)), m.group(2)
    if re.search(r"step [0-9]+: sample ", text) and last is not None:
        secs.append(t - last)
    if re.search(r"step [0-9]+.*loss|step [0-9]+: sample ", text):
        last = t
shown = ", ".join(f"{s:.1f}" for s in secs) or "none written"
print(f"{sys.argv[2] + ' samples':<34} {len(secs)} samples, seconds each: {shown}")
EOF
}
# The plan's two phases (`framesmith plan`: the training step and sampling, which binds) and the run's VRAM lines
# after each sampling round, into the summary.
sampling_lines() { # case-dir label
    { grep -hE "peak|Fits|fit:|sampling" "$1/plan.log" | grep -v "^ *[0-9.]* *note" | tail -5
      grep -hE "VRAM after sampling|VRAM: peak" "$1/train.log" | tail -4; } 2>/dev/null \
        | sed -E "s/^ *[0-9.]+ //; s/^/  $2: /" >> "$SUMMARY"
}
# The PyTorch step on the project's bf16 file and caches, and its summary line.
torch_case() { # case-dir log-name label [flux_step.py args...]   (--ncu CSV: under Nsight Compute)
    local d="$1" name="$2" label="$3"; shift 3
    local pre=() args=()
    while [[ $# -gt 0 ]]; do
        if [[ "$1" == --ncu ]]; then
            pre=(ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base
                --log-file "$2")
            shift 2
        else
            args+=("$1"); shift
        fi
    done
    timed "$d" "$name" "${pre[@]}" python3 "$HERE/reference/flux_step.py" --dit "$P/flux1-dev.safetensors" \
        --latent-cache "$(ls "$P"/cache/*_flux.safetensors | head -1)" \
        --text-cache "$(ls "$P"/cache/*_flux_te.safetensors | head -1)" \
        --rank "$RANK" --warmup "$TORCH_WARMUP" --iters "$TORCH_ITERS" "${args[@]}"
    python3 - "$d/$name.log" "$label" >> "$SUMMARY" <<'EOF'
import json, sys
label = sys.argv[2]
lines = [l.split("FLUX_STEP ", 1)[1] for l in open(sys.argv[1], errors="replace") if "FLUX_STEP " in l]
records = [json.loads(l) for l in lines]
# One line per kind when the run trained several (--kind), else the last record.
if records and "--kind" not in label:
    records = records[-1:]
for r in records:
    name = f"{label} {r['kind']}" if len(records) > 1 or "--kind" in label else label
    print(f"{name:<34} step {r['ms_mean'] / 1e3:7.3f} s (mean of {r['steps_timed']}, "
          f"median {r['ms_median'] / 1e3:.3f}), peak allocated {r['peak_allocated_gib']:.2f} GiB "
          f"(reserved {r['peak_reserved_gib']:.2f}), {r['img_tokens']}+{r['txt_tokens']} tokens, "
          f"{r['lora_parameters']} LoRA parameters")
if not records:
    print(f"{label:<34} failed: see {sys.argv[1]}")
EOF
}

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    framesmith --version 2>&1 | head -1
    free -g | head -2; nproc
} > "$OUT/env.txt" 2>&1
P="$WORK/flux-dev"
[[ " ${CASES[*]} " == *" samples"* ]] && SAMPLE_FILES=1
# The base project only for the cases that use it (the Kontext cases make their own).
needs_base=0
for case in "${CASES[@]}"; do [[ "$case" != kontext* ]] && needs_base=1; done
if [[ $needs_base == 1 ]]; then
    synth "$P" bf16 || { note "synth failed"; exit 1; }
fi
for case in "${CASES[@]}"; do
    D="$OUT/$case"
    mkdir -p "$D"
    start_smi "$D"
    case "$case" in
    torch|torch-none)
        extra=()
        [[ "$case" == torch-none ]] && extra=(--no-checkpointing)
        torch_case "$D" torch "PyTorch (official arch., SDPA, bf16${extra:+, no ckpt})" "${extra[@]}"
        ;;
    profile-torch)
        TORCH_WARMUP=1 TORCH_ITERS=1 torch_case "$D" torch "PyTorch under ncu (not a timing)" \
            --ncu "$D/kernels.csv"
        python3 "$HERE/reference/ncu_summary.py" "$D/kernels.csv" --steps 2 > "$D/kernels.txt"
        head -30 "$D/kernels.txt" | tee -a "$LOG"
        gzip -f "$D/kernels.csv"
        ;;
    profile-bf16)
        CKPT="${CKPT:-blocks}" STEPS="${PROFILE_STEPS:-2}" config "$P" "$P/profile.toml" bf16 off
        timed "$D" train timeout "${PROFILE_LIMIT:-600}" ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
            --print-units base --target-processes all --log-file "$D/kernels.csv" \
            framesmith train --config "$P/profile.toml"
        keep_outputs "$P" "$D"
        python3 "$HERE/reference/ncu_summary.py" "$D/kernels.csv" --steps "${PROFILE_STEPS:-2}" > "$D/kernels.txt"
        head -30 "$D/kernels.txt" | tee -a "$LOG"
        gzip -f "$D/kernels.csv"
        ;;
    torch-kinds)
        kinds="${KINDS:-lora lokr loha dora}"
        torch_case "$D" torch "PyTorch+PEFT --kind" --kind "${kinds// /,}"
        ;;
    kinds)
        config "$P" "$P/kinds.toml" bf16 off
        for kind in ${KINDS:-lora lokr loha dora}; do
            with_kind "$P/kinds.toml" "$P/kind-$kind.toml" "$kind"
            train_case "$D/$kind" "$P/kind-$kind.toml" "framesmith train, bf16, $kind"
        done
        ;;
    bf16|bf16-attention|bf16-off)
        mode="${case#bf16}" mode="${mode#-}"
        CKPT="${mode:-blocks}" config "$P" "$P/bf16.toml" bf16 off
        train_case "$D" "$P/bf16.toml" "framesmith train, bf16, resident${mode:+, ckpt $mode}"
        ;;
    fp8)
        config "$P" "$P/fp8.toml" fp8 off
        train_case "$D" "$P/fp8.toml" "framesmith train, FP8 b64, resident"
        ;;
    fp8-file)
        P8="$WORK/flux-dev-fp8"
        synth "$P8" fp8-scaled || { kill "$SMI"; continue; }
        config "$P" "$P/fp8-file.toml" fp8 off "$P8/flux1-dev-fp8-scaled.safetensors"
        train_case "$D" "$P/fp8-file.toml" "framesmith train, FP8 file, resident"
        ;;
    budget-12|budget-12-single_first|budget-12-double_first|budget-12-spread)
        # budget-12 keeps the default memory.flux_stream_order; budget-12-ORDER sets it.
        order="${case#budget-12}" order="${order#-}"
        config "$P" "$P/budget.toml" fp8 budget
        if [[ -n "$order" ]] && grep -q '^flux_stream_order = ' "$P/budget.toml"; then
            sed -i "s/^flux_stream_order = .*/flux_stream_order = \"$order\"/" "$P/budget.toml"
        elif [[ -n "$order" ]]; then
            sed -i "s/^\[memory\]$/[memory]\nflux_stream_order = \"$order\"/" "$P/budget.toml"
        fi
        extra=(--vram-budget-gb 12)
        [[ -n "${BUDGET_PRESET:-}" ]] && extra+=(--preset "$BUDGET_PRESET")
        timed "$D" plan framesmith plan --config "$P/budget.toml" "${extra[@]}"
        train_case "$D" "$P/budget.toml" "framesmith train, FP8 b64, 12 GiB ${order:-default order}" "${extra[@]}"
        ;;
    samples|samples-budget-12)
        extra=()
        if [[ "$case" == samples ]]; then
            config "$P" "$P/samples.toml" fp8 off
        else
            config "$P" "$P/samples.toml" fp8 budget
            extra=(--vram-budget-gb 12)
        fi
        with_samples "$P" "$P/samples.toml"
        # The plan with its sampling phase (issue 47 item 2), then the run; the VRAM lines logged after each
        # sampling round go to the summary beside the plan's two phases.
        timed "$D" plan framesmith plan --config "$P/samples.toml" "${extra[@]}"
        train_case "$D" "$P/samples.toml" "framesmith train, FP8 b64, sampling ${case#samples}" "${extra[@]}"
        summarise_samples "$D" train "$case"
        sampling_lines "$D" "$case"
        ;;
    kontext|kontext-fp8|kontext-budget-12)
        PK="$WORK/flux-kontext"
        synth_kontext "$PK" || { kill "$SMI"; continue; }
        extra=()
        case "$case" in
        kontext) config "$PK" "$PK/run-$case.toml" bf16 off; label="bf16, resident" ;;
        kontext-fp8) config "$PK" "$PK/run-$case.toml" fp8 off; label="FP8 b64, resident" ;;
        *) config "$PK" "$PK/run-$case.toml" fp8 budget; extra=(--vram-budget-gb 12); label="FP8 b64, 12 GiB"
           timed "$D" plan framesmith plan --config "$PK/run-$case.toml" "${extra[@]}" ;;
        esac
        # train_case keeps the outputs of the project in $P.
        ( P="$PK"; train_case "$D" "$PK/run-$case.toml" "framesmith train, Kontext edit, $label" "${extra[@]}" )
        ;;
    *) note "unknown case $case" ;;
    esac
    stop_smi "$case" "$D"
done
finish_cases "FLUX.1 [dev] LoRA rank $RANK, ${SIZE}x${SIZE}, batch 1"
