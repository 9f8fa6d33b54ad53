// Internal to the GPU text encoder (t5_gpu.cpp): its memory-bound kernels (t5_gpu_kernels.cu) and the
// relative-position bucket. Exposed only for t5_gpu.cpp and tests/gpu/test_t5_gpu.cu.
//
// Numerics (see t5_gpu.h for where each one sits in the block):
// - embed_gather: bf16 -> fp32 is exact;
// - add_rms_norm: x += y as one fp32 add per element (written back: the fp32 residual), then
//   r = 1 / sqrt(mean(x²) + eps) in fp32 (fixed reduction order), out = bf16(bf16(x·r)·w): the
//   normalised value is rounded to bf16 before the weight multiply, as the reference's T5LayerNorm
//   (`x.type_as(weight)` then `weight * x`), and the product rounded once more;
// - gelu_mul: h = bf16(bf16(gelu_tanh(g))·f) with g, f bf16 and the GELU evaluated in fp32 (tanhf):
//   the reference's `fc1(x) * gate(x)` with gate = GELU(Linear) in bf16 rounds the GELU output and
//   the product; the GELU's own intermediates are kept in fp32 here (closer to exact);
// - softmax_bias: p = bf16(e_j / Σe) with e_j = exp(s_j + bias_j − max) over the first L keys, all fp32
//   (expf, not __expf), warp-shuffle sums in a fixed order.
// Invariants: row widths are multiples of 8 and the pointers 16-byte aligned (16-byte vector loads
// and stores throughout); every kernel is deterministic (no atomics).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace wan::cuda::t5_gpu_detail {

constexpr int64_t kMaxTokens = 512;  // longest prompt (the tokenizer's max_length)

// x[i, :] = fp32(emb[ids[i], :]) for i < L. D % 8 == 0. ids must already be checked (in range).
void embed_gather(const __nv_bfloat16* emb, const int32_t* ids, float* x, int64_t L, int64_t D, cudaStream_t s);

// Per row i < L of x [L, D]: when y is non-null x += fp32(y) (written back); then
// out = bf16(bf16(x·r)·w), r = 1/sqrt(mean(x²) + eps). D % 8 == 0.
void add_rms_norm(float* x, const __nv_bfloat16* y, const float* w, __nv_bfloat16* out, int64_t L, int64_t D,
                  float eps, cudaStream_t s);

// gf [L, 2F] = [gate | fc1] (the fused GEMM's output); h [L, F] = bf16(bf16(gelu_tanh(gate))·fc1).
// F % 8 == 0.
void gelu_mul(const __nv_bfloat16* gf, __nv_bfloat16* h, int64_t L, int64_t F, cudaStream_t s);

// S [H, L, ld] fp32 scores (q·kᵀ, no scaling); pos [num_buckets, H] fp32 (one layer's table);
// bucket_of[r + kMaxTokens − 1] = bucket of r for r in (−kMaxTokens, kMaxTokens).
// P [H, L, ld] bf16: softmax over the keys j < L of S + pos[bucket_of(j − i), h]; P's columns L..ld
// are written as 0. 1 <= L <= kMaxTokens, ld % 8 == 0, ld >= L.
void softmax_bias(const float* S, const float* pos, const int32_t* bucket_of, __nv_bfloat16* P, int64_t H,
                  int64_t L, int64_t ld, cudaStream_t s);

}  // namespace wan::cuda::t5_gpu_detail
