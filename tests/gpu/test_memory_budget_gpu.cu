// `--memory-budget` (issue 27): the run plan picks the fastest weight residency that fits the budget,
// every choice gives the all-resident run's latents byte for byte (with chunked rows, to within the
// GEMMs' rounding: cuBLASLt may pick other kernels for a chunk's rows), a budget nothing fits is refused
// naming the smallest that works, and a budget beyond the device or on the CPU is a keyed bad-input
// error before any work. Tiny random weights at 5 blocks, prompt embeddings from files and no decode,
// so the denoise stage is the plan's peak.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "../cpu/test_util.h"
#include "api/options.h"
#include "core/philox.h"
#include "gpu_test_model.h"
#include "pipeline/files.h"
#include "pipeline/model_cache.h"
#include "pipeline/pipeline.h"
#include "runtime/memory_plan.h"

using namespace wan;

namespace {

GenerateOptions tiny(const test::TempDir& t) {
  GenerateOptions o;
  o.random_weights = true;
  o.weights_seed = 21;
  o.config = "tiny";
  o.layers = 5;
  o.width = 64;
  o.height = 48;
  o.frames = 9;
  o.steps = 4;
  o.seed = 8;
  o.device = "cuda";
  o.decode = false;
  GenerateOptions with_prompt = o;
  with_prompt.prompt = "a fox";
  const int64_t text_dim = plan_generate(with_prompt).ckpt.dit.text_dim;  // the random config's
  for (const char* name : {"p.safetensors", "n.safetensors"}) {
    Tensor e = Tensor::empty(DType::F32, {7, text_dim});
    for (int64_t i = 0; i < e.numel(); ++i) e.f32()[i] = 0.3f * philox_normal(name[0], static_cast<uint64_t>(i));
    write_prompt_embeds(t / name, e);
  }
  o.prompt_embeds_file = t / "p.safetensors";
  o.negative_embeds_file = t / "n.safetensors";
  return o;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// The run's latents against the resident run's: the same bytes, or with chunked rows within 1e-2 (relative L2).
void expect_resident_latents(const GeneratePlan& p, const Tensor& got, const Tensor& ref) {
  if (p.dit_memory->chunk_rows == 0) {
    EXPECT_TRUE(same_bytes(got, ref));
    return;
  }
  ASSERT_EQ(got.shape(), ref.shape());
  const double err = gpu_test::rel_l2(got, ref);
  printf("    chunked rows (%lld per chunk): latents %.2e from the resident run's\n",
         static_cast<long long>(p.dit_memory->chunk_rows), err);
  EXPECT_LE(err, 1e-2);
}

}  // namespace

TEST(MemoryBudgetGpu, EveryChosenResidencyGivesTheResidentLatents) {
  REQUIRE_GPU();
  test::TempDir t{"memory_budget"};
  GenerateOptions o = tiny(t);
  const GeneratePlan p0 = plan_generate(o);
  ASSERT_EQ(p0.residency_name, "resident");
  const GenerateResult ref = run_generate(p0, {}, false);
  std::set<std::string> seen{p0.residency_name};
  // A budget bounds the memory in use: what the device holds before the run (the context) counts.
  const int64_t held = gpu_memory_in_use(0);
  size_t budget = p0.memory->peak(p0.device);
  std::string refusal;
  for (int i = 0; i < 12 && refusal.empty(); ++i) {
    o.memory_budget = static_cast<int64_t>(budget) - 1 + held;
    try {
      const GeneratePlan p = plan_generate(o);
      SCOPED_TRACE(p.residency_name);
      EXPECT_LT(p.memory->peak(p.device), budget);
      EXPECT_NE(p.memory->str().find(p.residency_name), std::string::npos) << p.memory->str();
      seen.insert(p.residency_name);
      const GenerateResult r = run_generate(p, {}, false);
      expect_resident_latents(p, r.latents, ref.latents);
      EXPECT_LE(r.peak_device_bytes - r.device_bytes_at_start, static_cast<int64_t>(budget));
      EXPECT_LE(r.peak_device_bytes, o.memory_budget + (int64_t{64} << 20));  // 64 MiB: what others may allocate
      printf("  budget %zu B: %s, plan peak %zu B, measured %lld B above the start\n", budget - 1,
             p.residency_name.c_str(), p.memory->peak(p.device),
             static_cast<long long>(r.peak_device_bytes - r.device_bytes_at_start));
      budget = p.memory->peak(p.device);
    } catch (const Error& e) {
      refusal = e.what();
    }
  }
  EXPECT_NE(refusal.find("the smallest budget that runs it: --memory-budget"), std::string::npos) << refusal;
  EXPECT_TRUE(seen.count("block streaming (2 slots)")) << "modes seen: " << seen.size();
  EXPECT_TRUE(seen.count("block streaming (2 slots), rows in 4 chunks")) << "modes seen: " << seen.size();
  EXPECT_GE(seen.size(), 4u);
}

// A host that cannot pin the experts (a host budget of 4 MiB: two staging blocks fit, the pinned copies
// do not): below the resident plan's budget the blocks stream from a spill file, with the resident
// latents byte for byte; below that, the refusal names the host budget.
TEST(MemoryBudgetGpu, AShortHostStreamsTheBlocksFromDisk) {
  REQUIRE_GPU();
  test::TempDir t{"memory_budget_disk"};
  GenerateOptions o = tiny(t);
  const GeneratePlan p0 = plan_generate(o);
  const GenerateResult ref = run_generate(p0, {}, false);
  const int64_t held = gpu_memory_in_use(0);
  o.host_memory_budget = int64_t{4} << 20;
  // Ever smaller budgets: streaming from disk, then with chunked rows, then the refusal.
  std::vector<std::string> seen;
  size_t budget = p0.memory->peak(p0.device);
  for (int i = 0; i < 4; ++i) {
    o.memory_budget = static_cast<int64_t>(budget) - 1 + held;
    try {
      const GeneratePlan p = plan_generate(o);
      seen.push_back(p.residency_name);
      SCOPED_TRACE(p.residency_name);
      const GenerateResult r = run_generate(p, {}, false);
      expect_resident_latents(p, r.latents, ref.latents);
      budget = p.memory->peak(p.device);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_NE(std::string(e.what()).find("--host-memory-budget"), std::string::npos) << e.what();
      break;
    }
  }
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen[0], "block streaming (3 slots, from disk)");
  EXPECT_EQ(seen[1], "block streaming (3 slots, from disk), rows in 4 chunks");
  EXPECT_LT(seen.size(), 4u) << "no refusal below the last";
}

TEST(MemoryBudgetGpu, BudgetsBeyondTheDeviceAreBadInput) {
  REQUIRE_GPU();
  test::TempDir t{"memory_budget_bad"};
  GenerateOptions o = tiny(t);
  o.memory_budget = int64_t{1} << 50;  // 1 PiB
  try {
    (void)plan_generate(o);
    ADD_FAILURE() << "a budget beyond the device accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "memory-budget");
    EXPECT_NE(std::string(e.what()).find("is more than device"), std::string::npos) << e.what();
  }
  o.memory_budget = 1 << 20;  // 1 MiB: nothing fits
  try {
    (void)plan_generate(o);
    ADD_FAILURE() << "1 MiB accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_NE(std::string(e.what()).find("the smallest budget that runs it"), std::string::npos) << e.what();
  }
  // Host memory for the swapped or streamed weights: a host budget of 1 MiB leaves only the resident plan.
  o.memory_budget = 0;
  o.host_memory_budget = 1 << 20;
  EXPECT_EQ(plan_generate(o).residency_name, "resident");
}

// The server's resident models on the GPU (pipeline/model_cache.h): the second run of equal settings
// takes the text encoder, the DiT (with its CUDA graphs) and the VAE's weights from the cache, planned as
// the device's owner, and gives the uncached run's latents and video byte for byte; so do a shorter run on
// the same DiT and a run whose budget streams the blocks, after which the resident DiT of the first settings is rebuilt.
TEST(MemoryBudgetGpu, ResidentModelsGiveTheUncachedRunsBytes) {
  REQUIRE_GPU();
  test::TempDir t{"model_cache_gpu"};
  GenerateOptions o = tiny(t);
  o.prompt_embeds_file.clear();
  o.negative_embeds_file.clear();
  o.prompt = "a red fox";
  o.decode = true;
  const GenerateResult plain = run_generate(plan_generate(o), {});
  o.plan_as_owner = true;
  ModelCache cache;
  for (int i = 0; i < 2; ++i) {
    const GenerateResult r = run_generate(plan_generate(o), {}, true, &cache);
    EXPECT_TRUE(same_bytes(r.latents, plain.latents)) << "run " << i;
    EXPECT_TRUE(same_bytes(r.video, plain.video)) << "run " << i;
  }
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused, 3u);
  // Fewer frames run on the same DiT (its arena and graphs work per shape within the plan): new CUDA
  // graphs, no new model, the uncached run's bytes.
  GenerateOptions shorter = o;
  shorter.frames = 5;
  shorter.plan_as_owner = false;
  const GenerateResult plain_short = run_generate(plan_generate(shorter), {});
  shorter.plan_as_owner = true;
  const GenerateResult rs = run_generate(plan_generate(shorter), {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused, 6u);
  EXPECT_TRUE(same_bytes(rs.latents, plain_short.latents));
  EXPECT_TRUE(same_bytes(rs.video, plain_short.video));
  // Embeddings and latents only, so the denoise stage is the plan's peak (the tiny text encoder's stage
  // is larger, and a decode plans its VAE at an upper bound).
  GenerateOptions streamed = tiny(t);
  streamed.plan_as_owner = true;
  const GeneratePlan p0 = plan_generate(streamed);
  streamed.memory_budget = static_cast<int64_t>(p0.memory->peak(p0.device)) - 1 + (int64_t{1} << 30);  // + the
  // context margin a server's plan sets aside
  const GeneratePlan ps = plan_generate(streamed);
  EXPECT_NE(ps.residency_name, "resident");
  const GenerateResult s = run_generate(ps, {}, false, &cache);
  EXPECT_TRUE(same_bytes(s.latents, run_generate(plan_generate(tiny(t)), {}, false).latents));  // uncached, resident
  EXPECT_GE(cache.stats.evicted, 1u);  // the resident DiT made way for the streamed one
  printf("  model cache: built %llu, reused %llu, evicted %llu\n", (unsigned long long)cache.stats.built,
         (unsigned long long)cache.stats.reused, (unsigned long long)cache.stats.evicted);
}
