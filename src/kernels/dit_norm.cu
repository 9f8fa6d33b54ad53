// Row-normalisation kernels of the DiT block: LayerNorm + adaLN modulation (norm1, norm2, head norm)
// and affine LayerNorm (norm3), each also with the residual add before it fused in (the same kernel,
// which then stores the updated residual row and normalises it without reading it again), and the q/k
// RMSNorm over the full width fused with 3D RoPE.
// One block per row (per row and tensor for q/k): the row is loaded once into registers with 16-byte
// vectors, the statistics come from fixed-order block sums, and the output is written once; the
// modulation vectors (base + e0, spec §2.7) are summed on the fly and come from L1/L2, since every
// row of a sample reads the same ones.
// The q/k kernel keeps its row packed (bf16, 4 registers per chunk) with a chunks-per-thread template
// (row_layout): at D = 5120 that is 56 registers, 7 blocks per SM, and 98% of the device-to-device
// copy bandwidth on an H100 (a first version with 8 float slots per thread used 117-128 registers
// and reached 52%: too few bytes in flight). The fp32-input LayerNorm moves twice the bytes per
// chunk and reaches 93% with the simpler fixed-slot shape (row_threads).
// Invariants: see dit_kernels.h. Rounding order of the reference: LN in fp32, then (1 + scale),
// ·, + shift as separate fp32 roundings; RMSNorm result rounded to bf16 before the weight, the product
// rounded to bf16 (bf16 × bf16 in the reference), RoPE in fp32 from an fp32 table built in float64.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/check.h"
#include "kernels/device_vec.h"
#include "kernels/dit_kernels.h"
#include "kernels/fp8_cvt.cuh"

namespace wan::cuda {
namespace {
using namespace dit_detail;

// The residual add a LayerNorm absorbs (the add just before it in the block): none, x += a, or
// x += a·gate. The updated row is stored once, with the add kernels' arithmetic (gated_add8 / add8), and
// normalised from the same registers, so the output equals the unfused add followed by the unfused
// LayerNorm bit for bit.
enum class Add : uint8_t { None, Plain, Gated };
struct AddIn {
  const bf16* a = nullptr;  // [rows, D] the GEMM output added to the residual
  ModVec gate;              // Add::Gated only
};
// The residual is read-only without an add, updated in place with one.
template <Add kAdd>
using Resid = std::conditional_t<kAdd == Add::None, const float*, float*>;

// x fp32 [rows, D] (+= the add) -> y [rows, D]; kAffine: LN·w + b, else LN·(1 + scale) + shift. One
// block per row. All loads come first (no store can hold them back), the residual is stored in the
// variance pass, which loads nothing.
// OutT uint8_t: the FP8 GEMM input (Fp8Rows): each output rounded to bf16 (as the bf16 form stores it),
// kept in v, then the row quantised with core/fp8_rows.h's scale into y (e4m3) and y_scale[row].
template <typename OutT, bool kAffine, Add kAdd>
__global__ void __launch_bounds__(kMaxRowThreads)
    layernorm_kernel(Resid<kAdd> __restrict__ x, OutT* __restrict__ y, int64_t D, float eps, ModVec shift,
                     ModVec scale, const float* __restrict__ w, const float* __restrict__ b, AddIn add,
                     float* __restrict__ y_scale) {
  constexpr bool kFp8 = std::is_same_v<OutT, uint8_t>;
  __shared__ float smem[32];
  const int64_t r = blockIdx.x;
  const int64_t chunks = D / kChunk;
  const Resid<kAdd> xr = x + r * D;
  const float* gate_e = kAdd == Add::Gated ? add.gate.e_row(r) : nullptr;
  float v[kMaxChunksPerThread][kChunk];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxChunksPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < chunks) {
      load8(xr + c * kChunk, v[i]);
      if constexpr (kAdd != Add::None) {
        float a[kChunk];
        load8(add.a + r * D + c * kChunk, a);
        if constexpr (kAdd == Add::Gated) {
          float g[kChunk];
          mod8(add.gate.base, gate_e, c * kChunk, g);
          gated_add8(v[i], a, g);
        } else {
          add8(v[i], a);
        }
      }
#pragma unroll
      for (int e = 0; e < kChunk; ++e) s += v[i][e];
    }
  }
  const float mean = block_sum(s, smem) / static_cast<float>(D);
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxChunksPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < chunks) {
      if constexpr (kAdd != Add::None) store8(xr + c * kChunk, v[i]);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const float d = v[i][e] - mean;
        ss += d * d;
      }
    }
  }
  const float var = block_sum(ss, smem) / static_cast<float>(D);
  const float rstd = 1.0f / sqrtf(var + eps);
  const float* sh_e = shift.e_row(r);
  const float* sc_e = scale.e_row(r);
  OutT* yr = y + r * D;
  uint32_t amax = 0;  // kFp8: of the bf16-rounded outputs
#pragma unroll
  for (int i = 0; i < kMaxChunksPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < chunks) {
      const int64_t col = c * kChunk;
      float o[kChunk];
      if constexpr (kAffine) {
        float wv[kChunk], bv[kChunk];
        load8(w + col, wv);
        load8(b + col, bv);
#pragma unroll
        for (int e = 0; e < kChunk; ++e)
          o[e] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v[i][e], mean), rstd), wv[e]), bv[e]);
      } else {
        float sh[kChunk], sc[kChunk];
        mod8(shift.base, sh_e, col, sh);
        mod8(scale.base, sc_e, col, sc);
#pragma unroll
        for (int e = 0; e < kChunk; ++e)
          o[e] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v[i][e], mean), rstd), __fadd_rn(1.0f, sc[e])), sh[e]);
      }
      if constexpr (kFp8) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          v[i][e] = round_bf16(o[e]);
          amax = max(amax, fp8::abs_bits(v[i][e]));
        }
      } else {
        store8(yr + col, o);
      }
    }
  }
  if constexpr (kFp8) {
    __shared__ uint32_t umax[32];
    const fp8::RowScale rs = fp8::row_scale(block_reduce(amax, umax, 0u, MaxU32Op{}));
    if (threadIdx.x == 0) y_scale[r] = rs.scale;
#pragma unroll
    for (int i = 0; i < kMaxChunksPerThread; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (c < chunks) *reinterpret_cast<uint2*>(yr + c * kChunk) = quantize8(v[i], rs);
    }
  }
}

void check_mod(const ModVec& m, int64_t D, const char* what) {
  WAN_CHECK(m.base == nullptr || aligned16(m.base), what, ": modulation base not 16-byte aligned");
  WAN_CHECK(m.e == nullptr || aligned16(m.e), what, ": modulation e not 16-byte aligned");
  WAN_CHECK(m.e == nullptr || (m.rows_per_e >= 1 && m.e_stride % 4 == 0 && m.e_stride >= 0), what,
            ": bad modulation e layout (rows_per_e ", m.rows_per_e, ", e_stride ", m.e_stride, ")");
  WAN_CHECK(m.e_first == nullptr || (m.e && aligned16(m.e_first) && m.first_tokens >= 0 && m.token0 >= 0), what,
            ": bad first-frame modulation (e_first needs e and 16-byte alignment; first_tokens ", m.first_tokens,
            ", token0 ", m.token0, ")");
}

bool overlap(const void* p, size_t p_bytes, const void* q, size_t q_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return a < b + q_bytes && b < a + p_bytes;
}

template <typename OutT, bool kAffine, Add kAdd = Add::None>
void launch_layernorm(Resid<kAdd> x, OutT* y, int64_t rows, int64_t D, const ModVec& shift, const ModVec& scale,
                      const float* w, const float* b, float eps, cudaStream_t stream, const char* what,
                      const AddIn& add = {}, float* y_scale = nullptr) {
  WAN_CHECK(D > 0 && D % kChunk == 0, what, ": width ", D, " must be a positive multiple of 8");
  WAN_CHECK(aligned16(x) && aligned16(y), what, ": x and y must be 16-byte aligned");
  if constexpr (std::is_same_v<OutT, uint8_t>) WAN_CHECK(y_scale != nullptr, what, ": FP8 output without scales");
  if constexpr (kAdd != Add::None) {
    WAN_CHECK(add.a && aligned16(add.a), what, ": the added rows must be given and 16-byte aligned");
    if (kAdd == Add::Gated) check_mod(add.gate, D, what);
    const size_t n = static_cast<size_t>(rows * D);
    WAN_CHECK(!overlap(y, n * sizeof(OutT), add.a, n * 2) && !overlap(y, n * sizeof(OutT), x, n * 4) &&
                  !overlap(add.a, n * 2, x, n * 4),
              what, ": the residual, the added rows and the output must not overlap");
  }
  if (rows == 0) return;
  const int threads = row_threads(D / kChunk, what);
  layernorm_kernel<OutT, kAffine, kAdd>
      <<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, y, D, eps, shift, scale, w, b, add, y_scale);
  CUDA_CHECK_LAUNCH();
}

// ---- q/k RMSNorm + RoPE ----

struct RopeDev {
  const float* table;  // [max_pos][half][2]
  int64_t seq, f, h, w;
  int64_t offset;      // first token of the rows' slice (sequence parallel), 0 for whole sequences
  int half;            // pairs per head
  int p_f, p_fh;       // pairs [0, p_f) frame axis, [p_f, p_fh) height, [p_fh, half) width
  int head_dim;
};

// Rotates the pairs of one chunk (8 channels = 4 complex pairs of one head) in place.
__device__ __forceinline__ void rope8(float (&o)[kChunk], int col_in_head, const RopeDev& rope, int64_t pf,
                                      int64_t ph, int64_t pw) {
  const int j0 = col_in_head / 2;
#pragma unroll
  for (int p = 0; p < kChunk / 2; ++p) {
    const int j = j0 + p;
    const int64_t pos = j < rope.p_f ? pf : (j < rope.p_fh ? ph : pw);
    const float2 cs = *reinterpret_cast<const float2*>(rope.table + (pos * rope.half + j) * 2);
    const float a = o[2 * p], b = o[2 * p + 1];
    o[2 * p] = a * cs.x - b * cs.y;
    o[2 * p + 1] = a * cs.y + b * cs.x;
  }
}

// One block per (row, tensor). x and w chunks stay packed (4 registers per chunk) and are both loaded
// before the first use, so the weight's latency hides under the row's; kC chunks per thread.
template <bool kRope, int kC>
__global__ void __launch_bounds__(kMaxRowThreads)
    rmsnorm_rope_kernel(RmsNormJob j0, RmsNormJob j1, int64_t D, float eps, RopeDev rope) {
  __shared__ float smem[32];
  const RmsNormJob job = blockIdx.y == 0 ? j0 : j1;
  const int64_t r = blockIdx.x;
  if (r >= job.rows) return;  // whole block leaves together: no barrier is skipped by part of it
  const int chunks = static_cast<int>(D / kChunk);
  const uint4* xr = reinterpret_cast<const uint4*>(job.x + r * job.x_stride);
  const uint4* wr = reinterpret_cast<const uint4*>(job.w);
  uint4 xv[kC], wv[kC];
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      xv[i] = xr[c];
      wv[i] = wr[c];
    }
  }
  bool rotate = false;
  int64_t pf = 0, ph = 0, pw = 0;
  if constexpr (kRope) {
    const int64_t n = rope.offset + r % rope.seq;
    if (n < rope.f * rope.h * rope.w) {
      rotate = true;
      pf = n / (rope.h * rope.w);
      ph = (n / rope.w) % rope.h;
      pw = n % rope.w;
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      float v[kChunk];
      unpack8(xv[i], v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) ss += v[e] * v[e];
    }
  }
  const float total = block_sum(ss, smem);
  const float rstd = 1.0f / sqrtf(total / static_cast<float>(D) + eps);
  bf16* yr = job.y + r * job.y_stride;  // in place: the whole row is in registers before the block_sum barrier
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      float v[kChunk], wf[kChunk], o[kChunk];
      unpack8(xv[i], v);
      unpack8(wv[i], wf);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) o[e] = round_bf16(__fmul_rn(round_bf16(__fmul_rn(v[e], rstd)), wf[e]));
      if constexpr (kRope) {
        if (rotate) rope8(o, (c * kChunk) % rope.head_dim, rope, pf, ph, pw);
      }
      store8(yr + static_cast<int64_t>(c) * kChunk, o);
    }
  }
}

template <bool kRope>
void launch_rmsnorm_rope(dim3 grid, RowLayout lay, const RmsNormJob& q, const RmsNormJob& k, int64_t D, float eps,
                         const RopeDev& rd, cudaStream_t stream) {
  switch (lay.per_thread) {
    case 1: rmsnorm_rope_kernel<kRope, 1><<<grid, lay.threads, 0, stream>>>(q, k, D, eps, rd); break;
    case 2: rmsnorm_rope_kernel<kRope, 2><<<grid, lay.threads, 0, stream>>>(q, k, D, eps, rd); break;
    case 4: rmsnorm_rope_kernel<kRope, 4><<<grid, lay.threads, 0, stream>>>(q, k, D, eps, rd); break;
    default: rmsnorm_rope_kernel<kRope, 8><<<grid, lay.threads, 0, stream>>>(q, k, D, eps, rd); break;
  }
}

void check_job(const RmsNormJob& j, int64_t D, const char* name) {
  WAN_CHECK(j.x && j.w && j.y, "qk_rmsnorm_rope: ", name, ": null pointer");
  WAN_CHECK(j.rows >= 0 && j.rows <= 0x7FFFFFFF, "qk_rmsnorm_rope: ", name, ": rows ", j.rows);
  WAN_CHECK(j.x_stride >= D && j.x_stride % kChunk == 0, "qk_rmsnorm_rope: ", name, ": row stride ", j.x_stride,
            " must be >= D = ", D, " and a multiple of 8");
  WAN_CHECK(aligned16(j.x) && aligned16(j.w) && aligned16(j.y), "qk_rmsnorm_rope: ", name,
            ": pointers must be 16-byte aligned");
  WAN_CHECK(j.y_stride >= D && j.y_stride % kChunk == 0, "qk_rmsnorm_rope: ", name, ": output row stride ",
            j.y_stride, " must be >= D = ", D, " and a multiple of 8");
  WAN_CHECK(j.y != j.x || j.x_stride == j.y_stride, "qk_rmsnorm_rope: ", name,
            ": in place only with equal input and output strides");
}

}  // namespace

void layernorm_modulate(const float* x, bf16* y, int64_t rows, int64_t D, const ModVec& shift, const ModVec& scale,
                        float eps, cudaStream_t stream) {
  check_mod(shift, D, "layernorm_modulate shift");
  check_mod(scale, D, "layernorm_modulate scale");
  launch_layernorm<bf16, false>(x, y, rows, D, shift, scale, nullptr, nullptr, eps, stream, "layernorm_modulate");
}
void layernorm_modulate(const float* x, float* y, int64_t rows, int64_t D, const ModVec& shift, const ModVec& scale,
                        float eps, cudaStream_t stream) {
  check_mod(shift, D, "layernorm_modulate shift");
  check_mod(scale, D, "layernorm_modulate scale");
  launch_layernorm<float, false>(x, y, rows, D, shift, scale, nullptr, nullptr, eps, stream, "layernorm_modulate");
}
void layernorm_modulate(const float* x, const Fp8Rows& y, int64_t rows, int64_t D, const ModVec& shift,
                        const ModVec& scale, float eps, cudaStream_t stream) {
  check_mod(shift, D, "layernorm_modulate shift");
  check_mod(scale, D, "layernorm_modulate scale");
  launch_layernorm<uint8_t, false>(x, y.q, rows, D, shift, scale, nullptr, nullptr, eps, stream, "layernorm_modulate",
                                   {}, y.scale);
}
void layernorm_affine(const float* x, const float* w, const float* b, bf16* y, int64_t rows, int64_t D, float eps,
                      cudaStream_t stream) {
  WAN_CHECK(w && b && aligned16(w) && aligned16(b), "layernorm_affine: weight and bias must be 16-byte aligned");
  launch_layernorm<bf16, true>(x, y, rows, D, ModVec{}, ModVec{}, w, b, eps, stream, "layernorm_affine");
}
namespace {
// The residual add (gated when `gate` is given) fused in front of the LayerNorm: modulated or affine;
// bf16 output, or e4m3 rows with their scales (y_scale given).
template <bool kAffine, typename OutT>
void launch_add_layernorm(float* x, const bf16* a, const ModVec* gate, OutT* y, int64_t rows, int64_t D,
                          const ModVec& shift, const ModVec& scale, const float* w, const float* b, float eps,
                          cudaStream_t stream, const char* what, float* y_scale = nullptr) {
  if (gate)
    launch_layernorm<OutT, kAffine, Add::Gated>(x, y, rows, D, shift, scale, w, b, eps, stream, what, AddIn{a, *gate},
                                                y_scale);
  else
    launch_layernorm<OutT, kAffine, Add::Plain>(x, y, rows, D, shift, scale, w, b, eps, stream, what,
                                                AddIn{a, ModVec{}}, y_scale);
}
constexpr const char* kAddModulate = "residual_add_layernorm_modulate";
constexpr const char* kAddAffine = "residual_add_layernorm_affine";
void check_modulate(const ModVec& shift, const ModVec& scale, int64_t D) {
  check_mod(shift, D, kAddModulate);
  check_mod(scale, D, kAddModulate);
}
void check_affine(const float* w, const float* b) {
  WAN_CHECK(w && b && aligned16(w) && aligned16(b), kAddAffine, ": weight and bias must be 16-byte aligned");
}
}  // namespace

void residual_add_layernorm_modulate(float* x, const bf16* a, const ModVec* gate, bf16* y, int64_t rows, int64_t D,
                                     const ModVec& shift, const ModVec& scale, float eps, cudaStream_t stream) {
  check_modulate(shift, scale, D);
  launch_add_layernorm<false>(x, a, gate, y, rows, D, shift, scale, nullptr, nullptr, eps, stream, kAddModulate);
}
void residual_add_layernorm_modulate(float* x, const bf16* a, const ModVec* gate, const Fp8Rows& y, int64_t rows,
                                     int64_t D, const ModVec& shift, const ModVec& scale, float eps,
                                     cudaStream_t stream) {
  check_modulate(shift, scale, D);
  launch_add_layernorm<false>(x, a, gate, y.q, rows, D, shift, scale, nullptr, nullptr, eps, stream, kAddModulate,
                              y.scale);
}
void residual_add_layernorm_affine(float* x, const bf16* a, const ModVec* gate, const float* w, const float* b,
                                   bf16* y, int64_t rows, int64_t D, float eps, cudaStream_t stream) {
  check_affine(w, b);
  launch_add_layernorm<true>(x, a, gate, y, rows, D, ModVec{}, ModVec{}, w, b, eps, stream, kAddAffine);
}
void residual_add_layernorm_affine(float* x, const bf16* a, const ModVec* gate, const float* w, const float* b,
                                   const Fp8Rows& y, int64_t rows, int64_t D, float eps, cudaStream_t stream) {
  check_affine(w, b);
  launch_add_layernorm<true>(x, a, gate, y.q, rows, D, ModVec{}, ModVec{}, w, b, eps, stream, kAddAffine, y.scale);
}

std::vector<float> rope_table_f32(int head_dim, int max_pos) {
  WAN_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_table_f32: head_dim ", head_dim, " must be positive and even");
  WAN_CHECK(max_pos > 0, "rope_table_f32: max_pos ", max_pos);
  const int half = head_dim / 2;
  const int p[3] = {half - 2 * (half / 3), half / 3, half / 3};
  std::vector<float> t(static_cast<size_t>(max_pos) * half * 2);
  int j = 0;
  for (int a = 0; a < 3; ++a) {
    const double dim_axis = 2.0 * p[a];
    for (int q = 0; q < p[a]; ++q, ++j) {
      // Same float64 expression as wan::ops::rope_table (the reference's complex128 table).
      const double inv = 1.0 / std::pow(10000.0, (2.0 * q) / dim_axis);
      for (int pos = 0; pos < max_pos; ++pos) {
        const double ang = static_cast<double>(pos) * inv;
        const size_t at = (static_cast<size_t>(pos) * half + j) * 2;
        t[at] = static_cast<float>(std::cos(ang));
        t[at + 1] = static_cast<float>(std::sin(ang));
      }
    }
  }
  return t;
}

namespace {
// Validates a q/k call and returns the kernel's RoPE geometry (zeros without RoPE).
RopeDev check_qk(const RmsNormJob& q, const RmsNormJob* k, int64_t D, const RopeArgs* rope) {
  WAN_CHECK(D > 0 && D % kChunk == 0, "qk_rmsnorm_rope: width ", D, " must be a positive multiple of 8");
  check_job(q, D, "q");
  if (k) check_job(*k, D, "k");
  RopeDev rd{};
  if (rope) {
    const int hd = rope->head_dim;
    WAN_CHECK(rope->table && hd > 0 && hd % kChunk == 0 && D % hd == 0, "qk_rmsnorm_rope: head_dim ", hd,
              " must be a multiple of 8 dividing D = ", D);
    WAN_CHECK(rope->f >= 1 && rope->h >= 1 && rope->w >= 1 && rope->f <= rope->max_pos &&
                  rope->h <= rope->max_pos && rope->w <= rope->max_pos,
              "qk_rmsnorm_rope: grid (", rope->f, ", ", rope->h, ", ", rope->w, ") outside the table's ",
              rope->max_pos, " positions per axis");
    const int64_t total = rope->total > 0 ? rope->total : rope->seq;
    WAN_CHECK(total >= rope->f * rope->h * rope->w, "qk_rmsnorm_rope: grid has ", rope->f * rope->h * rope->w,
              " tokens but the sequence only ", total);
    WAN_CHECK(rope->offset >= 0 && rope->offset + rope->seq <= total, "qk_rmsnorm_rope: slice [", rope->offset, ", ",
              rope->offset + rope->seq, ") outside the sequence of ", total, " tokens");
    WAN_CHECK(q.rows % rope->seq == 0 && (!k || k->rows % rope->seq == 0), "qk_rmsnorm_rope: rows are not whole ",
              "sequences of ", rope->seq);
    WAN_CHECK(aligned16(rope->table), "qk_rmsnorm_rope: rope table must be 16-byte aligned");
    const int half = hd / 2;
    rd = RopeDev{rope->table, rope->seq, rope->f, rope->h, rope->w, rope->offset, half, half - 2 * (half / 3),
                 half - 2 * (half / 3) + half / 3, hd};
  }
  return rd;
}
}  // namespace

void qk_rmsnorm_rope(const RmsNormJob& q_in, const RmsNormJob* k_in, int64_t D, float eps, const RopeArgs* rope,
                     cudaStream_t stream) {
  auto dense = [D](RmsNormJob j) {
    if (j.y_stride == 0) j.y_stride = D;
    return j;
  };
  const RmsNormJob q = dense(q_in), kj = k_in ? dense(*k_in) : RmsNormJob{};
  const RmsNormJob* k = k_in ? &kj : nullptr;
  const RopeDev rd = check_qk(q, k, D, rope);
  const int64_t rows = k ? std::max(q.rows, k->rows) : q.rows;
  if (rows == 0) return;
  const RowLayout lay = row_layout(D / kChunk, "qk_rmsnorm_rope");
  const dim3 grid(static_cast<unsigned>(rows), k ? 2u : 1u);
  const RmsNormJob second = k ? *k : RmsNormJob{};
  if (rope)
    launch_rmsnorm_rope<true>(grid, lay, q, second, D, eps, rd, stream);
  else
    launch_rmsnorm_rope<false>(grid, lay, q, second, D, eps, rd, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace wan::cuda
