#!/usr/bin/env bash
# The main job on a machine without a GPU or real weights: write a tiny random-weight Wan2.2 T2V-A14B
# checkpoint (official layout), inspect it, and run one CPU forward pass of each DiT expert.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${WAN_BUILD_DIR:-build}
OUT=${WAN_DEMO_DIR:-out/tiny-t2v}
WAN=$BUILD_DIR/wan
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
"$WAN" make-checkpoint --config tiny --layout official --seed 1 --out "$OUT"
"$WAN" inspect "$OUT"
"$WAN" forward --model "$OUT" --expert high --size 128x96 --frames 9 --seed 7
"$WAN" forward --model "$OUT" --expert low --size 128x96 --frames 9 --seed 7
