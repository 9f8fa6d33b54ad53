// The engine's own Hopper attention forward (see attention_own.h for the design and the contract).
// Written from the PTX ISA: wgmma (9.7.15), cp.async.bulk.tensor (9.7.9.25), mbarrier (9.7.13.15),
// setmaxnreg (9.7.17.1); tensor maps through the driver's cuTensorMapEncodeTiled, fetched at run time
// with cudaGetDriverEntryPointByVersion (no link against libcuda).
#include "kernels/attention_own.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/sm90_ptx.cuh"

namespace wan::cuda {

// Key tile BN = 128 or 176 keys (template parameter; 176 as FA3 uses for head dim 128 amortises the
// per-tile softmax bookkeeping over more keys, 128 fits short key sequences such as the 512 text tokens).
// Shared memory (dynamic, 1024-byte aligned for the 128-byte swizzle), 32 KiB + 2·2·BN·256 B + barriers
// (160 KiB for BN 128, 208 KiB for BN 176):
//   Q [2 column halves][128 rows][64 bf16]          (half c holds head dims 64c .. 64c+63)
//   K [2 stages][2 halves][BN keys][64 bf16]
//   V [2 stages][2 halves][BN keys][64 bf16]
// Each [rows][64] half is what one TMA box of (64 dims, 1 head, rows tokens, 1 sample) writes with
// CU_TENSOR_MAP_SWIZZLE_128B: row r at r·128 bytes, its 16-byte chunks permuted by (r mod 8).
// wgmma descriptors address these halves directly:
//   Q (A, K-major) and K (B, K-major): start = half base + 32·(k step mod 4) bytes, SBO 1024 (8 rows);
//   V (B, N-major, imm-trans-b = 1): start = stage base + 2048·(k step) (16 keys), LBO = half size (the
//   next 64 head dims), SBO 1024 (the next 8 keys).

namespace {

constexpr int kBlockM = 128;  // query rows per work item (two consumer warpgroups of 64)
constexpr int kHeadDim = 128;
constexpr uint32_t kQHalfBytes = 128 * 64 * 2;     // one [128][64] bf16 half of Q: 16 KiB
constexpr uint32_t kQTileBytes = 2 * kQHalfBytes;  // 32 KiB
constexpr int kThreads = 384;
constexpr int kStages = 2;  // K/V ring depth (3 stages of 128-key tiles measured slower for the text keys)
// Q buffers: two with 128-key tiles (the next item's Q loads during the current one: the text keys are
// 4 tiles per item), one with 176 (no room; the long-key items are one per CTA).
constexpr int q_buffers(int bn) { return bn == 128 ? 2 : 1; }
constexpr size_t smem_bytes(int bn) {
  return size_t{kQTileBytes} * q_buffers(bn) + size_t{2} * kStages * (2 * bn * 128) + 1024 /*align*/ +
         256 /*barriers*/;
}

struct Params {
  int B, Lq, Lk, H;
  int num_q_tiles;
  const int32_t* k_lens;  // nullable
  __nv_bfloat16* o;
  int64_t o_ld;           // token stride of O (elements); sample stride Lq·o_ld
  float* lse;             // nullable [B, H, Lq]
  float scale_log2;       // scale · log2(e)
};

#if defined(WAN_SM90A)
using namespace sm90;
// wgmma wrappers (generated operand lists).
// S[64 x N] (+)= A[64 x 16] (shared, K-major) · B[16 x N] (shared, K-major); scale_d 0 overwrites S.
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d);
template <>
__device__ __forceinline__ void wgmma_ss<128>(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_ss<176>(float (&d)[88], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
      : "l"(da), "l"(db), "r"(scale_d));
}
// O[64 x 128] += A[64 x 16] (registers, 4 x bf16x2) · B[16 x 128] (shared, N-major: imm-trans-b = 1).
__device__ __forceinline__ void wgmma_rs_tn(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}


template <int BN>
__device__ __forceinline__ void to_bf16_fragments(const float (&s)[BN / 2], uint32_t (&p)[BN / 4]) {
#pragma unroll
  for (int i = 0; i < BN / 4; ++i) p[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
}

// O += P·V over one key tile: BN/16 k-steps of 16 keys; V is read N-major from its two halves.
template <int BN>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&p)[BN / 4], uint32_t v_base) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    wgmma_rs_tn(o, a, desc(v_base + 2048u * kk, BN * 128, 1024));
  }
}
// S = Q·Kᵀ over the head dim: 8 k-steps of 16 dims (4 per 64-dim half).
template <int BN>
__device__ __forceinline__ void issue_qk(float (&s)[BN / 2], uint32_t q_base, uint32_t k_base) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t qo = (kk >> 2) * kQHalfBytes + (kk & 3) * 32, ko = (kk >> 2) * (BN * 128) + (kk & 3) * 32;
    wgmma_ss<BN>(s, desc(q_base + qo, 16, 1024), desc(k_base + ko, 16, 1024), kk > 0);
  }
}
#endif  // WAN_SM90A

// Persistent kernel: CTA k runs work items k, k + gridDim.x, ... The producer runs ahead across items:
// the K/V ring's stages and phases continue over items, and Q of the next item goes into the other Q
// buffer (two with 128-key tiles; with one, as soon as both consumers have issued their last Q·Kᵀ).
//
// With 128-key tiles (the text keys: 4 tiles per item, persistent grid) the consumers run one continuous
// pipeline over the tiles of all their items: the last P·V of an item is issued together with the first
// Q·Kᵀ of the next, and the item's epilogue (O / l, stores) runs after that P·V while the other
// consumer's matrix products occupy the tensor cores, so an item boundary costs about what a tile
// boundary does. With 176-key tiles (long keys, one item per CTA) items run one after the other.
//
// The producer issues K one tile ahead of V (K_{n+1} before V_n): K_{n+1} waits for S_{n-1} (early in the
// consumers' iteration n-1) and V_n for P·V_{n-2} (late in it), so the K that the next Q·Kᵀ needs is not
// queued behind a V wait.
//
// PP (ping-pong): the two consumer warpgroups take turns at issuing their matrix products, so that one
// warpgroup's softmax (exp2 on the MUFU, max/sum shuffles) runs while the other's wgmmas occupy the
// tensor cores. Named barrier 1 + c is consumer c's turn: it waits there (bar.sync, 256 threads: its
// own 128 plus the other's 128 bar.arrive), issues, then hands the turn over (bar.arrive on the other's
// barrier). Consumer 1 hands consumer 0 the first turn. Both run the same items with the same number of
// issue points (one per tile plus one at the end), so the turns stay paired to the end; the last
// hand-over is never waited for (barrier state does not outlive the CTA).
template <int BN, bool PP>
__global__ void __launch_bounds__(kThreads, 1)
    attn_fwd_sm90(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const Params p) {
#if defined(WAN_SM90A)
  constexpr uint32_t kKVHalf = BN * 128;  // bytes of one [BN][64] half
  constexpr uint32_t kKVTile = 2 * kKVHalf;
  constexpr int kQB = q_buffers(BN);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t sQ = smem_u32(smem);                 // buffer j at sQ + j·kQTileBytes
  const uint32_t sK = sQ + kQB * kQTileBytes;         // stage s at sK + s·kKVTile
  const uint32_t sV = sK + kStages * kKVTile;
  const uint32_t bars = sV + kStages * kKVTile;       // 8-byte mbarriers
  auto q_full = [&](int j) { return bars + 8u * j; };
  auto q_empty = [&](int j) { return bars + 8u * (2 + j); };
  auto k_full = [&](int s) { return bars + 8u * (4 + s); };
  auto v_full = [&](int s) { return bars + 8u * (4 + kStages + s); };
  auto k_empty = [&](int s) { return bars + 8u * (4 + 2 * kStages + s); };
  auto v_empty = [&](int s) { return bars + 8u * (4 + 3 * kStages + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int num_items = p.num_q_tiles * p.H * p.B;
  auto n_valid_of = [&](int b) {
    const int n = p.k_lens ? p.k_lens[b] : p.Lk;
    return n < 1 ? 1 : (n > p.Lk ? p.Lk : n);
  };

  if (tid == 0) {
    for (int j = 0; j < kQB; ++j) {
      mbar_init(q_full(j), 1);
      mbar_init(q_empty(j), 256);  // every consumer thread arrives
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 8);  // one arrival per consumer warp
      mbar_init(v_empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid != 0) return;
    // Key tile n (ring position pos) of K or V: wait until the stage's previous tile was released, then load.
    auto load_kv = [&](bool is_v, uint32_t pos, int n, int h, int b) {
      const int s = pos % kStages;
      const uint32_t full = is_v ? v_full(s) : k_full(s);
      const uint32_t dst = (is_v ? sV : sK) + s * kKVTile;
      const CUtensorMap* map = is_v ? &tv : &tk;
      mbar_wait(is_v ? v_empty(s) : k_empty(s), ((pos / kStages) & 1) ^ 1);
      mbar_expect_tx(full, kKVTile);
      tma_load(dst, map, full, 0, h, n * BN, b);
      tma_load(dst + kKVHalf, map, full, 64, h, n * BN, b);
    };
    uint32_t it = 0;  // key tiles issued so far (ring position)
    uint32_t item = 0;
    for (int w = blockIdx.x; w < num_items; w += gridDim.x, ++item) {
      int qt, h, b;
      decode_item(w, p.num_q_tiles, p.H, qt, h, b);
      const int n_tiles = (n_valid_of(b) + BN - 1) / BN;
      const int qb = static_cast<int>(item % kQB);
      mbar_wait(q_empty(qb), ((item / kQB) & 1) ^ 1);  // the buffer's previous item's last Q·Kᵀ is done
      mbar_expect_tx(q_full(qb), kQTileBytes);
      tma_load(sQ + qb * kQTileBytes, &tq, q_full(qb), 0, h, qt * kBlockM, b);
      tma_load(sQ + qb * kQTileBytes + kQHalfBytes, &tq, q_full(qb), 64, h, qt * kBlockM, b);
      load_kv(false, it, 0, h, b);
      for (int n = 0; n < n_tiles; ++n) {
        if (n + 1 < n_tiles) load_kv(false, it + n + 1, n + 1, h, b);
        load_kv(true, it + n, n, h, b);
      }
      it += n_tiles;
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int c = wg - 1;          // consumer index: query rows 64c .. 64c+63 of the tile
  const int t = tid - 128 * wg;  // thread in the warpgroup
  const int warp = t / 32, lane = t % 32;
  const float sl2 = p.scale_log2;
  // A K/V stage is released once per warp, after the warp's wgmma wait (every lane has passed it).
  auto release = [&](uint32_t bar) {
    if (lane == 0) mbar_arrive(bar);
  };
  auto turn_begin = [&] {
    if constexpr (PP) named_bar_sync(1 + c, 256);
  };
  auto turn_end = [&] {
    if constexpr (PP) named_bar_arrive(2 - c, 256);
  };
  if constexpr (PP) {
    if (c == 1) named_bar_arrive(1, 256);  // consumer 0 issues first
  }

  float s[BN / 2], o[64];
  uint32_t pf[BN / 4];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  RowState st, st_prev;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
  float alpha[2] = {0.f, 0.f};
  // The pending P·V: P (in pf) of the last tile whose softmax is done, its V ring position, its item.
  uint32_t pend_pos = 0;
  int pend_qt = 0, pend_h = 0, pend_b = 0;

  // O / l -> bf16 and the log-sum-exp of one finished item (O complete in o, its statistics in rs).
  auto epilogue = [&](const RowState& rs, int qt, int h, int b) {
    float inv_l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = rs.l[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv_l[r] = 1.f / l;
      const int row = qt * kBlockM + 64 * c + 16 * warp + (lane >> 2) + 8 * r;
      if (p.lse && (lane & 3) == 0 && row < p.Lq)
        p.lse[(static_cast<int64_t>(b) * p.H + h) * p.Lq + row] = (rs.m[r] + __log2f(l)) * 0.69314718055994531f;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = qt * kBlockM + 64 * c + 16 * warp + (lane >> 2) + 8 * r;
      const bool in_range = row < p.Lq;  // rows past Lq still take part in the quad's shuffles
      // The quad holds the row's 8-column groups j = 0..15 (lane q: columns 8j + 2q, +1). A 4x4 transpose
      // over the quad per 4 groups gives lane q all 8 columns of group 4k + q: one 16-byte store each
      // instead of four 4-byte stores (whole 32-byte sectors). validate/run guarantee 16-byte alignment.
      uint4* dst = reinterpret_cast<uint4*>(p.o + (static_cast<int64_t>(b) * p.Lq + row) * p.o_ld +
                                            static_cast<int64_t>(h) * kHeadDim) + (lane & 3);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t a[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          a[i] = pack_bf16(o[4 * (4 * k + i) + 2 * r] * inv_l[r], o[4 * (4 * k + i) + 2 * r + 1] * inv_l[r]);
        store_quad_transposed(dst + 4 * k, a, lane, in_range);
      }
    }
  };

  // The item being computed (the pending P·V's item is pend_*).
  int qt = 0, h = 0, b = 0, n_valid = 0, n_tiles = 0, qb = 0;
  uint32_t q_base = 0, it = 0, item = 0;
  auto begin_item = [&](int w) {
    decode_item(w, p.num_q_tiles, p.H, qt, h, b);
    n_valid = n_valid_of(b);
    n_tiles = (n_valid + BN - 1) / BN;
    qb = static_cast<int>(item % kQB);
    q_base = sQ + qb * kQTileBytes + c * (64 * 128);  // 64 rows of 128 bytes into each half
    mbar_wait(q_full(qb), (item / kQB) & 1);
  };
  // After S_n is ready: free K_n's stage (and Q after the item's last Q·Kᵀ).
  auto after_s = [&](int n, int sn) {
    reg_fence(s);
    release(k_empty(sn));
    if (n == n_tiles - 1) mbar_arrive(q_empty(qb));  // Q no longer read: the producer may refill it
  };
  auto pend = [&](uint32_t pos) {
    to_bf16_fragments<BN>(s, pf);
    pend_pos = pos;
    pend_qt = qt, pend_h = h, pend_b = b;
  };
  // Every wgmma below is waited for in the same straight-line block that issued it (no conditional
  // waits: ptxas serialises wgmmas whose accumulators it cannot prove untouched between issue and wait).
  // Tile 0 of the CTA's first item: S_0 alone.
  auto first_tile = [&] {
    const int s0 = it % kStages;
    mbar_wait(k_full(s0), (it / kStages) & 1);
    turn_begin();
    wgmma_fence();
    issue_qk<BN>(s, q_base, sK + s0 * kKVTile);
    wgmma_commit();
    turn_end();
    wgmma_wait<0>();
    after_s(0, s0);
    softmax_tile<BN>(s, st, sl2, n_valid, lane, alpha);
    pend(it);
  };
  // O rescaled to the pending tile's maxima, then O += P·V of the pending tile (V in ring stage sp)
  // issued and committed; inside the caller's turn.
  auto rescale_and_issue_pv = [&](int sp) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] *= alpha[(i >> 1) & 1];
    wgmma_fence();  // orders the multiplies before the wgmma that accumulates into O
    issue_pv<BN>(o, pf, sV + sp * kKVTile);
    wgmma_commit();
  };
  // S = Q·K_posᵀ issued, then O rescaled to the previous tile's maxima (while Q·Kᵀ runs) and O += P·V of
  // the pending tile issued, in one turn of the ping-pong. The caller waits (straight-line, see above).
  auto issue_qk_then_pv = [&](uint32_t pos) {
    const int sk = pos % kStages, sp = pend_pos % kStages;
    mbar_wait(k_full(sk), (pos / kStages) & 1);
    mbar_wait(v_full(sp), (pend_pos / kStages) & 1);
    turn_begin();
    wgmma_fence();
    issue_qk<BN>(s, q_base, sK + sk * kKVTile);
    wgmma_commit();
    rescale_and_issue_pv(sp);
    turn_end();
  };
  // Tile 0 of a later item: S_0 together with the previous item's last P·V, then that item's epilogue.
  auto boundary_tile = [&] {
    const int s0 = it % kStages, sp = pend_pos % kStages;
    issue_qk_then_pv(it);
    wgmma_wait<1>();
    after_s(0, s0);
    st_prev = st;  // the finished item's statistics, for its epilogue
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
    softmax_tile<BN>(s, st, sl2, n_valid, lane, alpha);
    wgmma_wait<0>();
    reg_fence(o);
    release(v_empty(sp));
    epilogue(st_prev, pend_qt, pend_h, pend_b);
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    pend(it);
  };
  // Tiles 1 .. n_tiles-1: S_n = Q·K_nᵀ issued, then O rescaled to tile n-1's maxima (while Q·K_nᵀ runs)
  // and O += P_{n-1}·V_{n-1}. The softmax does not overlap that P·V: ptxas places the wait_group 0 below
  // right after the softmax's first FMNMX (the sm_90a SASS; the registers do not hold P_{n-1}, O and the
  // softmax's working set at once). Retiring the P·V at the next issue instead puts the wait after the
  // exponentials but measured no faster (bench/README, attention section).
  auto rest_tiles = [&] {
    for (int n = 1; n < n_tiles; ++n) {
      const uint32_t cur = it + n;
      const int sn = cur % kStages, sp = pend_pos % kStages;
      issue_qk_then_pv(cur);
      wgmma_wait<1>();  // S_n ready (P·V may still run)
      after_s(n, sn);
      softmax_tile<BN>(s, st, sl2, n_valid - n * BN, lane, alpha);
      wgmma_wait<0>();  // P·V done: O and the V stage are free
      reg_fence(o);
      release(v_empty(sp));
      pend(cur);
    }
    it += n_tiles;
    ++item;
  };

  // The last P·V of the current item and its epilogue.
  auto last_pv_and_epilogue = [&] {
    const int sp = pend_pos % kStages;
    mbar_wait(v_full(sp), (pend_pos / kStages) & 1);
    turn_begin();
    rescale_and_issue_pv(sp);
    turn_end();
    wgmma_wait<0>();
    reg_fence(o);
    release(v_empty(sp));
    epilogue(st, pend_qt, pend_h, pend_b);
  };

  if constexpr (kQB == 2) {
    // One pipeline across the items (the persistent grid over the text keys).
    int w = blockIdx.x;
    if (w >= num_items) return;
    begin_item(w);
    first_tile();
    rest_tiles();
    for (w += gridDim.x; w < num_items; w += gridDim.x) {
      begin_item(w);
      boundary_tile();
      rest_tiles();
    }
    last_pv_and_epilogue();
  } else {
    // Item by item (long keys: one item per CTA; the extra state of the cross-item pipeline would not
    // fit the registers with 176-key tiles).
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
      begin_item(w);
      st.m[0] = st.m[1] = -INFINITY;
      st.l[0] = st.l[1] = 0.f;
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] = 0.f;
      first_tile();
      rest_tiles();
      last_pv_and_epilogue();
    }
  }
#endif  // WAN_SM90A
}

}  // namespace

namespace {

// Tensor map over a token-major [B, L, H, 128] bf16 tensor with token stride ld (elements): dims
// (dim, head, token, sample), box (64, 1, box_rows, 1), 128-byte swizzle, zero fill out of bounds.
CUtensorMap make_map(const void* base, int64_t B, int64_t L, int64_t H, int64_t ld, uint32_t box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(kHeadDim), static_cast<cuuint64_t>(H),
                              static_cast<cuuint64_t>(L), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(kHeadDim * 2), static_cast<cuuint64_t>(ld * 2),
                                 static_cast<cuuint64_t>(L * ld * 2)};
  const cuuint32_t box[4] = {64, 1, box_rows, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUresult r = sm90::encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims,
                                       strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  WAN_CHECK(r == CUDA_SUCCESS, "attention_own: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r),
            ") for B=", B, " L=", L, " H=", H, " token stride ", ld);
  return m;
}

int64_t ld_or(int64_t ld, int64_t H) { return ld ? ld : H * kHeadDim; }

}  // namespace

bool OwnAttention::supported() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (prop.major != 9 || prop.minor != 0) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, attn_fwd_sm90<128, true>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return fa.binaryVersion >= 90;
}

void OwnAttention::validate(const AttentionShape& s) {
  WAN_CHECK(s.D == kHeadDim, "attention_own: head dim ", s.D, " unsupported (only 128)");
  WAN_CHECK(s.out == AttnOutType::BF16, "attention_own: only bf16 output is supported");
  WAN_CHECK(s.B >= 1 && s.Lq >= 1 && s.Lk >= 1 && s.H >= 1, "attention_own: bad shape B=", s.B, " Lq=", s.Lq,
            " Lk=", s.Lk, " H=", s.H);
  WAN_CHECK(s.B <= 65535 && s.H <= 65535 && s.Lq <= (int64_t{1} << 30) && s.Lk <= (int64_t{1} << 30),
            "attention_own: shape too large B=", s.B, " H=", s.H, " Lq=", s.Lq, " Lk=", s.Lk);
  for (int64_t ld : {s.q_ld, s.k_ld, s.v_ld, s.o_ld})
    WAN_CHECK(ld == 0 || (ld >= s.H * s.D && ld % 8 == 0), "attention_own: token stride ", ld,
              " must be >= H*D = ", s.H * s.D, " and a multiple of 8");
}

namespace {

// Launches one instantiation; its shared-memory attribute is set once per device (attributes are per
// device, and multi-GPU runs drive several devices from one process).
template <int BN, bool PP>
void launch(unsigned grid, const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv, const Params& p,
            cudaStream_t stream) {
  constexpr size_t smem = smem_bytes(BN);
  static_assert(smem <= 232448, "attention_own: shared memory over the sm_90 limit");
  static std::mutex mu;
  static std::vector<bool> set_on;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (set_on.size() <= static_cast<size_t>(dev)) set_on.resize(static_cast<size_t>(dev) + 1, false);
    if (!set_on[static_cast<size_t>(dev)]) {
      CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_sm90<BN, PP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
      set_on[static_cast<size_t>(dev)] = true;
    }
  }
  attn_fwd_sm90<BN, PP><<<grid, kThreads, smem, stream>>>(tq, tk, tv, p);
}

}  // namespace

void OwnAttention::run(const AttentionShape& s, const AttentionArgs& a, cudaStream_t stream) {
  validate(s);
  WAN_CHECK(a.q && a.k && a.v && a.o, "attention_own: null Q/K/V/O pointer");
  WAN_CHECK(!s.masked || a.k_lens, "attention_own: masked shape without k_lens");
  WAN_CHECK(!s.lse || a.lse, "attention_own: lse requested without a buffer");
  for (const void* ptr : {a.q, a.k, a.v, static_cast<const void*>(a.o)})
    WAN_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "attention_own: pointers must be 16-byte aligned");
  int num_sms = 0;
  {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  }
  // Key tile: 128 for short key sequences (512 text tokens: 4 full tiles), else 176.
  int bn = s.Lk <= 1024 ? 128 : 176;
  if (const char* e = std::getenv("WAN_ATTN_BN")) bn = std::atoi(e) == 128 ? 128 : 176;  // experiments
  Params p{};
  p.B = static_cast<int>(s.B);
  p.Lq = static_cast<int>(s.Lq);
  p.Lk = static_cast<int>(s.Lk);
  p.H = static_cast<int>(s.H);
  p.num_q_tiles = static_cast<int>((s.Lq + kBlockM - 1) / kBlockM);
  p.k_lens = s.masked ? a.k_lens : nullptr;
  p.o = static_cast<__nv_bfloat16*>(a.o);
  p.o_ld = ld_or(s.o_ld, s.H);
  p.lse = s.lse ? a.lse : nullptr;
  const float scale = a.scale != 0.f ? a.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  p.scale_log2 = scale * 1.4426950408889634f;
  const int64_t items = int64_t{p.num_q_tiles} * s.H * s.B;
  WAN_CHECK(items < (int64_t{1} << 31), "attention_own: too many work items (", items, ")");
  const CUtensorMap tq = make_map(a.q, s.B, s.Lq, s.H, ld_or(s.q_ld, s.H), kBlockM);
  const CUtensorMap tk = make_map(a.k, s.B, s.Lk, s.H, ld_or(s.k_ld, s.H), static_cast<uint32_t>(bn));
  const CUtensorMap tv = make_map(a.v, s.B, s.Lk, s.H, ld_or(s.v_ld, s.H), static_cast<uint32_t>(bn));
  // Long key sequences: one CTA per work item (the block scheduler starts a new item the moment an SM
  // frees up). Short ones (text keys): a persistent grid, one continuous pipeline over its items (the
  // next item's Q·Kᵀ and loads overlap the current item's last P·V and epilogue).
  bool persistent = s.Lk <= 1024;
  if (const char* e = std::getenv("WAN_ATTN_PERSIST")) persistent = e[0] == '1';  // experiments
  const unsigned grid = static_cast<unsigned>(persistent ? std::min<int64_t>(items, num_sms) : items);
  // Ping-pong between the consumer warpgroups (see the kernel); WAN_ATTN_PINGPONG=0 turns it off
  // (experiments: on an H100, L = 75 600, 652 TFLOP/s with it, 640 without, same run).
  bool pp = true;
  if (const char* e = std::getenv("WAN_ATTN_PINGPONG")) pp = e[0] != '0';
  if (bn == 128) pp ? launch<128, true>(grid, tq, tk, tv, p, stream) : launch<128, false>(grid, tq, tk, tv, p, stream);
  else pp ? launch<176, true>(grid, tq, tk, tv, p, stream) : launch<176, false>(grid, tq, tk, tv, p, stream);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace wan::cuda
