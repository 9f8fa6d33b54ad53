// Elementwise and gather kernels of the DiT: gated and plain residual adds on the fp32 residual stream,
// the sinusoidal time embedding (float64) and SiLU, patch-embedding im2col to bf16, unpatchify, and
// fp32 <-> bf16 conversion. Each thread handles one 8-element chunk (16-byte bf16 vector, two 16-byte
// fp32 vectors); grids are flat over chunks, so any row count works.
// Invariants: see dit_kernels.h. Residual arithmetic is `x + y·gate` with the product and the sum each
// rounded to fp32 (no FMA), gate = base + e rounded first: the reference's order, bit for bit
// (gated_add8 / add8 of device_vec.h, which the adds fused into a LayerNorm, dit_norm.cu, share).
#include <cmath>

#include "kernels/check.h"
#include "kernels/device_vec.h"
#include "kernels/dit_kernels.h"

namespace wan::cuda {
namespace {
using namespace dit_detail;

constexpr int kThreads = 256;

// ---- residual adds ----

// x[r, :] += y[r, :]·gate_r over rows·chunks chunks of one row width D = chunks_per_row·8.
__global__ void gated_residual_kernel(float* __restrict__ x, const bf16* __restrict__ y, int64_t total,
                                      int64_t chunks_per_row, ModVec gate) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / chunks_per_row;
  const int64_t col = (i - r * chunks_per_row) * kChunk;
  const int64_t at = i * kChunk;  // = r·D + col
  float xv[kChunk], yv[kChunk], g[kChunk];
  load8(x + at, xv);
  load8(y + at, yv);
  mod8(gate.base, gate.e_row(r), col, g);
  gated_add8(xv, yv, g);
  store8(x + at, xv);
}

// x[i] += y[i]; kVec: pointers 16-byte aligned, full chunks use vectors, the tail is scalar.
template <bool kVec>
__global__ void residual_add_kernel(float* __restrict__ x, const bf16* __restrict__ y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t at = i * kChunk;
  if (at >= n) return;
  if (kVec && at + kChunk <= n) {
    float xv[kChunk], yv[kChunk];
    load8(x + at, xv);
    load8(y + at, yv);
    add8(xv, yv);
    store8(x + at, xv);
  } else {
    for (int64_t j = at; j < n && j < at + kChunk; ++j) x[j] = __fadd_rn(x[j], __bfloat162float(y[j]));
  }
}

// ---- time embedding ----

// One thread per (row, 4 frequencies): out[row, k0..k0+3] = cos, out[row, half + k0..] = sin.
__global__ void timestep_embedding_kernel(const float* __restrict__ t, int64_t n, int64_t half,
                                          float* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t groups = half / 4;
  if (i >= n * groups) return;
  const int64_t row = i / groups;
  const int64_t k0 = (i - row * groups) * 4;
  const double ti = t[row];
  float c[4], s[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // The reference's float64 expression: 10000^(-k/half), then t·ω, then cos/sin, one fp32 rounding.
    const double omega = pow(10000.0, -(static_cast<double>(k0 + q) / static_cast<double>(half)));
    double sd, cd;
    sincos(ti * omega, &sd, &cd);
    c[q] = static_cast<float>(cd);
    s[q] = static_cast<float>(sd);
  }
  float* o = out + row * 2 * half + k0;
  __stwb(reinterpret_cast<float4*>(o), make_float4(c[0], c[1], c[2], c[3]));
  __stwb(reinterpret_cast<float4*>(o + half), make_float4(s[0], s[1], s[2], s[3]));
}

__device__ __forceinline__ float silu1(float v) { return __fdiv_rn(v, __fadd_rn(1.0f, expf(-v))); }

template <bool kVec>
__global__ void silu_kernel(const float* x, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t at = i * 4;
  if (at >= n) return;
  if (kVec && at + 4 <= n) {
    float4 v = *reinterpret_cast<const float4*>(x + at);
    v = make_float4(silu1(v.x), silu1(v.y), silu1(v.z), silu1(v.w));
    __stwb(reinterpret_cast<float4*>(y + at), v);
  } else {
    for (int64_t j = at; j < n && j < at + 4; ++j) y[j] = silu1(x[j]);
  }
}

// ---- patchify / unpatchify ----

struct PatchDims {
  int64_t B, C, T, H, W, S, f, h, w, K;
  int pt, ph, pw;
};

// One thread per (sample, token, 8 features): gathers the patch values and stores one 16-byte vector.
__global__ void patchify_kernel(const float* __restrict__ x, bf16* __restrict__ rows, PatchDims d) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t groups = d.K / kChunk;
  if (i >= d.B * d.S * groups) return;
  const int64_t tok = i / groups;  // b·S + n
  const int64_t g = i - tok * groups;
  const int64_t b = tok / d.S, n = tok - b * d.S;
  float o[kChunk];
  if (n < d.f * d.h * d.w) {
    const int64_t fi = n / (d.h * d.w), hi = (n / d.w) % d.h, wi = n % d.w;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      int64_t k = g * kChunk + e;
      const int64_t qw = k % d.pw;
      k /= d.pw;
      const int64_t qh = k % d.ph;
      k /= d.ph;
      const int64_t qt = k % d.pt;
      const int64_t c = k / d.pt;
      o[e] = x[(((b * d.C + c) * d.T + fi * d.pt + qt) * d.H + hi * d.ph + qh) * d.W + wi * d.pw + qw];
    }
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) o[e] = 0.0f;
  }
  store8(rows + i * kChunk, o);
}

// One thread per kVec consecutive output pixels along the width (kVec = 4: one 16-byte store).
template <int kVec>
__global__ void unpatchify_kernel(const float* __restrict__ rows, float* __restrict__ out, PatchDims d) {
  const int64_t To = d.f * d.pt, Ho = d.h * d.ph, Wo = d.w * d.pw;
  const int64_t xgroups = Wo / kVec;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= d.B * d.C * To * Ho * xgroups) return;
  int64_t t = i;
  const int64_t xg = t % xgroups;
  t /= xgroups;
  const int64_t yy = t % Ho;
  t /= Ho;
  const int64_t tt = t % To;
  t /= To;
  const int64_t c = t % d.C;
  const int64_t b = t / d.C;
  const int64_t fi = tt / d.pt, qt = tt % d.pt, hi = yy / d.ph, qh = yy % d.ph;
  float v[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const int64_t xx = xg * kVec + e;
    const int64_t wi = xx / d.pw, qw = xx % d.pw;
    const int64_t n = (fi * d.h + hi) * d.w + wi;
    v[e] = rows[(b * d.S + n) * d.K + ((qt * d.ph + qh) * d.pw + qw) * d.C + c];
  }
  if constexpr (kVec == 4) {
    __stwb(reinterpret_cast<float4*>(out + i * 4), make_float4(v[0], v[1], v[2], v[3]));
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[i * kVec + e] = v[e];
  }
}

// ---- conversions ----

template <bool kVec>
__global__ void f32_to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, int64_t n) {
  const int64_t at = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kChunk;
  if (at >= n) return;
  if (kVec && at + kChunk <= n) {
    float v[kChunk];
    load8(x + at, v);
    store8(y + at, v);
  } else {
    for (int64_t j = at; j < n && j < at + kChunk; ++j) y[j] = __float2bfloat16_rn(x[j]);
  }
}

template <bool kVec>
__global__ void bf16_to_f32_kernel(const bf16* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t at = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kChunk;
  if (at >= n) return;
  if (kVec && at + kChunk <= n) {
    float v[kChunk];
    load8(x + at, v);
    store8(y + at, v);
  } else {
    for (int64_t j = at; j < n && j < at + kChunk; ++j) y[j] = __bfloat162float(x[j]);
  }
}

// Grid for a flat kernel over `work` threads.
unsigned grid1(int64_t work) { return blocks_for(work, kThreads); }

}  // namespace

void gated_residual_add(float* x, const bf16* y, int64_t rows, int64_t D, const ModVec& gate, cudaStream_t stream) {
  WAN_CHECK(D > 0 && D % kChunk == 0, "gated_residual_add: width ", D, " must be a positive multiple of 8");
  WAN_CHECK(aligned16(x) && aligned16(y), "gated_residual_add: x and y must be 16-byte aligned");
  WAN_CHECK(gate.base == nullptr || aligned16(gate.base), "gated_residual_add: gate base not 16-byte aligned");
  WAN_CHECK(gate.e == nullptr || (aligned16(gate.e) && gate.rows_per_e >= 1 && gate.e_stride % 4 == 0),
            "gated_residual_add: bad gate e (alignment, rows_per_e ", gate.rows_per_e, ", e_stride ", gate.e_stride,
            ")");
  WAN_CHECK(gate.e_first == nullptr ||
                (gate.e && aligned16(gate.e_first) && gate.first_tokens >= 0 && gate.token0 >= 0),
            "gated_residual_add: bad first-frame gate (e_first needs e and 16-byte alignment; first_tokens ",
            gate.first_tokens, ", token0 ", gate.token0, ")");
  const int64_t total = rows * (D / kChunk);
  if (total == 0) return;
  gated_residual_kernel<<<grid1(total), kThreads, 0, stream>>>(x, y, total, D / kChunk, gate);
  CUDA_CHECK_LAUNCH();
}

void residual_add(float* x, const bf16* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t work = (n + kChunk - 1) / kChunk;
  if (aligned16(x) && aligned16(y))
    residual_add_kernel<true><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  else
    residual_add_kernel<false><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH();
}

void timestep_embedding(const float* t, int64_t n, int64_t dim, float* out, cudaStream_t stream) {
  WAN_CHECK(dim > 0 && dim % 8 == 0, "timestep_embedding: dim ", dim, " must be a positive multiple of 8");
  WAN_CHECK(aligned16(out), "timestep_embedding: out must be 16-byte aligned");
  const int64_t work = n * (dim / 8);
  if (work == 0) return;
  timestep_embedding_kernel<<<grid1(work), kThreads, 0, stream>>>(t, n, dim / 2, out);
  CUDA_CHECK_LAUNCH();
}

void silu(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t work = (n + 3) / 4;
  if (aligned16(x) && aligned16(y))
    silu_kernel<true><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  else
    silu_kernel<false><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH();
}

void patchify_bf16(const float* x, bf16* rows, int64_t B, int64_t C, int64_t T, int64_t H, int64_t W, int pt,
                   int ph, int pw, int64_t S, cudaStream_t stream) {
  WAN_CHECK(pt >= 1 && ph >= 1 && pw >= 1 && T % pt == 0 && H % ph == 0 && W % pw == 0, "patchify_bf16: [", C,
            ", ", T, ", ", H, ", ", W, "] is not a whole number of (", pt, ", ", ph, ", ", pw, ") patches");
  const PatchDims d{B, C, T, H, W, S, T / pt, H / ph, W / pw, C * pt * ph * pw, pt, ph, pw};
  WAN_CHECK(d.K % kChunk == 0, "patchify_bf16: patch features ", d.K, " must be a multiple of 8");
  WAN_CHECK(S >= d.f * d.h * d.w, "patchify_bf16: ", d.f * d.h * d.w, " tokens do not fit the sequence of ", S);
  WAN_CHECK(aligned16(rows), "patchify_bf16: rows must be 16-byte aligned");
  const int64_t work = B * S * (d.K / kChunk);
  if (work == 0) return;
  patchify_kernel<<<grid1(work), kThreads, 0, stream>>>(x, rows, d);
  CUDA_CHECK_LAUNCH();
}

void unpatchify(const float* rows, float* out, int64_t B, int64_t S, int64_t C, int64_t f, int64_t h, int64_t w,
                int pt, int ph, int pw, cudaStream_t stream) {
  WAN_CHECK(pt >= 1 && ph >= 1 && pw >= 1 && S >= f * h * w, "unpatchify: grid (", f, ", ", h, ", ", w,
            ") does not fit the sequence of ", S);
  const PatchDims d{B, C, f * pt, h * ph, w * pw, S, f, h, w, C * pt * ph * pw, pt, ph, pw};
  const int64_t pixels = B * C * d.T * d.H * d.W;
  if (pixels == 0) return;
  if (d.W % 4 == 0 && aligned16(out))
    unpatchify_kernel<4><<<grid1(pixels / 4), kThreads, 0, stream>>>(rows, out, d);
  else
    unpatchify_kernel<1><<<grid1(pixels), kThreads, 0, stream>>>(rows, out, d);
  CUDA_CHECK_LAUNCH();
}

void convert_f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t work = (n + kChunk - 1) / kChunk;
  if (aligned16(x) && aligned16(y))
    f32_to_bf16_kernel<true><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  else
    f32_to_bf16_kernel<false><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH();
}

void convert_bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t work = (n + kChunk - 1) / kChunk;
  if (aligned16(x) && aligned16(y))
    bf16_to_f32_kernel<true><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  else
    bf16_to_f32_kernel<false><<<grid1(work), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace wan::cuda
