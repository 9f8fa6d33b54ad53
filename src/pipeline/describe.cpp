// GeneratePlan::describe(): the plan as the lines `wan generate` prints before it runs (weights, device,
// video, sampler, experts, LoRAs, seed, prompts, memory; with --verbose the run memory plan).
#include "pipeline/pipeline.h"

#include <sstream>

#include "core/error.h"
#include "pipeline/host_memory.h"
#include "pipeline/models.h"
#include "pipeline/pipeline_internal.h"
#include "runtime/memory_plan.h"

namespace wan {

std::string GeneratePlan::describe() const {
  std::ostringstream os;
  if (random_weights) {
    os << "weights  RANDOM (seed " << weights_seed << ", " << ckpt.root << ", DiT " << ckpt.dit.num_layers
       << " layers): every weight drawn from the engine RNG, the video is noise (for timings)\n";
    if (ckpt.has(Role::DiTHigh) || ckpt.has(Role::DiT) || ckpt.has(Role::Tokenizer))
      os << "model    " << ckpt.root << " (sizes" << (ckpt.has(Role::Tokenizer) ? " and tokenizer" : "") << " only)\n";
  } else {
    os << "model    " << ckpt.root << " (" << layout_name(ckpt.layout) << ", " << task_name(task) << ")\n";
  }
  if (device == "cpu") {
    os << "device   cpu (float32 reference)\n";
  } else {
    os << "device   " << device << " (" << (text_on_gpu ? "text encoder, " : "") << "DiT and VAE decode in bf16";
    os << "; attention " << (attention == "auto" ? "auto: own on sm_90, else cuDNN" : attention);
    if (gemm == "fp8") os << "; FP8 block GEMMs (e4m3 weights, per-token inputs)";
    if (text_on_gpu)
      os << (keep_text_encoder ? "; text encoder resident next to the DiT"
             : fast_start      ? "; text encoder freed before the DiT's activations"
                               : "; text encoder freed before the DiT loads");
    if (fast_start) os << "; weights streamed to the GPU together, warm-up during the load";
    os << ")\n";
  }
  os << "video    " << width << "x" << height << ", " << frames << " frames at " << fps << " fps; latents "
     << latent_shape.str() << ", " << seq_len << " tokens\n";
  if (image.defined())
    os << "image    " << image_file << (last_image.defined() ? cat(" -> ", last_image_file) : "") << ": " << image_sizing
       << "\n";
  os << "sampler  " << solver_name(sampler.solver) << ", " << sampler.steps << " steps, ";
  if (sampler.timesteps.empty()) os << schedule_name(sampler.schedule) << " schedule";
  else os << "timesteps list";
  os << ", shift " << sampler.shift << ", timesteps " << schedule.model_t.front();
  if (schedule.model_t.size() > 1) os << " .. " << schedule.model_t.back();
  if (sampler.bf16_latents) os << ", bf16 latents";
  if (!preset.empty()) os << " (preset " << preset << ")";
  os << "\n";
  const int high = experts.num_high(), low = static_cast<int>(experts.steps.size()) - high;
  auto steps = [](int n) { return cat(n, n == 1 ? " step" : " steps"); };
  os << "experts  high-noise " << steps(high) << " (guide " << guide_high << "), low-noise " << steps(low) << " (guide "
     << guide_low << "), boundary " << boundary << "\n";
  os << pipeline_detail::describe_lora(*this);
  if (init_latents.defined()) os << "seed     unused (initial latents given)\n";
  else os << "seed     " << seed << (seed_random ? " (random)" : seed_from_state ? " (from the state)" : "") << "\n";
  auto text = [&](const Tensor& e, const std::string& s) {
    if (e.defined()) return cat("embeddings, ", e.dim(0), " tokens");
    if (s.size() <= 60) return cat("\"", s, "\"");
    size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // UTF-8 boundary
    return cat("\"", s.substr(0, cut), "...\"");
  };
  const char* tokens = stand_in_tokens && needs_text_encoder ? " (stand-in tokens: UTF-8 bytes, no tokenizer file)" : "";
  if (resume) {
    os << "prompt   " << text(prompt_embeds, prompt) << " (from the state)\n";
    os << "negative " << text(negative_embeds, negative_prompt) << " (from the state)\n";
  } else {
    os << "prompt   " << text(prompt_embeds, prompt) << tokens << "\n";
    os << "negative " << text(negative_embeds, negative_prompt) << tokens << "\n";
  }
  if (resume) os << "resume   " << resume_file << ": continues after step " << resume->step << " of " << sampler.steps << "\n";
  if (stop_after_steps > 0)
    os << "stop     after step " << stop_after_steps << " of " << sampler.steps << " (state saved, no decode)\n";
  if (device == "cpu") {
    os << "memory   f32 weights: DiT " << human_bytes(dit_f32_bytes(ckpt.dit)) << " per expert";
    if (needs_text_encoder) os << ", text encoder " << human_bytes(t5_f32_bytes(t5));
    os << "; at most " << human_bytes(weights_peak_bytes) << " held at once\n";
  } else {
    os << "memory   device: DiT about " << human_bytes(dit_f32_bytes(ckpt.dit) / 2) << " per expert (bf16)";
    if (text_on_gpu)
      os << ", text encoder " << human_bytes(t5_device_bytes) << " (bf16 weights + activations"
         << (keep_text_encoder ? ", counted in the DiT's fit" : "") << ")";
    os << "; host: " << human_bytes(host_weights_bytes) << " of weights at most\n";
    if (verbose && text_on_gpu)
      os << "text enc " << t5.num_layers << " layers, dim " << t5.dim << ", vocab " << t5.vocab << ": "
         << t5_device_bytes << " bytes on the device (bf16 GEMM weights, fp32 norms and position tables, "
         << "activation headroom)\n";
    if (verbose && memory) os << memory->str();
    if (verbose && !memory_plan_note.empty()) os << "plan     device memory " << memory_plan_note << "\n";
  }
  if (vae_tiling.on() || (verbose && vae_device_bytes > 0))  // the decode's tiles (--vae-tile)
    os << "decode   " << pipeline_detail::vae_tiling_str(vae_tiling, vae, latent_shape) << "\n";
  return os.str();
}

}  // namespace wan
