// Models kept from one run to the next (wan serve's resident models): the text encoder (GPU or CPU), the
// DiT (a Denoiser: weights, activation arena, GEMM / attention plans and CUDA graphs) and the VAE's host
// weights, each under a key that names everything it was built from, so a run reuses only a model it
// would have built the same way (bit-identical results). run_generate(plan, hooks, decode, &cache) takes
// matching models from the cache and leaves what it built there.
// Device memory: a run was planned as if the device were its own (GenerateOptions::plan_as_owner);
// before each stage that allocates, make_room frees cached models that stage does not use (the text
// encoder first, then the DiT) until the device has the bytes the stage needs. The CPU keeps its f32
// models only while they fit half of the host's memory.
// Invariants: a key mismatch frees the old model before the new one loads; not thread-safe (one worker).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "pipeline/denoiser.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"

namespace wan {

struct ModelCacheStats {
  uint64_t built = 0;    // models built by runs that had a cache (text encoder, DiT, VAE weights)
  uint64_t reused = 0;   // models a run took from the cache
  uint64_t evicted = 0;  // models freed to make room or on a key change
};

struct ModelCache {
  std::string text_key, dit_key, vae_key;
  // The latent elements (T·H·W) the cached DiT was planned for: it serves any run of its key whose latent
  // is no larger (the GPU arena and CUDA graphs work per shape within the plan), so one DiT serves every
  // request shape up to the largest seen so far; a larger one rebuilds it at that shape.
  int64_t dit_latent = 0;
  std::unique_ptr<GpuTextEncoder> text_gpu;
  std::shared_ptr<TextEncoder> text_cpu;
  std::unique_ptr<Denoiser> dit;
  std::shared_ptr<const VaeWeights> vae;
  ModelCacheStats stats;

  void drop_text();
  void drop_dit();
  void clear();
};

// Loads the models a run of `p` uses into the cache without running it (wan serve at start): the DiT
// (and its CUDA graphs), the VAE's weights, and the text encoder when the device keeps room for it next to
// the DiT and the VAE decoder. A later run of a plan with equal keys builds nothing.
void preload_models(const GeneratePlan& p, ModelCache& cache);

namespace pipeline_detail {

// What a model of the plan is built from; equal keys build bit-identical models. The DiT's key leaves out
// the latent shape and the weights' residency, which change no result (dit_serves decides reuse), but
// names the memory budgets: a DiT planned within a budget for a larger latent fits it for a smaller one.
std::string text_cache_key(const GeneratePlan& p);
std::string dit_cache_key(const GeneratePlan& p);
// Whether the cached DiT (key `key`) can run p: the same key and a plan at least as large as p's latent.
bool dit_serves(const ModelCache& c, const GeneratePlan& p, const std::string& key);
// Puts a run's DiT back into the cache. One the cache did not serve (drop_dit ran first, so dit_latent is 0)
// was built for p's latent shape; a reused one keeps the shape it was planned for.
void keep_dit(ModelCache& c, const GeneratePlan& p, const std::string& key, std::unique_ptr<Denoiser> dit);
std::string vae_cache_key(const GeneratePlan& p);
// GPU `gpu`: frees the cached text encoder, then the cached DiT, while fewer than `bytes` are free.
// Nothing on the CPU (gpu < 0).
void make_room(ModelCache& c, int gpu, int64_t bytes);
// The CPU keeps its f32 models only while the text encoder's and both experts' weights fit half the host.
bool cpu_may_keep(const GeneratePlan& p);
// The run's VAE weights: the cache's when the key matches, else read (or drawn) and kept there.
VaeWeights cached_vae_weights(const GeneratePlan& p, ModelCache* c);

}  // namespace pipeline_detail
}  // namespace wan
