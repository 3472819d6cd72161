#!/usr/bin/env bash
# The desktop app on a headless GPU machine, as a user runs it: Xvfb with Mesa's software Vulkan for the window
# (the GPU trains; the UI is drawn on the CPU, as in CI), `framesmith --open RUN_TOML`, Ctrl+Enter to start, tabs
# clicked with xdotool, the screen saved with bench/x11shot.py while the run loads, trains and samples; then the
# finished run replayed with `framesmith --screenshot --run`. Needs the Debian packages bench/device-gl-debs.sh
# downloads (GL: their folder, or the .tar.xz it packs with --pack) and the project bench/run-e2e.sh made in
# WORK_DIR (E2E_PREPARE_ONLY=1 stops it there). Builds nothing.
# Usage: bench/run-app-e2e.sh BIN_DIR GL OUT_DIR [WORK_DIR]
set -uo pipefail
BIN="$(realpath "$1")" GL="$(realpath "$2")" LOG="$3" WORK="${4:-/tmp/framesmith-e2e}"
HERE="$(cd "$(dirname "$0")" && pwd)"
STEPS="${APP_STEPS:-4}"
mkdir -p "$LOG/shots"
ROOT=/opt/framesmith-xgl
mkdir -p "$ROOT"
if [[ -f "$GL" ]]; then
    tar xJf "$GL" -C "$ROOT"
else
    for deb in "$GL"/*.deb; do dpkg -x "$deb" "$ROOT"; done
fi
LIBS="$ROOT/usr/lib/x86_64-linux-gnu"
# Xvfb finds xkbcomp and the keyboard data at fixed paths: add them where the machine has none.
[[ -e /usr/share/X11/xkb ]] || { mkdir -p /usr/share/X11 && cp -r "$ROOT/usr/share/X11/xkb" /usr/share/X11/xkb; }
[[ -e /usr/bin/xkbcomp ]] || cp "$ROOT/usr/bin/xkbcomp" /usr/bin/xkbcomp
mkdir -p /var/lib/xkb
# The software Vulkan driver, by absolute path (its manifest names /usr/lib/...).
sed "s#/usr/lib/x86_64-linux-gnu#$LIBS#" "$ROOT/usr/share/vulkan/icd.d/lvp_icd.x86_64.json" > "$ROOT/lvp.json"
export VK_ICD_FILENAMES="$ROOT/lvp.json" VK_DRIVER_FILES="$ROOT/lvp.json"
source "$HERE/device-env.sh"
export LD_LIBRARY_PATH="$LIBS:$(nvidia_libs):${LD_LIBRARY_PATH:-}"
export PATH="$BIN:$ROOT/usr/bin:$PATH" DISPLAY=:99
START=$(date +%s)
note() { echo "$(( $(date +%s) - START )) s: $*" | tee -a "$LOG/app.log"; }
shot() { python3 "$HERE/x11shot.py" "$LOG/shots/$1.png" && note "screenshot $1"; }
click() { xdotool mousemove "$1" "$2" click 1; sleep "${3:-2}"; }
# Tab bar positions at the app's default 1280x860 window in this Xvfb (measured from a screenshot).
TRAIN_TAB=(274 12) MONITOR_TAB=(335 12) SAMPLES_TAB=(408 12) PLAY_FIRST=(50 141) START=(30 235)

Xvfb :99 -screen 0 1600x1000x24 -nolisten tcp > "$LOG/xvfb.log" 2>&1 &
sleep 3
sed -e "s#$WORK/output#$WORK/app-output#" -e "s/^max_train_steps = .*/max_train_steps = $STEPS/" \
    -e "s/^sample_every_n_steps = .*/sample_every_n_steps = 2/" "$WORK/run.toml" > "$WORK/app-run.toml"
# What `--preset balanced-24gb --vram-budget-gb 24` sets, as the app saves a config after picking the preset.
cat >> "$WORK/app-run.toml" <<'TOML'

[memory]
streaming = "pinned"
blocks_to_swap = "auto"
activations = "host"
checkpointing = "blocks"
shared_memory_guard = true
vram_budget_gb = 24.0
TOML
sed -i -e 's/^\[model\]$/[model]\nbase_dtype = "fp8"\nfp8_scale = "block64"/' "$WORK/app-run.toml"
cp "$WORK/app-run.toml" "$LOG/app-run.toml"
rm -rf "$WORK/app-output"
framesmith --open "$WORK/app-run.toml" > "$LOG/framesmith-app.log" 2>&1 &
APP=$!
sleep 12
shot 01-opened
click "${TRAIN_TAB[@]}" 6
shot 02-train-tab-will-it-fit
# No window manager gives the window the keyboard: focus it, then press the shortcut; the Start button if the run
# has not begun (its output folder appears when it does).
xdotool search --name '^Framesmith$' windowfocus --sync 2>/dev/null
xdotool key ctrl+Return
note "Ctrl+Enter"
sleep 5
if [[ ! -d "$WORK/app-output" ]]; then
    click "${START[@]}" 1
    note "Ctrl+Enter started nothing; clicked Start"
fi
sleep 40
shot 03-loading
click "${MONITOR_TAB[@]}" 20
shot 04-monitor
for _ in $(seq 1 80); do
    [[ -n "$(find "$WORK/app-output/samples" -name '*.mp4' 2>/dev/null | head -1)" ]] && break
    kill -0 "$APP" 2>/dev/null || break
    sleep 3
done
note "first sample: $(find "$WORK/app-output/samples" -name '*.mp4' 2>/dev/null | head -1)"
click "${TRAIN_TAB[@]}" 3
shot 05-train-charts
click "${MONITOR_TAB[@]}" 3
shot 06-monitor-later
click "${SAMPLES_TAB[@]}" 4
shot 07-samples
click "${PLAY_FIRST[@]}" 6
shot 08-player
for _ in $(seq 1 200); do
    grep -q "e2e.safetensors" <(ls "$WORK/app-output" 2>/dev/null) && break
    kill -0 "$APP" 2>/dev/null || break
    sleep 3
done
sleep 5
click "${TRAIN_TAB[@]}" 3
shot 09-finished
kill "$APP" 2>/dev/null; sleep 3; kill -9 "$APP" 2>/dev/null
note "outputs: $(ls "$WORK/app-output" | tr '\n' ' ')"
framesmith --screenshot "$LOG/shots/10-replay.png" --run "$WORK/app-output" >> "$LOG/framesmith-app.log" 2>&1
note "replay screenshot exit $?"
cp "$WORK/app-output/metrics.jsonl" "$LOG/app-metrics.jsonl" 2>/dev/null
kill %1 2>/dev/null
