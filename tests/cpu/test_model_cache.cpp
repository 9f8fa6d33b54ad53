// The resident models of consecutive runs (pipeline/model_cache.h, wan serve's ResidentRunner) on the CPU
// tiny random model: a second run with the same settings takes the text encoder, the DiT and the VAE's
// weights from the cache and gives the uncached run's latents and video byte for byte; a changed
// setting that shapes a model (a LoRA, the size) rebuilds that model only; a sampling change (seed,
// shift, prompt) rebuilds nothing.
#include <gtest/gtest.h>

#include <cstring>

#include "pipeline/model_cache.h"
#include "pipeline/pipeline.h"
#include "test_util.h"
#include "testing/make_lora.h"
#include "models/config.h"

using namespace wan;

namespace {

GenerateOptions tiny(uint64_t seed = 3) {
  GenerateOptions o;
  o.random_weights = true;
  o.weights_seed = 11;
  o.config = "tiny";
  o.prompt = "a red fox runs through the snow";
  o.width = 64;
  o.height = 48;
  o.frames = 5;
  o.steps = 3;
  o.seed = seed;
  return o;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST(ModelCache, ASecondRunReusesEveryModelAndGivesTheSameVideo) {
  ModelCache cache;
  const GenerateResult plain = run_generate(plan_generate(tiny()), {});
  const GenerateResult first = run_generate(plan_generate(tiny()), {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);  // text encoder, DiT, VAE weights
  EXPECT_EQ(cache.stats.reused, 0u);
  EXPECT_TRUE(cache.dit && cache.text_cpu && cache.vae);
  const GenerateResult second = run_generate(plan_generate(tiny()), {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused, 3u);
  for (const GenerateResult* r : {&first, &second}) {
    EXPECT_TRUE(same_bytes(r->latents, plain.latents));
    EXPECT_TRUE(same_bytes(r->video, plain.video));
  }
  // Sampling settings shape no model: nothing is rebuilt, and the result is the uncached one's. (The
  // step count can: it decides which experts the schedule uses.)
  GenerateOptions other = tiny(9);
  other.shift = 3.0;
  other.prompt = "a boat";
  const GenerateResult third = run_generate(plan_generate(other), {}, true, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_TRUE(same_bytes(third.video, run_generate(plan_generate(other), {}).video));
}

TEST(ModelCache, ASettingThatShapesAModelRebuildsOnlyThatModel) {
  test::TempDir t;
  ModelCache cache;
  (void)run_generate(plan_generate(tiny()), {}, false, &cache);
  ASSERT_EQ(cache.stats.built, 2u);  // latents only: no VAE
  // Another size: the DiT (planned for the latent shape) again; the text encoder stays.
  GenerateOptions wide = tiny();
  wide.width = 96;
  const GenerateResult w = run_generate(plan_generate(wide), {}, false, &cache);
  EXPECT_EQ(cache.stats.built, 3u);
  EXPECT_EQ(cache.stats.reused, 1u);
  EXPECT_EQ(cache.stats.evicted, 1u);
  EXPECT_TRUE(same_bytes(w.latents, run_generate(plan_generate(wide), {}, false).latents));
  // A LoRA changes the DiT's weights: rebuilt, and the run equals an uncached one with that LoRA.
  gen::MakeLoraOptions l;
  l.dit = plan_generate(tiny()).ckpt.dit;
  l.rank = 4;
  l.format = gen::LoraFormat::Kohya;
  l.dtype = DType::F32;
  l.seed = 5;
  l.up_std = 0.05f;
  l.out = t / "l.safetensors";
  gen::make_lora(l);
  GenerateOptions lora = tiny();
  lora.loras.push_back({l.out, 0.8f, LoraExpert::All});
  const GenerateResult a = run_generate(plan_generate(lora), {}, false, &cache);
  EXPECT_EQ(cache.stats.built, 4u);
  EXPECT_EQ(cache.stats.evicted, 2u);
  const GenerateResult b = run_generate(plan_generate(lora), {}, false);
  EXPECT_TRUE(same_bytes(a.latents, b.latents));
  EXPECT_FALSE(same_bytes(a.latents, run_generate(plan_generate(tiny()), {}, false).latents));
  cache.clear();
  EXPECT_FALSE(cache.dit || cache.text_cpu || cache.vae);
}
