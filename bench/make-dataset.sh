#!/usr/bin/env bash
# A small real dataset for product-path runs, made with ffmpeg (needs libx264): H.264 videos of several sizes,
# lengths and frame rates (landscape, portrait, 720p, one shorter than the longest bucket), PNG and JPEG images,
# a caption beside each, and a musubi-tuner dataset TOML with bucketing over both. About 10 MB; builds nothing.
# Usage: bench/make-dataset.sh OUT_DIR
set -euo pipefail
OUT="${1:?usage: bench/make-dataset.sh OUT_DIR}"
mkdir -p "$OUT/videos" "$OUT/images"
ff() { ffmpeg -nostdin -hide_banner -loglevel error -y "$@"; }
video() { # name source size frames fps caption
    ff -f lavfi -i "$2=size=$3:rate=$5" -frames:v "$4" -c:v libx264 -preset veryfast -crf 26 \
        -pix_fmt yuv420p "$OUT/videos/$1.mp4"
    printf '%s\n' "$6" > "$OUT/videos/$1.txt"
}
video wide_81   testsrc2   832x480  81 16 "a test card with a moving colour bar and a running clock"
video small_49  mandelbrot 640x368  49 16 "a zoom into the Mandelbrot set, colours shifting"
video tall_65   testsrc    480x832  65 16 "a vertical test pattern with a scrolling gradient"
video hd_100    rgbtestsrc 1280x720 100 24 "red, green and blue bars on a 720p frame"
image() { # name source size caption
    ff -f lavfi -i "$2=size=$3" -frames:v 1 "$OUT/images/$1"
    printf '%s\n' "$4" > "$OUT/images/${1%.*}.txt"
}
image grid.png   "testsrc2" 1024x768 "a colourful test grid, still"
image fractal.jpg "mandelbrot" 832x480 "a fractal in deep blue and orange"
image square.png "smptebars" 512x512  "broadcast colour bars, square"
cat > "$OUT/dataset.toml" <<TOML
# bench/make-dataset.sh: videos and images of several sizes, bucketed at 832x480.
[general]
resolution = [832, 480]
caption_extension = ".txt"
batch_size = 1
enable_bucket = true
bucket_no_upscale = false

[[datasets]]
video_directory = "videos"
cache_directory = "cache/videos"
target_frames = [45, 81]
frame_extraction = "head"

[[datasets]]
image_directory = "images"
cache_directory = "cache/images"
TOML
du -sh "$OUT"
