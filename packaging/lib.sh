# Shared helpers of the packaging scripts (sourced, not run). Paths are relative to the repository root, which
# every script cd's into first. Outputs go to dist/ (ignored by git).

# The version from Cargo.toml: the [workspace.package] table's (which [package] inherits), or [package]'s own.
fs_version() {
    awk -F'"' '/^\[(workspace\.)?package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{print $2; exit}' Cargo.toml
}

# Installs missing Debian packages (as .ci/run does for ffmpeg): "need_packages cmd:pkg ...", one pair per tool.
need_packages() {
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) -ne 0 ]]; then
        echo "missing: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
        return 1
    fi
    echo "installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Copies what every package ships beside the binary: the presets (commented TOML, also built into the binary),
# the icon, and the README.
stage_common() {
    local dest="$1"
    mkdir -p "$dest/presets" "$dest/assets"
    cp presets/*.toml "$dest/presets/"
    cp packaging/assets/framesmith.png packaging/assets/framesmith.ico "$dest/assets/"
    cp README.md "$dest/README.md"
}

# Human-readable size of a file.
fs_size() {
    du -h "$1" | cut -f1
}
