# Sourced by the bench/run-*.sh scripts that time `framesmith train` cases on the GPU test machine. Uses the
# caller's P (the project folder), STEPS, SUMMARY and, from device-env.sh, timed.
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

