// Packing the GPU VAE's weights (see vae_gpu_weights.h): converts every filter on the host to bf16 in
// the layout of its convolution (causal 3-D, folded 2-D, 3×3 2-D, the down-samplers' 4×4 stride-2 2-D,
// or a 1×1 GEMM) and appends it, its fp32 bias and the norm gammas to one aligned byte image.
// Padded input or output channels (conv1 of the encoder, the decoder's head) get zero filter entries,
// so they contribute nothing and compute zeros.
#include "models/vae/vae_gpu_weights.h"

#include <cstring>
#include <functional>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace wan::cuda::vae_gpu_detail {
namespace {

int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

// Sizing (plans before any weights are read): offsets advance, nothing is stored.
class Packer {
 public:
  explicit Packer(bool sizing) : sizing_(sizing) {}
  size_t add(const void* p, size_t n) {
    const size_t off = align_up(size_);
    size_ = off + n;
    if (sizing_) return off;
    bytes_.resize(size_);
    std::memcpy(bytes_.data() + off, p, n);
    return off;
  }
  size_t size() const { return size_; }
  bool sizing() const { return sizing_; }
  size_t f32(const std::vector<float>& v) { return add(v.data(), v.size() * sizeof(float)); }
  size_t bf16v(const std::vector<uint16_t>& v) { return add(v.data(), v.size() * sizeof(uint16_t)); }
  // A bf16 filter of n elements, zero but where `fill` writes; sizing skips building it (the A14B
  // decoder's ~70 M filter values cost ~0.2 s to convert, on the run's critical path when planning).
  size_t bf16_filter(size_t n, const std::function<void(std::vector<uint16_t>&)>& fill) {
    if (sizing_) return add(nullptr, n * sizeof(uint16_t));
    std::vector<uint16_t> o(n, 0);
    fill(o);
    return bf16v(o);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
  size_t size_ = 0;
  bool sizing_;
};

// Official module prefix of residual block / resampler j of stage i: Wan 2.1 numbers them flatly
// ("decoder.upsamples.{flat}"), Wan 2.2 nests them ("decoder.upsamples.{i}.upsamples.{j}").
std::string module_name(int version, const char* side, const char* list, int stage, int j, int flat) {
  const std::string p = std::string(side) + "." + list + ".";
  if (version == 21) return p + std::to_string(flat);
  return p + std::to_string(stage) + "." + list + "." + std::to_string(j);
}

class WeightBuilder {
 public:
  WeightBuilder(VaeConvMode mode, bool sizing, const char* side) : pack(sizing), mode_(mode), side_(side) {}
  Packer pack;

  // `sizing`: the tensor's shape is checked but its values are not read (zeros stand in; filters,
  // which only bf16_filter reads, get none).
  std::vector<float> host_f32(const Tensor& t, int64_t numel, const std::string& what, bool filter = false) {
    WAN_CHECK(t.defined(), side_, ": ", what, " is missing");
    WAN_CHECK(t.numel() == numel, side_, ": ", what, " has ", t.numel(), " elements, expected ", numel);
    if (pack.sizing()) return std::vector<float>(filter ? 0 : static_cast<size_t>(numel), 0.0f);
    const Tensor f = t.to_f32();
    return std::vector<float>(f.f32(), f.f32() + numel);
  }

  // A CausalConv3d with temporal kernel 3: filter [cout_pad, kt, kh, kw, cin_pad] (Conv3d mode) or
  // [cout_pad, kh, kw, kt, cin_pad] (Folded2d: the taps are channel blocks; for k = 1 both are the
  // same), zero rows beyond cout and zero columns beyond cin.
  DevConv causal(const VaeConv& c, int64_t cin, int64_t cout, int k, const std::string& what, int64_t cout_pad = 0,
                 int64_t cin_pad = 0) {
    DevConv d = head_of(c, cin, cout, what, 5, cin_pad ? cin_pad : cin);
    d.kt = 3;
    d.kh = d.kw = k;
    WAN_CHECK(c.weight.dim(2) == 3 && c.weight.dim(3) == k && c.weight.dim(4) == k, side_, ": ", what, " weight ",
              c.weight.shape().str(), " is not a 3x", k, "x", k, " kernel");
    d.cout_pad = cout_pad ? cout_pad : cout;
    const int64_t cs = d.cin;
    const std::vector<float> w = host_f32(c.weight, cout * cin * 3 * k * k, what + ".weight", true);
    d.w = pack.bf16_filter(static_cast<size_t>(d.cout_pad * cs * 3 * k * k), [&](std::vector<uint16_t>& o) {
      for (int64_t co = 0; co < cout; ++co)
        for (int64_t ci = 0; ci < cin; ++ci)
          for (int dt = 0; dt < 3; ++dt)
            for (int dy = 0; dy < k; ++dy)
              for (int dx = 0; dx < k; ++dx) {
                const float v = w[(((co * cin + ci) * 3 + dt) * k + dy) * k + dx];
                const int64_t at = mode_ == VaeConvMode::Conv3d ? (((co * 3 + dt) * k + dy) * k + dx) * cs + ci
                                                                 : (((co * k + dy) * k + dx) * 3 + dt) * cs + ci;
                o[at] = f32_to_bf16(v);
              }
    });
    d.b = bias(c, cout, d.cout_pad, what);
    return d;
  }
  // A Conv2d 3×3: filter [cout, kh, kw, cin]. `down`: the stride-2 down-sampler, stored as a 4×4 filter
  // whose taps (dy + 1, dx + 1) hold the 3×3 ones and whose first row and column are zero.
  DevConv conv2d(const VaeConv& c, int64_t cin, int64_t cout, const std::string& what, bool down = false) {
    DevConv d = head_of(c, cin, cout, what, 4, cin);
    const int kk = down ? 4 : 3, o0 = down ? 1 : 0;
    d.kh = d.kw = kk;
    d.cout_pad = cout;
    WAN_CHECK(c.weight.dim(2) == 3 && c.weight.dim(3) == 3, side_, ": ", what, " weight ", c.weight.shape().str(),
              " is not 3x3");
    const std::vector<float> w = host_f32(c.weight, cout * cin * 9, what + ".weight", true);
    d.w = pack.bf16_filter(static_cast<size_t>(cout * kk * kk * cin), [&](std::vector<uint16_t>& o) {
      for (int64_t co = 0; co < cout; ++co)
        for (int64_t ci = 0; ci < cin; ++ci)
          for (int j = 0; j < 9; ++j) {
            const int dy = j / 3 + o0, dx = j % 3 + o0;
            o[((co * kk + dy) * kk + dx) * cin + ci] = f32_to_bf16(w[(co * cin + ci) * 9 + j]);
          }
    });
    d.b = bias(c, cout, cout, what);
    return d;
  }
  // A 1×1(×1) conv as a GEMM weight [cout, cin] (already row-major).
  DevConv pointwise(const VaeConv& c, int64_t cin, int64_t cout, const std::string& what) {
    WAN_CHECK(c.present(), side_, ": ", what, " is missing");
    WAN_CHECK(c.weight.dim(0) == cout && c.weight.dim(1) == cin && c.weight.numel() == cout * cin, side_, ": ", what,
              " weight ", c.weight.shape().str(), " is not a 1x1 conv ", cin, " -> ", cout);
    DevConv d;
    d.cin = cin;
    d.cout = d.cout_pad = cout;
    const std::vector<float> w = host_f32(c.weight, cout * cin, what + ".weight", true);
    d.w = pack.bf16_filter(static_cast<size_t>(cout * cin), [&](std::vector<uint16_t>& o) {
      for (size_t i = 0; i < o.size(); ++i) o[i] = f32_to_bf16(w[i]);
    });
    d.b = bias(c, cout, cout, what);
    return d;
  }
  size_t gamma(const Tensor& g, int64_t C, const std::string& what) {
    WAN_CHECK(C <= 1024, side_, ": ", what, " normalises ", C, " channels (the GPU VAE's norms take at most 1024)");
    return pack.f32(host_f32(g, C, what));
  }

  DevRes res(const VaeResBlock& b, int64_t cin, const std::string& what) {
    WAN_CHECK(b.conv1.present(), side_, ": ", what, " is missing");
    DevRes r;
    r.cin = cin;
    r.cout = b.conv1.weight.dim(0);
    r.g1 = gamma(b.norm1, cin, what + ".residual.0.gamma");
    r.c1 = causal(b.conv1, cin, r.cout, 3, what + ".residual.2");
    r.g2 = gamma(b.norm2, r.cout, what + ".residual.3.gamma");
    r.c2 = causal(b.conv2, r.cout, r.cout, 3, what + ".residual.6");
    r.has_sc = cin != r.cout;
    if (r.has_sc) r.sc = pointwise(b.shortcut, cin, r.cout, what + ".shortcut");
    return r;
  }

  void middle(const VaeCoder& m, int64_t C, const std::string& p, DevVae& v) {
    v.mid0 = res(m.middle0, C, p + "middle.0");
    v.mid1.C = C;
    v.mid1.g = gamma(m.middle1.norm, C, p + "middle.1.norm.gamma");
    v.mid1.qkv = pointwise(m.middle1.to_qkv, C, 3 * C, p + "middle.1.to_qkv");
    v.mid1.proj = pointwise(m.middle1.proj, C, C, p + "middle.1.proj");
    v.mid2 = res(m.middle2, C, p + "middle.2");
    WAN_CHECK(v.mid0.cout == C && v.mid2.cout == C, side_, ": ", p, "middle blocks change the width ", C);
  }

  // A stage's residual blocks from width C (updated to the blocks' output), its Wan 2.2 shortcut.
  DevStage stage_blocks(const VaeConfig& config, const VaeStage& st, const char* side, const char* list, int i,
                        int& flat, int64_t& C) {
    DevStage ds;
    ds.cin = C;
    for (size_t j = 0; j < st.res.size(); ++j) {
      ds.res.push_back(res(st.res[j], C, module_name(config.version, side, list, i, static_cast<int>(j), flat++)));
      C = ds.res.back().cout;
    }
    ds.mode = st.resample.mode;
    if (st.shortcut) {
      WAN_CHECK(config.version == 22, side_, ": stage ", i, " has a Wan 2.2 shortcut in a Wan 2.1 VAE");
      ds.shortcut = true;
      ds.sc_out = st.shortcut_out;
      ds.sc_ft = st.shortcut_ft;
      ds.sc_fs = st.shortcut_fs;
    }
    return ds;
  }

  // The top-level 1×1×1 conv [C, C] (fp32) and the latent statistics of the z channels.
  void top(const VaeConv& c, int64_t C, const char* name, const VaeConfig& config, DevVae& v) {
    WAN_CHECK(c.present(), side_, ": ", name, " is missing");
    v.top_w = pack.f32(host_f32(c.weight, C * C, std::string(name) + ".weight"));
    v.top_b = pack.f32(host_f32(c.bias, C, std::string(name) + ".bias"));
    std::vector<float> inv(static_cast<size_t>(v.z));
    for (int64_t i = 0; i < v.z; ++i) inv[i] = 1.0f / config.latents_std[i];  // the reference stores 1/std in fp32
    v.inv_std = pack.f32(inv);
    v.mean = pack.f32(config.latents_mean);
  }

  const char* side() const { return side_; }

 private:
  DevConv head_of(const VaeConv& c, int64_t cin, int64_t cout, const std::string& what, int ndim, int64_t cin_store) {
    WAN_CHECK(c.present(), side_, ": ", what, " is missing");
    WAN_CHECK(c.weight.ndim() == ndim && c.weight.dim(0) == cout && c.weight.dim(1) == cin, side_, ": ", what,
              " weight ", c.weight.shape().str(), " does not map ", cin, " -> ", cout, " channels");
    WAN_CHECK(cin_store % 8 == 0 && cin_store >= cin, side_, ": ", what, " has ", cin,
              " input channels (the GPU VAE needs multiples of 8)");
    DevConv d;
    d.cin = cin_store;
    d.cout = cout;
    return d;
  }
  size_t bias(const VaeConv& c, int64_t cout, int64_t cout_pad, const std::string& what) {
    std::vector<float> b = host_f32(c.bias, cout, what + ".bias");
    b.resize(static_cast<size_t>(cout_pad), 0.0f);
    return pack.f32(b);
  }
  VaeConvMode mode_;
  const char* side_;
};

DevVae header(const VaeConfig& config) {
  DevVae v;
  v.version = config.version;
  v.patch = config.patch;
  v.z = config.z_dim;
  WAN_CHECK(static_cast<int64_t>(config.latents_mean.size()) == v.z &&
                static_cast<int64_t>(config.latents_std.size()) == v.z,
            "GPU VAE: latent mean/std tables must have ", v.z, " entries");
  return v;
}

}  // namespace

DevVae pack_decoder(const VaeConfig& config, const VaeWeights& weights, VaeConvMode mode, std::vector<uint8_t>& bytes,
                    size_t* sized) {
  const VaeCoder& d = weights.decoder;
  WeightBuilder wb(mode, sized != nullptr, "GPU VAE decoder");
  DevVae dec = header(config);
  dec.in_pad = dec.z;
  WAN_CHECK(d.conv1.present(), "GPU VAE decoder: decoder weights are not loaded");
  const int64_t top = d.conv1.weight.dim(0);
  dec.conv1 = wb.causal(d.conv1, dec.z, top, 3, "decoder.conv1");
  wb.middle(d, top, "decoder.", dec);
  int64_t C = top;
  int flat = 0;
  for (size_t i = 0; i < d.stages.size(); ++i) {
    const VaeStage& st = d.stages[i];
    DevStage ds = wb.stage_blocks(config, st, "decoder", "upsamples", static_cast<int>(i), flat, C);
    const std::string rp = module_name(config.version, "decoder", "upsamples", static_cast<int>(i),
                                       static_cast<int>(st.res.size()), flat);
    switch (ds.mode) {
      case VaeResampleMode::None:
        break;
      case VaeResampleMode::Upsample3d:
        ds.tc = wb.causal(st.resample.time_conv, C, 2 * C, 1, rp + ".time_conv");
        [[fallthrough]];
      case VaeResampleMode::Upsample2d:
        WAN_CHECK(st.resample.resample.present(), "GPU VAE decoder: ", rp, ".resample.1 is missing");
        ds.rs = wb.conv2d(st.resample.resample, C, st.resample.resample.weight.dim(0), rp + ".resample.1");
        C = ds.rs.cout;
        ++flat;
        break;
      default:
        WAN_THROW("GPU VAE decoder: ", rp, " is a down-sampler");
    }
    WAN_CHECK(!ds.shortcut || ds.sc_out == C, "GPU VAE decoder: stage ", i, " shortcut gives ", ds.sc_out,
              " channels, its blocks ", C);
    dec.stages.push_back(std::move(ds));
  }
  dec.head_g = wb.gamma(d.head_norm, C, "decoder.head.0.gamma");
  const int64_t out_ch = 3LL * config.patch * config.patch;
  WAN_CHECK(d.head_conv.present() && d.head_conv.weight.dim(0) == out_ch, "GPU VAE decoder: decoder.head.2 must give ",
            out_ch, " channels");
  dec.head = wb.causal(d.head_conv, C, out_ch, 3, "decoder.head.2", round8(out_ch));
  wb.top(weights.conv2, dec.z, "conv2", config, dec);
  if (sized) *sized = wb.pack.size();
  else bytes = wb.pack.bytes();
  return dec;
}

DevVae pack_encoder(const VaeConfig& config, const VaeWeights& weights, VaeConvMode mode, std::vector<uint8_t>& bytes,
                    size_t* sized) {
  const VaeCoder& e = weights.encoder;
  WeightBuilder wb(mode, sized != nullptr, "GPU VAE encoder");
  DevVae enc = header(config);
  const int64_t in_ch = 3LL * config.patch * config.patch;
  enc.in_pad = round8(in_ch);
  WAN_CHECK(e.conv1.present(), "GPU VAE encoder: encoder weights are not loaded");
  const int64_t top = e.conv1.weight.dim(0);
  enc.conv1 = wb.causal(e.conv1, in_ch, top, 3, "encoder.conv1", 0, enc.in_pad);
  int64_t C = top;
  int flat = 0;
  for (size_t i = 0; i < e.stages.size(); ++i) {
    const VaeStage& st = e.stages[i];
    DevStage ds = wb.stage_blocks(config, st, "encoder", "downsamples", static_cast<int>(i), flat, C);
    const std::string rp = module_name(config.version, "encoder", "downsamples", static_cast<int>(i),
                                       static_cast<int>(st.res.size()), flat);
    switch (ds.mode) {
      case VaeResampleMode::None:
        break;
      case VaeResampleMode::Downsample3d:
        ds.tc = wb.causal(st.resample.time_conv, C, C, 1, rp + ".time_conv");
        [[fallthrough]];
      case VaeResampleMode::Downsample2d:
        WAN_CHECK(st.resample.resample.present(), "GPU VAE encoder: ", rp, ".resample.1 is missing");
        ds.rs = wb.conv2d(st.resample.resample, C, C, rp + ".resample.1", /*down=*/true);
        ++flat;
        break;
      default:
        WAN_THROW("GPU VAE encoder: ", rp, " is an up-sampler");
    }
    WAN_CHECK(!ds.shortcut || ds.sc_out == C, "GPU VAE encoder: stage ", i, " shortcut gives ", ds.sc_out,
              " channels, its blocks ", C);
    enc.stages.push_back(std::move(ds));
  }
  wb.middle(e, C, "encoder.", enc);
  enc.head_g = wb.gamma(e.head_norm, C, "encoder.head.0.gamma");
  enc.head = wb.causal(e.head_conv, C, 2 * enc.z, 3, "encoder.head.2");
  wb.top(weights.conv1, 2 * enc.z, "conv1", config, enc);
  if (sized) *sized = wb.pack.size();
  else bytes = wb.pack.bytes();
  return enc;
}

}  // namespace wan::cuda::vae_gpu_detail
