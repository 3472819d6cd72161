#!/usr/bin/env bash
# Runs framesmith-data's unit tests built for Windows under wine (default filter: the video decoding module,
# whose Windows code Linux CI never compiles): among them, Media Foundation writing-then-reading a real
# H.264 clip at a path with a space and a non-ASCII letter (Wine's Media Foundation, over GStreamer).
# Usage: packaging/windows/wine-tests.sh [test filter...]   (default: media)
set -euo pipefail
cd "$(dirname "$0")/../.."
source packaging/lib.sh
source packaging/windows/wine-env.sh

TARGET=x86_64-pc-windows-gnu
need_packages x86_64-w64-mingw32-g++:g++-mingw-w64-x86-64
rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"
filters=("$@")
[[ ${#filters[@]} -gt 0 ]] || filters=(media)

exe="$(cargo test --locked --target "$TARGET" -p framesmith-data --lib --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])')"
[[ -n "$exe" ]] || { echo "the test build failed: cargo test --target $TARGET -p framesmith-data --lib --no-run" >&2; exit 1; }
wine_prefix "$PWD/dist/wine-tests"
# The MinGW C++ runtime the bundled encoder needs, from the toolchain.
WINEPATH="$(winepath -w "$(dirname "$(ls /usr/lib/gcc/x86_64-w64-mingw32/*-win32/libstdc++-6.dll | head -n1)")")"
export WINEPATH
wine "$exe" "${filters[@]}" 2>&1 | tr -d '\r'
