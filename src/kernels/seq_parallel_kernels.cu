// Kernels of dit_parallel_kernels.h: 16-byte vector reshuffles (flat grids over vectors), the fp32
// log-sum-exp merge of ring attention, and the slice patchify.
#include "kernels/seq_parallel_kernels.h"

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/device_vec.h"

namespace wan::cuda {
namespace {
using namespace dit_detail;

constexpr int kThreads = 256;

unsigned grid_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  WAN_CHECK(b <= 0x7FFFFFFF, "parallel kernels: grid of ", b, " blocks is too large");
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// One thread per 16-byte vector of (j, i, r, v): v-th vector of part j of row r of tensor i.
__global__ void token_major_kernel(TokenMajor tm, char* __restrict__ chunks, int n, int64_t U, int64_t rows,
                                   int64_t W, bool to_chunks) {
  const int64_t i_vec = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vpr = W / 16;  // vectors per part
  const int64_t total = static_cast<int64_t>(n) * U * rows * vpr;
  if (i_vec >= total) return;
  const int64_t v = i_vec % vpr;
  int64_t q = i_vec / vpr;
  const int64_t r = q % rows;
  q /= rows;
  const int i = static_cast<int>(q % n);
  const int64_t j = q / n;
  char* tok = tm.t[i] + r * tm.ld_bytes[i] + j * W + v * 16;
  char* chk = chunks + ((j * n + i) * rows + r) * W + v * 16;
  if (to_chunks) *reinterpret_cast<uint4*>(chk) = *reinterpret_cast<const uint4*>(tok);
  else *reinterpret_cast<uint4*>(tok) = *reinterpret_cast<const uint4*>(chk);
}

// One thread per 16-byte vector of (j, i, b, t, v).
__global__ void seq_major_kernel(SeqMajor sm, char* __restrict__ chunks, int n, int64_t U, int64_t Bl, int64_t Lc,
                                 int64_t W, bool to_chunks) {
  const int64_t i_vec = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vpr = W / 16;
  const int64_t rows = Bl * Lc;
  const int64_t total = static_cast<int64_t>(n) * U * rows * vpr;
  if (i_vec >= total) return;
  const int64_t v = i_vec % vpr;
  int64_t q = i_vec / vpr;
  const int64_t r = q % rows;  // b·Lc + t
  q /= rows;
  const int i = static_cast<int>(q % n);
  const int64_t j = q / n;
  const int64_t b = r / Lc, t = r - b * Lc;
  char* seq = sm.s[i] + ((b * U + j) * Lc + t) * W + v * 16;
  char* chk = chunks + ((j * n + i) * rows + r) * W + v * 16;
  if (to_chunks) *reinterpret_cast<uint4*>(chk) = *reinterpret_cast<const uint4*>(seq);
  else *reinterpret_cast<uint4*>(seq) = *reinterpret_cast<const uint4*>(chk);
}

// One thread per 8 values of one (b, l, h) row of 128: 16 threads per row.
__global__ void ring_merge_kernel(const bf16* __restrict__ o_part, const float* __restrict__ lse_part,
                                  float* __restrict__ acc, float* __restrict__ acc_lse, bf16* __restrict__ out,
                                  int64_t B, int64_t Lq, int64_t H, bool first) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  constexpr int kPerRow = 128 / kChunk;
  const int64_t rows = B * Lq * H;
  if (i >= rows * kPerRow) return;
  const int64_t row = i / kPerRow;  // (b·Lq + l)·H + h
  const int64_t h = row % H, bl = row / H, l = bl % Lq, b = bl / Lq;
  const int64_t at = i * kChunk;
  const int64_t li = (b * H + h) * Lq + l;
  float o[kChunk], a[kChunk];
  load8(o_part + at, o);
  const float lb = lse_part[li];
  float lse = lb;
  if (!first) {
    load8(acc + at, a);
    const float la = acc_lse[li];
    const float m = fmaxf(la, lb);
    const float wa = expf(la - m), wb = expf(lb - m);
    const float s = wa + wb, inv = 1.0f / s;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) o[e] = (a[e] * wa + o[e] * wb) * inv;
    lse = m + logf(s);
  }
  if (out) {
    store8(out + at, o);
  } else {
    store8(acc + at, o);
    if ((i % kPerRow) == 0) acc_lse[li] = lse;
  }
}

__global__ void patchify_slice_kernel(const float* __restrict__ x, bf16* __restrict__ rows, int64_t B, int64_t C,
                                      int64_t T, int64_t H, int64_t W, int pt, int ph, int pw, int64_t f, int64_t h,
                                      int64_t w, int64_t K, int64_t offset, int64_t S) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t groups = K / kChunk;
  if (i >= B * S * groups) return;
  const int64_t tok = i / groups;  // b·S + t
  const int64_t g = i - tok * groups;
  const int64_t b = tok / S, n = offset + (tok - b * S);
  float o[kChunk];
  if (n < f * h * w) {
    const int64_t fi = n / (h * w), hi = (n / w) % h, wi = n % w;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      int64_t k = g * kChunk + e;
      const int64_t qw = k % pw;
      k /= pw;
      const int64_t qh = k % ph;
      k /= ph;
      const int64_t qt = k % pt;
      const int64_t c = k / pt;
      o[e] = x[(((b * C + c) * T + fi * pt + qt) * H + hi * ph + qh) * W + wi * pw + qw];
    }
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) o[e] = 0.0f;
  }
  store8(rows + i * kChunk, o);
}

bool a16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void token_major_chunks(const TokenMajor& tm, char* chunks, int n, int64_t U, int64_t rows, int64_t W,
                        bool to_chunks, cudaStream_t stream) {
  WAN_CHECK(n >= 1 && n <= kMaxMovedTensors && U >= 1 && rows >= 0 && W > 0 && W % 16 == 0,
            "token_major_chunks: bad geometry n=", n, " U=", U, " rows=", rows, " W=", W);
  WAN_CHECK(a16(chunks), "token_major_chunks: chunk buffer must be 16-byte aligned");
  for (int i = 0; i < n; ++i)
    WAN_CHECK(tm.t[i] && a16(tm.t[i]) && tm.ld_bytes[i] % 16 == 0 && tm.ld_bytes[i] >= U * W,
              "token_major_chunks: tensor ", i, " null, unaligned or with a row stride ", tm.ld_bytes[i],
              " below ", U * W, " bytes");
  const int64_t total = static_cast<int64_t>(n) * U * rows * (W / 16);
  if (total == 0) return;
  token_major_kernel<<<grid_for(total), kThreads, 0, stream>>>(tm, chunks, n, U, rows, W, to_chunks);
  CUDA_CHECK_LAUNCH();
}

void seq_major_chunks(const SeqMajor& sm, char* chunks, int n, int64_t U, int64_t Bl, int64_t Lc, int64_t W,
                      bool to_chunks, cudaStream_t stream) {
  WAN_CHECK(n >= 1 && n <= kMaxMovedTensors && U >= 1 && Bl >= 1 && Lc >= 1 && W > 0 && W % 16 == 0,
            "seq_major_chunks: bad geometry n=", n, " U=", U, " Bl=", Bl, " Lc=", Lc, " W=", W);
  WAN_CHECK(a16(chunks), "seq_major_chunks: chunk buffer must be 16-byte aligned");
  for (int i = 0; i < n; ++i) WAN_CHECK(sm.s[i] && a16(sm.s[i]), "seq_major_chunks: tensor ", i, " null or unaligned");
  const int64_t total = static_cast<int64_t>(n) * U * Bl * Lc * (W / 16);
  seq_major_kernel<<<grid_for(total), kThreads, 0, stream>>>(sm, chunks, n, U, Bl, Lc, W, to_chunks);
  CUDA_CHECK_LAUNCH();
}

void ring_merge(const bf16* o_part, const float* lse_part, float* acc, float* acc_lse, bf16* out, int64_t B,
                int64_t Lq, int64_t H, bool first, cudaStream_t stream) {
  WAN_CHECK(B >= 1 && Lq >= 1 && H >= 1, "ring_merge: bad shape B=", B, " Lq=", Lq, " H=", H);
  WAN_CHECK(o_part && lse_part && a16(o_part) && (out || (acc && acc_lse)) && (first || (acc && acc_lse)),
            "ring_merge: null or unaligned buffer");
  WAN_CHECK((!acc || a16(acc)) && (!out || a16(out)), "ring_merge: unaligned buffer");
  const int64_t total = B * Lq * H * (128 / kChunk);
  ring_merge_kernel<<<grid_for(total), kThreads, 0, stream>>>(o_part, lse_part, acc, acc_lse, out, B, Lq, H, first);
  CUDA_CHECK_LAUNCH();
}

void patchify_slice_bf16(const float* x, bf16* rows, int64_t B, int64_t C, int64_t T, int64_t H, int64_t W, int pt,
                         int ph, int pw, int64_t offset, int64_t S, cudaStream_t stream) {
  const int64_t K = C * pt * ph * pw;
  WAN_CHECK(K % kChunk == 0, "patchify_slice_bf16: patch features ", K, " must be a multiple of 8");
  WAN_CHECK(x && rows && a16(rows) && offset >= 0 && S >= 1 && B >= 1, "patchify_slice_bf16: bad arguments");
  const int64_t total = B * S * (K / kChunk);
  patchify_slice_kernel<<<grid_for(total), kThreads, 0, stream>>>(x, rows, B, C, T, H, W, pt, ph, pw, T / pt, H / ph,
                                                                   W / pw, K, offset, S);
  CUDA_CHECK_LAUNCH();
}

}  // namespace wan::cuda
