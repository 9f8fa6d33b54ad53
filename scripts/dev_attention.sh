#!/usr/bin/env bash
# Fast iteration on the attention kernel on the device: builds only the own-attention GPU test and what it
# links (src/kernels/attention_*.cu/cpp, cuDNN graph, RNG, core, CPU ops) with nvcc, without CMake and without
# the rest of wan_kernels, so a device call takes about 60-70 s. Needs .carry/googletest-src (see
# scripts/device_test.sh). Usage (device): scripts/dev_attention.sh; GTEST_ARGS=--gtest_filter=... to select;
# EXTRA_SRC="src/..." to add sources. Output also in $OUT/attn.log.
set -euo pipefail
export PATH=/usr/local/cuda/bin:$PATH
OUTDIR=${OUT:-/tmp/o}; mkdir -p $OUTDIR
if [ ! -f /tmp/gtest-install/lib/libgtest.a ] && [ ! -f /tmp/gtest-install/lib64/libgtest.a ]; then
  cmake -S .carry/googletest-src -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null
  cmake --build /tmp/gtest-build -j 16 >/dev/null && cmake --install /tmp/gtest-build >/dev/null
fi
GL=$(ls -d /tmp/gtest-install/lib* | head -1)
mkdir -p /tmp/da && cd /tmp/da
SRC=$OLDPWD
FL="-std=c++20 -O3 -DNDEBUG -DWAN_HAVE_CUDNN=1 -I$SRC/src -I$SRC/tests/gpu -I/tmp/gtest-install/include -gencode=arch=compute_90a,code=sm_90a"
pids=()
for f in src/kernels/attention_own.cu src/kernels/attention_cudnn.cpp src/kernels/cudnn_graph.cpp src/kernels/check.cpp src/kernels/rng.cu \
         src/core/dtype.cpp src/core/log.cpp src/core/philox.cpp src/core/tensor.cpp src/core/thread_pool.cpp src/core/mmap.cpp \
         src/ops/cpu_ops.cpp tests/gpu/test_attention_own.cu tests/test_main.cpp ${EXTRA_SRC:-}; do
  o=$(echo $f | tr / _).o
  if [[ $f == *.cu ]]; then nvcc $FL -Xptxas -v -c $SRC/$f -o $o > $o.log 2>&1 & else nvcc -x cu $FL -c $SRC/$f -o $o > $o.log 2>&1 & fi
  pids+=($!)
done
fail=0; for p in ${pids[@]}; do wait $p || fail=1; done
grep -h -E "error|registers|spill|C7" *.log | grep -v "^$" | head -30
[ $fail = 0 ] || { cat *.log | grep -B2 -A5 error | head -60; exit 1; }
nvcc -gencode=arch=compute_90a,code=sm_90a *.o -o test_attn -L$GL -lgtest -lcudnn -lcublasLt -lcublas -lpthread
cd $SRC
/tmp/da/test_attn ${GTEST_ARGS:-} 2>&1 | tee $OUTDIR/attn.log | tail -60
