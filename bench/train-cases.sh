# Sourced by the bench/run-*.sh scripts that time `framesmith train` cases on the GPU test machine. Uses the
# caller's P (the project folder), STEPS, OUT and WORK (the output and work folders), SUMMARY (set by begin_cases)
# and, from device-env.sh, timed, note and use_nvidia_libs.
# One line of the summary from a training run's metrics.jsonl and log: mean step_secs over steps 2..N, the
# VRAM line's peak (and the plan's prediction when there is one), peak RSS.
summarise_train() { # case-dir log-name label
    python3 - "$1" "$2" "$3" >> "$SUMMARY" <<'EOF'
import json, re, statistics, sys, pathlib
d, name, label = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = []
for f in sorted(d.rglob("metrics.jsonl")):
    for line in f.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "step_secs" in r:
            rows.append(r)
secs = [r["step_secs"] for r in rows[1:]] or [r["step_secs"] for r in rows]
log = (d / f"{name}.log").read_text(errors="replace") if (d / f"{name}.log").exists() else ""
vram = re.findall(r"VRAM: peak ([0-9.]+) GiB so far(?: \(the plan predicted ([0-9.]+) GiB)?", log)
rss = re.findall(r"Maximum resident set size \(kbytes\): ([0-9]+)", log)
out = f"{label:<34}"
if secs:
    out += (f" step {statistics.mean(secs):7.3f} s (mean of {len(secs)}, median {statistics.median(secs):.3f},"
            f" {min(secs):.3f}-{max(secs):.3f})")
else:
    out += " no steps recorded"
if vram:
    peak, plan = vram[-1]
    out += f", peak VRAM {float(peak):.2f} GiB" + (f" (plan {float(plan):.2f})" if plan else "")
tensors = re.findall(r"VRAM: peak .* so far.*the tensors' own peak ([0-9.]+) GiB", log)
if tensors:
    out += f", tensors' peak {float(tensors[-1]):.2f} GiB"
if rss:
    out += f", peak RSS {int(rss[-1]) / 2**20:.1f} GiB"
losses = [r["loss"] for r in rows if "loss" in r]
norms = [r["grad_norm"] for r in rows if "grad_norm" in r]
if losses:
    out += f", loss {losses[0]:.4f} -> {losses[-1]:.4f}"
if norms:
    out += f", grad_norm {min(norms):.3g}-{max(norms):.3g}"
lora = re.findall(r"LoRA: ([0-9]+) modules, ([0-9]+) parameters", log)
if lora:
    out += f", {lora[-1][1]} LoRA parameters"
print(out)
EOF
}
# A copy of the project's run.toml with its memory keys replaced, for one case.
config() { # project-dir out-toml base(bf16|fp8) streaming(off|budget) [dit-file]   (CKPT: checkpointing mode)
    local p="$1" out="$2" base="$3" mode="$4" dit="${5:-}" ckpt="${CKPT:-blocks}"
    grep -v -E '^(streaming|blocks_to_swap|activations|checkpointing|base_dtype|fp8_scale) = ' "$p/run.toml" \
        | sed -e "s/^max_train_steps = .*/max_train_steps = $STEPS/" > "$out"
    local model="base_dtype = \"$base\"" memory
    [[ "$base" == fp8 ]] && model+=$'\nfp8_scale = "block64"'
    if [[ "$mode" == budget ]]; then
        memory=$'streaming = "pinned"\nblocks_to_swap = "auto"\nactivations = "host"\ncheckpointing = '"\"$ckpt\""
    else
        memory=$'streaming = "off"\nblocks_to_swap = 0\nactivations = "device"\ncheckpointing = '"\"$ckpt\""
    fi
    python3 - "$out" "$model" "$memory" "$dit" <<'EOF'
import sys
path, model, memory, dit = sys.argv[1:]
text = open(path).read()
text = text.replace("[model]\n", "[model]\n" + model + "\n", 1).replace("[memory]\n", "[memory]\n" + memory + "\n", 1)
if dit:
    lines = [f'dit = "{dit}"' if l.startswith("dit = ") else l for l in text.splitlines()]
    text = "\n".join(lines) + "\n"
open(path, "w").write(text)
EOF
}
# A copy of a run.toml with `[lora] kind` set (the table added when missing; checked by parsing it back).
with_kind() { # in-toml out-toml kind
    python3 - "$1" "$2" "$3" <<'EOF'
import re, sys, tomllib
src, dst, kind = sys.argv[1:]
out, table, done = [], None, False
for line in open(src).read().splitlines():
    m = re.match(r"^\[([A-Za-z_.]+)\]\s*$", line)
    if m:
        table = m.group(1)
    if table == "lora" and re.match(r"^kind\s*=", line):
        continue
    out.append(line)
    if m and table == "lora":
        out.append(f'kind = "{kind}"')
        done = True
if not done:
    out += ["", "[lora]", f'kind = "{kind}"']
text = "\n".join(out) + "\n"
assert tomllib.loads(text)["lora"]["kind"] == kind
open(dst, "w").write(text)
EOF
}
keep_outputs() { # project-dir case-dir
    find "$1/output" -name metrics.jsonl -exec cp {} "$2/" \; 2>/dev/null
    rm -rf "$1/output"
}
train_case() { # case-dir config label [extra framesmith args...]
    local d="$1" toml="$2" label="$3"; shift 3
    timed "$d" train framesmith train --config "$toml" "$@"
    keep_outputs "$P" "$d"
    summarise_train "$d" train "$label"
}

# One line of the summary from a reference step's log: its last `MARKER {json}` line (time per step, peak memory,
# tokens, LoRA size, loss), or where to look when there is none.
summarise_torch() { # log label marker
    python3 - "$1" "$2" "$3" >> "$SUMMARY" <<'EOF'
import json, sys
log, label, marker = sys.argv[1], sys.argv[2], sys.argv[3] + " "
lines = [l.split(marker, 1)[1] for l in open(log, errors="replace") if marker in l]
if lines:
    r = json.loads(lines[-1])
    print(f"{label:<34} step {r['ms_mean'] / 1e3:7.3f} s (mean of {r['steps_timed']}, "
          f"median {r['ms_median'] / 1e3:.3f}), peak allocated {r['peak_allocated_gib']:.2f} GiB "
          f"(reserved {r['peak_reserved_gib']:.2f}), {r['img_tokens']}+{r['txt_tokens']} tokens, "
          f"{r['lora_modules']} LoRA modules, {r['lora_parameters']} LoRA parameters, loss {r['loss']:.4f}")
else:
    print(f"{label:<34} failed: see {log}")
EOF
}
# The project's run.toml cut down to its files, steps, seed, device, LoRA size and outputs: a preset given on the
# command line sets everything else (a key the config spells would win over the preset's). Keeps the [training]
# keys named (default: seed device mode).
minimal_config() { # project-dir out-toml [training-keys]
    python3 - "$1/run.toml" "$2" "$STEPS" "${3:-seed device mode}" <<'EOF'
import json, sys, tomllib
src, out, steps, training = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
cfg = tomllib.load(open(src, "rb"))
keep = {"model": ["dit"], "dataset": ["config"], "training": training, "lora": ["rank", "alpha"],
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
# The machine into OUT/env.txt: the time, the GPU, torch, the reference's package (`reference`: what a check of it
# printed), framesmith's version, memory and cores.
write_env() { # reference
    {
        date -u +%Y-%m-%dT%H:%M:%SZ
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
        python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
        echo "$1"
        framesmith --version 2>&1 | head -1
        free -g | head -2; nproc
    } > "$OUT/env.txt" 2>&1
}
# nvidia-smi's memory and utilisation every second into CASE_DIR/smi.log, in the background (SMI: its pid).
start_smi() { # case-dir
    ( while true; do nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader; sleep 1; done ) > "$1/smi.log" 2>&1 &
    SMI=$!
}
# Stops start_smi's sampler and adds the case's largest memory.used to the summary: nvidia-smi's view (every process
# on the card, the CUDA context included), next to each run's own numbers.
stop_smi() { # case case-dir
    kill "$SMI" 2>/dev/null
    awk -F', ' -v c="$1" '$2 ~ /MiB/ { v = $2 + 0; if (v > m) m = v } END { if (m) printf "%-34s nvidia-smi memory.used max %d MiB\n", "  (" c ")", m }' \
        "$2/smi.log" >> "$SUMMARY"
}
# The cases every family's script runs alike on the project in P: bf16 / fp8 (`framesmith train`, every block
# resident) and budget-24 / budget-16 (`--preset PREFIX-Ngb --vram-budget-gb N` over minimal_config, whose
# [training] keys are TRAINING_KEYS; `framesmith plan` first). Returns 1 for any other case.
memory_case() { # case case-dir preset-prefix [training-keys]
    local case="$1" d="$2" prefix="$3" gb extra
    case "$case" in
    bf16)
        config "$P" "$P/bf16.toml" bf16 off
        train_case "$d" "$P/bf16.toml" "framesmith train, bf16, resident"
        ;;
    fp8)
        config "$P" "$P/fp8.toml" fp8 off
        train_case "$d" "$P/fp8.toml" "framesmith train, FP8 b64, resident"
        ;;
    budget-24|budget-16)
        gb="${case#budget-}"
        minimal_config "$P" "$P/budget.toml" "${4:-}"
        extra=(--preset "${prefix}-${gb}gb" --vram-budget-gb "$gb")
        timed "$d" plan framesmith plan --config "$P/budget.toml" "${extra[@]}"
        train_case "$d" "$P/budget.toml" "framesmith train, preset, $gb GiB" "${extra[@]}"
        ;;
    *) return 1 ;;
    esac
    return 0
}
# The start of a run of cases: the NVIDIA libraries on the path, the clock started (START), OUT and WORK created,
# the run's log OUT/NAME.log (LOG), the summary (SUMMARY) and how many matching lines `timed` keeps (TIMED_LINES).
# shellcheck disable=SC2034  # START, LOG and TIMED_LINES are read by device-env.sh's stamp, note and timed.
begin_cases() { # name
    use_nvidia_libs
    START=$(date +%s%N)
    mkdir -p "$OUT" "$WORK"
    LOG="$OUT/$1.log"
    SUMMARY="$OUT/summary.txt"
    TIMED_LINES=16
}
# The end of a run of cases: `done` in the log, and the summary under its TITLE line (with the GPU from env.txt)
# into OUT/summary-final.txt and on the terminal.
finish_cases() { # title
    note "done"
    {
        echo "== $1 ($(head -2 "$OUT/env.txt" | tail -1)) =="
        cat "$SUMMARY" 2>/dev/null
    } | tee "$OUT/summary-final.txt"
}
