// The GPU text encoder's memory-bound kernels (see t5_gpu_kernels.h for the numerics).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/device_vec.h"
#include "kernels/t5_kernels.h"

namespace wan::cuda::t5_gpu_detail {

namespace {

using bf16 = __nv_bfloat16;
using dit_detail::aligned16;
using dit_detail::block_sum;
using dit_detail::blocks_for;
using dit_detail::load8;
using dit_detail::round_bf16;
using dit_detail::store8;
using dit_detail::warp_sum;

constexpr int kSoftmaxWarps = 4;                                 // rows per block (one warp each)
constexpr int kSoftmaxChunks = static_cast<int>(kMaxTokens / 8 / 32);  // 8-key chunks per lane: 2

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__global__ void embed_gather_kernel(const bf16* __restrict__ emb, const int32_t* __restrict__ ids,
                                    float* __restrict__ x, int64_t D) {
  const int64_t i = blockIdx.x;
  const bf16* src = emb + static_cast<int64_t>(ids[i]) * D;
  float* dst = x + i * D;
  for (int64_t c = threadIdx.x; c < D / 8; c += blockDim.x) {
    float v[8];
    load8(src + 8 * c, v);
    store8(dst + 8 * c, v);
  }
}

// One block per row. Pass 1 adds y (when given), writes x back and sums squares; pass 2 re-reads the
// thread's own chunks of x (its own writes) and normalises.
__global__ void add_rms_norm_kernel(float* __restrict__ x, const bf16* __restrict__ y, const float* __restrict__ w,
                                    bf16* __restrict__ out, int64_t D, float eps) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  float* xr = x + row * D;
  const int64_t chunks = D / 8;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[8];
    load8(xr + 8 * c, v);
    if (y) {
      float u[8];
      load8(y + row * D + 8 * c, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __fadd_rn(v[k], u[k]);
      store8(xr + 8 * c, v);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) ss = __fmaf_rn(v[k], v[k], ss);
  }
  ss = block_sum(ss, smem);
  const float r = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(D)), eps));
  bf16* orow = out + row * D;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[8], wv[8], o[8];
    load8(xr + 8 * c, v);
    load8(w + 8 * c, wv);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = __fmul_rn(round_bf16(__fmul_rn(v[k], r)), wv[k]);
    store8(orow + 8 * c, o);
  }
}

// gelu_tanh as the CPU reference writes it (ops::gelu_tanh), each operation correctly rounded.
__device__ __forceinline__ float gelu_tanh_f32(float v) {
  const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
  const float v3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v);
  const float t = tanhf(__fmul_rn(k0, __fadd_rn(v, v3)));
  return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, t));
}

__global__ void gelu_mul_kernel(const bf16* __restrict__ gf, bf16* __restrict__ h, int64_t L, int64_t F) {
  const int64_t cpr = F / 8;  // chunks per row
  const int64_t n = L * cpr;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = q / cpr, c = q % cpr;
    float g[8], f[8], o[8];
    load8(gf + i * 2 * F + 8 * c, g);
    load8(gf + i * 2 * F + F + 8 * c, f);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = __fmul_rn(round_bf16(gelu_tanh_f32(g[k])), f[k]);
    store8(h + i * F + 8 * c, o);
  }
}

// One warp per (head, query) row; lane l holds keys 8·(l + 32·k) .. +7, k < kSoftmaxChunks.
__global__ void softmax_bias_kernel(const float* __restrict__ S, const float* __restrict__ pos,
                                    const int32_t* __restrict__ bucket_of, bf16* __restrict__ P, int H, int L,
                                    int64_t ld) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSoftmaxWarps + warp;
  if (row >= static_cast<int64_t>(H) * L) return;  // the whole warp leaves together
  const int h = static_cast<int>(row / L), i = static_cast<int>(row % L);
  const float* sr = S + row * ld;
  float v[kSoftmaxChunks][8];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSoftmaxChunks; ++k) {
    const int c0 = 8 * (lane + 32 * k);
    if (c0 < ld) {
      load8(sr + c0, v[k]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int j = c0 + e;
        if (j < L) {
          const int b = bucket_of[j - i + kMaxTokens - 1];
          v[k][e] = __fadd_rn(v[k][e], pos[b * H + h]);
          mx = fmaxf(mx, v[k][e]);
        }
      }
    }
  }
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kSoftmaxChunks; ++k) {
    const int c0 = 8 * (lane + 32 * k);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int j = c0 + e;
      v[k][e] = j < L ? expf(__fsub_rn(v[k][e], mx)) : 0.0f;
      sum = __fadd_rn(sum, v[k][e]);
    }
  }
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  bf16* pr = P + row * ld;
#pragma unroll
  for (int k = 0; k < kSoftmaxChunks; ++k) {
    const int c0 = 8 * (lane + 32 * k);
    if (c0 < ld) {
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(v[k][e], inv);
      store8(pr + c0, o);
    }
  }
}

int row_threads_for(int64_t chunks) {
  const int64_t t = ((chunks + 3) / 4 + 31) / 32 * 32;  // about 4 chunks per thread
  return static_cast<int>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

}  // namespace

void embed_gather(const bf16* emb, const int32_t* ids, float* x, int64_t L, int64_t D, cudaStream_t s) {
  WAN_ASSERT(D % 8 == 0 && aligned16(emb) && aligned16(x), "embed_gather: D % 8 and 16-byte alignment");
  if (L <= 0) return;
  embed_gather_kernel<<<static_cast<unsigned>(L), row_threads_for(D / 8), 0, s>>>(emb, ids, x, D);
  CUDA_CHECK_LAUNCH();
}

void add_rms_norm(float* x, const bf16* y, const float* w, bf16* out, int64_t L, int64_t D, float eps,
                  cudaStream_t s) {
  WAN_ASSERT(D % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(out),
             "add_rms_norm: D % 8 and 16-byte alignment");
  if (L <= 0) return;
  add_rms_norm_kernel<<<static_cast<unsigned>(L), row_threads_for(D / 8), 0, s>>>(x, y, w, out, D, eps);
  CUDA_CHECK_LAUNCH();
}

void gelu_mul(const bf16* gf, bf16* h, int64_t L, int64_t F, cudaStream_t s) {
  WAN_ASSERT(F % 8 == 0 && aligned16(gf) && aligned16(h), "gelu_mul: F % 8 and 16-byte alignment");
  const int64_t n = L * (F / 8);
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks = std::min<unsigned>(blocks_for(n, kThreads), 132u * 16u);
  gelu_mul_kernel<<<blocks, kThreads, 0, s>>>(gf, h, L, F);
  CUDA_CHECK_LAUNCH();
}

void softmax_bias(const float* S, const float* pos, const int32_t* bucket_of, bf16* P, int64_t H, int64_t L,
                  int64_t ld, cudaStream_t s) {
  WAN_ASSERT(L >= 1 && L <= kMaxTokens && ld % 8 == 0 && ld >= L && ld <= kMaxTokens && H >= 1,
             "softmax_bias: L ", L, " ld ", ld, " H ", H);
  WAN_ASSERT(aligned16(S) && aligned16(P), "softmax_bias: 16-byte alignment");
  const unsigned blocks = blocks_for(H * L, kSoftmaxWarps);
  softmax_bias_kernel<<<blocks, 32 * kSoftmaxWarps, 0, s>>>(S, pos, bucket_of, P, static_cast<int>(H),
                                                             static_cast<int>(L), ld);
  CUDA_CHECK_LAUNCH();
}

}  // namespace wan::cuda::t5_gpu_detail
