// Internal to the GPU DiT: the small elementwise kernels its weight drawing needs (affine.cu).
// Arithmetic is x·scale + offset as two correctly rounded fp32 operations (no FMA), so the values are
// reproducible from the CPU RNG. Any n and alignment.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace wan::cuda::dit_gpu_detail {
// x[i] = x[i]·scale + offset
void affine_f32(float* x, int64_t n, float scale, float offset, cudaStream_t stream);
// y[i] = bf16(x[i]·scale + offset)
void affine_f32_to_bf16(const float* x, __nv_bfloat16* y, int64_t n, float scale, float offset, cudaStream_t stream);
}  // namespace wan::cuda::dit_gpu_detail
