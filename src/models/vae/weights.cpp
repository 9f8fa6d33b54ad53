// VAE structure from the configuration: the weight table, official tensor names and shapes, and weight
// loading. One walk over the network (walk_vae) produces all three, so they can never disagree. Structure (diffusers AutoencoderKLWan = official WanVAE_):
//   encoder widths dims[0] = base, dims[i+1] = base * dim_mult[i]; stage i: num_res_blocks
//   residual blocks dims[i] -> dims[i+1], then (except the last stage) downsample3d if
//   temporal_downsample[i] else downsample2d. Wan 2.2 adds AvgDown3D(dims[i] -> dims[i+1],
//   ft = 2 if temporal, fs = 2 if down-sampling) to every stage (the last one is an identity).
//   decoder widths d[0] = dec * dim_mult[-1], d[i+1] = dec * dim_mult[-1-i]; stage i:
//   num_res_blocks + 1 residual blocks, Wan 2.1 input width d[i] / 2 for i > 0 (the 2.1
//   up-samplers halve channels), then (except the last stage) upsample3d if the reversed
//   temporal_downsample says so else upsample2d. Wan 2.2 adds DupUp3D(d[i] -> d[i+1]) to every
//   up-sampling stage.
#include <cmath>

#include "core/error.h"
#include "models/vae/weights.h"

namespace wan {
namespace {

int n_stages(const VaeConfig& c) { return static_cast<int>(c.dim_mult.size()); }
bool temporal_down(const VaeConfig& c, int i) { return i < n_stages(c) - 1 && c.temporal_downsample[i]; }
// diffusers: temperal_upsample = temperal_downsample[::-1]
bool temporal_up(const VaeConfig& c, int i) {
  return i < n_stages(c) - 1 && c.temporal_downsample[c.temporal_downsample.size() - 1 - i];
}
int64_t in_channels(const VaeConfig& c) { return 3LL * c.patch * c.patch; }

// need(name, shape) -> Tensor: loads (or, for the spec list, records) one tensor.
template <class Need>
VaeConv walk_conv(const std::string& p, Shape w, Need& need) {
  VaeConv conv;
  conv.weight = need(p + "weight", w);
  conv.bias = need(p + "bias", Shape{w[0]});
  return conv;
}

template <class Need>
VaeResBlock walk_res(const std::string& p, int64_t cin, int64_t cout, Need& need) {
  VaeResBlock b;
  b.norm1 = need(p + "residual.0.gamma", Shape{cin, 1, 1, 1});
  b.conv1 = walk_conv(p + "residual.2.", Shape{cout, cin, 3, 3, 3}, need);
  b.norm2 = need(p + "residual.3.gamma", Shape{cout, 1, 1, 1});
  b.conv2 = walk_conv(p + "residual.6.", Shape{cout, cout, 3, 3, 3}, need);
  if (cin != cout) b.shortcut = walk_conv(p + "shortcut.", Shape{cout, cin, 1, 1, 1}, need);
  return b;
}

template <class Need>
void walk_middle(const std::string& p, int64_t dim, VaeCoder& coder, Need& need) {
  coder.middle0 = walk_res(p + "middle.0.", dim, dim, need);
  coder.middle1.norm = need(p + "middle.1.norm.gamma", Shape{dim, 1, 1});
  coder.middle1.to_qkv = walk_conv(p + "middle.1.to_qkv.", Shape{3 * dim, dim, 1, 1}, need);
  coder.middle1.proj = walk_conv(p + "middle.1.proj.", Shape{dim, dim, 1, 1}, need);
  coder.middle2 = walk_res(p + "middle.2.", dim, dim, need);
}

// "encoder.downsamples.{n}." (2.1, flat) or "encoder.downsamples.{stage}.downsamples.{j}." (2.2).
std::string stage_module(const VaeConfig& c, const char* side, const char* list, int stage, int j, int flat) {
  std::string p = std::string(side) + "." + list + ".";
  if (c.version == 21) return p + std::to_string(flat) + ".";
  return p + std::to_string(stage) + "." + list + "." + std::to_string(j) + ".";
}

template <class Need>
VaeCoder walk_encoder(const VaeConfig& c, Need& need) {
  VaeCoder e;
  const int n = n_stages(c);
  std::vector<int64_t> dims{c.base_dim};
  for (int m : c.dim_mult) dims.push_back(static_cast<int64_t>(c.base_dim) * m);
  e.conv1 = walk_conv("encoder.conv1.", Shape{dims[0], in_channels(c), 3, 3, 3}, need);
  int flat = 0;
  for (int i = 0; i < n; ++i) {
    VaeStage st;
    int64_t cin = dims[i];
    const int64_t cout = dims[i + 1];
    for (int j = 0; j < c.num_res_blocks; ++j, ++flat) {
      st.res.push_back(walk_res(stage_module(c, "encoder", "downsamples", i, j, flat), cin, cout, need));
      cin = cout;
    }
    const bool down = i != n - 1;
    if (down) {
      const bool t = temporal_down(c, i);
      const std::string p = stage_module(c, "encoder", "downsamples", i, c.num_res_blocks, flat++);
      st.resample.mode = t ? VaeResampleMode::Downsample3d : VaeResampleMode::Downsample2d;
      st.resample.resample = walk_conv(p + "resample.1.", Shape{cout, cout, 3, 3}, need);
      if (t) st.resample.time_conv = walk_conv(p + "time_conv.", Shape{cout, cout, 3, 1, 1}, need);
    }
    if (c.version == 22) {
      st.shortcut = true;
      st.shortcut_out = cout;
      st.shortcut_ft = temporal_down(c, i) ? 2 : 1;
      st.shortcut_fs = down ? 2 : 1;
    }
    e.stages.push_back(std::move(st));
  }
  walk_middle("encoder.", dims[n], e, need);
  e.head_norm = need("encoder.head.0.gamma", Shape{dims[n], 1, 1, 1});
  e.head_conv = walk_conv("encoder.head.2.", Shape{2LL * c.z_dim, dims[n], 3, 3, 3}, need);
  return e;
}

template <class Need>
VaeCoder walk_decoder(const VaeConfig& c, Need& need) {
  VaeCoder d;
  const int n = n_stages(c);
  std::vector<int64_t> dims{static_cast<int64_t>(c.dec_dim) * c.dim_mult[n - 1]};
  for (int i = n - 1; i >= 0; --i) dims.push_back(static_cast<int64_t>(c.dec_dim) * c.dim_mult[i]);
  d.conv1 = walk_conv("decoder.conv1.", Shape{dims[0], c.z_dim, 3, 3, 3}, need);
  walk_middle("decoder.", dims[0], d, need);
  int flat = 0;
  for (int i = 0; i < n; ++i) {
    VaeStage st;
    const int64_t stage_in = (c.version == 21 && i > 0) ? dims[i] / 2 : dims[i];
    int64_t cin = stage_in;
    const int64_t cout = dims[i + 1];
    for (int j = 0; j < c.num_res_blocks + 1; ++j, ++flat) {
      st.res.push_back(walk_res(stage_module(c, "decoder", "upsamples", i, j, flat), cin, cout, need));
      cin = cout;
    }
    if (i != n - 1) {
      const bool t = temporal_up(c, i);
      const std::string p = stage_module(c, "decoder", "upsamples", i, c.num_res_blocks + 1, flat++);
      st.resample.mode = t ? VaeResampleMode::Upsample3d : VaeResampleMode::Upsample2d;
      const int64_t up_out = c.version == 21 ? cout / 2 : cout;
      st.resample.resample = walk_conv(p + "resample.1.", Shape{up_out, cout, 3, 3}, need);
      if (t) st.resample.time_conv = walk_conv(p + "time_conv.", Shape{2 * cout, cout, 3, 1, 1}, need);
      if (c.version == 22) {
        st.shortcut = true;
        st.shortcut_out = cout;
        st.shortcut_ft = t ? 2 : 1;
        st.shortcut_fs = 2;
      }
    }
    d.stages.push_back(std::move(st));
  }
  d.head_norm = need("decoder.head.0.gamma", Shape{dims[n], 1, 1, 1});
  d.head_conv = walk_conv("decoder.head.2.", Shape{in_channels(c), dims[n], 3, 3, 3}, need);
  return d;
}

template <class Need>
VaeWeights walk_vae(const VaeConfig& c, Need& need) {
  vae_validate(c);
  VaeWeights w;
  w.encoder = walk_encoder(c, need);
  w.conv1 = walk_conv("conv1.", Shape{2LL * c.z_dim, 2LL * c.z_dim, 1, 1, 1}, need);
  w.conv2 = walk_conv("conv2.", Shape{c.z_dim, c.z_dim, 1, 1, 1}, need);
  w.decoder = walk_decoder(c, need);
  return w;
}

}  // namespace

void vae_validate(const VaeConfig& c) {
  WAN_CHECK(c.version == 21 || c.version == 22, "VAE config: version must be 21 or 22, got ", c.version);
  WAN_CHECK(c.z_dim > 0 && c.base_dim > 0 && c.dec_dim > 0 && c.num_res_blocks > 0 && c.patch > 0,
            "VAE config: z_dim, base_dim, dec_dim, num_res_blocks and patch must be positive");
  const int n = n_stages(c);
  WAN_CHECK(n >= 1, "VAE config: dim_mult is empty");
  for (int m : c.dim_mult) WAN_CHECK(m > 0, "VAE config: dim_mult entries must be positive");
  WAN_CHECK(static_cast<int>(c.temporal_downsample.size()) == n - 1, "VAE config: temporal_downsample has ",
            c.temporal_downsample.size(), " entries, dim_mult has ", n, " (expected one per down-sampling stage)");
  WAN_CHECK(static_cast<int>(c.latents_mean.size()) == c.z_dim && static_cast<int>(c.latents_std.size()) == c.z_dim,
            "VAE config: latents_mean / latents_std have ", c.latents_mean.size(), " / ", c.latents_std.size(),
            " entries, z_dim is ", c.z_dim);
  for (float s : c.latents_std) WAN_CHECK(std::isfinite(s) && s != 0.0f, "VAE config: latents_std entry ", s);
  for (int i = 0; i < n; ++i) {
    const int64_t enc_in = i == 0 ? c.base_dim : static_cast<int64_t>(c.base_dim) * c.dim_mult[i - 1];
    const int64_t enc_out = static_cast<int64_t>(c.base_dim) * c.dim_mult[i];
    const int64_t dec_in = static_cast<int64_t>(c.dec_dim) * c.dim_mult[i == 0 ? n - 1 : n - i];
    const int64_t dec_out = static_cast<int64_t>(c.dec_dim) * c.dim_mult[n - 1 - i];
    if (c.version == 22) {
      const int64_t fdown = (temporal_down(c, i) ? 2 : 1) * (i != n - 1 ? 4 : 1);
      WAN_CHECK(enc_in * fdown % enc_out == 0, "VAE config: encoder stage ", i, " AvgDown3D cannot map ", enc_in,
                " to ", enc_out, " channels");
      if (i != n - 1)
        WAN_CHECK(dec_out * (temporal_up(c, i) ? 8 : 4) % dec_in == 0, "VAE config: decoder stage ", i,
                  " DupUp3D cannot map ", dec_in, " to ", dec_out, " channels");
    } else if (i != n - 1) {
      WAN_CHECK(dec_out % 2 == 0, "VAE config: Wan 2.1 up-sampler halves ", dec_out, " channels");
    }
  }
}

int vae_spatial_factor(const VaeConfig& c) { return (1 << (n_stages(c) - 1)) * c.patch; }

int vae_temporal_factor(const VaeConfig& c) {
  int f = 1;
  for (int i = 0; i < n_stages(c) - 1; ++i)
    if (temporal_down(c, i)) f *= 2;
  return f;
}

std::vector<std::pair<std::string, Shape>> vae_tensor_specs(const VaeConfig& c) {
  std::vector<std::pair<std::string, Shape>> specs;
  auto need = [&](const std::string& name, const Shape& s) {
    specs.emplace_back(name, s);
    return Tensor();
  };
  walk_vae(c, need);
  return specs;
}

WeightTable vae_weight_table(const VaeConfig& c) {
  WeightTable t;
  auto need = [&](const std::string& name, const Shape& s) {
    const bool gamma = name.size() > 6 && name.compare(name.size() - 6, 6, ".gamma") == 0;
    const bool bias = !gamma && name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (gamma) {
      t.push_back({name, s, WeightClass::Norm, init_norm_scale(), DType::F32, {}});
    } else if (bias) {
      // A bias follows its weight (walk_conv) and shares its fan-in.
      WAN_ASSERT(!t.empty() && t.back().cls == WeightClass::Conv, "VAE bias ", name, " without its weight");
      t.push_back({name, s, WeightClass::ConvBias, t.back().init, DType::F32, {}});
    } else {
      int64_t fan_in = 1;  // in-channels times the kernel volume
      for (int d = 1; d < s.ndim; ++d) fan_in *= s[d];
      t.push_back({name, s, WeightClass::Conv, init_fan_in(fan_in), DType::F32, {}});
    }
    return Tensor();
  };
  walk_vae(c, need);
  return t;
}

VaeWeights load_vae_weights(const VaeConfig& c, const VaeTensorSource& get) {
  WAN_CHECK(static_cast<bool>(get), "load_vae_weights: no tensor source");
  auto need = [&](const std::string& name, const Shape& s) {
    Tensor t;
    WAN_WITH_CONTEXT("VAE tensor " + name, t = get(name));
    WAN_CHECK(t.defined(), "VAE tensor ", name, ": missing");
    WAN_CHECK(dtype_is_float(t.dtype()), "VAE tensor ", name, ": dtype ", dtype_name(t.dtype()),
              " is not a floating-point type");
    WAN_CHECK(t.shape() == s, "VAE tensor ", name, ": shape ", t.shape().str(), ", expected ", s.str(),
              " for this configuration");
    return t.to_f32();
  };
  return walk_vae(c, need);
}

}  // namespace wan
