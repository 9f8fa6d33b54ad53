// The engine's own FP8 attention forward for Hopper (see attention_fp8.h for the scheme and the contract).
// The layout follows attention_own.cu's long-key path (a TMA producer warp, consumer warpgroups that take
// turns at the tensor cores, online softmax in fp32), with e4m3 operands and three consumers of 64 query
// rows each (192 per CTA):
//   S = Q·Kᵀ: wgmma m64n128k32 e4m3, both operands K-major from shared memory (one 128-byte row holds a
//   whole head of 128 e4m3 values, so a 128-byte-swizzled TMA box is a whole Q or K tile);
//   softmax: s·f with f = scale·log2(e)·sq·sk per tile, numerators 2^kOff·exp2(...), written as e4m3
//   to a P tile in shared memory (two per consumer, alternating) in the accumulator's key order;
//   O += P·V: both from shared memory, V transposed ([dims][keys], K-major) with the keys permuted per 16 by
//   the quantiser to match P (attention_fp8_quant.cu);
//   l: P times ones (wgmma N = 8) beside each P·V, the tile's row sums added in fp32;
//   epilogue: O · (1/l) · sv (V's per-channel scale), the LSE with the K-smoothing correction.
#include "kernels/attention_fp8.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/fp8_rows.h"
#include "kernels/check.h"
#include "kernels/sm90_ptx.cuh"

namespace wan::cuda {
namespace {

// Three consumer warpgroups of 64 query rows each: while one runs its softmax, the tensor cores have the
// other two's MMAs to work on (with two, the softmax of one is exposed whenever the other's MMAs end).
constexpr int kConsumers = 3;
constexpr int kBlockM = 64 * kConsumers;  // query rows per work item
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kQuantRows = 128;  // the quantiser's Q block (one scale per 128 rows; 64-row slices never straddle one)
constexpr int kHeadDim = 128;
constexpr int kBN = 128;      // keys per tile (= the K scale block of the quantiser)
constexpr uint32_t kQBytes = kBlockM * kHeadDim;  // e4m3: one byte per element
constexpr uint32_t kKBytes = kBN * kHeadDim;
constexpr uint32_t kVBytes = kHeadDim * kBN;
constexpr uint32_t kPBytes = 64 * kBN;  // one consumer warpgroup's P tile (e4m3)
// K/V ring depth 2 or 3 (template parameter STAGES; each stage 32 KiB); two P tiles per consumer.
constexpr size_t smem_bytes(int stages) {
  return size_t(kQBytes) + size_t(stages) * (kKBytes + kVBytes) + 2 * kConsumers * kPBytes + 1024 /*ones*/ +
         1024 /*align*/ + 256 /*barriers*/;
}

struct Params {
  int B, Lq, Lk, H;
  int num_q_tiles, k_blocks;  // num_q_tiles: work items per (sample, head), kBlockM rows each
  int q_blocks;               // the quantiser's 128-row Q blocks per (sample, head)
  const int32_t* k_lens;  // nullable
  __nv_bfloat16* o;
  int64_t o_ld;
  float* lse;             // nullable [B, H, Lq]
  float scale_log2;       // scale · log2(e)
  float scale;
  const float *q_scale, *k_scale, *q_mean_dot;  // q_mean_dot: with lse
  const uint32_t* v_amax;
};

#if defined(WAN_SM90A)
using namespace sm90;

// Every operand here is K-major with 128-byte rows, 128-byte swizzled, 1024 bytes between 8-row groups:
// its descriptor is desc(addr, 16, 1024), whose high word does not depend on the address. The MMAs take
// the low word alone (desc_lo) and add kDescHi in the asm, which keeps ptxas from rebuilding 64-bit
// descriptors before every wgmma (2% faster at L 75 600). Moving the address by 16·j bytes adds j.
constexpr uint32_t kDescHi = static_cast<uint32_t>(desc(0, 16, 1024) >> 32);
__device__ __forceinline__ uint32_t desc_lo(uint32_t addr) { return static_cast<uint32_t>(desc(addr, 16, 1024)); }

// D[64 x 128] (+)= A[64 x 32] · B[32 x 128], both from shared memory, given their descriptors' low words;
// scale_d 0 overwrites D.
__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[64], uint32_t a_lo, uint32_t b_lo, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %66, 0;\nmov.b64 da, {%64, %67};\nmov.b64 db, {%65, %67};\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, da, db, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a_lo), "r"(b_lo), "r"(scale_d), "r"(kDescHi));
}
// The same with N = 8 (P times a block of ones: the row sums).
__device__ __forceinline__ void wgmma_ss_e4m3_n8(float (&d)[4], uint32_t a_lo, uint32_t b_lo, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %6, 0;\nmov.b64 da, {%4, %7};\nmov.b64 db, {%5, %7};\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, da, db, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a_lo), "r"(b_lo), "r"(scale_d), "r"(kDescHi));
}

// Four probabilities (>= 0, <= 256) -> four e4m3 bytes, v0 in the low byte.
__device__ __forceinline__ uint32_t e4m3x4(float v0, float v1, float v2, float v3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v0, v1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v2, v3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}
// S = Q·Kᵀ and O += P·V (P from shared memory, laid out like Q), from descriptor low words (32 bytes along
// K add 2).
__device__ __forceinline__ void issue_qk(float (&s)[kBN / 2], uint32_t q_lo, uint32_t k_lo) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 32; ++kk) wgmma_ss_e4m3(s, q_lo + 2 * kk, k_lo + 2 * kk, kk > 0);
}
__device__ __forceinline__ void issue_pv(float (&o)[64], uint32_t p_lo, uint32_t v_lo) {
#pragma unroll
  for (int kk = 0; kk < kBN / 32; ++kk) wgmma_ss_e4m3(o, p_lo + 2 * kk, v_lo + 2 * kk, 1);
}
// The online softmax of one S tile (accumulator layout: s[i] is row (i>>1)&1, column 8·(i>>2) + 2·(lane&3)
// + (i&1)), written as e4m3 into the warpgroup's P tile in shared memory. It only reads s: ptxas waits for
// every wgmma in flight before any write to a wgmma accumulator register, so a softmax in place would wait
// for this warpgroup's own P·V before its exponentials.
// Per 32 keys, one stmatrix of four 8 x 16-byte matrices (rows +0/+8, 16-byte chunks 2kk and 2kk+1,
// swizzled). Byte 4t + i of each 16-key half holds key 8·(i/2) + 2t + (i mod 2) of the accumulator: the
// quantiser writes V's keys in that order (attention_fp8_quant.cu), so no data moves between lanes.
// kPolyEvery > 0: every kPolyEvery-th exponential on the FMA pipe (exp2_poly), the rest on the MUFU.
// kLazy: the running max moves only when the tile's exceeds it by more than 2 (log2 units); alpha is then
// 1 exactly and the caller skips the rescale (numerators reach 2^(kOff + 2)).
template <bool kMasked, int kPolyEvery, bool kLazy, int kOff>
__device__ __forceinline__ void softmax_to_smem(const float (&s)[kBN / 2], RowState& st, float f, int valid, int lane,
                                                float (&alpha)[2], uint32_t p_base, int warp) {
  const int c0 = 2 * (lane & 3);
  auto col_of = [&](int i) { return 8 * (i >> 2) + c0 + (i & 1); };
  float mc[2][4];
  row_max_chains<kBN / 2>([&](int i) { return !kMasked || col_of(i) < valid ? s[i] : -INFINITY; }, mc);
  float neg_m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = fmaxf(fmaxf(mc[r][0], mc[r][1]), fmaxf(mc[r][2], mc[r][3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if constexpr (kLazy) {
      const float cand = mx * f;
      alpha[r] = 1.f;
      if (cand > st.m[r] + 2.f) {  // always on the first tile (st.m = -inf: alpha = 0)
        alpha[r] = ex2(st.m[r] - cand);
        st.m[r] = cand;
      }
    } else {
      const float m_new = fmaxf(st.m[r], mx * f);
      alpha[r] = ex2(st.m[r] - m_new);  // st.m = -inf on the first tile: alpha = 0
      st.m[r] = m_new;
    }
    neg_m[r] = kOff - st.m[r];  // P = 2^(s·f − m + kOff)
  }
  const int j = lane >> 3, rr = lane & 7;
  const uint32_t row = 16 * warp + rr + 8 * (j & 1);
#pragma unroll
  for (int kk = 0; kk < kBN / 32; ++kk) {
    float e[16];
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      const int i = 16 * kk + q, r = (i >> 1) & 1;
      const float x = fmaf(s[i], f, neg_m[r]);
      float y;
      if constexpr (kPolyEvery > 0) y = i % kPolyEvery == kPolyEvery - 1 ? exp2_poly(x) : ex2(x);
      else y = ex2(x);
      if (kMasked && col_of(i) >= valid) y = 0.f;
      e[q] = y;
    }
    const uint32_t r0 = e4m3x4(e[0], e[1], e[4], e[5]), r1 = e4m3x4(e[2], e[3], e[6], e[7]);
    const uint32_t r2 = e4m3x4(e[8], e[9], e[12], e[13]), r3 = e4m3x4(e[10], e[11], e[14], e[15]);
    const uint32_t addr = p_base + row * 128 + ((static_cast<uint32_t>(2 * kk + (j >> 1)) ^ rr) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // P is read by wgmma (the async proxy)
}
#endif  // WAN_SM90A

// POLY > 0: every POLY-th softmax exponential on the FMA pipe (exp2_poly), the rest on the MUFU.
// LAZY (the default): lazy rescale: P = 2^(s·f − m + 6) <= 256, O rescaled only on a max move.
template <int POLY, int STAGES, bool LAZY>
__global__ void __launch_bounds__(kThreads, 1)
    attn_fp8_sm90(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const Params p) {
#if defined(WAN_SM90A)
  constexpr int kOff = LAZY ? 6 : 8;  // P = 2^(s·f − m + kOff)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + kQBytes;           // stage s at sK + s·kKBytes
  const uint32_t sV = sK + STAGES * kKBytes;  // stage s at sV + s·kVBytes
  const uint32_t sP = sV + STAGES * kVBytes;  // consumer c, parity e at sP + (2c + e)·kPBytes
  const uint32_t sOnes = sP + 2 * kConsumers * kPBytes;  // 1 KiB of e4m3 ones (the row sums' B operand)
  const uint32_t bars = sOnes + 1024;
  const uint32_t q_full = bars, q_empty = bars + 8;
  auto k_full = [&](int s) { return bars + 8u * (2 + s); };
  auto v_full = [&](int s) { return bars + 8u * (2 + STAGES + s); };
  auto k_empty = [&](int s) { return bars + 8u * (2 + 2 * STAGES + s); };
  auto v_empty = [&](int s) { return bars + 8u * (2 + 3 * STAGES + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int num_items = p.num_q_tiles * p.H * p.B;
  auto n_valid_of = [&](int b) {
    const int n = p.k_lens ? p.k_lens[b] : p.Lk;
    return n < 1 ? 1 : (n > p.Lk ? p.Lk : n);
  };
  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, 128 * kConsumers);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * kConsumers);
      mbar_init(v_empty(s), 4 * kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (tid < 256) {  // read by wgmma (the async proxy)
    reinterpret_cast<uint32_t*>(smem + (sOnes - sQ))[tid] = 0x38383838u;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid != 0) return;
    auto load_kv = [&](bool is_v, uint32_t pos, int n, int bh) {
      const int s = pos % STAGES;
      const uint32_t full = is_v ? v_full(s) : k_full(s);
      mbar_wait(is_v ? v_empty(s) : k_empty(s), ((pos / STAGES) & 1) ^ 1);
      mbar_expect_tx(full, is_v ? kVBytes : kKBytes);
      if (is_v) tma_load_3d(sV + s * kVBytes, &tv, full, n * kBN, 0, bh);
      else tma_load_3d(sK + s * kKBytes, &tk, full, 0, n * kBN, bh);
    };
    uint32_t it = 0, item = 0;
    for (int w = blockIdx.x; w < num_items; w += gridDim.x, ++item) {
      int qt, h, b;
      decode_item(w, p.num_q_tiles, p.H, qt, h, b);
      const int bh = b * p.H + h;
      const int n_tiles = (n_valid_of(b) + kBN - 1) / kBN;
      mbar_wait(q_empty, (item & 1) ^ 1);
      mbar_expect_tx(q_full, kQBytes);
      tma_load_3d(sQ, &tq, q_full, 0, qt * kBlockM, bh);
      load_kv(false, it, 0, bh);
      for (int n = 0; n < n_tiles; ++n) {
        if (n + 1 < n_tiles) load_kv(false, it + n + 1, n + 1, bh);
        load_kv(true, it + n, n, bh);
      }
      it += n_tiles;
    }
    return;
  }

  // ---- consumers ----
  // (65536 − 128·24) / 384 = 162 registers a thread, rounded down to a multiple of 8.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n");
  const int c = wg - 1;
  const int t = tid - 128 * wg;
  const int warp = t / 32, lane = t % 32;
  auto release = [&](uint32_t bar) {
    if (lane == 0) mbar_arrive(bar);
  };
  // The consumers take turns at the tensor cores round a ring of named barriers 1..3: a turn ends by
  // letting the next consumer's begin. The turns also publish P: every warp's stmatrix of P precedes the
  // barrier that the warpgroup's P·V issue follows.
  auto turn_begin = [&] { named_bar_sync(1 + c, 256); };
  auto turn_end = [&] { named_bar_arrive(1 + (c + 1) % kConsumers, 256); };
  if (c == kConsumers - 1) named_bar_arrive(1, 256);

  float s[kBN / 2], o[64];
  // The row sums of P come from the tensor cores, P times ones (N = 8) beside each P·V, into a fresh lt per
  // tile (lt[2r]: row r, the whole row in every thread) that is added to st.l in fp32: the FP8 MMA's own
  // accumulation drops the low bits of small addends, so a sum carried across tiles in it comes out
  // too small at L 75 600. They save the softmax 64 FADDs per tile (1.2% at L 75 600).
  float lt[4];
  const uint32_t ones_lo = desc_lo(sOnes);
  RowState st;
  float alpha[2] = {0.f, 0.f};
  int qt = 0, h = 0, b = 0, bh = 0, n_valid = 0, n_tiles = 0;
  uint32_t it = 0, item = 0;
  float fq = 0.f;  // scale·log2(e)·sq of the item's Q block
  const uint32_t p_tile = sP + 2 * c * kPBytes;
  // Descriptor low words of the tiles: a K or V stage is 1024 more, the second P tile 512 more.
  const uint32_t q_lo = desc_lo(sQ + c * (64 * 128)), k_lo = desc_lo(sK), v_lo = desc_lo(sV);
  const uint32_t p_lo = desc_lo(p_tile);
  static_assert(kKBytes == 16 << 10 && kVBytes == 16 << 10 && kPBytes == 8 << 10, "descriptor strides");
  // O += P_n·V (V stage sv) and lt = P_n's row sums, P_n in P tile n mod 2.
  auto issue_pv_rowsum = [&](int n, int sv) {
    const uint32_t pn = p_lo + ((n & 1) << 9);
    issue_pv(o, pn, v_lo + (sv << 10));
#pragma unroll
    for (int kk = 0; kk < kBN / 32; ++kk) wgmma_ss_e4m3_n8(lt, pn + 2 * kk, ones_lo, kk > 0);
  };

  auto tile_factor = [&](int n) { return fq * p.k_scale[static_cast<int64_t>(bh) * p.k_blocks + n]; };
  auto softmax = [&](int n) {  // S_n -> P_n (P tile n mod 2)
    const int valid = n_valid - n * kBN;
    const uint32_t p_dst = p_tile + (n & 1) * kPBytes;
    if (valid >= kBN) softmax_to_smem<false, POLY, LAZY, kOff>(s, st, tile_factor(n), valid, lane, alpha, p_dst, warp);
    else softmax_to_smem<true, POLY, LAZY, kOff>(s, st, tile_factor(n), valid, lane, alpha, p_dst, warp);
  };
  auto rescale = [&] {
#pragma unroll
    for (int r = 0; r < 2; ++r) st.l[r] = (st.l[r] + lt[2 * r]) * alpha[r];
    if (!LAZY || alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
  };
  auto epilogue = [&] {
    float inv_l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = st.l[r];
      inv_l[r] = 1.f / l;
      const int row = qt * kBlockM + 64 * c + 16 * warp + (lane >> 2) + 8 * r;
      if (p.lse && (lane & 3) == 0 && row < p.Lq) {
        const int64_t bhr = static_cast<int64_t>(bh) * p.Lq + row;
        p.lse[bhr] = (st.m[r] + __log2f(l) - kOff) * 0.69314718055994531f + p.scale * p.q_mean_dot[bhr];
      }
    }
    // V's per-channel scales of this thread's 32 columns 8j + 2(lane&3) + e.
    float sv[16][2];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        sv[j][e] = fp8::row_scale(p.v_amax[static_cast<int64_t>(bh) * kHeadDim + 8 * j + 2 * (lane & 3) + e]).scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = qt * kBlockM + 64 * c + 16 * warp + (lane >> 2) + 8 * r;
      const bool in_range = row < p.Lq;
      uint4* dst = reinterpret_cast<uint4*>(p.o + (static_cast<int64_t>(b) * p.Lq + row) * p.o_ld +
                                            static_cast<int64_t>(h) * kHeadDim) + (lane & 3);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t a[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * k + i;
          a[i] = pack_bf16(o[4 * j + 2 * r] * inv_l[r] * sv[j][0], o[4 * j + 2 * r + 1] * inv_l[r] * sv[j][1]);
        }
        store_quad_transposed(dst + 4 * k, a, lane, in_range);
      }
    }
  };

  for (int w = blockIdx.x; w < num_items; w += gridDim.x, ++item) {
    decode_item(w, p.num_q_tiles, p.H, qt, h, b);
    bh = b * p.H + h;
    n_valid = n_valid_of(b);
    n_tiles = (n_valid + kBN - 1) / kBN;
    // The last item's rows may run past the last Q block (rows >= Lq: computed, never stored).
    fq = p.scale_log2 *
         p.q_scale[static_cast<int64_t>(bh) * p.q_blocks + min((qt * kBlockM + 64 * c) / kQuantRows, p.q_blocks - 1)];
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    mbar_wait(q_full, item & 1);
    {  // tile 0: S_0 alone. (Peeled: a P·V issued under `if (n > 0)` makes ptxas serialise every wgmma, C7514.)
      const int s0 = it % STAGES;
      mbar_wait(k_full(s0), (it / STAGES) & 1);
      turn_begin();
      wgmma_fence();
      issue_qk(s, q_lo, k_lo + (s0 << 10));
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      reg_fence(s);
      release(k_empty(s0));
      if (n_tiles == 1) mbar_arrive(q_empty);
      softmax(0);
    }
    // Tile n: S_n issued, then O += P_{n-1}·V_{n-1}; the softmax of S_n runs while that P·V does and writes
    // P_n to the other P tile; then O is rescaled.
    for (int n = 1; n < n_tiles; ++n) {
      const uint32_t cur = it + n, prev = cur - 1;
      const int sn = cur % STAGES, sp = prev % STAGES;
      mbar_wait(k_full(sn), (cur / STAGES) & 1);
      mbar_wait(v_full(sp), (prev / STAGES) & 1);
      turn_begin();
      wgmma_fence();
      issue_qk(s, q_lo, k_lo + (sn << 10));
      wgmma_commit();
      wgmma_fence();
      issue_pv_rowsum(n - 1, sp);
      wgmma_commit();
      turn_end();
      wgmma_wait<1>();  // S_n (P·V_{n-1} may still run)
      reg_fence(s);
      release(k_empty(sn));
      if (n == n_tiles - 1) mbar_arrive(q_empty);
      softmax(n);
      wgmma_wait<0>();
      reg_fence(o);
      reg_fence(lt);
      release(v_empty(sp));
      rescale();
    }
    {  // the last P·V and the epilogue
      const uint32_t last = it + n_tiles - 1;
      const int sl = last % STAGES;
      mbar_wait(v_full(sl), (last / STAGES) & 1);
      turn_begin();
      wgmma_fence();
      issue_pv_rowsum(n_tiles - 1, sl);
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      reg_fence(o);
      reg_fence(lt);
      st.l[0] += lt[0];
      st.l[1] += lt[2];
      release(v_empty(sl));
      epilogue();
    }
    it += n_tiles;
  }
#endif  // WAN_SM90A
}

// Tensor map over e4m3 bytes [outer][rows][inner] (dense), box (box_inner, box_rows, 1), 128-byte swizzle.
CUtensorMap make_map(const void* base, int64_t inner, int64_t rows, int64_t outer, uint32_t box_inner,
                     uint32_t box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(inner * rows)};
  const cuuint32_t box[3] = {box_inner, box_rows, 1};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = sm90::encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides,
                                       box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  WAN_CHECK(r == CUDA_SUCCESS, "attention_fp8: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r),
            ") for ", inner, " x ", rows, " x ", outer);
  return m;
}

template <int POLY, int STAGES, bool LAZY>
void launch(unsigned grid, const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv, const Params& p,
            cudaStream_t stream) {
  constexpr size_t kSmem = smem_bytes(STAGES);
  static_assert(kSmem <= 232448, "attention_fp8: shared memory over the sm_90 limit");
  static std::mutex mu;
  static std::vector<bool> set_on;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (set_on.size() <= static_cast<size_t>(dev)) set_on.resize(static_cast<size_t>(dev) + 1, false);
    if (!set_on[static_cast<size_t>(dev)]) {
      CUDA_CHECK(cudaFuncSetAttribute(attn_fp8_sm90<POLY, STAGES, LAZY>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kSmem)));
      set_on[static_cast<size_t>(dev)] = true;
    }
  }
  attn_fp8_sm90<POLY, STAGES, LAZY><<<grid, kThreads, kSmem, stream>>>(tq, tk, tv, p);
}

}  // namespace

bool fp8_attention_lazy_rescale() {
  const char* e = std::getenv("WAN_ATTN_FP8_LAZY");
  return !(e && e[0] == '0');
}

bool OwnAttentionFp8::supported() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (prop.major != 9 || prop.minor != 0) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, attn_fp8_sm90<0, 2, true>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return fa.binaryVersion >= 90;
}

void OwnAttentionFp8::validate(const AttentionShape& s) {
  WAN_CHECK(s.D == kHeadDim, "attention_fp8: head dim ", s.D, " unsupported (only 128)");
  WAN_CHECK(s.out == AttnOutType::BF16, "attention_fp8: only bf16 output is supported");
  WAN_CHECK(s.B >= 1 && s.Lq >= 1 && s.Lk >= 1 && s.H >= 1, "attention_fp8: bad shape B=", s.B, " Lq=", s.Lq,
            " Lk=", s.Lk, " H=", s.H);
  WAN_CHECK(s.B * s.H <= 65535 && s.Lq <= (int64_t{1} << 30) && s.Lk <= (int64_t{1} << 30),
            "attention_fp8: shape too large B=", s.B, " H=", s.H, " Lq=", s.Lq, " Lk=", s.Lk);
  for (int64_t ld : {s.q_ld, s.k_ld, s.v_ld, s.o_ld})
    WAN_CHECK(ld == 0 || (ld >= s.H * s.D && ld % 8 == 0), "attention_fp8: token stride ", ld,
              " must be >= H*D = ", s.H * s.D, " and a multiple of 8");
}

void OwnAttentionFp8::run(const AttentionShape& s, const AttentionArgs& a, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream, Fp8KV kv) {
  validate(s);
  WAN_CHECK(a.q && a.k && a.v && a.o, "attention_fp8: null Q/K/V/O pointer");
  WAN_CHECK(!s.masked || a.k_lens, "attention_fp8: masked shape without k_lens");
  WAN_CHECK(!s.lse || a.lse, "attention_fp8: lse requested without a buffer");
  for (const void* ptr : {a.q, a.k, a.v, static_cast<const void*>(a.o)})
    WAN_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "attention_fp8: pointers must be 16-byte aligned");
  const Fp8AttentionLayout l = fp8_attention_layout(s);
  WAN_CHECK(workspace && workspace_bytes >= l.bytes && reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
            "attention_fp8: workspace of ", workspace_bytes, " B, needs ", l.bytes, " B (256-byte aligned)");
  auto* ws = static_cast<uint8_t*>(workspace);
  fp8_attention_quantize(s, a, l, ws, stream, kv);
  Params p{};
  p.B = static_cast<int>(s.B), p.Lq = static_cast<int>(s.Lq), p.Lk = static_cast<int>(s.Lk), p.H = static_cast<int>(s.H);
  p.num_q_tiles = static_cast<int>((s.Lq + kBlockM - 1) / kBlockM), p.k_blocks = static_cast<int>(l.k_blocks);
  p.q_blocks = static_cast<int>(l.q_tiles);
  p.k_lens = s.masked ? a.k_lens : nullptr;
  p.o = static_cast<__nv_bfloat16*>(a.o);
  p.o_ld = s.o_ld ? s.o_ld : s.H * kHeadDim;
  p.lse = s.lse ? a.lse : nullptr;
  p.scale = a.scale != 0.f ? a.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.q_scale = reinterpret_cast<const float*>(ws + l.q_scale);
  p.k_scale = reinterpret_cast<const float*>(ws + l.k_scale);
  p.q_mean_dot = reinterpret_cast<const float*>(ws + l.q_mean_dot);
  p.v_amax = reinterpret_cast<const uint32_t*>(ws + l.v_amax);
  const int64_t items = int64_t{p.num_q_tiles} * l.BH;
  WAN_CHECK(items < (int64_t{1} << 31), "attention_fp8: too many work items (", items, ")");
  const CUtensorMap tq = make_map(ws + l.q, kHeadDim, s.Lq, l.BH, kHeadDim, kBlockM);
  const CUtensorMap tk = make_map(ws + l.k, kHeadDim, s.Lk, l.BH, kHeadDim, kBN);
  const CUtensorMap tv = make_map(ws + l.vt, l.Lk16, kHeadDim, l.BH, kBN, kHeadDim);
  // Lazy rescaling is the default (WAN_ATTN_FP8_LAZY=0: eager, P offset 8): O is rescaled only when a row
  // max moves by more than 2 (log2), with P offset 6 (ops::Fp8AttentionRefOptions::lazy_rescale).
  // Experiments (bench-attention): WAN_ATTN_FP8_POLY=2|4 moves every 2nd / 4th exponential off the MUFU;
  // WAN_ATTN_FP8_STAGES=3 deepens the K/V ring.
  int poly = 0;
  if (const char* e = std::getenv("WAN_ATTN_FP8_POLY")) poly = std::atoi(e);
  const unsigned grid = static_cast<unsigned>(items);
  int stages = 2;
  if (const char* e = std::getenv("WAN_ATTN_FP8_STAGES")) stages = std::atoi(e) == 3 ? 3 : 2;
  const bool lazy = fp8_attention_lazy_rescale();
  if (!lazy && poly == 4) launch<4, 2, false>(grid, tq, tk, tv, p, stream);
  else if (!lazy) launch<0, 2, false>(grid, tq, tk, tv, p, stream);
  else if (poly == 2) launch<2, 2, true>(grid, tq, tk, tv, p, stream);
  else if (poly == 4) launch<4, 2, true>(grid, tq, tk, tv, p, stream);
  else if (stages == 3) launch<0, 3, true>(grid, tq, tk, tv, p, stream);
  else launch<0, 2, true>(grid, tq, tk, tv, p, stream);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace wan::cuda
