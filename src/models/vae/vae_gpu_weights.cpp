// Packing the GPU VAE decoder's weights (see vae_gpu_weights.h): converts every filter on the host to
// bf16 in the layout of its convolution (causal 3-D, folded 2-D, 3×3 2-D or 1×1 GEMM) and appends
// it, its fp32 bias and the norm gammas to one aligned byte image.
#include "models/vae/vae_gpu_weights.h"

#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace wan::cuda::vae_gpu_detail {
namespace {

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
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
  size_t size_ = 0;
  bool sizing_;
};

// `sizing`: the tensor's shape is checked but its values are not read (zeros stand in).
std::vector<float> host_f32(const Tensor& t, int64_t numel, const std::string& what, bool sizing) {
  WAN_CHECK(t.defined(), "vae decoder: ", what, " is missing");
  WAN_CHECK(t.numel() == numel, "vae decoder: ", what, " has ", t.numel(), " elements, expected ", numel);
  if (sizing) return std::vector<float>(static_cast<size_t>(numel), 0.0f);
  const Tensor f = t.to_f32();
  return std::vector<float>(f.f32(), f.f32() + numel);
}

class WeightBuilder {
 public:
  WeightBuilder(VaeConvMode mode, bool sizing) : pack(sizing), mode_(mode) {}
  Packer pack;

  // A CausalConv3d with temporal kernel 3: filter [cout_pad, kt, kh, kw, cin] (Conv3d mode) or
  // [cout_pad, kh, kw, kt, cin] (Folded2d: the taps are channel blocks), zero rows beyond cout.
  DevConv causal(const VaeConv& c, int64_t cin, int64_t cout, int k, const std::string& what, int64_t cout_pad = 0) {
    DevConv d = head_of(c, cin, cout, what, 5);
    d.kt = 3;
    d.kh = d.kw = k;
    WAN_CHECK(c.weight.dim(2) == 3 && c.weight.dim(3) == k && c.weight.dim(4) == k, "vae decoder: ", what,
              " weight ", c.weight.shape().str(), " is not a 3x", k, "x", k, " kernel");
    d.cout_pad = cout_pad ? cout_pad : cout;
    const std::vector<float> w = host_f32(c.weight, cout * cin * 3 * k * k, what + ".weight", pack.sizing());
    std::vector<uint16_t> o(static_cast<size_t>(d.cout_pad * cin * 3 * k * k), 0);
    for (int64_t co = 0; co < cout; ++co)
      for (int64_t ci = 0; ci < cin; ++ci)
        for (int dt = 0; dt < 3; ++dt)
          for (int dy = 0; dy < k; ++dy)
            for (int dx = 0; dx < k; ++dx) {
              const float v = w[(((co * cin + ci) * 3 + dt) * k + dy) * k + dx];
              const int64_t at = mode_ == VaeConvMode::Conv3d ? (((co * 3 + dt) * k + dy) * k + dx) * cin + ci
                                                               : (((co * k + dy) * k + dx) * 3 + dt) * cin + ci;
              o[at] = f32_to_bf16(v);
            }
    d.w = pack.bf16v(o);
    d.b = bias(c, cout, d.cout_pad, what);
    return d;
  }
  // A Conv2d 3×3: filter [cout, kh, kw, cin].
  DevConv conv2d(const VaeConv& c, int64_t cin, int64_t cout, const std::string& what) {
    DevConv d = head_of(c, cin, cout, what, 4);
    d.kh = d.kw = 3;
    d.cout_pad = cout;
    WAN_CHECK(c.weight.dim(2) == 3 && c.weight.dim(3) == 3, "vae decoder: ", what, " weight ",
              c.weight.shape().str(), " is not 3x3");
    const std::vector<float> w = host_f32(c.weight, cout * cin * 9, what + ".weight", pack.sizing());
    std::vector<uint16_t> o(w.size());
    for (int64_t co = 0; co < cout; ++co)
      for (int64_t ci = 0; ci < cin; ++ci)
        for (int j = 0; j < 9; ++j) o[(co * 9 + j) * cin + ci] = f32_to_bf16(w[(co * cin + ci) * 9 + j]);
    d.w = pack.bf16v(o);
    d.b = bias(c, cout, cout, what);
    return d;
  }
  // A 1×1(×1) conv as a GEMM weight [cout, cin] (already row-major).
  DevConv pointwise(const VaeConv& c, int64_t cin, int64_t cout, const std::string& what) {
    WAN_CHECK(c.present(), "vae decoder: ", what, " is missing");
    WAN_CHECK(c.weight.dim(0) == cout && c.weight.dim(1) == cin && c.weight.numel() == cout * cin, "vae decoder: ",
              what, " weight ", c.weight.shape().str(), " is not a 1x1 conv ", cin, " -> ", cout);
    DevConv d;
    d.cin = cin;
    d.cout = d.cout_pad = cout;
    const std::vector<float> w = host_f32(c.weight, cout * cin, what + ".weight", pack.sizing());
    std::vector<uint16_t> o(w.size());
    for (size_t i = 0; i < w.size(); ++i) o[i] = f32_to_bf16(w[i]);
    d.w = pack.bf16v(o);
    d.b = bias(c, cout, cout, what);
    return d;
  }
  size_t gamma(const Tensor& g, int64_t C, const std::string& what) {
    return pack.f32(host_f32(g, C, what, pack.sizing()));
  }

  DevRes res(const VaeResBlock& b, int64_t cin, int64_t cout, const std::string& what) {
    DevRes r;
    r.cin = cin;
    r.cout = cout;
    r.g1 = gamma(b.norm1, cin, what + ".residual.0.gamma");
    r.c1 = causal(b.conv1, cin, cout, 3, what + ".residual.2");
    r.g2 = gamma(b.norm2, cout, what + ".residual.3.gamma");
    r.c2 = causal(b.conv2, cout, cout, 3, what + ".residual.6");
    r.has_sc = cin != cout;
    if (r.has_sc) r.sc = pointwise(b.shortcut, cin, cout, what + ".shortcut");
    return r;
  }

 private:
  DevConv head_of(const VaeConv& c, int64_t cin, int64_t cout, const std::string& what, int ndim) {
    WAN_CHECK(c.present(), "vae decoder: ", what, " is missing");
    WAN_CHECK(c.weight.ndim() == ndim && c.weight.dim(0) == cout && c.weight.dim(1) == cin, "vae decoder: ", what,
              " weight ", c.weight.shape().str(), " does not map ", cin, " -> ", cout, " channels");
    WAN_CHECK(cin % 8 == 0, "vae decoder: ", what, " has ", cin, " input channels (the GPU decoder needs multiples of 8)");
    DevConv d;
    d.cin = cin;
    d.cout = cout;
    return d;
  }
  size_t bias(const VaeConv& c, int64_t cout, int64_t cout_pad, const std::string& what) {
    std::vector<float> b = host_f32(c.bias, cout, what + ".bias", pack.sizing());
    b.resize(static_cast<size_t>(cout_pad), 0.0f);
    return pack.f32(b);
  }
  VaeConvMode mode_;
};

}  // namespace

DevDecoder pack_decoder(const VaeConfig& config, const VaeWeights& weights, VaeConvMode mode,
                        std::vector<uint8_t>& bytes, size_t* sized) {
  const VaeCoder& d = weights.decoder;
  WeightBuilder wb(mode, sized != nullptr);
  DevDecoder dec;
  WAN_CHECK(d.conv1.present(), "GPU VAE decoder: decoder weights are not loaded");
  const int64_t top = d.conv1.weight.dim(0);
  dec.conv1 = wb.causal(d.conv1, 16, top, 3, "decoder.conv1");
  dec.mid0 = wb.res(d.middle0, top, top, "decoder.middle.0");
  dec.mid1.C = top;
  dec.mid1.g = wb.gamma(d.middle1.norm, top, "decoder.middle.1.norm.gamma");
  dec.mid1.qkv = wb.pointwise(d.middle1.to_qkv, top, 3 * top, "decoder.middle.1.to_qkv");
  dec.mid1.proj = wb.pointwise(d.middle1.proj, top, top, "decoder.middle.1.proj");
  dec.mid2 = wb.res(d.middle2, top, top, "decoder.middle.2");
  int64_t C = top;
  int flat = 0;
  for (const VaeStage& st : d.stages) {
    WAN_CHECK(!st.shortcut, "GPU VAE decoder: the Wan 2.2 DupUp3D stage shortcut is not supported");
    DevStage ds;
    for (const VaeResBlock& b : st.res) {
      WAN_CHECK(b.conv1.present(), "GPU VAE decoder: decoder.upsamples.", flat, " is missing");
      const int64_t cout = b.conv1.weight.dim(0);
      ds.res.push_back(wb.res(b, C, cout, "decoder.upsamples." + std::to_string(flat++)));
      C = cout;
    }
    ds.mode = st.resample.mode;
    const std::string rp = "decoder.upsamples." + std::to_string(flat);
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
    dec.stages.push_back(std::move(ds));
  }
  dec.head_g = wb.gamma(d.head_norm, C, "decoder.head.0.gamma");
  WAN_CHECK(d.head_conv.present() && d.head_conv.weight.dim(0) == 3, "GPU VAE decoder: decoder.head.2 must give 3 channels");
  dec.head = wb.causal(d.head_conv, C, 3, 3, "decoder.head.2", 8);
  WAN_CHECK(weights.conv2.present(), "GPU VAE decoder: conv2 is missing");
  dec.conv2_w = wb.pack.f32(host_f32(weights.conv2.weight, 16 * 16, "conv2.weight", wb.pack.sizing()));
  dec.conv2_b = wb.pack.f32(host_f32(weights.conv2.bias, 16, "conv2.bias", wb.pack.sizing()));
  std::vector<float> inv(16);
  for (int i = 0; i < 16; ++i) inv[i] = 1.0f / config.latents_std[i];  // the reference stores 1/std in fp32
  dec.inv_std = wb.pack.f32(inv);
  dec.mean = wb.pack.f32(config.latents_mean);

  if (sized) *sized = wb.pack.size();
  else bytes = wb.pack.bytes();
  return dec;
}

}  // namespace wan::cuda::vae_gpu_detail
