#!/usr/bin/env bash
# Smoke test of the Windows installer under wine, on Linux, end to end:
#   1. a fresh 64-bit wine prefix (under dist/smoke, with its own HOME so nothing leaks into yours; see
#      wine-env.sh);
#   2. the installer, silently, into a folder whose path has spaces and non-ASCII characters;
#   3. every staged file installed byte for byte, the Start-menu and desktop shortcuts, the work folder, and the
#      Add/Remove Programs entry with the version;
#   4. `framesmith.exe --version`, then a headless `framesmith.exe demo` (CPU) into a folder with spaces and
#      non-ASCII characters, to completion; the LoRA it writes (keys, step count, finite values) and the sample
#      clip (an MP4 that ffprobe reads, when ffprobe is installed);
#   5. `framesmith.exe dataset check` on the demo's clips: sizes and frame counts through Media Foundation (Wine's,
#      which decodes with GStreamer; no ffmpeg is visible to the Windows program);
#   6. the uninstaller, silently: the program folder, the shortcuts and the registry entries gone, the user's
#      outputs kept;
#   7. a second install with no folder given lands in %LOCALAPPDATA%\Programs\Framesmith, and uninstalls cleanly.
# NSIS silent mode hides errors in the exit code, so every step checks the files themselves.
#
# Usage: packaging/windows/smoke-test.sh [installer.exe]   (default: dist/Framesmith-Setup-<version>.exe)
# Environment: SMOKE_DEMO_STEPS (default 100) optimizer steps of the demo run.
set -euo pipefail
cd "$(dirname "$0")/../.."
source packaging/lib.sh

VERSION="$(fs_version)"
INSTALLER="$(realpath "${1:-dist/Framesmith-Setup-$VERSION.exe}")"
STAGE="$PWD/dist/windows/Framesmith"
STEPS="${SMOKE_DEMO_STEPS:-100}"
[[ -f "$INSTALLER" ]] || { echo "no installer at $INSTALLER: run packaging/windows/build.sh first" >&2; exit 1; }
[[ -d "$STAGE" ]] || { echo "no staged folder $STAGE: run packaging/windows/build.sh first" >&2; exit 1; }
need_packages python3:python3
source packaging/windows/wine-env.sh

T0=$SECONDS
step() { printf '\n== [%3ds] %s\n' $((SECONDS - T0)) "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok   $*"; }
win() { wine "$@"; wineserver -w; }
# A Windows environment variable of the prefix, as a Unix path.
winvar() { winepath -u "$(wine cmd /c echo "%$1%" | tr -d '\r')"; }
# A registry value; reg.exe writes in the console's OEM code page (437 in a fresh prefix).
reg_value() {
    wine reg query "$1" /v "$2" 2>/dev/null | iconv -f CP437 -t UTF-8 | tr -d '\r' |
        awk -v n="$2" '$1 == n {$1=""; $2=""; sub(/^ +/, ""); print}'
}
UNINST_KEY='HKCU\Software\Microsoft\Windows\CurrentVersion\Uninstall\Framesmith'

step "installer $(basename "$INSTALLER"): $(fs_size "$INSTALLER") ($(stat -c %s "$INSTALLER") bytes)"

step "fresh wine prefix"
wine_prefix "$PWD/dist/smoke"
ok "$(wine --version)"
APPDATA_U="$(winvar APPDATA)"
LOCALAPPDATA_U="$(winvar LOCALAPPDATA)"
PROFILE_U="$(winvar USERPROFILE)"
ok "profile $PROFILE_U"

check_installed() {
    local inst="$1" rel
    [[ -d "$inst" ]] || fail "no program folder at $inst"
    while IFS= read -r rel; do
        cmp -s "$STAGE/$rel" "$inst/$rel" || fail "not installed or different: $rel"
    done < <(cd "$STAGE" && find . -type f | sed 's|^\./||' | sort)
    ok "$(cd "$STAGE" && find . -type f | wc -l) staged files installed identically in $inst"
    [[ -s "$inst/uninstall.exe" ]] || fail "no uninstaller"
    ok "uninstall.exe"
    [[ -s "$APPDATA_U/Microsoft/Windows/Start Menu/Programs/Framesmith.lnk" ]] || fail "no Start-menu shortcut"
    ok "Start-menu shortcut"
    [[ -s "$PROFILE_U/Desktop/Framesmith.lnk" ]] || fail "no desktop shortcut"
    ok "desktop shortcut"
    [[ -d "$PROFILE_U/Documents/Framesmith" ]] || fail "no work folder Documents\\Framesmith"
    ok "work folder Documents\\Framesmith"
    local version
    version="$(reg_value "$UNINST_KEY" DisplayVersion)"
    [[ "$version" == "$VERSION" ]] || fail "Add/Remove Programs shows version '$version', expected $VERSION"
    ok "Add/Remove Programs: Framesmith $version, uninstall: $(reg_value "$UNINST_KEY" UninstallString)"
}

check_uninstalled() {
    local inst="$1"
    [[ ! -e "$inst" ]] || { find "$inst" | head; fail "the program folder is still there: $inst"; }
    ok "program folder gone"
    [[ ! -e "$APPDATA_U/Microsoft/Windows/Start Menu/Programs/Framesmith.lnk" ]] || fail "Start-menu shortcut left"
    [[ ! -e "$PROFILE_U/Desktop/Framesmith.lnk" ]] || fail "desktop shortcut left"
    ok "shortcuts gone"
    [[ -z "$(reg_value "$UNINST_KEY" DisplayVersion)" ]] || fail "Add/Remove Programs entry left"
    ok "Add/Remove Programs entry gone"
}

# NSIS reads /D= only unquoted and last on the command line, which wine cannot pass for a path with spaces; the
# installer also takes its folder from HKCU\Software\Framesmith\InstallDir (what a reinstall does), so the test
# sets that to the awkward path.
INSTDIR_WIN='C:\Prögram Fïles\Frame smith'
step "silent install into $INSTDIR_WIN"
win reg add 'HKCU\Software\Framesmith' /v InstallDir /t REG_SZ /d "$INSTDIR_WIN" /f >/dev/null
win "$INSTALLER" /S
INST="$(winepath -u "$INSTDIR_WIN")"
INST="${INST%/}"
check_installed "$INST"

step "framesmith.exe --version"
out="$(wine "$INST/framesmith.exe" --version | tr -d '\r')"
wineserver -w
echo "$out"
[[ "$out" == "framesmith $VERSION" ]] || fail "unexpected version output"

DEMO_U="$PROFILE_U/Documents/Framesmith/démo run ü"
step "framesmith.exe demo --steps $STEPS --out \"démo run ü\" (CPU, in Documents\\Framesmith)"
(cd "$PROFILE_U/Documents/Framesmith" && wine "$INST/framesmith.exe" demo --steps "$STEPS" --out "démo run ü" 2>&1 |
    tr -d '\r' | grep -v -E '^\s*$' | tail -n 12)
wineserver -w
LORA="$DEMO_U/output/demo-lora.safetensors"
[[ -s "$LORA" ]] || fail "the demo wrote no LoRA at $LORA"
python3 - "$LORA" "$STEPS" <<'PY'
import json, math, struct, sys
path, steps = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
meta = header.pop("__metadata__", {})
downs = [k for k in header if k.endswith(".lora_down.weight")]
ups = [k for k in header if k.endswith(".lora_up.weight")]
assert downs and len(downs) == len(ups), f"{len(downs)} down / {len(ups)} up weights"
assert all(k.startswith("lora_unet_blocks_") for k in downs), downs[:3]
assert meta.get("ss_steps") == steps, f"ss_steps {meta.get('ss_steps')} != {steps}"
body = data[8 + n:]

def values(raw, dtype):
    """The tensor's numbers, with the standard library only (no numpy on a fresh machine)."""
    if dtype == "F32":
        return struct.unpack(f"<{len(raw) // 4}f", raw)
    if dtype == "F16":
        return struct.unpack(f"<{len(raw) // 2}e", raw)
    if dtype == "BF16":
        halves = struct.unpack(f"<{len(raw) // 2}H", raw)
        return struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves)))
    raise AssertionError(f"unexpected dtype {dtype}")

nonzero_up = 0
for k, t in header.items():
    a, b = t["data_offsets"]
    v = values(body[a:b], t["dtype"])
    assert all(math.isfinite(x) for x in v), f"non-finite values in {k}"
    if k in ups and max(abs(x) for x in v) > 0:
        nonzero_up += 1
assert nonzero_up == len(ups), f"only {nonzero_up} of {len(ups)} lora_up weights moved from zero"
print(f"ok   LoRA {len(downs)} modules, ss_steps={steps}, all finite, every lora_up trained ({len(data)} bytes)")
PY
CLIP="$(find "$DEMO_U/output/samples" -name '*.mp4' | sort | head -n1)"
[[ -n "$CLIP" && -s "$CLIP" ]] || fail "the demo wrote no sample clip under $DEMO_U/output/samples"
[[ "$(head -c 8 "$CLIP" | tail -c 4)" == "ftyp" ]] || fail "the sample clip is not an MP4: $CLIP"
if command -v ffprobe >/dev/null 2>&1; then
    frames="$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=codec_name,width,height,nb_read_frames \
        -of csv=p=0 "$CLIP")"
    [[ "$frames" == h264,* ]] || fail "ffprobe cannot read the sample clip: $frames"
    ok "sample clip $(basename "$CLIP"): codec,width,height,frames = $frames"
else
    ok "sample clip $(basename "$CLIP") is an MP4 ($(fs_size "$CLIP")); ffprobe not installed, frames not counted"
fi

step "framesmith.exe dataset check on the demo's clips: videos read by Media Foundation (Wine's, over GStreamer)"
report="$(cd "$DEMO_U" && wine "$INST/framesmith.exe" dataset check dataset.toml 2>&1 | tr -d '\r')"
wineserver -w
echo "$report" | tail -n 6
grep -q "0 unreadable file(s)" <<<"$report" && grep -q "frames: 5 to 5" <<<"$report" ||
    fail "Media Foundation did not measure the demo's clips"
ok "every clip measured through Media Foundation (5 frames each)"

step "silent uninstall"
win "$INST/uninstall.exe" /S
check_uninstalled "$INST"
[[ -s "$LORA" ]] || fail "the uninstaller removed the user's outputs"
ok "outputs kept: $(find "$DEMO_U" -type f | wc -l) files in Documents\\Framesmith\\démo run ü"

step "second install with the default folder, then uninstall"
win "$INSTALLER" /S
DEFAULT="$LOCALAPPDATA_U/Programs/Framesmith"
check_installed "$DEFAULT"
win "$DEFAULT/uninstall.exe" /S
check_uninstalled "$DEFAULT"

step "smoke test passed"
