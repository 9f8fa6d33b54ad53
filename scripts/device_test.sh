#!/usr/bin/env bash
# Builds wan with CUDA on a GPU machine that has no package registry (the lent device) and runs the
# GPU tests (CTest label gpu), then optionally the CPU ones. Needs, carried in .carry/ (ignored by git):
#   .carry/prefix/{include/nlohmann, share/cmake/nlohmann_json}   (Debian nlohmann-json3-dev)
#   .carry/googletest-src                                          (Debian googletest source)
# Usage: scripts/device_test.sh [ctest -L label regex, default gpu] [targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
LABEL=${1:-gpu}
shift || true
OUTDIR=${OUT:-/tmp/wan-out}
mkdir -p "$OUTDIR"
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUTDIR/gpu.txt"
if [ ! -f /tmp/gtest-install/lib/cmake/GTest/GTestConfig.cmake ] && [ ! -f /tmp/gtest-install/lib64/cmake/GTest/GTestConfig.cmake ]; then
  cmake -S .carry/googletest-src -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null
  cmake --build /tmp/gtest-build -j 16 >/dev/null && cmake --install /tmp/gtest-build >/dev/null
fi
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix;/tmp/gtest-install" >"$OUTDIR/configure.log" 2>&1 ||
  { cat "$OUTDIR/configure.log"; exit 1; }
if [ $# -gt 0 ]; then
  cmake --build build-dev -j 16 --target "$@" 2>&1 | tail -5
else
  cmake --build build-dev -j 16 2>&1 | tail -5
fi
ctest --test-dir build-dev --output-on-failure -L "$LABEL" 2>&1 | tee "$OUTDIR/ctest-$LABEL.log"
