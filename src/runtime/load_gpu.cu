// The conversion kernel of the streaming weight upload (load_gpu.h): one staging chunk of any float
// dtype -> bf16 or f32 weights, optionally times the fp8_scaled scale.
// Numerics: the scalar conversions of core/dtype.h (the host's, bit for bit), the scale as one
// correctly rounded fp32 multiply (__fmul_rn: no contraction), then one rounding to the destination.
// NaN inputs keep the bits the x86 host path gives them (fp64 narrowing, the scale multiply).
// Each thread converts 8 consecutive elements: 8..64 source bytes read and 16 or 32 destination bytes
// written with 16-byte (fp8: 8-byte) vector accesses when both pointers allow it, element by element
// for the tail and for unaligned pointers.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "runtime/load_gpu.h"

namespace wan::cuda {
namespace {

constexpr int kPerThread = 8;
constexpr int kThreads = 256;

// Element i of a source array as f32.
template <DType S>
__device__ __forceinline__ float to_f32(const void* p, int64_t i);
template <>
__device__ __forceinline__ float to_f32<DType::F32>(const void* p, int64_t i) {
  return static_cast<const float*>(p)[i];
}
template <>
__device__ __forceinline__ float to_f32<DType::F64>(const void* p, int64_t i) {
  const double d = static_cast<const double*>(p)[i];
  if (d != d) {  // NaN as the host (x86 cvtsd2ss) converts it: quiet, the payload's top bits kept
    const unsigned long long b = static_cast<unsigned long long>(__double_as_longlong(d));
    const uint32_t sign = static_cast<uint32_t>(b >> 63) << 31;
    return __int_as_float(static_cast<int>(sign | 0x7FC00000u | static_cast<uint32_t>((b >> 29) & 0x3FFFFFu)));
  }
  return __double2float_rn(d);  // = static_cast<float> on the host
}

// x * scale as the host computes it (x86: a NaN operand comes back quieted with its payload; the GPU's
// multiply would return the canonical NaN).
__device__ __forceinline__ float scale_like_host(float x, float scale) {
  return x != x ? __int_as_float(__float_as_int(x) | 0x400000) : __fmul_rn(x, scale);
}
template <>
__device__ __forceinline__ float to_f32<DType::F16>(const void* p, int64_t i) {
  return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}
template <>
__device__ __forceinline__ float to_f32<DType::BF16>(const void* p, int64_t i) {
  return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}
template <>
__device__ __forceinline__ float to_f32<DType::F8E4M3>(const void* p, int64_t i) {
  return f8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
}
template <>
__device__ __forceinline__ float to_f32<DType::F8E5M2>(const void* p, int64_t i) {
  return f8e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
}

constexpr int dsize(DType t) {
  return t == DType::F64 ? 8 : t == DType::F32 ? 4 : (t == DType::F16 || t == DType::BF16) ? 2 : 1;
}

// Loads 8 source elements starting at element i (a multiple of 8) as raw words into `w` (vector path).
template <DType S>
__device__ __forceinline__ void load8(const void* src, int64_t i, uint4 (&w)[4]) {
  constexpr int bytes = dsize(S) * kPerThread;  // 8, 16, 32 or 64
  const char* p = static_cast<const char*>(src) + i * dsize(S);
  if constexpr (bytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = make_uint4(v.x, v.y, 0, 0);
  } else {
#pragma unroll
    for (int k = 0; k < bytes / 16; ++k) w[k] = reinterpret_cast<const uint4*>(p)[k];
  }
}

template <DType S, DType D>
__global__ void convert_kernel(const void* __restrict__ src, void* __restrict__ dst, int64_t n, int scaled,
                               float scale, int vector_ok) {
  const int64_t groups = (n + kPerThread - 1) / kPerThread;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = g * kPerThread;
    float v[kPerThread];
    const bool full = vector_ok && i0 + kPerThread <= n;
    if (full) {
      uint4 w[4];
      load8<S>(src, i0, w);
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) v[k] = to_f32<S>(w, k);
    } else {
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) v[k] = i0 + k < n ? to_f32<S>(src, i0 + k) : 0.0f;
    }
    if (scaled) {
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) v[k] = scale_like_host(v[k], scale);
    }
    if constexpr (D == DType::BF16) {
      uint16_t* out = static_cast<uint16_t*>(dst);
      if (full) {
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          h[k] = static_cast<uint32_t>(f32_to_bf16(v[2 * k])) | (static_cast<uint32_t>(f32_to_bf16(v[2 * k + 1])) << 16);
        *reinterpret_cast<uint4*>(out + i0) = make_uint4(h[0], h[1], h[2], h[3]);
      } else {
        for (int k = 0; k < kPerThread && i0 + k < n; ++k) out[i0 + k] = f32_to_bf16(v[k]);
      }
    } else {
      float* out = static_cast<float*>(dst);
      if (full) {
        reinterpret_cast<float4*>(out + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(out + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
      } else {
        for (int k = 0; k < kPerThread && i0 + k < n; ++k) out[i0 + k] = v[k];
      }
    }
  }
}

template <DType S, DType D>
void launch(const void* src, void* dst, int64_t n, bool scaled, float scale, cudaStream_t stream) {
  const bool vector_ok = reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t groups = (n + kPerThread - 1) / kPerThread;
  const int64_t blocks = std::min<int64_t>((groups + kThreads - 1) / kThreads, 132 * 16);
  convert_kernel<S, D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, dst, n, scaled ? 1 : 0, scale,
                                                                             vector_ok ? 1 : 0);
  CUDA_CHECK_LAUNCH();
}

template <DType D>
void launch_for(const void* src, DType s, void* dst, int64_t n, bool scaled, float scale, cudaStream_t stream) {
  switch (s) {
    case DType::F32: return launch<DType::F32, D>(src, dst, n, scaled, scale, stream);
    case DType::F64: return launch<DType::F64, D>(src, dst, n, scaled, scale, stream);
    case DType::F16: return launch<DType::F16, D>(src, dst, n, scaled, scale, stream);
    case DType::BF16: return launch<DType::BF16, D>(src, dst, n, scaled, scale, stream);
    case DType::F8E4M3: return launch<DType::F8E4M3, D>(src, dst, n, scaled, scale, stream);
    case DType::F8E5M2: return launch<DType::F8E5M2, D>(src, dst, n, scaled, scale, stream);
    default: WAN_THROW("weight upload: cannot convert ", dtype_name(s), " weights (not a float type)");
  }
}

__global__ void fill_kernel(float* __restrict__ p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

}  // namespace

void row_scales_fill(float* scales, int64_t rows, float scale, cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t blocks = std::min<int64_t>((rows + kThreads - 1) / kThreads, 1024);
  fill_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(scales, rows, scale);
  CUDA_CHECK_LAUNCH();
}

void convert_weights(const void* src, DType src_type, bool scaled, float scale, void* dst, DType dst_type, int64_t n,
                     cudaStream_t stream) {
  if (n <= 0) return;
  if (dst_type == DType::BF16) return launch_for<DType::BF16>(src, src_type, dst, n, scaled, scale, stream);
  if (dst_type == DType::F32) return launch_for<DType::F32>(src, src_type, dst, n, scaled, scale, stream);
  WAN_THROW("weight upload: destination dtype ", dtype_name(dst_type), " (expected bf16 or f32)");
}

}  // namespace wan::cuda
