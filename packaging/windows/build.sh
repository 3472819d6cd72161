#!/usr/bin/env bash
# Builds Framesmith's Windows installer on Linux (Debian): cross-compiles framesmith.exe for
# x86_64-pc-windows-gnu with mingw-w64 (GUI and telemetry on), stages it with the MinGW runtime DLLs it imports,
# the presets and the icon, and packs dist/Framesmith-Setup-<version>.exe with NSIS (makensis).
#
# Usage: packaging/windows/build.sh [--release] [--cuda] [--no-build] [--stage-only]
#   --release   optimised build (default: the dev profile, whose dependencies are already built with -O3)
#   --cuda      with the CUDA path (see packaging/windows/cuda.sh): CUDA 13 runtime and cuDNN 9 DLLs from PyPI's
#               Windows wheels beside the exe, nvcuda.dll and cuDNN delay-loaded so the app starts without an
#               NVIDIA driver (checked under wine; not yet run on a Windows GPU)
#   --no-build  package the framesmith.exe built last time
#   --stage-only  stop after staging the program folder (no installer)
# Installs the Debian packages it needs (gcc/g++-mingw-w64-x86-64, nsis) when run as root.
# Outputs (all under dist/, ignored by git): dist/windows/Framesmith/ (the staged program folder) and the installer
# (Framesmith-Setup-<version>.exe, or Framesmith-Setup-<version>-cuda.exe with --cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
source packaging/lib.sh

PROFILE=debug
CUDA=0
BUILD=1
INSTALLER=1
for arg in "$@"; do
    case "$arg" in
        --release) PROFILE=release ;;
        --cuda) CUDA=1 ;;
        --no-build) BUILD=0 ;;
        --stage-only) INSTALLER=0 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

TARGET=x86_64-pc-windows-gnu
# MinGW's thread model: win32 for the CPU build; the CUDA build switches to posix (packaging/windows/cuda.sh).
MINGW_THREADS=win32
need_packages x86_64-w64-mingw32-gcc:gcc-mingw-w64-x86-64 x86_64-w64-mingw32-g++:g++-mingw-w64-x86-64 \
    x86_64-w64-mingw32-dlltool:binutils-mingw-w64-x86-64 makensis:nsis
rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"

VERSION="$(fs_version)"
DIST="$PWD/dist"
STAGE="$DIST/windows/Framesmith"
EXE="target/$TARGET/$PROFILE/framesmith.exe"

cargo_args=(build --locked --target "$TARGET" --bin framesmith)
[[ $PROFILE == release ]] && cargo_args+=(--release)
if [[ $CUDA -eq 1 ]]; then
    source packaging/windows/cuda.sh
    cuda_prepare
    cargo_args+=(--features cudnn)
fi
if [[ $BUILD -eq 1 ]]; then
    echo "building $EXE ($PROFILE profile, cuda: $CUDA)" >&2
    if [[ $CUDA -eq 1 ]]; then cuda_cargo "${cargo_args[@]}"; else cargo "${cargo_args[@]}"; fi
fi
[[ -f "$EXE" ]] || { echo "$EXE is missing: build it first (drop --no-build)" >&2; exit 1; }

# The DLLs the exe (and those DLLs) import from the MinGW toolchain: the C++ runtime of the bundled OpenH264
# encoder and its dependencies. Everything else it imports is part of Windows.
copy_mingw_runtime() {
    local dest="$1" file dll dir
    local dirs=(/usr/lib/gcc/x86_64-w64-mingw32/*-"$MINGW_THREADS" /usr/x86_64-w64-mingw32/lib)
    local queue=("$dest/framesmith.exe")
    while [[ ${#queue[@]} -gt 0 ]]; do
        file="${queue[0]}"
        queue=("${queue[@]:1}")
        for dll in $(x86_64-w64-mingw32-objdump -p "$file" | awk '/DLL Name:/ {print $3}'); do
            [[ -e "$dest/$dll" ]] && continue
            for dir in "${dirs[@]}"; do
                if [[ -f "$dir/$dll" ]]; then
                    x86_64-w64-mingw32-strip --strip-debug -o "$dest/$dll" "$dir/$dll"
                    queue+=("$dest/$dll")
                    break
                fi
            done
        done
    done
}

rm -rf "$DIST/windows"
mkdir -p "$STAGE"
# Line-table debug info is for developers; the shipped exe is stripped.
x86_64-w64-mingw32-strip --strip-debug -o "$STAGE/framesmith.exe" "$EXE"
copy_mingw_runtime "$STAGE"
[[ $CUDA -eq 1 ]] && cuda_stage "$STAGE"
stage_common "$STAGE"
cp packaging/windows/THIRD-PARTY.txt "$STAGE/"
tree_args=(tree --locked --target "$TARGET" -p framesmith -e normal,build --prefix none -f '{p} {l}')
[[ $CUDA -eq 1 ]] && tree_args+=(--features cudnn)
cargo "${tree_args[@]}" | sed 's/ (\*)$//' | grep -Ev '^framesmith(-[a-z]+)? ' | sort -u > "$STAGE/crates.txt"

# The uninstaller's list: every staged file, then every staged folder deepest first (RMDir keeps non-empty ones).
UNLIST="$DIST/windows/uninstall-list.nsh"
(
    cd "$STAGE"
    find . -type f | sort | sed 's|^\./||; s|/|\\|g; s|\$|$$|g' | awk '{print "  Delete \"$INSTDIR\\" $0 "\""}'
    find . -mindepth 1 -type d | sort -r | sed 's|^\./||; s|/|\\|g; s|\$|$$|g' | awk '{print "  RMDir \"$INSTDIR\\" $0 "\""}'
) > "$UNLIST"

if [[ $INSTALLER -eq 0 ]]; then
    echo "staged: $STAGE ($(du -sh "$STAGE" | cut -f1), $PROFILE build)"
    exit 0
fi
OUTFILE="$DIST/Framesmith-Setup-$VERSION.exe"
[[ $CUDA -eq 1 ]] && OUTFILE="$DIST/Framesmith-Setup-$VERSION-cuda.exe"
makensis -V2 -DVERSION="$VERSION" -DSTAGE="$STAGE" -DOUTFILE="$OUTFILE" -DUNLIST="$UNLIST" \
    packaging/windows/framesmith.nsi
echo "installer: $OUTFILE ($(fs_size "$OUTFILE"); program folder $(du -sh "$STAGE" | cut -f1), $PROFILE build)"
