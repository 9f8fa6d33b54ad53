// The model components of a checkpoint as the pipeline uses them: configurations (read from the
// checkpoint's config files, else inferred from tensor shapes), loaders (f32 CPU weights through
// the layout's WeightStore), prompt encoding, and the sampling settings a diffusers folder declares.
// Invariants: the *_config_for() functions only read config files and tensor headers (cheap: the
// pipeline calls them while validating, before any heavy work); the loaders check every shape.
#pragma once
#include <optional>
#include <string>

#include "ckpt/layout.h"
#include "config/config.h"
#include "dit/dit.h"
#include "text/tokenizer.h"
#include "text/umt5.h"
#include "vae/vae.h"

namespace wan {

// The official default negative prompt (spec §1.1), used whenever the negative prompt is empty.
extern const char* const kDefaultNegativePrompt;

// ---- configurations ----
// Wan VAE: the preset of info.vae_version, then the diffusers vae/config.json when there is one
// (widths, z_dim, stages, latents_mean / latents_std), else the widths from tensor shapes (the
// official Wan2.1_VAE.pth / Wan2.2_VAE.pth carry no config; their tables are the presets').
VaeConfig vae_config_for(const CheckpointInfo& info);
// UMT5 encoder: sizes from tensor shapes (vocab, widths, heads, layers, buckets); max_distance and
// eps from the diffusers text_encoder/config.json when there is one, else the umt5-xxl values.
T5Config t5_config_for(const CheckpointInfo& info);
// Diffusers folders only (nullopt otherwise or when absent): scheduler/scheduler_config.json
// "flow_shift" and model_index.json "boundary_ratio".
std::optional<double> diffusers_flow_shift(const CheckpointInfo& info);
std::optional<double> diffusers_boundary_ratio(const CheckpointInfo& info);

// Bytes of the f32 weights: a DiT expert, the text encoder, the VAE.
int64_t dit_f32_bytes(const DiTConfig& c);
int64_t t5_f32_bytes(const T5Config& c);

// ---- loading (f32 on the CPU) ----
DiTWeights load_dit(const CheckpointInfo& info, Role role);
VaeWeights load_vae(const CheckpointInfo& info, const VaeConfig& cfg);

struct TextEncoder {
  T5Config cfg;
  T5Weights weights;
  text::Tokenizer tokenizer;
};
// Needs the checkpoint's text encoder and tokenizer components.
TextEncoder load_text_encoder(const CheckpointInfo& info);
// Tokenize (official cleaning, EOS, 512 max) and encode: [L, dim] f32 for the L real tokens.
Tensor encode_prompt(const TextEncoder& te, const std::string& prompt);

}  // namespace wan
