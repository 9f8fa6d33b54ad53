// Warp and block reductions of the row kernels (LayerNorms' sums, FP8 quantisers' amax), one definition
// so that every kernel reduces in the same fixed order (deterministic, independent of timing). Include
// only from .cu files.
#pragma once
#include <cuda_runtime.h>

namespace wan::cuda {

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Over the block, returned to every thread: each warp's result to smem, then every warp reduces
// those (identity past the last warp). blockDim.x must be a multiple of 32 (at most 1024); smem holds
// 32 values. The trailing barrier lets the caller reuse smem for the next reduction.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* smem, T identity, Op op) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  T t = lane < nwarps ? smem[lane] : identity;
  t = warp_reduce(t, op);
  __syncthreads();
  return t;
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxU32Op {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};

}  // namespace wan::cuda
