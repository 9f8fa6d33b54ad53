// Hopper (sm_90a) device primitives shared by the engine's attention kernels (attention_own.cu, bf16;
// attention_fp8.cu, e4m3): mbarriers, TMA tile loads, wgmma descriptors/fences, named barriers, the quad
// transpose store, the online-softmax row state, and the host-side tensor-map encoder. Written from the
// PTX ISA: wgmma (9.7.15), cp.async.bulk.tensor (9.7.9.25), mbarrier (9.7.13.15). Include only from .cu
// files; the device part exists only in the sm_90a compilation pass (WAN_SM90A).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>

#include "core/error.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WAN_SM90A 1
#endif

namespace wan::cuda::sm90 {

#if defined(WAN_SM90A)
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One TMA box (64 dims, 1 head, 128 tokens, 1 sample) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, int d0, int h, int t0,
                                         int b) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(d0), "r"(h), "r"(t0), "r"(b), "r"(bar)
      : "memory");
}
// wgmma shared-memory descriptor, 128-byte swizzle.
__host__ __device__ constexpr uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across wgmma waits.
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Named barriers from 1 (0 is __syncthreads): the consumers' turns at the tensor cores (attention_own.cu's
// two consumers ping-pong on 1 and 2, attention_fp8.cu's three go round 1..3).
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// 2^x on the FMA and integer pipes instead of the MUFU (which the softmax saturates once the tensor cores
// run FP8): round-to-nearest split x = n + f (the 1.5·2^23 trick), a cubic for 2^f on [-0.5, 0.5] (max
// relative error 1.4e-4: invisible after the e4m3 rounding of P), n added to the exponent bits. x is
// clamped at -125 (results stay normal; e4m3 flushes them to 0 anyway).
__device__ __forceinline__ float exp2_poly(float x) {
  x = fmaxf(x, -125.f);
  const float j = __fadd_rn(x, 12582912.f);
  const float f = __fsub_rn(x, __fsub_rn(j, 12582912.f));
  const float p = fmaf(fmaf(fmaf(0.05502927f, f, 0.24225698f), f, 0.69325304f), f, 0.99995136f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(j) << 23));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Work item w -> (query tile, head, sample), query tile fastest: the CTAs resident at one time work on
// the same (sample, head), so its K/V stream through L2 once for all of them.
__device__ __forceinline__ void decode_item(int w, int num_q_tiles, int H, int& qt, int& h, int& b) {
  qt = w % num_q_tiles;
  const int bh = w / num_q_tiles;
  h = bh % H;
  b = bh / H;
}
// One TMA box of a 3-D tensor map (coordinates innermost first) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Lane q of a quad holds a[i] = element q of 4-element group i (i = 0..3); stores, through a 4x4
// transpose over the quad (two xor-butterfly stages, 4 shuffles), lane q's uint4 {group q from lanes 0..3}
// at dst (if `store`): the quad's 4 lanes then write 4 whole, consecutive 16-byte chunks. Every lane of
// the warp must call it (full-warp shuffles).
__device__ __forceinline__ void store_quad_transposed(uint4* dst, const uint32_t (&a)[4], int lane, bool store) {
  const bool b0 = lane & 1, b1 = lane & 2;
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, b0 ? a[0] : a[1], 1);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, b0 ? a[2] : a[3], 1);
  const uint32_t c0 = b0 ? r0 : a[0], c1 = b0 ? a[1] : r0, c2 = b0 ? r1 : a[2], c3 = b0 ? a[3] : r1;
  const uint32_t u0 = __shfl_xor_sync(0xffffffffu, b1 ? c0 : c2, 2);
  const uint32_t u1 = __shfl_xor_sync(0xffffffffu, b1 ? c1 : c3, 2);
  if (store) *dst = b1 ? make_uint4(u0, u1, c2, c3) : make_uint4(c0, c1, u0, u1);
}

// Online-softmax state of the two rows a thread owns (r0 = 16·warp + lane/4 and r0 + 8).
struct RowState {
  float m[2];  // running max of the scaled scores, in log2 units
  float l[2];  // running sum of exp2(s − m): attention_own.cu's over this thread's columns (reduced over the
               // quad at the end), attention_fp8.cu's over the whole row (from the tensor cores)
};

// Running maxima of a thread's share of an accumulator tile (N elements; element i is v(i), of row
// (i >> 1) & 1) in 4 independent chains per row (chain (i >> 2) & 3), so the dependent latency between the
// tile's arrival and its first exp2 is ~N/8 + 2 steps instead of N/2. The caller reduces the chains.
template <int N, class V>
__device__ __forceinline__ void row_max_chains(V v, float (&mc)[2][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < 4; ++k) mc[r][k] = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) mc[(i >> 1) & 1][(i >> 2) & 3] = fmaxf(mc[(i >> 1) & 1][(i >> 2) & 3], v(i));
}

// Softmax of one [64 x BN] tile in place (accumulator layout): s becomes exp2(s·scale_log2 − m_new); alpha
// gets the factors exp2(m_old − m_new) that rescale the previous accumulator. Columns >= valid
// (tile-relative) are masked. (The FP8 kernel has its own, attention_fp8.cu softmax_to_smem: it must not
// write s.)
template <int BN>
__device__ __forceinline__ void softmax_tile(float (&s)[BN / 2], RowState& st, float scale_log2, int valid, int lane,
                                             float (&alpha)[2]) {
  if (valid < BN) {
    const int c0 = 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const int col = 8 * (i >> 2) + c0 + (i & 1);
      if (col >= valid) s[i] = -INFINITY;
    }
  }
  float mc[2][4];
  row_max_chains<BN / 2>([&](int i) { return s[i]; }, mc);
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) mx[r] = fmaxf(fmaxf(mc[r][0], mc[r][1]), fmaxf(mc[r][2], mc[r][3]));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(st.m[r], mx[r] * scale_log2);
    alpha[r] = ex2(st.m[r] - m_new);  // st.m = -inf on the first tile: alpha = 0
    st.m[r] = m_new;
    st.l[r] *= alpha[r];
  }
  const float neg_m[2] = {-st.m[0], -st.m[1]};
  float lc[2][4] = {};
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) {
    const int r = (i >> 1) & 1;
    s[i] = ex2(fmaf(s[i], scale_log2, neg_m[r]));
    lc[r][(i >> 2) & 3] += s[i];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] += (lc[r][0] + lc[r][1]) + (lc[r][2] + lc[r][3]);
}
#endif  // WAN_SM90A

// The driver's cuTensorMapEncodeTiled, fetched once at run time (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    else
      (void)cudaGetLastError();
  });
  WAN_CHECK(fn != nullptr, "attention_own: the CUDA driver has no cuTensorMapEncodeTiled");
  return fn;
}

}  // namespace wan::cuda::sm90
