// The VAE weight table (see weights.h). Shapes are PyTorch's: Conv3d [out, in, kt, kh, kw], Conv2d
// [out, in, kh, kw], RMS_norm gamma [C, 1, 1, 1] (video) or [C, 1, 1] (images).
#include "models/vae/weights.h"

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace wan {
namespace {

struct Builder {
  WeightTable out;

  void add(std::string name, Shape shape, WeightClass cls, InitRule init) {
    out.push_back({std::move(name), shape, cls, init, DType::F32, {}});
  }
  // Conv with kernel dims k (3 for Conv3d, 2 for Conv2d).
  void conv(const std::string& m, int64_t in, int64_t o, std::initializer_list<int64_t> k) {
    std::vector<int64_t> dims = {o, in};
    int64_t vol = 1;
    for (int64_t x : k) {
      dims.push_back(x);
      vol *= x;
    }
    add(m + ".weight", Shape(dims), WeightClass::Conv, init_fan_in(in * vol));
    add(m + ".bias", {o}, WeightClass::ConvBias, init_fan_in(in * vol));
  }
  void conv3(const std::string& m, int64_t in, int64_t o, int64_t k) { conv(m, in, o, {k, k, k}); }
  // VAE RMS_norm: gamma [C,1,1,1] (5-D inputs) or [C,1,1] (images).
  void rms_gamma(const std::string& m, int64_t c, bool images) {
    add(m + ".gamma", images ? Shape{c, 1, 1} : Shape{c, 1, 1, 1}, WeightClass::Norm, init_norm_scale());
  }
  // VAE ResidualBlock(in, out).
  void res_block(const std::string& m, int64_t in, int64_t o) {
    rms_gamma(m + ".residual.0", in, false);
    conv3(m + ".residual.2", in, o, 3);
    rms_gamma(m + ".residual.3", o, false);
    conv3(m + ".residual.6", o, o, 3);
    if (in != o) conv3(m + ".shortcut", in, o, 1);
  }
  // VAE AttentionBlock(c).
  void attn_block(const std::string& m, int64_t c) {
    rms_gamma(m + ".norm", c, true);
    conv(m + ".to_qkv", c, 3 * c, {1, 1});
    conv(m + ".proj", c, c, {1, 1});
  }
  // VAE Resample: 2d spatial conv `resample.1` (in -> out) and, for the temporal modes, time_conv.
  void resample(const std::string& m, int64_t c, int64_t conv_out, bool temporal, bool up) {
    conv(m + ".resample.1", c, conv_out, {3, 3});
    if (temporal) conv(m + ".time_conv", c, up ? 2 * c : c, {3, 1, 1});
  }
};

}  // namespace

WeightTable vae_weight_table(const VaeConfig& c) {
  WAN_CHECK(c.version == 21 || c.version == 22, "VAE version ", c.version, " (expected 21 or 22)");
  WAN_CHECK(c.dim_mult.size() == 4 && c.num_res_blocks == 2 && c.temporal_downsample.size() == 3,
            "VAE config: only the released structure (4 stages, 2 residual blocks) can be generated");
  WAN_CHECK(c.base_dim > 0 && c.dec_dim > 0 && c.z_dim > 0 && c.patch >= 1, "invalid VAE config");
  const bool v22 = c.version == 22;
  WAN_CHECK(v22 || c.dec_dim == c.base_dim, "Wan2.1 VAE: the decoder width must equal the encoder width");
  const int64_t io = 3LL * c.patch * c.patch;  // pixel channels after patchify
  const int64_t z = c.z_dim;
  Builder b;

  // Encoder: widths base * [1, m0, m1, m2, m3].
  std::vector<int64_t> ed = {c.base_dim};
  for (int m : c.dim_mult) ed.push_back(static_cast<int64_t>(c.base_dim) * m);
  b.conv3("encoder.conv1", io, ed[0], 3);
  int flat = 0;
  for (int s = 0; s < 4; ++s) {
    int64_t in = ed[s];
    const int64_t o = ed[s + 1];
    for (int j = 0; j < c.num_res_blocks; ++j) {
      const std::string m = v22 ? "encoder.downsamples." + std::to_string(s) + ".downsamples." + std::to_string(j)
                                : "encoder.downsamples." + std::to_string(flat++);
      b.res_block(m, in, o);
      in = o;
    }
    if (s != 3) {
      const std::string m =
          v22 ? "encoder.downsamples." + std::to_string(s) + ".downsamples." + std::to_string(c.num_res_blocks)
              : "encoder.downsamples." + std::to_string(flat++);
      b.resample(m, o, o, c.temporal_downsample[s], false);
    }
  }
  const int64_t emid = ed[4];
  b.res_block("encoder.middle.0", emid, emid);
  b.attn_block("encoder.middle.1", emid);
  b.res_block("encoder.middle.2", emid, emid);
  b.rms_gamma("encoder.head.0", emid, false);
  b.conv3("encoder.head.2", emid, 2 * z, 3);

  b.conv3("conv1", 2 * z, 2 * z, 1);
  b.conv3("conv2", z, z, 1);

  // Decoder: widths dec * [m3, m3, m2, m1, m0]; temporal upsampling mirrors the encoder.
  std::vector<int64_t> dd = {static_cast<int64_t>(c.dec_dim) * c.dim_mult[3]};
  for (int i = 3; i >= 0; --i) dd.push_back(static_cast<int64_t>(c.dec_dim) * c.dim_mult[i]);
  b.conv3("decoder.conv1", z, dd[0], 3);
  b.res_block("decoder.middle.0", dd[0], dd[0]);
  b.attn_block("decoder.middle.1", dd[0]);
  b.res_block("decoder.middle.2", dd[0], dd[0]);
  flat = 0;
  for (int s = 0; s < 4; ++s) {
    // Wan2.1: every up-sampler halves the width, so stages after the first start at half width.
    int64_t in = (!v22 && s > 0) ? dd[s] / 2 : dd[s];
    const int64_t o = dd[s + 1];
    for (int j = 0; j < c.num_res_blocks + 1; ++j) {
      const std::string m = v22 ? "decoder.upsamples." + std::to_string(s) + ".upsamples." + std::to_string(j)
                                : "decoder.upsamples." + std::to_string(flat++);
      b.res_block(m, in, o);
      in = o;
    }
    if (s != 3) {
      const std::string m =
          v22 ? "decoder.upsamples." + std::to_string(s) + ".upsamples." + std::to_string(c.num_res_blocks + 1)
              : "decoder.upsamples." + std::to_string(flat++);
      b.resample(m, o, v22 ? o : o / 2, c.temporal_downsample[2 - s], true);
    }
  }
  b.rms_gamma("decoder.head.0", dd[4], false);
  b.conv3("decoder.head.2", dd[4], io, 3);
  return std::move(b.out);
}

}  // namespace wan
