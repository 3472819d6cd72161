#!/usr/bin/env bash
# Downloads into .gl/ (ignored; carried to the GPU machine) the Debian 12 packages bench/run-app-e2e.sh unpacks
# there: Xvfb with xkbcomp and the keyboard data, Mesa's software Vulkan (lavapipe) with its LLVM, xdotool, and the
# X libraries winit loads that the GPU machine (Ubuntu 24.04, no desktop) lacks. About 45 MB. With --pack, also
# .gl/xgl.tar.xz: only the files the run needs (no docs, no other GPU drivers), 34 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gl && cd .gl
apt-get download xvfb libxfont2 libpixman-1-0 libunwind8 libfontenc1 libfreetype6 libbrotli1 libgl1 libglx0 \
    libglvnd0 x11-xkb-utils libxkbfile1 xkb-data mesa-vulkan-drivers libllvm15 libz3-4 libvulkan1 libxcb-dri3-0 \
    libxcb-present0 libxcb-randr0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0 libxshmfence1 libwayland-client0 \
    libx11-xcb1 libsensors5 libxkbcommon0 libxkbcommon-x11-0 libxcursor1 libxrandr2 libxi6 libxrender1 libxfixes3 \
    xdotool libxdo3 libxtst6 libxinerama1 libxcb-xkb1
if [[ "${1:-}" == --pack ]]; then
    root="$(mktemp -d)"
    for deb in *.deb; do dpkg -x "$deb" "$root"; done
    rm -rf "$root"/usr/share/{doc,man,locale,lintian,bug}
    rm -f "$root"/usr/lib/x86_64-linux-gnu/libvulkan_{radeon,intel,intel_hasvk}.so "$root"/usr/share/vulkan/icd.d/{radeon,intel}*
    rm -f "$root"/usr/bin/{xkbbell,xkbevd,xkbprint,xkbvleds,xkbwatch,mesa-overlay-control.py}
    tar cf - -C "$root" . | xz -T0 -9 > xgl.tar.xz
    rm -rf "$root"
fi
du -sh .
