// The GPU VAE's weights (internal to vae_gpu*.cpp): host-side packing of a Wan 2.1 / 2.2 encoder or
// decoder into one device allocation, bf16 filters in the layout each convolution mode reads, fp32
// biases, gammas, the top-level 1×1×1 conv and the latent statistics. Offsets are kAlign-aligned; the
// walk order is the coder's, so error messages name the official weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/config.h"
#include "models/vae/vae_gpu.h"
#include "models/vae/weights.h"

namespace wan::cuda::vae_gpu_detail {

constexpr size_t kAlign = 256;
inline size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct DevConv {
  size_t w = 0, b = 0;                       // offsets in the weight allocation
  int64_t cin = 0, cout = 0, cout_pad = 0;   // cin: stored (padded) input channels; cout_pad: stored outputs
  int kt = 1, kh = 1, kw = 1;
};
struct DevRes {
  size_t g1 = 0, g2 = 0;  // fp32 gammas [cin], [cout]
  DevConv c1, c2, sc;
  bool has_sc = false;
  int64_t cin = 0, cout = 0;
};
struct DevAttn {
  size_t g = 0;
  DevConv qkv, proj;  // 1×1: bf16 [3C, C] and [C, C]
  int64_t C = 0;
};
// One encoder down stage / decoder up stage. rs: up-samplers a 3×3 2-D conv [cout, 3, 3, cin];
// down-samplers the ZeroPad(0, 1, 0, 1) + stride-2 3×3 conv as a stride-2 4×4 conv with padding 1 whose
// first filter row and column are zero (same outputs, symmetric padding for cuDNN). tc: time_conv
// [cout, 3, 1, 1, cin]. Wan 2.2's parameter-free shortcut over the whole stage: AvgDown3D (encoder) or
// DupUp3D (decoder) to sc_out channels with factors sc_ft (time) and sc_fs (space).
struct DevStage {
  std::vector<DevRes> res;
  VaeResampleMode mode = VaeResampleMode::None;
  DevConv rs, tc;
  bool shortcut = false;
  int64_t cin = 0, sc_out = 0;
  int sc_ft = 1, sc_fs = 1;
};
// One coder with its top-level 1×1×1 conv (decoder: conv2 [z, z] on the latents; encoder: conv1 [2z, 2z]
// on the head's output) in fp32, and the latent statistics (1/std as the reference stores it, mean).
// Encoder: conv1, stages, middle, head; decoder: conv1, middle, stages, head.
struct DevVae {
  int version = 21, patch = 1;
  int64_t z = 16;
  int64_t in_pad = 16;  // conv1's stored input channels: z (decoder), 3·patch² padded to 8 (encoder)
  DevConv conv1;
  DevRes mid0, mid2;
  DevAttn mid1;
  std::vector<DevStage> stages;
  size_t head_g = 0;
  DevConv head;  // decoder: 3·patch² outputs padded to a multiple of 8; encoder: 2z
  size_t top_w = 0, top_b = 0, inv_std = 0, mean = 0;
};

// Check and pack the decoder (with top-level conv2) or the encoder (with top-level conv1) weights for
// `mode`: return the offsets, and the bytes of the weight allocation in `bytes`. Throw wan::Error on
// inconsistent weights. With `sized` only the shapes are checked and laid out (the values are never
// read): *sized gets the allocation's size and `bytes` is left alone.
DevVae pack_decoder(const VaeConfig& config, const VaeWeights& weights, VaeConvMode mode, std::vector<uint8_t>& bytes,
                    size_t* sized = nullptr);
DevVae pack_encoder(const VaeConfig& config, const VaeWeights& weights, VaeConvMode mode, std::vector<uint8_t>& bytes,
                    size_t* sized = nullptr);

}  // namespace wan::cuda::vae_gpu_detail
