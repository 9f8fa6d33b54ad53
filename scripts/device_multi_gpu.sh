#!/usr/bin/env bash
# One device command on a multi-GPU kind (nvidia-h200-x4 on 2026-11-21): builds wan and the multi-GPU tests
# (NCCL from the PyTorch wheel when present), runs the parallel DiT test, the 720p layout table
# (bench/run_dist_bench.sh 720p, 2 timed steps per depth) and the multi-GPU generate tests within
# X4_BUDGET seconds (default 470). Carry [".carry"]. Usage: X4_BUDGET=420 scripts/device_multi_gpu.sh
set -uo pipefail
T0=$(date +%s); END=$((T0 + ${X4_BUDGET:-470}))
left() { echo $((END - $(date +%s))); }
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
bash -c '
G=/tmp/gtest-install
[ -f $G/lib/cmake/GTest/GTestConfig.cmake ] || { cmake -S .carry/googletest-src -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$G -DBUILD_GMOCK=OFF >/dev/null && cmake --build /tmp/gtest-build -j 64 >/dev/null && cmake --install /tmp/gtest-build >/dev/null; }'
P=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null); NA=()
[ -n "$P" ] && [ -f "$P/include/nccl.h" ] && NA=(-DNCCL_INCLUDE_DIR="$P/include" -DNCCL_LIBRARY="$(ls "$P"/lib/libnccl.so* | head -1)")
cmake -S . -B build-dist -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DWAN_ENABLE_FFMPEG=OFF \
  -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix;/tmp/gtest-install" "${NA[@]}" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
grep "wan: NCCL" "$OUT/configure.log"
cmake --build build-dist -j 64 --target wan gpu_test_dist_dit gpu_test_generate_dist gpu_test_pipeline_gpu >"$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "[$(( $(date +%s) - T0 )) s] built"
timeout 130 build-dist/tests/gpu_test_dist_dit 2>&1 | tee "$OUT/dist_dit.log" | grep -E "^(  |\[  (PASSED|FAILED|  SKIPPED)|.*Failure|rel L2)" | head -40
echo "[$(( $(date +%s) - T0 )) s] dist_dit done"
B=$(( $(left) - 150 )); [ $B -gt 60 ] && WAN_BIN=build-dist/wan WAN_BENCH_BUDGET_S=$B WAN_DIST_STEPS=2 WAN_DIST_NEED_S=25 bench/run_dist_bench.sh 720p 2>&1 | tail -14
echo "[$(( $(date +%s) - T0 )) s] bench done"
timeout $(( $(left) - 30 )) build-dist/tests/gpu_test_generate_dist 2>&1 | tee "$OUT/generate_dist.log" | grep -vE "^\[ *(RUN|OK) " | tail -40
timeout 25 build-dist/tests/gpu_test_pipeline_gpu 2>&1 | grep -E "PASSED|FAILED|Failure" | head
echo "[$(( $(date +%s) - T0 )) s] end"
