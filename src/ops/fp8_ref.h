// CPU reference of the FP8 (e4m3fn) path: row-wise quantisation and dequantisation (the scheme of
// core/fp8_rows.h, shared bit for bit with kernels/fp8_quant.h) and the scaled FP8 Linear that
// GemmRunner::linear_fp8 (kernels/gemm.h) runs through cuBLASLt's outer-vector scaling.
// Layouts: row-major, q [rows, K] one e4m3 byte per element, scale [rows] fp32. Weights [N, K] get one
// scale per output channel, activations [M, K] one per token: the same function serves both.
// Invariants: results do not depend on the thread count (rows are independent; the Linear's sums are
// exact, see linear_fp8_ref).
#pragma once
#include <cstdint>

namespace wan::ops {

// q, scale <- x [rows, K] fp32 (any values; see core/fp8_rows.h for zero, tiny and non-finite rows).
void quantize_rows_fp8(const float* x, int64_t rows, int64_t K, uint8_t* q, float* scale);
// Same from bf16 bit patterns (exactly their fp32 values).
void quantize_rows_fp8(const uint16_t* x, int64_t rows, int64_t K, uint8_t* q, float* scale);
// y [rows, K] = f8e4m3_to_f32(q) · scale[row] (one fp32 multiply).
void dequantize_rows_fp8(const uint8_t* q, const float* scale, int64_t rows, int64_t K, float* y);

// y [M, N] = act(scale_x[m] · scale_w[n] · Σ_k e4m3(xq[m, k]) · e4m3(wq[n, k]) + bias[n]) in fp32:
// the sum is exact (each product is a multiple of 2^-18 below 2^18, so a double holds every partial
// sum exactly for K <= 2^17), rounded once to fp32, then s = scale_x[m] · scale_w[n] (fp32), y = s · sum,
// + bias (may be null), then GELU-tanh when gelu (ops::gelu_tanh, the formula of kernels/gemm.h).
void linear_fp8_ref(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                    const float* bias, float* y, int64_t M, int64_t K, int64_t N, bool gelu);

}  // namespace wan::ops
