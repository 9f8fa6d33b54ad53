// Kernels of the Wan 2.1 / 2.2 VAE encoder and decoder (see vae_kernels.h for layouts and semantics).
// Row kernels (fuse) give each position a half-warp: lane l owns the 8-channel chunks l, l + 16, ...
// (16-byte loads), so rows of 96..1024 channels use 75..100 % of the lanes and every warp keeps two rows'
// loads in flight; the sum of squares is reduced with fixed xor shuffles (deterministic).
// Elementwise kernels are flat over 8-channel chunks.
#include <cmath>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/vae_kernels.h"

namespace wan::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 16;

__device__ __forceinline__ void load8(const bf16* p, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float* v) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ uint4 pack8(const float* v) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  return u;
}
__device__ __forceinline__ void store8(bf16* p, uint4 u) { *reinterpret_cast<uint4*>(p) = u; }

// v = (a + a_bias) + (r + r_bias) for the 8 channels at element `at` (channel c of the biases); r and
// the biases optional. The residual stream's value, the same fp32 adds wherever it is formed.
__device__ __forceinline__ void load_pending8(const bf16* a, const float* a_bias, const bf16* r, const float* r_bias,
                                              int64_t at, int64_t c, float* v) {
  float t[8];
  load8(a + at, v);
  if (a_bias) {
    load8(a_bias + c, t);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __fadd_rn(v[e], t[e]);
  }
  if (r) {
    float rv[8];
    load8(r + at, rv);
    if (r_bias) {
      load8(r_bias + c, t);
#pragma unroll
      for (int e = 0; e < 8; ++e) rv[e] = __fadd_rn(rv[e], t[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __fadd_rn(v[e], rv[e]);
  }
}

int64_t blocks_for(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

void check_aligned(const void* p, const char* what) {
  WAN_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "vae kernels: ", what, " is not 16-byte aligned");
}

// ---- fused residual add + RMS norm (+ SiLU) into the staging ----

struct FuseParams {
  const bf16* a;
  const float* a_bias;
  const bf16* r;
  const float* r_bias;
  bf16* x_out;
  StageDst y;
  int32_t mode;
  const float* gamma;
  int64_t P, HW;
  int32_t C;
  float scale;  // sqrt(C)
};

__device__ __forceinline__ void stage_store(const StageDst& y, int64_t s, int64_t p, int64_t HW, int64_t C, int64_t c,
                                            uint4 u) {
  if (y.kind == StageDst::Plain) {
    store8(y.base + (s * HW + p) * C + c, u);
  } else {
#pragma unroll
    for (int dt = 0; dt < 3; ++dt) {
      const int64_t t = s - dt;
      if (t >= 0 && t < y.T) store8(y.base + (t * HW + p) * 3 * C + dt * C + c, u);
    }
  }
}

template <int NIT>
__global__ void __launch_bounds__(kThreads) fuse_kernel(FuseParams q) {
  const int64_t pos = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + (threadIdx.x >> 4);
  const bool live = pos < q.P;
  const int l = threadIdx.x & 15;
  const int nch = q.C / 8;
  float v[NIT][8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < NIT; ++i) {
    const int k = l + 16 * i;
    if (live && k < nch) {
      load_pending8(q.a, q.a_bias, q.r, q.r_bias, pos * q.C + k * 8, k * 8, v[i]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = __fadd_rn(ss, __fmul_rn(v[i][e], v[i][e]));
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[i][e] = 0.0f;
    }
  }
  if (q.x_out && live) {
#pragma unroll
    for (int i = 0; i < NIT; ++i) {
      const int k = l + 16 * i;
      if (k < nch) store8(q.x_out + pos * q.C + k * 8, pack8(v[i]));
    }
  }
  if (!q.y.base) return;  // uniform over the grid: no shuffle below is left half-done
  float denom = 1.0f;
  if (q.mode != static_cast<int32_t>(NormMode::Copy)) {
#pragma unroll
    for (int off = 8; off >= 1; off >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, off, 16));
    denom = fmaxf(__fsqrt_rn(ss), 1e-12f);
  }
  if (!live) return;
  const int64_t t = pos / q.HW, p = pos - t * q.HW;
#pragma unroll
  for (int i = 0; i < NIT; ++i) {
    const int k = l + 16 * i;
    if (k >= nch) continue;
    float o[8];
    if (q.mode == static_cast<int32_t>(NormMode::Copy)) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = v[i][e];
    } else {
      float g[8];
      load8(q.gamma + k * 8, g);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float yv = __fmul_rn(__fmul_rn(__fdiv_rn(v[i][e], denom), q.scale), g[e]);
        if (q.mode == static_cast<int32_t>(NormMode::RmsSilu)) yv = __fdiv_rn(yv, __fadd_rn(1.0f, expf(-yv)));
        o[e] = yv;
      }
    }
    stage_store(q.y, q.y.s0 + t, p, q.HW, q.C, k * 8, pack8(o));
  }
}

// ---- nearest up-sampling ----

__global__ void upsample_kernel(const bf16* __restrict__ in, const float* __restrict__ bias, bf16* __restrict__ out,
                                int64_t total, int64_t H, int64_t W, int64_t C, int split) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t nch = C / 8;
  const int64_t c8 = i % nch;
  int64_t rest = i / nch;
  const int64_t ox = rest % (2 * W);
  rest /= 2 * W;
  const int64_t oy = rest % (2 * H);
  const int64_t f = rest / (2 * H);
  const int64_t t = f / split, j = f - t * split;
  const int64_t src = ((t * H + oy / 2) * W + ox / 2) * (split * C) + j * C + c8 * 8;
  uint4 u = *reinterpret_cast<const uint4*>(in + src);
  if (bias) {
    float v[8], b[8];
    load8(in + src, v);
    load8(bias + j * C + c8 * 8, b);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __fadd_rn(v[e], b[e]);
    u = pack8(v);
  }
  store8(out + i * 8, u);
}

// ---- folded staging ----

__global__ void folded_put_kernel(const bf16* __restrict__ frames, int64_t total, int64_t s0, bf16* __restrict__ folded,
                                  int64_t T, int64_t HW, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t nch = C / 8;
  const int64_t c8 = i % nch, rest = i / nch;
  const int64_t p = rest % HW, k = rest / HW;
  const uint4 u = *reinterpret_cast<const uint4*>(frames + i * 8);
  const int64_t s = s0 + k;
#pragma unroll
  for (int dt = 0; dt < 3; ++dt) {
    const int64_t t = s - dt;
    if (t >= 0 && t < T) store8(folded + (t * HW + p) * 3 * C + dt * C + c8 * 8, u);
  }
}

__global__ void folded_get_kernel(const bf16* __restrict__ folded, int64_t s0, int64_t total, bf16* __restrict__ frames,
                                  int64_t T, int64_t HW, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t nch = C / 8;
  const int64_t c8 = i % nch, rest = i / nch;
  const int64_t p = rest % HW, k = rest / HW;
  const int64_t s = s0 + k;
  const int64_t t = s < T - 1 ? s : T - 1, dt = s - t;
  store8(frames + i * 8, *reinterpret_cast<const uint4*>(folded + (t * HW + p) * 3 * C + dt * C + c8 * 8));
}

// ---- decoder input / output ----

template <int Z>
__global__ void latent_in_kernel(const float* __restrict__ lat, int64_t Tl, int64_t t, int64_t HW,
                                 const float* __restrict__ inv_std, const float* __restrict__ mean,
                                 const float* __restrict__ w, const float* __restrict__ b, StageDst y) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= HW) return;
  float z[Z];
#pragma unroll
  for (int c = 0; c < Z; ++c) z[c] = __fadd_rn(__fdiv_rn(lat[(c * Tl + t) * HW + p], inv_std[c]), mean[c]);
  // Eight output channels at a time: each is its own fp32 sum over ci in order.
#pragma unroll
  for (int c0 = 0; c0 < Z; c0 += 8) {
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int co = c0 + e;
      float acc = b[co];
#pragma unroll
      for (int ci = 0; ci < Z; ++ci) acc = __fadd_rn(acc, __fmul_rn(w[co * Z + ci], z[ci]));
      o[e] = acc;
    }
    stage_store(y, y.s0, p, HW, Z, c0, pack8(o));
  }
}

__global__ void video_out_kernel(const bf16* __restrict__ in, int64_t Cs, const float* __restrict__ bias, int64_t T,
                                 int64_t H, int64_t W, int patch, float* __restrict__ video, int64_t F, int64_t f0,
                                 bool clamp) {
  const int64_t HW = H * W;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * HW) return;
  const int64_t t = i / HW, p = i - t * HW, y = p / W, x = p - y * W;
  const int pp = patch * patch;
  const int64_t Wv = W * patch, HWv = HW * pp;
  for (int oc = 0; oc < 3 * pp; ++oc) {
    const int c = oc / pp, r = (oc / patch) % patch, q = oc % patch;
    float v = __fadd_rn(__bfloat162float(in[i * Cs + oc]), bias[oc]);
    if (clamp) v = fminf(fmaxf(v, -1.0f), 1.0f);
    video[(c * F + f0 + t) * HWv + (y * patch + q) * Wv + x * patch + r] = v;
  }
}

__global__ void video_in_kernel(const float* __restrict__ video, int64_t F, int64_t f0, int64_t total, int64_t H,
                                int64_t W, int patch, int64_t Cs, StageDst y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t w = W / patch, hw = (H / patch) * w, nch = Cs / 8;
  const int64_t c8 = i % nch, rest = i / nch;
  const int64_t p = rest % hw, k = rest / hw, py = p / w, px = p - py * w;
  const int pp = patch * patch;
  float v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int oc = static_cast<int>(c8 * 8) + e;
    v[e] = 0.0f;
    if (oc < 3 * pp) {
      const int c = oc / pp, r = (oc / patch) % patch, q = oc % patch;
      v[e] = video[((c * F + f0 + k) * H + py * patch + q) * W + px * patch + r];
    }
  }
  stage_store(y, y.s0 + k, p, hw, Cs, c8 * 8, pack8(v));
}

__global__ void latent_out_kernel(const bf16* __restrict__ in, const float* __restrict__ in_bias, int64_t Z,
                                  const float* __restrict__ w, const float* __restrict__ b,
                                  const float* __restrict__ mean, const float* __restrict__ inv_std,
                                  float* __restrict__ lat, int64_t Tl, int64_t t, int64_t HW) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= Z * HW) return;
  const int64_t co = i / HW, p = i - co * HW, C2 = 2 * Z;
  const bf16* row = in + p * C2;
  float acc = b[co];
  for (int64_t ci = 0; ci < C2; ++ci)
    acc = __fadd_rn(acc, __fmul_rn(w[co * C2 + ci], __fadd_rn(__bfloat162float(row[ci]), in_bias[ci])));
  lat[(co * Tl + t) * HW + p] = __fmul_rn(__fsub_rn(acc, mean[co]), inv_std[co]);
}

// ---- Wan 2.2 stage shortcuts ----

struct ShortcutParams {
  const bf16* a;
  const float* a_bias;
  const bf16* r;
  const float* r_bias;
  VaeShortcut sc;
  bf16* out;
  int64_t To, Ho, Wo, Cout;
  int32_t group;  // AvgDown: channels averaged (g); DupUp: copies of an input channel (rep)
  int32_t pad;    // AvgDown: zero frames in front
};

__device__ __forceinline__ float shortcut_value(const ShortcutParams& q, int64_t to, int64_t y, int64_t x, int64_t co) {
  const VaeShortcut& s = q.sc;
  const int64_t fs = s.fs, ft = s.ft;
  if (s.kind == VaeShortcut::DupUp) {
    const int64_t tf = to + s.drop, t = tf / ft, dt = tf - t * ft;
    const int64_t j = ((co * ft + dt) * fs + y % fs) * fs + x % fs;
    return __bfloat162float(s.in[((t * s.hi + y / fs) * s.wi + x / fs) * s.Cin + j / q.group]);
  }
  const int64_t factor = ft * fs * fs;
  float sum = 0.0f;
  for (int64_t j = co * q.group; j < (co + 1) * q.group; ++j) {
    const int64_t dw = j % fs, dh = (j / fs) % fs, dt = (j / (fs * fs)) % ft, c = j / factor;
    const int64_t tt = to * ft + dt - q.pad;
    if (tt < 0) continue;  // time padding: zero
    sum = __fadd_rn(sum, __bfloat162float(s.in[((tt * s.hi + y * fs + dh) * s.wi + x * fs + dw) * s.Cin + c]));
  }
  return __fdiv_rn(sum, static_cast<float>(q.group));
}

__global__ void shortcut_add_kernel(ShortcutParams q, int64_t total) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t nch = q.Cout / 8;
  const int64_t c8 = i % nch;
  int64_t rest = i / nch;
  const int64_t x = rest % q.Wo;
  rest /= q.Wo;
  const int64_t y = rest % q.Ho, to = rest / q.Ho;
  const int64_t at = i * 8;
  float v[8];
  load_pending8(q.a, q.a_bias, q.r, q.r_bias, at, c8 * 8, v);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = __fadd_rn(v[e], shortcut_value(q, to, y, x, c8 * 8 + e));
  store8(q.out + at, pack8(v));
}

__global__ void bias_to_bf16_kernel(const float* __restrict__ in, const float* __restrict__ bias, bf16* __restrict__ out,
                                    int64_t total, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t c = (i * 8) % C;
  float v[8], b[8];
  load8(in + i * 8, v);
  load8(bias + c, b);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = __fadd_rn(v[e], b[e]);
  store8(out + i * 8, pack8(v));
}

// ---- softmax ----

__device__ float block_reduce(float v, bool is_max, float* sh) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : __fadd_rn(v, o);
  }
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();  // sh may still be read by a previous reduction
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = sh[0];
  for (int i = 1; i < static_cast<int>(blockDim.x >> 5); ++i) v = is_max ? fmaxf(v, sh[i]) : __fadd_rn(v, sh[i]);
  return v;
}

__global__ void __launch_bounds__(kThreads) softmax_kernel(const float* __restrict__ S, bf16* __restrict__ P, int64_t N,
                                                           float scale) {
  __shared__ float sh[kThreads / 32];
  const float* row = S + blockIdx.x * N;
  bf16* out = P + blockIdx.x * N;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < N; j += blockDim.x) mx = fmaxf(mx, __fmul_rn(row[j], scale));
  mx = block_reduce(mx, true, sh);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < N; j += blockDim.x) sum = __fadd_rn(sum, expf(__fsub_rn(__fmul_rn(row[j], scale), mx)));
  sum = block_reduce(sum, false, sh);
  const float inv = __fdiv_rn(1.0f, sum);
  for (int64_t j = threadIdx.x; j < N; j += blockDim.x)
    out[j] = __float2bfloat16_rn(__fmul_rn(expf(__fsub_rn(__fmul_rn(row[j], scale), mx)), inv));
}

// ---- convolution self-check ----

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

struct CheckParams {
  const bf16* in;
  const bf16* w;
  const bf16* out;
  int64_t D, H, W, Cin, Cout, Dout, Ho, Wo;
  int kt, kh, kw, ph, pw, st, ss;
  uint32_t salt;
  float* stats;
};

__global__ void conv_check_kernel(CheckParams q) {
  __shared__ float sh[4];
  const uint64_t total = static_cast<uint64_t>(q.Dout * q.Ho * q.Wo * q.Cout);
  const uint64_t idx = mix64((static_cast<uint64_t>(q.salt) << 32) ^ (blockIdx.x + 0x9E3779B97F4A7C15ull)) % total;
  const int64_t co = idx % q.Cout;
  int64_t rest = idx / q.Cout;
  const int64_t ox = rest % q.Wo;
  rest /= q.Wo;
  const int64_t oy = rest % q.Ho, od = rest / q.Ho;
  const int64_t K = q.kt * q.kh * q.kw * q.Cin;
  float acc = 0.0f, mag = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const int64_t ci = k % q.Cin;
    int64_t r = k / q.Cin;
    const int64_t dx = r % q.kw;
    r /= q.kw;
    const int64_t dy = r % q.kh, dt = r / q.kh;
    const int64_t iy = oy * q.ss + dy - q.ph, ix = ox * q.ss + dx - q.pw;
    if (iy < 0 || iy >= q.H || ix < 0 || ix >= q.W) continue;
    const float x = __bfloat162float(q.in[(((od * q.st + dt) * q.H + iy) * q.W + ix) * q.Cin + ci]);
    const float wv = __bfloat162float(q.w[co * K + k]);
    acc += x * wv;
    mag += fabsf(x * wv);
  }
  acc = block_reduce(acc, false, sh);
  mag = block_reduce(mag, false, sh);
  if (threadIdx.x == 0) {
    const float got = __bfloat162float(q.out[idx]);
    if (!isfinite(got)) {
      atomicAdd(q.stats + 1, 1.0f);
    } else {
      const float err = fabsf(got - acc) / (mag + 1e-20f);
      atomicMax(reinterpret_cast<int*>(q.stats), __float_as_int(err));  // err >= 0: int order = float order
    }
  }
}

}  // namespace

void vae_fuse(const bf16* a, const float* a_bias, const bf16* r, const float* r_bias, bf16* x_out, StageDst y,
              NormMode mode, const float* gamma, int64_t T, int64_t HW, int64_t C, cudaStream_t stream) {
  WAN_CHECK(C % 8 == 0 && C >= 8 && C <= 1024, "vae_fuse: ", C, " channels (need a multiple of 8, at most 1024)");
  WAN_CHECK(mode == NormMode::Copy || gamma, "vae_fuse: RMS norm without gamma");
  for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(a_bias), static_cast<const void*>(r),
                        static_cast<const void*>(r_bias), static_cast<const void*>(x_out),
                        static_cast<const void*>(y.base), static_cast<const void*>(gamma)})
    check_aligned(p, "a fuse operand");
  const int64_t P = T * HW;
  if (P == 0) return;
  FuseParams q{a, a_bias, r, r_bias, x_out, y, static_cast<int32_t>(mode), gamma, P, HW, static_cast<int32_t>(C),
               std::sqrt(static_cast<float>(C))};
  const dim3 grid(static_cast<unsigned>(blocks_for(P, kRowsPerBlock)));
  const int nit = static_cast<int>((C / 8 + 15) / 16);
  switch (nit) {
    case 1: fuse_kernel<1><<<grid, kThreads, 0, stream>>>(q); break;
    case 2: fuse_kernel<2><<<grid, kThreads, 0, stream>>>(q); break;
    case 3: fuse_kernel<3><<<grid, kThreads, 0, stream>>>(q); break;
    case 4: fuse_kernel<4><<<grid, kThreads, 0, stream>>>(q); break;
    case 5: fuse_kernel<5><<<grid, kThreads, 0, stream>>>(q); break;
    case 6: fuse_kernel<6><<<grid, kThreads, 0, stream>>>(q); break;
    case 7: fuse_kernel<7><<<grid, kThreads, 0, stream>>>(q); break;
    default: fuse_kernel<8><<<grid, kThreads, 0, stream>>>(q); break;
  }
  CUDA_CHECK_LAUNCH();
}

void vae_upsample2x(const bf16* in, const float* bias, bf16* out, int64_t T, int64_t H, int64_t W, int64_t C,
                    int split, cudaStream_t stream) {
  WAN_CHECK(C % 8 == 0 && (split == 1 || split == 2), "vae_upsample2x: C ", C, " split ", split);
  check_aligned(in, "upsample input");
  check_aligned(out, "upsample output");
  check_aligned(bias, "upsample bias");
  const int64_t total = T * split * 4 * H * W * (C / 8);
  if (total == 0) return;
  upsample_kernel<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads, 0, stream>>>(in, bias, out, total, H,
                                                                                                W, C, split);
  CUDA_CHECK_LAUNCH();
}

void vae_folded_put(const bf16* frames, int64_t n, int64_t s0, bf16* folded, int64_t T, int64_t HW, int64_t C,
                    cudaStream_t stream) {
  WAN_CHECK(C % 8 == 0 && s0 >= 0 && s0 + n <= T + 2, "vae_folded_put: frames ", s0, "+", n, " of a ", T + 2,
            "-frame stream, C ", C);
  check_aligned(frames, "folded_put frames");
  check_aligned(folded, "folded_put staging");
  const int64_t total = n * HW * (C / 8);
  if (total == 0) return;
  folded_put_kernel<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads, 0, stream>>>(frames, total, s0,
                                                                                                  folded, T, HW, C);
  CUDA_CHECK_LAUNCH();
}

void vae_folded_get(const bf16* folded, int64_t s0, int64_t n, bf16* frames, int64_t T, int64_t HW, int64_t C,
                    cudaStream_t stream) {
  WAN_CHECK(C % 8 == 0 && s0 >= 0 && s0 + n <= T + 2, "vae_folded_get: frames ", s0, "+", n, " of a ", T + 2,
            "-frame stream, C ", C);
  check_aligned(frames, "folded_get frames");
  check_aligned(folded, "folded_get staging");
  const int64_t total = n * HW * (C / 8);
  if (total == 0) return;
  folded_get_kernel<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads, 0, stream>>>(folded, s0, total,
                                                                                                  frames, T, HW, C);
  CUDA_CHECK_LAUNCH();
}

void vae_latent_in(const float* latents, int64_t Z, int64_t Tl, int64_t t, int64_t HW, const float* inv_std,
                   const float* mean, const float* w, const float* b, StageDst y, cudaStream_t stream) {
  WAN_CHECK(Z == 16 || Z == 48, "vae_latent_in: ", Z, " latent channels (the Wan 2.1 VAE has 16, Wan 2.2 48)");
  WAN_CHECK(t >= 0 && t < Tl, "vae_latent_in: frame ", t, " of ", Tl);
  check_aligned(y.base, "latent_in staging");
  const unsigned grid = static_cast<unsigned>(blocks_for(HW, kThreads));
  if (Z == 16)
    latent_in_kernel<16><<<grid, kThreads, 0, stream>>>(latents, Tl, t, HW, inv_std, mean, w, b, y);
  else
    latent_in_kernel<48><<<grid, kThreads, 0, stream>>>(latents, Tl, t, HW, inv_std, mean, w, b, y);
  CUDA_CHECK_LAUNCH();
}

void vae_video_out(const bf16* in, int64_t Cs, const float* bias, int64_t T, int64_t H, int64_t W, int patch,
                   float* video, int64_t F, int64_t f0, bool clamp, cudaStream_t stream) {
  WAN_CHECK((patch == 1 || patch == 2) && Cs % 8 == 0 && Cs >= 3 * patch * patch && f0 + T <= F, "vae_video_out: ",
            Cs, " channels, patch ", patch, ", frames ", f0, "+", T, " of ", F);
  check_aligned(in, "video_out input");
  if (T * H * W == 0) return;
  video_out_kernel<<<static_cast<unsigned>(blocks_for(T * H * W, kThreads)), kThreads, 0, stream>>>(
      in, Cs, bias, T, H, W, patch, video, F, f0, clamp);
  CUDA_CHECK_LAUNCH();
}

namespace {
__device__ __forceinline__ uint8_t unit_to_u8(float x) {
  if (isnan(x)) return 0;
  const float c = fminf(fmaxf(x, -1.0f), 1.0f);
  return static_cast<uint8_t>(__fmul_rn(__fdiv_rn(__fadd_rn(c, 1.0f), 2.0f), 255.0f));
}

__global__ void video_rgb8_kernel(const float* __restrict__ video, int64_t F, int64_t HW, int64_t f0, int64_t n,
                                  uint8_t* __restrict__ rgb) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t src = f0 * HW + i, channel = F * HW;
  for (int c = 0; c < 3; ++c) rgb[3 * i + c] = unit_to_u8(video[c * channel + src]);
}
}  // namespace

void vae_video_rgb8(const float* video, int64_t F, int64_t HW, int64_t f0, int64_t f1, uint8_t* rgb,
                    cudaStream_t stream) {
  WAN_CHECK(f0 >= 0 && f0 <= f1 && f1 <= F && HW >= 0, "vae_video_rgb8: frames ", f0, "..", f1, " of ", F);
  const int64_t n = (f1 - f0) * HW;
  if (n == 0) return;
  video_rgb8_kernel<<<static_cast<unsigned>(blocks_for(n, kThreads)), kThreads, 0, stream>>>(video, F, HW, f0, n, rgb);
  CUDA_CHECK_LAUNCH();
}

void vae_video_in(const float* video, int64_t F, int64_t f0, int64_t n, int64_t H, int64_t W, int patch, int64_t Cs,
                  StageDst y, cudaStream_t stream) {
  WAN_CHECK((patch == 1 || patch == 2) && Cs % 8 == 0 && Cs >= 3 * patch * patch && H % patch == 0 && W % patch == 0,
            "vae_video_in: ", H, "x", W, ", patch ", patch, ", ", Cs, " channels");
  WAN_CHECK(f0 >= 0 && n >= 0 && f0 + n <= F, "vae_video_in: frames ", f0, "+", n, " of ", F);
  check_aligned(y.base, "video_in staging");
  const int64_t total = n * (H / patch) * (W / patch) * (Cs / 8);
  if (total == 0) return;
  video_in_kernel<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads, 0, stream>>>(video, F, f0, total, H,
                                                                                                W, patch, Cs, y);
  CUDA_CHECK_LAUNCH();
}

void vae_latent_out(const bf16* in, const float* in_bias, int64_t Z, const float* w, const float* b, const float* mean,
                    const float* inv_std, float* latents, int64_t Tl, int64_t t, int64_t HW, cudaStream_t stream) {
  WAN_CHECK(Z >= 1 && t >= 0 && t < Tl, "vae_latent_out: Z ", Z, ", frame ", t, " of ", Tl);
  if (Z * HW == 0) return;
  latent_out_kernel<<<static_cast<unsigned>(blocks_for(Z * HW, kThreads)), kThreads, 0, stream>>>(
      in, in_bias, Z, w, b, mean, inv_std, latents, Tl, t, HW);
  CUDA_CHECK_LAUNCH();
}

void vae_shortcut_geometry(const VaeShortcut& sc, int64_t* To, int64_t* Ho, int64_t* Wo) {
  if (sc.kind == VaeShortcut::DupUp) {
    *To = sc.Ti * sc.ft - sc.drop;
    *Ho = sc.hi * sc.fs;
    *Wo = sc.wi * sc.fs;
  } else {
    *To = (sc.Ti + sc.ft - 1) / sc.ft;
    *Ho = sc.hi / sc.fs;
    *Wo = sc.wi / sc.fs;
  }
}

void vae_shortcut_add(const bf16* a, const float* a_bias, const bf16* r, const float* r_bias, const VaeShortcut& sc,
                      bf16* out, int64_t Cout, cudaStream_t stream) {
  const int64_t factor = static_cast<int64_t>(sc.ft) * sc.fs * sc.fs;
  WAN_CHECK(Cout % 8 == 0 && sc.ft >= 1 && sc.fs >= 1 && sc.Cin >= 1, "vae_shortcut_add: Cout ", Cout, ", ft ", sc.ft,
            ", fs ", sc.fs);
  ShortcutParams q{a, a_bias, r, r_bias, sc, out, 0, 0, 0, Cout, 0, 0};
  vae_shortcut_geometry(sc, &q.To, &q.Ho, &q.Wo);
  if (sc.kind == VaeShortcut::DupUp) {
    WAN_CHECK(Cout * factor % sc.Cin == 0 && sc.drop >= 0 && sc.drop < sc.ft, "vae_shortcut_add: DupUp ", sc.Cin,
              " -> ", Cout, " channels x", factor, ", drop ", sc.drop);
    q.group = static_cast<int32_t>(Cout * factor / sc.Cin);
  } else {
    WAN_CHECK(sc.Cin * factor % Cout == 0 && sc.hi % sc.fs == 0 && sc.wi % sc.fs == 0, "vae_shortcut_add: AvgDown ",
              sc.Cin, " -> ", Cout, " channels, ", sc.hi, "x", sc.wi, " by ", sc.fs);
    q.group = static_cast<int32_t>(sc.Cin * factor / Cout);
    q.pad = static_cast<int32_t>((sc.ft - sc.Ti % sc.ft) % sc.ft);
  }
  for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(a_bias), static_cast<const void*>(r),
                        static_cast<const void*>(r_bias), static_cast<const void*>(out)})
    check_aligned(p, "a shortcut_add operand");
  WAN_CHECK(a && out && sc.in && sc.in != out,
            "vae_shortcut_add: null operand, or the output aliases the shortcut input");
  const int64_t total = q.To * q.Ho * q.Wo * (Cout / 8);
  if (total == 0) return;
  shortcut_add_kernel<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads, 0, stream>>>(q, total);
  CUDA_CHECK_LAUNCH();
}

void vae_bias_to_bf16(const float* in, const float* bias, bf16* out, int64_t rows, int64_t C, cudaStream_t stream) {
  WAN_CHECK(C % 8 == 0, "vae_bias_to_bf16: C ", C);
  check_aligned(in, "bias_to_bf16 input");
  check_aligned(bias, "bias_to_bf16 bias");
  check_aligned(out, "bias_to_bf16 output");
  const int64_t total = rows * C / 8;
  if (total == 0) return;
  bias_to_bf16_kernel<<<static_cast<unsigned>(blocks_for(total, kThreads)), kThreads, 0, stream>>>(in, bias, out,
                                                                                                    total, C);
  CUDA_CHECK_LAUNCH();
}

void vae_softmax_rows(const float* S, bf16* P, int64_t rows, int64_t N, float scale, cudaStream_t stream) {
  WAN_CHECK(rows < (int64_t{1} << 31), "vae_softmax_rows: ", rows, " rows");
  if (rows == 0 || N == 0) return;
  softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(S, P, N, scale);
  CUDA_CHECK_LAUNCH();
}

void vae_conv_check(const bf16* in, const bf16* w, const bf16* out, int64_t D, int64_t H, int64_t W, int64_t Cin,
                    int64_t Cout, int kt, int kh, int kw, int ph, int pw, int points, uint32_t salt, float* stats,
                    cudaStream_t stream, int st, int ss) {
  WAN_CHECK(st >= 1 && ss >= 1, "vae_conv_check: strides ", st, ", ", ss);
  CheckParams q{in, w, out, D, H, W, Cin, Cout, (D - kt) / st + 1, (H + 2 * ph - kh) / ss + 1,
                (W + 2 * pw - kw) / ss + 1, kt, kh, kw, ph, pw, st, ss, salt, stats};
  WAN_CHECK(q.Dout > 0 && q.Ho > 0 && q.Wo > 0, "vae_conv_check: empty output");
  if (points <= 0) return;
  conv_check_kernel<<<static_cast<unsigned>(points), 128, 0, stream>>>(q);
  CUDA_CHECK_LAUNCH();
}

}  // namespace wan::cuda
