#!/usr/bin/env bash
# Sets up a CUDA 13.0 build toolchain for `cargo build --features cuda` on a machine
# without a GPU, a driver or a system CUDA toolkit (see shared/CUDA.md).
#
# What it does, idempotently:
#   1. creates a Python venv outside the repo ($FRAMESMITH_CUDA_VENV, default
#      ~/.cache/framesmith-cuda) and pip-installs the pinned CUDA 13.0 compiler and libraries
#      (and cuDNN + the cuDNN frontend headers with --cudnn);
#   2. adds the unversioned .so links the linker looks for;
#   3. builds a stub libcuda.so (soname libcuda.so.1) that defines every driver-API symbol
#      cudarc can reference, so binaries link here; at run time the real driver is used;
#   4. writes `env.sh` in the venv and prints the environment to build with.
#
# Usage: scripts/cuda-toolchain.sh [--cudnn] [--print-env]
#   --print-env  only print the environment (the toolchain must exist already).
set -euo pipefail

VENV="${FRAMESMITH_CUDA_VENV:-$HOME/.cache/framesmith-cuda}"
WITH_CUDNN=0
PRINT_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --cudnn) WITH_CUDNN=1 ;;
        --print-env) PRINT_ONLY=1 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

# The newest nvvm / crt do not match the 13.0 compiler: everything is pinned to 13.0.
CUDA_PKGS=(
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
    nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
    nvidia-cublas==13.0.0.19 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88
)
# cuDNN 9.19 is what PyTorch 2.11 ships on the test machine; the frontend is header-only.
CUDNN_PKGS=(nvidia-cudnn-cu13==9.19.0.56 nvidia-cudnn-frontend==1.18.0)

py() { "$VENV/bin/python" "$@"; }

if [[ $PRINT_ONLY -eq 0 ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "creating venv $VENV" >&2
        python3 -m venv "$VENV"
    fi
    pkgs=("${CUDA_PKGS[@]}")
    [[ $WITH_CUDNN -eq 1 ]] && pkgs+=("${CUDNN_PKGS[@]}")
    py -m pip install -q "${pkgs[@]}"
fi

SITE="$(py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
CU13="$SITE/nvidia/cu13"
[[ -x "$CU13/bin/nvcc" ]] || { echo "nvcc not found under $CU13: run without --print-env first" >&2; exit 1; }
STUB_DIR="$VENV/stub"

if [[ $PRINT_ONLY -eq 0 ]]; then
    # The linker looks for the unversioned names; pip ships only the versioned ones.
    for lib in cublas cublasLt curand nvrtc cudart cudnn; do
        for dir in "$CU13/lib" "$SITE/nvidia/cudnn/lib"; do
            [[ -d "$dir" ]] || continue
            versioned="$(cd "$dir" && ls "lib$lib.so."* 2>/dev/null | sort -V | head -n1 || true)"
            if [[ -n "$versioned" && ! -e "$dir/lib$lib.so" ]]; then
                ln -s "$versioned" "$dir/lib$lib.so"
            fi
        done
    done

    # Stub driver library. The symbol list is every driver function cudarc declares (a
    # superset of what candle references), so it does not depend on a previous build.
    find_cudarc() { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-*/src/driver/sys/mod.rs 2>/dev/null || true; }
    cudarc_sys="$(find_cudarc)"
    if [[ -z "$cudarc_sys" ]]; then
        echo "fetching crate sources (cudarc's driver bindings list the symbols to stub)" >&2
        (cd "$(dirname "$0")/.." && cargo fetch --locked)
        cudarc_sys="$(find_cudarc)"
    fi
    [[ -n "$cudarc_sys" ]] || { echo "cudarc sources not found after cargo fetch" >&2; exit 1; }
    mkdir -p "$STUB_DIR"
    # shellcheck disable=SC2086
    grep -hoE '^\s+fn cu[A-Za-z0-9_]+\(' $cudarc_sys \
        | sed -E 's/^\s+fn (cu[A-Za-z0-9_]+)\(/\1/' | sort -u \
        | awk '{ printf "int %s(void) { return 999; }\n", $1 }' > "$STUB_DIR/cuda_stub.c"
    nsyms="$(wc -l < "$STUB_DIR/cuda_stub.c")"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUB_DIR/libcuda.so" "$STUB_DIR/cuda_stub.c"
    echo "stub libcuda.so with $nsyms symbols in $STUB_DIR" >&2
fi

CUDNN_DIR="$SITE/nvidia/cudnn"
# nvidia-cudnn-frontend puts its headers straight into site-packages/include.
FE_INC=""
[[ -f "$SITE/include/cudnn_frontend.h" ]] && FE_INC="$SITE/include"
RUST_L="-L $STUB_DIR -L $CU13/lib"
[[ -d "$CUDNN_DIR/lib" ]] && RUST_L="$RUST_L -L $CUDNN_DIR/lib"

{
    echo "export PATH=\"$CU13/bin:\$PATH\""
    echo "export CUDA_ROOT=\"$CU13\" CUDA_PATH=\"$CU13\" CUDA_COMPUTE_CAP=90"
    echo "export RUSTFLAGS=\"$RUST_L\""
    [[ -d "$CUDNN_DIR/include" ]] && echo "export CUDNN_ROOT=\"$CUDNN_DIR\""
    [[ -n "$FE_INC" ]] && echo "export CUDNN_FRONTEND_INCLUDE=\"$FE_INC\""
    echo "export CARGO_TARGET_DIR=\"\${CARGO_TARGET_DIR:-\$PWD/target/cuda}\""
} > "$VENV/env.sh"

echo "# Build with:  source $VENV/env.sh && cargo build --release --features cuda" >&2
cat "$VENV/env.sh"
