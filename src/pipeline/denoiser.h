// The DiT as the sampling loop sees it: one forward of an expert on a batch (cond[, uncond]) of the
// same latent. Two implementations: the CPU float32 reference (wan::dit_forward) and, in CUDA builds,
// the GPU engine (wan::cuda::DiTGpu: bf16 numerics, both experts resident, CUDA graphs).
// Invariants: make_denoiser() does all loading (and, on the GPU, the memory-fit check) before the
// first step; forward() writes batch × numel(x) floats to out, cond first.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "core/tensor.h"
#include "sampler/sampler.h"
#include "vae/vae.h"

namespace wan {

class Denoiser {
 public:
  virtual ~Denoiser() = default;
  // x [z, T, H, W] f32; ctx [batch, rows, text_dim] f32 with lens[b] real rows; out [batch, z, T, H, W].
  virtual void forward(Expert e, const Tensor& x, int batch, float t, const Tensor& ctx,
                       const std::vector<int64_t>& lens, float* out) = 0;
};

struct DenoiserSpec {
  std::string device = "cpu";  // "cpu" | "cuda" | "cuda:<i>"
  bool use_high = true, use_low = true;
  Shape latent_shape;          // [z, T, H, W]: the GPU arena is planned for it (batch 2)
  bool verbose = false;        // print the GPU memory plan
};

// Loads the experts the schedule uses (CPU f32, or uploaded to the GPU).
std::unique_ptr<Denoiser> make_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec);

// Parses "cuda" / "cuda:<i>" (device index) or "cpu" (-1); throws wan::Error otherwise.
int parse_device(const std::string& device);
// Throws one clear wan::Error unless the CUDA path can run `spec` on this machine: built with CUDA, the
// device exists, and the planned memory (experts + arena) fits its free memory. Cheap (no allocation).
void check_gpu_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec);

// The VAE decode on the GPU (Wan 2.1 VAE, bf16, wan::cuda::VaeDecoderGpu).
// check_gpu_vae: throws one clear wan::Error unless this build and VAE can decode on `device`.
void check_gpu_vae(const VaeConfig& vae, const std::string& device);
// latents [z, T, h, w] f32 (host) -> video [3, F, H, W] f32 in [-1, 1] (host).
Tensor gpu_vae_decode(const VaeConfig& vae, const VaeWeights& w, const Tensor& latents, int device);

}  // namespace wan
