#!/usr/bin/env bash
# Builds the Linux release archive: dist/framesmith-<version>-linux-x86_64.tar.gz holding framesmith-<version>/
# with the binary (GUI and telemetry; stripped), the presets, the icon, the README, framesmith.desktop and
# install.sh (per-user install into ~/.local, `--uninstall` to remove). Then unpacks it and checks
# `framesmith --version` and the .desktop file.
#
# With --cuda: the GPU archive, dist/framesmith-<version>-linux-x86_64-cuda.tar.gz. The binary is built with CUDA
# and cuDNN attention (scripts/cuda-toolchain.sh installs the CUDA 13 compiler and cuDNN from PyPI into
# ~/.cache/framesmith-cuda: no system CUDA), its kernels as machine code for sm_80/86/89/90/120 plus PTX for
# compute_80, candle's kernels as PTX for compute_80. NVIDIA's CUDA 13 runtime libraries and cuDNN 9 from the same
# wheels go into lib/ beside it, found through the binary's RUNPATH ($ORIGIN/lib), with their licences in
# licenses/. The user's machine needs only the NVIDIA driver (580 or newer, for CUDA 13).
#
# Usage: packaging/linux/build.sh [--release] [--cuda] [--no-build]
# Runtime needs on the user's machine: glibc, a Vulkan or OpenGL driver for the window, ffmpeg to read videos.
set -euo pipefail
cd "$(dirname "$0")/../.."
source packaging/lib.sh

PROFILE=debug
BUILD=1
CUDA=0
for arg in "$@"; do
    case "$arg" in
        --release) PROFILE=release ;;
        --cuda) CUDA=1 ;;
        --no-build) BUILD=0 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

VERSION="$(fs_version)"
NAME="framesmith-$VERSION"
BIN="target/$PROFILE/framesmith"
cargo_args=(build --locked --bin framesmith)
[[ $PROFILE == release ]] && cargo_args+=(--release)
if [[ $CUDA -eq 1 ]]; then
    source packaging/linux/cuda.sh
    cuda_prepare
    NAME="$NAME-cuda"
    # NCCL is loaded when a run uses several GPUs (not linked): the archive starts without it.
    cargo_args+=(--features cudnn,nccl)
fi
if [[ $BUILD -eq 1 ]]; then
    cargo "${cargo_args[@]}"
fi
[[ -x "$BIN" ]] || { echo "$BIN is missing: build it first (drop --no-build)" >&2; exit 1; }

STAGE="dist/linux/$NAME"
rm -rf dist/linux
mkdir -p "$STAGE"
strip --strip-debug -o "$STAGE/framesmith" "$BIN"
stage_common "$STAGE"
cp packaging/linux/framesmith.desktop packaging/linux/install.sh "$STAGE/"
[[ $CUDA -eq 1 ]] && cuda_stage "$STAGE"
ARCHIVE="dist/framesmith-$VERSION-linux-x86_64$([[ $CUDA -eq 1 ]] && echo -cuda).tar.gz"
tar -C dist/linux -czf "$ARCHIVE" "$NAME"

# Check what was packed, from the archive itself.
check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
tar -C "$check" -xzf "$ARCHIVE"
run_packed=("$check/$NAME/framesmith")
# No NVIDIA driver here: the build's stub libcuda.so.1 stands in for it, so the binary can start.
[[ $CUDA -eq 1 ]] && run_packed=(env LD_LIBRARY_PATH="$CUDA_STUB_DIR" "$check/$NAME/framesmith")
[[ $CUDA -eq 1 ]] && cuda_check_archive "$check/$NAME"
version="$("${run_packed[@]}" --version)"
[[ "$version" == "framesmith $VERSION" ]] || { echo "unexpected: $version" >&2; exit 1; }
for f in framesmith.desktop install.sh assets/framesmith.png presets/demo-cpu.toml; do
    [[ -s "$check/$NAME/$f" ]] || { echo "missing from the archive: $f" >&2; exit 1; }
done
if command -v desktop-file-validate >/dev/null 2>&1; then
    desktop-file-validate "$check/$NAME/framesmith.desktop"
fi
env -u XDG_DATA_HOME HOME="$check/home" "$check/$NAME/install.sh" >/dev/null
[[ -x "$check/home/.local/bin/framesmith" ]] || { echo "install.sh did not link the binary" >&2; exit 1; }
# The installed copy must find its libraries too (lib/ travels with it).
[[ $CUDA -eq 1 ]] && cuda_check_archive "$check/home/.local/share/framesmith"
env -u XDG_DATA_HOME HOME="$check/home" "$check/$NAME/install.sh" --uninstall >/dev/null
[[ ! -e "$check/home/.local/share/framesmith" ]] || { echo "install.sh --uninstall left files" >&2; exit 1; }
echo "archive: $ARCHIVE ($(fs_size "$ARCHIVE"), $PROFILE build): $version; install.sh and --uninstall checked"
