// The e4m3 pair conversion of the FP8 quantisers (fp8_quant.cu, attention_fp8_quant.cu, the LayerNorms
// of dit_norm.cu), one definition so that every quantising kernel agrees bit for bit with
// wan::f32_to_f8e4m3 (core/dtype.h), and eight elements of a row to bytes under core/fp8_rows.h's
// scheme (the row's amax: block_reduce.cuh with MaxU32Op). Include only from .cu files.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/fp8_rows.h"
#include "kernels/block_reduce.cuh"

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
