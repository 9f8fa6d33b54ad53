// Fused memory-bound kernels of the DiT (everything but GEMMs and attention): host launchers on raw
// device pointers and a stream; no model types. Implementations: dit_norm.cu (LayerNorm + modulation,
// the residual adds fused into a LayerNorm, q/k RMSNorm + 3D RoPE), dit_kernels.cu (residual adds,
// time embedding, patchify, conversions).
//
// Invariants: every kernel reads its input once and writes its output once (16-byte vectors; a scalar
// path only where a size or pointer forbids vectors, as the launcher says). Row widths D must be
// multiples of 8 and the row pointers 16-byte aligned where a launcher says so (checked: wan::Error).
// Launchers never synchronise; errors of the launch itself are thrown (CUDA_CHECK_LAUNCH).
// Kernels are deterministic (fixed reduction order). Outputs must not alias inputs unless stated.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace wan::cuda {

// Numerics follow the official reference (spec §2.10, §9): the residual stream, norms, modulation,
// RoPE and the time embedding are fp32 (the sinusoid in float64), GEMM inputs are bf16. Where the
// reference rounds an intermediate (the q/k RMSNorm result to bf16 before the weight), so do we; fp32
// adds and multiplies of the modulation, gates and residual adds are done as separate correctly
// rounded operations in the reference's order (no FMA contraction), so they equal the CPU reference
// bit for bit.

using bf16 = __nv_bfloat16;

// A per-row fp32 vector v_r[i] = base[i] + e_r[i]: the reference's `modulation + e0` folded into the
// kernel that uses it, so no pass materialises m. Row r belongs to e vector j = r / rows_per_e and is
// token n = token0 + r % rows_per_e of that vector's sequence; e_r = e_first + j·e_stride when e_first
// is given and n < first_tokens, else e + j·e_stride.
//   block modulation [1, 6, D] + e0 [B, 6, D] (per-sample t):  base = mod + k·D, e = e0 + k·D,
//       e_stride = 6·D, rows_per_e = S (tokens per sample, the rows of one sample)
//   block modulation + e0 [B, S, 6, D] (per-token t):          same with rows_per_e = 1
//   two timesteps per sample (TI2V image mode, spec §7.5.3: the tokens of latent frame 0 take their
//       own): as per-sample, plus e_first = e0_first + k·D ([B, 6, D] of that timestep),
//       first_tokens = the tokens of frame 0, token0 = the sequence index of each sample's first row
//       (sequence parallel: the rank's slice offset)
//   head modulation [1, 2, D] + e [B, D] or [B, S, D]:          base = hmod + k·D, e = e, e_stride = D
// base or e may be null (contributes 0; e_first needs e). Pointers 16-byte aligned, e_stride a
// multiple of 4.
struct ModVec {
  const float* base = nullptr;  // [D]
  const float* e = nullptr;     // first vector; vector j at e + j·e_stride
  int64_t e_stride = 0;         // elements between consecutive e vectors
  int64_t rows_per_e = 1;       // rows sharing one e vector (>= 1)
  const float* e_first = nullptr;  // null: every row reads e
  int64_t first_tokens = 0;        // tokens n < first_tokens read e_first
  int64_t token0 = 0;              // the token index of row 0 of each e vector's rows
  // The e vector of row r (null without e). Host and device: the kernels call it per row.
  __host__ __device__ const float* e_row(int64_t r) const {
    if (!e) return nullptr;
    const int64_t j = r / rows_per_e;
    const float* v = e_first && token0 + (r - j * rows_per_e) < first_tokens ? e_first : e;
    return v + j * e_stride;
  }
};

// ---- LayerNorm (eps = 1e-6 in the model; biased variance; fp32 statistics) ----
// y[r, :] = LN(x[r, :])·(1 + scale_r) + shift_r, in that rounding order, x fp32 [rows, D] (the
// residual stream). bf16 output feeds the next GEMM (norm1, norm2); the fp32 one is for the output
// head, whose Linear runs in fp32 in the reference. D % 8 == 0, D <= 32768, pointers 16-byte aligned.
void layernorm_modulate(const float* x, bf16* y, int64_t rows, int64_t D, const ModVec& shift, const ModVec& scale,
                        float eps, cudaStream_t stream);
void layernorm_modulate(const float* x, float* y, int64_t rows, int64_t D, const ModVec& shift, const ModVec& scale,
                        float eps, cudaStream_t stream);
// Affine LayerNorm (norm3, the cross-attention pre-norm): y = LN(x)·w + b with fp32 w, b [D] (the
// reference up-casts them and runs the norm in fp32) -> bf16 [rows, D]. The forward runs norm3 fused with
// the add before it (residual_add_layernorm_affine); this unfused form is kept as the reference the
// fused kernel is tested against bit for bit (tests/gpu/test_dit_kernels.cu).
void layernorm_affine(const float* x, const float* w, const float* b, bf16* y, int64_t rows, int64_t D, float eps,
                      cudaStream_t stream);
// The residual add before a LayerNorm fused into it (one pass over the residual instead of two):
//   x[r, :] += a[r, :]·gate_r   (gate given: gated_residual_add's arithmetic)
//   x[r, :] += a[r, :]          (gate == nullptr: residual_add's arithmetic)
// stored to x, then y = LN(x[r, :])·(1 + scale_r) + shift_r (modulate) or LN(x[r, :])·w + b (affine) from
// the same registers. Both outputs are bit-identical to the unfused add followed by layernorm_modulate /
// layernorm_affine (same arithmetic, same reduction order). a bf16 [rows, D] (a GEMM output); x, a and
// y must not overlap (checked). Same width and alignment rules as the LayerNorms; gate as in
// gated_residual_add. Block uses: norm3 after the self-attention's gated add (affine, gated), norm2
// after the cross-attention's plain add (modulate, no gate), the next block's norm1 after the FFN's
// gated add (modulate, gated).
void residual_add_layernorm_modulate(float* x, const bf16* a, const ModVec* gate, bf16* y, int64_t rows, int64_t D,
                                     const ModVec& shift, const ModVec& scale, float eps, cudaStream_t stream);
void residual_add_layernorm_affine(float* x, const bf16* a, const ModVec* gate, const float* w, const float* b,
                                   bf16* y, int64_t rows, int64_t D, float eps, cudaStream_t stream);

// The LayerNorms that feed a GEMM, writing its FP8 input instead (DiTGemm::Fp8): each output rounded to
// bf16 as the forms above store it, then the row quantised as kernels/fp8_quant.h's quantize_rows_fp8
// does (core/fp8_rows.h): e4m3 bytes q [rows, D] (16-byte aligned) and fp32 scale [rows]. Bit-identical
// to the bf16 form followed by quantize_rows_fp8, without the bf16 rows' write and read.
struct Fp8Rows {
  uint8_t* q = nullptr;
  float* scale = nullptr;
};
void layernorm_modulate(const float* x, const Fp8Rows& y, int64_t rows, int64_t D, const ModVec& shift,
                        const ModVec& scale, float eps, cudaStream_t stream);
void residual_add_layernorm_modulate(float* x, const bf16* a, const ModVec* gate, const Fp8Rows& y, int64_t rows,
                                     int64_t D, const ModVec& shift, const ModVec& scale, float eps,
                                     cudaStream_t stream);
void residual_add_layernorm_affine(float* x, const bf16* a, const ModVec* gate, const float* w, const float* b,
                                   const Fp8Rows& y, int64_t rows, int64_t D, float eps, cudaStream_t stream);

// ---- q/k RMSNorm over the full width fused with 3D RoPE (spec §2.6, §2.7, §9.6, §9.7) ----
// One tensor to normalise: rows of D bf16 values (a GEMM output; x_stride lets q and k be column
// slices of a fused QKV output [rows, 3·D]) -> y [rows, D] = [B, S, H, head_dim] dense, the layout the
// attention reads. y may equal x only when x_stride == D.
struct RmsNormJob {
  const bf16* x = nullptr;  // [rows, x_stride], first D columns used
  int64_t x_stride = 0;     // elements between rows (>= D, multiple of 8)
  const bf16* w = nullptr;  // [D] RMSNorm weight
  bf16* y = nullptr;        // [rows, y_stride], first D columns written
  int64_t rows = 0;         // B·S
  int64_t y_stride = 0;     // elements between output rows (0: D); in place (y == x) needs y_stride == x_stride
};
// 3D RoPE geometry. Row r is token n = offset + r % seq of its sample; n < f·h·w sits at grid position
// (n / (h·w), (n / w) % h, n % w); tokens n >= f·h·w (padding) are normalised but not rotated.
struct RopeArgs {
  const float* table = nullptr;  // device copy of rope_table_f32(head_dim, max_pos)
  int max_pos = 0;               // positions per axis in the table (f, h, w <= max_pos)
  int head_dim = 128;
  int64_t seq = 0;               // S: rows per sample
  int64_t f = 0, h = 0, w = 0;   // latent grid after patching
  // Sequence parallel (spec §8): the rows are the slice [offset, offset + seq) of each sample's padded
  // sequence of `total` tokens, so row r is token n = offset + r % seq. total = 0: whole sequences.
  int64_t offset = 0, total = 0;
};
// Host: cos/sin of pos·inv_j for every position and complex pair of a head, computed in float64 exactly
// as wan::ops::rope_table and rounded to fp32: [max_pos][head_dim/2][2] = (cos, sin). Pair j belongs to
// the frame axis for j < c - 2·(c/3), then height, then width (c = head_dim/2; 22/21/21 at 128).
std::vector<float> rope_table_f32(int head_dim, int max_pos = 1024);
// y = rope(bf16(bf16(x·rsqrt(mean(x²) + eps))·w)) per row, in fp32 with one rounding to bf16 at the
// end; without rope (rope == nullptr: cross-attention) y = bf16(bf16(x·rsqrt(...))·w). k may be null;
// when given it is normalised in the same launch with the same D, eps and rope (q and k of one
// attention). D = H·head_dim, D % 8 == 0, D <= 32768; head_dim % 8 == 0.
void qk_rmsnorm_rope(const RmsNormJob& q, const RmsNormJob* k, int64_t D, float eps, const RopeArgs* rope,
                     cudaStream_t stream);

// ---- residual adds (fp32 residual stream) ----
// x[r, :] = x[r, :] + y[r, :]·gate_r (the product rounded to fp32 first, as the reference), x fp32
// [rows, D], y bf16 [rows, D] (a GEMM output). D % 8 == 0, pointers 16-byte aligned.
void gated_residual_add(float* x, const bf16* y, int64_t rows, int64_t D, const ModVec& gate, cudaStream_t stream);
// x[i] += y[i] for i < n. Any n and alignment (vectors where possible). The forward fuses this add
// (after the cross-attention) into norm2 (residual_add_layernorm_modulate); kept, like layernorm_affine,
// as the unfused reference of the fused kernels' bit-identity tests.
void residual_add(float* x, const bf16* y, int64_t n, cudaStream_t stream);

// ---- time embedding ----
// out[i, :] = [cos(t_i·ω_0..half-1), sin(t_i·ω_0..half-1)], ω_k = 10000^(-k/half), half = dim/2, in
// float64, rounded to fp32 (spec §2.4). t [n] holds per-sample or per-token timesteps (n = B or
// B·S). dim % 8 == 0, out 16-byte aligned.
void timestep_embedding(const float* t, int64_t n, int64_t dim, float* out, cudaStream_t stream);
// y = x / (1 + exp(-x)), fp32, any n; y may equal x.
void silu(const float* x, float* y, int64_t n, cudaStream_t stream);

// ---- patch embedding and unpatchify (spec §2.3, §2.9) ----
// im2col of the patch-embedding Conv3d: x fp32 [B, C, T, H, W] (latents) -> rows bf16 [B, S, K],
// K = C·pt·ph·pw, features ordered (c, qt, qh, qw) like the flattened Conv3d weight [dim, K], token
// n = (fi·h + hi)·w + wi (f = T/pt, h = H/ph, w = W/pw, L = f·h·w <= S). Rows n >= L of each sample
// are written as zeros (note: the GEMM's bias makes them non-zero; the reference pads after the
// conv). The patch embedding is then rows · weight[dim, K]ᵀ + bias with GemmRunner. K % 8 == 0.
void patchify_bf16(const float* x, bf16* rows, int64_t B, int64_t C, int64_t T, int64_t H, int64_t W, int pt,
                   int ph, int pw, int64_t S, cudaStream_t stream);
// Output head rows fp32 [B, S, K] (K = pt·ph·pw·C, features ordered (qt, qh, qw, c), c fastest; only
// the first f·h·w rows of each sample are read) -> out fp32 [B, C, f·pt, h·ph, w·pw].
void unpatchify(const float* rows, float* out, int64_t B, int64_t S, int64_t C, int64_t f, int64_t h, int64_t w,
                int pt, int ph, int pw, cudaStream_t stream);

// ---- conversions (round to nearest even, bit-identical to wan::f32_to_bf16 except NaN payloads) ----
// Any n and alignment (16-byte vectors when both pointers allow).
void convert_f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream);
void convert_bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t stream);

}  // namespace wan::cuda
