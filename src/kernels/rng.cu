// Kernels: grid-stride fills from the counter-based RNG (one Philox call per element).
#include "core/dtype.h"
#include "core/philox.h"
#include "kernels/check.h"
#include "kernels/rng.h"

namespace wan::cuda {
namespace {
__global__ void normal_fill_kernel(float* dst, size_t n, uint64_t seed, uint64_t offset) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = philox_normal(seed, offset + i);
}
__global__ void normal_fill_bf16_kernel(uint16_t* dst, size_t n, uint64_t seed, uint64_t offset, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = f32_to_bf16(__fmul_rn(philox_normal(seed, offset + i), scale));
}
unsigned grid_for(size_t n) {
  size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks > 65535 * 8 ? 65535 * 8 : (blocks == 0 ? 1 : blocks));
}
}  // namespace

void philox_normal_fill(float* dst, size_t n, uint64_t seed, uint64_t offset, cudaStream_t stream) {
  if (n == 0) return;
  normal_fill_kernel<<<grid_for(n), 256, 0, stream>>>(dst, n, seed, offset);
  CUDA_CHECK_LAUNCH();
}
void philox_normal_fill_bf16(uint16_t* dst, size_t n, uint64_t seed, uint64_t offset, float scale,
                             cudaStream_t stream) {
  if (n == 0) return;
  normal_fill_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(dst, n, seed, offset, scale);
  CUDA_CHECK_LAUNCH();
}
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}
}  // namespace wan::cuda
