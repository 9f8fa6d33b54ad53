// The GPU UMT5 encoder (src/models/umt5/umt5_gpu.h) against the CPU fp32 reference wan::t5_encode (src/text):
//   - its kernels on fresh random inputs: fused residual add + RMSNorm (the fp32 residual bit-exact),
//     GELU-mul and softmax with relative bias (bf16 outputs within twice the error of the same maths
//     done plainly in bf16 on the host); the relative buckets come from wan::t5_relative_bucket, shared
//     with the CPU encoder and tested in tests/cpu/test_umt5.cpp;
//   - the whole encoder on small configs (head_dim 64 with an outlier embedding channel, and the
//     "tiny" preset, head_dim 16) with random bf16-exact host weights, lengths 1, 7, 77, 512 run in
//     increasing order on one encoder whose arena starts poisoned with NaN (a row left unwritten shows);
//   - determinism (two encodes and two encoder objects bit-identical); the random weights drawn on the
//     GPU equal the documented formula drawn on the host (bit-identical encodes);
//   - bad input (length 0 / 513, ids out of range, a wrong weight shape, a model that cannot fit);
//   - a timing case at umt5-xxl size with random weights drawn on the GPU (weight bytes, encode time
//     for 512 and 100 tokens, peak device memory; outputs finite).
// Precision rule (issue 4): the encoder's error vs fp32 (max abs and relative L2) at most twice that of
// `encode_bf16_plain` below: the same computation on the host with every bf16 rounding of t5_gpu.h
// (GEMM inputs/outputs, P, GELU-mul, norm outputs) and fp32 elsewhere; plus a sanity bound of 2e-2
// relative L2. Links wan_text (the CPU reference), which the GPU tests get through wan_pipeline.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/weight_spec.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/philox.h"
#include "kernels/check.h"
#include "models/dit/dit_gpu.h"
#include "kernels/rng.h"
#include "models/umt5/umt5_gpu.h"
#include "kernels/t5_kernels.h"
#include "gpu_test_util.h"
#include "ops/cpu_ops.h"
#include "models/umt5/umt5_cpu.h"

using namespace wan;
using namespace wan::gpu_test;
using cuda::T5EncoderGpu;
using cuda::T5WeightSource;
namespace k = wan::cuda::t5_gpu_detail;

namespace {

constexpr double kRelL2Bound = 2e-2;

T5Config small_config() {
  T5Config c;
  c.vocab = 1000;
  c.dim = 256;
  c.dim_attn = 256;
  c.dim_ffn = 640;
  c.num_heads = 4;  // head_dim 64, as umt5-xxl
  c.num_layers = 3;
  return c;
}

Tensor tensor_of(const std::vector<float>& v, Shape s) {
  Tensor t = Tensor::empty(DType::F32, s);
  std::memcpy(t.f32(), v.data(), v.size() * 4);
  return t;
}

// Random host weights, every value bf16-exact (both sides see the same weights). Scales as the GPU's
// random init; `outlier` multiplies one embedding channel by 64 (umt5's residual has big outliers).
T5Weights make_weights(const T5Config& c, uint64_t seed, bool outlier) {
  const int64_t D = c.dim, A = c.dim_attn, F = c.dim_ffn;
  uint64_t s = seed;
  auto w = [&](Shape sh, float scale, float offset = 0.0f) {
    return tensor_of(round_bf16(randn(++s, static_cast<size_t>(sh.numel()), scale, offset)), sh);
  };
  auto lin = [](int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(3.0 * fan_in)); };
  T5Weights W;
  W.token_embedding = w({c.vocab, D}, 1.0f);
  if (outlier)
    for (int64_t r = 0; r < c.vocab; ++r) W.token_embedding.f32()[r * D + 3] *= 64.0f;
  W.norm = w({D}, 0.05f, 1.0f);
  for (int i = 0; i < c.num_layers; ++i) {
    T5Block b;
    b.norm1 = w({D}, 0.05f, 1.0f);
    b.q = w({A, D}, lin(D));
    b.k = w({A, D}, lin(D));
    b.v = w({A, D}, lin(D));
    b.o = w({D, A}, lin(A));
    b.pos_embedding = w({c.num_buckets, c.num_heads}, 1.0f);
    b.norm2 = w({D}, 0.05f, 1.0f);
    b.ffn_gate = w({F, D}, lin(D));
    b.ffn_fc1 = w({F, D}, lin(D));
    b.ffn_fc2 = w({D, F}, lin(F));
    W.blocks.push_back(b);
  }
  return W;
}

std::vector<int32_t> make_ids(const T5Config& c, int64_t L, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i)
    ids[static_cast<size_t>(i)] = std::min<int32_t>(
        c.vocab - 1, static_cast<int32_t>(philox_uniform(seed, static_cast<uint64_t>(i)) * static_cast<float>(c.vocab)));
  if (L > 1) ids.back() = 1;  // EOS
  return ids;
}

std::vector<float> vec_of(const Tensor& t) { return {t.f32(), t.f32() + t.numel()}; }

float gelu_ref(float v) {
  const float k0 = 0.7978845608028654f;
  return 0.5f * v * (1.0f + std::tanh(k0 * (v + 0.044715f * v * v * v)));
}

// Host: out = bf16(bf16(x·r)·w) per row, r from a double sum of squares.
void rms_bf16(const float* x, const float* w, float* out, int64_t L, int64_t D, float eps) {
  for (int64_t i = 0; i < L; ++i) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(x[i * D + d]) * x[i * D + d];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / D + eps));
    for (int64_t d = 0; d < D; ++d) out[i * D + d] = rb(rb(x[i * D + d] * r) * w[d]);
  }
}

// The encoder computed plainly on the host with t5_gpu.h's bf16 roundings (see the file comment).
std::vector<float> encode_bf16_plain(const T5Config& c, const T5Weights& W, const std::vector<int32_t>& ids) {
  const int64_t L = static_cast<int64_t>(ids.size()), D = c.dim, A = c.dim_attn, F = c.dim_ffn, H = c.num_heads,
                Dh = c.head_dim();
  std::vector<float> x(static_cast<size_t>(L * D)), a(x.size()), y(x.size());
  for (int64_t i = 0; i < L; ++i)
    std::copy(W.token_embedding.f32() + ids[i] * D, W.token_embedding.f32() + (ids[i] + 1) * D, x.data() + i * D);
  std::vector<float> q(static_cast<size_t>(L * A)), kk(q.size()), v(q.size()), att(q.size());
  std::vector<float> g(static_cast<size_t>(L * F)), f(g.size()), p(static_cast<size_t>(L));
  auto round_all = [](std::vector<float>& t) {
    for (float& e : t) e = rb(e);
  };
  for (const T5Block& b : W.blocks) {
    rms_bf16(x.data(), b.norm1.f32(), a.data(), L, D, c.eps);
    ops::linear(a.data(), b.q.f32(), nullptr, q.data(), L, D, A);
    ops::linear(a.data(), b.k.f32(), nullptr, kk.data(), L, D, A);
    ops::linear(a.data(), b.v.f32(), nullptr, v.data(), L, D, A);
    round_all(q), round_all(kk), round_all(v);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        float mx = -INFINITY;
        for (int64_t j = 0; j < L; ++j) {
          float s = 0;
          for (int64_t d = 0; d < Dh; ++d) s += q[i * A + h * Dh + d] * kk[j * A + h * Dh + d];
          s += b.pos_embedding.f32()[t5_relative_bucket(j - i, c.num_buckets, c.max_distance) * H + h];
          p[j] = s;
          mx = std::max(mx, s);
        }
        float sum = 0;
        for (int64_t j = 0; j < L; ++j) sum += (p[j] = std::exp(p[j] - mx));
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < Dh; ++d) att[i * A + h * Dh + d] = 0;
        for (int64_t j = 0; j < L; ++j) {
          const float pj = rb(p[j] * inv);
          for (int64_t d = 0; d < Dh; ++d) att[i * A + h * Dh + d] += pj * v[j * A + h * Dh + d];
        }
      }
    round_all(att);
    ops::linear(att.data(), b.o.f32(), nullptr, y.data(), L, A, D);
    for (size_t e = 0; e < x.size(); ++e) x[e] += rb(y[e]);
    rms_bf16(x.data(), b.norm2.f32(), a.data(), L, D, c.eps);
    ops::linear(a.data(), b.ffn_gate.f32(), nullptr, g.data(), L, D, F);
    ops::linear(a.data(), b.ffn_fc1.f32(), nullptr, f.data(), L, D, F);
    for (size_t e = 0; e < g.size(); ++e) g[e] = rb(rb(gelu_ref(rb(g[e]))) * rb(f[e]));
    ops::linear(g.data(), b.ffn_fc2.f32(), nullptr, y.data(), L, F, D);
    for (size_t e = 0; e < x.size(); ++e) x[e] += rb(y[e]);
  }
  rms_bf16(x.data(), W.norm.f32(), a.data(), L, D, c.eps);
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Host only: the baseline of the precision rule is a real bf16 error (not zero, not broken).

TEST(T5GpuBaseline, PlainBf16IsNearFp32) {
  const T5Config c = small_config();
  const T5Weights W = make_weights(c, 100, true);
  for (int64_t L : {7, 77}) {
    const std::vector<int32_t> ids = make_ids(c, L, 500 + L);
    const Err base = error_vs(encode_bf16_plain(c, W, ids), vec_of(t5_encode(c, W, ids.data(), L)));
    std::printf("bf16 plain L=%lld: max %.3g rel %.3g\n", static_cast<long long>(L), base.max_abs, base.rel_l2);
    EXPECT_GT(base.rel_l2, 1e-4);
    EXPECT_LT(base.rel_l2, 1e-2);
  }
}

// ---------------------------------------------------------------------------------------------------
// Kernels

TEST(T5GpuKernels, AddRmsNorm) {
  REQUIRE_GPU();
  const int64_t L = 37, D = 4096;
  const float eps = 1e-6f;
  std::vector<float> x = randn(11, L * D, 1.0f);
  for (int64_t i = 0; i < L; ++i) x[i * D + 7] *= 300.0f;  // an outlier channel
  const std::vector<float> y = round_bf16(randn(12, L * D, 2.0f));
  const std::vector<float> w = randn(13, D, 0.05f, 1.0f);
  DevBuf<float> dx(x.size()), dw(w.size());
  DevBuf<uint16_t> dy(y.size()), dout(x.size());
  dx.upload(x), dw.upload(w), dy.upload(to_bf16(y));
  for (bool with_y : {true, false}) {
    dout.poison();
    k::add_rms_norm(dx.p, with_y ? reinterpret_cast<const __nv_bfloat16*>(dy.p) : nullptr, dw.p,
                    reinterpret_cast<__nv_bfloat16*>(dout.p), L, D, eps, nullptr);
    const std::vector<float> got_x = dx.download(), got = to_f32(dout.download());
    std::vector<float> xs = x;
    if (with_y)
      for (size_t e = 0; e < xs.size(); ++e) xs[e] = x[e] + y[e];
    ASSERT_EQ(0, std::memcmp(got_x.data(), xs.data(), xs.size() * 4)) << "fp32 residual add not exact";
    std::vector<float> ref(xs.size()), emu(xs.size());
    ops::rms_norm(xs.data(), w.data(), ref.data(), L, D, eps);
    rms_bf16(xs.data(), w.data(), emu.data(), L, D, eps);
    const Err e = error_vs(got, ref), base = error_vs(emu, ref);
    std::printf("add_rms_norm (y %d): max %.3g rel %.3g (bf16 plain max %.3g rel %.3g)\n", with_y, e.max_abs,
                e.rel_l2, base.max_abs, base.rel_l2);
    expect_2x_bf16(e, base, "add_rms_norm");
    x = xs;  // the residual now holds x + y
  }
}

TEST(T5GpuKernels, GeluMul) {
  REQUIRE_GPU();
  const int64_t L = 77, F = 10240;
  const std::vector<float> gf = round_bf16(randn(21, L * 2 * F, 2.0f));
  DevBuf<uint16_t> dgf(gf.size()), dh(L * F);
  dgf.upload(to_bf16(gf));
  dh.poison();
  k::gelu_mul(reinterpret_cast<const __nv_bfloat16*>(dgf.p), reinterpret_cast<__nv_bfloat16*>(dh.p), L, F, nullptr);
  const std::vector<float> got = to_f32(dh.download());
  std::vector<float> ref(got.size()), emu(got.size());
  for (int64_t i = 0; i < L; ++i)
    for (int64_t c = 0; c < F; ++c) {
      const float g = gf[i * 2 * F + c], f = gf[i * 2 * F + F + c];
      ref[i * F + c] = static_cast<float>(0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * f);
      emu[i * F + c] = rb(rb(gelu_ref(g)) * f);
    }
  const Err e = error_vs(got, ref), base = error_vs(emu, ref);
  std::printf("gelu_mul: max %.3g rel %.3g (bf16 plain max %.3g rel %.3g)\n", e.max_abs, e.rel_l2, base.max_abs,
              base.rel_l2);
  expect_2x_bf16(e, base, "gelu_mul");
}

TEST(T5GpuKernels, SoftmaxBias) {
  REQUIRE_GPU();
  const int64_t H = 64, NB = 32;
  std::vector<int32_t> buckets(2 * k::kMaxTokens - 1);
  for (int64_t r = -(k::kMaxTokens - 1); r <= k::kMaxTokens - 1; ++r)
    buckets[r + k::kMaxTokens - 1] = t5_relative_bucket(r, NB, 128);
  DevBuf<int32_t> db(buckets.size());
  db.upload(buckets);
  const std::vector<float> pos = randn(31, NB * H, 1.0f);
  DevBuf<float> dpos(pos.size());
  dpos.upload(pos);
  for (int64_t L : {1, 7, 77, 512}) {
    const int64_t ld = (L + 7) / 8 * 8;
    std::vector<float> S = randn(32 + L, H * L * ld, 3.0f);
    for (int64_t r = 0; r < H * L; ++r)
      for (int64_t j = L; j < ld; ++j) S[r * ld + j] = NAN;  // padding: never read
    DevBuf<float> dS(S.size());
    DevBuf<uint16_t> dP(S.size());
    dS.upload(S);
    dP.poison();
    k::softmax_bias(dS.p, dpos.p, db.p, reinterpret_cast<__nv_bfloat16*>(dP.p), H, L, ld, nullptr);
    const std::vector<float> got_all = to_f32(dP.download());
    std::vector<float> got, ref, emu;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t r = h * L + i;
        std::vector<double> e(L);
        double mx = -INFINITY, sum = 0;
        std::vector<float> sf(L);
        float mxf = -INFINITY;
        for (int64_t j = 0; j < L; ++j) {
          sf[j] = S[r * ld + j] + pos[buckets[j - i + k::kMaxTokens - 1] * H + h];
          mx = std::max(mx, static_cast<double>(sf[j]));
          mxf = std::max(mxf, sf[j]);
        }
        float sumf = 0;
        std::vector<float> ef(L);
        for (int64_t j = 0; j < L; ++j) {
          sum += (e[j] = std::exp(sf[j] - mx));
          sumf += (ef[j] = std::exp(sf[j] - mxf));
        }
        for (int64_t j = 0; j < ld; ++j) {
          if (j >= L) {
            ASSERT_EQ(got_all[r * ld + j], 0.0f) << "padding column not zeroed";
            continue;
          }
          got.push_back(got_all[r * ld + j]);
          ref.push_back(static_cast<float>(e[j] / sum));
          emu.push_back(rb(ef[j] * (1.0f / sumf)));
        }
      }
    const Err e = error_vs(got, ref), base = error_vs(emu, ref);
    std::printf("softmax_bias L=%lld: max %.3g rel %.3g (bf16 plain max %.3g rel %.3g)\n",
                static_cast<long long>(L), e.max_abs, e.rel_l2, base.max_abs, base.rel_l2);
    expect_2x_bf16(e, base, "softmax_bias", 1e-6);
  }
}

// ---------------------------------------------------------------------------------------------------
// The whole encoder vs the CPU fp32 reference

namespace {
void check_encoder(const T5Config& c, bool outlier, const std::vector<int64_t>& lengths) {
  const T5Weights W = make_weights(c, 100, outlier);
  T5EncoderGpu enc(c, W, 0);
  EXPECT_EQ(enc.weight_bytes(), T5EncoderGpu::weight_bytes(c));
  for (int64_t L : lengths) {  // increasing: rows a shorter run never wrote still hold the NaN poison
    const std::vector<int32_t> ids = make_ids(c, L, 500 + L);
    const Tensor out = enc.encode(ids.data(), L);
    ASSERT_EQ(out.shape(), Shape({L, c.dim}));
    const std::vector<float> got = vec_of(out);
    const std::vector<float> ref = vec_of(t5_encode(c, W, ids.data(), L));
    const std::vector<float> emu = encode_bf16_plain(c, W, ids);
    const Err e = error_vs(got, ref), base = error_vs(emu, ref);
    std::printf("encoder dim %d heads %d L=%lld: max %.3g rel %.3g (bf16 plain max %.3g rel %.3g), max|ref| %.3g\n",
                c.dim, c.num_heads, static_cast<long long>(L), e.max_abs, e.rel_l2, base.max_abs, base.rel_l2,
                max_abs_of(ref));
    expect_2x_bf16(e, base, cat("encoder L=", L), 1e-6);
    EXPECT_LE(e.rel_l2, kRelL2Bound);
  }
}
}  // namespace

TEST(T5Gpu, MatchesCpuHeadDim64) {
  REQUIRE_GPU();
  check_encoder(small_config(), true, {1, 7, 77, 512});
}

TEST(T5Gpu, MatchesCpuTinyPreset) {
  REQUIRE_GPU();
  check_encoder(t5_preset("tiny"), false, {33});
}

TEST(T5Gpu, Deterministic) {
  REQUIRE_GPU();
  const T5Config c = small_config();
  const T5Weights W = make_weights(c, 200, true);
  const std::vector<int32_t> ids = make_ids(c, 77, 9);
  T5EncoderGpu a(c, W, 0), b(c, W, 0);
  const Tensor o1 = a.encode(ids.data(), 77);
  const std::vector<int32_t> other = make_ids(c, 300, 10);
  a.encode(other.data(), 300);  // a different length in between
  const Tensor o2 = a.encode(ids.data(), 77);
  const Tensor o3 = b.encode(ids.data(), 77);
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.nbytes())) << "two encodes differ";
  EXPECT_EQ(0, std::memcmp(o1.data(), o3.data(), o1.nbytes())) << "two encoder objects differ";
}

// Random weights drawn on the GPU == the documented formula drawn on the host and uploaded.
TEST(T5Gpu, RandomWeightsMatchHostFormula) {
  REQUIRE_GPU();
  const T5Config c = small_config();
  const uint64_t seed = 77;
  auto host_draw = [&](const std::string& name) -> Tensor {
    const int64_t D = c.dim, A = c.dim_attn, F = c.dim_ffn;
    Shape s;
    float scale = 0, offset = 0;
    bool bf = true;
    auto lin = [](int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(3.0 * static_cast<double>(fan_in))); };
    auto ends = [&](const char* suf) { return name.size() >= std::strlen(suf) && name.ends_with(suf); };
    if (name == "token_embedding.weight") s = {c.vocab, D}, scale = 1.0f;
    else if (ends("norm.weight") || ends("norm1.weight") || ends("norm2.weight")) s = {D}, scale = 0.05f, offset = 1.0f, bf = false;
    else if (ends("attn.q.weight") || ends("attn.k.weight") || ends("attn.v.weight")) s = {A, D}, scale = lin(D);
    else if (ends("attn.o.weight")) s = {D, A}, scale = lin(A);
    else if (ends("ffn.gate.0.weight") || ends("ffn.fc1.weight")) s = {F, D}, scale = lin(D);
    else if (ends("ffn.fc2.weight")) s = {D, F}, scale = lin(F);
    else if (ends("pos_embedding.embedding.weight")) s = {c.num_buckets, c.num_heads}, scale = 1.0f, bf = false;
    else ADD_FAILURE() << "unexpected name " << name;
    const uint64_t ws = random_weight_key(seed, name);
    Tensor t = Tensor::empty(DType::F32, s);
    for (int64_t i = 0; i < s.numel(); ++i) {
      const float v = philox_normal(ws, static_cast<uint64_t>(i)) * scale;
      t.f32()[i] = bf ? rb(v) : v + offset;
    }
    return t;
  };
  T5WeightSource hs;
  hs.get = host_draw;
  T5WeightSource rs;
  rs.random = true;
  rs.seed = seed;
  T5EncoderGpu from_host(c, hs, 0), drawn(c, rs, 0);
  const std::vector<int32_t> ids = make_ids(c, 130, 3);
  const Tensor a = from_host.encode(ids.data(), 130), b = drawn.encode(ids.data(), 130);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes())) << "GPU random draw differs from the host formula";
  EXPECT_GT(max_abs_of(vec_of(b)), 0.1);
}

TEST(T5Gpu, BadInput) {
  REQUIRE_GPU();
  const T5Config c = small_config();
  const T5Weights W = make_weights(c, 300, false);
  T5EncoderGpu enc(c, W, 0);
  std::vector<int32_t> ids = make_ids(c, 513, 4);
  EXPECT_THROW(enc.encode(ids.data(), 0), wan::Error);
  EXPECT_THROW(enc.encode(ids.data(), 513), wan::Error);
  EXPECT_THROW(enc.encode(nullptr, 5), wan::Error);
  ids[3] = c.vocab;
  EXPECT_THROW(enc.encode(ids.data(), 7), wan::Error);
  ids[3] = -1;
  EXPECT_THROW(enc.encode(ids.data(), 7), wan::Error);
  ids[3] = 5;
  EXPECT_NO_THROW(enc.encode(ids.data(), 7));  // still usable after the errors

  // A wrong weight shape names the tensor.
  T5Weights bad = W;
  bad.blocks[1].o = Tensor(DType::F32, {c.dim, c.dim_attn + 8});
  try {
    T5EncoderGpu e(c, bad, 0);
    ADD_FAILURE() << "no error for a wrong shape";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.1.attn.o.weight"), std::string::npos) << e.what();
  }
  // A model that cannot fit: one clear error before allocating.
  T5Config huge = c;
  huge.vocab = 2000000000;
  huge.dim = 4096;
  huge.dim_attn = 4096;
  huge.num_heads = 64;
  size_t free0 = 0, free1 = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  try {
    T5WeightSource rs;
    rs.random = true;
    T5EncoderGpu e(huge, rs, 0);
    ADD_FAILURE() << "no error for a model larger than the device";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MiB free"), std::string::npos) << e.what();
  }
  CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  EXPECT_LE(free0 - std::min(free0, free1), size_t{64} << 20) << "memory left allocated after the error";
  T5Config odd = c;
  odd.dim = 250;
  EXPECT_THROW({ T5EncoderGpu e(odd, W, 0); }, wan::Error);
}

// ---------------------------------------------------------------------------------------------------
// umt5-xxl size, random weights drawn on the GPU

TEST(T5Gpu, TimingUmt5Xxl) {
  REQUIRE_GPU();
  const T5Config c = t5_preset("umt5-xxl");
  size_t free0 = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  if (free0 < T5EncoderGpu::device_bytes(c)) GTEST_SKIP() << "not enough device memory for umt5-xxl";
  T5WeightSource rs;
  rs.random = true;
  rs.seed = 42;
  using clk = std::chrono::steady_clock;
  auto secs = [](clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const auto t0 = clk::now();
  T5EncoderGpu enc(c, rs, 0);
  const auto t1 = clk::now();
  EXPECT_EQ(enc.weight_bytes(), T5EncoderGpu::weight_bytes(c));
  std::printf("umt5-xxl: weights %.3f GB (%.2f GiB), device_bytes %.2f GiB, random draw %.3f s\n",
              enc.weight_bytes() / 1e9, enc.weight_bytes() / 1073741824.0,
              T5EncoderGpu::device_bytes(c) / 1073741824.0, secs(t0, t1));
  for (int64_t L : {512, 100}) {
    const std::vector<int32_t> ids = make_ids(c, L, 1000 + L);
    Tensor out = enc.encode(ids.data(), L);  // warm-up: builds the GEMM plans
    std::vector<double> ts;
    for (int it = 0; it < 5; ++it) {
      const auto a = clk::now();
      out = enc.encode(ids.data(), L);
      ts.push_back(secs(a, clk::now()));
    }
    std::sort(ts.begin(), ts.end());
    const std::vector<float> v = vec_of(out);
    size_t nonfinite = 0;
    double ss = 0;
    for (float e : v) {
      if (!std::isfinite(e)) ++nonfinite;
      else ss += static_cast<double>(e) * e;
    }
    std::printf("umt5-xxl encode L=%lld: median %.2f ms (min %.2f, max %.2f), output rms %.3g\n",
                static_cast<long long>(L), ts[2] * 1e3, ts[0] * 1e3, ts[4] * 1e3, std::sqrt(ss / v.size()));
    EXPECT_EQ(nonfinite, 0u);
    EXPECT_GT(ss, 0.0);
    EXPECT_LT(ts[2], 1.0) << "encode of " << L << " tokens";
  }
  size_t free1 = 0;
  CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  std::printf("umt5-xxl: peak device memory of the encoder %.2f GiB (device in use %.2f of %.2f GiB)\n",
              (free0 - free1) / 1073741824.0, (total - free1) / 1073741824.0, total / 1073741824.0);
}
