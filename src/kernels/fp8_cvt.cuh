// The e4m3 pair conversion of the FP8 quantisers (fp8_quant.cu, attention_fp8_quant.cu, the LayerNorms
// of dit_norm.cu), one definition so that every quantising kernel agrees bit for bit with
// wan::f32_to_f8e4m3 (core/dtype.h), and the pieces of core/fp8_rows.h's per-row scheme that row
// kernels share (the block's amax, eight elements to bytes). Include only from .cu files.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/fp8_rows.h"

namespace wan::cuda {

// Two scaled values -> two e4m3 bytes (a in the low byte), equal to wan::f32_to_f8e4m3 for |v| <= 464
// (check_e4m3_conversion proves it on the device): on sm_89+ one cvt instruction per pair; the sign
// of a zero result is taken from the input, as f32_to_f8e4m3 does (-tiny -> 0x80).
__device__ __forceinline__ uint32_t cvt_e4m3x2(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t h = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  return h | ((__float_as_uint(a) >> 24) & 0x80u) | ((__float_as_uint(b) >> 16) & 0x8000u);
#else
  return static_cast<uint32_t>(f32_to_f8e4m3(a)) | (static_cast<uint32_t>(f32_to_f8e4m3(b)) << 8);
#endif
}

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Max over the block (blockDim.x a multiple of 32, at most 32 warps); every thread gets it. `smem`: 33
// words of shared memory the caller owns (no other use between the two barriers).
__device__ __forceinline__ uint32_t block_max_u32(uint32_t v, uint32_t* smem) {
  v = warp_max_u32(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint32_t w = lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : 0u;
    w = warp_max_u32(w);
    if (lane == 0) smem[32] = w;
  }
  __syncthreads();
  return smem[32];
}

// Eight elements of a row with scale rs -> eight e4m3 bytes (element 0 in the low byte of .x).
__device__ __forceinline__ uint2 quantize8(const float (&v)[8], const fp8::RowScale& rs) {
  const uint32_t fill = fp8::fill_byte(rs) * 0x01010101u;
  if (rs.kind != fp8::RowKind::Finite) return make_uint2(fill, fill);
  float s[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = rn::mul(v[i], rs.inv);
  return make_uint2(cvt_e4m3x2(s[0], s[1]) | (cvt_e4m3x2(s[2], s[3]) << 16),
                    cvt_e4m3x2(s[4], s[5]) | (cvt_e4m3x2(s[6], s[7]) << 16));
}

}  // namespace wan::cuda
