// The GPU DiT forward (src/models/dit/dit_gpu.h) against the CPU fp32 reference (src/models/dit/dit_cpu.h):
// (a) the tiny fixture (tests/fixtures/tiny_dit, bf16-exact weights, diffusers names) on its T2V batch-2,
//     odd-grid, I2V and single-frame cases; host/device and f32/bf16 context inputs agree bit for bit;
// (b) a full-width 14B config (dim 5120, 40 heads, ffn 13824) with 2 blocks and random weights drawn on
//     the GPU (checked against the CPU RNG), downloaded for the CPU forward, at the 480p token grid
//     (30 x 52 patches) with 2 latent frames;
// two experts (one weight allocation each) share one arena, one graph per (expert, shape);
// (c, d) determinism and CUDA-graph replay == eager, bit for bit, at a 480p-like grid (3 x 30 x 52);
//   one latent for both samples (DiTShape::one_latent) against both computed in full;
// (e) the memory plan: layout invariants, the 720p/81-frame two-expert plan fits 80 GB, and a too-large
//     request throws the clear error without allocating.
// Precision rule: GPU vs CPU fp32 within 2e-2 relative L2 (the issue's bound for a bf16 engine; the
// measured numbers are printed), every output element written (outputs poisoned with NaN first).
// The TI2V per-token-timestep fixture case and the TI2V / I2V shapes run in test_dit_gpu_ti2v.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/names.h"
#include "models/weight_spec.h"
#include "models/config.h"
#include "core/dtype.h"
#include "core/philox.h"
#include "kernels/check.h"
#include "kernels/attention_own.h"
#include "models/dit/dit_gpu.h"
#include "kernels/rng.h"
#include "models/dit/dit_cpu.h"
#include "gpu_test_model.h"
#include "formats/safetensors.h"

using namespace wan;
using cuda::DiTGpu;
using cuda::DiTInputs;
using cuda::DiTShape;
using cuda::DiTWeightSource;


namespace {

constexpr double kRelL2Bound = 2e-2;

struct Err {
  double rel_l2 = 0, max_abs = 0, max_ref = 0;
  size_t nonfinite = 0;
};
Err compare(const float* got, const float* ref, size_t n) {
  Err e;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) {
      ++e.nonfinite;
      continue;
    }
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
    e.max_ref = std::max(e.max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  e.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  return e;
}
void expect_close(const Err& e, const std::string& what) {
  std::printf("  %-40s rel L2 %.3e  max abs %.3e  (max|ref| %.3g)\n", what.c_str(), e.rel_l2, e.max_abs, e.max_ref);
  EXPECT_EQ(e.nonfinite, 0u) << what << ": unwritten or non-finite outputs";
  EXPECT_GT(e.max_ref, 0.0) << what;
  EXPECT_LE(e.rel_l2, kRelL2Bound) << what;
}
using gpu_test::bit_equal;
using gpu_test::poisoned;

// ---------------------------------------------------------------------------------------------
// (a) tiny fixture

const std::string kTinyDir = std::string(WAN_FIXTURES) + "/tiny_dit";

using gpu_test::slurp;

struct Tiny {
  DiTConfig cfg, i2v_cfg;
  SafetensorsSet weights = SafetensorsSet::open(kTinyDir + "/transformer");
  SafetensorsSet i2v_patch = SafetensorsSet::open(kTinyDir + "/i2v_patch_embedding.safetensors");
  SafetensorsSet cases = SafetensorsSet::open(kTinyDir + "/cases.safetensors");
  Tiny() {
    cfg = dit_config_from_json(slurp(kTinyDir + "/transformer/config.json"));
    i2v_cfg = cfg;
    i2v_cfg.in_dim = 36;
  }
  // official name -> diffusers name -> tensor (bf16 as stored; the I2V variant swaps the patch embedding)
  Tensor get(const std::string& official, bool i2v) const {
    const std::string d = dit_official_to_diffusers(official);
    WAN_CHECK(!d.empty(), "no diffusers name for ", official);
    if (i2v && official.rfind("patch_embedding.", 0) == 0) return i2v_patch.get(d);
    return weights.get(d);
  }
  std::vector<int64_t> lens(const std::string& c) const {
    Tensor t = cases.get(c + ".context_lens");
    const int64_t* p = static_cast<const int64_t*>(t.data());
    return std::vector<int64_t>(p, p + t.numel());
  }
};

struct CaseRun {
  Tensor x, t, ctx;
  std::vector<int64_t> lens;
  DiTShape shape;
};
CaseRun load_case(const Tiny& fx, const std::string& name) {
  CaseRun r;
  r.x = fx.cases.get(name + ".x").to_f32();
  r.t = fx.cases.get(name + ".t").to_f32();
  r.ctx = fx.cases.get(name + ".context").to_f32();
  r.lens = fx.lens(name);
  r.shape = {r.x.dim(0), r.x.dim(2), r.x.dim(3), r.x.dim(4)};
  return r;
}
DiTInputs host_inputs(const CaseRun& r) {
  DiTInputs in;
  in.x = r.x.f32();
  in.t = r.t.f32();
  in.context = r.ctx.data();
  in.context_dtype = DType::F32;
  in.ctx_rows = r.ctx.dim(1);
  in.ctx_lens = r.lens.data();
  return in;
}

TEST(GpuDit, TinyFixtureMatchesCpuReference) {
  REQUIRE_GPU();
  const Tiny fx;
  ASSERT_EQ(fx.cfg.num_heads, 2);
  struct Case {
    const char* name;
    bool i2v;
  };
  for (const Case c : {Case{"t2v_cfg", false}, Case{"odd_grid", false}, Case{"i2v", true},
                       Case{"tall_single_frame", false}}) {
    const DiTConfig& cfg = c.i2v ? fx.i2v_cfg : fx.cfg;
    auto getter = [&fx, i2v = c.i2v](const std::string& n) { return fx.get(n, i2v); };
    const CaseRun r = load_case(fx, c.name);
    const DiTWeights w = load_dit_weights(cfg, getter);
    const Tensor ref = dit_forward(cfg, w, r.x, r.t, r.ctx, r.lens);

    // Both attention kernels: cuDNN everywhere, the engine's own on sm_90 (the default there).
    std::vector<DiTGpu::Attention> kinds = {DiTGpu::Attention::Cudnn};
    if (cuda::OwnAttention::supported()) kinds.push_back(DiTGpu::Attention::Own);
    for (const DiTGpu::Attention kind : kinds) {
      const std::string what = cat(c.name, kind == DiTGpu::Attention::Own ? " (own attention)" : " (cuDNN attention)");
      DiTGpu::Options opt;
      opt.attention = kind;
      DiTGpu gpu = DiTGpu::create(cfg, {DiTWeightSource::from(getter)}, r.shape, opt);
      EXPECT_EQ(gpu.attention(), kind);
      std::vector<float> out = poisoned(static_cast<size_t>(ref.numel()));
      for (int rep = 0; rep < 3; ++rep) {  // eager, capture + replay, replay
        std::vector<float> o = poisoned(out.size());
        gpu.forward(0, r.shape, host_inputs(r), o.data(), nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        if (rep == 0) out = o;
        else EXPECT_TRUE(bit_equal(o, out)) << what << ": forward " << rep << " differs from the first";
      }
      EXPECT_EQ(gpu.graphs_captured(), 1u);
      expect_close(compare(out.data(), ref.f32(), out.size()), what + " velocity vs CPU fp32");
      // the fixture's own diffusers fp32 output, for scale (the CPU forward matches it to ~1e-6)
      const Tensor oracle = fx.cases.get(std::string(c.name) + ".out").to_f32();
      expect_close(compare(out.data(), oracle.f32(), out.size()), what + " velocity vs diffusers fp32");
    }
  }
}

// The same forward from device-resident inputs with a bf16 context (the rounding the engine applies
// to an f32 context anyway), into device memory, on a user stream: bit-identical to host f32 inputs.
TEST(GpuDit, TinyDeviceAndBf16InputsAgree) {
  REQUIRE_GPU();
  const Tiny fx;
  auto getter = [&fx](const std::string& n) { return fx.get(n, false); };
  const CaseRun r = load_case(fx, "t2v_cfg");
  DiTGpu gpu = DiTGpu::create(fx.cfg, {DiTWeightSource::from(getter)}, r.shape);
  const size_t n_out = static_cast<size_t>(r.x.dim(0) * fx.cfg.out_dim * r.x.dim(2) * r.x.dim(3) * r.x.dim(4));
  std::vector<float> want = poisoned(n_out);
  gpu.forward(0, r.shape, host_inputs(r), want.data(), nullptr);

  std::vector<uint16_t> ctx_bf16(static_cast<size_t>(r.ctx.numel()));
  for (size_t i = 0; i < ctx_bf16.size(); ++i) ctx_bf16[i] = f32_to_bf16(r.ctx.f32()[i]);
  float *dx = nullptr, *dout = nullptr;
  void* dctx = nullptr;
  CUDA_CHECK(cudaMalloc(&dx, r.x.nbytes()));
  CUDA_CHECK(cudaMalloc(&dctx, ctx_bf16.size() * 2));
  CUDA_CHECK(cudaMalloc(&dout, n_out * 4));
  CUDA_CHECK(cudaMemcpy(dx, r.x.data(), r.x.nbytes(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dctx, ctx_bf16.data(), ctx_bf16.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dout, 0xFF, n_out * 4));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DiTInputs in = host_inputs(r);
  in.x = dx;
  in.context = dctx;
  in.context_dtype = DType::BF16;
  for (int rep = 0; rep < 2; ++rep) {  // the shape was warmed above: capture + replay, then replay
    std::vector<float> got = poisoned(n_out);
    gpu.forward(0, r.shape, in, dout, st);
    CUDA_CHECK(cudaMemcpyAsync(got.data(), dout, n_out * 4, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    EXPECT_TRUE(bit_equal(got, want)) << "device/bf16 inputs, forward " << rep;
  }
  CUDA_CHECK(cudaStreamDestroy(st));
  cudaFree(dx);
  cudaFree(dctx);
  cudaFree(dout);
}

// Two experts in one object (one weight allocation each, one shared arena, one graph per expert and
// shape): expert 1 equals a one-expert object holding the same weights, bit for bit, and differs
// from expert 0.
TEST(GpuDit, TwoExpertsShareTheArena) {
  REQUIRE_GPU();
  const Tiny fx;
  const CaseRun r = load_case(fx, "odd_grid");
  DiTGpu both = DiTGpu::create(fx.cfg, {DiTWeightSource::random_weights(5), DiTWeightSource::random_weights(6)},
                               r.shape);
  DiTGpu only = DiTGpu::create(fx.cfg, {DiTWeightSource::random_weights(6)}, r.shape);
  EXPECT_EQ(both.experts(), 2);
  EXPECT_EQ(both.memory_plan().arena_bytes, only.memory_plan().arena_bytes);
  const size_t n = static_cast<size_t>(fx.cfg.out_dim * r.x.dim(2) * r.x.dim(3) * r.x.dim(4));
  std::vector<float> o0, o1, want = poisoned(n);
  only.forward(0, r.shape, host_inputs(r), want.data(), nullptr);
  for (int rep = 0; rep < 3; ++rep) {  // alternate experts: eager, capture, replay for each
    o0 = poisoned(n);
    o1 = poisoned(n);
    both.forward(0, r.shape, host_inputs(r), o0.data(), nullptr);
    both.forward(1, r.shape, host_inputs(r), o1.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(bit_equal(o1, want)) << "expert 1, forward " << rep;
    EXPECT_FALSE(bit_equal(o0, want)) << "expert 0 gave expert 1's output";
    EXPECT_EQ(compare(o0.data(), want.data(), n).nonfinite, 0u);
  }
  EXPECT_EQ(both.graphs_captured(), 2u);
}

// ---------------------------------------------------------------------------------------------
// (b, c, d) full-width 14B config, 2 blocks, random weights on the GPU

constexpr uint64_t kWeightSeed = 2024;

DiTConfig full_width_cfg() {
  DiTConfig c = dit_preset("t2v-A14B");
  c.num_layers = 2;
  return c;
}

using FullInputs = gpu_test::DiTHostInputs;
// Text lengths 97 (and 23) of 128 rows.
FullInputs full_inputs(const DiTConfig& c, DiTShape s, uint64_t seed, std::vector<float> t) {
  return gpu_test::dit_host_inputs(c, s, seed, std::move(t),
                                   s.batch == 2 ? std::vector<int64_t>{97, 23} : std::vector<int64_t>{97});
}

std::unique_ptr<DiTGpu>& full_width_holder() {
  static std::unique_ptr<DiTGpu> g;
  return g;
}
// Frees the shared model before the CUDA runtime tears down at exit.
class FreeFullWidth : public ::testing::Environment {
 public:
  void TearDown() override { full_width_holder().reset(); }
};
[[maybe_unused]] ::testing::Environment* const kFreeFullWidth = ::testing::AddGlobalTestEnvironment(new FreeFullWidth);

DiTGpu& full_width_gpu() {
  std::unique_ptr<DiTGpu>& g = full_width_holder();
  if (!g) {
    DiTGpu::Options opt;
    opt.verbose = true;
    g = std::make_unique<DiTGpu>(
        DiTGpu::create(full_width_cfg(), {DiTWeightSource::random_weights(kWeightSeed)}, {2, 3, 60, 104}, opt));
  }
  return *g;
}

TEST(GpuDit, RandomWeightsAreTheCpuRngStream) {
  REQUIRE_GPU();
  DiTGpu& gpu = full_width_gpu();
  const DiTConfig c = full_width_cfg();
  struct Probe {
    const char* name;
    float scale, offset;
    bool bf16;
  };
  const float s_lin = static_cast<float>(1.0 / std::sqrt(3.0 * c.dim));
  for (const Probe p : {Probe{"blocks.1.ffn.0.weight", s_lin, 0.0f, true},
                        Probe{"blocks.0.self_attn.v.weight", s_lin, 0.0f, true},
                        Probe{"blocks.0.cross_attn.norm_k.weight", 0.05f, 1.0f, true},
                        Probe{"time_projection.1.weight", s_lin, 0.0f, false},
                        Probe{"blocks.1.modulation", static_cast<float>(1.0 / std::sqrt(5120.0)), 0.0f, false}}) {
    const Tensor w = gpu.download_weight(0, p.name);
    const uint64_t seed = random_weight_key(kWeightSeed, p.name);
    const size_t n = std::min<size_t>(static_cast<size_t>(w.numel()), 8192);
    size_t mismatches = 0;
    double sum2 = 0;
    for (size_t i = 0; i < n; ++i) {
      float v = philox_normal(seed, i) * p.scale + p.offset;
      if (p.bf16) v = bf16_to_f32(f32_to_bf16(v));
      mismatches += std::memcmp(&v, w.f32() + i, 4) != 0;
      sum2 += static_cast<double>(w.f32()[i] - p.offset) * (w.f32()[i] - p.offset);
    }
    EXPECT_EQ(mismatches, 0u) << p.name;
    const double std_dev = std::sqrt(sum2 / n);
    EXPECT_NEAR(std_dev, p.scale, 0.05 * p.scale) << p.name;
  }
  // Different tensors draw different streams.
  EXPECT_NE(random_weight_key(kWeightSeed, "blocks.0.ffn.0.weight"),
            random_weight_key(kWeightSeed, "blocks.1.ffn.0.weight"));
}

TEST(GpuDit, FullWidth14BTwoBlocksMatchesCpu) {
  REQUIRE_GPU();
  DiTGpu& gpu = full_width_gpu();
  const DiTConfig c = full_width_cfg();
  // The 480p token grid (30 x 52 patches) at 2 latent frames: the CPU fp32 reference of 2 x 3120 tokens
  // at full width takes about half a minute on the device's 16 cores.
  const FullInputs f = full_inputs(c, {2, 2, 60, 104}, 77, {937.0f, 412.0f});
  std::vector<float> out = poisoned(f.out_numel(c));
  gpu.forward(0, f.shape, f.in(), out.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  const auto t0 = std::chrono::steady_clock::now();
  const DiTWeights w = load_dit_weights(c, [&](const std::string& n) { return gpu.download_weight(0, n); });
  Tensor x = Tensor::empty(DType::F32, {f.shape.batch, c.in_dim, f.shape.frames, f.shape.height, f.shape.width});
  std::memcpy(x.data(), f.x.data(), x.nbytes());
  Tensor t = Tensor::empty(DType::F32, {f.shape.batch});
  std::memcpy(t.data(), f.t.data(), t.nbytes());
  Tensor ctx = Tensor::empty(DType::F32, {f.shape.batch, f.ctx_rows, c.text_dim});
  std::memcpy(ctx.data(), f.ctx.data(), ctx.nbytes());
  const Tensor ref = dit_forward(c, w, x, t, ctx, f.lens);
  const double cpu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  CPU fp32 reference: %.1f s\n", cpu_s);
  expect_close(compare(out.data(), ref.f32(), out.size()), "14B width, 2 blocks, 2x2x30x52 grid");
}

TEST(GpuDit, DeterministicAndGraphReplayEqualsEager) {
  REQUIRE_GPU();
  DiTGpu& gpu = full_width_gpu();
  const DiTConfig c = full_width_cfg();
  const DiTShape s{2, 3, 60, 104};  // 3 x 30 x 52 patches: the 480p grid at 3 latent frames
  const size_t graphs_before = gpu.graphs_captured();
  const FullInputs a = full_inputs(c, s, 101, {999.0f, 999.0f});
  std::vector<float> eager = poisoned(a.out_numel(c)), g1 = poisoned(eager.size()), g2 = poisoned(eager.size());
  gpu.set_use_graphs(false);
  gpu.forward(0, s, a.in(), eager.data(), nullptr);  // eager (also the warm-up of this shape)
  gpu.set_use_graphs(true);
  gpu.forward(0, s, a.in(), g1.data(), nullptr);     // capture + replay
  gpu.forward(0, s, a.in(), g2.data(), nullptr);     // replay
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(gpu.graphs_captured(), graphs_before + 1);
  EXPECT_EQ(compare(eager.data(), eager.data(), eager.size()).nonfinite, 0u) << "unwritten outputs";
  EXPECT_TRUE(bit_equal(g1, eager)) << "graph replay differs from the eager forward";
  EXPECT_TRUE(bit_equal(g2, g1)) << "two replays differ";

  // New inputs through the existing graph equal a fresh eager forward on them (nothing stale).
  const FullInputs b = full_inputs(c, s, 202, {500.0f, 500.0f});
  std::vector<float> eb = poisoned(eager.size()), gb = poisoned(eager.size());
  gpu.set_use_graphs(false);
  gpu.forward(0, s, b.in(), eb.data(), nullptr);
  gpu.set_use_graphs(true);
  gpu.forward(0, s, b.in(), gb.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(bit_equal(gb, eb)) << "replay with new inputs differs from eager";
  EXPECT_FALSE(bit_equal(gb, eager)) << "new inputs gave the old output";

  // Batch independence: sample 0 alone (a smaller shape in the same arena) matches its batch-2 row.
  FullInputs one = full_inputs(c, {1, 3, 60, 104}, 101, {999.0f});
  one.x.assign(a.x.begin(), a.x.begin() + static_cast<ptrdiff_t>(a.x.size() / 2));
  one.ctx.assign(a.ctx.begin(), a.ctx.begin() + static_cast<ptrdiff_t>(a.ctx.size() / 2));
  std::vector<float> o1 = poisoned(one.out_numel(c));
  gpu.forward(0, one.shape, one.in(), o1.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const Err e = compare(o1.data(), eager.data(), o1.size());
  std::printf("  batch-1 vs row 0 of batch 2: rel L2 %.3e (bit-identical: %s)\n", e.rel_l2,
              std::memcmp(o1.data(), eager.data(), o1.size() * 4) == 0 ? "yes" : "no");
  EXPECT_EQ(e.nonfinite, 0u);
  EXPECT_LE(e.rel_l2, 1e-2);

  // Informational: replay time of this 2-block forward.
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  float* dout = nullptr;
  CUDA_CHECK(cudaMalloc(&dout, eager.size() * 4));
  gpu.forward(0, s, a.in(), dout, nullptr);
  CUDA_CHECK(cudaEventRecord(e0, nullptr));
  constexpr int kReps = 5;
  for (int i = 0; i < kReps; ++i) gpu.forward(0, s, a.in(), dout, nullptr);
  CUDA_CHECK(cudaEventRecord(e1, nullptr));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  std::printf("  2-block forward, batch 2 x %lld tokens (incl. input/output copies): %.2f ms\n",
              static_cast<long long>(3 * 30 * 52), ms / kReps);
  cudaFree(dout);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// DiTShape::one_latent (the samplers' CFG batch): the forward reads only the first latent and runs the
// first block's norm1, q|k|v, self-attention and o projection once, copied to the second sample.
TEST(GpuDit, OneLatentRunsTheFirstSelfAttentionOnce) {
  REQUIRE_GPU();
  DiTGpu& gpu = full_width_gpu();
  const DiTConfig c = full_width_cfg();
  const DiTShape s{2, 3, 60, 104};
  DiTShape s1 = s;
  s1.one_latent = true;
  FullInputs a = full_inputs(c, s, 303, {850.0f, 850.0f});
  const auto half = static_cast<ptrdiff_t>(a.x.size() / 2);
  std::copy(a.x.begin(), a.x.begin() + half, a.x.begin() + half);  // one latent, two prompts
  std::vector<float> ref = poisoned(a.out_numel(c));
  gpu.forward(0, s, a.in(), ref.data(), nullptr);  // every sample computed in full
  // The second latent must not be read: NaN there.
  FullInputs p = a;
  std::fill(p.x.begin() + half, p.x.end(), std::nanf(""));
  const size_t graphs_before = gpu.graphs_captured();
  std::vector<float> eager = poisoned(ref.size()), g1 = poisoned(ref.size()), g2 = poisoned(ref.size());
  gpu.set_use_graphs(false);
  gpu.forward(0, s1, p.in(), eager.data(), nullptr);
  gpu.set_use_graphs(true);
  gpu.forward(0, s1, p.in(), g1.data(), nullptr);  // capture + replay
  gpu.forward(0, s1, p.in(), g2.data(), nullptr);  // replay
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(gpu.graphs_captured(), graphs_before + 1) << "one_latent has a graph of its own";
  EXPECT_TRUE(bit_equal(g1, eager)) << "graph replay differs from the eager forward";
  EXPECT_TRUE(bit_equal(g2, g1)) << "two replays differ";
  const Err e = compare(eager.data(), ref.data(), ref.size());
  std::printf("  one latent (shared first self-attention) vs both samples in full: rel L2 %.3e, max abs %.3e "
              "(bit-identical: %s)\n",
              e.rel_l2, e.max_abs, bit_equal(eager, ref) ? "yes" : "no");
  EXPECT_EQ(e.nonfinite, 0u) << "the second latent was read, or outputs were not written";
  EXPECT_GT(e.max_ref, 0.0);
  // Only GEMM kernels picked for the smaller M can differ (fp32 accumulation order); the unshared
  // batch-1 forward vs row 0 of batch 2 measured 6e-5 on the H100.
  EXPECT_LE(e.rel_l2, 1e-3);
  // The two prompts still give two different outputs.
  EXPECT_NE(std::memcmp(eager.data(), eager.data() + eager.size() / 2, eager.size() / 2 * sizeof(float)), 0);

  // One latent means one timestep: a second one is refused before any work.
  FullInputs bad = p;
  bad.t = {850.0f, 400.0f};
  std::string msg;
  try {
    gpu.forward(0, s1, bad.in(), eager.data(), nullptr);
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("needs one timestep"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// (e) memory plan

TEST(GpuDit, MemoryPlanLayoutAnd720pFits80GB) {
  REQUIRE_GPU();
  const DiTConfig c = dit_preset("t2v-A14B");
  const cuda::MemoryPlan p = DiTGpu::plan(c, {2, 21, 90, 160}, 2);
  std::printf("%s", p.str().c_str());
  // Non-view buffers are disjoint, ordered, 256-byte aligned; views lie inside "big".
  const auto& big = p.get("big");
  size_t end = 0;
  for (const auto& b : p.buffers) {
    EXPECT_EQ(b.offset % 16, 0u) << b.name;
    if (b.view) {
      EXPECT_GE(b.offset, big.offset) << b.name;
      EXPECT_LE(b.offset + b.bytes, big.offset + big.bytes) << b.name;
    } else {
      EXPECT_EQ(b.offset % 256, 0u) << b.name;
      EXPECT_GE(b.offset, end) << b.name;
      end = b.offset + b.bytes;
    }
  }
  EXPECT_LE(end, p.arena_bytes);
  // One GPU: q and k are normed in place in the fused qkv rows, so big holds those rows and nothing else
  // (at this width they are wider than the FFN hidden) and has no q or k of its own.
  const size_t rows = size_t{2} * 21 * 45 * 80;
  EXPECT_EQ(p.get("big.qkv").offset, big.offset);
  EXPECT_EQ(big.bytes, rows * 3 * c.dim * 2);
  EXPECT_THROW((void)p.get("big.q"), Error);
  EXPECT_THROW((void)p.get("big.k"), Error);
  EXPECT_LT(p.arena_bytes, size_t{21} << 29) << "720p activations within 10.5 GiB";
  // Weights: bf16 everywhere but the fp32 tensors (time MLP/projection, modulation, norm3, head).
  const int64_t D = c.dim, OP = c.out_dim * 4;
  const int64_t f32_params = D * c.freq_dim + D + D * D + D + 6 * D * D + 6 * D + 2 * D + OP * D + OP +
                             c.num_layers * (6 * D + 2 * D);
  const int64_t expect = 2 * dit_param_count(c) + 2 * f32_params;
  EXPECT_GE(static_cast<int64_t>(p.weight_bytes), expect);
  EXPECT_LE(static_cast<int64_t>(p.weight_bytes), expect + 256 * (30 * c.num_layers + 30));
  // Both experts and the 720p/81-frame activations fit an 80 GB H100 (issue 4, item 4).
  EXPECT_LT(p.total_bytes(), size_t{79} << 30);
}

TEST(GpuDit, TooLargeRequestThrowsBeforeAllocating) {
  REQUIRE_GPU();
  CUDA_CHECK(cudaFree(nullptr));  // the context exists before we measure
  size_t free0 = 0, free1 = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  const DiTConfig c = dit_preset("t2v-A14B");
  std::string msg;
  try {
    (void)DiTGpu::create(c, {DiTWeightSource::random_weights(1), DiTWeightSource::random_weights(2)},
                         {2, 401, 90, 160});  // 1601 frames at 720p
  } catch (const Error& e) {
    msg = e.what();
  }
  CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  std::printf("  error: %s\n", msg.c_str());
  EXPECT_NE(msg.find("does not fit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("latent frames fit"), std::string::npos) << msg;
  EXPECT_EQ(free0, free1) << "memory was allocated before the error";
  // The frames it names do fit the same free memory, and one more latent frame would not.
  const size_t at = msg.find("at most ");
  ASSERT_NE(at, std::string::npos);
  const int64_t T = std::stoll(msg.substr(at + 8));
  EXPECT_GE(T, 1);
  EXPECT_LE(DiTGpu::plan(c, {2, T, 90, 160}, 2).total_bytes(), free0);
  EXPECT_GT(DiTGpu::plan(c, {2, T + 1, 90, 160}, 2).total_bytes(), free0);
}

}  // namespace
