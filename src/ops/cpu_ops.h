// CPU float32 reference ops for the DiT (WanModel). Every later GPU kernel is tested against exactly
// these functions, so each takes raw pointers plus dims and documents its layout; all tensors are
// contiguous row-major float32 unless a stride argument says otherwise.
// Invariants:
// - Numerics follow the official reference where it is defined (spec §2, §9): norms in fp32 with
//   statistics accumulated in double (more exact than any fp32 order, deterministic), sinusoidal
//   time embedding and RoPE in float64 rounded once to fp32, everything else plain fp32.
// - GEMM sums run over k in increasing order per output element (no reassociation), so results do
//   not depend on the thread count.
// - Ops are multi-threaded with wan::parallel_for; scratch is at most one head's K/V (attention) or
//   one sample's patch rows (patch_embed). Out-of-place ops accept out == in unless stated otherwise.
#pragma once
#include <cstdint>
#include <vector>

namespace wan::ops {

// ---- GEMM ----
// y[M, N] = x[M, K] · w[N, K]ᵀ + b[N]. w is a PyTorch Linear weight [out_features, in_features];
// b may be null. y must not alias x or w.
void linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t K, int64_t N);

// The register-blocked kernel behind linear, shared with the VAE convolutions (serial: callers
// parallelise over blocks). The B operand is packed into column panels of kGemmNR: panel p holds
// columns [p·kGemmNR, (p+1)·kGemmNR) as kc rows of kGemmNR floats (row kk at (p·kc + kk)·kGemmNR),
// zero beyond ncols.
// C[M, ncols] (row stride ldc) = init + A[:, k0:k0+kc] · Bp, where row m of A starts at A + m·lda.
// init: bias[m] when first (bias may be null -> 0), else the current C. Each element is one fp32 sum,
// init first, then k in increasing order; C round-trips fp32 exactly, so calling this per k block
// (first on the first block only) sums exactly as one call over all of K would.
constexpr int64_t kGemmNR = 16;
void gemm_packed(const float* A, int64_t lda, int64_t M, int64_t k0, int64_t kc, const float* bp, int64_t ncols,
                 float* C, int64_t ldc, bool first, const float* bias);

// ---- normalisation ----
// Per row of x[rows, dim]: y = (x - mean) / sqrt(var + eps) (biased var), then y·w + b when w/b are
// non-null (w and b are both null for norm1/norm2/head.norm, both set for norm3).
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t dim, float eps);
// Per row of x[rows, dim]: y = fp32(x · rsqrt(mean(x²) + eps)) · w (w [dim]; may be null). The DiT
// passes dim = heads·head_dim: q/k RMSNorm spans all heads jointly (spec §2.7).
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);

// ---- elementwise ----
// y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
void gelu_tanh(const float* x, float* y, int64_t n);
// y = x / (1 + exp(-x))
void silu(const float* x, float* y, int64_t n);
// x += y
void add_inplace(float* x, const float* y, int64_t n);

// ---- time embedding ----
// out[n, dim]: half = dim/2, ω_k = 10000^(-k/half) and out[i] = [cos(t_i·ω_0..half-1), sin(...)]
// computed in float64, rounded to fp32 (spec §2.4: cosine half first).
void timestep_embedding(const float* t, int64_t n, int64_t dim, float* out);

// ---- modulation (adaLN) ----
// y[r, :] = x[r, :]·(1 + scale_r) + shift_r with shift_r = shift + r·mod_stride (same for scale);
// mod_stride 0 broadcasts one vector to every row (per-sample timestep), 6·dim walks the per-token
// [L, 6, dim] modulation tensor.
void modulate(const float* x, const float* shift, const float* scale, int64_t mod_stride, float* y, int64_t rows,
              int64_t dim);
// x[r, :] += y[r, :]·gate_r, gate_r = gate + r·gate_stride (0 = broadcast).
void gated_residual(float* x, const float* y, const float* gate, int64_t gate_stride, int64_t rows, int64_t dim);

// ---- 3D RoPE (spec §2.6) ----
// Complex-pair split of a head of head_dim real channels: c = head_dim/2 pairs, c - 2·(c/3) for
// frames, c/3 each for height and width (22/21/21 at head_dim 128).
struct RopeTable {
  int head_dim = 0;
  int max_pos = 0;
  int pairs[3] = {0, 0, 0};  // frame, height, width pairs
  // [axis][pos][pair]: cos/sin of pos·inv_axis[pair] in float64, inv = 1/10000^(2j/dim_axis),
  // dim_axis = 2·pairs[axis].
  std::vector<double> cos[3], sin[3];
};
RopeTable rope_table(int head_dim, int max_pos = 1024);
// Rotates x[B, S, heads, head_dim] in place: token n < f·h·w sits at grid position
// (n / (h·w), (n / w) % h, n % w); pair j = channels (2j, 2j+1) as (re, im) is multiplied by
// e^{iθ} in float64 and rounded to fp32. Tokens n >= f·h·w (padding) are left unrotated.
void rope_apply(float* x, int64_t B, int64_t S, int64_t heads, int64_t head_dim, int64_t f, int64_t h, int64_t w,
                const RopeTable& table);

// ---- attention ----
// out[B, Lq, H, D] = softmax(q·kᵀ·scale)·v per (sample, head); q [B, Lq, H, D], k and v [B, Lk, H, D].
// k_lens (nullable, [B]): keys j >= k_lens[b] are excluded (1 <= k_lens[b] <= Lk). out must not
// alias q, k or v.
void attention(const float* q, const float* k, const float* v, float* out, int64_t B, int64_t Lq, int64_t Lk,
               int64_t H, int64_t D, const int64_t* k_lens, float scale);

// ---- patch embedding / unpatchify (spec §2.3, §2.9) ----
// Gathers one sample x[C, T, H, W] into patch rows [f·h·w, C·pt·ph·pw] (f = T/pt, h = H/ph,
// w = W/pw; token n = (fi·h + hi)·w + wi; features ordered (c, qt, qh, qw) like a flattened Conv3d
// weight [D, C, pt, ph, pw]). T, H, W must be multiples of the patch.
void patchify(const float* x, float* rows, int64_t C, int64_t T, int64_t H, int64_t W, int pt, int ph, int pw);
// Conv3d with kernel = stride = patch as a GEMM: out[f·h·w, D] = patchify(x) · w[D, C·pt·ph·pw]ᵀ + b.
void patch_embed(const float* x, const float* w, const float* b, float* out, int64_t C, int64_t T, int64_t H,
                 int64_t W, int64_t D, int pt, int ph, int pw);
// rows[f·h·w, pt·ph·pw·C] (features ordered (qt, qh, qw, c), c fastest) -> out[C, f·pt, h·ph, w·pw].
void unpatchify(const float* rows, float* out, int64_t C, int64_t f, int64_t h, int64_t w, int pt, int ph, int pw);

}  // namespace wan::ops
