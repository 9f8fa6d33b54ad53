// The parallel DiT forward (issue 5: CFG-parallel, Ulysses, Ring, 2D; src/models/dit/seq_attention_gpu.h,
// src/runtime/dist/) against the single-GPU DiTGpu forward and the CPU fp32 reference, on every layout the
// visible GPUs allow:
//   2 GPUs: cfg 2 | Ulysses 2 | Ring 2 (Ring also with cuDNN attention: its log-sum-exp)
//   4 GPUs: cfg 2 x Ulysses 2 | cfg 2 x Ring 2 | Ulysses 2 x Ring 2 | Ulysses 4 | Ring 4
//   8 GPUs: cfg 2 x Ulysses 2 x Ring 2 | Ulysses 4 x Ring 2 | cfg 2 x Ulysses 4
// Model: random weights drawn on the GPU (the same on every device), dim 1024, 8 heads of 128, 2 blocks;
// batch 2 (cond, uncond: different timesteps and prompt lengths); latent 5 x 30 x 26 -> 975 tokens, odd,
// so every sequence split pads (to 976 tokens for 2, 4 and 8 ranks) and the last ring block is partly
// padding. TI2V image mode (per-token timesteps, DiTShape::first_frame_t): TI2V-5B widths (dim 3072,
// 24 heads, in/out 48, 2 blocks), latent 3 x 30 x 26 -> 585 tokens of which the 195 of latent frame 0
// take t_first, so the frame boundary falls inside a slice other than the first for 4 and 8 ranks
// (global token index = slice offset + row); its own timesteps per sample (the CFG split picks them).
// Checks per layout, on every rank: the whole [2, 16, 5, 30, 26] output is written (poisoned first);
// rel L2 vs the single-GPU engine <= 1e-2 (bf16 engine; measured values printed); error vs CPU fp32 at
// most twice the single-GPU engine's own error vs CPU fp32 (+1e-3); the forward is deterministic and the
// CUDA-graph replays equal the eager first forward bit for bit; every rank holds the same output bit
// for bit. The ranks are threads of this process, one per GPU, with NCCL communicators from
// ncclCommInitAll and the layout's groups split from them (dist::make_groups).
// Skips with fewer than 2 GPUs, or without NCCL in the build. The layout logic is tested without GPUs.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "models/config.h"
#include "core/error.h"
#include "kernels/attention_own.h"
#include "kernels/check.h"
#include "models/dit/dit_gpu.h"
#include "runtime/dist/parallel_layout.h"
#include "models/dit/dit_cpu.h"
#include "gpu_test_model.h"

#ifdef WAN_HAVE_NCCL
#include <nccl.h>

#include "pipeline/parallel_groups.h"
#endif

using namespace wan;
using cuda::DiTGpu;
using cuda::DiTShape;
using cuda::DiTWeightSource;
using PL = dist::Layout;  // (wan::Layout is the checkpoint layout)

namespace {

// ---- layouts (host only) ----

TEST(DistLayout, RankCoordinates) {
  const PL l{2, 2, 2};
  // rank = (cfg·R + ring)·U + ulysses
  const dist::RankCoords c5 = dist::coords(l, 5);  // 5 = (1·2 + 0)·2 + 1
  EXPECT_EQ(c5.cfg, 1);
  EXPECT_EQ(c5.ring, 0);
  EXPECT_EQ(c5.ulysses, 1);
  EXPECT_EQ(c5.seq, 1);
  const dist::RankCoords c3 = dist::coords(l, 3);  // (0·2 + 1)·2 + 1
  EXPECT_EQ(c3.cfg, 0);
  EXPECT_EQ(c3.ring, 1);
  EXPECT_EQ(c3.ulysses, 1);
  EXPECT_EQ(c3.seq, 3);
}

TEST(DistLayout, AutomaticChoiceAndValidation) {
  EXPECT_EQ(dist::choose_layout(1, 40), (PL{1, 1, 1}));
  EXPECT_EQ(dist::choose_layout(2, 40), (PL{2, 1, 1}));
  EXPECT_EQ(dist::choose_layout(4, 40), (PL{2, 2, 1}));
  EXPECT_EQ(dist::choose_layout(8, 40), (PL{2, 4, 1}));
  EXPECT_EQ(dist::choose_layout(16, 40), (PL{2, 8, 1}));
  EXPECT_EQ(dist::choose_layout(6, 40), (PL{2, 1, 3}));   // 3 divides no head count of 40
  EXPECT_EQ(dist::choose_layout(12, 24), (PL{2, 6, 1}));  // 5B: 24 heads
  EXPECT_EQ(dist::choose_layout(2, 40, false), (PL{1, 2, 1}));
  EXPECT_EQ(dist::resolve_layout(8, 40, false, 0, 2), (PL{1, 4, 2}));
  EXPECT_EQ(dist::resolve_layout(8, 40, true, 2, 0), (PL{2, 2, 2}));
  EXPECT_EQ(dist::resolve_layout(8, 40, false, 0, 0), (PL{2, 4, 1}));
  EXPECT_THROW(dist::resolve_layout(8, 40, false, 3, 0), Error);   // 3 does not divide 8
  EXPECT_THROW(dist::resolve_layout(6, 40, false, 6, 1), Error);   // 6 does not divide 40 heads
  EXPECT_THROW(dist::resolve_layout(4, 40, true, 4, 1), Error);    // 2·4·1 != 4
  EXPECT_THROW(dist::resolve_layout(3, 40, true, 0, 0), Error);    // cfg needs an even count
  const std::vector<PL> v8 = dist::valid_layouts(8, 40);
  EXPECT_EQ(v8.size(), 7u);  // cfg 1: U 1,2,4,8; cfg 2: U 1,2,4
  for (const PL& l : v8) EXPECT_NO_THROW(dist::validate(l, 8, 40));
  EXPECT_EQ(cuda::seq_split(975, 4).padded, 976);
  EXPECT_EQ(cuda::seq_split(975, 4).per_rank, 244);
  EXPECT_EQ(cuda::seq_split(976, 8).padded, 976);
}

// ---- the parallel forward ----

constexpr uint64_t kWeightSeed = 515;
constexpr double kVsSingleBound = 1e-2;

DiTConfig model_cfg() {
  DiTConfig c = dit_preset("tiny");
  c.dim = 1024;
  c.num_heads = 8;
  c.ffn_dim = 2048;
  c.num_layers = 2;
  return c;
}

// Batch 2 on a 5 x 15 x 13 patch grid (975 tokens per sample), two timesteps, two text lengths.
gpu_test::DiTHostInputs inputs(const DiTConfig& c) {
  return gpu_test::dit_host_inputs(c, DiTShape{2, 5, 30, 26}, 901, {937.0f, 512.0f}, {97, 23});
}
using gpu_test::bit_equal;
using gpu_test::poisoned;

// TI2V image mode at TI2V-5B widths: 3 x 15 x 13 patches (585 tokens, 195 of latent frame 0).
DiTConfig ti2v_cfg() {
  DiTConfig c = dit_preset("ti2v-5B");
  c.num_layers = 2;
  return c;
}
gpu_test::DiTHostInputs ti2v_inputs(const DiTConfig& c) {
  DiTShape s{2, 3, 30, 26};
  s.first_frame_t = true;
  gpu_test::DiTHostInputs in = gpu_test::dit_host_inputs(c, s, 902, {700.0f, 650.0f}, {97, 23});
  in.t_first = {0.0f, 40.0f};
  return in;
}

// One model and its inputs with the references, computed once: the single-GPU engine (device 0) and the
// CPU fp32 forward.
struct References {
  std::vector<float> single, cpu;
  gpu_test::Err single_vs_cpu;
};
struct Case {
  const char* name;
  DiTConfig cfg;
  gpu_test::DiTHostInputs in;
  References ref;
};
Case make_case(const char* name, const DiTConfig& c, const gpu_test::DiTHostInputs& in) {
  Case k{name, c, in, {}};
  References& ref = k.ref;
  CUDA_CHECK(cudaSetDevice(0));
  DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(kWeightSeed)}, in.shape);
  ref.single = poisoned(in.out_numel(c));
  gpu.forward(0, in.shape, in.in(), ref.single.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const DiTWeights w = load_dit_weights(c, [&](const std::string& n) { return gpu.download_weight(0, n); });
  const Tensor cpu = dit_forward(c, w, in.cpu_x(c), in.cpu_t(c), in.cpu_ctx(c), in.lens);
  ref.cpu.assign(cpu.f32(), cpu.f32() + cpu.numel());
  ref.single_vs_cpu = gpu_test::error_vs(ref.single, ref.cpu);
  std::printf("  %s: single GPU vs CPU fp32: rel L2 %.3e, max abs %.3e (max |ref| %.3g)\n", name,
              ref.single_vs_cpu.rel_l2, ref.single_vs_cpu.max_abs, gpu_test::max_abs_of(ref.cpu));
  return k;
}
const Case& base_case() {
  static const Case k = make_case("8 heads", model_cfg(), inputs(model_cfg()));
  return k;
}
const Case& ti2v_case() {
  static const Case k = make_case("TI2V per-token t", ti2v_cfg(), ti2v_inputs(ti2v_cfg()));
  return k;
}

#ifdef WAN_HAVE_NCCL

// Runs fn(rank, world communicator, adopt) on one thread per GPU 0..n-1. A rank that throws aborts every
// communicator (so its peers return from NCCL instead of hanging) and the first error is rethrown.
class LocalRanks {
 public:
  using Fn = std::function<void(int rank, ncclComm_t world, const std::function<void(ncclComm_t)>& adopt)>;
  static void run(int n, const Fn& fn) {
    std::vector<ncclComm_t> world(static_cast<size_t>(n));
    std::vector<int> devs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) devs[i] = i;
    NCCL_CHECK(ncclCommInitAll(world.data(), n, devs.data()));
    std::mutex mu;
    std::vector<ncclComm_t> extra;
    std::string first_error;
    std::atomic<bool> failed{false};
    auto abort_all = [&] {
      std::lock_guard<std::mutex> lk(mu);
      for (ncclComm_t c : extra) ncclCommAbort(c);
      for (ncclComm_t c : world) ncclCommAbort(c);
      extra.clear();
      world.clear();
    };
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          CUDA_CHECK(cudaSetDevice(r));
          fn(r, world[static_cast<size_t>(r)], [&](ncclComm_t c) {
            std::lock_guard<std::mutex> lk(mu);
            extra.push_back(c);
          });
        } catch (const std::exception& e) {
          {
            std::lock_guard<std::mutex> lk(mu);
            if (first_error.empty()) first_error = cat("rank ", r, ": ", e.what());
          }
          if (!failed.exchange(true)) abort_all();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    if (!failed) {
      for (ncclComm_t c : extra) ncclCommDestroy(c);
      for (ncclComm_t c : world) ncclCommDestroy(c);
    }
    if (!first_error.empty()) WAN_THROW(first_error);
  }
};

struct RankResult {
  std::vector<float> out;
  bool deterministic = false;
  size_t graphs = 0;
};

void check_layout(const PL& l, DiTGpu::Attention attention, const Case& k = base_case()) {
  const DiTConfig& c = k.cfg;
  const References& ref = k.ref;
  const gpu_test::DiTHostInputs& in = k.in;
  const int n = l.world();
  std::vector<RankResult> res(static_cast<size_t>(n));
  LocalRanks::run(n, [&](int rank, ncclComm_t world, const std::function<void(ncclComm_t)>& adopt) {
    const dist::ParallelGroups groups = dist::make_groups(world, l, adopt);
    DiTGpu::Options opt;
    opt.device = rank;
    opt.attention = attention;
    opt.parallel = groups.view();
    DiTGpu gpu = DiTGpu::create(c, {DiTWeightSource::random_weights(kWeightSeed)}, in.shape, opt);
    EXPECT_EQ(gpu.memory_plan().parallel, (dist::Layout{l.cfg, l.ulysses, l.ring}));
    RankResult& rr = res[static_cast<size_t>(rank)];
    rr.deterministic = true;
    for (int rep = 0; rep < 3; ++rep) {  // eager (sets up every NCCL connection), capture + replay, replay
      std::vector<float> o = poisoned(in.out_numel(c));
      gpu.forward(0, in.shape, in.in(), o.data(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      if (rep == 0) rr.out = std::move(o);
      else rr.deterministic = rr.deterministic && bit_equal(o, rr.out);
    }
    rr.graphs = gpu.graphs_captured();
  });
  const std::string what =
      cat(k.name, ", ", dist::describe(l), attention == DiTGpu::Attention::Cudnn ? " (cuDNN)" : " (auto)");
  for (int r = 0; r < n; ++r) {
    const RankResult& rr = res[static_cast<size_t>(r)];
    EXPECT_TRUE(rr.deterministic) << what << ": rank " << r << " repeated / graph forwards differ from the first";
    EXPECT_EQ(rr.graphs, 1u) << what << ": rank " << r;
    if (r > 0) EXPECT_TRUE(bit_equal(rr.out, res[0].out)) << what << ": rank " << r << " output differs from rank 0";
  }
  const gpu_test::Err vs_single = gpu_test::error_vs(res[0].out, ref.single);
  const gpu_test::Err vs_cpu = gpu_test::error_vs(res[0].out, ref.cpu);
  std::printf("  %-36s vs single GPU: rel L2 %.3e max abs %.3e | vs CPU fp32: rel L2 %.3e (single GPU %.3e)\n",
              what.c_str(), vs_single.rel_l2, vs_single.max_abs, vs_cpu.rel_l2, ref.single_vs_cpu.rel_l2);
  EXPECT_EQ(vs_single.nonfinite, 0u) << what << ": unwritten or non-finite outputs";
  EXPECT_LE(vs_single.rel_l2, kVsSingleBound) << what;
  EXPECT_LE(vs_cpu.rel_l2, 2 * ref.single_vs_cpu.rel_l2 + 1e-3) << what;
}

int gpus() { return cuda::device_count(); }

#define REQUIRE_GPUS(n) \
  if (gpus() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, " << gpus() << " visible"

TEST(DistDit, TwoGpuLayoutsMatchSingleGpu) {
  REQUIRE_GPUS(2);
  for (const PL& l : {PL{2, 1, 1}, PL{1, 2, 1}, PL{1, 1, 2}}) check_layout(l, DiTGpu::Attention::Auto);
  // Ring merges with the LSE that cuDNN returns too (the own kernel is the default on sm_90).
  if (cuda::OwnAttention::supported()) check_layout(PL{1, 1, 2}, DiTGpu::Attention::Cudnn);
}

TEST(DistDit, FourGpuLayoutsMatchSingleGpu) {
  REQUIRE_GPUS(4);
  for (const PL& l : {PL{2, 2, 1}, PL{2, 1, 2}, PL{1, 2, 2}, PL{1, 4, 1}, PL{1, 1, 4}})
    check_layout(l, DiTGpu::Attention::Auto);
}

TEST(DistDit, EightGpuLayoutsMatchSingleGpu) {
  REQUIRE_GPUS(8);
  for (const PL& l : {PL{2, 2, 2}, PL{1, 4, 2}, PL{2, 4, 1}}) check_layout(l, DiTGpu::Attention::Auto);
}

// TI2V image mode (latent frame 0's tokens at t_first) split over ranks: each rank picks a token's time
// row by its global index, the CFG split by its sample. Ulysses degrees 2, 4, 8 divide the 24 heads.
TEST(DistDit, PerTokenTimestepLayoutsMatchSingleGpu) {
  REQUIRE_GPUS(2);
  std::vector<PL> layouts = {PL{2, 1, 1}, PL{1, 2, 1}, PL{1, 1, 2}};
  if (gpus() >= 4) layouts.insert(layouts.end(), {PL{2, 2, 1}, PL{1, 4, 1}, PL{1, 2, 2}, PL{1, 1, 4}});
  if (gpus() >= 8) layouts.insert(layouts.end(), {PL{1, 8, 1}, PL{2, 4, 1}, PL{1, 4, 2}});
  for (const PL& l : layouts) check_layout(l, DiTGpu::Attention::Auto, ti2v_case());
}

// A layout whose Ulysses degree does not divide the heads is refused before anything is allocated.
TEST(DistDit, BadLayoutIsOneClearError) {
  const DiTConfig c = model_cfg();
  dist::Layout d;
  d.ulysses = 3;
  try {
    (void)DiTGpu::plan(c, {2, 5, 30, 26}, 1, 0, d);
    FAIL() << "Ulysses 3 with 8 heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the 8 heads"), std::string::npos) << e.what();
  }
  d = {};
  d.cfg = 2;
  EXPECT_THROW((void)DiTGpu::plan(c, {1, 5, 30, 26}, 1, 0, d), Error);  // CFG-parallel with batch 1
}

#else
TEST(DistDit, NeedsNccl) { GTEST_SKIP() << "built without NCCL"; }
#endif  // WAN_HAVE_NCCL

}  // namespace
