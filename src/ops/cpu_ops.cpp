// CPU float32 reference ops (see cpu_ops.h for layouts and numerics).
// The GEMM packs W into column panels of kNR outputs so the innermost loop runs across output
// columns with one broadcast x value: it vectorises without reassociating any sum (each lane is one
// output element summed over k in order). An AVX2 clone of that kernel (gemm_packed, also used by the
// VAE convolutions) is selected at run time when available.
#include "ops/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

// The 32-byte vector helpers below are always inlined, so the AVX-without-AVX ABI note GCC emits for
// the default clone never applies to a real call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace wan::ops {

namespace {

// GEMM tiling. kNR = 16 columns: two AVX registers per row, so a kMR x kNR accumulator tile (8
// registers) stays in registers; kKC x kNR packed panel = 16 KiB stays in L1; a task covers
// kMC x kNC of y so its packed W block (kNC x kKC = 128 KiB) stays in L2 while its rows stream.
constexpr int64_t kNR = kGemmNR;
constexpr int64_t kMR = 4;
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 64;
constexpr int64_t kNC = 128;

// 8 floats: one AVX register in the avx2 clone, two SSE registers in the default one. Explicit
// vectors keep the accumulator tile in registers (auto-vectorised arrays were spilled).
typedef float v8f __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

// y[MR, ncols] (ldy) = init + x[MR, kc] (ldx) · wp, wp one packed kc x kNR panel. init: bias[r] when
// first (bias may be null -> 0), else the current y. ncols <= kNR.
template <int MR>
[[gnu::always_inline]] inline void micro_tile(const float* x, int64_t ldx, const float* wp, int64_t kc, float* y,
                                              int64_t ldy, int64_t ncols, bool first, const float* bias) {
  static_assert(kNR == 16, "micro_tile holds two 8-wide vectors per row");
  v8f a0[MR], a1[MR];
  if (first || ncols < kNR) {
    float tmp[kNR];
    for (int r = 0; r < MR; ++r) {
      for (int64_t j = 0; j < kNR; ++j)
        tmp[j] = first ? (bias ? bias[r] : 0.0f) : (j >= ncols ? 0.0f : y[r * ldy + j]);
      a0[r] = load8(tmp);
      a1[r] = load8(tmp + 8);
    }
  } else {
    for (int r = 0; r < MR; ++r) {
      a0[r] = load8(y + r * ldy);
      a1[r] = load8(y + r * ldy + 8);
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    const v8f w0 = load8(wp + k * kNR), w1 = load8(wp + k * kNR + 8);
    for (int r = 0; r < MR; ++r) {
      const float xv = x[r * ldx + k];
      a0[r] += xv * w0;
      a1[r] += xv * w1;
    }
  }
  if (ncols == kNR) {
    for (int r = 0; r < MR; ++r) {
      store8(y + r * ldy, a0[r]);
      store8(y + r * ldy + 8, a1[r]);
    }
  } else {
    float tmp[kNR];
    for (int r = 0; r < MR; ++r) {
      store8(tmp, a0[r]);
      store8(tmp + 8, a1[r]);
      for (int64_t j = 0; j < ncols; ++j) y[r * ldy + j] = tmp[j];
    }
  }
}

// One task: y[m0:m1, n0:n1] = x[m0:m1, :] · w[n0:n1, :]ᵀ (no bias). pack holds kNC x kKC floats.
void linear_task(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t m1, int64_t n0,
                 int64_t n1, float* pack) {
  const int64_t npanels = (n1 - n0 + kNR - 1) / kNR;
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kc = std::min(kKC, K - k0);
    for (int64_t p = 0; p < npanels; ++p) {
      float* dst = pack + p * kc * kNR;
      for (int64_t j = 0; j < kNR; ++j) {
        const int64_t n = n0 + p * kNR + j;
        if (n < n1) {
          const float* src = w + n * K + k0;
          for (int64_t k = 0; k < kc; ++k) dst[k * kNR + j] = src[k];
        } else {
          for (int64_t k = 0; k < kc; ++k) dst[k * kNR + j] = 0.0f;
        }
      }
    }
    gemm_packed(x + m0 * K, K, m1 - m0, k0, kc, pack, n1 - n0, y + m0 * N + n0, N, k0 == 0, nullptr);
  }
}

}  // namespace

__attribute__((target_clones("avx2", "default"))) void gemm_packed(const float* A, int64_t lda, int64_t M,
                                                                    int64_t k0, int64_t kc, const float* bp,
                                                                    int64_t ncols, float* C, int64_t ldc, bool first,
                                                                    const float* bias) {
  const int64_t panels = (ncols + kNR - 1) / kNR;
  for (int64_t m0 = 0; m0 < M; m0 += kMR) {
    const int64_t mr = std::min(kMR, M - m0);
    const float* a = A + m0 * lda + k0;
    const float* b = bias ? bias + m0 : nullptr;
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t n0 = p * kNR;
      const int64_t nc = std::min(kNR, ncols - n0);
      const float* wp = bp + p * kc * kNR;
      float* c = C + m0 * ldc + n0;
      switch (mr) {
        case 4: micro_tile<4>(a, lda, wp, kc, c, ldc, nc, first, b); break;
        case 3: micro_tile<3>(a, lda, wp, kc, c, ldc, nc, first, b); break;
        case 2: micro_tile<2>(a, lda, wp, kc, c, ldc, nc, first, b); break;
        default: micro_tile<1>(a, lda, wp, kc, c, ldc, nc, first, b); break;
      }
    }
  }
}

void linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t K, int64_t N) {
  WAN_ASSERT(M >= 0 && K >= 0 && N >= 0, "linear dims ", M, " ", K, " ", N);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = b ? b[n] : 0.0f;
    return;
  }
  const int64_t mt = (M + kMC - 1) / kMC, nt = (N + kNC - 1) / kNC;
  parallel_for(mt * nt, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> pack;
    pack.resize(static_cast<size_t>(kNC * kKC));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = (t / nt) * kMC, n0 = (t % nt) * kNC;
      const int64_t m1 = std::min(M, m0 + kMC), n1 = std::min(N, n0 + kNC);
      linear_task(x, w, y, K, N, m0, m1, n0, n1, pack.data());
      if (b)
        for (int64_t m = m0; m < m1; ++m)
          for (int64_t n = n0; n < n1; ++n) y[m * N + n] += b[n];
    }
  });
}

// ---- normalisation ----

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t dim, float eps) {
  WAN_ASSERT((w == nullptr) == (b == nullptr), "layer_norm: weight and bias must both be given or both null");
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      double sum = 0.0;
      for (int64_t i = 0; i < dim; ++i) sum += xr[i];
      const double mean = sum / static_cast<double>(dim);
      double var = 0.0;
      for (int64_t i = 0; i < dim; ++i) {
        const double d = xr[i] - mean;
        var += d * d;
      }
      var /= static_cast<double>(dim);
      const double rstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
      for (int64_t i = 0; i < dim; ++i) {
        const float n = static_cast<float>((xr[i] - mean) * rstd);
        yr[i] = w ? n * w[i] + b[i] : n;
      }
    }
  });
}

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      double ss = 0.0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps));
      for (int64_t i = 0; i < dim; ++i) {
        const float n = static_cast<float>(xr[i] * rstd);  // rounded before the weight (spec §9.6)
        yr[i] = w ? n * w[i] : n;
      }
    }
  });
}

// ---- elementwise ----

void gelu_tanh(const float* x, float* y, int64_t n) {
  const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
  parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::tanh(k0 * (v + 0.044715f * v * v * v)));
    }
  });
}

void silu(const float* x, float* y, int64_t n) {
  parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
  });
}

void add_inplace(float* x, const float* y, int64_t n) {
  parallel_for(n, 16384, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
  });
}

// ---- time embedding ----

void timestep_embedding(const float* t, int64_t n, int64_t dim, float* out) {
  WAN_CHECK(dim % 2 == 0, "timestep_embedding: dim ", dim, " must be even");
  const int64_t half = dim / 2;
  std::vector<double> omega(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k)
    omega[k] = std::pow(10000.0, -(static_cast<double>(k) / static_cast<double>(half)));
  for (int64_t i = 0; i < n; ++i) {
    const double ti = t[i];
    for (int64_t k = 0; k < half; ++k) {
      const double a = ti * omega[k];
      out[i * dim + k] = static_cast<float>(std::cos(a));
      out[i * dim + half + k] = static_cast<float>(std::sin(a));
    }
  }
}

// ---- modulation ----

void modulate(const float* x, const float* shift, const float* scale, int64_t mod_stride, float* y, int64_t rows,
              int64_t dim) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* sh = shift + r * mod_stride;
      const float* sc = scale + r * mod_stride;
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * (1.0f + sc[i]) + sh[i];
    }
  });
}

void gated_residual(float* x, const float* y, const float* gate, int64_t gate_stride, int64_t rows, int64_t dim) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = gate + r * gate_stride;
      const float* yr = y + r * dim;
      float* xr = x + r * dim;
      for (int64_t i = 0; i < dim; ++i) xr[i] = xr[i] + yr[i] * g[i];
    }
  });
}

// ---- RoPE ----

RopeTable rope_table(int head_dim, int max_pos) {
  WAN_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim ", head_dim, " must be positive and even");
  WAN_CHECK(max_pos > 0, "rope: max_pos ", max_pos);
  RopeTable t;
  t.head_dim = head_dim;
  t.max_pos = max_pos;
  const int c = head_dim / 2;
  t.pairs[1] = t.pairs[2] = c / 3;
  t.pairs[0] = c - 2 * (c / 3);
  for (int a = 0; a < 3; ++a) {
    const int p = t.pairs[a];
    const double dim_axis = 2.0 * p;
    t.cos[a].resize(static_cast<size_t>(max_pos) * p);
    t.sin[a].resize(static_cast<size_t>(max_pos) * p);
    for (int j = 0; j < p; ++j) {
      const double inv = 1.0 / std::pow(10000.0, (2.0 * j) / dim_axis);
      for (int pos = 0; pos < max_pos; ++pos) {
        const double ang = static_cast<double>(pos) * inv;
        t.cos[a][static_cast<size_t>(pos) * p + j] = std::cos(ang);
        t.sin[a][static_cast<size_t>(pos) * p + j] = std::sin(ang);
      }
    }
  }
  return t;
}

void rope_apply(float* x, int64_t B, int64_t S, int64_t heads, int64_t head_dim, int64_t f, int64_t h, int64_t w,
                const RopeTable& table) {
  WAN_CHECK(table.head_dim == head_dim, "rope: table built for head_dim ", table.head_dim, ", got ", head_dim);
  WAN_CHECK(f <= table.max_pos && h <= table.max_pos && w <= table.max_pos, "rope: grid (", f, ", ", h, ", ", w,
            ") exceeds ", table.max_pos, " positions per axis");
  const int64_t L = f * h * w;
  WAN_CHECK(L <= S, "rope: grid has ", L, " tokens but the sequence only ", S);
  parallel_for(B * L, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t bi = i / L, n = i % L;
      const int64_t pos[3] = {n / (h * w), (n / w) % h, n % w};
      float* tok = x + (bi * S + n) * heads * head_dim;
      for (int64_t hd = 0; hd < heads; ++hd) {
        float* v = tok + hd * head_dim;
        int64_t j = 0;
        for (int a = 0; a < 3; ++a) {
          const int p = table.pairs[a];
          const double* cs = table.cos[a].data() + pos[a] * p;
          const double* sn = table.sin[a].data() + pos[a] * p;
          for (int q = 0; q < p; ++q, ++j) {
            const double re = v[2 * j], im = v[2 * j + 1];
            v[2 * j] = static_cast<float>(re * cs[q] - im * sn[q]);
            v[2 * j + 1] = static_cast<float>(re * sn[q] + im * cs[q]);
          }
        }
      }
    }
  });
}

// ---- attention ----

namespace {
constexpr int64_t kQB = 8;   // queries per task: Kᵀ/V blocks are reused kQB times from cache
constexpr int64_t kKB = 64;  // keys per score block (Kᵀ packed as [key block][D][kKB])

__attribute__((target_clones("avx2", "default"))) void attention_qblock(const float* q, int64_t qstride, int64_t nq,
                                                                         const float* kt, const float* vv,
                                                                         int64_t klen, int64_t D, float scale,
                                                                         float* s, float* o, float* out,
                                                                         int64_t ostride) {
  const int64_t nkb = (klen + kKB - 1) / kKB;
  const int64_t kp = nkb * kKB;
  // scores s[nq][kp] = q·kᵀ, summed over d in order
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const float* ktb = kt + kb * D * kKB;
    for (int64_t qi = 0; qi < nq; ++qi) {
      float acc[kKB];
      for (int64_t j = 0; j < kKB; ++j) acc[j] = 0.0f;
      const float* qr = q + qi * qstride;
      for (int64_t d = 0; d < D; ++d) {
        const float qv = qr[d];
        const float* kr = ktb + d * kKB;
        for (int64_t j = 0; j < kKB; ++j) acc[j] += qv * kr[j];
      }
      std::memcpy(s + qi * kp + kb * kKB, acc, sizeof(acc));
    }
  }
  // softmax over the klen valid keys, then o = p·v / sum(p)
  for (int64_t qi = 0; qi < nq; ++qi) {
    float* sr = s + qi * kp;
    float mx = -INFINITY;
    for (int64_t j = 0; j < klen; ++j) {
      sr[j] *= scale;
      mx = std::max(mx, sr[j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < klen; ++j) {
      sr[j] = std::exp(sr[j] - mx);
      sum += sr[j];
    }
    float* orow = o + qi * D;
    for (int64_t d = 0; d < D; ++d) orow[d] = 0.0f;
    for (int64_t j = 0; j < klen; ++j) {
      const float p = sr[j];
      const float* vr = vv + j * D;
      for (int64_t d = 0; d < D; ++d) orow[d] += p * vr[d];
    }
    const float inv = static_cast<float>(1.0 / sum);
    float* dst = out + qi * ostride;
    for (int64_t d = 0; d < D; ++d) dst[d] = orow[d] * inv;
  }
}
}  // namespace

void attention(const float* q, const float* k, const float* v, float* out, int64_t B, int64_t Lq, int64_t Lk,
               int64_t H, int64_t D, const int64_t* k_lens, float scale) {
  const int64_t row = H * D;
  std::vector<float> kt, vv;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t klen = k_lens ? k_lens[b] : Lk;
    WAN_CHECK(klen >= 1 && klen <= Lk, "attention: k_len ", klen, " of sample ", b, " outside [1, ", Lk, "]");
    const int64_t nkb = (klen + kKB - 1) / kKB;
    const int64_t kp = nkb * kKB;
    kt.resize(static_cast<size_t>(D * kp));
    vv.resize(static_cast<size_t>(klen * D));
    for (int64_t hd = 0; hd < H; ++hd) {
      const float* kh = k + b * Lk * row + hd * D;
      const float* vh = v + b * Lk * row + hd * D;
      // Kᵀ packed [key block][D][kKB] (zero padded), V contiguous [klen][D]
      parallel_for(nkb, 1, [&](int64_t kb0, int64_t kb1) {
        for (int64_t blk = kb0; blk < kb1; ++blk) {
          float* dst = kt.data() + blk * D * kKB;
          for (int64_t jj = 0; jj < kKB; ++jj) {
            const int64_t j = blk * kKB + jj;
            for (int64_t d = 0; d < D; ++d) dst[d * kKB + jj] = j < klen ? kh[j * row + d] : 0.0f;
            if (j < klen) std::memcpy(vv.data() + j * D, vh + j * row, D * sizeof(float));
          }
        }
      });
      const int64_t nqb = (Lq + kQB - 1) / kQB;
      parallel_for(nqb, 1, [&](int64_t t0, int64_t t1) {
        thread_local std::vector<float> s, o;
        s.resize(static_cast<size_t>(kQB * kp));
        o.resize(static_cast<size_t>(kQB * D));
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t q0 = t * kQB;
          const int64_t nq = std::min(kQB, Lq - q0);
          attention_qblock(q + (b * Lq + q0) * row + hd * D, row, nq, kt.data(), vv.data(), klen, D, scale,
                           s.data(), o.data(), out + (b * Lq + q0) * row + hd * D, row);
        }
      });
    }
  }
}

// ---- patch embedding / unpatchify ----

void patchify(const float* x, float* rows, int64_t C, int64_t T, int64_t H, int64_t W, int pt, int ph, int pw) {
  WAN_CHECK(pt > 0 && ph > 0 && pw > 0, "patchify: bad patch (", pt, ", ", ph, ", ", pw, ")");
  WAN_CHECK(T % pt == 0 && H % ph == 0 && W % pw == 0, "patchify: latent [", T, ", ", H, ", ", W,
            "] is not a multiple of the patch (", pt, ", ", ph, ", ", pw, ")");
  const int64_t f = T / pt, h = H / ph, w = W / pw;
  const int64_t P = C * pt * ph * pw;
  parallel_for(f * h * w, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t fi = n / (h * w), hi = (n / w) % h, wi = n % w;
      float* r = rows + n * P;
      for (int64_t c = 0; c < C; ++c)
        for (int qt = 0; qt < pt; ++qt)
          for (int qh = 0; qh < ph; ++qh)
            for (int qw = 0; qw < pw; ++qw)
              *r++ = x[((c * T + fi * pt + qt) * H + hi * ph + qh) * W + wi * pw + qw];
    }
  });
}

void patch_embed(const float* x, const float* w, const float* b, float* out, int64_t C, int64_t T, int64_t H,
                 int64_t W, int64_t D, int pt, int ph, int pw) {
  WAN_CHECK(T % pt == 0 && H % ph == 0 && W % pw == 0, "patch_embed: latent [", T, ", ", H, ", ", W,
            "] is not a multiple of the patch (", pt, ", ", ph, ", ", pw, ")");
  const int64_t L = (T / pt) * (H / ph) * (W / pw);
  const int64_t P = C * pt * ph * pw;
  std::vector<float> rows(static_cast<size_t>(L * P));
  patchify(x, rows.data(), C, T, H, W, pt, ph, pw);
  linear(rows.data(), w, b, out, L, P, D);
}

void unpatchify(const float* rows, float* out, int64_t C, int64_t f, int64_t h, int64_t w, int pt, int ph, int pw) {
  const int64_t T = f * pt, H = h * ph, W = w * pw;
  const int64_t P = static_cast<int64_t>(pt) * ph * pw * C;
  parallel_for(f * h * w, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t fi = n / (h * w), hi = (n / w) % h, wi = n % w;
      const float* r = rows + n * P;
      for (int qt = 0; qt < pt; ++qt)
        for (int qh = 0; qh < ph; ++qh)
          for (int qw = 0; qw < pw; ++qw)
            for (int64_t c = 0; c < C; ++c)
              out[((c * T + fi * pt + qt) * H + hi * ph + qh) * W + wi * pw + qw] = *r++;
    }
  });
}

}  // namespace wan::ops
