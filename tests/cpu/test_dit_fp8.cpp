// FP8 block GEMMs of the DiT on the host:
// (a) the CPU reference's emulation (dit_forward's fp8_block_gemms): deterministic, near the exact forward
//     (the e4m3 error of 7 GEMMs per block), and exactly the quantised linear of ops/fp8_ref.h;
// (b) CUDA builds: DiTGpu::parse_gemm and the memory plan's arithmetic (pure host): the e4m3 weights take
//     one byte per element plus four per output row, their ranges and scales 16-byte aligned, the
//     quantised inputs are views plus one small buffer of row scales, and a 720p two-expert plan shrinks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/philox.h"
#include "models/config.h"
#include "models/dit/dit_cpu.h"
#include "models/dit/weights.h"
#include "models/weight_spec.h"
#include "ops/fp8_ref.h"
#ifdef WAN_HAVE_CUDA
#include "models/dit/dit_gpu.h"
#endif

using namespace wan;

namespace {

DiTConfig small_config() {
  DiTConfig c = dit_preset("tiny");
  c.num_layers = 1;
  c.text_len = 16;
  c.text_dim = 64;
  return c;
}

Tensor randn(const Shape& s, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(DType::F32, s);
  philox_normal_fill(seed, 0, t.f32(), static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] *= scale;
  return t;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double d = 0, n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d += (a.f32()[i] - b.f32()[i]) * static_cast<double>(a.f32()[i] - b.f32()[i]);
    n += b.f32()[i] * static_cast<double>(b.f32()[i]);
  }
  return std::sqrt(d / n);
}

}  // namespace

TEST(DitFp8Cpu, EmulationIsDeterministicAndNearTheExactForward) {
  const DiTConfig c = small_config();
  const WeightTable table = dit_weight_table(c);
  const DiTWeights w =
      load_dit_weights(c, [&](const std::string& n) { return draw_random_weight(find_weight(table, n, "DiT"), 4); });
  const Tensor x = randn({1, c.in_dim, 2, 8, 8}, 1, 1.0f), ctx = randn({1, 10, c.text_dim}, 2, 0.2f);
  Tensor t = Tensor::empty(DType::F32, {1});
  t.f32()[0] = 600.0f;
  const Tensor exact = dit_forward(c, w, x, t, ctx, {10});
  const Tensor a = dit_forward(c, w, x, t, ctx, {10}, 0, {}, true), b = dit_forward(c, w, x, t, ctx, {10}, 0, {}, true);
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  const double e = rel_l2(a, exact);
  std::printf("  CPU fp8 emulation vs exact: rel L2 %.3e\n", e);
  EXPECT_GT(e, 1e-4);  // the GEMMs really are quantised
  EXPECT_LT(e, 0.1);
}

TEST(DitFp8Cpu, QuantisedLinearIsTheReferenceOnBf16Inputs) {
  // What dit_forward's emulation computes per linear, spelled out: x rounded to bf16, rows quantised.
  const int64_t M = 5, K = 32, N = 16;
  const Tensor x = randn({M, K}, 7, 2.0f), wt = randn({N, K}, 8, 0.1f), bias = randn({N}, 9, 0.1f);
  std::vector<float> xb(x.f32(), x.f32() + M * K);
  for (float& v : xb) v = bf16_to_f32(f32_to_bf16(v));
  std::vector<uint8_t> xq(M * K), wq(N * K);
  std::vector<float> xs(M), ws(N), y(M * N);
  ops::quantize_rows_fp8(xb.data(), M, K, xq.data(), xs.data());
  ops::quantize_rows_fp8(wt.f32(), N, K, wq.data(), ws.data());
  ops::linear_fp8_ref(xq.data(), xs.data(), wq.data(), ws.data(), bias.f32(), y.data(), M, K, N, false);
  // Against the dequantised operands in double: the same sum up to the fp32 scale products.
  std::vector<float> xd(M * K), wd(N * K);
  ops::dequantize_rows_fp8(xq.data(), xs.data(), M, K, xd.data());
  ops::dequantize_rows_fp8(wq.data(), ws.data(), N, K, wd.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias.f32()[n];
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(xd[m * K + k]) * wd[n * K + k];
      EXPECT_NEAR(y[m * N + n], s, 1e-4 * (1 + std::fabs(s))) << m << "," << n;
    }
}

#ifdef WAN_HAVE_CUDA
using cuda::DiTGpu;

TEST(DitFp8Plan, ParseGemm) {
  EXPECT_EQ(DiTGpu::parse_gemm("bf16"), DiTGpu::Gemm::Bf16);
  EXPECT_EQ(DiTGpu::parse_gemm("fp8"), DiTGpu::Gemm::Fp8);
  for (const char* bad : {"fp16", "FP8", ""}) {
    try {
      (void)DiTGpu::parse_gemm(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--gemm: expected bf16 or fp8"), std::string::npos) << e.what();
    }
  }
}

TEST(DitFp8Plan, WeightsTakeOneBytePerElementPlusRowScales) {
  for (const char* preset : {"tiny", "t2v-A14B", "ti2v-5B"}) {
    SCOPED_TRACE(preset);
    const DiTConfig c = dit_preset(preset);
    const cuda::DiTShape s{2, 2, 16, 16};
    const cuda::MemoryPlan bf = DiTGpu::plan(c, s, 1), f8 = DiTGpu::plan(c, s, 1, 0, {}, DiTGpu::Gemm::Fp8);
    EXPECT_EQ(bf.gemm, DiTGpu::Gemm::Bf16);
    EXPECT_EQ(f8.gemm, DiTGpu::Gemm::Fp8);
    // Saved: one byte per block GEMM weight element, less 4 bytes of scale per output row; placement adds
    // at most one 256-byte alignment gap per tensor group either way.
    size_t saved = 0, scales = 0, tensors = 0;
    for (const WeightSpec& w : dit_weight_table(c)) {
      ++tensors;
      if (w.cls != WeightClass::GemmWeight || w.name.rfind("blocks.", 0) != 0) continue;
      saved += static_cast<size_t>(w.shape.numel());
      scales += static_cast<size_t>(w.shape[0]) * 4;
    }
    const double got = static_cast<double>(bf.weight_bytes) - static_cast<double>(f8.weight_bytes);
    const double want = static_cast<double>(saved) - static_cast<double>(scales);
    EXPECT_NEAR(got, want, 256.0 * static_cast<double>(tensors)) << got << " vs " << want;
    EXPECT_LT(f8.weight_bytes, bf.weight_bytes);
    EXPECT_EQ(f8.weight_bytes % 256, 0u);
    // The quantised inputs: views in the arena (16-byte aligned, inside it) and one scale buffer.
    int views = 0;
    for (const cuda::MemoryPlan::Buffer& b : f8.buffers) {
      EXPECT_EQ(b.offset % 16, 0u) << b.name;
      EXPECT_LE(b.offset + b.bytes, f8.arena_bytes) << b.name;
      if (b.name.rfind("fp8.xq", 0) == 0) views += b.view;
    }
    EXPECT_EQ(views, 4);
    EXPECT_FALSE(f8.get("fp8.x_scale").view);
    EXPECT_THROW((void)bf.get("fp8.x_scale"), Error);
    EXPECT_GE(f8.arena_bytes, bf.arena_bytes);
    EXPECT_NE(f8.str().find("FP8"), std::string::npos);
  }
  // The 720p two-expert A14B plan: about 13 GB per expert saved (the block GEMMs are nearly all of 14B).
  const DiTConfig c = dit_preset("t2v-A14B");
  const cuda::MemoryPlan bf = DiTGpu::plan(c, {2, 21, 90, 160}, 2),
                         f8 = DiTGpu::plan(c, {2, 21, 90, 160}, 2, 0, {}, DiTGpu::Gemm::Fp8);
  std::printf("  720p A14B: bf16 %.2f GiB (weights %.2f x 2), fp8 %.2f GiB (weights %.2f x 2)\n",
              bf.total_bytes() / 1073741824.0, bf.weight_bytes / 1073741824.0, f8.total_bytes() / 1073741824.0,
              f8.weight_bytes / 1073741824.0);
  EXPECT_LT(f8.total_bytes() + size_t{20} * 1000 * 1000 * 1000, bf.total_bytes());
}
#endif
