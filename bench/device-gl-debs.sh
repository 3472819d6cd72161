#!/usr/bin/env bash
# Downloads into .gl/ (ignored; carried to the GPU machine) the Debian 12 packages bench/run-app-e2e.sh unpacks
# there: Xvfb with xkbcomp and the keyboard data, Mesa's software Vulkan (lavapipe) with its LLVM, xdotool, and the
# X libraries winit loads that the GPU machine (Ubuntu 24.04, no desktop) lacks. About 45 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gl && cd .gl
apt-get download xvfb libxfont2 libpixman-1-0 libunwind8 libfontenc1 libfreetype6 libbrotli1 libgl1 libglx0 \
    libglvnd0 x11-xkb-utils libxkbfile1 xkb-data mesa-vulkan-drivers libllvm15 libz3-4 libvulkan1 libxcb-dri3-0 \
    libxcb-present0 libxcb-randr0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0 libxshmfence1 libwayland-client0 \
    libx11-xcb1 libsensors5 libxkbcommon0 libxkbcommon-x11-0 libxcursor1 libxrandr2 libxi6 libxrender1 libxfixes3 \
    xdotool libxdo3 libxtst6 libxinerama1
du -sh .
