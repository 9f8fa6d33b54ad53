// The quantisation passes of the FP8 attention (attention_fp8.h): bf16 Q/K/V views -> e4m3 copies and
// scales in the workspace. Three launches, each deterministic (fixed summation orders, integer maxima):
//   1. per (chunk of 512 keys, sample·head): K's per-channel partial sums and V's per-channel amax
//      (magnitude bits, atomicMax: order-free) over the valid keys;
//   2. per sample·head: K's mean = the chunk sums in chunk order / valid keys;
//   3. per (tile of 128 rows, sample·head, Q|K|V): Q and smoothed K blocks (one scale per block, the rule
//      of core/fp8_rows.h), V per channel, transposed with the P·V key permutation of each 16 keys.
// Fp8KV::Reuse launches pass 3 for Q alone (the K/V side of the workspace is a previous call's).
#include <cuda_bf16.h>

#include <algorithm>

#include "core/error.h"
#include "core/fp8_rows.h"
#include "core/rn_math.h"
#include "kernels/attention_fp8.h"
#include "kernels/check.h"
#include "kernels/fp8_cvt.cuh"

namespace wan::cuda {
namespace {

constexpr int kD = 128;
constexpr int kTile = 128;       // rows per Q block, keys per K block and per V tile
constexpr int kChunkKeys = 512;  // keys per partial sum of pass 1
constexpr int kThreads = 256;    // 16 threads per row (8 channels each), 16 rows at a time

struct QuantParams {
  int B, H, Lq, Lk;
  const int32_t* k_lens;  // nullable
  const __nv_bfloat16 *q, *k, *v;
  int64_t q_ld, k_ld, v_ld;  // token strides (elements)
  uint8_t *q8, *k8, *vt8;
  float *q_scale, *k_scale, *k_partial, *k_mean, *q_mean_dot;  // q_mean_dot nullable
  uint32_t* v_amax;
  int q_tiles, k_blocks, chunks, Lk16;
};

__device__ __forceinline__ int valid_keys(const QuantParams& p, int b) {
  const int n = p.k_lens ? p.k_lens[b] : p.Lk;
  return n < 1 ? 1 : (n > p.Lk ? p.Lk : n);
}
__device__ __forceinline__ void load8(const __nv_bfloat16* src, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(src);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

// Pass 1: grid (chunks, B·H).
__global__ void __launch_bounds__(kThreads) kv_stats_kernel(const QuantParams p) {
  __shared__ float sums[16][kD];
  __shared__ uint32_t maxes[16][kD];
  const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int c8 = threadIdx.x % 16, rsub = threadIdx.x / 16;
  const int n = valid_keys(p, b);
  float s[8] = {};
  uint32_t m[8] = {};
  const int j0 = blockIdx.x * kChunkKeys;
  for (int j = j0 + rsub; j < min(j0 + kChunkKeys, n); j += 16) {
    float k[8], v[8];
    load8(p.k + (static_cast<int64_t>(b) * p.Lk + j) * p.k_ld + h * kD + 8 * c8, k);
    load8(p.v + (static_cast<int64_t>(b) * p.Lk + j) * p.v_ld + h * kD + 8 * c8, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      s[e] = rn::add(s[e], k[e]);
      m[e] = max(m[e], fp8::abs_bits(v[e]));
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) sums[rsub][8 * c8 + e] = s[e], maxes[rsub][8 * c8 + e] = m[e];
  __syncthreads();
  if (threadIdx.x < kD) {
    float t = 0.f;
    uint32_t mx = 0;
    for (int r = 0; r < 16; ++r) t = rn::add(t, sums[r][threadIdx.x]), mx = max(mx, maxes[r][threadIdx.x]);
    p.k_partial[(static_cast<int64_t>(bh) * p.chunks + blockIdx.x) * kD + threadIdx.x] = t;
    if (mx) atomicMax(p.v_amax + static_cast<int64_t>(bh) * kD + threadIdx.x, mx);
  }
}

// Pass 2: grid B·H, 128 threads.
__global__ void k_mean_kernel(const QuantParams p) {
  const int bh = blockIdx.x, b = bh / p.H;
  const int n = valid_keys(p, b);
  const int used = (n + kChunkKeys - 1) / kChunkKeys;
  float t = 0.f;
  for (int c = 0; c < used; ++c) t = rn::add(t, p.k_partial[(static_cast<int64_t>(bh) * p.chunks + c) * kD + threadIdx.x]);
  p.k_mean[static_cast<int64_t>(bh) * kD + threadIdx.x] = rn::div(t, static_cast<float>(n));
}

// Pass 3, Q (z = 0) or K (z = 1): one block of 128 rows; rows outside [0, valid) are excluded and zero.
__device__ void quant_block(const QuantParams& p, bool is_k, int tile, int bh) {
  __shared__ uint32_t warp_amax[32];
  const int b = bh / p.H, h = bh % p.H;
  const int c8 = threadIdx.x % 16, rsub = threadIdx.x / 16;
  const int L = is_k ? p.Lk : p.Lq, valid = is_k ? valid_keys(p, b) : p.Lq;
  const __nv_bfloat16* src = is_k ? p.k : p.q;
  const int64_t ld = is_k ? p.k_ld : p.q_ld;
  float mean[8] = {};
  if (is_k || p.q_mean_dot) {
#pragma unroll
    for (int e = 0; e < 8; ++e) mean[e] = p.k_mean[static_cast<int64_t>(bh) * kD + 8 * c8 + e];
  }
  float x[8][8];
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = tile * kTile + rsub + 16 * i;
#pragma unroll
    for (int e = 0; e < 8; ++e) x[i][e] = 0.f;
    if (row < valid) load8(src + (static_cast<int64_t>(b) * L + row) * ld + h * kD + 8 * c8, x[i]);
    if (!is_k && p.q_mean_dot) {  // every lane shuffles (the two rows of a warp may differ in validity)
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) d = fmaf(x[i][e], mean[e], d);
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) d += __shfl_xor_sync(0xFFFFFFFFu, d, o);
      if (c8 == 0 && row < valid) p.q_mean_dot[static_cast<int64_t>(bh) * p.Lq + row] = d;
    }
    if (row < valid) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (is_k) x[i][e] = rn::sub(x[i][e], mean[e]);
        amax = max(amax, fp8::abs_bits(x[i][e]));
      }
    }
  }
  const fp8::RowScale rs = fp8::row_scale(block_reduce(amax, warp_amax, 0u, MaxU32Op{}));
  uint8_t* dst = is_k ? p.k8 : p.q8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = tile * kTile + rsub + 16 * i;
    if (row >= L) continue;
    const uint2 out = row < valid ? quantize8(x[i], rs) : make_uint2(0u, 0u);
    *reinterpret_cast<uint2*>(dst + (static_cast<int64_t>(bh) * L + row) * kD + 8 * c8) = out;
  }
  if (threadIdx.x == 0) (is_k ? p.k_scale : p.q_scale)[static_cast<int64_t>(bh) * (is_k ? p.k_blocks : p.q_tiles) + tile] = rs.scale;
}

// Position of key j (0..15) of a 16-key group in the transposed V: the inverse of the P·V fragment order
// (attention_fp8.cu: position 4t + i of a 16-column half holds score column 8·(i/2) + 2t + (i mod 2)).
__device__ __forceinline__ int v_position(int j) { return 4 * ((j >> 1) & 3) + 2 * (j >> 3) + (j & 1); }

// Pass 3, V (z = 2): keys [128·tile, +128) -> vt8 [bh][channel][Lk16] (keys permuted within each 16).
__device__ void quant_v_tile(const QuantParams& p, int tile, int bh) {
  __shared__ __align__(16) uint8_t t8[kD][kTile];
  const int b = bh / p.H, h = bh % p.H;
  const int c8 = threadIdx.x % 16, rsub = threadIdx.x / 16;
  const int n = valid_keys(p, b);
  fp8::RowScale rs[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) rs[e] = fp8::row_scale(p.v_amax[static_cast<int64_t>(bh) * kD + 8 * c8 + e]);
#pragma unroll 2
  for (int i = 0; i < 8; ++i) {
    const int jl = rsub + 16 * i, j = tile * kTile + jl;
    float x[8] = {};
    if (j < n) load8(p.v + (static_cast<int64_t>(b) * p.Lk + j) * p.v_ld + h * kD + 8 * c8, x);
    const int pos = (jl & ~15) | v_position(jl & 15);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      uint8_t q = 0;
      if (j < n) q = rs[e].kind == fp8::RowKind::Finite ? static_cast<uint8_t>(cvt_e4m3x2(rn::mul(x[e], rs[e].inv), 0.f) & 0xFFu)
                                                        : fp8::fill_byte(rs[e]);
      t8[8 * c8 + e][pos] = q;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kD * (kTile / 16); idx += kThreads) {
    const int ch = idx / (kTile / 16), part = idx % (kTile / 16);
    const int key = tile * kTile + 16 * part;
    if (key >= p.Lk16) continue;
    *reinterpret_cast<uint4*>(p.vt8 + (static_cast<int64_t>(bh) * kD + ch) * p.Lk16 + key) =
        *reinterpret_cast<const uint4*>(&t8[ch][16 * part]);
  }
}

// Pass 3: grid (max(q_tiles, k_blocks), B·H, 3).
__global__ void __launch_bounds__(kThreads) quant_tiles_kernel(const QuantParams p) {
  const int tile = blockIdx.x, bh = blockIdx.y, what = blockIdx.z;
  if (what == 0 && tile < p.q_tiles) quant_block(p, false, tile, bh);
  else if (what == 1 && tile < p.k_blocks) quant_block(p, true, tile, bh);
  else if (what == 2 && tile < p.k_blocks) quant_v_tile(p, tile, bh);
}

}  // namespace

void fp8_attention_quantize(const AttentionShape& s, const AttentionArgs& a, const Fp8AttentionLayout& l,
                            uint8_t* ws, cudaStream_t stream, Fp8KV kv) {
  QuantParams p{};
  p.B = static_cast<int>(s.B), p.H = static_cast<int>(s.H), p.Lq = static_cast<int>(s.Lq), p.Lk = static_cast<int>(s.Lk);
  p.k_lens = s.masked ? a.k_lens : nullptr;
  p.q = static_cast<const __nv_bfloat16*>(a.q), p.k = static_cast<const __nv_bfloat16*>(a.k);
  p.v = static_cast<const __nv_bfloat16*>(a.v);
  p.q_ld = s.q_ld ? s.q_ld : s.H * kD, p.k_ld = s.k_ld ? s.k_ld : s.H * kD, p.v_ld = s.v_ld ? s.v_ld : s.H * kD;
  p.q8 = ws + l.q, p.k8 = ws + l.k, p.vt8 = ws + l.vt;
  p.q_scale = reinterpret_cast<float*>(ws + l.q_scale), p.k_scale = reinterpret_cast<float*>(ws + l.k_scale);
  p.k_partial = reinterpret_cast<float*>(ws + l.k_partial), p.k_mean = reinterpret_cast<float*>(ws + l.k_mean);
  p.q_mean_dot = s.lse ? reinterpret_cast<float*>(ws + l.q_mean_dot) : nullptr;
  p.v_amax = reinterpret_cast<uint32_t*>(ws + l.v_amax);
  p.q_tiles = static_cast<int>(l.q_tiles), p.k_blocks = static_cast<int>(l.k_blocks);
  p.chunks = static_cast<int>(l.chunks), p.Lk16 = static_cast<int>(l.Lk16);
  const unsigned bh = static_cast<unsigned>(l.BH);
  if (kv == Fp8KV::Reuse) {  // grid z = 1: the Q blocks alone (quant_tiles_kernel's z = 0)
    quant_tiles_kernel<<<dim3(static_cast<unsigned>(l.q_tiles), bh, 1), kThreads, 0, stream>>>(p);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  CUDA_CHECK(cudaMemsetAsync(p.v_amax, 0, static_cast<size_t>(l.BH) * kD * sizeof(uint32_t), stream));
  kv_stats_kernel<<<dim3(static_cast<unsigned>(l.chunks), bh), kThreads, 0, stream>>>(p);
  k_mean_kernel<<<bh, kD, 0, stream>>>(p);
  const unsigned tiles = static_cast<unsigned>(std::max(l.q_tiles, l.k_blocks));
  quant_tiles_kernel<<<dim3(tiles, bh, 3), kThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

Fp8AttentionLayout fp8_attention_layout(const AttentionShape& s) {
  Fp8AttentionLayout l;
  l.BH = s.B * s.H, l.Lq = s.Lq, l.Lk = s.Lk, l.Lk16 = (s.Lk + 15) / 16 * 16;
  l.q_tiles = (s.Lq + kTile - 1) / kTile, l.k_blocks = (s.Lk + kTile - 1) / kTile;
  l.chunks = (s.Lk + kChunkKeys - 1) / kChunkKeys;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += (bytes + 255) / 256 * 256;
    return at;
  };
  const auto BH = static_cast<size_t>(l.BH);
  // K/V side first (offsets independent of Lq: Fp8KV::Reuse), then the Q side.
  l.k = take(BH * static_cast<size_t>(s.Lk) * kD);
  l.vt = take(BH * kD * static_cast<size_t>(l.Lk16));
  l.k_scale = take(BH * static_cast<size_t>(l.k_blocks) * 4);
  l.v_amax = take(BH * kD * 4);
  l.k_partial = take(BH * static_cast<size_t>(l.chunks) * kD * 4);
  l.k_mean = take(BH * kD * 4);
  l.q = take(BH * static_cast<size_t>(s.Lq) * kD);
  l.q_scale = take(BH * static_cast<size_t>(l.q_tiles) * 4);
  l.q_mean_dot = take(BH * static_cast<size_t>(s.Lq) * 4);
  l.bytes = off;
  return l;
}

}  // namespace wan::cuda
