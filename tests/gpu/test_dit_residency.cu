// The GPU DiT's weight residencies (WeightResidency, dit_gpu.h; issue 27's low-memory mode): every mode
// runs the same kernels on the same bytes, so
// (a) outputs are bit-identical to the resident DiT's for expert sequences that swap and stream (eager,
//     CUDA graphs, warm_up's captures), bf16 and FP8 block GEMMs, random weights with a LoRA merge;
// (b) a checkpoint streamed from its files (with a LoRA merge) fills the host copies bit for bit as it
//     fills a resident allocation, whatever the fill windows;
// (c) every weight downloads the same from each residency;
// (d) the plan counts the residency's device and host bytes, and the A14B 720p CFG step streams within
//     24 GiB (host arithmetic);
// (e) at the real width (t2v-A14B, 3 blocks) block streaming is bit-identical to resident weights.
// Block streaming from disk (a spill file under $TMPDIR, no CUDA graphs) is one of the modes throughout.
// Skips without a device (FP8 cases without FP8 GEMMs).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cpu/test_util.h"
#include "ckpt/layout.h"
#include "gpu_test_model.h"
#include "kernels/check.h"
#include "kernels/gemm.h"
#include "lora/lora.h"
#include "lora/lora_gpu.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/weights.h"
#include "models/weight_spec.h"
#include "testing/make_checkpoint.h"
#include "testing/make_lora.h"

using namespace wan;
using cuda::DiTGpu;
using cuda::DiTShape;
using cuda::DiTWeightSource;
using cuda::WeightResidency;

namespace {

const DiTShape kShape{2, 2, 16, 16};  // 2 samples x 128 tokens

DiTConfig five_blocks() {
  DiTConfig c = dit_preset("tiny");
  c.num_layers = 5;  // rings of 2 and 3 slots wrap more than once
  return c;
}

std::vector<WeightResidency> all_modes() {
  return {WeightResidency::resident(), WeightResidency::swap(), WeightResidency::stream(2),
          WeightResidency::stream(3), WeightResidency::stream_disk(3)};
}

DiTGpu make(const DiTConfig& cfg, std::vector<DiTWeightSource> src, WeightResidency r,
            DiTGpu::Gemm gemm = DiTGpu::Gemm::Bf16, const DiTShape& shape = kShape) {
  DiTGpu::Options opt;
  opt.gemm = gemm;
  opt.residency = r;
  return DiTGpu::create(cfg, std::move(src), shape, opt);
}

std::vector<float> run(DiTGpu& d, int expert, const gpu_test::DiTHostInputs& in, const DiTConfig& c) {
  std::vector<float> out = gpu_test::poisoned(in.out_numel(c));
  d.forward(expert, in.shape, in.in(), out.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return out;
}

std::shared_ptr<const LoraSet> tiny_lora(const DiTConfig& cfg, const test::TempDir& t) {
  return gpu_test::tiny_kohya_lora(cfg, t.str());
}

// The outputs of a fixed sequence of forwards that swaps experts back and forth: eager first, then
// graphs (captured on the second forward of a shape, or by warm_up for expert 1).
std::vector<std::vector<float>> sequence(DiTGpu& d, const DiTConfig& c, const gpu_test::DiTHostInputs& in) {
  std::vector<std::vector<float>> outs;
  d.set_use_graphs(false);
  outs.push_back(run(d, 0, in, c));
  outs.push_back(run(d, 1, in, c));
  d.set_use_graphs(true);
  d.warm_up({{1, kShape}});
  for (int e : {0, 0, 1, 0, 1, 1, 0}) outs.push_back(run(d, e, in, c));
  return outs;
}

void expect_same_weights(const DiTGpu& a, const DiTGpu& b, const DiTConfig& c, int expert) {
  for (const WeightSpec& s : dit_weight_table(c)) {
    const Tensor x = a.download_weight(expert, s.name), y = b.download_weight(expert, s.name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << s.name;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << s.name;
  }
}

}  // namespace

TEST(GpuDitResidency, EveryModeGivesTheResidentOutputsBitForBit) {
  REQUIRE_GPU();
  const DiTConfig cfg = five_blocks();
  test::TempDir t{"dit_residency"};
  const auto set = tiny_lora(cfg, t);
  const auto in = gpu_test::dit_host_inputs(cfg, kShape, 3, {500.0f, 500.0f}, {128, 64});
  std::vector<DiTGpu::Gemm> gemms{DiTGpu::Gemm::Bf16};
  if (cuda::fp8_supported(0)) gemms.push_back(DiTGpu::Gemm::Fp8);
  for (DiTGpu::Gemm gemm : gemms) {
    SCOPED_TRACE(gemm == DiTGpu::Gemm::Fp8 ? "fp8" : "bf16");
    auto sources = [&] {
      std::vector<DiTWeightSource> s{DiTWeightSource::random_weights(9), DiTWeightSource::random_weights(10)};
      s[1].merge = cuda::lora_merge_hooks(set);  // the second expert merges a LoRA as it is drawn
      return s;
    };
    DiTGpu ref = make(cfg, sources(), WeightResidency::resident(), gemm);
    const auto want = sequence(ref, cfg, in);
    ASSERT_FALSE(gpu_test::bit_equal(want[0], want[1]));  // the experts differ
    for (const WeightResidency& r : all_modes()) {
      if (r == WeightResidency::resident()) continue;
      SCOPED_TRACE(r.str());
      DiTGpu d = make(cfg, sources(), r, gemm);
      EXPECT_EQ(d.memory_plan().residency, r);
      const auto got = sequence(d, cfg, in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(gpu_test::bit_equal(got[i], want[i])) << "forward " << i;
      for (int e : {0, 1}) expect_same_weights(d, ref, cfg, e);
      EXPECT_THROW(d.weight_allocation(0), Error);  // only resident weights have one
    }
  }
}

TEST(GpuDitResidency, StreamedCheckpointFillsTheHostCopiesAsTheDevice) {
  REQUIRE_GPU();
  test::TempDir t{"dit_residency_ckpt"};
  gen::MakeCheckpointOptions o;
  o.config = "tiny";
  o.layout = Layout::Official;
  o.dtype = DType::BF16;
  o.dit_only = true;
  o.seed = 5;
  o.out = t / "ck";
  gen::make_checkpoint(o);
  const CheckpointInfo info = detect_checkpoint(o.out + "/high_noise_model");
  std::unique_ptr<WeightStore> store = open_weights(info, info.components.at(0).role);
  WeightStore* ws = store.get();
  const auto set = tiny_lora(info.dit, t);
  const auto in = gpu_test::dit_host_inputs(info.dit, kShape, 4, {700.0f, 700.0f}, {128, 100});
  auto source = [&](bool lora) {
    DiTWeightSource s = DiTWeightSource::from([ws](const std::string& n) { return ws->get_f32(n); });
    s.span = [ws](const std::string& n) { return ws->raw_span(n); };
    if (lora) s.merge = cuda::lora_merge_hooks(set);
    return s;
  };
  for (bool lora : {false, true}) {
    SCOPED_TRACE(lora ? "LoRA merged" : "plain");
    DiTGpu ref = make(info.dit, {source(lora)}, WeightResidency::resident());
    const std::vector<float> want = run(ref, 0, in, info.dit);
    for (const WeightResidency& r :
         {WeightResidency::swap(), WeightResidency::stream(2), WeightResidency::stream_disk(2)}) {
      SCOPED_TRACE(r.str());
      DiTGpu d = make(info.dit, {source(lora)}, r);
      expect_same_weights(d, ref, info.dit, 0);
      EXPECT_TRUE(gpu_test::bit_equal(run(d, 0, in, info.dit), want));
      EXPECT_TRUE(gpu_test::bit_equal(run(d, 0, in, info.dit), want));  // graph capture, then replay
      EXPECT_TRUE(gpu_test::bit_equal(run(d, 0, in, info.dit), want));
    }
  }
}

TEST(GpuDitResidency, PlanCountsDeviceAndHostBytes) {
  const DiTConfig cfg = five_blocks();
  const DiTGpu::Gemm bf = DiTGpu::Gemm::Bf16;
  const cuda::MemoryPlan res = DiTGpu::plan(cfg, kShape, 2, 0, {}, bf);
  const cuda::MemoryPlan swap = DiTGpu::plan(cfg, kShape, 2, 0, {}, bf, WeightResidency::swap());
  const cuda::MemoryPlan s3 = DiTGpu::plan(cfg, kShape, 2, 0, {}, bf, WeightResidency::stream(3));
  EXPECT_EQ(res.device_weight_bytes(), 2 * res.weight_bytes);
  EXPECT_EQ(res.host_weight_bytes(), 0u);
  EXPECT_EQ(swap.device_weight_bytes(), swap.weight_bytes);
  EXPECT_EQ(swap.host_weight_bytes(), 2 * swap.weight_bytes);
  EXPECT_EQ(s3.device_weight_bytes(), 2 * s3.nonblock_bytes + 3 * s3.block_bytes);
  EXPECT_EQ(s3.arena_bytes, res.arena_bytes);  // the activations do not change
  EXPECT_GT(s3.block_bytes, 0u);
  EXPECT_LT(s3.nonblock_bytes + 5 * s3.block_bytes, s3.weight_bytes + 5 * 256);
  EXPECT_GE(s3.nonblock_bytes + 5 * s3.block_bytes, s3.weight_bytes - 5 * 256);
  EXPECT_THROW(DiTGpu::plan(cfg, kShape, 2, 0, {}, bf, WeightResidency::stream(1)), Error);
  // From disk: the device holds what it holds streaming from pinned memory; the host pins two staging
  // blocks, and the spill file takes every expert's blocks.
  const cuda::MemoryPlan d3 = DiTGpu::plan(cfg, kShape, 2, 0, {}, bf, WeightResidency::stream_disk(3));
  EXPECT_EQ(d3.device_weight_bytes(), s3.device_weight_bytes());
  EXPECT_EQ(d3.host_weight_bytes(), 2 * d3.block_bytes);
  EXPECT_EQ(d3.disk_bytes(), 2 * (d3.weight_bytes - d3.nonblock_bytes));
  EXPECT_EQ(s3.disk_bytes(), 0u);
  // The A14B 720p CFG step (81 frames: 21 x 90 x 160 latents) in bf16: resident experts need about
  // 68 GiB; block streaming fits 24 GiB.
  const DiTConfig a14b = dit_preset("t2v-A14B");
  const DiTShape p720{2, 21, 90, 160};
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const cuda::MemoryPlan full = DiTGpu::plan(a14b, p720, 2, 0, {}, bf);
  const cuda::MemoryPlan low = DiTGpu::plan(a14b, p720, 2, 0, {}, bf, WeightResidency::stream(3));
  std::printf("  A14B 720p: resident %.2f GiB, block streaming (3 slots) %.2f GiB, block %.0f MiB\n",
              full.total_bytes() / gib, low.total_bytes() / gib, low.block_bytes / gib * 1024);
  EXPECT_GT(full.total_bytes(), 60 * gib);
  EXPECT_LT(low.total_bytes(), 22 * gib);
}

TEST(GpuDitResidency, RealWidthStreamingIsBitIdentical) {
  REQUIRE_GPU();
  DiTConfig c = dit_preset("t2v-A14B");
  c.num_layers = 3;
  const DiTShape shape{2, 2, 30, 52};
  const auto in = gpu_test::dit_host_inputs(c, shape, 77, {937.0f, 937.0f}, {128, 40});
  std::vector<float> want;
  for (const WeightResidency& r :
       {WeightResidency::resident(), WeightResidency::stream(2), WeightResidency::stream_disk(3)}) {
    SCOPED_TRACE(r.str());
    DiTGpu d = make(c, {DiTWeightSource::random_weights(3)}, r, DiTGpu::Gemm::Bf16, shape);
    std::vector<float> first = run(d, 0, in, c), replay;
    for (int i = 0; i < 3; ++i) replay = run(d, 0, in, c);
    EXPECT_TRUE(gpu_test::bit_equal(replay, first));
    if (want.empty()) want = first;
    else EXPECT_TRUE(gpu_test::bit_equal(first, want));
  }
}

// WAN_SPILL_DROP_CACHE=1 (the disk measurements' switch: every forward reads the spill file from the disk,
// not the page cache) changes no byte.
TEST(GpuDitResidency, SpillReadFromTheDiskGivesTheSameOutputs) {
  REQUIRE_GPU();
  const DiTConfig cfg = five_blocks();
  const auto in = gpu_test::dit_host_inputs(cfg, kShape, 5, {300.0f, 300.0f}, {128, 64});
  auto sources = [] { return std::vector<DiTWeightSource>{DiTWeightSource::random_weights(4)}; };
  DiTGpu ref = make(cfg, sources(), WeightResidency::resident());
  const std::vector<float> want = run(ref, 0, in, cfg);
  setenv("WAN_SPILL_DROP_CACHE", "1", 1);
  DiTGpu d = make(cfg, sources(), WeightResidency::stream_disk(3));
  unsetenv("WAN_SPILL_DROP_CACHE");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(gpu_test::bit_equal(run(d, 0, in, cfg), want)) << "forward " << i;
}
