// The model components of a checkpoint as the pipeline uses them: configurations (read from the
// checkpoint's config files, else inferred from tensor shapes), loaders (f32 CPU weights through
// the layout's WeightStore), prompt encoding, and the sampling settings a diffusers folder declares.
// Invariants: the *_config_for() functions only read config files and tensor headers (cheap: the
// pipeline calls them while validating, before any heavy work); the loaders check every shape.
#pragma once
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "lora/lora.h"
#include "models/config.h"
#include "models/dit/dit_cpu.h"
#include "text/tokenizer.h"
#include "models/umt5/umt5_cpu.h"
#include "models/vae/vae_cpu.h"

namespace wan {

namespace cuda {
class DeviceLoader;  // runtime/load_gpu.h (CUDA builds)
}

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
int64_t vae_f32_bytes(const VaeConfig& c);

// ---- loading (f32 on the CPU) ----
// With `lora`, the terms it holds are merged into the f32 weights (lora.h with_lora / apply_lora_cpu).
DiTWeights load_dit(const CheckpointInfo& info, Role role, std::shared_ptr<const LoraSet> lora = nullptr);
VaeWeights load_vae(const CheckpointInfo& info, const VaeConfig& cfg);

// ---- prompt -> token ids ----
// The checkpoint's tokenizer (official cleaning, EOS, at most max_tokens tokens), or, without a tokenizer
// file (`--weights random` only), the stand-in: the UTF-8 bytes b of the cleaned prompt as ids 3 + b
// (3 + b mod (vocab - 3) for a vocabulary under 259 ids; UMT5's pad/EOS/unk are 0/1/2), at most
// max_tokens - 1 of them, then EOS (1). The ids are not the real tokenizer's, so the text is not
// understood (the weights are random anyway); what a timing depends on, the number of tokens, is about
// that of real text. max_tokens is the DiT's text_len (the official code tokenizes to it), at most 512
// (the text encoder's length). A longer prompt is cut, with a warning that says how many tokens went.
struct PromptTokenizer {
  std::optional<text::Tokenizer> tokenizer;  // nullopt: the stand-in
  int vocab = 0;                             // the text encoder's embedding rows
  int max_tokens = 512;                      // EOS included
  std::vector<int32_t> ids(const std::string& prompt) const;
};
// With the checkpoint's tokenizer when `info` has one, else the stand-in (when allowed); max_tokens from
// info's DiT config.
PromptTokenizer load_prompt_tokenizer(const CheckpointInfo* info, int vocab, bool allow_stand_in);
// `dropped` (optional) gets the number of tokens cut off.
std::vector<int32_t> stand_in_token_ids(const std::string& prompt, int vocab, int max_tokens = 512,
                                        int* dropped = nullptr);

struct TextEncoder {
  T5Config cfg;
  T5Weights weights;
  PromptTokenizer tokens;
};
// Needs the checkpoint's text encoder and tokenizer components.
TextEncoder load_text_encoder(const CheckpointInfo& info);
// Tokenize and encode: [L, dim] f32 for the L real tokens.
Tensor encode_prompt(const TextEncoder& te, const std::string& prompt);

// ---- `--weights random`: every weight drawn from the engine RNG at the real sizes, no files ----
// Component seeds of --weights-seed S (the component names of `wan make-checkpoint`): the experts
// dit_seed(S, task, high), the text encoder component_seed(S, "t5"), the VAE component_seed(S, "vae").
uint64_t random_expert_seed(uint64_t seed, Task task, bool high_noise);
uint64_t random_t5_seed(uint64_t seed);
uint64_t random_vae_seed(uint64_t seed);
// Host copies of the random weights. The DiT and the text encoder with the engine's rule (normal_draw of
// each row's init rule, keyed by random_weight_key(seed, name), rounded to the row's device dtype):
// bit-identical to the GPU's draw. The VAE with make-checkpoint's rule (fill_init, f32) for both devices:
// it is small (0.5 GB at the real size).
Tensor random_dit_tensor(const DiTConfig& c, uint64_t expert_seed, const std::string& name);
DiTWeights random_dit_weights(const DiTConfig& c, uint64_t expert_seed, std::shared_ptr<const LoraSet> lora = nullptr);
T5Weights random_t5_weights(const T5Config& c, uint64_t t5_seed);
VaeWeights random_vae_weights(const VaeConfig& c, uint64_t vae_seed);
TextEncoder random_text_encoder(const T5Config& c, uint64_t t5_seed, PromptTokenizer tokens);

// ---- GPU text encoder (CUDA builds; src/pipeline/text_gpu.cpp) ----
// UMT5 on the GPU in bf16 (wan::cuda::T5EncoderGpu) with a tokenizer. Destroying it frees its device
// memory: the pipeline destroys it before the DiT is created unless --keep-text-encoder.
class GpuTextEncoder {
 public:
  virtual ~GpuTextEncoder() = default;
  virtual Tensor encode(const std::string& prompt) = 0;             // [L, dim] f32 host
  virtual Tensor encode_ids(const std::vector<int32_t>& ids) = 0;   // same, from token ids
  // The tokenizer encode() uses (one made without it, by the fast start, gets it once loaded).
  virtual void set_tokenizer(PromptTokenizer tokens) = 0;
  virtual size_t device_bytes() const = 0;                         // weights on the device
};
// Weights streamed from the checkpoint's text encoder file (runtime/load_gpu.h: host memory is the
// loader's staging ring), or drawn on the GPU (random, with random_t5_seed(S) as the seed). With
// `loader` (not started) the checkpoint's weights are only added to it as completion group
// `loader_group`: encode only after the caller has waited for that group.
std::unique_ptr<GpuTextEncoder> make_gpu_text_encoder(const CheckpointInfo& info, const T5Config& c, bool random,
                                                      uint64_t t5_seed, PromptTokenizer tokens, int device,
                                                      cuda::DeviceLoader* loader = nullptr, int loader_group = 0);
// Device bytes of the GPU text encoder: weights, the 512-token activation arena and its reserve
// (cuda::T5EncoderGpu::device_bytes), an input of the run-level plan, which checks the fit. Throws
// one clear wan::Error in a build without CUDA.
size_t gpu_text_encoder_bytes(const T5Config& c);
// Device memory in use (cudaMemGetInfo: total - free) on `device`; 0 without CUDA or device.
int64_t gpu_memory_in_use(int device);
// Free device memory on `device` now (cudaMemGetInfo); throws wan::Error without CUDA.
size_t gpu_free_bytes(int device);
// Starts creating the CUDA context of `device` on another thread, so that it overlaps reading the
// checkpoint's headers and configs; the first CUDA call elsewhere waits for it, and so does the
// returned future's destructor. Errors are left to the next CUDA call. Without CUDA: nothing to do.
std::future<void> gpu_prewarm(int device);
// The GPU VAE decode (as gpu_vae_decode) that also reports the device memory in use while the
// decoder is alive (after its arena is allocated and after decoding) through *in_use_peak (max with
// the value there).
Tensor gpu_vae_decode_tracked(const VaeConfig& vae, const VaeWeights& w, const Tensor& latents, int device,
                              int64_t* in_use_peak);

// A GPU VAE decoder planned ahead of its use: the planning (weights packed, convolution plans) is host
// work that takes no device memory, so it runs on a host thread while the DiT still holds the device,
// and the decode later only allocates and runs.
class GpuVaeDecoder {
 public:
  virtual ~GpuVaeDecoder() = default;
  // Decodes latents [z, T, h, w] of the planned h, w, allocating the decoder on the first call. The
  // device memory in use while it is alive goes to *in_use_peak (max with the value there). Without
  // `rgb`: returns the video [3, F, H, W] float32. With `rgb` ([F, H, W, 3] uint8, the caller's): the
  // frames go there quantised as formats/video.h does, chunk by chunk as the decode produces them,
  // `ready(n)` saying frames [0, n) are in place (called on this thread; what it throws ends the
  // decode), and the returned tensor is undefined. A tiled decoder takes no `rgb` (its tiles are blended on
  // the host once all are decoded) and calls ready(n) after each tile with the chunks (latent frames of
  // every tile) done so far.
  virtual Tensor decode(const Tensor& latents, int64_t* in_use_peak, uint8_t* rgb,
                        const std::function<void(int ready)>& ready) = 0;
};
// Plans on `device` (the caller's thread may be any). With `tiling` of more than one tile over latent_h x
// latent_w (vae_tiling.h), one decoder planned for the tile decodes them all (VaeDecoderGpu::decode_tiled).
// Throws wan::Error without CUDA.
std::unique_ptr<GpuVaeDecoder> plan_gpu_vae_decoder(const VaeConfig& vae, const VaeWeights& w, int64_t latent_h,
                                                    int64_t latent_w, int device, const VaeTiling& tiling = {});

}  // namespace wan
