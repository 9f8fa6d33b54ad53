// The e4m3 pair conversion of the FP8 quantisers (fp8_quant.cu, attention_fp8_quant.cu), one definition so
// that every quantising kernel agrees bit for bit with wan::f32_to_f8e4m3 (core/dtype.h). Include only
// from .cu files.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "core/dtype.h"

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

}  // namespace wan::cuda
