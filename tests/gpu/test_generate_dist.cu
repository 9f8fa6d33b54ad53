// Multi-GPU `wan generate` (issue 5 items 1, 3, 4 at the pipeline level; pipeline/generate_parallel.h)
// against the single-GPU pipeline, on every layout the visible GPUs allow:
//   - random tiny T2V (2 heads), 80x48, 9 frames (45 tokens: every sequence split pads), 5 steps, fresh
//     seeds: 2 GPUs cfg 2 | Ulysses 2 | Ring 2; 4 GPUs cfg x U2 | cfg x R2 | U2 x R2 | Ring 4; 8 GPUs
//     cfg x U2 x R2 | cfg x R4. Latents rel L2 <= 2e-2 and video rel L2 <= 3e-2 vs the single-GPU run (the
//     bounds of the GPU-vs-CPU pipeline tests; the measured values are printed), every value finite;
//     the same layout twice is bit-identical (cfg 2 and a ring layout);
//   - the A14B width (40 heads of 128, 1 block, random weights, prompt embeddings from files): Ulysses 4
//     and cfg x U2 on 4 GPUs (Ulysses 2 on 2), latents within the same bound;
//   - a make-checkpoint tiny model in a temp dir: the sharded load (each rank streams its byte range,
//     then ncclBroadcast per range) gives every rank the single-GPU weights bit for bit (download_weight
//     of every tensor, on 2 / 4 / 8 ranks, official f32 and diffusers bf16 layouts), the ranks' streamed
//     bytes add up to the experts' stored bytes with a share on every rank; the pipeline on 2 GPUs gives
//     the single-GPU video within the bound;
//   - the CLI: `--gpus 2 --ulysses 2` in-process and the same command as 2 processes (WAN_RANK /
//     WAN_WORLD_SIZE / WAN_MASTER_ADDR / WAN_MASTER_PORT) write byte-identical latents and video, only
//     once; the timings JSON reports every rank;
//   - forced failures (dist::maybe_fail): rank 1 throwing at "step" (in-process and 2 processes), rank
//     1's process dying at "step" (lost peer), a real out-of-memory on rank 1 at "load": every process
//     exits non-zero with exactly one "error:" line, the same on every process, within 30 s, and no
//     output file exists;
//   - pausing and resuming (the pipeline's own loop on the collective denoiser): stopped after step k
//     on 2 GPUs (Ulysses 2 after 1 and 3, cfg 2 after 2, Ring 2 after 4 of 5), the state written and
//     resumed on the same layout gives the uninterrupted run's latents and video bit for bit, also
//     paused twice (1, then 3); a state of one GPU or of another layout is refused both ways in one
//     line naming the numerics; through the CLI (in-process, and paused by 2 processes, resumed
//     in-process) the resumed run writes the uninterrupted run's files byte for byte, the paused run
//     only its state; bad pause / resume combinations exit 2 with one "error:" line on every process
//     and write nothing.
// Skips with fewer than 2 GPUs (cases needing more GPUs skip on their own) or without NCCL.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../cpu/test_util.h"
#include "ckpt/layout.h"
#include "core/error.h"
#include "kernels/gemm.h"
#include "models/dit/dit_gpu.h"
#include "testing/make_checkpoint.h"
#include "gpu_test_model.h"
#include "pipeline/files.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"

#ifndef WAN_HAVE_NCCL
TEST(GenerateDist, NeedsNccl) { GTEST_SKIP() << "built without NCCL"; }
#else
#include "pipeline/parallel_groups.h"
#include "runtime/dist/rendezvous.h"

using namespace wan;
namespace fs = std::filesystem;
using PL = dist::Layout;

namespace {

#define REQUIRE_GPUS(n)                                                                 \
  REQUIRE_GPU();                                                                        \
  if (::wan::cuda::device_count() < (n))                                                \
  GTEST_SKIP() << "needs " << (n) << " GPUs, found " << ::wan::cuda::device_count()

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr double kLatentBound = 2e-2, kVideoBound = 3e-2;

uint64_t fresh_seed() { return ((uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()) & 0xFFFFFFFFFFFFull; }

using gpu_test::rel_l2;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

using gpu_test::slurp;

const dist::EnvLookup kNoLauncher = [](const char*) -> const char* { return nullptr; };

// The request of `--gpus n [--cfg-parallel] [--ulysses u] [--ring r]` (this process's launcher
// environment ignored), applied to o.
ParallelRequest request(GenerateOptions* o, int n, bool cfg, int u, int r) {
  ParallelArgs a;
  a.gpus = std::to_string(n);
  a.cfg = cfg;
  if (u) a.ulysses = std::to_string(u);
  if (r) a.ring = std::to_string(r);
  return parse_parallel_request(a, o, kNoLauncher);
}

// The random tiny run (seeds fresh per test binary run).
uint64_t noise_seed() {
  static const uint64_t s = fresh_seed();
  return s;
}
uint64_t weights_seed() {
  static const uint64_t s = fresh_seed();
  return s;
}

GenerateOptions tiny() {
  GenerateOptions o;
  o.random_weights = true;
  o.weights_seed = weights_seed();
  o.config = "tiny";
  o.prompt = "a red fox runs through the snow";
  o.width = 80;
  o.height = 48;
  o.frames = 9;
  o.steps = 5;
  o.seed = noise_seed();
  o.device = "cuda:0";
  return o;
}

GenerateResult single_gpu(GenerateOptions o, bool decode = true) {
  o.device = "cuda:0";
  o.decode = decode;
  return run_generate(plan_generate(o), {}, decode);
}

struct LayoutCase {
  int gpus;
  bool cfg;
  int u, r;
  PL want;
};

void expect_close(const GenerateResult& got, const GenerateResult& ref, const std::string& what, bool video = true) {
  const double lat = rel_l2(got.latents, ref.latents);
  printf("%-40s latents rel L2 %.3e", what.c_str(), lat);
  EXPECT_LE(lat, kLatentBound) << what;
  if (video) {
    const double vid = rel_l2(got.video, ref.video);
    printf(", video rel L2 %.3e", vid);
    EXPECT_LE(vid, kVideoBound) << what;
  }
  printf("\n");
}

}  // namespace

TEST(GenerateDist, RandomTinyMatchesOneGpuOnEveryLayout) {
  REQUIRE_GPUS(2);
  const int n = cuda::device_count();
  printf("seeds: noise %llu, weights %llu\n", (unsigned long long)noise_seed(), (unsigned long long)weights_seed());
  const GenerateResult ref = single_gpu(tiny());
  ASSERT_TRUE(ref.video.defined());
  const std::vector<LayoutCase> cases = {
      {2, true, 0, 0, {2, 1, 1}}, {2, false, 2, 0, {1, 2, 1}}, {2, false, 0, 2, {1, 1, 2}},
      {4, true, 2, 0, {2, 2, 1}}, {4, true, 0, 2, {2, 1, 2}},  {4, false, 2, 2, {1, 2, 2}},
      {4, false, 0, 4, {1, 1, 4}}, {8, true, 2, 2, {2, 2, 2}}, {8, true, 0, 4, {2, 1, 4}},
  };
  int ran = 0;
  for (const LayoutCase& c : cases) {
    if (c.gpus > n) continue;
    GenerateOptions o = tiny();
    const ParallelRequest req = request(&o, c.gpus, c.cfg, c.u, c.r);
    const auto t0 = Clock::now();
    const ParallelRun run = run_generate_parallel(o, req, {}, true);
    const std::string what = cat(c.gpus, " GPUs ", dist::describe(run.layout));
    EXPECT_EQ(run.layout, c.want) << what;
    ASSERT_TRUE(run.output_rank);
    ASSERT_TRUE(run.result.video.defined()) << what;
    expect_close(run.result, ref, what);
    printf("  %.2f s; %s", since(t0), run.describe().c_str());
    ASSERT_EQ(run.ranks.size(), static_cast<size_t>(c.gpus));
    for (int r = 0; r < c.gpus; ++r) {
      EXPECT_EQ(run.ranks[r].rank, r);
      EXPECT_EQ(run.ranks[r].device, r);
      EXPECT_EQ(run.ranks[r].load_bytes, 0u) << "random weights are drawn, not loaded";
      EXPECT_GT(run.ranks[r].peak_device_bytes, 0);
    }
    EXPECT_EQ(run.result.timings.step_seconds.size(), 5u);
    ++ran;
  }
  EXPECT_GE(ran, 3);
  // Deterministic: the same layout twice gives the same bits (CFG-parallel, and a ring layout).
  for (const LayoutCase& c : {cases[0], cases[2]}) {
    GenerateOptions a = tiny(), b = tiny();
    const ParallelRun x = run_generate_parallel(a, request(&a, c.gpus, c.cfg, c.u, c.r), {}, true);
    const ParallelRun y = run_generate_parallel(b, request(&b, c.gpus, c.cfg, c.u, c.r), {}, true);
    EXPECT_TRUE(same_bytes(x.result.latents, y.result.latents)) << dist::describe(x.layout);
    EXPECT_TRUE(same_bytes(x.result.video, y.result.video)) << dist::describe(x.layout);
  }
}

// --precision fp8 (FP8 block GEMMs and self-attention) on every layout against one GPU in FP8: the
// layouts round differently (ring merges partial results by their log-sum-exp), nothing more.
TEST(GenerateDist, Fp8MatchesOneGpuFp8OnEveryLayout) {
  REQUIRE_GPUS(2);
  if (!cuda::fp8_supported(0)) GTEST_SKIP() << "no FP8 GEMMs on this GPU";
  const int n = cuda::device_count();
  auto fp8 = [] {
    GenerateOptions o = tiny();
    o.gemm = "fp8";
    o.attention = "own-fp8";
    return o;
  };
  const GenerateResult ref = single_gpu(fp8());
  const GenerateResult exact = single_gpu(tiny());
  printf("1 GPU fp8 vs exact: latents rel L2 %.3e\n", rel_l2(ref.latents, exact.latents));
  const std::vector<LayoutCase> cases = {{2, true, 0, 0, {2, 1, 1}},  {2, false, 2, 0, {1, 2, 1}},
                                         {2, false, 0, 2, {1, 1, 2}}, {4, true, 2, 0, {2, 2, 1}},
                                         {4, false, 2, 2, {1, 2, 2}}};
  for (const LayoutCase& c : cases) {
    if (c.gpus > n) continue;
    GenerateOptions o = fp8();
    const ParallelRun run = run_generate_parallel(o, request(&o, c.gpus, c.cfg, c.u, c.r), {}, true);
    EXPECT_EQ(run.layout, c.want);
    ASSERT_TRUE(run.result.video.defined());
    expect_close(run.result, ref, cat("fp8, ", c.gpus, " GPUs ", dist::describe(run.layout)));
  }
  // The paused state of an FP8 run names its numerics: it does not resume on the exact path.
  GenerateOptions a = fp8();
  const ParallelRun one = run_generate_parallel(a, request(&a, 2, true, 0, 0), {}, false);
  EXPECT_NE(one.plan.fingerprint.find("fp8 block GEMMs, fp8 self-attention, 2 GPUs"), std::string::npos)
      << one.plan.fingerprint;
}

TEST(GenerateDist, FortyHeadsUlysses) {
  REQUIRE_GPUS(2);
  const int n = cuda::device_count();
  test::TempDir t("gdist40");
  // Prompt embeddings from files (no 11 GB text encoder): fresh random [L, 4096].
  const uint64_t s = fresh_seed();
  auto embeds = [&](uint64_t seed, int64_t L, const std::string& file) {
    Tensor e = Tensor::f32(Shape{L, 4096});
    const std::vector<float> v = gpu_test::randn(seed, static_cast<size_t>(L * 4096), 0.2f);
    std::memcpy(e.f32(), v.data(), v.size() * 4);
    write_prompt_embeds(file, e);
  };
  embeds(s, 23, t / "p.safetensors");
  embeds(s + 1, 61, t / "n.safetensors");
  GenerateOptions o;
  o.random_weights = true;
  o.weights_seed = weights_seed();
  o.layers = 1;  // t2v-A14B sizes (dim 5120, 40 heads), one block
  o.prompt_embeds_file = t / "p.safetensors";
  o.negative_embeds_file = t / "n.safetensors";
  o.width = 80;
  o.height = 48;
  o.frames = 9;
  o.steps = 3;
  o.seed = noise_seed();
  const GenerateResult ref = single_gpu(o, false);
  std::vector<LayoutCase> cases = {{2, false, 2, 0, {1, 2, 1}}};
  if (n >= 4) cases = {{4, false, 4, 0, {1, 4, 1}}, {4, true, 2, 0, {2, 2, 1}}};
  for (const LayoutCase& c : cases) {
    GenerateOptions p = o;
    const ParallelRequest req = request(&p, c.gpus, c.cfg, c.u, c.r);
    const ParallelRun run = run_generate_parallel(p, req, {}, false);
    EXPECT_EQ(run.layout, c.want);
    EXPECT_FALSE(run.result.video.defined());
    expect_close(run.result, ref, cat("A14B width, 1 block: ", c.gpus, " GPUs ", dist::describe(run.layout)), false);
  }
}

namespace {

// The experts' official tensors as a single GPU loads them (DiTGpu streaming from the files).
struct RefWeights {
  std::vector<Role> roles;
  std::vector<std::map<std::string, Tensor>> tensors;  // per expert
  uint64_t stored_bytes = 0;                           // the experts' bytes in the files
};

RefWeights reference_weights(const GeneratePlan& p) {
  RefWeights r;
  bool high = false, low = false;
  for (const ExpertStep& s : p.experts.steps) (s.expert == Expert::High ? high : low) = true;
  const bool single = p.ckpt.has(Role::DiT) && !p.ckpt.has(Role::DiTHigh);
  if (high) r.roles.push_back(single ? Role::DiT : Role::DiTHigh);
  if (low) r.roles.push_back(Role::DiTLow);
  std::vector<std::unique_ptr<WeightStore>> stores;
  std::vector<cuda::DiTWeightSource> src;
  for (Role role : r.roles) {
    stores.push_back(open_weights(p.ckpt, role));
    WeightStore* ws = stores.back().get();
    cuda::DiTWeightSource s = cuda::DiTWeightSource::from([ws](const std::string& n) { return ws->get_f32(n); });
    s.span = [ws](const std::string& n) { return ws->raw_span(n); };
    src.push_back(std::move(s));
    for (const auto& [name, shape] : dit_expected_shapes(p.ckpt.dit)) {
      const std::optional<RawSpan> sp = ws->raw_span(name);
      r.stored_bytes += sp ? sp->length : 0;
    }
  }
  const Shape& ls = p.latent_shape;
  cuda::DiTGpu::Options opt;
  opt.device = 0;
  opt.gemm = cuda::DiTGpu::parse_gemm(p.gemm);  // e4m3 weights come back dequantised (download_weight)
  cuda::DiTGpu dit = cuda::DiTGpu::create(p.ckpt.dit, src, cuda::DiTShape{2, ls[1], ls[2], ls[3]}, opt);
  r.tensors.resize(r.roles.size());
  for (size_t e = 0; e < r.roles.size(); ++e)
    for (const auto& [name, shape] : dit_expected_shapes(p.ckpt.dit))
      r.tensors[e][name] = dit.download_weight(static_cast<int>(e), name);
  return r;
}

GenerateOptions checkpoint_options(const std::string& model) {
  GenerateOptions o;
  o.model = model;
  o.prompt = "a red fox runs through the snow";
  o.width = 80;
  o.height = 48;
  o.frames = 9;
  o.steps = 4;
  o.seed = noise_seed();
  o.device = "cuda:0";
  return o;
}

}  // namespace

TEST(GenerateDist, ShardedLoadGivesEveryRankTheSingleGpuWeights) {
  REQUIRE_GPUS(2);
  const int n = cuda::device_count();
  test::TempDir t("gdistckpt");
  const uint64_t seed = fresh_seed() % 100000;
  // bf16 from both layouts; FP8 GEMMs (e4m3 weights whose row scales follow each fusion group) once.
  struct Case {
    Layout layout;
    DType dtype;
    const char* gemm;
  };
  for (const auto& [layout, dtype, gemm] : {Case{Layout::Official, DType::F32, "bf16"},
                                            Case{Layout::Diffusers, DType::BF16, "bf16"},
                                            Case{Layout::Official, DType::F32, "fp8"}}) {
    if (std::string(gemm) == "fp8" && !cuda::fp8_supported(0)) continue;
    gen::MakeCheckpointOptions mk;
    mk.config = "tiny";
    mk.layout = layout;
    mk.dtype = dtype;
    mk.seed = seed;
    mk.out = t / (layout == Layout::Official ? "official" : "diffusers");
    if (!fs::exists(mk.out)) gen::make_checkpoint(mk);
    GenerateOptions o = checkpoint_options(mk.out);
    o.parallel = true;
    o.gemm = gemm;
    const GeneratePlan plan = plan_generate(o);
    const RefWeights ref = reference_weights(plan);
    ASSERT_FALSE(ref.roles.empty());
    ASSERT_GT(ref.stored_bytes, 0u);
    for (int world : {2, 4, 8}) {
      if (world > n) continue;
      dist::LaunchOptions lo;
      for (int d = 0; d < world; ++d) lo.devices.push_back(d);
      std::vector<ParallelRankStats> stats(world);
      std::vector<int64_t> compared(world, 0), mismatched(world, 0);
      std::vector<std::string> first_bad(world);
      const PL pl = dist::choose_layout(world, plan.ckpt.dit.num_heads);
      dist::launch(lo, [&](dist::RankContext& ctx) {
        const dist::ParallelGroups g = dist::make_groups(ctx.comm, pl, [&](ncclComm_t c) { ctx.register_comm(c); });
        auto dit = make_rank_dit(ctx, plan, g.view(), false, &stats[ctx.rank]);
        for (size_t e = 0; e < ref.roles.size(); ++e)
          for (const auto& [name, want] : ref.tensors[e]) {
            ++compared[ctx.rank];
            if (!same_bytes(dit->download_weight(static_cast<int>(e), name), want)) {
              if (mismatched[ctx.rank]++ == 0) first_bad[ctx.rank] = cat("expert ", e, " ", name);
            }
          }
      });
      // The expected shares: the tensors whose start lies in each rank's range, per expert.
      size_t total = 0;
      const cuda::DiTGpu::Gemm g = cuda::DiTGpu::parse_gemm(gemm);
      const std::vector<std::pair<size_t, size_t>> tensors = cuda::DiTGpu::weight_ranges(plan.ckpt.dit, &total, g);
      const auto ranges = shard_ranges(tensors, total, world);
      const int per_expert = static_cast<int>(dit_expected_shapes(plan.ckpt.dit).size());
      // FP8: a fused q|k|v or k|v group is one unit of three or two tensors.
      if (g == cuda::DiTGpu::Gemm::Fp8) EXPECT_LT(static_cast<int>(tensors.size()), per_expert);
      else EXPECT_EQ(static_cast<int>(tensors.size()), per_expert);
      uint64_t streamed = 0;
      int loaded = 0;
      for (int r = 0; r < world; ++r) {
        int want = 0;
        for (const auto& x : tensors) want += x.first >= ranges[r].first && x.first < ranges[r].second;
        if (g == cuda::DiTGpu::Gemm::Bf16)
          EXPECT_EQ(stats[r].load_tensors, want * static_cast<int>(ref.roles.size())) << "rank " << r;
        loaded += stats[r].load_tensors;
        const std::string what =
            cat(layout_name(layout), " ", dtype_name(dtype), " --gemm ", gemm, ", ", world, " ranks, rank ", r);
        EXPECT_GT(compared[r], 0) << what;
        EXPECT_EQ(mismatched[r], 0) << what << ": first differing tensor " << first_bad[r];
        EXPECT_EQ(stats[r].load_bytes > 0, want > 0) << what << ": a rank streams exactly when its range holds tensors";
        streamed += stats[r].load_bytes;
        printf("%s: streamed %llu B (%d tensors) in %.3f s, broadcasts %.3f s\n", what.c_str(),
               (unsigned long long)stats[r].load_bytes, stats[r].load_tensors, stats[r].load_s, stats[r].broadcast_s);
      }
      EXPECT_EQ(streamed, ref.stored_bytes) << "the shares add up to the experts' stored bytes";
      EXPECT_EQ(loaded, per_expert * static_cast<int>(ref.roles.size())) << "every tensor is loaded once";
    }
  }
  // The whole pipeline from the official checkpoint on 2 GPUs vs one GPU (text encoder streamed on rank 0).
  const std::string model = t / "official";
  const GenerateResult one = single_gpu(checkpoint_options(model));
  GenerateOptions o = checkpoint_options(model);
  const ParallelRun run = run_generate_parallel(o, request(&o, 2, false, 0, 0), {}, true);
  expect_close(run.result, one, cat("checkpoint, 2 GPUs ", dist::describe(run.layout)));
  printf("%s", run.describe().c_str());
  ASSERT_EQ(run.ranks.size(), 2u);
  EXPECT_GT(run.ranks[0].load_bytes, 0u);
  EXPECT_GT(run.ranks[1].load_bytes, 0u);
  EXPECT_EQ(run.result.load_bytes, run.ranks[0].load_bytes + run.ranks[1].load_bytes);
  if (cuda::fp8_supported(0)) {  // the same with FP8 GEMMs: sharded e4m3 weights and scales
    GenerateOptions f1 = checkpoint_options(model);
    f1.gemm = "fp8";
    const GenerateResult one8 = single_gpu(f1);
    GenerateOptions f2 = checkpoint_options(model);
    f2.gemm = "fp8";
    const ParallelRun run8 = run_generate_parallel(f2, request(&f2, 2, false, 0, 0), {}, true);
    expect_close(run8.result, one8, cat("checkpoint --gemm fp8, 2 GPUs ", dist::describe(run8.layout)));
  }
}

// ---- the command line: in-process, 2 processes, failures ----

namespace {

struct Proc {
  int code = -1;
  std::string out, err;
};

// Starts `wan args...` once per entry of `envs` (extra variables for that process; launcher variables of
// this process are dropped), waits up to limit_s (then kills). Logs to dir/<i>.out / .err.
std::vector<Proc> run_wan(const std::vector<std::string>& args, const std::vector<std::map<std::string, std::string>>& envs,
                          const std::string& dir, double limit_s, double* elapsed) {
  std::vector<pid_t> pids;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < envs.size(); ++i) {
    // Everything the child needs is built before fork(): between fork and exec only async-signal-safe calls.
    std::vector<std::string> kv;
    for (char** e = environ; *e; ++e) {
      const std::string s = *e, k = s.substr(0, s.find('='));
      const bool launcher = k.rfind("WAN_", 0) == 0 || k.rfind("OMPI_", 0) == 0 || k.rfind("PMI_", 0) == 0 ||
                            k.rfind("SLURM_", 0) == 0 || k == "MPI_LOCALRANKID";
      if (!launcher) kv.push_back(s);
    }
    for (const auto& [k, v] : envs[i]) kv.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : kv) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string bin = WAN_BINARY;
    std::vector<std::string> copy = args;
    std::vector<char*> argv{bin.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = dir + "/" + std::to_string(i) + ".out", err = dir + "/" + std::to_string(i) + ".err";
    fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(e, 2);
      execve(bin.c_str(), argv.data(), envp.data());
      _exit(121);
    }
    pids.push_back(pid);
  }
  std::vector<Proc> res(envs.size());
  std::vector<bool> done(envs.size(), false);
  size_t left = envs.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int st = 0;
      if (!done[i] && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        res[i].code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (left > 0 && since(t0) > limit_s) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          ADD_FAILURE() << "process " << i << " still running after " << limit_s << " s (hang)";
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  *elapsed = since(t0);
  for (size_t i = 0; i < envs.size(); ++i) {
    res[i].out = slurp(dir + "/" + std::to_string(i) + ".out");
    res[i].err = slurp(dir + "/" + std::to_string(i) + ".err");
  }
  return res;
}

// The launcher variables of `world` processes of one run (rank 0 at 127.0.0.1:<a free port>), plus `extra`.
std::vector<std::map<std::string, std::string>> ranks_env(int world, const std::map<std::string, std::string>& extra = {}) {
  const int port = dist::free_tcp_port();
  std::vector<std::map<std::string, std::string>> v;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> m = extra;
    m["WAN_RANK"] = std::to_string(r);
    m["WAN_WORLD_SIZE"] = std::to_string(world);
    m["WAN_LOCAL_RANK"] = std::to_string(r);
    m["WAN_MASTER_ADDR"] = "127.0.0.1";
    m["WAN_MASTER_PORT"] = std::to_string(port);
    v.push_back(m);
  }
  return v;
}

std::vector<std::string> error_lines(const std::string& err) {
  std::vector<std::string> v;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("error:", 0) == 0) v.push_back(line);
  return v;
}

std::string dump(const std::vector<Proc>& p) {
  std::string s;
  for (size_t i = 0; i < p.size(); ++i)
    s += cat("--- process ", i, " exit ", p[i].code, "\n", p[i].err.substr(0, 4000), "\n");
  return s;
}

std::vector<std::string> cli_base(const std::string& dir) {
  return {"generate", "--weights", "random", "--config", "tiny", "--weights-seed",
          std::to_string(weights_seed()), "--prompt", "a red fox", "--size", "80x48", "--frames", "9", "--steps", "4",
          "--seed", std::to_string(noise_seed()), "--ulysses", "2", "--output", dir + "/video.y4m", "--save-latents",
          dir + "/latents.safetensors"};
}

#define REQUIRE_BINARY() \
  ASSERT_TRUE(fs::exists(WAN_BINARY)) << "build the wan target too: " << WAN_BINARY

}  // namespace

TEST(GenerateDistCli, InProcessAndTwoProcessesWriteTheSameFiles) {
  REQUIRE_GPUS(2);
  REQUIRE_BINARY();
  test::TempDir a("gdcli_a"), b("gdcli_b"), logs("gdcli_logs");
  double s = 0;
  std::vector<std::string> in_process = cli_base(a.str());
  in_process.insert(in_process.end(), {"--gpus", "2", "--timings-json", a / "t.json"});
  const std::vector<Proc> p1 = run_wan(in_process, {{}}, logs.str(), 300, &s);
  ASSERT_EQ(p1[0].code, 0) << dump(p1);
  printf("in-process, 2 GPUs: %.1f s\n", s);
  const auto j = nlohmann::json::parse(slurp(a / "t.json"));
  EXPECT_EQ(j.at("parallel").at("gpus"), 2);
  EXPECT_EQ(j.at("parallel").at("ulysses"), 2);
  EXPECT_EQ(j.at("parallel").at("ranks").size(), 2u);
  EXPECT_GT(j.at("parallel").at("ranks")[1].at("peak_device_bytes").get<int64_t>(), 0);

  const std::vector<Proc> p2 = run_wan(cli_base(b.str()), ranks_env(2), logs.str(), 300, &s);
  ASSERT_EQ(p2[0].code, 0) << dump(p2);
  ASSERT_EQ(p2[1].code, 0) << dump(p2);
  printf("2 processes (WAN_RANK), 2 GPUs: %.1f s\n", s);
  EXPECT_NE(p2[0].out.find("rank 1 (cuda:1)"), std::string::npos) << p2[0].out;  // rank 0 reports every rank
  EXPECT_TRUE(p2[1].out.empty()) << p2[1].out;  // rank 1 neither writes nor reports
  for (const char* f : {"video.y4m", "latents.safetensors"}) {
    const std::string x = slurp(a / f), y = slurp(b / f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_EQ(x, y) << f << " differs between the in-process and the 2-process run";
  }
  EXPECT_EQ(b.files(), (std::set<std::string>{"latents.safetensors", "video.y4m"}));  // nothing else, no .tmp
}

TEST(GenerateDistCli, ForcedFailureEndsEveryRankWithOneError) {
  REQUIRE_GPUS(2);
  REQUIRE_BINARY();
  test::TempDir logs("gdfail_logs");
  struct Case {
    std::string name;
    bool processes;
    std::map<std::string, std::string> env;
    std::string message;  // a part of the error line every surviving process prints
  };
  const std::vector<Case> cases = {
      {"throw at step, in-process", false, {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "step"}},
       "error: rank 1: forced failure at 'step' (WAN_DIST_FAIL_RANK=1)"},
      {"oom at load, in-process", false,
       {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "load"}, {"WAN_DIST_FAIL_MODE", "oom"}},
       "error: rank 1: forced failure at 'load': cudaMalloc of 1 PiB"},
      {"throw at step, 2 processes", true, {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "step"}},
       "error: rank 1: forced failure at 'step' (WAN_DIST_FAIL_RANK=1)"},
      // Steps 2 and 3 replay CUDA graphs with NCCL kernels: the other rank must not be inside one when
      // rank 1 fails (the ranks agree before every step). A grace longer than the limit below: only
      // ranks that return, not the launch's reaper, end these in time.
      {"throw at step 2, in-process", false,
       {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "step2"}, {"WAN_DIST_ABORT_GRACE", "60"}},
       "error: rank 1: forced failure at 'step2' (WAN_DIST_FAIL_RANK=1)"},
      {"throw at step 3, 2 processes", true,
       {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "step3"}, {"WAN_DIST_ABORT_GRACE", "60"}},
       "error: rank 1: forced failure at 'step3' (WAN_DIST_FAIL_RANK=1)"},
      {"rank 1 dies at step, 2 processes", true,
       {{"WAN_DIST_FAIL_RANK", "1"}, {"WAN_DIST_FAIL_AT", "step"}, {"WAN_DIST_FAIL_MODE", "exit"}},
       "error: lost peer rank 1"},
  };
  for (const Case& c : cases) {
    test::TempDir out("gdfail_out");
    double s = 0;
    std::vector<Proc> p;
    if (c.processes) {
      p = run_wan(cli_base(out.str()), ranks_env(2, c.env), logs.str(), 120, &s);
    } else {
      std::vector<std::string> args = cli_base(out.str());
      args.insert(args.end(), {"--gpus", "2"});
      p = run_wan(args, {c.env}, logs.str(), 120, &s);
    }
    printf("%s: every process ended %.1f s after the start\n", c.name.c_str(), s);
    EXPECT_LT(s, 30.0) << c.name;
    std::string seen;
    for (size_t i = 0; i < p.size(); ++i) {
      const bool died = c.env.count("WAN_DIST_FAIL_MODE") && c.env.at("WAN_DIST_FAIL_MODE") == "exit" && i == 1;
      EXPECT_NE(p[i].code, 0) << c.name << ", process " << i << "\n" << dump(p);
      if (died) continue;  // killed itself (exit 3) without a message
      EXPECT_NE(p[i].code, 2) << c.name << ": not a bad-input failure";
      const std::vector<std::string> lines = error_lines(p[i].err);
      ASSERT_EQ(lines.size(), 1u) << c.name << ", process " << i << "\n" << dump(p);
      EXPECT_EQ(lines[0].rfind(c.message, 0), 0u) << c.name << ": " << lines[0];
      if (seen.empty()) seen = lines[0];
      EXPECT_EQ(lines[0], seen) << c.name << ": every process reports the same error";
    }
    EXPECT_TRUE(out.files().empty()) << c.name << ": an output file was left behind";
  }
}

// ---- pausing and resuming on several GPUs (--stop-after-steps / --save-state / --resume) ----

namespace {

// The one wan::Error of a multi-GPU run of o on `gpus` GPUs with that layout (checked to be bad input).
std::string parallel_error(GenerateOptions o, int gpus, bool cfg, int u, int r) {
  try {
    const ParallelRequest req = request(&o, gpus, cfg, u, r);
    (void)run_generate_parallel(o, req, {}, true);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    return e.what();
  }
  return "(no error)";
}

ParallelRun run_layout(GenerateOptions o, const LayoutCase& c) {
  const ParallelRequest req = request(&o, c.gpus, c.cfg, c.u, c.r);
  return run_generate_parallel(o, req, {}, true);
}

}  // namespace

TEST(GenerateDistResume, PausedAndResumedRunEqualsUninterrupted) {
  REQUIRE_GPUS(2);
  test::TempDir t("gdresume");
  printf("seeds: noise %llu, weights %llu\n", (unsigned long long)noise_seed(), (unsigned long long)weights_seed());
  struct Case {
    LayoutCase layout;
    std::vector<int> stops;
  };
  const std::vector<Case> cases = {{{2, false, 2, 0, {1, 2, 1}}, {1, 3}},
                                   {{2, true, 0, 0, {2, 1, 1}}, {2}},
                                   {{2, false, 0, 2, {1, 1, 2}}, {4}}};
  for (const Case& c : cases) {
    const ParallelRun full = run_layout(tiny(), c.layout);
    const std::string what = dist::describe(full.layout);
    ASSERT_EQ(full.layout, c.layout.want);
    ASSERT_TRUE(full.result.video.defined()) << what;
    ASSERT_FALSE(full.result.state.has_value()) << what;
    for (int stop : c.stops) {
      const std::string at = cat(what, ", stop after ", stop);
      GenerateOptions a = tiny();
      a.stop_after_steps = stop;
      const ParallelRun paused = run_layout(a, c.layout);
      ASSERT_TRUE(paused.output_rank);
      ASSERT_TRUE(paused.result.state.has_value()) << at;
      const RunState& st = *paused.result.state;
      EXPECT_FALSE(paused.result.video.defined()) << at << ": a paused run decodes nothing";
      EXPECT_EQ(st.step, stop);
      EXPECT_EQ(st.sampler.index, stop);
      EXPECT_EQ(paused.result.timings.step_seconds.size(), static_cast<size_t>(stop));
      EXPECT_EQ(st.timings.step_seconds.size(), static_cast<size_t>(stop));
      EXPECT_TRUE(same_bytes(st.latents, paused.result.latents)) << at;
      EXPECT_FALSE(same_bytes(st.latents, full.result.latents)) << at << ": the paused latents are the final ones";
      EXPECT_TRUE(st.prompt_embeds.defined() && st.negative_embeds.defined()) << at;
      EXPECT_NE(st.fingerprint.find(cat("cuda bf16, 2 GPUs, ", what)), std::string::npos) << st.fingerprint;
      EXPECT_EQ(st.fingerprint, paused.plan.fingerprint);
      EXPECT_GT(st.peak_device_bytes, 0);
      ASSERT_EQ(paused.ranks.size(), 2u);
      const std::string file = t / cat("l", c.layout.want.cfg, c.layout.want.ulysses, c.layout.want.ring, "_s", stop,
                                       ".safetensors");
      write_run_state(file, st);  // through the file, as the CLI does

      GenerateOptions b = tiny();
      b.resume_file = file;
      const ParallelRun resumed = run_layout(b, c.layout);
      EXPECT_FALSE(resumed.plan.needs_text_encoder) << at << ": the text comes from the state";
      EXPECT_EQ(resumed.result.first_step, stop);
      EXPECT_EQ(resumed.result.timings.step_seconds.size(), static_cast<size_t>(5 - stop));
      EXPECT_EQ(resumed.result.earlier.step_seconds.size(), static_cast<size_t>(stop));
      EXPECT_FALSE(resumed.result.state.has_value());
      EXPECT_TRUE(same_bytes(resumed.result.latents, full.result.latents)) << at;
      EXPECT_TRUE(same_bytes(resumed.result.video, full.result.video)) << at;
      printf("%s: resumed run bit-identical to the uninterrupted one: %s\n", at.c_str(),
             same_bytes(resumed.result.latents, full.result.latents) ? "yes" : "NO");
    }
  }
  // Paused twice on Ulysses 2: after step 1, then (resumed) after step 3, then to the end.
  const LayoutCase u2 = cases[0].layout;
  const ParallelRun full = run_layout(tiny(), u2);
  GenerateOptions b = tiny();
  b.resume_file = t / "l121_s1.safetensors";
  b.stop_after_steps = 3;
  const ParallelRun second = run_layout(b, u2);
  ASSERT_TRUE(second.result.state.has_value());
  EXPECT_EQ(second.result.state->step, 3);
  EXPECT_EQ(second.result.first_step, 1);
  EXPECT_EQ(second.result.state->timings.step_seconds.size(), 3u) << "the state carries every step so far";
  write_run_state(t / "twice.safetensors", *second.result.state);
  GenerateOptions c = tiny();
  c.resume_file = t / "twice.safetensors";
  const ParallelRun last = run_layout(c, u2);
  EXPECT_EQ(last.result.first_step, 3);
  EXPECT_TRUE(same_bytes(last.result.latents, full.result.latents)) << "paused twice";
  EXPECT_TRUE(same_bytes(last.result.video, full.result.video)) << "paused twice";
}

TEST(GenerateDistResume, StatesOfAnotherLayoutOrOneGpuAreRefused) {
  REQUIRE_GPUS(2);
  test::TempDir t("gdrefuse");
  const std::string one = t / "one.safetensors", ulysses = t / "ulysses.safetensors";
  GenerateOptions a = tiny();
  a.stop_after_steps = 2;
  const GenerateResult single = single_gpu(a, false);
  ASSERT_TRUE(single.state.has_value());
  write_run_state(one, *single.state);
  const ParallelRun u2 = run_layout(a, {2, false, 2, 0, {1, 2, 1}});
  ASSERT_TRUE(u2.result.state.has_value());
  write_run_state(ulysses, *u2.result.state);
  // The two paused runs agree within bf16 (the same run on other numerics), yet neither resumes the other.
  const double lat = rel_l2(u2.result.state->latents, single.state->latents);
  printf("paused after step 2: 2 GPUs Ulysses 2 vs one GPU latents rel L2 %.3e\n", lat);
  EXPECT_LE(lat, kLatentBound);

  const std::string saved_u2 = "numerics cuda bf16, 2 GPUs, cfg 1 x ulysses 2 x ring 1 (saved)";
  GenerateOptions o = tiny();
  o.resume_file = one;
  EXPECT_EQ(parallel_error(o, 2, false, 2, 0),
            cat("--resume ", one, ": the state was saved by a different run: numerics cuda bf16 (saved) vs cuda bf16, 2 "
                "GPUs, cfg 1 x ulysses 2 x ring 1 (now)"));
  o.resume_file = ulysses;
  EXPECT_EQ(parallel_error(o, 2, false, 0, 2), cat("--resume ", ulysses, ": the state was saved by a different run: ",
                                                   saved_u2, " vs cuda bf16, 2 GPUs, cfg 1 x ulysses 1 x ring 2 (now)"));
  EXPECT_EQ(parallel_error(o, 2, true, 0, 0), cat("--resume ", ulysses, ": the state was saved by a different run: ",
                                                  saved_u2, " vs cuda bf16, 2 GPUs, cfg 2 x ulysses 1 x ring 1 (now)"));
  try {
    GenerateOptions s = tiny();
    s.resume_file = ulysses;
    (void)plan_generate(s);
    ADD_FAILURE() << "a 2-GPU state resumed on one GPU";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), cat("--resume ", ulysses, ": the state was saved by a different run: ", saved_u2,
                                         " vs cuda bf16 (now)"));
  }
  GenerateOptions other = tiny();
  other.resume_file = ulysses;
  other.steps = 6;
  EXPECT_NE(parallel_error(other, 2, false, 2, 0).find("steps 5 (saved) vs 6 (now)"), std::string::npos);
  GenerateOptions again = tiny();
  again.resume_file = ulysses;
  again.stop_after_steps = 2;
  EXPECT_EQ(parallel_error(again, 2, false, 2, 0),
            "--stop-after-steps 2: the resumed state is already at step 2");
  GenerateOptions keep = tiny();
  keep.resume_file = ulysses;
  keep.keep_text_encoder = true;
  EXPECT_EQ(parallel_error(keep, 2, false, 2, 0),
            "--keep-text-encoder: not with several GPUs (the text encoder runs once on rank 0 and is freed before its "
            "DiT loads)");
}

// Each rank checks its share of the run-level memory plan (the DiT planned for the layout) before any
// model is loaded: a run far too large for the devices is one line naming the rank, the stage and
// what would fit, with exit 2's error kind.
TEST(GenerateDistMemory, EveryRankRefusesARunThatCannotFitBeforeLoading) {
  REQUIRE_GPUS(2);
  GenerateOptions o = tiny();
  o.config = "t2v-A14B";
  o.width = 1280;
  o.height = 720;
  o.frames = 1001;
  o.steps = 2;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = parallel_error(o, 2, false, 2, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("refusal after %.2f s: %s\n", s, e.c_str());
  EXPECT_NE(e.find("rank "), std::string::npos) << e;
  EXPECT_NE(e.find("this rank's share of cfg 1 x ulysses 2 x ring 1"), std::string::npos) << e;
  EXPECT_NE(e.find("does not fit: its denoise stage needs"), std::string::npos) << e;
  EXPECT_NE(e.find("frames fit at 1280x720"), std::string::npos) << e;
  EXPECT_LT(s, 30.0) << "refused only after " << s << " s";
}

namespace {

// `wan generate` on the tiny random model (4 steps) plus `extra`.
std::vector<std::string> tiny_cli(const std::vector<std::string>& extra) {
  std::vector<std::string> v = {"generate", "--weights", "random", "--config", "tiny", "--weights-seed",
                                std::to_string(weights_seed()), "--prompt", "a red fox", "--size", "80x48", "--frames",
                                "9", "--steps", "4", "--seed", std::to_string(noise_seed())};
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

}  // namespace

TEST(GenerateDistCli, PausedAndResumedRunWritesTheSameFiles) {
  REQUIRE_GPUS(2);
  REQUIRE_BINARY();
  test::TempDir full("gdpause_full"), paused("gdpause_state"), resumed("gdpause_resumed"), logs("gdpause_logs");
  double s = 0;
  auto outputs = [](const test::TempDir& d) {
    return std::vector<std::string>{"--output", d / "video.y4m", "--save-latents", d / "latents.safetensors"};
  };
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<std::string> in_process = {"--gpus", "2", "--ulysses", "2"};
  const std::vector<Proc> p0 = run_wan(tiny_cli(with(in_process, outputs(full))), {{}}, logs.str(), 300, &s);
  ASSERT_EQ(p0[0].code, 0) << dump(p0);

  // Paused in-process after step 2: only the state (and the timings) are written, by rank 0's process.
  const std::string state = paused / "s.safetensors";
  const std::vector<Proc> p1 = run_wan(
      tiny_cli(with(in_process, {"--save-state", state, "--stop-after-steps", "2", "--timings-json", paused / "t.json"})),
      {{}}, logs.str(), 300, &s);
  ASSERT_EQ(p1[0].code, 0) << dump(p1);
  EXPECT_NE(p1[0].out.find("stopped after step 2 of 4"), std::string::npos) << p1[0].out;
  EXPECT_EQ(paused.files(), (std::set<std::string>{"s.safetensors", "t.json"}));
  const auto j1 = nlohmann::json::parse(slurp(paused / "t.json"));
  EXPECT_EQ(j1.at("last_step"), 2);
  EXPECT_EQ(j1.at("parallel").at("gpus"), 2);
  const RunState st = read_run_state(state);
  EXPECT_EQ(st.step, 2);
  EXPECT_NE(st.fingerprint.find("cuda bf16, 2 GPUs, cfg 1 x ulysses 2 x ring 1"), std::string::npos) << st.fingerprint;

  // Resumed in-process: the uninterrupted run's files, byte for byte.
  const std::vector<Proc> p2 = run_wan(
      tiny_cli(with(with(in_process, outputs(resumed)), {"--resume", state, "--timings-json", resumed / "t.json"})), {{}},
      logs.str(), 300, &s);
  ASSERT_EQ(p2[0].code, 0) << dump(p2);
  EXPECT_NE(p2[0].out.find("whole run (steps 1-2 in earlier processes, 3-4 here)"), std::string::npos) << p2[0].out;
  const auto j2 = nlohmann::json::parse(slurp(resumed / "t.json"));
  EXPECT_EQ(j2.at("first_step"), 2);
  EXPECT_EQ(j2.at("resumed_from"), state);
  EXPECT_EQ(j2.at("whole_run").at("steps"), 4);
  for (const char* f : {"video.y4m", "latents.safetensors"}) {
    const std::string x = slurp(full / f), y = slurp(resumed / f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_EQ(x, y) << f << " differs between the uninterrupted and the paused + resumed run";
  }

  // Paused as 2 processes (WAN_RANK) after step 3, resumed in-process: the same files again (how the
  // ranks were started is not part of the numerics); only rank 0's process writes the state.
  test::TempDir paused2("gdpause_state2"), resumed2("gdpause_resumed2");
  const std::string state2 = paused2 / "s.safetensors";
  const std::vector<Proc> p3 = run_wan(tiny_cli({"--ulysses", "2", "--save-state", state2, "--stop-after-steps", "3"}),
                                       ranks_env(2), logs.str(), 300, &s);
  ASSERT_EQ(p3[0].code, 0) << dump(p3);
  ASSERT_EQ(p3[1].code, 0) << dump(p3);
  EXPECT_TRUE(p3[1].out.empty()) << p3[1].out;
  EXPECT_EQ(paused2.files(), (std::set<std::string>{"s.safetensors"}));
  const std::vector<Proc> p4 =
      run_wan(tiny_cli(with(with(in_process, outputs(resumed2)), {"--resume", state2})), {{}}, logs.str(), 300, &s);
  ASSERT_EQ(p4[0].code, 0) << dump(p4);
  for (const char* f : {"video.y4m", "latents.safetensors"})
    EXPECT_EQ(slurp(full / f), slurp(resumed2 / f)) << f << ": paused by 2 processes, resumed in-process";
}

TEST(GenerateDistCli, BadPauseAndResumeCombinationsGiveOneError) {
  REQUIRE_GPUS(2);
  REQUIRE_BINARY();
  test::TempDir states("gdbad_states"), logs("gdbad_logs");
  double s = 0;
  const std::string one = states / "one.safetensors", u2 = states / "u2.safetensors";
  const std::vector<Proc> a = run_wan(tiny_cli({"--device", "cuda:0", "--save-state", one, "--stop-after-steps", "2"}),
                                      {{}}, logs.str(), 300, &s);
  ASSERT_EQ(a[0].code, 0) << dump(a);
  const std::vector<Proc> b = run_wan(
      tiny_cli({"--gpus", "2", "--ulysses", "2", "--save-state", u2, "--stop-after-steps", "2"}), {{}}, logs.str(), 300, &s);
  ASSERT_EQ(b[0].code, 0) << dump(b);
  const std::string different = ": the state was saved by a different run: numerics ";
  struct Case {
    std::vector<std::string> args;  // after tiny_cli's; <out> is replaced by the case's output folder
    bool processes;                 // 2 processes (WAN_RANK) instead of --gpus 2
    std::string message;            // the one error line
  };
  const std::vector<Case> cases = {
      {{"--gpus", "2", "--save-state", "<out>/s.safetensors"}, false,
       "error: --save-state FILE and --stop-after-steps N go together (the state after step N is written to FILE)"},
      {{"--gpus", "2", "--save-state", "<out>/s.safetensors", "--stop-after-steps", "2", "--output", "<out>/v.y4m"},
       false, "error: --stop-after-steps: the run stops before the end, so there is no video or final latents to write (drop "
       "--output / --save-latents; they belong to the --resume run)"},
      {{"--gpus", "2", "--save-state", "<out>/s.safetensors", "--stop-after-steps", "9"}, false,
       "error: --stop-after-steps 9: must be in 1..4 (the run's steps)"},
      {{"--gpus", "2", "--ulysses", "2", "--resume", one, "--output", "<out>/v.y4m"}, false,
       cat("error: --resume ", one, different, "cuda bf16 (saved) vs cuda bf16, 2 GPUs, cfg 1 x ulysses 2 x ring 1 (now)")},
      {{"--gpus", "2", "--ring", "2", "--resume", u2, "--output", "<out>/v.y4m"}, false,
       cat("error: --resume ", u2, different,
           "cuda bf16, 2 GPUs, cfg 1 x ulysses 2 x ring 1 (saved) vs cuda bf16, 2 GPUs, cfg 1 x ulysses 1 x ring 2 (now)")},
      {{"--device", "cuda:0", "--resume", u2, "--output", "<out>/v.y4m"}, false,
       cat("error: --resume ", u2, different, "cuda bf16, 2 GPUs, cfg 1 x ulysses 2 x ring 1 (saved) vs cuda bf16 (now)")},
      {{"--gpus", "2", "--ulysses", "2", "--resume", u2, "--save-state", "<out>/s.safetensors", "--stop-after-steps", "1"},
       false, "error: --stop-after-steps 1: the resumed state is already at step 2"},
      {{"--ulysses", "2", "--resume", one, "--output", "<out>/v.y4m"}, true,
       cat("error: --resume ", one, different, "cuda bf16 (saved) vs cuda bf16, 2 GPUs, cfg 1 x ulysses 2 x ring 1 (now)")},
  };
  for (const Case& c : cases) {
    test::TempDir out("gdbad_out");
    std::vector<std::string> args;
    for (const std::string& x : c.args) args.push_back(x.rfind("<out>", 0) == 0 ? out.str() + x.substr(5) : x);
    const std::vector<Proc> p = run_wan(tiny_cli(args), c.processes ? ranks_env(2) : std::vector<std::map<std::string, std::string>>{{}},
                                        logs.str(), 120, &s);
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(p[i].code, 2) << c.message << ", process " << i << "\n" << dump(p);
      const std::vector<std::string> lines = error_lines(p[i].err);
      ASSERT_EQ(lines.size(), 1u) << c.message << ", process " << i << "\n" << dump(p);
      EXPECT_EQ(lines[0], c.message);
    }
    EXPECT_TRUE(out.files().empty()) << c.message << ": an output file was left behind";
  }
  EXPECT_EQ(states.files(), (std::set<std::string>{"one.safetensors", "u2.safetensors"})) << "the states are untouched";
}

#endif  // WAN_HAVE_NCCL
