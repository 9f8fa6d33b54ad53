// Row-wise FP8 (e4m3fn) quantisation on the GPU: q [rows, K] bytes and scale [rows] fp32 from a bf16 or
// fp32 matrix, bit-identical to ops::quantize_rows_fp8 (the scheme of core/fp8_rows.h), for the FP8
// GEMM of kernels/gemm.h (activations per token, weights per output channel); a dequantiser for tests.
// Invariants: one block per row; when K % 8 == 0 and x is 16-byte and q 8-byte aligned (every model
// shape), each thread keeps its 8-element chunks in registers between the amax reduction and the
// conversion, so x is read once and q written once (memory-bound: bytes = rows·K·(sizeof(x) + 1) + 4·rows);
// other K (odd, unaligned, or above 32768) take a scalar kernel that reads the row twice (the second
// read hits L2). amax is an integer max of magnitude bits, so the result does not depend on the launch
// shape. On sm_89+ the conversion is the hardware's cvt.rn.satfinite.e4m3x2.f32 (sign of zero forced
// from the input), proved equal to wan::f32_to_f8e4m3 on every fp32 value the scheme can feed it by
// check_e4m3_conversion (tests/gpu/test_fp8_quant.cu); older GPUs run f32_to_f8e4m3 itself.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace wan::cuda {

// q [rows, K], scale [rows] <- x [rows, K] row-major. rows >= 0 (0: no-op), K >= 1.
void quantize_rows_fp8(const __nv_bfloat16* x, int64_t rows, int64_t K, uint8_t* q, float* scale,
                       cudaStream_t stream);
void quantize_rows_fp8(const float* x, int64_t rows, int64_t K, uint8_t* q, float* scale, cudaStream_t stream);

// y [rows, K] fp32 = f8e4m3_to_f32(q) · scale[row] (tests and error reports).
void dequantize_rows_fp8(const uint8_t* q, const float* scale, int64_t rows, int64_t K, float* y,
                         cudaStream_t stream);

// The quantiser's conversion against wan::f32_to_f8e4m3 for every fp32 bit pattern b in [begin, end) (as
// both lanes of the paired conversion, with -b's pattern in the other lane). Synchronises the stream.
struct E4m3CvtCheck {
  uint64_t checked = 0, mismatches = 0;
  uint32_t first_mismatch = 0xFFFFFFFFu;  // smallest mismatching pattern (0xFFFFFFFF: none)
};
E4m3CvtCheck check_e4m3_conversion(uint32_t begin, uint32_t end, cudaStream_t stream);

}  // namespace wan::cuda
