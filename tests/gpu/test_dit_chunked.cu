// The GPU DiT with chunked rows (WeightResidency::chunks; dit_gpu_chunked.cpp, issue 27's activation
// strategy): each sample's rows run a block's norms, q, attentions, projections and FFN one chunk at a time
// against every row's keys and values. Checks:
// (a) on the tiny model (5 blocks, 2 samples of 128 tokens), chunks of 32 rows (4 per sample) and of 48
//     (a remainder chunk of 32), with every weight residency, bf16 and FP8 block GEMMs, with and without
//     first-frame timesteps (the chunks' modulation rows), give the whole-row outputs to within bf16
//     rounding (cuBLASLt may pick other kernels for the chunks' row counts; at this size it picks the same
//     ones, and the outputs are bit-identical), eager and in CUDA graphs;
// (b) at the real width (t2v-A14B, 3 blocks) the same;
// (c) the plan: a chunked A14B 720p CFG step needs about 4 GiB fewer activations (host arithmetic).
// Skips without a device (FP8 cases without FP8 GEMMs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "gpu_test_model.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "models/dit/dit_gpu.h"

using namespace wan;
using cuda::DiTGpu;
using cuda::DiTShape;
using cuda::DiTWeightSource;
using cuda::WeightResidency;

namespace {

DiTGpu make(const DiTConfig& cfg, WeightResidency r, DiTGpu::Gemm gemm, const DiTShape& shape) {
  DiTGpu::Options opt;
  opt.gemm = gemm;
  opt.residency = r;
  return DiTGpu::create(cfg, {DiTWeightSource::random_weights(9), DiTWeightSource::random_weights(10)}, shape, opt);
}

std::vector<float> run(DiTGpu& d, int expert, const gpu_test::DiTHostInputs& in, const DiTConfig& c) {
  std::vector<float> out = gpu_test::poisoned(in.out_numel(c));
  d.forward(expert, in.shape, in.in(), out.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Both experts' outputs, eager, then in a CUDA graph (captured, then replayed): the graph's equal the
// eager ones bit for bit; each is within `tol` of the whole-row DiT's.
void expect_close(DiTGpu& d, const std::vector<std::vector<float>>& want, const gpu_test::DiTHostInputs& in,
                  const DiTConfig& c, double tol) {
  for (int e : {0, 1}) {
    d.set_use_graphs(false);
    const std::vector<float> eager = run(d, e, in, c);
    const double err = rel_l2(eager, want[static_cast<size_t>(e)]);
    std::printf("    expert %d: rel L2 vs whole rows %.2e\n", e, err);
    EXPECT_LE(err, tol) << "expert " << e;
    d.set_use_graphs(true);
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(gpu_test::bit_equal(run(d, e, in, c), eager)) << "graph " << i;
  }
}

}  // namespace

TEST(GpuDitChunked, ChunkedRowsGiveTheWholeRowOutputs) {
  REQUIRE_GPU();
  DiTConfig cfg = dit_preset("tiny");
  cfg.num_layers = 5;
  std::vector<DiTGpu::Gemm> gemms{DiTGpu::Gemm::Bf16};
  if (cuda::fp8_supported(0)) gemms.push_back(DiTGpu::Gemm::Fp8);
  for (bool first_frame : {false, true}) {
    DiTShape shape{2, 2, 16, 16};  // 2 samples x 128 tokens
    shape.first_frame_t = first_frame;
    gpu_test::DiTHostInputs in = gpu_test::dit_host_inputs(cfg, shape, 3, {500.0f, 700.0f}, {128, 64});
    in.t_first = {0.0f, 0.0f};
    for (DiTGpu::Gemm gemm : gemms) {
      SCOPED_TRACE(gemm == DiTGpu::Gemm::Fp8 ? "fp8" : "bf16");
      SCOPED_TRACE(first_frame ? "first-frame timesteps" : "one timestep");
      DiTGpu whole = make(cfg, WeightResidency::resident(), gemm, shape);
      whole.set_use_graphs(false);
      const std::vector<std::vector<float>> want{run(whole, 0, in, cfg), run(whole, 1, in, cfg)};
      ASSERT_GT(rel_l2(want[0], want[1]), 0.1);  // the experts differ: a tolerance below this means something
      for (int chunks : {4, 3}) {
        for (const WeightResidency& base :
             {WeightResidency::resident(), WeightResidency::swap(), WeightResidency::stream(2),
              WeightResidency::stream_disk(3)}) {
          const WeightResidency r = base.chunked(chunks);
          SCOPED_TRACE(r.str());
          std::printf("  %s, %s, %s\n", r.str().c_str(), gemm == DiTGpu::Gemm::Fp8 ? "fp8" : "bf16",
                      first_frame ? "first-frame t" : "one t");
          DiTGpu d = make(cfg, r, gemm, shape);
          EXPECT_EQ(d.memory_plan().chunk_rows, chunks == 4 ? 32 : 48);
          EXPECT_LT(d.memory_plan().arena_bytes, whole.memory_plan().arena_bytes);
          expect_close(d, want, in, cfg, gemm == DiTGpu::Gemm::Fp8 ? 3e-2 : 1e-2);
        }
      }
    }
  }
}

TEST(GpuDitChunked, RealWidthChunkedRowsMatchWholeRows) {
  REQUIRE_GPU();
  DiTConfig c = dit_preset("t2v-A14B");
  c.num_layers = 3;
  const DiTShape shape{2, 2, 30, 52};  // 2 x 780 tokens: chunks of 256 (195 rounded up to 128), the last of 12
  const auto in = gpu_test::dit_host_inputs(c, shape, 77, {937.0f, 937.0f}, {128, 40});
  DiTGpu::Options opt;
  DiTGpu whole = DiTGpu::create(c, {DiTWeightSource::random_weights(3)}, shape, opt);
  whole.set_use_graphs(false);
  const std::vector<float> want = run(whole, 0, in, c);
  for (const WeightResidency& r : {WeightResidency::resident().chunked(4), WeightResidency::stream(2).chunked(4)}) {
    SCOPED_TRACE(r.str());
    opt.residency = r;
    DiTGpu d = DiTGpu::create(c, {DiTWeightSource::random_weights(3)}, shape, opt);
    d.set_use_graphs(false);
    const std::vector<float> got = run(d, 0, in, c);
    const double err = rel_l2(got, want);
    std::printf("  A14B width, %s: rel L2 vs whole rows %.2e\n", r.str().c_str(), err);
    EXPECT_LE(err, 1e-2);
  }
}

TEST(GpuDitChunked, PlanShrinksTheActivations) {
  const DiTConfig a14b = dit_preset("t2v-A14B");
  const DiTShape p720{2, 21, 90, 160};  // the 81-frame 720p CFG step
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const DiTGpu::Gemm bf = DiTGpu::Gemm::Bf16;
  const cuda::MemoryPlan whole = DiTGpu::plan(a14b, p720, 2, 0, {}, bf, WeightResidency::stream(2));
  const cuda::MemoryPlan c4 = DiTGpu::plan(a14b, p720, 2, 0, {}, bf, WeightResidency::stream(2).chunked(4));
  const cuda::MemoryPlan c16 = DiTGpu::plan(a14b, p720, 2, 0, {}, bf, WeightResidency::stream(2).chunked(16));
  std::printf("  A14B 720p activations: whole rows %.2f GiB, 4 chunks %.2f GiB, 16 chunks %.2f GiB; totals %.2f, "
              "%.2f, %.2f GiB\n",
              whole.arena_bytes / gib, c4.arena_bytes / gib, c16.arena_bytes / gib, whole.total_bytes() / gib,
              c4.total_bytes() / gib, c16.total_bytes() / gib);
  EXPECT_EQ(c4.chunk_rows, 18944);  // 75600 / 4 = 18900, rounded up to 128
  EXPECT_EQ(c4.device_weight_bytes(), whole.device_weight_bytes());
  EXPECT_LT(c4.arena_bytes + 3 * gib, whole.arena_bytes);
  EXPECT_LT(c16.arena_bytes, c4.arena_bytes);
  EXPECT_EQ(WeightResidency::stream(2).chunked(4).str(), "block streaming (2 slots), rows in 4 chunks");
  // A split sequence or CFG-parallel rank does not chunk.
  dist::Layout two;
  two.cfg = 2;
  EXPECT_THROW(DiTGpu::plan(a14b, p720, 2, 0, two, bf, WeightResidency::resident().chunked(4)), Error);
}
