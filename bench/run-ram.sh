#!/usr/bin/env bash
# Issue 47's RAM must-show on the GPU test machine, through the product's own commands: a synthetic Wan2.1-14B
# project (`framesmith-bench synth-project --variant t2v-14b --dtype fp8-scaled`: random weights in ComfyUI's
# scaled-FP8 single file, one cached 480x832x81 clip), then for each case `framesmith plan` and `framesmith train`
# (STEPS steps, default 6) with a preset, `--vram-budget-gb` and `memory.ram_budget_gb` written into the case's
# run.toml (a key the config sets wins over the preset's). Records the plan's RAM, page-locked RAM, VRAM, the limit
# that binds and the placements it chose; the run's peak RSS (/usr/bin/time -v), its RAM sampled each second from
# /proc (anonymous, file-backed, shared, locked) and the machine's MemAvailable drop (page-locked memory shows there
# whatever the RSS says), the run's VRAM high-water line and the step time. One summary line per case in
# OUT_DIR/summary.txt: plan RAM vs peak RSS (±%), plan VRAM vs peak, step time, and whether RSS stayed within the
# budget. The machine has more RAM than the budgets: the budgets are what the planner must respect. Builds nothing.
# Usage: bench/run-ram.sh BIN_DIR OUT_DIR WORK_DIR [CASE...]
#   CASE = VRAM_GB:RAM_GB:PRESET; default: 16:32:16gb-32gb-ram 16:64:16gb-64gb-ram 24:32:16gb-32gb-ram
set -uo pipefail
if [[ $# -lt 3 ]]; then
    sed -n '2,13p' "$0"
    exit 2
fi
BIN="$(realpath "$1")" OUT="$(realpath -m "$2")" P="$(realpath -m "$3")/ram-14b"
shift 3
CASES=("$@")
[[ ${#CASES[@]} -gt 0 ]] || CASES=(16:32:16gb-32gb-ram 16:64:16gb-64gb-ram 24:32:16gb-32gb-ram)
STEPS="${STEPS:-6}"
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/device-env.sh"
source "$HERE/train-cases.sh"
use_nvidia_libs
mkdir -p "$OUT"
LOG="$OUT/commands.log"
SUMMARY="$OUT/summary.txt"
START=$(date +%s%N)
{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    grep -E 'MemTotal|MemAvailable' /proc/meminfo
} 2>&1 | tee "$OUT/env.log"

if [[ ! -f "$P/run.toml" ]]; then
    t0=$(date +%s)
    "$BIN/framesmith-bench" synth-project --variant t2v-14b --dtype fp8-scaled --out "$P" \
        --frames 81 --height 480 --width 832 --steps "$STEPS" > "$OUT/synth.log" 2>&1 \
        || { tail "$OUT/synth.log"; exit 1; }
    echo "synth-project took $(($(date +%s) - t0)) s" | tee -a "$OUT/synth.log"
fi

# The project's run.toml with max_train_steps = STEPS and memory.ram_budget_gb = RAM_GB.
case_toml() { # out-toml ram-gb
    python3 - "$P/run.toml" "$1" "$2" "$STEPS" <<'EOF'
import re, sys, tomllib
src, dst, ram, steps = sys.argv[1:]
text = open(src).read()
text = re.sub(r"(?m)^ram_budget_gb = .*\n", "", text)
text = re.sub(r"(?m)^max_train_steps = .*$", f"max_train_steps = {steps}", text)
text = text.replace("[memory]\n", f"[memory]\nram_budget_gb = {float(ram)}\n", 1)
assert tomllib.loads(text)["memory"]["ram_budget_gb"] == float(ram)
open(dst, "w").write(text)
EOF
}

# Samples the RAM of the process PID (and the machine's MemAvailable) each second into FILE until it exits.
sample_ram() { # pid file
    local pid="$1" file="$2"
    echo "secs vm_rss_kb rss_anon_kb rss_file_kb rss_shmem_kb vm_lck_kb vm_pin_kb mem_available_kb" > "$file"
    while kill -0 "$pid" 2>/dev/null; do
        awk -v t="$(($(date +%s%N) - START))" '
            FILENAME ~ /status/ && /^(VmRSS|RssAnon|RssFile|RssShmem|VmLck|VmPin):/ { v[$1] = $2 }
            FILENAME ~ /meminfo/ && /^MemAvailable:/ { a = $2 }
            END { printf "%.1f %d %d %d %d %d %d %d\n", t / 1e9, v["VmRSS:"], v["RssAnon:"], v["RssFile:"],
                  v["RssShmem:"], v["VmLck:"], v["VmPin:"], a }' "/proc/$pid/status" /proc/meminfo \
            >> "$file" 2>/dev/null
        sleep 1
    done
}

# One summary line: the plan (JSON) against the run's log, /proc samples and metrics.
summarise_ram() { # case-dir label ram-gb available-kb-before
    python3 - "$@" >> "$SUMMARY" <<'EOF'
import json, pathlib, re, statistics, sys
d, label, ram_gb, before_kb = pathlib.Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
gib = lambda b: b / 2**30
out = f"{label:<26}"
try:
    plan = json.loads((d / "plan.json").read_text())
except (OSError, ValueError):
    plan = None
log = (d / "train.log").read_text(errors="replace") if (d / "train.log").exists() else ""
rss = re.findall(r"Maximum resident set size \(kbytes\): ([0-9]+)", log)
rss = int(rss[-1]) * 1024 if rss else None
if plan:
    pr, pv = plan["peak_ram_bytes"], plan["peak_vram_bytes"]
    out += f" plan {plan['verdict']}, binds {plan.get('binding_limit')}, RAM {gib(pr):.2f} GiB"
    out += f" (pinned {gib(plan['pinned_ram_bytes']):.2f})"
    if rss:
        out += f" vs peak RSS {gib(rss):.2f} GiB ({(rss / max(pr, 1) - 1) * 100:+.1f}%)"
        out += f", RSS {'within' if rss <= ram_gb * 2**30 else 'OVER'} the {ram_gb:g} GiB budget"
    vram = re.findall(r"VRAM: peak ([0-9.]+) GiB so far", log)
    out += f"; plan VRAM {gib(pv):.2f} GiB"
    if vram:
        peak = float(vram[-1])
        out += f" vs peak {peak:.2f} GiB ({(peak * 2**30 / max(pv, 1) - 1) * 100:+.1f}%)"
    p = plan.get("placements") or {}
    out += f"; {plan['blocks_to_swap']} blocks streamed, placements {json.dumps(p, separators=(',', ':'))}"
else:
    out += " no plan"
samples = (d / "ram.txt").read_text().splitlines()[1:] if (d / "ram.txt").exists() else []
cols = [list(map(float, s.split())) for s in samples if len(s.split()) == 8]
if cols:
    mx = lambda i: max(c[i] for c in cols) * 1024
    out += (f"; sampled max anon {gib(mx(2)):.2f} file {gib(mx(3)):.2f} shmem {gib(mx(4)):.2f}"
            f" locked {gib(mx(5)):.2f} pinned {gib(mx(6)):.2f} GiB")
    top = max(cols, key=lambda c: c[1])
    out += (f"; at the sampled RSS peak {gib(top[1] * 1024):.2f} GiB: anon {gib(top[2] * 1024):.2f}"
            f" file {gib(top[3] * 1024):.2f} shmem {gib(top[4] * 1024):.2f} GiB")
    drop = before_kb * 1024 - min(c[7] for c in cols) * 1024
    out += f", MemAvailable drop {gib(drop):.2f} GiB"
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
out += f"; step {statistics.mean(secs):.3f} s (mean of {len(secs)})" if secs else "; no steps recorded"
m = re.search(r"exit ([0-9]+)", (d / "exit.txt").read_text() if (d / "exit.txt").exists() else "")
out += f"; exit {m.group(1) if m else '?'}"
print(out)
EOF
}

for c in "${CASES[@]}"; do
    IFS=: read -r VRAM RAM PRESET <<< "$c"
    TAG="${VRAM}g-vram-${RAM}g-ram-$PRESET"
    D="$OUT/$TAG"
    mkdir -p "$D"
    case_toml "$D/run.toml" "$RAM"
    note "$TAG"
    "$BIN/framesmith" plan --config "$D/run.toml" --preset "$PRESET" --vram-budget-gb "$VRAM" > "$D/plan.txt" 2>&1
    "$BIN/framesmith" plan --config "$D/run.toml" --preset "$PRESET" --vram-budget-gb "$VRAM" --json \
        > "$D/plan.json" 2> "$D/plan-json.err"
    grep -E "^(Fits|Does not fit|Peak)|binds|placements" "$D/plan.txt" | sed "s/^/   $TAG plan: /" | tee -a "$LOG"
    rm -rf "$P/output"
    before=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    /usr/bin/time -v "$BIN/framesmith" train --config "$D/run.toml" --preset "$PRESET" --vram-budget-gb "$VRAM" \
        > >(stamp > "$D/train.log") 2>&1 &
    TIME_PID=$!
    sleep 2
    RUN_PID=$(pgrep -P "$TIME_PID" -x framesmith || true)
    [[ -n "$RUN_PID" ]] && sample_ram "$RUN_PID" "$D/ram.txt" &
    SAMPLER=$!
    wait "$TIME_PID"
    echo "exit $?" > "$D/exit.txt"
    wait "$SAMPLER" 2>/dev/null
    sleep 1
    grep -E "memory plan|placements|step [0-9]+/|VRAM: peak|Maximum resident|error|Error" "$D/train.log" \
        | tail -14 | sed "s/^/   $TAG: /" | tee -a "$LOG"
    keep_outputs "$P" "$D"
    summarise_ram "$D" "$TAG" "$RAM" "$before"
done
cat "$SUMMARY"
