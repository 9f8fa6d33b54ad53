// The Wan 2.1 and Wan 2.2 VAE encoders on one GPU in bf16 (spec §5.4, §6), with the reference's
// chunked causal execution (vae_encode in vae_cpu.h is the numerics contract): pixel chunks of 1, 4,
// 4, ... frames, a 2-frame cache per temporal-kernel-3 convolution, downsample3d's skipped first
// time_conv and kept last frame, Wan 2.2's patchify and AvgDown3D stage shortcuts; each chunk yields
// one latent frame, normalised as the posterior mean (mu - mean) · (1/std).
//
// Memory is planned as the decoder's (vae_gpu.h): create() walks the first chunk and a later one on
// shapes only, then makes one weight allocation and one arena; encode() allocates nothing. The plan
// depends on the frame size only; any frame count 1 + 4k encodes.
//
// Invariants: encode() is deterministic (the same video gives bit-identical latents); all work is
// enqueued on the caller's stream; the object is not thread-safe. Released configurations only, as
// the decoder. Options (conv mode, algorithm search, poison, self-check, profile) are the decoder's.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "models/config.h"
#include "models/vae/vae_gpu.h"
#include "models/vae/weights.h"

namespace wan::cuda {

// Numerics: bf16 conv/attention weights and activations (the patchified input frames included) with
// fp32 accumulation; biases, norm gammas, RMS norm statistics, SiLU, residual sums, the AvgDown3D
// averages and softmax in fp32 with one rounding per stored activation; the top-level conv1 (1×1×1),
// the mean half and the normalisation in fp32 from the head's bf16 output.
class VaeEncoderGpu {
 public:
  // Uploads the encoder (and top-level conv1) weights of a Wan 2.1 or 2.2 VAE (any float dtype,
  // converted on the host) and plans the arena for latent frames of `shape` (input frames of
  // sf·height x sf·width pixels, sf = 8 for Wan 2.1, 16 for Wan 2.2). Throws wan::Error on an
  // unsupported configuration, inconsistent weights, or when the plan does not fit in free device memory.
  static std::unique_ptr<VaeEncoderGpu> create(const VaeConfig& config, const VaeWeights& weights, VaeGpuShape shape,
                                               const VaeGpuOptions& options = {});
  // The device bytes create() would need (weights + arena + reserve), planned on the config's shapes
  // alone (no weights read, nothing allocated on the device; cuDNN is asked for its workspaces on the
  // current device). Throws wan::Error on an unsupported configuration.
  static size_t device_bytes(const VaeConfig& config, VaeGpuShape shape, const VaeGpuOptions& options = {});
  ~VaeEncoderGpu();
  VaeEncoderGpu(const VaeEncoderGpu&) = delete;
  VaeEncoderGpu& operator=(const VaeEncoderGpu&) = delete;

  // video: device fp32 [3, F, sf·h, sf·w] in [-1, 1] (PyTorch order), F = 1 + 4k -> latents: device fp32
  // [z, T, h, w], T = 1 + (F - 1) / 4. Enqueued on `stream`; returns without synchronising (except with
  // profile or self_check, which synchronise at the end).
  void encode(const float* video, int64_t F, float* latents, cudaStream_t stream);
  // Host convenience: video [3, F, H, W] (any float dtype) -> latents [z, T, h, w] float32.
  Tensor encode(const Tensor& video);

  int64_t latent_frames(int64_t F) const;  // 1 + (F - 1) / 4
  int64_t z_dim() const;
  int spatial_factor() const;  // input pixels per latent pixel (8 or 16)
  size_t weight_bytes() const;
  size_t arena_bytes() const;
  std::string plan_str() const;
  std::string profile_report() const;  // with options.profile, of the last encode
  std::string find_report() const;     // with options.find_algorithms
  float self_check_max_err() const;    // with options.self_check, of the last encode
  int64_t self_check_nonfinite() const;
  int64_t conv_calls_checked() const;

  struct Impl;

 private:
  explicit VaeEncoderGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wan::cuda
