// THE weight table of the Wan 2.1 and Wan 2.2 VAEs (WanVAE_ of the official vae2_1.py / vae2_2.py,
// spec §5.3, §6.2), in registration order, and the loaded weights' structure. Only the released
// structure (4 stages, 2 residual blocks, 3 temporal flags) has a table. The CPU loader walks the same
// network (vae_tensor_specs in vae_weights.cpp); tests check the two name/shape lists are equal.
// The GPU decoder reads VaeWeights (bf16 filters made at upload), so device_dtype (F32: host weights) matters only to random draws.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/config.h"
#include "models/weight_spec.h"

namespace wan {

// Rows in registration order: RMS_norm gammas (Norm), conv weights and biases (Conv, ConvBias), each
// with PyTorch's default init. Throws wan::Error on an inconsistent config (vae_validate).
WeightTable vae_weight_table(const VaeConfig& c);

// A convolution's parameters: weight [Cout, Cin, kt, kh, kw] (CausalConv3d) or [Cout, Cin, kh, kw]
// (Conv2d); bias [Cout]. Undefined weight = absent module (e.g. an identity shortcut).
struct VaeConv {
  Tensor weight, bias;
  bool present() const { return weight.defined(); }
};

// ResidualBlock(Cin -> Cout): official "<prefix>.residual.{0,2,3,6}.*" and "<prefix>.shortcut.*".
struct VaeResBlock {
  Tensor norm1;        // residual.0.gamma  [Cin, 1, 1, 1]
  VaeConv conv1;       // residual.2        [Cout, Cin, 3, 3, 3]
  Tensor norm2;        // residual.3.gamma  [Cout, 1, 1, 1]
  VaeConv conv2;       // residual.6        [Cout, Cout, 3, 3, 3]
  VaeConv shortcut;    // shortcut          [Cout, Cin, 1, 1, 1], only when Cin != Cout
};

// AttentionBlock(C): official "<prefix>.{norm.gamma, to_qkv.*, proj.*}".
struct VaeAttnBlock {
  Tensor norm;         // norm.gamma [C, 1, 1]
  VaeConv to_qkv;      // [3C, C, 1, 1]
  VaeConv proj;        // [C, C, 1, 1]
};

enum class VaeResampleMode { None, Upsample2d, Upsample3d, Downsample2d, Downsample3d };

// Resample(dim, mode): official "<prefix>.resample.1.*" (Conv2d) and "<prefix>.time_conv.*".
struct VaeResample {
  VaeResampleMode mode = VaeResampleMode::None;
  VaeConv resample;    // resample.1: up [dim/2 (2.1) or dim (2.2), dim, 3, 3]; down [dim, dim, 3, 3]
  VaeConv time_conv;   // 3d modes: up [2dim, dim, 3, 1, 1]; down [dim, dim, 3, 1, 1] (stride 2)
};

// One encoder down stage / decoder up stage: its residual blocks, then its resampler.
// Wan 2.1 numbers these modules flatly ("encoder.downsamples.{n}"); Wan 2.2 nests them
// ("encoder.downsamples.{stage}.downsamples.{j}") and adds a parameter-free shortcut over the whole
// stage: AvgDown3D in the encoder (every stage), DupUp3D in the decoder (stages that up-sample).
struct VaeStage {
  std::vector<VaeResBlock> res;
  VaeResample resample;
  bool shortcut = false;       // Wan 2.2 AvgDown3D / DupUp3D
  int64_t shortcut_out = 0;    // its output channels
  int shortcut_ft = 1, shortcut_fs = 1;
};

// Encoder3d / Decoder3d: official "encoder.*" / "decoder.*".
struct VaeCoder {
  VaeConv conv1;               // conv1   [dims0, Cin, 3, 3, 3]
  std::vector<VaeStage> stages;
  VaeResBlock middle0;         // middle.0
  VaeAttnBlock middle1;        // middle.1
  VaeResBlock middle2;         // middle.2
  Tensor head_norm;            // head.0.gamma [C, 1, 1, 1]
  VaeConv head_conv;           // head.2 [Cout, C, 3, 3, 3]
};

struct VaeWeights {
  VaeCoder encoder;
  VaeCoder decoder;
  VaeConv conv1;               // top-level conv1 [2z, 2z, 1, 1, 1]: encoder output -> mean | logvar
  VaeConv conv2;               // top-level conv2 [z, z, 1, 1, 1]: latent -> decoder input
};

// Returns the tensor stored under an official name (any float dtype; throws wan::Error if absent).
using VaeTensorSource = std::function<Tensor(const std::string& official_name)>;

// Throws wan::Error on an inconsistent configuration (table sizes, widths, patch, version).
void vae_validate(const VaeConfig& c);
// Every official tensor name of this configuration with its expected shape, in load order.
std::vector<std::pair<std::string, Shape>> vae_tensor_specs(const VaeConfig& c);
// Loads (and up-casts to float32) every tensor of vae_tensor_specs(c) through get, checking shapes;
// errors name the tensor.
VaeWeights load_vae_weights(const VaeConfig& c, const VaeTensorSource& get);

// Spatial / temporal compression of a configuration (8 or 16 / 4 for the released VAEs).
int vae_spatial_factor(const VaeConfig& c);
int vae_temporal_factor(const VaeConfig& c);

}  // namespace wan
