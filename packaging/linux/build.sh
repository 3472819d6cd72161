#!/usr/bin/env bash
# Builds the Linux release archive: dist/framesmith-<version>-linux-x86_64.tar.gz holding framesmith-<version>/
# with the binary (GUI and telemetry; stripped), the presets, the icon, the README, framesmith.desktop and
# install.sh (per-user install into ~/.local, `--uninstall` to remove). Then unpacks it and checks
# `framesmith --version` and the .desktop file.
#
# Usage: packaging/linux/build.sh [--release] [--no-build]
# Runtime needs on the user's machine: glibc, a Vulkan or OpenGL driver for the window, ffmpeg to read videos.
set -euo pipefail
cd "$(dirname "$0")/../.."
source packaging/lib.sh

PROFILE=debug
BUILD=1
for arg in "$@"; do
    case "$arg" in
        --release) PROFILE=release ;;
        --no-build) BUILD=0 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

VERSION="$(fs_version)"
NAME="framesmith-$VERSION"
BIN="target/$PROFILE/framesmith"
if [[ $BUILD -eq 1 ]]; then
    cargo_args=(build --locked --bin framesmith)
    [[ $PROFILE == release ]] && cargo_args+=(--release)
    cargo "${cargo_args[@]}"
fi
[[ -x "$BIN" ]] || { echo "$BIN is missing: build it first (drop --no-build)" >&2; exit 1; }

STAGE="dist/linux/$NAME"
rm -rf dist/linux
mkdir -p "$STAGE"
strip --strip-debug -o "$STAGE/framesmith" "$BIN"
stage_common "$STAGE"
cp packaging/linux/framesmith.desktop packaging/linux/install.sh "$STAGE/"
ARCHIVE="dist/$NAME-linux-x86_64.tar.gz"
tar -C dist/linux -czf "$ARCHIVE" "$NAME"

# Check what was packed, from the archive itself.
check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
tar -C "$check" -xzf "$ARCHIVE"
version="$("$check/$NAME/framesmith" --version)"
[[ "$version" == "framesmith $VERSION" ]] || { echo "unexpected: $version" >&2; exit 1; }
for f in framesmith.desktop install.sh assets/framesmith.png presets/demo-cpu.toml; do
    [[ -s "$check/$NAME/$f" ]] || { echo "missing from the archive: $f" >&2; exit 1; }
done
if command -v desktop-file-validate >/dev/null 2>&1; then
    desktop-file-validate "$check/$NAME/framesmith.desktop"
fi
env -u XDG_DATA_HOME HOME="$check/home" "$check/$NAME/install.sh" >/dev/null
[[ -x "$check/home/.local/bin/framesmith" ]] || { echo "install.sh did not link the binary" >&2; exit 1; }
env -u XDG_DATA_HOME HOME="$check/home" "$check/$NAME/install.sh" --uninstall >/dev/null
[[ ! -e "$check/home/.local/share/framesmith" ]] || { echo "install.sh --uninstall left files" >&2; exit 1; }
echo "archive: $ARCHIVE ($(fs_size "$ARCHIVE"), $PROFILE build): $version; install.sh and --uninstall checked"
