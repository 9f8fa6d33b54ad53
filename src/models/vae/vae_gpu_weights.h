// The GPU VAE decoder's weights (internal to vae_gpu*.cpp): host-side packing of a Wan 2.1 decoder
// into one device allocation, bf16 filters in the layout each convolution mode reads, fp32 biases,
// gammas and the latent statistics. Offsets are kAlign-aligned; the walk order is the decoder's, so
// error messages name the official weights.
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
  int64_t cin = 0, cout = 0, cout_pad = 0;   // cout_pad: channels of the stored filter / output
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
struct DevStage {
  std::vector<DevRes> res;
  VaeResampleMode mode = VaeResampleMode::None;
  DevConv rs, tc;  // resample.1 (2-D 3×3), time_conv (3×1×1)
};
struct DevDecoder {
  DevConv conv1;
  DevRes mid0, mid2;
  DevAttn mid1;
  std::vector<DevStage> stages;
  size_t head_g = 0;
  DevConv head;
  size_t conv2_w = 0, conv2_b = 0, inv_std = 0, mean = 0;  // fp32 [16, 16], [16], [16], [16]
};

// Checks and packs the decoder (and top-level conv2) weights for `mode`: returns the offsets, and
// the bytes of the weight allocation in `bytes`. Throws wan::Error on inconsistent weights. With `sized`
// only the shapes are checked and laid out (the values are never read): *sized gets the allocation's
// size and `bytes` is left alone.
DevDecoder pack_decoder(const VaeConfig& config, const VaeWeights& weights, VaeConvMode mode,
                        std::vector<uint8_t>& bytes, size_t* sized = nullptr);

}  // namespace wan::cuda::vae_gpu_detail
