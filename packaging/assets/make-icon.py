#!/usr/bin/env python3
"""Draws the Framesmith icon (a film strip on a dark rounded square): framesmith.png and framesmith.ico.

Run from this folder with Pillow installed; the outputs are committed, so packaging does not need Pillow.
"""
from PIL import Image, ImageDraw

BG = (28, 32, 48, 255)
STRIP = (236, 140, 52, 255)
FRAME = (250, 214, 170, 255)
FRAME_LIT = (255, 247, 235, 255)


def draw(size):
    s = 4 * size  # drawn large, then downsampled for smooth edges
    im = Image.new("RGBA", (s, s), (0, 0, 0, 0))
    d = ImageDraw.Draw(im)
    d.rounded_rectangle([0, 0, s - 1, s - 1], radius=s // 6, fill=BG)
    top, bot = int(s * 0.22), int(s * 0.78)
    d.rectangle([0, top, s - 1, bot], fill=STRIP)
    hole_w, hole_h = s // 12, s // 16
    for i in range(6):
        x = int(s * (0.08 + i * 0.155))
        for y in (top + s // 28, bot - s // 28 - hole_h):
            d.rectangle([x, y, x + hole_w, y + hole_h], fill=BG)
    fw = int(s * 0.24)
    fy0 = top + s // 28 + hole_h + s // 40
    fy1 = bot - s // 28 - hole_h - s // 40
    for i, col in enumerate([FRAME, FRAME_LIT, FRAME]):
        x = int(s * 0.1) + i * int(s * 0.28)
        d.rectangle([x, fy0, x + fw, fy1], fill=col)
    return im.resize((size, size), Image.LANCZOS)


if __name__ == "__main__":
    icon = draw(256)
    icon.save("framesmith.png")
    # BMP entries: NSIS and older Windows shells read those everywhere.
    icon.save("framesmith.ico", sizes=[(16, 16), (32, 32), (48, 48), (256, 256)], bitmap_format="bmp")
