// CPU float32 VAE ops (see vae_ops.h for layouts and semantics).
// Convolution = im2col + GEMM without materialising the im2col matrix: a task owns one output frame
// and a tile of output positions, packs kKC rows of the (virtual) im2col matrix at a time into
// 16-column panels in thread-local scratch, and runs ops::gemm_packed (the DiT linear's 4 x 16
// register-blocked kernel) over them with the weight rows read in place. Each output element is one
// vector lane summed over k in order, so vectorisation never reassociates a sum.
#include "ops/vae_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu_ops.h"

namespace wan::vae {
namespace {

// Panels are ops::gemm_packed's (kNR = 16 columns). kKC rows x (up to kNC columns) of packed im2col
// = 256 KiB: stays in L2 while every weight row panel streams over it.
constexpr int64_t kNR = ops::kGemmNR;
constexpr int64_t kKC = 256;
constexpr int64_t kNC = 256;

// Everything a conv task needs (plain values; one per conv3d call).
struct ConvJob {
  const std::vector<const float*>* frames;
  int64_t Cin, H, W, kt, kh, kw;
  ConvGeom g;
  int64_t Hout, Wout, N, K, M;
  const float* w;     // [M, K]
  const float* bias;  // [M] or null
  float* out;         // [Tout, M, N]
};

// One task: output frame t, output positions [n0, n1). scratch: kKC * kNC floats; base: 2 * kNC ints.
__attribute__((target_clones("avx2", "default"))) void conv_tile(const ConvJob& j, int64_t t, int64_t n0,
                                                                  int64_t n1, float* scratch, int64_t* base) {
  const int64_t nc = n1 - n0;
  const int64_t panels = (nc + kNR - 1) / kNR;
  int64_t* by = base;
  int64_t* bx = base + kNC;
  for (int64_t c = 0; c < panels * kNR; ++c) {
    const int64_t n = n0 + c;
    if (n < n1) {
      by[c] = (n / j.Wout) * j.g.sh - j.g.pad_top;
      bx[c] = (n % j.Wout) * j.g.sw - j.g.pad_left;
    } else {
      by[c] = std::numeric_limits<int32_t>::min();  // never inside the frame
      bx[c] = 0;
    }
  }
  const int64_t HW = j.H * j.W;
  float* out_t = j.out + t * j.M * j.N + n0;
  for (int64_t k0 = 0; k0 < j.K; k0 += kKC) {
    const int64_t kc = std::min(kKC, j.K - k0);
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t k = k0 + kk;
      const int64_t dx = k % j.kw, dy = (k / j.kw) % j.kh, dt = (k / (j.kw * j.kh)) % j.kt;
      const int64_t ci = k / (j.kw * j.kh * j.kt);
      const float* f = (*j.frames)[t * j.g.st + dt];
      for (int64_t p = 0; p < panels; ++p) {
        float* dst = scratch + (p * kc + kk) * kNR;
        if (!f) {
          std::memset(dst, 0, kNR * sizeof(float));
          continue;
        }
        const float* fc = f + ci * HW;
        for (int64_t q = 0; q < kNR; ++q) {
          const int64_t c = p * kNR + q;
          const int64_t iy = by[c] + dy, ix = bx[c] + dx;
          dst[q] = (iy >= 0 && iy < j.H && ix >= 0 && ix < j.W) ? fc[iy * j.W + ix] : 0.0f;
        }
      }
    }
    ops::gemm_packed(j.w, j.K, j.M, k0, kc, scratch, nc, out_t, j.N, k0 == 0, j.bias);
  }
}

// Packs B[k, n] = src[k * sk + n * sn] for k in [0, K), n in [0, ncols) into kc-row panels in the
// layout ops::gemm_packed reads for one k block: returns panels for rows [k0, k0 + kc).
void pack_panels(const float* src, int64_t sk, int64_t sn, int64_t k0, int64_t kc, int64_t ncols, float* dst) {
  const int64_t panels = (ncols + kNR - 1) / kNR;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t kk = 0; kk < kc; ++kk) {
      float* d = dst + (p * kc + kk) * kNR;
      for (int64_t q = 0; q < kNR; ++q) {
        const int64_t n = p * kNR + q;
        d[q] = n < ncols ? src[(k0 + kk) * sk + n * sn] : 0.0f;
      }
    }
}

// C[M, N] = A[M, K] (lda) · B where B[k, n] = src[k * sk + n * sn]; serial (called inside tasks).
__attribute__((target_clones("avx2", "default"))) void gemm_serial(const float* A, int64_t lda, int64_t M,
                                                                    const float* src, int64_t sk, int64_t sn,
                                                                    int64_t K, int64_t N, float* C, int64_t ldc,
                                                                    std::vector<float>& scratch) {
  for (int64_t n0 = 0; n0 < N; n0 += kNC) {
    const int64_t nc = std::min(kNC, N - n0);
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0);
      const size_t need = static_cast<size_t>(((nc + kNR - 1) / kNR) * kc * kNR);
      if (scratch.size() < need) scratch.resize(need);
      pack_panels(src + n0 * sn, sk, sn, k0, kc, nc, scratch.data());
      ops::gemm_packed(A, lda, M, k0, kc, scratch.data(), nc, C + n0, ldc, k0 == 0, nullptr);
    }
  }
}

void check_frames(const Tensor& x, const char* op) {
  WAN_CHECK(x.dtype() == DType::F32 && x.ndim() == 4, op, ": expected a float32 [T, C, H, W] tensor, got ",
            dtype_name(x.dtype()), " ", x.shape().str());
}

}  // namespace

Tensor to_frames(const Tensor& cthw) {
  WAN_CHECK(cthw.ndim() == 4, "to_frames: expected [C, T, H, W], got ", cthw.shape().str());
  Tensor src = cthw.to_f32();
  const int64_t C = src.dim(0), T = src.dim(1), HW = src.dim(2) * src.dim(3);
  Tensor out = Tensor::empty(DType::F32, {T, C, src.dim(2), src.dim(3)});
  const float* s = src.f32();
  float* d = out.f32();
  parallel_for(T * C, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / C, c = i % C;
      std::memcpy(d + i * HW, s + (c * T + t) * HW, HW * sizeof(float));
    }
  });
  return out;
}

Tensor from_frames(const Tensor& tchw) {
  check_frames(tchw, "from_frames");
  const int64_t T = tchw.dim(0), C = tchw.dim(1), HW = tchw.dim(2) * tchw.dim(3);
  Tensor out = Tensor::empty(DType::F32, {C, T, tchw.dim(2), tchw.dim(3)});
  const float* s = tchw.f32();
  float* d = out.f32();
  parallel_for(T * C, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t c = i / T, t = i % T;
      std::memcpy(d + i * HW, s + (t * C + c) * HW, HW * sizeof(float));
    }
  });
  return out;
}

Tensor slice_frames(const Tensor& x, int64_t t0, int64_t t1) {
  check_frames(x, "slice_frames");
  WAN_ASSERT(0 <= t0 && t0 <= t1 && t1 <= x.dim(0), "frames [", t0, ", ", t1, ") of ", x.shape().str());
  Tensor out = Tensor::empty(DType::F32, {t1 - t0, x.dim(1), x.dim(2), x.dim(3)});
  std::memcpy(out.f32(), frame_ptr(x, t0), static_cast<size_t>((t1 - t0) * frame_elems(x)) * sizeof(float));
  return out;
}

Tensor cat_frames(const Tensor& a, const Tensor& b) {
  if (!a.defined() || a.numel() == 0) return b;
  if (!b.defined() || b.numel() == 0) return a;
  check_frames(a, "cat_frames");
  check_frames(b, "cat_frames");
  WAN_ASSERT(a.dim(1) == b.dim(1) && a.dim(2) == b.dim(2) && a.dim(3) == b.dim(3), a.shape().str(), " vs ",
             b.shape().str());
  Tensor out = Tensor::empty(DType::F32, {a.dim(0) + b.dim(0), a.dim(1), a.dim(2), a.dim(3)});
  std::memcpy(out.f32(), a.f32(), a.nbytes());
  std::memcpy(out.f32() + a.numel(), b.f32(), b.nbytes());
  return out;
}

std::vector<const float*> frame_list(const Tensor& x) {
  std::vector<const float*> f(static_cast<size_t>(x.dim(0)));
  for (int64_t t = 0; t < x.dim(0); ++t) f[t] = frame_ptr(x, t);
  return f;
}

Tensor conv3d(const std::vector<const float*>& frames, int64_t Cin, int64_t H, int64_t W, const Tensor& weight,
              const Tensor& bias, const ConvGeom& g) {
  WAN_CHECK(weight.dtype() == DType::F32 && (weight.ndim() == 5 || weight.ndim() == 4),
            "conv3d: weight must be a float32 [Cout, Cin, kt, kh, kw] or [Cout, Cin, kh, kw] tensor, got ",
            weight.shape().str());
  ConvJob j{};
  const bool w5 = weight.ndim() == 5;
  j.frames = &frames;
  j.Cin = Cin;
  j.H = H;
  j.W = W;
  j.M = weight.dim(0);
  j.kt = w5 ? weight.dim(2) : 1;
  j.kh = weight.dim(w5 ? 3 : 2);
  j.kw = weight.dim(w5 ? 4 : 3);
  j.g = g;
  WAN_CHECK(weight.dim(1) == Cin, "conv3d: weight ", weight.shape().str(), " expects ", weight.dim(1),
            " input channels, input has ", Cin);
  WAN_CHECK(!bias.defined() || (bias.dtype() == DType::F32 && bias.numel() == j.M), "conv3d: bias ",
            bias.shape().str(), " does not match ", j.M, " output channels");
  const int64_t Tin = static_cast<int64_t>(frames.size());
  WAN_CHECK(Tin >= j.kt, "conv3d: ", Tin, " input frames for a temporal kernel of ", j.kt);
  const int64_t Tout = (Tin - j.kt) / g.st + 1;
  j.Hout = (H + g.pad_top + g.pad_bottom - j.kh) / g.sh + 1;
  j.Wout = (W + g.pad_left + g.pad_right - j.kw) / g.sw + 1;
  WAN_CHECK(j.Hout > 0 && j.Wout > 0, "conv3d: input ", H, "x", W, " too small for kernel ", j.kh, "x", j.kw);
  j.N = j.Hout * j.Wout;
  j.K = Cin * j.kt * j.kh * j.kw;
  j.w = weight.f32();
  j.bias = bias.defined() ? bias.f32() : nullptr;
  Tensor out = Tensor::empty(DType::F32, {Tout, j.M, j.Hout, j.Wout});
  j.out = out.f32();

  // Tile width: the full kNC unless that leaves fewer than ~2 tasks per thread.
  const int64_t want = 2 * num_threads();
  int64_t nc = kNC;
  while (nc > kNR && Tout * ((j.N + nc - 1) / nc) < want) nc -= kNR;
  const int64_t tiles = (j.N + nc - 1) / nc;
  parallel_for(Tout * tiles, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(static_cast<size_t>(kKC * kNC));
    std::vector<int64_t> base(static_cast<size_t>(2 * kNC));
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / tiles, n0 = (i % tiles) * nc;
      conv_tile(j, t, n0, std::min(j.N, n0 + nc), scratch.data(), base.data());
    }
  });
  return out;
}

Tensor conv2d_frames(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeom& g) {
  check_frames(x, "conv2d_frames");
  WAN_CHECK(weight.ndim() == 4 || (weight.ndim() == 5 && weight.dim(2) == 1),
            "conv2d_frames: weight must be [Cout, Cin, kh, kw], got ", weight.shape().str());
  ConvGeom g2 = g;
  g2.st = 1;
  return conv3d(frame_list(x), x.dim(1), x.dim(2), x.dim(3), weight, bias, g2);
}

Tensor rms_norm(const Tensor& x, const Tensor& gamma, bool silu) {
  check_frames(x, "rms_norm");
  const int64_t T = x.dim(0), C = x.dim(1), HW = x.dim(2) * x.dim(3);
  WAN_CHECK(gamma.dtype() == DType::F32 && gamma.numel() == C, "rms_norm: gamma ", gamma.shape().str(),
            " does not match ", C, " channels");
  Tensor out = Tensor::empty(DType::F32, x.shape());
  const float* src = x.f32();
  const float* gm = gamma.f32();
  float* dst = out.f32();
  const float scale = std::sqrt(static_cast<float>(C));
  constexpr int64_t kBlock = 256;  // positions per task
  const int64_t blocks = (HW + kBlock - 1) / kBlock;
  parallel_for(T * blocks, 1, [&](int64_t b, int64_t e) {
    double acc[kBlock];
    float denom[kBlock];
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / blocks, p0 = (i % blocks) * kBlock, np = std::min(kBlock, HW - p0);
      const float* xs = src + t * C * HW + p0;
      float* ys = dst + t * C * HW + p0;
      for (int64_t p = 0; p < np; ++p) acc[p] = 0.0;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t p = 0; p < np; ++p) acc[p] += static_cast<double>(xs[c * HW + p]) * xs[c * HW + p];
      // F.normalize: x / max(||x||, eps), eps = 1e-12 on the norm itself.
      for (int64_t p = 0; p < np; ++p) denom[p] = std::max(static_cast<float>(std::sqrt(acc[p])), 1e-12f);
      for (int64_t c = 0; c < C; ++c) {
        const float gc = gm[c];
        for (int64_t p = 0; p < np; ++p) {
          float y = xs[c * HW + p] / denom[p] * scale * gc;
          if (silu) y = y / (1.0f + std::exp(-y));
          ys[c * HW + p] = y;
        }
      }
    }
  });
  return out;
}

void add_inplace(Tensor& x, const Tensor& y) {
  WAN_CHECK(x.shape() == y.shape(), "add_inplace: ", x.shape().str(), " vs ", y.shape().str());
  float* a = x.f32();
  const float* b = y.f32();
  parallel_for(x.numel(), 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) a[i] += b[i];
  });
}

void clamp_inplace(Tensor& x, float lo, float hi) {
  float* a = x.f32();
  parallel_for(x.numel(), 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) a[i] = std::min(std::max(a[i], lo), hi);
  });
}

Tensor upsample_nearest2x(const Tensor& x) {
  check_frames(x, "upsample_nearest2x");
  const int64_t TC = x.dim(0) * x.dim(1), H = x.dim(2), W = x.dim(3);
  Tensor out = Tensor::empty(DType::F32, {x.dim(0), x.dim(1), 2 * H, 2 * W});
  const float* s = x.f32();
  float* d = out.f32();
  parallel_for(TC * 2 * H, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t tc = i / (2 * H), oy = i % (2 * H);
      const float* row = s + (tc * H + oy / 2) * W;
      float* o = d + i * 2 * W;
      for (int64_t ox = 0; ox < 2 * W; ++ox) o[ox] = row[ox / 2];
    }
  });
  return out;
}

Tensor attention_block(const Tensor& x, const Tensor& gamma, const Tensor& qkv_w, const Tensor& qkv_b,
                       const Tensor& proj_w, const Tensor& proj_b) {
  check_frames(x, "attention_block");
  const int64_t T = x.dim(0), C = x.dim(1), N = x.dim(2) * x.dim(3);
  Tensor qkv = conv2d_frames(rms_norm(x, gamma, false), qkv_w, qkv_b, ConvGeom{});  // [T, 3C, H, W]
  WAN_CHECK(qkv.dim(1) == 3 * C, "attention_block: to_qkv gives ", qkv.dim(1), " channels for C = ", C);
  Tensor attn = Tensor::empty(DType::F32, x.shape());  // [T, C, H, W]
  const float scale = 1.0f / std::sqrt(static_cast<float>(C));
  constexpr int64_t kQB = 64;  // queries per task: bounds the score block to kQB x N
  const int64_t qblocks = (N + kQB - 1) / kQB;
  parallel_for(T * qblocks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> qt(static_cast<size_t>(kQB * C)), s(static_cast<size_t>(kQB * N)),
        o(static_cast<size_t>(kQB * C)), scratch;
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / qblocks, i0 = (i % qblocks) * kQB, nq = std::min(kQB, N - i0);
      const float* q = frame_ptr(qkv, t);  // [3C, N]: q rows [0, C), k [C, 2C), v [2C, 3C)
      const float* k = q + C * N;
      const float* v = q + 2 * C * N;
      for (int64_t r = 0; r < nq; ++r)
        for (int64_t c = 0; c < C; ++c) qt[r * C + c] = q[c * N + i0 + r];
      gemm_serial(qt.data(), C, nq, k, N, 1, C, N, s.data(), N, scratch);  // S = Qᵀ K  [nq, N]
      for (int64_t r = 0; r < nq; ++r) {
        float* row = s.data() + r * N;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < N; ++j) {
          row[j] *= scale;
          mx = std::max(mx, row[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < N; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < N; ++j) row[j] *= inv;
      }
      gemm_serial(s.data(), N, nq, v, 1, N, N, C, o.data(), C, scratch);  // O = P Vᵀ  [nq, C]
      float* a = attn.f32() + t * C * N;
      for (int64_t r = 0; r < nq; ++r)
        for (int64_t c = 0; c < C; ++c) a[c * N + i0 + r] = o[r * C + c];
    }
  });
  Tensor out = conv2d_frames(attn, proj_w, proj_b, ConvGeom{});
  add_inplace(out, x);
  return out;
}

Tensor patchify(const Tensor& x, int p) {
  check_frames(x, "patchify");
  const int64_t T = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  WAN_CHECK(H % p == 0 && W % p == 0, "patchify: ", H, "x", W, " is not a multiple of the patch size ", p);
  const int64_t h = H / p, w = W / p;
  Tensor out = Tensor::empty(DType::F32, {T, C * p * p, h, w});
  const float* s = x.f32();
  float* d = out.f32();
  parallel_for(T * C * p * p, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / (C * p * p), oc = i % (C * p * p);
      const int64_t c = oc / (p * p), r = (oc / p) % p, q = oc % p;  // r: column offset, q: row offset
      const float* src = s + (t * C + c) * H * W;
      float* dst = d + i * h * w;
      for (int64_t y = 0; y < h; ++y)
        for (int64_t xx = 0; xx < w; ++xx) dst[y * w + xx] = src[(y * p + q) * W + xx * p + r];
    }
  });
  return out;
}

Tensor unpatchify(const Tensor& x, int p) {
  check_frames(x, "unpatchify");
  const int64_t T = x.dim(0), Cp = x.dim(1), h = x.dim(2), w = x.dim(3);
  WAN_CHECK(Cp % (p * p) == 0, "unpatchify: ", Cp, " channels is not a multiple of ", p * p);
  const int64_t C = Cp / (p * p), H = h * p, W = w * p;
  Tensor out = Tensor::empty(DType::F32, {T, C, H, W});
  const float* s = x.f32();
  float* d = out.f32();
  parallel_for(T * Cp, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / Cp, ic = i % Cp;
      const int64_t c = ic / (p * p), r = (ic / p) % p, q = ic % p;
      const float* src = s + i * h * w;
      float* dst = d + (t * C + c) * H * W;
      for (int64_t y = 0; y < h; ++y)
        for (int64_t xx = 0; xx < w; ++xx) dst[(y * p + q) * W + xx * p + r] = src[y * w + xx];
    }
  });
  return out;
}

Tensor avg_down3d(const Tensor& x, int64_t Cout, int ft, int fs) {
  check_frames(x, "avg_down3d");
  const int64_t T = x.dim(0), Cin = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t factor = static_cast<int64_t>(ft) * fs * fs;
  WAN_CHECK((Cin * factor) % Cout == 0 && H % fs == 0 && W % fs == 0, "avg_down3d: cannot reduce ",
            x.shape().str(), " to ", Cout, " channels with factors ", ft, "x", fs, "x", fs);
  const int64_t g = Cin * factor / Cout;
  const int64_t pad = (ft - T % ft) % ft;  // zero frames in front
  const int64_t To = (T + pad) / ft, h = H / fs, w = W / fs;
  Tensor out = Tensor::empty(DType::F32, {To, Cout, h, w});
  const float* s = x.f32();
  float* d = out.f32();
  parallel_for(To * Cout, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t to = i / Cout, co = i % Cout;
      float* dst = d + i * h * w;
      for (int64_t y = 0; y < h; ++y)
        for (int64_t xx = 0; xx < w; ++xx) {
          float sum = 0.0f;
          for (int64_t j = co * g; j < (co + 1) * g; ++j) {  // j = ((c*ft + dt)*fs + dh)*fs + dw
            const int64_t dw = j % fs, dh = (j / fs) % fs, dt = (j / (fs * fs)) % ft, c = j / factor;
            const int64_t tt = to * ft + dt - pad;
            if (tt >= 0) sum += s[((tt * Cin + c) * H + y * fs + dh) * W + xx * fs + dw];
          }
          dst[y * w + xx] = sum / static_cast<float>(g);
        }
    }
  });
  return out;
}

Tensor dup_up3d(const Tensor& x, int64_t Cout, int ft, int fs, bool first_chunk) {
  check_frames(x, "dup_up3d");
  const int64_t T = x.dim(0), Cin = x.dim(1), h = x.dim(2), w = x.dim(3);
  const int64_t factor = static_cast<int64_t>(ft) * fs * fs;
  WAN_CHECK((Cout * factor) % Cin == 0, "dup_up3d: cannot expand ", Cin, " to ", Cout, " channels x", factor);
  const int64_t rep = Cout * factor / Cin;
  const int64_t drop = first_chunk ? ft - 1 : 0;
  const int64_t To = T * ft - drop, H = h * fs, W = w * fs;
  Tensor out = Tensor::empty(DType::F32, {To, Cout, H, W});
  const float* s = x.f32();
  float* d = out.f32();
  parallel_for(To * Cout, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t to = i / Cout, co = i % Cout;
      const int64_t tf = to + drop, t = tf / ft, dt = tf % ft;
      float* dst = d + i * H * W;
      for (int64_t y = 0; y < H; ++y)
        for (int64_t xx = 0; xx < W; ++xx) {
          const int64_t j = ((co * ft + dt) * fs + y % fs) * fs + xx % fs;  // expanded channel
          dst[y * W + xx] = s[((t * Cin + j / rep) * h + y / fs) * w + xx / fs];
        }
    }
  });
  return out;
}

}  // namespace wan::vae
