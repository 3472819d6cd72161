# Sourced by the bench/run-*.sh scripts on the GPU test machine.
# nvidia_libs: the lib/ folders of the NVIDIA wheels in this Python (PyTorch's CUDA runtime, cuBLAS, cuDNN …),
# colon-separated; empty where there are none.
nvidia_libs() {
    python3 -c 'import nvidia,os;p=nvidia.__path__[0];print(":".join(os.path.join(p,d,"lib") for d in os.listdir(p) if os.path.isdir(os.path.join(p,d,"lib"))))' 2>/dev/null
}
# stamp: prefixes each line with the seconds since $START (set START=$(date +%s%N) first).
stamp() { while IFS= read -r line; do printf '%8.1f %s\n' "$(($(date +%s%N) - START))e-9" "$line"; done; }
# use_nvidia_libs: puts those folders before LD_LIBRARY_PATH and exports it.
use_nvidia_libs() {
    LD_LIBRARY_PATH="$(nvidia_libs):${LD_LIBRARY_PATH:-}"
    export LD_LIBRARY_PATH
}
# note TEXT...: a stamped "== TEXT ==" line, also appended to $LOG.
note() { echo "== $* ==" | stamp | tee -a "$LOG"; }
# timed DIR NAME COMMAND...: runs COMMAND under /usr/bin/time -v into DIR/NAME.log (stamped), then appends to $LOG
# the log's last $TIMED_LINES lines (default 14) that match $TIMED_PATTERN and the exit code; returns that code.
timed() {
    local dir="$1" name="$2"; shift 2
    mkdir -p "$dir"
    note "$name: $*"
    /usr/bin/time -v "$@" 2>&1 | stamp > "$dir/$name.log"
    local rc=${PIPESTATUS[0]}
    grep -E "$TIMED_PATTERN" "$dir/$name.log" | tail -"${TIMED_LINES:-14}" | sed "s/^/   $name: /" | tee -a "$LOG"
    echo "   $name: exit $rc" | tee -a "$LOG"
    return "$rc"
}
