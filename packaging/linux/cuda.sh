# The CUDA part of packaging/linux/build.sh (sourced by it with --cuda; not run on its own).
#
# - Toolchain: scripts/cuda-toolchain.sh --cudnn (CUDA 13.0 compiler, runtime libraries, cuDNN 9 and the cuDNN
#   frontend headers from PyPI, in ~/.cache/framesmith-cuda; no system CUDA, no GPU needed to build).
# - Kernels: Framesmith's as a fat binary (build.rs: sm_80/86/89/90/120 and compute_80 PTX); candle's as PTX for
#   compute_80 (CUDA_COMPUTE_CAP=80), which the driver compiles for the card at first use.
# - Libraries: the binary's RUNPATH is $ORIGIN/lib, where the CUDA 13 runtime, cuBLAS, cuBLASLt, cuRAND, NVRTC and
#   cuDNN 9 from those wheels are copied (each already finds its siblings through its own $ORIGIN). Only the
#   driver's libcuda.so.1 comes from the system.
# - Build folder: the default target/ (no RUSTFLAGS: cudarc finds the libraries and the build's stub libcuda.so
#   through CUDA_HOME / CUDA_ROOT / CUDNN_LIB, and patchelf writes the RUNPATH), so every dependency the CPU build
#   compiled is reused and only the CUDA crates and Framesmith's own are built again.

CUDA_LIBS=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13
    libnvrtc-builtins.so.13.0)
CUDNN_LIBS=(libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9
    libcudnn_engines_precompiled.so.9 libcudnn_heuristic.so.9 libcudnn_ops.so.9 libcudnn_cnn.so.9
    libcudnn_adv.so.9)

cuda_prepare() {
    need_packages patchelf:patchelf
    scripts/cuda-toolchain.sh --cudnn >/dev/null
    local venv="${FRAMESMITH_CUDA_VENV:-$HOME/.cache/framesmith-cuda}"
    # shellcheck disable=SC1091
    source "$venv/env.sh"
    unset RUSTFLAGS CARGO_TARGET_DIR
    CUDA_SITE="$(dirname "$(dirname "$CUDNN_ROOT")")"
    # The driver stub where cudarc looks for libraries (<root>/lib of each root it is given), also under its
    # soname, so the packed binary can start here for the checks below.
    CUDA_STUB_DIR="$venv/stub-root/lib"
    mkdir -p "$CUDA_STUB_DIR"
    ln -sf "$venv/stub/libcuda.so" "$CUDA_STUB_DIR/libcuda.so"
    ln -sf "$venv/stub/libcuda.so" "$CUDA_STUB_DIR/libcuda.so.1"
    export CUDA_HOME="$venv/stub-root" CUDNN_LIB="$CUDNN_ROOT"
    export CUDA_COMPUTE_CAP=80
}

# The binary finds its CUDA libraries in lib/ beside it.
cuda_set_runpath() {
    patchelf --set-rpath '$ORIGIN/lib' "$1"
}

cuda_stage() {
    local dest="$1" lib dist
    cuda_set_runpath "$dest/framesmith"
    mkdir -p "$dest/lib" "$dest/licenses"
    for lib in "${CUDA_LIBS[@]}"; do
        cp -L "$CUDA_ROOT/lib/$lib" "$dest/lib/"
    done
    for lib in "${CUDNN_LIBS[@]}"; do
        cp -L "$CUDNN_ROOT/lib/$lib" "$dest/lib/"
    done
    # The licence each wheel ships (the CUDA EULA, the cuDNN SLA), under the package's name.
    for dist in "$CUDA_SITE"/nvidia_*.dist-info; do
        case "$dist" in
            *cuda_runtime*|*cublas*|*curand*|*cuda_nvrtc*|*cudnn_cu13*) ;;
            *) continue ;;
        esac
        lib="$(find "$dist" -iname 'license*' -type f | head -n 1)"
        [[ -n "$lib" ]] && cp "$lib" "$dest/licenses/$(basename "$dist" .dist-info).txt"
    done
}

# Every CUDA library the binary needs resolves inside the unpacked folder, not from the build machine.
cuda_check_archive() {
    local dir="$1" lib resolved
    readelf -d "$dir/framesmith" | grep -q 'R.*PATH.*\$ORIGIN/lib' ||
        { echo "the binary has no \$ORIGIN/lib RUNPATH" >&2; exit 1; }
    resolved="$(env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$CUDA_STUB_DIR" ldd "$dir/framesmith")"
    for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libcudnn.so.9; do
        grep -q "$lib => $dir/lib/$lib" <<< "$resolved" ||
            { echo "$lib does not resolve to $dir/lib:"; grep "$lib" <<< "$resolved"; exit 1; } >&2
    done
    [[ "$(ls "$dir/licenses" | wc -l)" -ge 5 ]] || { echo "licences missing from $dir/licenses" >&2; exit 1; }
}
