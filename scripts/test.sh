#!/usr/bin/env bash
# Runs the whole test suite: every CPU test (GPU tests skip without a device; on a GPU machine they run),
# then the CPU tests once more under AddressSanitizer + UndefinedBehaviorSanitizer, then a short fuzz
# run of every file parser (scripts/fuzz.sh: clang + libFuzzer in build-fuzz, WAN_FUZZ_SECONDS each,
# default 20, crash regressions replayed first). WAN_SKIP_SANITIZE=1 / WAN_SKIP_FUZZ=1 skip those steps.
# Run scripts/setup.sh first (the README's test command does both).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${WAN_BUILD_DIR:-build}
JOBS=$(nproc)
echo "[test] ctest in $BUILD_DIR"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900

if [ "${WAN_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "[test] AddressSanitizer + UBSan build (build-asan)"
  # -O1 -g1: half the compile time of -O2 -g (CI's 2 cores spent ~25 min here) with the same findings
  # and line-numbered reports.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWAN_SANITIZE=ON -DWAN_ENABLE_CUDA=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    >build-asan.configure.log 2>&1 || { cat build-asan.configure.log; exit 1; }
  cmake --build build-asan -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" --timeout 1800 -LE gpu
fi

if [ "${WAN_SKIP_FUZZ:-0}" != "1" ]; then
  echo "[test] fuzz smoke run (build-fuzz)"
  ./scripts/fuzz.sh -t "${WAN_FUZZ_SECONDS:-20}" -p "$JOBS" -j "$JOBS"
fi
