// Grid-stride elementwise kernels for drawing random DiT weights (see dit_gpu_kernels.h).
#include "kernels/check.h"
#include "kernels/affine.h"

namespace wan::cuda::dit_gpu_detail {
namespace {

__global__ void affine_f32_kernel(float* x, int64_t n, float scale, float offset) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __fadd_rn(__fmul_rn(x[i], scale), offset);
}

__global__ void affine_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t n, float scale, float offset) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x[i], scale), offset));
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

}  // namespace

void affine_f32(float* x, int64_t n, float scale, float offset, cudaStream_t stream) {
  if (n <= 0) return;
  affine_f32_kernel<<<grid_for(n), 256, 0, stream>>>(x, n, scale, offset);
  CUDA_CHECK_LAUNCH();
}

void affine_f32_to_bf16(const float* x, __nv_bfloat16* y, int64_t n, float scale, float offset, cudaStream_t stream) {
  if (n <= 0) return;
  affine_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(x, y, n, scale, offset);
  CUDA_CHECK_LAUNCH();
}

}  // namespace wan::cuda::dit_gpu_detail
