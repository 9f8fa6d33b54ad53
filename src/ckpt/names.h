// One internal naming for every checkpoint layout: the official Wan2.2 PyTorch module names
// (spec §3.2, §4.4, §5). These functions map diffusers / Hugging Face names to and from it.
// Each returns "" when the name is not part of the component (an unexpected tensor).
#pragma once
#include <string>

namespace wan {
// DiT: diffusers WanTransformer3DModel <-> official WanModel (spec §3.3, including the norm2/norm3 swap).
std::string dit_diffusers_to_official(const std::string& name);
std::string dit_official_to_diffusers(const std::string& name);
// UMT5 encoder: HF UMT5EncoderModel <-> official T5Encoder (spec §4.5).
std::string t5_hf_to_official(const std::string& name);
std::string t5_official_to_hf(const std::string& name);
// Wan VAE (2.1 and 2.2): diffusers AutoencoderKLWan <-> official WanVAE_ (spec §5, §6).
std::string vae_diffusers_to_official(const std::string& name, int version);
std::string vae_official_to_diffusers(const std::string& name, int version);
}  // namespace wan
