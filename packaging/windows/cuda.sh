# The CUDA part of packaging/windows/build.sh (sourced by it with --cuda; not run on its own).
# Status: builds and links; under wine (no nvcuda.dll) the exe starts, and with training.device = "auto" trains on
# the CPU after "no CUDA device found". Not yet run on a Windows PC with an NVIDIA GPU.
#
# - Kernels: PTX does not depend on the operating system, so build.rs and candle-kernels compile it with the
#   Linux CUDA 13.0 compiler from PyPI (scripts/cuda-toolchain.sh), for compute capability 8.0 (Ampere and every
#   newer card; the driver compiles it for the card).
# - Runtime libraries: cudart, cuBLAS, cuBLASLt, cuRAND and NVRTC come from NVIDIA's win_amd64 wheels on PyPI
#   (the same versions as the Linux toolchain) and are installed beside framesmith.exe; MinGW import libraries
#   are made for them from their export tables (gendef + dlltool).
# - The driver (nvcuda.dll) is linked through a delay-load import library made with dlltool from the list of
#   driver functions cudarc declares: Windows loads nvcuda.dll at the first CUDA call, not at start-up, so the
#   app starts on a PC without an NVIDIA driver; framesmith::platform checks for the DLL before any CUDA call
#   and says why training runs on the CPU.
# - candle-kernels also compiles its MoE / GGUF kernels into a static host library (libmoe.a) with nvcc, whose
#   host side is built by the Linux gcc (ELF objects, unusable in a Windows exe; nvcc on Linux cannot target
#   Windows). Framesmith uses none of those kernels, so that archive is replaced by MinGW stand-ins (cuda_cargo).
# - cuDNN (fused attention, convolutions): its DLLs come from NVIDIA's win_amd64 cuDNN wheel (the version the
#   Linux build uses) and are installed beside the exe with the wheel's License.txt. The attention shim
#   (kernels/cudnn_sdpa.cpp) is compiled by MinGW's g++ in its POSIX thread model (the cuDNN frontend needs
#   std::mutex) and calls cuDNN through a delay-load import library, like the driver: cudnn64_9.dll is loaded at
#   the first cuDNN call, after framesmith::driver has checked that it can be. The whole exe is then linked by
#   the POSIX-model gcc, and the MinGW runtime DLLs staged beside it are that model's.

CUDA_WHEELS=(nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.0.19 nvidia-curand==10.4.0.35
    nvidia-cuda-nvrtc==13.0.88 nvidia-cudnn-cu13==9.19.0.56)
# Import name (as cudarc links it: -l<name>) and the DLL that provides it.
CUDA_IMPORTS=(cudart:cudart64_13.dll cublas:cublas64_13.dll cublasLt:cublasLt64_13.dll curand:curand64_10.dll
    nvrtc:nvrtc64_130_0.dll)
# cuDNN's DLLs: the entry point (imported lazily) and the libraries it loads itself.
CUDNN_DLLS=(cudnn64_9.dll cudnn_graph64_9.dll cudnn_engines_runtime_compiled64_9.dll
    cudnn_engines_precompiled64_9.dll cudnn_heuristic64_9.dll cudnn_ops64_9.dll cudnn_cnn64_9.dll
    cudnn_adv64_9.dll)
WIN_CUDA="${FRAMESMITH_WIN_CUDA:-$HOME/.cache/framesmith-win/cuda13}"

cuda_prepare() {
    need_packages gendef:mingw-w64-tools pip3:python3-pip
    scripts/cuda-toolchain.sh --cudnn >/dev/null
    # shellcheck disable=SC1091
    local env_sh="${FRAMESMITH_CUDA_VENV:-$HOME/.cache/framesmith-cuda}/env.sh"
    LINUX_CU13="$(source "$env_sh" && echo "$CUDA_ROOT")"
    # cuDNN's headers are the same on every platform: the shim compiles against the Linux wheel's.
    CUDNN_ROOT="$(source "$env_sh" && echo "$CUDNN_ROOT")"
    CUDNN_FRONTEND_INCLUDE="$(source "$env_sh" && echo "$CUDNN_FRONTEND_INCLUDE")"
    local stub_c="${FRAMESMITH_CUDA_VENV:-$HOME/.cache/framesmith-cuda}/stub/cuda_stub.c"
    mkdir -p "$WIN_CUDA/wheels" "$WIN_CUDA/bin" "$WIN_CUDA/lib"
    if [[ ! -f "$WIN_CUDA/bin/cublasLt64_13.dll" || ! -f "$WIN_CUDA/bin/cudnn64_9.dll" ]]; then
        pip3 download -q --no-deps --only-binary=:all: --platform win_amd64 --python-version 3.11 \
            -d "$WIN_CUDA/wheels" "${CUDA_WHEELS[@]}"
        local whl
        for whl in "$WIN_CUDA"/wheels/*.whl; do
            python3 - "$whl" "$WIN_CUDA/bin" <<'PY'
import sys, zipfile, os
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        base = os.path.basename(name)
        if base.endswith(".dll") and not base.endswith(".alt.dll") and base != "nvblas64_13.dll":
            with z.open(name) as src, open(os.path.join(dest, base), "wb") as out:
                out.write(src.read())
        # The licence NVIDIA ships each wheel under, kept beside its DLLs.
        if base == "License.txt" and "cudnn" in os.path.basename(whl):
            with z.open(name) as src, open(os.path.join(dest, "cuDNN-License.txt"), "wb") as out:
                out.write(src.read())
PY
        done
    fi
    local pair name dll
    for pair in "${CUDA_IMPORTS[@]}"; do
        name="${pair%%:*}"
        dll="${pair#*:}"
        [[ -f "$WIN_CUDA/lib/lib$name.dll.a" ]] && continue
        (cd "$WIN_CUDA/lib" && gendef - "../bin/$dll" > "$name.def" 2>/dev/null)
        x86_64-w64-mingw32-dlltool -d "$WIN_CUDA/lib/$name.def" -D "$dll" -l "$WIN_CUDA/lib/lib$name.dll.a"
    done
    # cuDNN, imported lazily from cudnn64_9.dll (framesmith::driver checks it loads before any call).
    if [[ ! -f "$WIN_CUDA/lib/libcudnn.a" ]]; then
        (cd "$WIN_CUDA/lib" && gendef - ../bin/cudnn64_9.dll > cudnn.def 2>/dev/null)
        x86_64-w64-mingw32-dlltool -d "$WIN_CUDA/lib/cudnn.def" -D cudnn64_9.dll -y "$WIN_CUDA/lib/libcudnn.a"
    fi
    # The driver: every function cudarc declares, imported lazily from nvcuda.dll.
    if [[ ! -f "$WIN_CUDA/lib/libcuda.a" ]]; then
        { echo "LIBRARY nvcuda.dll"; echo "EXPORTS"; sed -E 's/^int (cu[A-Za-z0-9_]+)\(.*/\1/' "$stub_c"; } \
            > "$WIN_CUDA/lib/nvcuda.def"
        x86_64-w64-mingw32-dlltool -d "$WIN_CUDA/lib/nvcuda.def" -D nvcuda.dll -y "$WIN_CUDA/lib/libcuda.a"
    fi
    export PATH="$LINUX_CU13/bin:$PATH" NVCC="$LINUX_CU13/bin/nvcc" CUDA_COMPUTE_CAP=80
    # cudarc adds <root>/lib of each of these to the link search; build.rs takes nvcc from NVCC.
    export CUDA_ROOT="$LINUX_CU13" CUDA_PATH="$WIN_CUDA" CUDNN_ROOT CUDNN_FRONTEND_INCLUDE
    # The POSIX thread model for every C++ part and the link (see the top of this file).
    export CXX_x86_64_pc_windows_gnu=x86_64-w64-mingw32-g++-posix CC_x86_64_pc_windows_gnu=x86_64-w64-mingw32-gcc-posix
    export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc-posix
    MINGW_THREADS=posix
}

# Runs cargo; when the link fails, replaces candle-kernels' libmoe.a (ELF objects from nvcc's Linux host compiler)
# with a MinGW archive of stand-ins for every symbol the link misses: candle's MoE / GGUF kernel launchers, which
# candle keeps in function tables, and the cuBLASLt functions cudarc declares that the CUDA 13.0 DLL does not
# export. Framesmith calls none of them; each stand-in stops the program with its name if it ever were. The build
# script does not run again, so the swap stays; then cargo links again.
cuda_cargo() {
    cargo "$@" && return 0
    local deps="target/$TARGET/$PROFILE/deps" moe work
    moe="$(find "target/$TARGET/$PROFILE/build" -path '*candle-kernels-*/out/libmoe.a' 2>/dev/null)"
    [[ -n "$moe" ]] || return 1
    work="$(mktemp -d)"
    x86_64-w64-mingw32-nm -u --format=just-symbols "$deps"/libcandle_core-*.rlib "$deps"/libcandle_nn-*.rlib \
        2>/dev/null | grep -E '^(launch_mm|moe_gemm)' | sort -u > "$work/symbols"
    awk '!/^;/ && $1 != "LIBRARY" && $1 != "EXPORTS" {print $1}' "$WIN_CUDA/lib/cublasLt.def" | sort -u > "$work/exported"
    x86_64-w64-mingw32-nm -u --format=just-symbols "$deps"/libcudarc-*.rlib 2>/dev/null | grep -E '^cublasLt' |
        sort -u | comm -23 - "$work/exported" >> "$work/symbols"
    {
        echo '#include <stdio.h>'
        echo '#include <stdlib.h>'
        echo 'static void missing(const char *name) {'
        echo '    fprintf(stderr, "framesmith: %s is not part of this Windows build\n", name);'
        echo '    abort();'
        echo '}'
        awk '{printf "void %s(void) { missing(\"%s\"); }\n", $1, $1}' "$work/symbols"
    } > "$work/stand_ins.c"
    echo "linking $(wc -l < "$work/symbols") stand-ins for unused kernels and cuBLASLt 13.1 functions" >&2
    x86_64-w64-mingw32-gcc -O2 -c -o "$work/stand_ins.o" "$work/stand_ins.c"
    local m
    for m in $moe; do
        rm -f "$m"
        x86_64-w64-mingw32-ar rcs "$m" "$work/stand_ins.o"
    done
    rm -rf "$work"
    cargo "$@"
}

cuda_stage() {
    local dest="$1" pair
    for pair in "${CUDA_IMPORTS[@]}"; do
        cp "$WIN_CUDA/bin/${pair#*:}" "$dest/"
    done
    cp "$WIN_CUDA/bin/nvrtc-builtins64_130.dll" "$dest/"
    local dll
    for dll in "${CUDNN_DLLS[@]}"; do
        cp "$WIN_CUDA/bin/$dll" "$dest/"
    done
    mkdir -p "$dest/licenses"
    cp "$WIN_CUDA/bin/cuDNN-License.txt" "$dest/licenses/"
    # The exe must not import nvcuda.dll or cuDNN at start-up (only through the delay-load table).
    local direct
    direct="$(x86_64-w64-mingw32-objdump -p "$dest/framesmith.exe" | awk '/DLL Name:/ {print $3}')"
    if grep -qix -e nvcuda.dll -e cudnn64_9.dll <<< "$direct"; then
        echo "framesmith.exe imports nvcuda.dll or cudnn64_9.dll directly: it would not start without them" >&2
        return 1
    fi
}
