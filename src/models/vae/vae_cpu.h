// The Wan 2.1 and Wan 2.2 video VAEs on the CPU, float32 (spec §5, §6, §9 items 13-14).
// Weights are named and shaped as in the official WanVAE_ state dict; the layout code maps other
// checkpoint styles (diffusers AutoencoderKLWan) to those names and hands tensors over through a
// callback. Execution reproduces the official chunked causal evaluation with the feature cache
// (CACHE_T = 2): the encoder runs on pixel chunks of 1, 4, 4, ... frames, the decoder on one latent
// frame at a time, including the skipped first time_conv of every temporal resampler, the "Rep"
// rule of upsample3d and the first-chunk frame drop of Wan 2.2's DupUp3D shortcut.
// Invariants: batch 1; public tensors are [C, T, H, W] (PyTorch order without the batch dim);
// all maths in float32 (weights of any float dtype are up-cast at load).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/config.h"
#include "models/vae/vae_tiling.h"
#include "models/vae/weights.h"

namespace wan {

// Called after each chunk with (chunks done, chunks total); may be empty.
using VaeProgress = std::function<void(int, int)>;

// latents [z, T_lat, H_lat, W_lat], normalised (any float dtype) -> video [3, F, H, W] float32 with
// F = 1 + 4 (T_lat - 1), H = 8 H_lat (16 for Wan 2.2): un-normalise (z / (1/std) + mean), conv2,
// decode one latent frame at a time, un-patchify, clamp to [-1, 1] unless clamp is false.
Tensor vae_decode(const VaeConfig& c, const VaeWeights& w, const Tensor& latents, bool clamp = true,
                  const VaeProgress& progress = {});
// vae_decode in the spatial tiles of `tiling` (vae_tiling.h): each tile decoded unclamped by vae_decode,
// blended, then clamped. One tile (tiling off, or a tile as large as the latents) is vae_decode itself.
// progress counts (tile, latent frame) chunks.
Tensor vae_decode_tiled(const VaeConfig& c, const VaeWeights& w, const Tensor& latents, const VaeTiling& tiling,
                        bool clamp = true, const VaeProgress& progress = {});
// An upper bound of the host bytes vae_decode allocates for latents [z, T, h, w] besides the weights:
// the causal caches (2 frames per temporal convolution at its resolution), the largest chunk's working
// tensors (6 of the widest at each resolution) and the video twice (frame-major and the returned copy).
// Plain arithmetic on the config, for refusing a decode that cannot fit before it starts.
size_t vae_decode_bytes(const VaeConfig& c, int64_t T, int64_t h, int64_t w);

// video [3, F, H, W] in [-1, 1] (any float dtype), F = 1 + 4k, H and W multiples of the spatial
// factor -> normalised posterior mean [z, T_lat, H_lat, W_lat] float32: patchify, encode chunks of
// 1, 4, 4, ... frames, conv1, take the mean half, (mu - mean) * (1/std).
Tensor vae_encode(const VaeConfig& c, const VaeWeights& w, const Tensor& video, const VaeProgress& progress = {});

}  // namespace wan
