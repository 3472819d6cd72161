#!/usr/bin/env sh
# Installs Framesmith from this unpacked archive for the current user (no root): the program folder goes to
# ~/.local/share/framesmith, a `framesmith` link to ~/.local/bin, the menu entry and icon to ~/.local/share.
# `./install.sh --uninstall` removes exactly those; your runs and outputs (wherever you saved them) stay.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
data="${XDG_DATA_HOME:-$HOME/.local/share}"
app="$data/framesmith"
bin="$HOME/.local/bin"
if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$bin/framesmith" "$data/applications/framesmith.desktop" "$data/icons/hicolor/256x256/apps/framesmith.png"
    rm -rf "$app"
    echo "Framesmith removed"
    exit 0
fi
mkdir -p "$app" "$bin" "$data/applications" "$data/icons/hicolor/256x256/apps"
cp -R "$here/framesmith" "$here/presets" "$here/assets" "$here/README.md" "$app/"
# The GPU archive's CUDA and cuDNN libraries (found through the binary's $ORIGIN/lib) and their licences.
for extra in lib licenses; do
    if [ -d "$here/$extra" ]; then cp -R "$here/$extra" "$app/"; fi
done
ln -sf "$app/framesmith" "$bin/framesmith"
cp "$here/assets/framesmith.png" "$data/icons/hicolor/256x256/apps/framesmith.png"
sed "s|^Exec=framesmith|Exec=\"$app/framesmith\"|" "$here/framesmith.desktop" > "$data/applications/framesmith.desktop"
echo "Framesmith installed in $app; run \`framesmith\` or find it in the applications menu"
