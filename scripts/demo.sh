#!/usr/bin/env bash
# The main job on a machine without a GPU or real weights: write a tiny random-weight Wan2.2 T2V-A14B
# checkpoint (official layout: both experts, UMT5, Wan2.1 VAE, tokenizer), inspect it, and generate a
# short MP4 with the real T2V pipeline on the CPU. (Random weights: the video is noise-like by design.)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${WAN_BUILD_DIR:-build}
OUT=${WAN_DEMO_DIR:-out}
WAN=$BUILD_DIR/wan
mkdir -p "$OUT"
rm -rf "$OUT/tiny-t2v"
"$WAN" make-checkpoint --config tiny --layout official --seed 1 --output "$OUT/tiny-t2v"
"$WAN" inspect "$OUT/tiny-t2v"
"$WAN" generate --model "$OUT/tiny-t2v" --prompt "a corgi running on a beach at sunset" \
  --size 192x128 --frames 17 --steps 8 --seed 42 --device cpu --output "$OUT/tiny-t2v.mp4"
echo "video: $OUT/tiny-t2v.mp4"
