# A fresh 64-bit wine prefix for the Windows checks (sourced by smoke-test.sh and wine-tests.sh, from the
# repository root): its own HOME so nothing leaks into yours, no Mono/Gecko prompts, no Linux menu entries,
# GStreamer's plugins for Wine's Media Foundation, and a stand-in for bcryptprimitives.dll on Wine before 9.
# Usage: wine_prefix DIR  (sets HOME, WINEPREFIX, ... and SYSTEM32)

wine_prefix() {
    need_packages wine:wine /usr/lib/wine/wine64:wine64 x86_64-w64-mingw32-gcc:gcc-mingw-w64-x86-64
    # Wine's Media Foundation demuxes and decodes through GStreamer: mp4 (good), H.264 (libav).
    local plugins=(gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-libav) missing=() p
    for p in "${plugins[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [[ ${#missing[@]} -gt 0 ]]; then
        [[ $(id -u) -eq 0 ]] || { echo "missing: ${missing[*]} (apt-get install them)" >&2; return 1; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    local dir="$1"
    rm -rf "$dir"
    mkdir -p "$dir/home"
    export HOME="$dir/home" WINEPREFIX="$dir/prefix" WINEARCH=win64 WINEDEBUG=-all LANG=C.UTF-8 LC_ALL=C.UTF-8
    export WINEDLLOVERRIDES="mscoree,mshtml=;winemenubuilder.exe=d"
    unset DISPLAY WAYLAND_DISPLAY
    wineboot -i >/dev/null 2>&1
    wineserver -w
    SYSTEM32="$WINEPREFIX/drive_c/windows/system32"
    if [[ ! -e "$SYSTEM32/bcryptprimitives.dll" ]]; then
        # Wine before 9 lacks this Windows 10 DLL that Rust's standard library imports: a stand-in, test only.
        x86_64-w64-mingw32-gcc -shared -O2 -s -o "$SYSTEM32/bcryptprimitives.dll" \
            packaging/windows/wine/bcryptprimitives.c packaging/windows/wine/bcryptprimitives.def -ladvapi32
        echo "ok   this wine has no bcryptprimitives.dll: test stand-in (ProcessPrng over RtlGenRandom) in system32"
    fi
}
