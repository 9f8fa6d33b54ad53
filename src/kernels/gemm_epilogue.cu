// The separate bias + activation epilogue of the FP8 GEMM (see gemm_epilogue.h): each thread owns one
// column (its bias read once) and walks rows blockIdx.y, blockIdx.y + gridDim.y, ...: coalesced rows,
// no per-element index division.
#include "kernels/gemm_epilogue.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/check.h"

namespace wan::cuda {
namespace {

__device__ __forceinline__ float gelu_tanh(float v) {
  return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }

template <typename T>
__global__ void bias_act_kernel(T* __restrict__ y, const __nv_bfloat16* __restrict__ bias, int64_t M, int64_t N,
                                bool gelu) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float b = bias ? __bfloat162float(bias[n]) : 0.0f;
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
    T* p = y + m * N + n;
    float v = load(p);
    if (bias) v += b;
    if (gelu) v = gelu_tanh(v);
    store(p, v);
  }
}

template <typename T>
void launch(T* y, const __nv_bfloat16* bias, int64_t M, int64_t N, bool gelu, cudaStream_t stream) {
  WAN_CHECK(M >= 0 && N >= 0, "bias_act_rows: bad shape M ", M, " N ", N);
  if (M == 0 || N == 0 || (!bias && !gelu)) return;
  WAN_CHECK(y, "bias_act_rows: null y");
  // About 2^20 threads in flight whatever the shape; rows beyond grid.y are looped over.
  const int64_t col_blocks = (N + 255) / 256;
  const int64_t row_blocks = std::clamp<int64_t>(4096 / col_blocks, 1, std::min<int64_t>(M, 65535));
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
  bias_act_kernel<T><<<grid, 256, 0, stream>>>(y, bias, M, N, gelu);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void bias_act_rows(__nv_bfloat16* y, const __nv_bfloat16* bias, int64_t M, int64_t N, bool gelu,
                   cudaStream_t stream) {
  launch(y, bias, M, N, gelu, stream);
}
void bias_act_rows(float* y, const __nv_bfloat16* bias, int64_t M, int64_t N, bool gelu, cudaStream_t stream) {
  launch(y, bias, M, N, gelu, stream);
}

}  // namespace wan::cuda
