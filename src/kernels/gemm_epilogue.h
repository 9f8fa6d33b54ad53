// The FP8 GEMM's separate epilogue (kernels/gemm.h): y[M, N] = act(y + bias[N]) in place, for the
// (bias, activation) combinations cuBLASLt does not fuse with outer-vector FP8 scaling on a device.
// Numerics: y (bf16 or fp32) and the bf16 bias are read exactly, summed and activated in fp32 (GELU-tanh:
// 0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³)))), rounded once to y's type. With a bf16 y the GEMM output
// was already rounded once, so this path has two roundings where the fused epilogue has one.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace wan::cuda {

// bias may be null (activation only). M, N >= 0.
void bias_act_rows(__nv_bfloat16* y, const __nv_bfloat16* bias, int64_t M, int64_t N, bool gelu,
                   cudaStream_t stream);
void bias_act_rows(float* y, const __nv_bfloat16* bias, int64_t M, int64_t N, bool gelu, cudaStream_t stream);

}  // namespace wan::cuda
