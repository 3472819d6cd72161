# Sourced by the bench/run-*.sh scripts on the GPU test machine.
# nvidia_libs: the lib/ folders of the NVIDIA wheels in this Python (PyTorch's CUDA runtime, cuBLAS, cuDNN …),
# colon-separated; empty where there are none.
nvidia_libs() {
    python3 -c 'import nvidia,os;p=nvidia.__path__[0];print(":".join(os.path.join(p,d,"lib") for d in os.listdir(p) if os.path.isdir(os.path.join(p,d,"lib"))))' 2>/dev/null
}
# stamp: prefixes each line with the seconds since $START (set START=$(date +%s%N) first).
stamp() { while IFS= read -r line; do printf '%8.1f %s\n' "$(($(date +%s%N) - START))e-9" "$line"; done; }
