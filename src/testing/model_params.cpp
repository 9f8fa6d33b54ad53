// Parameter lists of WanModel, T5Encoder and WanVAE_ (2.1 and 2.2) from their configs.
// Shapes are PyTorch's: Linear [out, in], Conv3d [out, in, kt, kh, kw], Conv2d [out, in, kh, kw].
#include "testing/model_params.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace wan::gen {
namespace {

struct Builder {
  std::vector<ParamSpec> out;

  void add(std::string name, Shape shape, InitRule init) { out.push_back({std::move(name), shape, init}); }
  // nn.Linear(in, out) with or without bias.
  void linear(const std::string& m, int64_t in, int64_t o, bool bias = true) {
    add(m + ".weight", {o, in}, init_fan_in(in));
    if (bias) add(m + ".bias", {o}, init_fan_in(in));
  }
  // Conv with kernel dims k (3 for Conv3d, 2 for Conv2d).
  void conv(const std::string& m, int64_t in, int64_t o, std::initializer_list<int64_t> k) {
    std::vector<int64_t> dims = {o, in};
    int64_t vol = 1;
    for (int64_t x : k) {
      dims.push_back(x);
      vol *= x;
    }
    add(m + ".weight", Shape(dims), init_fan_in(in * vol));
    add(m + ".bias", {o}, init_fan_in(in * vol));
  }
  void conv3(const std::string& m, int64_t in, int64_t o, int64_t k) { conv(m, in, o, {k, k, k}); }
  // VAE RMS_norm: gamma [C,1,1,1] (5-D inputs) or [C,1,1] (images).
  void rms_gamma(const std::string& m, int64_t c, bool images) {
    add(m + ".gamma", images ? Shape{c, 1, 1} : Shape{c, 1, 1, 1}, init_norm_scale());
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

std::vector<ParamSpec> dit_params(const DiTConfig& c) {
  c.validate();
  const int64_t D = c.dim, F = c.ffn_dim;
  const int64_t patch_vol = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  Builder b;
  b.add("patch_embedding.weight", {D, c.in_dim, c.patch[0], c.patch[1], c.patch[2]}, init_fan_in(c.in_dim * patch_vol));
  b.add("patch_embedding.bias", {D}, init_fan_in(c.in_dim * patch_vol));
  b.linear("text_embedding.0", c.text_dim, D);
  b.linear("text_embedding.2", D, D);
  b.linear("time_embedding.0", c.freq_dim, D);
  b.linear("time_embedding.2", D, D);
  b.linear("time_projection.1", D, 6 * D);
  const InitRule modulation = init_normal(static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    for (const char* a : {"self_attn", "cross_attn"}) {
      const std::string m = p + a;
      b.linear(m + ".q", D, D);
      b.linear(m + ".k", D, D);
      b.linear(m + ".v", D, D);
      b.linear(m + ".o", D, D);
      b.add(m + ".norm_q.weight", {D}, init_norm_scale());
      b.add(m + ".norm_k.weight", {D}, init_norm_scale());
      if (a[0] == 's') {
        // norm3 (the affine cross-attention pre-norm) is registered between the two attentions.
        b.add(p + "norm3.weight", {D}, init_norm_scale());
        b.add(p + "norm3.bias", {D}, init_norm_bias());
      }
    }
    b.linear(p + "ffn.0", D, F);
    b.linear(p + "ffn.2", F, D);
    b.add(p + "modulation", {1, 6, D}, modulation);
  }
  b.linear("head.head", D, static_cast<int64_t>(c.out_dim) * patch_vol);
  b.add("head.modulation", {1, 2, D}, modulation);
  return std::move(b.out);
}

std::vector<ParamSpec> t5_params(const T5Config& c) {
  WAN_CHECK(c.dim > 0 && c.dim_attn > 0 && c.dim_ffn > 0 && c.num_heads > 0 && c.num_layers > 0 && c.vocab > 0 &&
                c.dim_attn % c.num_heads == 0,
            "invalid T5 config (dim ", c.dim, ", dim_attn ", c.dim_attn, ", heads ", c.num_heads, ")");
  Builder b;
  b.add("token_embedding.weight", {c.vocab, c.dim}, init_normal(1.0f));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    b.add(p + "norm1.weight", {c.dim}, init_norm_scale());
    b.linear(p + "attn.q", c.dim, c.dim_attn, false);
    b.linear(p + "attn.k", c.dim, c.dim_attn, false);
    b.linear(p + "attn.v", c.dim, c.dim_attn, false);
    b.linear(p + "attn.o", c.dim_attn, c.dim, false);
    b.add(p + "norm2.weight", {c.dim}, init_norm_scale());
    b.linear(p + "ffn.gate.0", c.dim, c.dim_ffn, false);
    b.linear(p + "ffn.fc1", c.dim, c.dim_ffn, false);
    b.linear(p + "ffn.fc2", c.dim_ffn, c.dim, false);
    b.add(p + "pos_embedding.embedding.weight", {c.num_buckets, c.num_heads}, init_normal(1.0f));
  }
  b.add("norm.weight", {c.dim}, init_norm_scale());
  return std::move(b.out);
}

std::vector<ParamSpec> vae_params(const VaeConfig& c) {
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

}  // namespace wan::gen
