// The resident models of consecutive runs (see model_cache.h): the cache's keys and its eviction.
#include "pipeline/model_cache.h"

#include "core/error.h"
#include "pipeline/host_memory.h"
#include "pipeline/pipeline_internal.h"
#include "pipeline/startup.h"

namespace wan {

void ModelCache::drop_text() {
  if (text_gpu || text_cpu) ++stats.evicted;
  text_gpu.reset();
  text_cpu.reset();
  text_key.clear();
}

void ModelCache::drop_dit() {
  if (dit) ++stats.evicted;
  dit.reset();
  dit_key.clear();
  dit_latent = 0;
}

void ModelCache::clear() {
  drop_text();
  drop_dit();
  vae.reset();
  vae_key.clear();
}

void preload_models(const GeneratePlan& p, ModelCache& c) {
  const int gpu = parse_device(p.device);
  if (gpu < 0 && !pipeline_detail::cpu_may_keep(p)) return;  // each run loads its own
  const std::string dit_key = pipeline_detail::dit_cache_key(p);
  const std::string text_key = pipeline_detail::text_cache_key(p);
  if (!pipeline_detail::dit_serves(c, p, dit_key)) {
    c.drop_dit();
    std::unique_ptr<Denoiser> dit;
    if (gpu >= 0 && p.fast_start) {
      // Checkpoint weights: the text encoder and the experts stream in together (pipeline/startup.h),
      // and a server's plan keeps the text encoder.
      c.drop_text();
      FastStart fs = gpu_fast_start(p, pipeline_detail::denoiser_spec(p), pipeline_detail::forward_uses(p, 0), {});
      dit = std::move(fs.dit);
      if (fs.text) {
        c.text_gpu = std::move(fs.text);
        c.text_key = text_key;
        ++c.stats.built;
      }
    } else {
      dit = make_denoiser(p.ckpt, pipeline_detail::denoiser_spec(p));
      if (gpu >= 0) dit->warm_up(pipeline_detail::forward_uses(p, 0), p.latent_shape);
    }
    pipeline_detail::keep_dit(c, p, dit_key, std::move(dit));
    ++c.stats.built;
  }
  (void)pipeline_detail::cached_vae_weights(p, &c);
  if (!p.needs_text_encoder || c.text_key == text_key) return;
  c.drop_text();
  const int64_t room = p.t5_device_bytes + p.vae_device_bytes;
  if (gpu >= 0 ? static_cast<int64_t>(gpu_free_bytes(gpu)) < room : !pipeline_detail::cpu_may_keep(p)) return;
  pipeline_detail::build_text_encoder(p, gpu, c.text_gpu, c.text_cpu);
  c.text_key = text_key;
  ++c.stats.built;
}

namespace pipeline_detail {

std::string text_cache_key(const GeneratePlan& p) {
  return cat(p.device, "|", p.ckpt.root, "|", p.t5.num_layers, "x", p.t5.dim, "|",
             p.random_weights ? cat("random ", p.weights_seed) : std::string("checkpoint"));
}

std::string dit_cache_key(const GeneratePlan& p) {
  const DenoiserSpec s = denoiser_spec(p);
  std::string loras;
  for (const LoraSpec& l : p.loras) loras += cat(l.path, ":", l.strength, ":", static_cast<int>(l.expert), ";");
  return cat(p.device, "|", p.ckpt.root, "|", s.use_high, s.use_low, "|", s.first_frame_t, "|", s.attention, "|",
             s.gemm, "|", s.random_weights ? cat("random ", s.seed_high, " ", s.seed_low) : std::string("checkpoint"),
             "|", p.ckpt.dit.num_layers, "|", loras, "|budget ", p.memory_budget, " ", p.host_memory_budget);
}

bool dit_serves(const ModelCache& c, const GeneratePlan& p, const std::string& key) {
  return c.dit && c.dit_key == key && p.latent_shape.numel() <= c.dit_latent;
}

void keep_dit(ModelCache& c, const GeneratePlan& p, const std::string& key, std::unique_ptr<Denoiser> dit) {
  if (c.dit_latent == 0) c.dit_latent = p.latent_shape.numel();  // 0: dropped, so built for this run
  c.dit = std::move(dit);
  c.dit_key = key;
}

std::string vae_cache_key(const GeneratePlan& p) {
  return cat(p.ckpt.root, "|", p.vae.z_dim, "x", p.vae.base_dim, "|",
             p.random_weights ? cat("random ", p.weights_seed) : std::string("checkpoint"));
}

void make_room(ModelCache& c, int gpu, int64_t bytes) {
  if (gpu < 0 || bytes <= 0) return;
  auto short_of_room = [&] { return static_cast<int64_t>(gpu_free_bytes(gpu)) < bytes; };
  if (c.text_gpu && short_of_room()) c.drop_text();
  if (c.dit && short_of_room()) c.drop_dit();
}

bool cpu_may_keep(const GeneratePlan& p) {
  const int64_t weights = 2 * dit_f32_bytes(p.ckpt.dit) + (p.needs_text_encoder ? t5_f32_bytes(p.t5) : 0);
  return weights <= physical_memory_bytes() / 2;
}

VaeWeights cached_vae_weights(const GeneratePlan& p, ModelCache* c) {
  if (!c) return run_vae_weights(p);
  const std::string key = vae_cache_key(p);
  if (c->vae && c->vae_key == key) {
    ++c->stats.reused;
    return *c->vae;
  }
  auto w = std::make_shared<const VaeWeights>(run_vae_weights(p));
  ++c->stats.built;
  c->vae = w;
  c->vae_key = key;
  return *w;
}

}  // namespace pipeline_detail
}  // namespace wan
