#!/usr/bin/env bash
# Device loop of the multi-GPU work (issue 5): builds the GPU tests named in WAN_DIST_TESTS (default: the
# parallel DiT test) and `wan` (sm_90a only) in build-dist, runs each test binary (a 300 s limit each), then
# optionally bench/run_dist_bench.sh with that `wan`.
# Needs .carry (nlohmann json prefix, googletest source).
# Usage: [WAN_DIST_TESTS="gpu_test_dist_dit gpu_test_..."] scripts/dev_dist.sh [test|bench MODE|all MODE]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
OUTDIR=${OUT:-/tmp/wan-out}
mkdir -p "$OUTDIR"
WHAT=${1:-test}
nvidia-smi -L
if [ ! -f /tmp/gtest-install/lib/cmake/GTest/GTestConfig.cmake ] && [ ! -f /tmp/gtest-install/lib64/cmake/GTest/GTestConfig.cmake ]; then
  cmake -S .carry/googletest-src -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null
  cmake --build /tmp/gtest-build -j 32 >/dev/null && cmake --install /tmp/gtest-build >/dev/null
fi
# The system NCCL of the device image may be older than the launcher needs (ncclCommRevoke: 2.28); the
# PyTorch wheel's NCCL (nvidia-nccl-cu13) is preferred when present.
NCCL_ARGS=()
P=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
if [ -n "$P" ] && [ -f "$P/include/nccl.h" ]; then
  grep -m2 -E "define NCCL_(MAJOR|MINOR)" "$P/include/nccl.h"
  NCCL_ARGS=(-DNCCL_INCLUDE_DIR="$P/include" -DNCCL_LIBRARY="$(ls "$P"/lib/libnccl.so* | head -1)")
fi
cmake -S . -B build-dist -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DWAN_ENABLE_FFMPEG=OFF \
  -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix;/tmp/gtest-install" "${NCCL_ARGS[@]}" >"$OUTDIR/configure.log" 2>&1 ||
  { tail -30 "$OUTDIR/configure.log"; exit 1; }
grep "wan: NCCL" "$OUTDIR/configure.log"
TESTS=${WAN_DIST_TESTS:-gpu_test_dist_dit}
# shellcheck disable=SC2086
cmake --build build-dist -j "$(nproc)" --target $TESTS wan >"$OUTDIR/build.log" 2>&1 || { grep -E "error|FAILED" "$OUTDIR/build.log" | head -40; exit 1; }
echo "built"
if [ "$WHAT" = test ] || [ "$WHAT" = all ]; then
  for t in $TESTS; do
    echo "== $t"
    timeout 300 "./build-dist/tests/$t" 2>&1 | tee "$OUTDIR/$t.log" | grep -vE "^\[ *(RUN|OK) "
  done
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  WAN_BIN=build-dist/wan bench/run_dist_bench.sh "${2:-quick}"
fi
