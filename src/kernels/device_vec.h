// Device-side helpers shared by the DiT's memory-bound kernels (dit_*.cu): 16-byte vector loads and
// stores of 8 bf16 / 8 fp32 values, warp and block sums, and the launch-shape rule of the row kernels.
// Included only from .cu files (it defines __device__ functions).
// Invariants: bf16 -> fp32 is exact (a shift); fp32 -> bf16 rounds to nearest even with the hardware
// conversion, which equals wan::f32_to_bf16 for every non-NaN value. Block sums reduce in a fixed order,
// so every kernel built on them is deterministic.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/dit_kernels.h"

namespace wan::cuda::dit_detail {

// One "chunk" is 8 consecutive elements: 16 bytes of bf16, two 16-byte vectors of fp32.
constexpr int kChunk = 8;
// Row kernels keep a whole row in registers (one read of the input); at most this many chunks per
// thread keeps the values in 64 registers, and 512 threads caps the register budget at 128 per thread.
constexpr int kMaxChunksPerThread = 8;
constexpr int kMaxRowThreads = 512;

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
// Stores go through __stwb so they stay 16-byte vectors (plain assignments were split into 4-byte
// stores by the compiler in some unrolled iterations).
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  __stwb(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
  __stwb(reinterpret_cast<float4*>(p) + 1, make_float4(v[4], v[5], v[6], v[7]));
}
__device__ __forceinline__ void unpack8(const uint4 u, float (&v)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  unpack8(*reinterpret_cast<const uint4*>(p), v);
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 u;
  u.x = pack_bf16x2(v[0], v[1]);
  u.y = pack_bf16x2(v[2], v[3]);
  u.z = pack_bf16x2(v[4], v[5]);
  u.w = pack_bf16x2(v[6], v[7]);
  __stwb(reinterpret_cast<uint4*>(p), u);
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp{}); }
// Sum over the block, returned to every thread (block_reduce.cuh: blockDim.x a multiple of 32, smem 32
// floats, reusable after the call).
__device__ __forceinline__ float block_sum(float v, float* smem) { return block_reduce(v, smem, 0.0f, SumOp{}); }

// v[i] = base[col + i] + e_row[col + i] (fp32 add, like `modulation + e0`); a null side is 0.
__device__ __forceinline__ void mod8(const float* base, const float* e_row, int64_t col, float (&v)[8]) {
  if (base && e_row) {
    float a[8], b[8];
    load8(base + col, a);
    load8(e_row + col, b);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(a[i], b[i]);
  } else if (base) {
    load8(base + col, v);
  } else if (e_row) {
    load8(e_row + col, v);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
}

// The residual adds' arithmetic (spec §2.7 steps 3, 4, 6), shared by the add kernels and the add fused
// into a LayerNorm so both store the same bits: x + y·g with the product and the sum each rounded to
// fp32 (no FMA contraction, the reference's order), and x + y.
__device__ __forceinline__ void gated_add8(float (&x)[8], const float (&y)[8], const float (&g)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = __fadd_rn(x[i], __fmul_rn(y[i], g[i]));
}
__device__ __forceinline__ void add8(float (&x)[8], const float (&y)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = __fadd_rn(x[i], y[i]);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Threads for a kernel that spreads `chunks` chunks of one row over a block: the smallest multiple of
// 32 that divides the row evenly with at most kMaxChunksPerThread each (no idle lanes: D = 5120 ->
// 128 threads x 5 chunks, 3072 -> 64 x 6, 256 -> 32 x 1), else the smallest that fits. Throws when the
// row is too wide.
inline int row_threads(int64_t chunks, const char* what) {
  for (int t = 32; t <= kMaxRowThreads; t += 32)
    if (chunks % t == 0 && chunks / t <= kMaxChunksPerThread) return t;
  for (int t = 32; t <= kMaxRowThreads; t += 32)
    if ((chunks + t - 1) / t <= kMaxChunksPerThread) return t;
  WAN_THROW(what, ": row of ", chunks * kChunk, " elements exceeds the supported width ",
            kMaxRowThreads * kMaxChunksPerThread * kChunk);
}

// Launch shape of a row kernel templated on its chunks per thread (registers sized to the row, so
// more blocks fit per SM than with kMaxChunksPerThread slots): an exact split preferring 4 chunks per
// thread (D = 5120 -> 160 x 4, 3072 -> 96 x 4, 256 -> 32 x 1), else the fewest chunks that fit.
struct RowLayout {
  int threads;
  int per_thread;  // 1, 2, 4 or 8
};
inline RowLayout row_layout(int64_t chunks, const char* what) {
  for (int k : {4, 8, 2, 1})
    if (chunks % k == 0 && (chunks / k) % 32 == 0 && chunks / k <= kMaxRowThreads)
      return {static_cast<int>(chunks / k), k};
  for (int k : {1, 2, 4, 8}) {
    const int64_t t = ((chunks + k - 1) / k + 31) / 32 * 32;
    if (t <= kMaxRowThreads) return {static_cast<int>(t), k};
  }
  WAN_THROW(what, ": row of ", chunks * kChunk, " elements exceeds the supported width ",
            kMaxRowThreads * kMaxChunksPerThread * kChunk);
}

inline unsigned blocks_for(int64_t work, int threads) {
  const int64_t b = (work + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace wan::cuda::dit_detail
