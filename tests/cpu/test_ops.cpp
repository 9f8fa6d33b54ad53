// CPU reference ops against straightforward double-precision re-computations written here from the
// spec formulas, on fresh random inputs with odd sizes (tile remainders), masking and broadcasts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/cpu_ops.h"

namespace {

using std::vector;

vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  vector<float> v(n);
  for (auto& x : v) x = offset + scale * d(g);
  return v;
}

// Max |a - b| / max |b| over all elements, and an elementwise check |a - b| <= tol·(|b| + floor).
void expect_close(const vector<float>& got, const vector<double>& want, double rel_tol, double floor,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double maxdiff = 0.0, maxref = 0.0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    maxdiff = std::max(maxdiff, d);
    maxref = std::max(maxref, std::fabs(want[i]));
    if (!(d <= rel_tol * (std::fabs(want[i]) + floor))) {
      if (bad++ == 0) first_bad = i;
    }
  }
  ASSERT_GT(maxref, 0.0) << what << ": reference is all zeros";
  const double rel = maxdiff / maxref;
  std::printf("  %-28s max rel err %.3g (n=%zu)\n", what, rel, got.size());
  EXPECT_LE(rel, rel_tol) << what;
  EXPECT_EQ(bad, 0u) << what << ": first bad index " << first_bad << " got " << got[first_bad] << " want "
                     << want[first_bad];
}

TEST(Ops, LinearOddSizes) {
  // M, K, N cross the row micro-tile (4), the k chunk (256), the panel (16) and the task tile (64x128).
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{37, 300, 150}, {1, 7, 5}, {70, 513, 129}, {2, 64, 300}}) {
    auto x = randn(M * K, 1 + M), w = randn(N * K, 2 + K, 0.1f), b = randn(N, 3 + N);
    for (bool with_bias : {true, false}) {
      vector<float> y(M * N, 123.0f);
      wan::ops::linear(x.data(), w.data(), with_bias ? b.data() : nullptr, y.data(), M, K, N);
      vector<double> ref(M * N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double s = with_bias ? b[n] : 0.0;
          for (int64_t k = 0; k < K; ++k) s += static_cast<double>(x[m * K + k]) * w[n * K + k];
          ref[m * N + n] = s;
        }
      expect_close(y, ref, 2e-5, 0.5, with_bias ? "linear+bias" : "linear");
    }
  }
}

TEST(Ops, LayerNormAffineAndPlain) {
  const int64_t rows = 19, dim = 333;
  auto x = randn(rows * dim, 10, 3.0f, 5.0f);  // non-zero mean: exposes one-pass variance errors
  auto w = randn(dim, 11), b = randn(dim, 12);
  for (bool affine : {false, true}) {
    vector<float> y(rows * dim);
    wan::ops::layer_norm(x.data(), affine ? w.data() : nullptr, affine ? b.data() : nullptr, y.data(), rows, dim,
                         1e-6f);
    vector<double> ref(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
      mean /= dim;
      for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
      var /= dim;
      for (int64_t i = 0; i < dim; ++i) {
        double n = (x[r * dim + i] - mean) / std::sqrt(var + 1e-6);
        ref[r * dim + i] = affine ? n * w[i] + b[i] : n;
      }
    }
    expect_close(y, ref, 1e-6, 1.0, affine ? "layer_norm affine" : "layer_norm");
  }
  // in place
  vector<float> y = x;
  wan::ops::layer_norm(y.data(), nullptr, nullptr, y.data(), rows, dim, 1e-6f);
  vector<float> y2(rows * dim);
  wan::ops::layer_norm(x.data(), nullptr, nullptr, y2.data(), rows, dim, 1e-6f);
  EXPECT_EQ(y, y2);
}

TEST(Ops, RmsNormAcrossFullWidth) {
  // dim = 3 heads x 40: the norm must span all heads jointly.
  const int64_t rows = 11, dim = 120;
  auto x = randn(rows * dim, 20, 2.0f, 0.3f), w = randn(dim, 21);
  vector<float> y(rows * dim);
  wan::ops::rms_norm(x.data(), w.data(), y.data(), rows, dim, 1e-6f);
  vector<double> ref(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double rs = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * rs * w[i];
  }
  expect_close(y, ref, 1e-6, 1.0, "rms_norm");
}

TEST(Ops, Activations) {
  const int64_t n = 10007;
  auto x = randn(n, 30, 3.0f);
  vector<float> g(n), s(n);
  wan::ops::gelu_tanh(x.data(), g.data(), n);
  wan::ops::silu(x.data(), s.data(), n);
  vector<double> gr(n), sr(n);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    gr[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    sr[i] = v / (1.0 + std::exp(-v));
  }
  expect_close(g, gr, 1e-6, 0.1, "gelu_tanh");  // 1 + tanh cancels for x << 0: absolute floor
  expect_close(s, sr, 1e-6, 1e-3, "silu");
  // add_inplace
  auto y = randn(n, 31);
  vector<float> z = x;
  wan::ops::add_inplace(z.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(z[i], x[i] + y[i]);
}

TEST(Ops, TimestepEmbeddingFloat64CosFirst) {
  const vector<float> t = {0.0f, 1.0f, 437.0f, 999.0f, 875.5f};
  const int64_t dim = 256, half = 128;
  vector<float> out(t.size() * dim);
  wan::ops::timestep_embedding(t.data(), t.size(), dim, out.data());
  vector<double> ref(out.size());
  for (size_t i = 0; i < t.size(); ++i)
    for (int64_t k = 0; k < half; ++k) {
      const double a = static_cast<double>(t[i]) * std::exp(-std::log(10000.0) * k / half);
      ref[i * dim + k] = std::cos(a);
      ref[i * dim + half + k] = std::sin(a);
    }
  // Computed in float64 and rounded once: agreement to fp32 rounding even at t = 999.
  expect_close(out, ref, 2e-7, 1.0, "timestep_embedding");
  EXPECT_EQ(out[0], 1.0f);     // t = 0: cos half = 1
  EXPECT_EQ(out[half], 0.0f);  // sin half = 0
}

TEST(Ops, ModulateAndGate) {
  const int64_t rows = 9, dim = 70;
  auto x = randn(rows * dim, 40), y = randn(rows * dim, 41);
  auto mod = randn(rows * 6 * dim, 42, 0.5f);  // per-token [rows, 6, dim]
  for (int64_t stride : {int64_t{0}, 6 * dim}) {
    const float* shift = mod.data() + 0 * dim;
    const float* scale = mod.data() + 1 * dim;
    const float* gate = mod.data() + 2 * dim;
    vector<float> out(rows * dim);
    wan::ops::modulate(x.data(), shift, scale, stride, out.data(), rows, dim);
    vector<float> res = x;
    wan::ops::gated_residual(res.data(), y.data(), gate, stride, rows, dim);
    vector<double> ref(rows * dim), rref(rows * dim);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < dim; ++i) {
        const int64_t m = r * stride + i;
        ref[r * dim + i] = static_cast<double>(x[r * dim + i]) * (1.0 + scale[m]) + shift[m];
        rref[r * dim + i] = static_cast<double>(x[r * dim + i]) + static_cast<double>(y[r * dim + i]) * gate[m];
      }
    expect_close(out, ref, 1e-6, 1.0, stride ? "modulate per-token" : "modulate broadcast");
    expect_close(res, rref, 1e-6, 1.0, stride ? "gated_residual per-token" : "gated_residual broadcast");
  }
}

// RoPE recomputed from the spec text: angle = pos·10000^(-2j/dim_axis), 22/21/21 pairs at d = 128.
void rope_ref(const vector<float>& x, vector<double>& out, int64_t B, int64_t S, int64_t H, int64_t D, int64_t f,
              int64_t h, int64_t w) {
  out.assign(x.begin(), x.end());
  const int64_t c = D / 2, p1 = c / 3, p0 = c - 2 * p1;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < f * h * w; ++n) {
      const int64_t fi = n / (h * w), hi = (n / w) % h, wi = n % w;
      for (int64_t hd = 0; hd < H; ++hd)
        for (int64_t j = 0; j < c; ++j) {
          double ang;
          if (j < p0)
            ang = fi * std::pow(10000.0, -2.0 * j / (2.0 * p0));
          else if (j < p0 + p1)
            ang = hi * std::pow(10000.0, -2.0 * (j - p0) / (2.0 * p1));
          else
            ang = wi * std::pow(10000.0, -2.0 * (j - p0 - p1) / (2.0 * p1));
          const size_t o = ((b * S + n) * H + hd) * D + 2 * j;
          const double re = x[o], im = x[o + 1];
          out[o] = re * std::cos(ang) - im * std::sin(ang);
          out[o + 1] = re * std::sin(ang) + im * std::cos(ang);
        }
    }
}

TEST(Ops, Rope3dSplitAndPadding) {
  auto t = wan::ops::rope_table(128);
  EXPECT_EQ(t.pairs[0], 22);
  EXPECT_EQ(t.pairs[1], 21);
  EXPECT_EQ(t.pairs[2], 21);
  const int64_t B = 2, H = 2, D = 128, f = 3, h = 4, w = 5, L = f * h * w, S = L + 7;  // 7 padding tokens
  auto x = randn(B * S * H * D, 50);
  vector<float> y = x;
  wan::ops::rope_apply(y.data(), B, S, H, D, f, h, w, t);
  vector<double> ref;
  rope_ref(x, ref, B, S, H, D, f, h, w);
  expect_close(y, ref, 1e-6, 1.0, "rope d=128 grid 3x4x5");
  for (int64_t b = 0; b < B; ++b)  // padding tokens pass through bit-exact
    for (int64_t i = L * H * D; i < S * H * D; ++i) ASSERT_EQ(y[b * S * H * D + i], x[b * S * H * D + i]);
  // Large positions (far end of the 1024 table) and another head size (split 12/10/10 at d = 64).
  auto t64 = wan::ops::rope_table(64);
  EXPECT_EQ(t64.pairs[0], 12);
  EXPECT_EQ(t64.pairs[1], 10);
  const int64_t f2 = 2, h2 = 1, w2 = 1000;
  auto x2 = randn(f2 * h2 * w2 * 64, 51);
  vector<float> y2 = x2;
  wan::ops::rope_apply(y2.data(), 1, f2 * h2 * w2, 1, 64, f2, h2, w2, t64);
  rope_ref(x2, ref, 1, f2 * h2 * w2, 1, 64, f2, h2, w2);
  expect_close(y2, ref, 1e-6, 1.0, "rope d=64 w=1000");
  EXPECT_THROW(wan::ops::rope_apply(y2.data(), 1, 2000, 1, 64, 1, 1, 1025, t64), wan::Error);
}

void attention_ref(const vector<float>& q, const vector<float>& k, const vector<float>& v, vector<double>& out,
                   int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t D, const int64_t* k_lens) {
  out.assign(B * Lq * H * D, 0.0);
  const double sc = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kl = k_lens ? k_lens[b] : Lk;
    for (int64_t i = 0; i < Lq; ++i)
      for (int64_t hd = 0; hd < H; ++hd) {
        vector<double> s(kl);
        double mx = -1e300;
        for (int64_t j = 0; j < kl; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += static_cast<double>(q[((b * Lq + i) * H + hd) * D + e]) * k[((b * Lk + j) * H + hd) * D + e];
          s[j] = d * sc;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int64_t j = 0; j < kl; ++j)
          for (int64_t e = 0; e < D; ++e)
            out[((b * Lq + i) * H + hd) * D + e] += s[j] / sum * v[((b * Lk + j) * H + hd) * D + e];
      }
  }
}

TEST(Ops, AttentionMaskedAndCross) {
  // Self-attention-like with key masking (lengths cross the 64-key block) and a cross-attention
  // shape (Lq != Lk, no mask). Scores are scaled up so the softmax is peaked, not uniform.
  struct Case {
    int64_t B, Lq, Lk, H, D;
    vector<int64_t> lens;
  };
  for (const Case& c : {Case{2, 13, 70, 3, 40, {70, 23}}, Case{1, 5, 130, 2, 128, {}}, Case{2, 66, 66, 1, 128, {1, 65}}}) {
    auto q = randn(c.B * c.Lq * c.H * c.D, 60, 2.0f), k = randn(c.B * c.Lk * c.H * c.D, 61, 2.0f);
    auto v = randn(c.B * c.Lk * c.H * c.D, 62);
    const int64_t* lens = c.lens.empty() ? nullptr : c.lens.data();
    vector<float> out(c.B * c.Lq * c.H * c.D);
    wan::ops::attention(q.data(), k.data(), v.data(), out.data(), c.B, c.Lq, c.Lk, c.H, c.D, lens,
                        1.0f / std::sqrt(static_cast<float>(c.D)));
    vector<double> ref;
    attention_ref(q, k, v, ref, c.B, c.Lq, c.Lk, c.H, c.D, lens);
    expect_close(out, ref, 2e-5, 0.1, lens ? "attention masked" : "attention cross");
    if (lens) {
      // Garbage in masked keys/values must not change anything.
      auto k2 = k, v2 = v;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t j = lens[b]; j < c.Lk; ++j)
          for (int64_t e = 0; e < c.H * c.D; ++e) {
            k2[(b * c.Lk + j) * c.H * c.D + e] = 1e4f;
            v2[(b * c.Lk + j) * c.H * c.D + e] = -1e4f;
          }
      vector<float> out2(out.size());
      wan::ops::attention(q.data(), k2.data(), v2.data(), out2.data(), c.B, c.Lq, c.Lk, c.H, c.D, lens,
                          1.0f / std::sqrt(static_cast<float>(c.D)));
      EXPECT_EQ(out, out2);
    }
  }
  vector<float> z(4 * 8, 1.0f), o(4 * 8);
  const int64_t bad = 0;
  EXPECT_THROW(wan::ops::attention(z.data(), z.data(), z.data(), o.data(), 1, 4, 4, 1, 8, &bad, 1.0f), wan::Error);
}

TEST(Ops, PatchEmbedIsConv3dAndUnpatchifyInverts) {
  const int64_t C = 5, T = 3, H = 6, W = 10, D = 24;
  const int pt = 1, ph = 2, pw = 2;
  auto x = randn(C * T * H * W, 70), w = randn(D * C * pt * ph * pw, 71, 0.2f), b = randn(D, 72);
  const int64_t f = T / pt, h = H / ph, wd = W / pw, L = f * h * wd;
  vector<float> out(L * D);
  wan::ops::patch_embed(x.data(), w.data(), b.data(), out.data(), C, T, H, W, D, pt, ph, pw);
  // Direct Conv3d (kernel = stride = patch), token n = (fi·h + hi)·w + wi.
  vector<double> ref(L * D);
  for (int64_t fi = 0; fi < f; ++fi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t wi = 0; wi < wd; ++wi)
        for (int64_t o = 0; o < D; ++o) {
          double s = b[o];
          for (int64_t c = 0; c < C; ++c)
            for (int a = 0; a < pt; ++a)
              for (int p = 0; p < ph; ++p)
                for (int q = 0; q < pw; ++q)
                  s += static_cast<double>(w[(((o * C + c) * pt + a) * ph + p) * pw + q]) *
                       x[((c * T + fi * pt + a) * H + hi * ph + p) * W + wi * pw + q];
          ref[((fi * h + hi) * wd + wi) * D + o] = s;
        }
  expect_close(out, ref, 1e-5, 0.5, "patch_embed");

  // unpatchify: out[c, fi, 2hi+q, 2wi+r] = row(fi,hi,wi)[(q·2 + r)·C + c]
  const int64_t Co = 7;
  auto rows = randn(L * 4 * Co, 73);
  vector<float> vid(Co * T * H * W, -1.0f);
  wan::ops::unpatchify(rows.data(), vid.data(), Co, f, h, wd, pt, ph, pw);
  for (int64_t c = 0; c < Co; ++c)
    for (int64_t fi = 0; fi < f; ++fi)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t wi = 0; wi < wd; ++wi)
          for (int q = 0; q < 2; ++q)
            for (int r = 0; r < 2; ++r)
              ASSERT_EQ(vid[((c * T + fi) * H + 2 * hi + q) * W + 2 * wi + r],
                        rows[((fi * h + hi) * wd + wi) * 4 * Co + (q * 2 + r) * Co + c]);
  vector<float> bad(L * D);
  EXPECT_THROW(wan::ops::patch_embed(x.data(), w.data(), b.data(), bad.data(), C, T, H - 1, W, D, pt, ph, pw),
               wan::Error);
}

}  // namespace
