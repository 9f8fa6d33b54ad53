// The GPU DiT (src/models/dit/dit_gpu.h) with TI2V's per-token timesteps (DiTShape::first_frame_t,
// DiTInputs::t_first: latent frame 0's tokens at their own timestep) and the I2V / TI2V-5B shapes,
// against the CPU fp32 reference (wan::dit_forward, its t [B, seq_len] built the same way) on fresh
// random inputs and random weights drawn on the GPU (downloaded for the CPU):
//   tiny TI2V (in/out 48) per token (different t and t_first per sample) and per sample;
//   a TI2V-5B-width model (dim 3072, 24 heads, ffn 14336, in/out 48, 2 blocks) per token and per sample;
//   the tiny fixture's per-token case (diffusers oracle too); tiny I2V (in_dim 36);
//   t_first == t gives the per-sample forward bit for bit (also with one latent, and at 5B width);
//   CUDA-graph replay (and a graph from warm_up) with a changed t_first equals the eager forward;
//   one latent with t_first against both samples in full; the input checks; profile_forward's GEMM
//   count; the memory plan's first-frame rows.
// Precision rule as tests/gpu/test_dit_gpu.cu: rel L2 vs CPU fp32 <= 2e-2, every output written
// (outputs poisoned with NaN first).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt/names.h"
#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "kernels/check.h"
#include "models/config.h"
#include "models/dit/dit_cpu.h"
#include "models/dit/dit_gpu.h"
#include "gpu_test_model.h"

using namespace wan;
using cuda::DiTGpu;
using cuda::DiTShape;
using cuda::DiTWeightSource;
using gpu_test::bit_equal;
using gpu_test::DiTHostInputs;
using gpu_test::poisoned;

namespace {

constexpr double kRelL2Bound = 2e-2;

// Per-token ("image mode") inputs: shape with first_frame_t, t and t_first per sample.
DiTHostInputs ti2v_inputs(const DiTConfig& c, DiTShape s, uint64_t seed, std::vector<float> t,
                          std::vector<float> t_first) {
  s.first_frame_t = true;
  DiTHostInputs f = gpu_test::dit_host_inputs(c, s, seed, std::move(t),
                                             s.batch == 2 ? std::vector<int64_t>{97, 23} : std::vector<int64_t>{61});
  f.t_first = std::move(t_first);
  return f;
}
// The same inputs as one timestep per sample (t for every token).
DiTHostInputs per_sample(DiTHostInputs f) {
  f.shape.first_frame_t = false;
  f.t_first.clear();
  return f;
}

std::vector<float> run(DiTGpu& gpu, const DiTConfig& c, const DiTHostInputs& f) {
  std::vector<float> o = poisoned(f.out_numel(c));
  gpu.forward(0, f.shape, f.in(), o.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return o;
}

DiTWeights cpu_weights(const DiTConfig& c, const DiTGpu& gpu) {
  return load_dit_weights(c, [&](const std::string& n) { return gpu.download_weight(0, n); });
}
std::vector<float> cpu_forward(const DiTConfig& c, const DiTWeights& w, const DiTHostInputs& f) {
  const Tensor r = dit_forward(c, w, f.cpu_x(c), f.cpu_t(c), f.cpu_ctx(c), f.lens);
  return std::vector<float>(r.f32(), r.f32() + r.numel());
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what,
                  double bound = kRelL2Bound) {
  const gpu_test::Err e = gpu_test::error_vs(got, ref);
  std::printf("  %-52s rel L2 %.3e  max abs %.3e  (max|ref| %.3g)\n", what.c_str(), e.rel_l2, e.max_abs,
              gpu_test::max_abs_of(ref));
  EXPECT_EQ(e.nonfinite, 0u) << what << ": unwritten or non-finite outputs";
  EXPECT_GT(gpu_test::max_abs_of(ref), 0.0) << what;
  EXPECT_LE(e.rel_l2, bound) << what;
}

// Eager, capture + replay, replay: all equal to the first, bit for bit; returns the first.
std::vector<float> run_thrice(DiTGpu& gpu, const DiTConfig& c, const DiTHostInputs& f, const std::string& what) {
  std::vector<float> first = run(gpu, c, f);
  for (int rep = 1; rep < 3; ++rep) EXPECT_TRUE(bit_equal(run(gpu, c, f), first)) << what << ": forward " << rep;
  return first;
}

DiTConfig tiny_ti2v() { return dit_preset("tiny-ti2v"); }
// 3 x 3 x 5 patches: 45 tokens per sample, the first 15 of latent frame 0.
const DiTShape kTinyShape{2, 3, 6, 10};

TEST(GpuDitTi2v, TinyPerTokenTimestepsMatchCpu) {
  REQUIRE_GPU();
  const DiTConfig c = tiny_ti2v();
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(41)}, kTinyShape);
  const DiTWeights w = cpu_weights(c, gpu);
  // Different t and t_first per sample, so a sample mix-up shows.
  const DiTHostInputs f = ti2v_inputs(c, kTinyShape, 11, {700.0f, 640.0f}, {0.0f, 35.0f});
  const std::vector<float> got = run_thrice(gpu, c, f, "tiny per-token");
  expect_close(got, cpu_forward(c, w, f), "tiny TI2V per-token t vs CPU fp32");
  const DiTHostInputs p = per_sample(f);
  const std::vector<float> ps = run_thrice(gpu, c, p, "tiny per-sample");
  expect_close(ps, cpu_forward(c, w, p), "tiny TI2V per-sample t vs CPU fp32");
  EXPECT_FALSE(bit_equal(got, ps)) << "t_first had no effect";
  EXPECT_EQ(gpu.graphs_captured(), 2u) << "per-token and per-sample forwards have a graph each";
}

// The fixture's ti2v_tokens case (diffusers oracle): t [1, 18] on a 3 x 2 x 3 grid, 0 for the 6 tokens
// of latent frame 0 and 700 for the rest.
TEST(GpuDitTi2v, FixturePerTokenCaseMatchesCpuAndDiffusers) {
  REQUIRE_GPU();
  const std::string dir = std::string(WAN_FIXTURES) + "/tiny_dit";
  const SafetensorsSet weights = SafetensorsSet::open(dir + "/transformer");
  const SafetensorsSet cases = SafetensorsSet::open(dir + "/cases.safetensors");
  const DiTConfig c = dit_config_from_json(gpu_test::slurp(dir + "/transformer/config.json"));
  auto getter = [&](const std::string& official) { return weights.get(dit_official_to_diffusers(official)); };
  const Tensor x = cases.get("ti2v_tokens.x").to_f32(), t = cases.get("ti2v_tokens.t").to_f32();
  const Tensor ctx = cases.get("ti2v_tokens.context").to_f32();
  const Tensor lens_t = cases.get("ti2v_tokens.context_lens");
  const std::vector<int64_t> lens(static_cast<const int64_t*>(lens_t.data()),
                                  static_cast<const int64_t*>(lens_t.data()) + lens_t.numel());
  DiTShape s{x.dim(0), x.dim(2), x.dim(3), x.dim(4)};
  s.first_frame_t = true;
  const int64_t hw = (s.height / 2) * (s.width / 2), L = s.frames * hw;
  ASSERT_EQ(s.batch, 1);
  ASSERT_EQ(t.numel(), L);
  const float t_first = t.f32()[0], t_rest = t.f32()[L - 1];
  for (int64_t n = 0; n < L; ++n) ASSERT_EQ(t.f32()[n], n < hw ? t_first : t_rest) << "fixture t pattern, token " << n;

  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::from(getter)}, s);
  cuda::DiTInputs in;
  in.x = x.f32(), in.t = &t_rest, in.t_first = &t_first;
  in.context = ctx.data(), in.context_dtype = DType::F32, in.ctx_rows = ctx.dim(1), in.ctx_lens = lens.data();
  std::vector<float> got = poisoned(static_cast<size_t>(x.dim(0) * c.out_dim * s.frames * s.height * s.width));
  gpu.forward(0, s, in, got.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor ref = dit_forward(c, load_dit_weights(c, getter), x, t, ctx, lens);
  expect_close(got, std::vector<float>(ref.f32(), ref.f32() + ref.numel()), "fixture ti2v_tokens vs CPU fp32");
  const Tensor oracle = cases.get("ti2v_tokens.out").to_f32();
  expect_close(got, std::vector<float>(oracle.f32(), oracle.f32() + oracle.numel()),
               "fixture ti2v_tokens vs diffusers fp32");
}

// TI2V-5B widths (dim 3072, 24 heads of 128, ffn 14336, in/out 48) with 2 blocks, batch 2 (CFG: one t
// and t_first for both, the image mode's values) on 3 x 8 x 11 patches (264 tokens, 88 of frame 0).
TEST(GpuDitTi2v, Ti2v5BWidthMatchesCpu) {
  REQUIRE_GPU();
  DiTConfig c = dit_preset("ti2v-5B");
  c.num_layers = 2;
  const DiTShape s{2, 3, 16, 22};
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(5005)}, s);
  const DiTWeights w = cpu_weights(c, gpu);
  const DiTHostInputs f = ti2v_inputs(c, s, 21, {700.0f, 700.0f}, {0.0f, 0.0f});
  const std::vector<float> got = run_thrice(gpu, c, f, "5B per-token");
  expect_close(got, cpu_forward(c, w, f), "TI2V-5B width, per-token t vs CPU fp32");
  const DiTHostInputs p = per_sample(ti2v_inputs(c, s, 22, {937.0f, 412.0f}, {}));
  expect_close(run_thrice(gpu, c, p, "5B per-sample"), cpu_forward(c, w, p), "TI2V-5B width, per-sample t vs CPU");
  // t_first == t is the per-sample forward, bit for bit (same GEMM plans for both time rows).
  DiTHostInputs same = ti2v_inputs(c, s, 22, {937.0f, 412.0f}, {937.0f, 412.0f});
  EXPECT_TRUE(bit_equal(run_thrice(gpu, c, same, "5B t_first == t"), run(gpu, c, p))) << "5B width";
}

// t_first == t: the same output as without first_frame_t, bit for bit, eager and replayed, for two
// samples with their own timesteps and for one latent (equal timesteps, the shared first block).
TEST(GpuDitTi2v, TFirstEqualToTIsThePerSampleForward) {
  REQUIRE_GPU();
  const DiTConfig c = tiny_ti2v();
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(42)}, kTinyShape);
  for (bool one_latent : {false, true}) {
    DiTShape s = kTinyShape;
    s.one_latent = one_latent;
    const std::vector<float> t = one_latent ? std::vector<float>{650.0f, 650.0f} : std::vector<float>{650.0f, 420.0f};
    DiTHostInputs f = ti2v_inputs(c, s, 31, t, t);
    const std::string what = one_latent ? "one latent" : "two latents";
    const std::vector<float> want = run_thrice(gpu, c, per_sample(f), what + ", per-sample");
    EXPECT_TRUE(bit_equal(run_thrice(gpu, c, f, what + ", t_first == t"), want)) << what;
  }
  EXPECT_EQ(gpu.graphs_captured(), 4u);
}

// t_first is an input like t: copied into the arena before a graph replays, so a replay with new values
// equals an eager forward on them; a graph captured by warm_up() (first forward replays) too.
TEST(GpuDitTi2v, GraphReplayWithNewTFirstEqualsEager) {
  REQUIRE_GPU();
  const DiTConfig c = tiny_ti2v();
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(43)}, kTinyShape);
  const DiTHostInputs a = ti2v_inputs(c, kTinyShape, 51, {700.0f, 700.0f}, {0.0f, 0.0f});
  DiTHostInputs b = a;
  b.t_first = {120.0f, 300.0f};
  gpu.set_use_graphs(false);
  const std::vector<float> ea = run(gpu, c, a), eb = run(gpu, c, b);
  gpu.set_use_graphs(true);
  const std::vector<float> ga = run(gpu, c, a);  // capture + replay
  const std::vector<float> gb = run(gpu, c, b);  // replay, new t_first
  const std::vector<float> ga2 = run(gpu, c, a);
  EXPECT_EQ(gpu.graphs_captured(), 1u);
  EXPECT_EQ(gpu_test::nonfinite(ea), 0u);
  EXPECT_TRUE(bit_equal(ga, ea)) << "replay differs from the eager forward";
  EXPECT_TRUE(bit_equal(gb, eb)) << "replay with a new t_first differs from the eager forward on it";
  EXPECT_TRUE(bit_equal(ga2, ea)) << "replay with the first t_first again";
  EXPECT_FALSE(bit_equal(eb, ea)) << "t_first had no effect";

  DiTGpu warm = DiTGpu::create(c, {DiTWeightSource::random_weights(43)}, kTinyShape);
  warm.warm_up({{0, a.shape}});
  EXPECT_EQ(warm.graphs_captured(), 1u);
  EXPECT_TRUE(bit_equal(run(warm, c, b), eb)) << "first forward through warm_up's graph";
  EXPECT_TRUE(bit_equal(run(warm, c, a), ea)) << "second forward through warm_up's graph";
  EXPECT_EQ(warm.graphs_captured(), 1u);
}

// I2V's in_dim 36 (x holds the 20 conditioning channels after the 16 noise channels) at the tiny width.
TEST(GpuDitTi2v, I2vInDim36MatchesCpu) {
  REQUIRE_GPU();
  const DiTConfig c = dit_preset("tiny-i2v");
  ASSERT_EQ(c.in_dim, 36);
  const DiTShape s{2, 3, 6, 10};
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(44)}, s);
  const DiTHostInputs f = gpu_test::dit_host_inputs(c, s, 61, {900.0f, 900.0f}, {97, 23});
  expect_close(run_thrice(gpu, c, f, "i2v"), cpu_forward(c, cpu_weights(c, gpu), f), "tiny I2V (in_dim 36) vs CPU");
}

// One latent for both samples with a first-frame timestep: against both samples computed in full (the
// shared first block's GEMMs may pick other kernels for the smaller M, see test_dit_gpu.cu), and against
// the CPU; a second t_first is refused like a second t.
TEST(GpuDitTi2v, OneLatentWithFirstFrameTimestep) {
  REQUIRE_GPU();
  const DiTConfig c = tiny_ti2v();
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(45)}, kTinyShape);
  DiTHostInputs f = ti2v_inputs(c, kTinyShape, 71, {700.0f, 700.0f}, {0.0f, 0.0f});
  const auto half = static_cast<ptrdiff_t>(f.x.size() / 2);
  std::copy(f.x.begin(), f.x.begin() + half, f.x.begin() + half);  // one latent, two prompts
  const std::vector<float> full = run(gpu, c, f);
  DiTHostInputs one = f;
  one.shape.one_latent = true;
  std::fill(one.x.begin() + half, one.x.end(), std::nanf(""));  // must not be read
  const std::vector<float> got = run_thrice(gpu, c, one, "one latent");
  expect_close(got, full, "one latent vs both samples in full", 1e-3);
  expect_close(got, cpu_forward(c, cpu_weights(c, gpu), f), "one latent, per-token t vs CPU fp32");

  DiTHostInputs bad = one;
  bad.t_first = {0.0f, 5.0f};
  std::string msg;
  try {
    gpu.forward(0, bad.shape, bad.in(), poisoned(bad.out_numel(c)).data(), nullptr);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("needs one first-frame timestep"), std::string::npos) << msg;
}

// t_first and DiTShape::first_frame_t go together: either alone is one clear error before any work.
TEST(GpuDitTi2v, TFirstAndShapeFlagMustAgree) {
  REQUIRE_GPU();
  const DiTConfig c = tiny_ti2v();
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(46)}, kTinyShape);
  const DiTHostInputs f = ti2v_inputs(c, kTinyShape, 81, {700.0f, 700.0f}, {0.0f, 0.0f});
  auto error_of = [&](const DiTShape& s, cuda::DiTInputs in) {
    std::vector<float> out = poisoned(f.out_numel(c));
    try {
      gpu.forward(0, s, in, out.data(), nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  cuda::DiTInputs no_first = f.in();
  no_first.t_first = nullptr;
  const std::string a = error_of(f.shape, no_first);
  EXPECT_NE(a.find("needs DiTInputs::t_first"), std::string::npos) << a;
  const std::string b = error_of(per_sample(f).shape, f.in());
  EXPECT_NE(b.find("first_frame_t is off"), std::string::npos) << b;
  EXPECT_EQ(gpu.graphs_captured(), 0u);
}

// profile_forward with a first-frame timestep: the 3 extra time GEMMs are counted, the output equals the
// eager forward's bit for bit.
TEST(GpuDitTi2v, ProfileForwardWithTFirst) {
  REQUIRE_GPU();
  const DiTConfig c = tiny_ti2v();
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(47)}, kTinyShape);
  const DiTHostInputs f = ti2v_inputs(c, kTinyShape, 91, {700.0f, 650.0f}, {0.0f, 10.0f});
  for (bool first : {true, false}) {
    const DiTHostInputs in = first ? f : per_sample(f);
    gpu.set_use_graphs(false);
    const std::vector<float> want = run(gpu, c, in);
    gpu.set_use_graphs(true);
    std::vector<float> got = poisoned(want.size());
    const cuda::OpProfile p = gpu.profile_forward(0, in.shape, in.in(), got.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(p.gemms, 7 * c.num_layers + (first ? 10 : 7)) << (first ? "t_first" : "per sample");
    EXPECT_EQ(p.self_attentions, c.num_layers);
    EXPECT_TRUE(bit_equal(got, want)) << (first ? "t_first" : "per sample");
  }
}

// The plan holds t_first, e_first [B, D] and e0_first [B, 6D] at the arena's alignment, whatever the
// shape says (a few KiB: one plan serves both kinds of forward). Host arithmetic only.
TEST(GpuDitTi2v, MemoryPlanHoldsTheFirstFrameRows) {
  const DiTConfig c = dit_preset("ti2v-5B");
  DiTShape s{2, 31, 44, 80};  // 704 x 1280, 121 frames
  const cuda::MemoryPlan p = DiTGpu::plan(c, s, 1);
  s.first_frame_t = true;
  const cuda::MemoryPlan q = DiTGpu::plan(c, s, 1);
  EXPECT_EQ(p.arena_bytes, q.arena_bytes);
  const size_t B = 2, D = static_cast<size_t>(c.dim);
  EXPECT_EQ(q.get("t_first").bytes, B * 4);
  EXPECT_EQ(q.get("e_first").bytes, B * D * 4);
  EXPECT_EQ(q.get("e0_first").bytes, B * 6 * D * 4);
  for (const char* n : {"t_first", "e_first", "e0_first", "e", "e0"}) EXPECT_EQ(q.get(n).offset % 256, 0u) << n;
}

}  // namespace
