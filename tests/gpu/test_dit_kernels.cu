// The DiT's fused memory-bound kernels (src/kernels/dit_kernels.h) against the CPU reference ops
// (src/ops/cpu_ops.h), composed where a kernel fuses several ops, on fresh random inputs with NaN-
// poisoned outputs, odd row counts, and widths 256 and 5120.
// Precision rule (issue 4): for kernels with a bf16 output, the error against the fp32 CPU reference
// is at most twice that of the same maths done plainly in bf16 (every intermediate rounded to bf16),
// in max-abs and relative L2. Kernels whose arithmetic is fully specified (residual adds, patchify,
// unpatchify, conversions) must match the CPU bit for bit; fp32-output norms and the float64 sinusoid
// meet stated bounds (a few fp32 ulps). The residual adds fused into a LayerNorm must also equal the
// unfused add + LayerNorm kernels bit for bit (both outputs), and the modulation's two-timestep row
// choice (ModVec::e_first, TI2V image mode) the kernels given the per-token table it spells out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "kernels/check.h"
#include "kernels/dit_kernels.h"
#include "kernels/gemm.h"
#include "kernels/rng.h"
#include "gpu_test_util.h"
#include "ops/cpu_ops.h"

using namespace wan;
using namespace wan::gpu_test;
using cuda::ModVec;

namespace {

constexpr float kEps = 1e-6f;

cuda::bf16* bf(DevBuf<uint16_t>& b) { return reinterpret_cast<cuda::bf16*>(b.p); }

// Per-row modulation vectors base[i] + e[er·e_stride + i] (fp32 add), er = r / rows_per_e.
std::vector<float> mod_rows(const float* base, const float* e, int64_t e_stride, int64_t rows_per_e, int64_t rows,
                            int64_t D) {
  std::vector<float> m(rows * D);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < D; ++i) m[r * D + i] = base[i] + e[(r / rows_per_e) * e_stride + i];
  return m;
}

}  // namespace

// norm1/norm2 (bf16 out, block modulation + e0 per sample or per token) and the head norm (fp32 out,
// head modulation + e).
TEST(GpuDitKernels, LayerNormModulate) {
  REQUIRE_GPU();
  uint64_t seed = 0x1A0;
  for (int64_t D : {256, 5120}) {
    for (bool per_token : {false, true}) {
      const int64_t B = 2, S = 37, rows = B * S;
      const auto x = randn(++seed, rows * D, 3.0f, 0.5f);  // residual stream with a non-zero mean
      const auto mod = randn(++seed, 6 * D, 0.05f);        // block modulation [1, 6, D]
      const int64_t n_e = per_token ? rows : B;
      const auto e0 = randn(++seed, n_e * 6 * D, 0.5f);    // [B, 6, D] or [B, S, 6, D]
      const int64_t rows_per_e = per_token ? 1 : S;
      const std::string what = cat("D ", D, per_token ? " per-token" : " per-sample");

      // CPU: m = modulation + e0, LN, modulate (ops), and the plain-bf16 chain.
      const auto shift = mod_rows(mod.data(), e0.data(), 6 * D, rows_per_e, rows, D);
      const auto scale = mod_rows(mod.data() + D, e0.data() + D, 6 * D, rows_per_e, rows, D);
      std::vector<float> n(rows * D), ref(rows * D), base(rows * D);
      ops::layer_norm(x.data(), nullptr, nullptr, n.data(), rows, D, kEps);
      ops::modulate(n.data(), shift.data(), scale.data(), D, ref.data(), rows, D);
      for (int64_t i = 0; i < rows * D; ++i)
        base[i] = rb(rb(rb(n[i]) * rb(1.0f + rb(scale[i]))) + rb(shift[i]));

      DevBuf<float> dx(x.size()), dmod(mod.size()), de0(e0.size());
      DevBuf<uint16_t> dy(rows * D);
      dx.upload(x);
      dmod.upload(mod);
      de0.upload(e0);
      dy.poison();
      const ModVec msh{dmod.p, de0.p, 6 * D, rows_per_e}, msc{dmod.p + D, de0.p + D, 6 * D, rows_per_e};
      cuda::layernorm_modulate(dx.p, bf(dy), rows, D, msh, msc, kEps, nullptr);
      expect_2x_bf16(error_vs(to_f32(dy.download()), ref), error_vs(base, ref), what);

      // Head: modulation [1, 2, D] + e [B, D] or [B, S, D] (e_stride D), fp32 output.
      const auto hmod = randn(++seed, 2 * D, 0.05f);
      const auto e = randn(++seed, n_e * D, 0.5f);
      const auto hsh = mod_rows(hmod.data(), e.data(), D, rows_per_e, rows, D);
      const auto hsc = mod_rows(hmod.data() + D, e.data(), D, rows_per_e, rows, D);
      std::vector<float> href(rows * D);
      ops::modulate(n.data(), hsh.data(), hsc.data(), D, href.data(), rows, D);
      DevBuf<float> dhmod(hmod.size()), de(e.size()), dyf(rows * D);
      dhmod.upload(hmod);
      de.upload(e);
      dyf.poison();
      cuda::layernorm_modulate(dx.p, dyf.p, rows, D, ModVec{dhmod.p, de.p, D, rows_per_e},
                               ModVec{dhmod.p + D, de.p, D, rows_per_e}, kEps, nullptr);
      const Err ef = error_vs(dyf.download(), href);
      EXPECT_EQ(ef.nonfinite, 0u) << what << " head";
      // fp32 statistics instead of the reference's float64 ones: a few fp32 ulps.
      EXPECT_LE(ef.rel_l2, 1e-5) << what << " head";
      EXPECT_LE(ef.max_abs, 1e-4 * max_abs_of(href)) << what << " head";
    }
  }
}

// norm3: affine LayerNorm with fp32 weight and bias -> bf16.
TEST(GpuDitKernels, LayerNormAffine) {
  REQUIRE_GPU();
  uint64_t seed = 0x1A1;
  for (int64_t D : {256, 5120}) {
    const int64_t rows = 75;
    const auto x = randn(++seed, rows * D, 2.0f, -0.3f);
    const auto w = round_bf16(randn(++seed, D, 0.1f, 1.0f));  // bf16 checkpoint values, up-cast
    const auto b = round_bf16(randn(++seed, D, 0.1f));
    std::vector<float> n(rows * D), ref(rows * D), base(rows * D);
    ops::layer_norm(x.data(), nullptr, nullptr, n.data(), rows, D, kEps);
    ops::layer_norm(x.data(), w.data(), b.data(), ref.data(), rows, D, kEps);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < D; ++i) base[r * D + i] = rb(rb(rb(n[r * D + i]) * w[i]) + b[i]);
    DevBuf<float> dx(x.size()), dw(D), db(D);
    DevBuf<uint16_t> dy(rows * D);
    dx.upload(x);
    dw.upload(w);
    db.upload(b);
    dy.poison();
    cuda::layernorm_affine(dx.p, dw.p, db.p, bf(dy), rows, D, kEps, nullptr);
    expect_2x_bf16(error_vs(to_f32(dy.download()), ref), error_vs(base, ref), cat("D ", D));
  }
}

namespace {
// CPU side of one q/k tensor: the fp32 reference, the reference's exact semantics (RMSNorm rounded to
// bf16, × weight rounded, RoPE in float64, rounded), and the plain-bf16 chain.
struct QkRefs {
  std::vector<float> ref32, spec, base;
};
QkRefs qk_refs(const std::vector<float>& xin, const std::vector<float>& w, int64_t B, int64_t S, int64_t D,
               const ops::RopeTable* rt, int64_t f, int64_t h, int64_t wd) {
  const int64_t rows = B * S, H = D / 128;
  QkRefs q;
  std::vector<float> n(rows * D);
  ops::rms_norm(xin.data(), nullptr, n.data(), rows, D, kEps);
  q.ref32.resize(rows * D);
  ops::rms_norm(xin.data(), w.data(), q.ref32.data(), rows, D, kEps);
  q.spec.resize(rows * D);
  q.base.resize(rows * D);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < D; ++i) q.spec[r * D + i] = q.base[r * D + i] = rb(rb(n[r * D + i]) * w[i]);
  if (rt) {
    ops::rope_apply(q.ref32.data(), B, S, H, 128, f, h, wd, *rt);
    ops::rope_apply(q.spec.data(), B, S, H, 128, f, h, wd, *rt);
    // Plain bf16 RoPE: bf16 table, every product and sum rounded.
    const int64_t L = f * h * wd;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tok = r % S;
      if (tok >= L) continue;
      const int64_t pos[3] = {tok / (h * wd), (tok / wd) % h, tok % wd};
      for (int64_t hd = 0; hd < H; ++hd) {
        float* v = q.base.data() + r * D + hd * 128;
        int j = 0;
        for (int a = 0; a < 3; ++a)
          for (int p = 0; p < rt->pairs[a]; ++p, ++j) {
            const float c = rb(static_cast<float>(rt->cos[a][pos[a] * rt->pairs[a] + p]));
            const float s = rb(static_cast<float>(rt->sin[a][pos[a] * rt->pairs[a] + p]));
            const float re = v[2 * j], im = v[2 * j + 1];
            v[2 * j] = rb(rb(re * c) - rb(im * s));
            v[2 * j + 1] = rb(rb(re * s) + rb(im * c));
          }
      }
    }
  }
  q.spec = round_bf16(q.spec);
  return q;
}
void check_qk(const std::vector<uint16_t>& got, const QkRefs& r, const std::string& what) {
  const auto g = to_f32(got);
  expect_2x_bf16(error_vs(g, r.ref32), error_vs(r.base, r.ref32), what);
  // Against the reference's exact rounding sequence only fp32-vs-float64 ties may differ.
  size_t same = 0;
  for (size_t i = 0; i < g.size(); ++i) same += got[i] == f32_to_bf16(r.spec[i]);
  EXPECT_GE(static_cast<double>(same), 0.99 * static_cast<double>(g.size())) << what << ": " << same << " of "
                                                                             << g.size() << " bit-identical";
}
}  // namespace

// Self-attention: q and k as column slices of a fused QKV output, normalised and rotated in one launch;
// 6 padding tokens per sample stay unrotated.
TEST(GpuDitKernels, QkRmsNormRope) {
  REQUIRE_GPU();
  const auto table = cuda::rope_table_f32(128, 1024);
  const ops::RopeTable rt = ops::rope_table(128, 1024);
  DevBuf<float> dtable(table.size());
  dtable.upload(table);
  uint64_t seed = 0x2B0;
  for (int64_t D : {256, 5120, 2560}) {  // 1, 4 and 2 chunks per thread
    const int64_t B = 2, f = 3, h = 5, w = 7, S = f * h * w + 6, rows = B * S;
    const auto qkv = to_bf16(randn(++seed, rows * 3 * D, 2.0f));
    const auto wq = round_bf16(randn(++seed, D, 0.2f, 1.0f)), wk = round_bf16(randn(++seed, D, 0.2f, 1.0f));
    DevBuf<uint16_t> dqkv(qkv.size()), dwq(D), dwk(D), dq(rows * D), dk(rows * D);
    dqkv.upload(qkv);
    dwq.upload(to_bf16(wq));
    dwk.upload(to_bf16(wk));
    dq.poison();
    dk.poison();
    const cuda::RmsNormJob jq{bf(dqkv), 3 * D, bf(dwq), bf(dq), rows};
    const cuda::RmsNormJob jk{bf(dqkv) + D, 3 * D, bf(dwk), bf(dk), rows};
    const cuda::RopeArgs rope{dtable.p, 1024, 128, S, f, h, w};
    cuda::qk_rmsnorm_rope(jq, &jk, D, kEps, &rope, nullptr);
    for (int t = 0; t < 2; ++t) {
      std::vector<float> xin(rows * D);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < D; ++i) xin[r * D + i] = bf16_to_f32(qkv[r * 3 * D + t * D + i]);
      const QkRefs refs = qk_refs(xin, t == 0 ? wq : wk, B, S, D, &rt, f, h, w);
      check_qk((t == 0 ? dq : dk).download(), refs, cat("D ", D, t == 0 ? " q" : " k"));
    }
    // In place (the DiT's layout): q and k overwrite their thirds of the qkv rows (output stride 3D),
    // bit for bit the dense outputs above; v's third is untouched.
    DevBuf<uint16_t> din(qkv.size());
    din.upload(qkv);
    const cuda::RmsNormJob iq{bf(din), 3 * D, bf(dwq), bf(din), rows, 3 * D};
    const cuda::RmsNormJob ik{bf(din) + D, 3 * D, bf(dwk), bf(din) + D, rows, 3 * D};
    cuda::qk_rmsnorm_rope(iq, &ik, D, kEps, &rope, nullptr);
    const auto got = din.download(), dense_q = dq.download(), dense_k = dk.download();
    size_t diff_q = 0, diff_k = 0, diff_v = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < D; ++i) {
        diff_q += got[r * 3 * D + i] != dense_q[r * D + i];
        diff_k += got[r * 3 * D + D + i] != dense_k[r * D + i];
        diff_v += got[r * 3 * D + 2 * D + i] != qkv[r * 3 * D + 2 * D + i];
      }
    EXPECT_EQ(diff_q, 0u) << "D " << D << ": in-place q differs from the dense output";
    EXPECT_EQ(diff_k, 0u) << "D " << D << ": in-place k differs from the dense output";
    EXPECT_EQ(diff_v, 0u) << "D " << D << ": v was written";
  }
}

// Cross-attention: no RoPE, q in place on a dense input, k with a different row count (text tokens).
TEST(GpuDitKernels, QkRmsNormNoRope) {
  REQUIRE_GPU();
  uint64_t seed = 0x2B1;
  for (int64_t D : {256, 5120, 2560, 24576, 40}) {  // 1, 4, 2, 8 chunks per thread; 40: idle lanes
    const int64_t B = 2, Sq = 41, Sk = 13;
    const auto q = to_bf16(randn(++seed, B * Sq * D, 3.0f)), k = to_bf16(randn(++seed, B * Sk * D, 0.7f));
    const auto wq = round_bf16(randn(++seed, D, 0.2f, 1.0f)), wk = round_bf16(randn(++seed, D, 0.2f, 1.0f));
    DevBuf<uint16_t> dq(q.size()), dk(k.size()), dko(k.size()), dwq(D), dwk(D);
    dq.upload(q);
    dk.upload(k);
    dwq.upload(to_bf16(wq));
    dwk.upload(to_bf16(wk));
    dko.poison();
    const cuda::RmsNormJob jq{bf(dq), D, bf(dwq), bf(dq), B * Sq};  // in place
    const cuda::RmsNormJob jk{bf(dk), D, bf(dwk), bf(dko), B * Sk};
    cuda::qk_rmsnorm_rope(jq, &jk, D, kEps, nullptr, nullptr);
    check_qk(dq.download(), qk_refs(to_f32(q), wq, B, Sq, D, nullptr, 0, 0, 0), cat("D ", D, " q"));
    check_qk(dko.download(), qk_refs(to_f32(k), wk, B, Sk, D, nullptr, 0, 0, 0), cat("D ", D, " k"));
  }
}

// x += y·gate with gate = modulation[2] + e0 chunk 2 (per sample and per token): bit-identical to ops.
TEST(GpuDitKernels, GatedResidualAdd) {
  REQUIRE_GPU();
  uint64_t seed = 0x3C0;
  for (int64_t D : {256, 5120}) {
    for (bool per_token : {false, true}) {
      const int64_t B = 2, S = 37, rows = B * S;
      const auto x = randn(++seed, rows * D, 2.0f);
      const auto yb = to_bf16(randn(++seed, rows * D, 1.0f));
      const auto mod = randn(++seed, 6 * D, 0.05f);
      const auto e0 = randn(++seed, (per_token ? rows : B) * 6 * D, 0.5f);
      const int64_t rows_per_e = per_token ? 1 : S;
      const auto gate = mod_rows(mod.data() + 2 * D, e0.data() + 2 * D, 6 * D, rows_per_e, rows, D);
      std::vector<float> ref(x);
      const auto yf = to_f32(yb);
      ops::gated_residual(ref.data(), yf.data(), gate.data(), D, rows, D);

      DevBuf<float> dx(x.size()), dmod(mod.size()), de0(e0.size());
      DevBuf<uint16_t> dy(yb.size());
      dx.upload(x);
      dy.upload(yb);
      dmod.upload(mod);
      de0.upload(e0);
      cuda::gated_residual_add(dx.p, bf(dy), rows, D, ModVec{dmod.p + 2 * D, de0.p + 2 * D, 6 * D, rows_per_e},
                               nullptr);
      const auto got = dx.download();
      size_t diff = 0;
      for (size_t i = 0; i < got.size(); ++i) diff += std::memcmp(&got[i], &ref[i], 4) != 0;
      EXPECT_EQ(diff, 0u) << "D " << D << (per_token ? " per-token" : " per-sample");
    }
  }
}

// x += y (cross-attention output): vector path, odd length tail, and a misaligned (scalar) view.
TEST(GpuDitKernels, ResidualAdd) {
  REQUIRE_GPU();
  const int64_t n = 74 * 256 + 3;
  const auto x = randn(0x3C1, n, 2.0f);
  const auto yb = to_bf16(randn(0x3C2, n, 1.0f));
  for (int64_t off : {0, 1}) {
    std::vector<float> ref(x);
    for (int64_t i = off; i < n; ++i) ref[i] = x[i] + bf16_to_f32(yb[i]);
    DevBuf<float> dx(n);
    DevBuf<uint16_t> dy(n);
    dx.upload(x);
    dy.upload(yb);
    cuda::residual_add(dx.p + off, bf(dy) + off, n - off, nullptr);
    const auto got = dx.download();
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), n * 4), 0) << "offset " << off;
  }
}

// The residual add fused into the LayerNorm after it: norm3 after the self-attention's gated add
// (affine, gated), norm2 after the cross-attention's plain add (modulate, no gate), the next block's
// norm1 after the FFN's gated add (modulate, gated), and affine without a gate. The stored residual
// must equal the unfused add kernel's and ops' bit for bit, the LayerNorm output the unfused LayerNorm
// of that residual bit for bit (same arithmetic and reduction order), and meet the 2x-bf16 rule
// against the fp32 CPU chain. Widths: 5120 (128 threads x 5 chunks), 256 (32 x 1), 40 (32 threads, 27
// idle), 24576 (384 x 8, every register slot); 37 rows per sample, per-sample and per-token e0.
TEST(GpuDitKernels, ResidualAddLayerNorm) {
  REQUIRE_GPU();
  uint64_t seed = 0x3D0;
  for (int64_t D : {5120, 256, 40, 24576}) {
    for (bool per_token : {false, true}) {
      const int64_t B = per_token ? 1 : 3, S = 37, rows = B * S;
      const int64_t rows_per_e = per_token ? 1 : S;
      const auto x = randn(++seed, rows * D, 2.0f, 0.7f);  // residual stream with a non-zero mean
      const auto ab = to_bf16(randn(++seed, rows * D, 1.0f));
      const auto af = to_f32(ab);
      const auto mod = randn(++seed, 6 * D, 0.05f);
      const auto e0 = randn(++seed, (per_token ? rows : B) * 6 * D, 0.5f);
      const auto w = round_bf16(randn(++seed, D, 0.1f, 1.0f)), b = round_bf16(randn(++seed, D, 0.1f));
      const auto gate = mod_rows(mod.data() + 2 * D, e0.data() + 2 * D, 6 * D, rows_per_e, rows, D);
      const auto shift = mod_rows(mod.data() + 3 * D, e0.data() + 3 * D, 6 * D, rows_per_e, rows, D);
      const auto scale = mod_rows(mod.data() + 4 * D, e0.data() + 4 * D, 6 * D, rows_per_e, rows, D);

      DevBuf<float> dmod(mod.size()), de0(e0.size()), dw(D), db(D);
      DevBuf<uint16_t> da(ab.size());
      dmod.upload(mod);
      de0.upload(e0);
      dw.upload(w);
      db.upload(b);
      da.upload(ab);
      const ModVec mgate{dmod.p + 2 * D, de0.p + 2 * D, 6 * D, rows_per_e};
      const ModVec msh{dmod.p + 3 * D, de0.p + 3 * D, 6 * D, rows_per_e};
      const ModVec msc{dmod.p + 4 * D, de0.p + 4 * D, 6 * D, rows_per_e};

      for (bool gated : {true, false}) {
        // CPU: the add (ops::gated_residual or x + a), then LN in fp32 and the plain-bf16 chain.
        std::vector<float> xr(x);
        if (gated)
          ops::gated_residual(xr.data(), af.data(), gate.data(), D, rows, D);
        else
          for (int64_t i = 0; i < rows * D; ++i) xr[i] = x[i] + af[i];
        std::vector<float> n(rows * D);
        ops::layer_norm(xr.data(), nullptr, nullptr, n.data(), rows, D, kEps);

        for (bool affine : {true, false}) {
          const std::string what = cat("D ", D, per_token ? " per-token" : " per-sample", gated ? " gated" : " plain",
                                       affine ? " affine" : " modulate");
          std::vector<float> ref(rows * D), base(rows * D);
          if (affine) {
            ops::layer_norm(xr.data(), w.data(), b.data(), ref.data(), rows, D, kEps);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t i = 0; i < D; ++i) base[r * D + i] = rb(rb(rb(n[r * D + i]) * w[i]) + b[i]);
          } else {
            ops::modulate(n.data(), shift.data(), scale.data(), D, ref.data(), rows, D);
            for (int64_t i = 0; i < rows * D; ++i)
              base[i] = rb(rb(rb(n[i]) * rb(1.0f + rb(scale[i]))) + rb(shift[i]));
          }

          // fused
          DevBuf<float> dx(x.size());
          DevBuf<uint16_t> dy(rows * D);
          dx.upload(x);
          dy.poison();
          const ModVec* g = gated ? &mgate : nullptr;
          if (affine)
            cuda::residual_add_layernorm_affine(dx.p, bf(da), g, dw.p, db.p, bf(dy), rows, D, kEps, nullptr);
          else
            cuda::residual_add_layernorm_modulate(dx.p, bf(da), g, bf(dy), rows, D, msh, msc, kEps, nullptr);
          // unfused: the add kernel, then the LayerNorm kernel
          DevBuf<float> ux(x.size());
          DevBuf<uint16_t> uy(rows * D);
          ux.upload(x);
          uy.poison();
          if (gated)
            cuda::gated_residual_add(ux.p, bf(da), rows, D, mgate, nullptr);
          else
            cuda::residual_add(ux.p, bf(da), rows * D, nullptr);
          if (affine)
            cuda::layernorm_affine(ux.p, dw.p, db.p, bf(uy), rows, D, kEps, nullptr);
          else
            cuda::layernorm_modulate(ux.p, bf(uy), rows, D, msh, msc, kEps, nullptr);

          const auto gx = dx.download(), wx = ux.download();
          const auto gy = dy.download(), wy = uy.download();
          EXPECT_EQ(std::memcmp(gx.data(), wx.data(), gx.size() * 4), 0) << what << ": residual vs the add kernel";
          EXPECT_EQ(std::memcmp(gx.data(), xr.data(), gx.size() * 4), 0) << what << ": residual vs ops";
          size_t diff = 0;
          for (size_t i = 0; i < gy.size(); ++i) diff += gy[i] != wy[i];
          EXPECT_EQ(diff, 0u) << what << ": LayerNorm output vs the unfused LayerNorm";
          expect_2x_bf16(error_vs(to_f32(gy), ref), error_vs(base, ref), what);
        }
      }
    }
  }
}

// ModVec's row choice with two timesteps per sample (TI2V image mode), on the host: row r of e vector
// j = r / rows_per_e is token token0 + r % rows_per_e; tokens below first_tokens read e_first.
TEST(GpuDitKernels, ModVecFirstFrameRowChoice) {
  static const float e[12] = {}, ef[12] = {};
  const ModVec plain{nullptr, e, 4, 5};
  for (int64_t r = 0; r < 15; ++r) EXPECT_EQ(plain.e_row(r), e + (r / 5) * 4) << r;
  for (int64_t token0 : {0, 2, 7}) {
    ModVec m = plain;
    m.e_first = ef, m.first_tokens = 3, m.token0 = token0;
    for (int64_t r = 0; r < 15; ++r) {
      const bool first = token0 + r % 5 < 3;
      EXPECT_EQ(m.e_row(r), (first ? ef : e) + (r / 5) * 4) << "token0 " << token0 << " row " << r;
    }
  }
  EXPECT_EQ((ModVec{nullptr, nullptr, 4, 5, ef, 3, 0}.e_row(0)), nullptr);  // no e: no vector at all
}

// The modulated kernels with two timesteps per sample (e = e0 of t, e_first = e0 of t_first; tokens of
// latent frame 0 read e_first): bit-identical to the same kernels given the per-token table that row
// choice spells out (rows_per_e = 1), for a whole sequence and for sequence-parallel slices (token0 > 0,
// the boundary inside, at or before the slice). Kernels: layernorm_modulate (bf16 and the head's fp32),
// gated_residual_add, and the residual adds fused into a modulated and an affine LayerNorm.
TEST(GpuDitKernels, FirstFrameModulationEqualsPerTokenTable) {
  REQUIRE_GPU();
  uint64_t seed = 0x3E0;
  for (int64_t D : {256, 3072}) {
    for (int64_t token0 : {0, 20, 40}) {
      // 25 frame-0 tokens: the boundary inside the rows (token0 0, 20) or before them (40)
      const int64_t B = 2, S = 37, rows = B * S, first = 25;
      const std::string what = cat("D ", D, " token0 ", token0);
      const auto x = randn(++seed, rows * D, 2.0f, 0.4f);
      const auto ab = to_bf16(randn(++seed, rows * D, 1.0f));
      const auto mod = randn(++seed, 6 * D, 0.05f), hmod = randn(++seed, 2 * D, 0.05f);
      const auto e0 = randn(++seed, B * 6 * D, 0.5f), e0f = randn(++seed, B * 6 * D, 0.5f);
      const auto w = round_bf16(randn(++seed, D, 0.1f, 1.0f)), b = round_bf16(randn(++seed, D, 0.1f));
      // the per-token table [rows, 6D]: row r is sample r / S's e0 or e0f by its token index
      std::vector<float> table(rows * 6 * D);
      for (int64_t r = 0; r < rows; ++r) {
        const auto& src = token0 + r % S < first ? e0f : e0;
        std::copy(src.begin() + (r / S) * 6 * D, src.begin() + (r / S + 1) * 6 * D, table.begin() + r * 6 * D);
      }
      DevBuf<float> dx(x.size()), dmod(mod.size()), dhmod(hmod.size()), de0(e0.size()), de0f(e0f.size());
      DevBuf<float> dtab(table.size()), dw(D), db(D);
      DevBuf<uint16_t> da(ab.size());
      dx.upload(x), dmod.upload(mod), dhmod.upload(hmod), de0.upload(e0), de0f.upload(e0f);
      dtab.upload(table), dw.upload(w), db.upload(b), da.upload(ab);
      // chunk k of the block modulation, both ways; the head's modulation + e (e = chunk 0 of e0 here)
      auto split = [&](const float* base, int k, int64_t stride, const float* e, const float* ef) {
        ModVec m{base, e + k * D, stride, S};
        m.e_first = ef + k * D, m.first_tokens = first, m.token0 = token0;
        return m;
      };
      auto mv = [&](int k) { return split(dmod.p + k * D, k, 6 * D, de0.p, de0f.p); };
      auto tv = [&](int k) { return ModVec{dmod.p + k * D, dtab.p + k * D, 6 * D, 1}; };
      const ModVec hs = split(dhmod.p, 0, 6 * D, de0.p, de0f.p), hc = split(dhmod.p + D, 0, 6 * D, de0.p, de0f.p);
      const ModVec ths{dhmod.p, dtab.p, 6 * D, 1}, thc{dhmod.p + D, dtab.p, 6 * D, 1};

      DevBuf<uint16_t> y1(rows * D), y2(rows * D);
      DevBuf<float> f1(rows * D), f2(rows * D);
      y1.poison(), y2.poison(), f1.poison(), f2.poison();
      cuda::layernorm_modulate(dx.p, bf(y1), rows, D, mv(0), mv(1), kEps, nullptr);
      cuda::layernorm_modulate(dx.p, bf(y2), rows, D, tv(0), tv(1), kEps, nullptr);
      const std::vector<uint16_t> ln_table = y2.download();
      EXPECT_TRUE(y1.download() == ln_table) << what << ": layernorm_modulate (bf16)";
      cuda::layernorm_modulate(dx.p, f1.p, rows, D, hs, hc, kEps, nullptr);
      cuda::layernorm_modulate(dx.p, f2.p, rows, D, ths, thc, kEps, nullptr);
      EXPECT_TRUE(bit_equal(f1.download(), f2.download())) << what << ": layernorm_modulate (fp32, head)";

      DevBuf<float> r1(x.size()), r2(x.size());
      r1.upload(x), r2.upload(x);
      cuda::gated_residual_add(r1.p, bf(da), rows, D, mv(2), nullptr);
      cuda::gated_residual_add(r2.p, bf(da), rows, D, tv(2), nullptr);
      EXPECT_TRUE(bit_equal(r1.download(), r2.download())) << what << ": gated_residual_add";

      for (bool affine : {false, true}) {
        r1.upload(x), r2.upload(x), y1.poison(), y2.poison();
        const ModVec g1 = mv(5), g2 = tv(5);
        if (affine) {
          cuda::residual_add_layernorm_affine(r1.p, bf(da), &g1, dw.p, db.p, bf(y1), rows, D, kEps, nullptr);
          cuda::residual_add_layernorm_affine(r2.p, bf(da), &g2, dw.p, db.p, bf(y2), rows, D, kEps, nullptr);
        } else {
          cuda::residual_add_layernorm_modulate(r1.p, bf(da), &g1, bf(y1), rows, D, mv(3), mv(4), kEps, nullptr);
          cuda::residual_add_layernorm_modulate(r2.p, bf(da), &g2, bf(y2), rows, D, tv(3), tv(4), kEps, nullptr);
        }
        const std::string k = affine ? ": residual_add_layernorm_affine" : ": residual_add_layernorm_modulate";
        EXPECT_TRUE(bit_equal(r1.download(), r2.download())) << what << k << " residual";
        EXPECT_TRUE(y1.download() == y2.download()) << what << k << " output";
      }
      // The choice matters: the per-sample ModVec (no e_first) gives another output when any row is first.
      if (token0 < first) {
        y1.poison();
        cuda::layernorm_modulate(dx.p, bf(y1), rows, D, ModVec{dmod.p, de0.p, 6 * D, S},
                                 ModVec{dmod.p + D, de0.p + D, 6 * D, S}, kEps, nullptr);
        EXPECT_FALSE(y1.download() == ln_table) << what;
      }
    }
  }
}

// Sinusoidal embedding of per-sample and per-token timesteps (float64 on both sides).
TEST(GpuDitKernels, TimestepEmbedding) {
  REQUIRE_GPU();
  const int64_t dim = 256;
  std::vector<std::vector<float>> cases = {{999.0f, 0.0f, 500.5f}};  // per sample (incl. t = 0)
  std::vector<float> per_token(2 * 37);
  for (size_t i = 0; i < per_token.size(); ++i)
    per_token[i] = std::trunc(1000.0f * philox_uniform(0x4D0, i)) + (i % 5 == 0 ? 0.25f : 0.0f);
  cases.push_back(per_token);
  for (const auto& t : cases) {
    const int64_t n = static_cast<int64_t>(t.size());
    std::vector<float> ref(n * dim);
    ops::timestep_embedding(t.data(), n, dim, ref.data());
    DevBuf<float> dt(n), dout(n * dim);
    dt.upload(t);
    dout.poison();
    cuda::timestep_embedding(dt.p, n, dim, dout.p, nullptr);
    const auto got = dout.download();
    const Err e = error_vs(got, ref);
    size_t same = 0;
    for (size_t i = 0; i < got.size(); ++i) same += std::memcmp(&got[i], &ref[i], 4) == 0;
    EXPECT_EQ(e.nonfinite, 0u);
    EXPECT_LE(e.max_abs, 1.2e-7) << "n " << n;  // at most one fp32 ulp of |v| <= 1
    EXPECT_GE(same, got.size() * 999 / 1000) << "n " << n;
  }
}

TEST(GpuDitKernels, Silu) {
  REQUIRE_GPU();
  const int64_t n = 100003;
  const auto x = randn(0x4D1, n, 4.0f);
  std::vector<float> ref(n);
  ops::silu(x.data(), ref.data(), n);
  for (int64_t off : {0, 1}) {
    DevBuf<float> dx(n), dy(n);
    dx.upload(x);
    dy.poison();
    cuda::silu(dx.p + off, dy.p + off, n - off, nullptr);
    const auto got = dy.download();
    for (int64_t i = off; i < n; ++i) {
      // expf within 2 ulp in CUDA, then one add and one division: a few ulps relative.
      ASSERT_LE(std::fabs(got[i] - ref[i]), 6e-7 * std::fabs(ref[i]) + 1e-30) << i << " x " << x[i];
    }
  }
}

namespace {
struct PatchCase {
  int64_t C, T, H, W;
  int pt, ph, pw;
};
}  // namespace

// im2col to bf16: bit-identical to bf16(ops::patchify), padding rows zero.
TEST(GpuDitKernels, Patchify) {
  REQUIRE_GPU();
  const PatchCase cases[] = {{16, 3, 10, 14, 1, 2, 2}, {6, 3, 10, 14, 1, 2, 2}, {2, 4, 6, 10, 2, 2, 2}};
  uint64_t seed = 0x5E0;
  for (const PatchCase& c : cases) {
    const int64_t B = 2, f = c.T / c.pt, h = c.H / c.ph, w = c.W / c.pw, L = f * h * w, S = L + 5;
    const int64_t K = c.C * c.pt * c.ph * c.pw, per = c.C * c.T * c.H * c.W;
    const auto x = randn(++seed, B * per, 1.5f);
    DevBuf<float> dx(x.size());
    DevBuf<uint16_t> drows(B * S * K);
    dx.upload(x);
    drows.poison();
    cuda::patchify_bf16(dx.p, bf(drows), B, c.C, c.T, c.H, c.W, c.pt, c.ph, c.pw, S, nullptr);
    const auto got = drows.download();
    std::vector<float> ref(L * K);
    size_t bad = 0;
    for (int64_t b = 0; b < B; ++b) {
      ops::patchify(x.data() + b * per, ref.data(), c.C, c.T, c.H, c.W, c.pt, c.ph, c.pw);
      for (int64_t n = 0; n < S; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const uint16_t want = n < L ? f32_to_bf16(ref[n * K + k]) : uint16_t{0};
          bad += got[(b * S + n) * K + k] != want;
        }
    }
    EXPECT_EQ(bad, 0u) << "C " << c.C << " K " << K;
  }
}

// Patch embedding = im2col + GEMM against ops::patch_embed on the bf16-rounded inputs (2x bf16 rule).
TEST(GpuDitKernels, PatchEmbedThroughGemm) {
  REQUIRE_GPU();
  const int64_t B = 2, C = 16, T = 3, H = 10, W = 14, D = 256, L = 3 * 5 * 7, K = C * 4, per = C * T * H * W;
  const auto x = round_bf16(randn(0x5E1, B * per, 1.0f));
  const auto wt = round_bf16(randn(0x5E2, D * K, 0.1f));
  const auto bias = round_bf16(randn(0x5E3, D, 0.5f));
  std::vector<float> ref(B * L * D);
  for (int64_t b = 0; b < B; ++b)
    ops::patch_embed(x.data() + b * per, wt.data(), bias.data(), ref.data() + b * L * D, C, T, H, W, D, 1, 2, 2);
  DevBuf<float> dx(x.size());
  DevBuf<uint16_t> drows(B * L * K), dw(wt.size()), db(D), dy(B * L * D);
  DevBuf<uint8_t> ws(cuda::GemmRunner::kWorkspaceBytes);
  dx.upload(x);
  dw.upload(to_bf16(wt));
  db.upload(to_bf16(bias));
  dy.poison();
  cuda::GemmRunner gemm(ws.p, ws.n);
  cuda::patchify_bf16(dx.p, bf(drows), B, C, T, H, W, 1, 2, 2, L, nullptr);
  gemm.linear(bf(drows), bf(dw), bf(db), bf(dy), B * L, K, D, cuda::Act::None, nullptr);
  expect_2x_bf16(error_vs(to_f32(dy.download()), ref), error_vs(round_bf16(ref), ref), "patch embed");
}

// Head rows -> video: bit-identical to ops::unpatchify; odd widths take the scalar path.
TEST(GpuDitKernels, Unpatchify) {
  REQUIRE_GPU();
  struct Case {
    int64_t C, f, h, w;
    int pt, ph, pw;
  };
  const Case cases[] = {{16, 3, 5, 7, 1, 2, 2}, {16, 3, 5, 8, 1, 2, 2}, {3, 2, 3, 4, 2, 2, 2}};
  uint64_t seed = 0x6F0;
  for (const Case& c : cases) {
    const int64_t B = 2, L = c.f * c.h * c.w, S = L + 3, K = c.C * c.pt * c.ph * c.pw;
    const int64_t per = c.C * c.f * c.pt * c.h * c.ph * c.w * c.pw;
    const auto rows = randn(++seed, B * S * K, 1.0f);
    DevBuf<float> drows(rows.size()), dout(B * per);
    drows.upload(rows);
    dout.poison();
    cuda::unpatchify(drows.p, dout.p, B, S, c.C, c.f, c.h, c.w, c.pt, c.ph, c.pw, nullptr);
    const auto got = dout.download();
    std::vector<float> ref(B * per);
    for (int64_t b = 0; b < B; ++b)
      ops::unpatchify(rows.data() + b * S * K, ref.data() + b * per, c.C, c.f, c.h, c.w, c.pt, c.ph, c.pw);
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << "C " << c.C << " w " << c.w;
  }
}

// fp32 -> bf16 bit-identical to wan::f32_to_bf16 (ties, subnormals, infinities), bf16 -> fp32 exact,
// on aligned and misaligned views.
TEST(GpuDitKernels, Conversions) {
  REQUIRE_GPU();
  const int64_t n = 100003;
  auto x = randn(0x7A0, n, 10.0f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, -3e-39f, 3.3e38f, -3.39e38f,
                            1.00390625f /* 1 + 2^-8: tie to even (down) */, 1.01171875f /* 1 + 3·2^-8: tie up */,
                            65504.0f, 1.0e-38f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float); ++i) x[i * 997] = specials[i];
  std::vector<uint16_t> hb(n);
  for (int64_t i = 0; i < n; ++i) hb[i] = static_cast<uint16_t>(philox_uniform(0x7A1, i) * 65536.0f);
  for (int64_t off : {0, 1}) {
    DevBuf<float> dx(n), dyf(n);
    DevBuf<uint16_t> dyb(n), dhb(n);
    dx.upload(x);
    dhb.upload(hb);
    dyb.poison();
    dyf.poison();
    cuda::convert_f32_to_bf16(dx.p + off, bf(dyb) + off, n - off, nullptr);
    cuda::convert_bf16_to_f32(bf(dhb) + off, dyf.p + off, n - off, nullptr);
    const auto gb = dyb.download();
    const auto gf = dyf.download();
    size_t bad_b = 0, bad_f = 0;
    for (int64_t i = off; i < n; ++i) {
      bad_b += gb[i] != f32_to_bf16(x[i]);
      const uint32_t want = static_cast<uint32_t>(hb[i]) << 16;
      bad_f += std::memcmp(&gf[i], &want, 4) != 0;
    }
    EXPECT_EQ(bad_b, 0u) << "f32 -> bf16, offset " << off;
    EXPECT_EQ(bad_f, 0u) << "bf16 -> f32, offset " << off;
  }
}

// Launch-time checks: a misaligned or badly shaped call throws before any launch.
TEST(GpuDitKernels, ChecksThrow) {
  REQUIRE_GPU();
  DevBuf<float> dx(1024);
  DevBuf<uint16_t> dy(1024);
  EXPECT_THROW(cuda::layernorm_modulate(dx.p, bf(dy), 2, 100, ModVec{}, ModVec{}, kEps, nullptr), wan::Error);
  EXPECT_THROW(cuda::gated_residual_add(dx.p + 1, bf(dy), 1, 256, ModVec{}, nullptr), wan::Error);
  const cuda::RmsNormJob j{bf(dy), 256, bf(dy), bf(dy) + 1, 2};
  EXPECT_THROW(cuda::qk_rmsnorm_rope(j, nullptr, 256, kEps, nullptr, nullptr), wan::Error);  // misaligned y
  const cuda::RmsNormJob js{bf(dy), 264, bf(dy), bf(dy), 2};
  EXPECT_THROW(cuda::qk_rmsnorm_rope(js, nullptr, 256, kEps, nullptr, nullptr), wan::Error);  // in place, strides differ
  const cuda::RmsNormJob jo{bf(dy), 256, bf(dy), bf(dy) + 8, 2, 252};
  EXPECT_THROW(cuda::qk_rmsnorm_rope(jo, nullptr, 256, kEps, nullptr, nullptr), wan::Error);  // output stride < D
  EXPECT_THROW(cuda::patchify_bf16(dx.p, bf(dy), 1, 3, 1, 2, 2, 1, 2, 2, 1, nullptr), wan::Error);  // K = 12
  // residual add + LayerNorm: bad width, misaligned added rows, outputs overlapping inputs
  DevBuf<uint16_t> dz(1024);
  DevBuf<float> dwb(256);
  EXPECT_THROW(cuda::residual_add_layernorm_modulate(dx.p, bf(dz), nullptr, bf(dy), 2, 100, ModVec{}, ModVec{}, kEps,
                                                     nullptr),
               wan::Error);
  EXPECT_THROW(cuda::residual_add_layernorm_modulate(dx.p, bf(dz) + 1, nullptr, bf(dy), 2, 256, ModVec{}, ModVec{},
                                                     kEps, nullptr),
               wan::Error);
  EXPECT_THROW(cuda::residual_add_layernorm_modulate(dx.p, bf(dy), nullptr, bf(dy), 2, 256, ModVec{}, ModVec{}, kEps,
                                                     nullptr),
               wan::Error);  // y is the added rows (the unfused block's pattern)
  EXPECT_THROW(cuda::residual_add_layernorm_affine(dx.p, bf(dz), nullptr, dwb.p, dwb.p,
                                                   reinterpret_cast<cuda::bf16*>(dx.p) + 8, 2, 256, kEps, nullptr),
               wan::Error);  // y inside the residual
  const ModVec bad_gate{nullptr, dwb.p, 6, 1};  // e_stride not a multiple of 4
  EXPECT_THROW(cuda::residual_add_layernorm_affine(dx.p, bf(dz), &bad_gate, dwb.p, dwb.p, bf(dy), 2, 256, kEps,
                                                   nullptr),
               wan::Error);
  ModVec no_e;  // a first-frame vector without the other tokens' one
  no_e.e_first = dwb.p, no_e.first_tokens = 1;
  EXPECT_THROW(cuda::layernorm_modulate(dx.p, bf(dy), 2, 256, no_e, ModVec{}, kEps, nullptr), wan::Error);
  EXPECT_THROW(cuda::gated_residual_add(dx.p, bf(dy), 2, 256, no_e, nullptr), wan::Error);
  const int64_t wide = 40 * 1024;  // wider than the LayerNorms support (32768)
  DevBuf<float> wx(wide);
  DevBuf<uint16_t> wa(wide), wy(wide);
  EXPECT_THROW(cuda::residual_add_layernorm_modulate(wx.p, bf(wa), nullptr, bf(wy), 1, wide, ModVec{}, ModVec{}, kEps,
                                                     nullptr),
               wan::Error);
}

// Achieved bandwidth at a 480p-like size (2 samples x 32760 tokens, D = 5120), against a
// device-to-device copy measured in the same run. Memory-bound kernels that move each byte once
// should reach a good fraction of the copy; the floor (30%) only catches a badly broken access pattern.
TEST(GpuDitKernels, BandwidthReport) {
  REQUIRE_GPU();
  const int64_t rows = 2 * 32760, D = 5120, n = rows * D;
  DevBuf<float> x(n), x2(n), mod(6 * D), e0(2 * 6 * D);
  DevBuf<uint16_t> y(n), qkv(3 * n), q(n), k(n), w(D);
  cuda::philox_normal_fill(x.p, n, 1, 0, nullptr);
  cuda::philox_normal_fill(mod.p, mod.n, 2, 0, nullptr);
  cuda::philox_normal_fill(e0.p, e0.n, 3, 0, nullptr);
  cuda::philox_normal_fill_bf16(y.p, n, 4, 0, 1.0f, nullptr);
  cuda::philox_normal_fill_bf16(qkv.p, 3 * n, 5, 0, 1.0f, nullptr);
  cuda::philox_normal_fill_bf16(w.p, D, 6, 0, 1.0f, nullptr);
  const auto table = cuda::rope_table_f32(128, 1024);
  DevBuf<float> dtable(table.size());
  dtable.upload(table);
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  auto time_ms = [&](auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    const int reps = 20;
    CUDA_CHECK(cudaEventRecord(t0));
    for (int i = 0; i < reps; ++i) fn();
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    return static_cast<double>(ms) / reps;
  };
  const double copy_ms = time_ms([&] { CUDA_CHECK(cudaMemcpyAsync(x2.p, x.p, n * 4, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * n * 4 / copy_ms / 1e6;
  const ModVec sh{mod.p, e0.p, 6 * D, rows / 2}, sc{mod.p + D, e0.p + D, 6 * D, rows / 2};
  const ModVec gate{mod.p + 2 * D, e0.p + 2 * D, 6 * D, rows / 2};
  const cuda::RmsNormJob jq{bf(qkv), 3 * D, bf(w), bf(q), rows}, jk{bf(qkv) + D, 3 * D, bf(w), bf(k), rows};
  const cuda::RopeArgs rope{dtable.p, 1024, 128, rows / 2, 21, 30, 52};
  struct Row {
    const char* name;
    double ms, bytes;
  };
  const Row results[] = {
      {"layernorm_modulate", time_ms([&] { cuda::layernorm_modulate(x.p, bf(y), rows, D, sh, sc, kEps, nullptr); }),
       n * 6.0},
      {"qk_rmsnorm_rope", time_ms([&] { cuda::qk_rmsnorm_rope(jq, &jk, D, kEps, &rope, nullptr); }), n * 8.0},
      {"gated_residual_add", time_ms([&] { cuda::gated_residual_add(x2.p, bf(y), rows, D, gate, nullptr); }),
       n * 10.0},
      // The fused residual add + LayerNorm against the unfused pair (16 vs 12 bytes per element).
      {"gated_add+ln_affine x2", time_ms([&] {
         cuda::gated_residual_add(x2.p, bf(y), rows, D, gate, nullptr);
         cuda::layernorm_affine(x2.p, mod.p + 3 * D, mod.p + 4 * D, bf(q), rows, D, kEps, nullptr);
       }),
       n * 16.0},
      {"residual_add_ln_affine", time_ms([&] {
         cuda::residual_add_layernorm_affine(x2.p, bf(y), &gate, mod.p + 3 * D, mod.p + 4 * D, bf(q), rows, D, kEps,
                                             nullptr);
       }),
       n * 12.0},
      {"add+ln_modulate x2", time_ms([&] {
         cuda::residual_add(x2.p, bf(y), n, nullptr);
         cuda::layernorm_modulate(x2.p, bf(q), rows, D, sh, sc, kEps, nullptr);
       }),
       n * 16.0},
      {"residual_add_ln_modulate", time_ms([&] {
         cuda::residual_add_layernorm_modulate(x2.p, bf(y), nullptr, bf(q), rows, D, sh, sc, kEps, nullptr);
       }),
       n * 12.0},
      {"gated_add_ln_modulate", time_ms([&] {
         cuda::residual_add_layernorm_modulate(x2.p, bf(y), &gate, bf(q), rows, D, sh, sc, kEps, nullptr);
       }),
       n * 12.0},
      {"convert_f32_to_bf16", time_ms([&] { cuda::convert_f32_to_bf16(x.p, bf(y), n, nullptr); }), n * 6.0},
  };
  std::printf("device-to-device copy: %.0f GB/s (%.3f ms for %.2f GB)\n", copy_gbs, copy_ms, 2.0 * n * 4 / 1e9);
  for (const Row& r : results) {
    const double gbs = r.bytes / r.ms / 1e6;
    std::printf("%-24s %.3f ms  %6.0f GB/s  %.0f%% of copy\n", r.name, r.ms, gbs, 100.0 * gbs / copy_gbs);
    EXPECT_GE(gbs, 0.3 * copy_gbs) << r.name;
  }
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
}
