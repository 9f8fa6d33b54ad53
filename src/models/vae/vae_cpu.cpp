// Chunked causal forward of the Wan VAEs (spec §5.4 and §6; diffusers AutoencoderKLWan._encode /
// _decode with feat_cache).
// Cache model: every cached module owns one Slot, handed out in visiting order by Caches::next();
// the order is the same for every chunk, so slot i always belongs to the same module (this is the
// reference's feat_idx counter). Rules reproduced:
// - kt = 3 causal convs (conv1, residual convs, head, upsample3d time_conv): the conv sees the last
//   2 frames of its input stream before this chunk (zero frames before the stream start); the slot
//   keeps those frames. This equals the reference's cache_x rule, including the 1-frame chunk case.
// - upsample3d: on its first call the slot becomes the "Rep" marker and time_conv is skipped; from
//   the second call on it is a plain cached causal conv whose stream starts at the second call
//   (the reference's zero frame in the Rep branch).
// - downsample3d: on its first call the chunk passes through (time_conv skipped) and its last frame
//   is kept; later calls run the stride-2 time_conv on [kept frame, chunk] without padding.
// - 1x1x1 convs (shortcuts, top-level conv1/conv2) and attention have no temporal context.
#include "models/vae/vae_cpu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "ops/vae_ops.h"

namespace wan {
namespace {

using vae::ConvGeom;

struct Slot {
  bool seen = false;  // called before (upsample3d: holds "Rep"; downsample3d: first chunk stored)
  Tensor frames;      // [n <= 2, C, H, W] cached input frames (undefined = none yet)
};

class Caches {
 public:
  void start_chunk() { next_ = 0; }
  Slot& next() {
    if (next_ == slots_.size()) slots_.emplace_back();
    return slots_[next_++];
  }

 private:
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

// Causal conv with kt - 1 frames of history from the slot (kt = 3), spatial zero padding pad_hw.
Tensor causal_conv(const Tensor& x, const VaeConv& c, int pad_hw, Slot& s) {
  const int64_t hist = c.weight.dim(2) - 1;
  const int64_t cached = s.frames.defined() ? s.frames.dim(0) : 0;
  std::vector<const float*> f;
  for (int64_t i = cached; i < hist; ++i) f.push_back(nullptr);
  for (int64_t i = 0; i < cached; ++i) f.push_back(vae::frame_ptr(s.frames, i));
  for (int64_t i = 0; i < x.dim(0); ++i) f.push_back(vae::frame_ptr(x, i));
  Tensor y = vae::conv3d(f, x.dim(1), x.dim(2), x.dim(3), c.weight, c.bias, ConvGeom::same(pad_hw));
  // New history: the last `hist` frames of (old history ++ x).
  if (x.dim(0) >= hist) {
    s.frames = vae::slice_frames(x, x.dim(0) - hist, x.dim(0));
  } else {
    Tensor all = vae::cat_frames(s.frames, x);
    s.frames = vae::slice_frames(all, std::max<int64_t>(0, all.dim(0) - hist), all.dim(0));
  }
  return y;
}

// 1x1x1 conv over all frames (no temporal context).
Tensor pointwise_conv(const Tensor& x, const VaeConv& c) {
  return vae::conv3d(vae::frame_list(x), x.dim(1), x.dim(2), x.dim(3), c.weight, c.bias, ConvGeom{});
}

Tensor res_block(const VaeResBlock& b, const Tensor& x, Caches& cc) {
  const Tensor h = b.shortcut.present() ? pointwise_conv(x, b.shortcut) : x;
  Tensor a = vae::rms_norm(x, b.norm1, /*silu=*/true);
  a = causal_conv(a, b.conv1, 1, cc.next());
  a = vae::rms_norm(a, b.norm2, /*silu=*/true);  // dropout (p = 0) is the identity
  a = causal_conv(a, b.conv2, 1, cc.next());
  vae::add_inplace(a, h);
  return a;
}

Tensor resample(const VaeResample& r, Tensor x, Caches& cc) {
  switch (r.mode) {
    case VaeResampleMode::None:
      return x;
    case VaeResampleMode::Upsample3d: {
      Slot& s = cc.next();
      if (!s.seen) {
        s.seen = true;  // "Rep": no temporal doubling on the first chunk
      } else {
        const int64_t T = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
        // [T, 2C, H, W] frame-major: channels [0, C) of frame t are output frame 2t, [C, 2C) frame
        // 2t + 1, which is exactly the memory of [2T, C, H, W].
        x = causal_conv(x, r.time_conv, 0, s).reshape(Shape{2 * T, C, H, W});
      }
      return vae::conv2d_frames(vae::upsample_nearest2x(x), r.resample.weight, r.resample.bias, ConvGeom::same(1));
    }
    case VaeResampleMode::Upsample2d:
      return vae::conv2d_frames(vae::upsample_nearest2x(x), r.resample.weight, r.resample.bias, ConvGeom::same(1));
    case VaeResampleMode::Downsample2d:
    case VaeResampleMode::Downsample3d: {
      // ZeroPad2d((0, 1, 0, 1)) then a stride-2 3x3 conv without padding.
      const ConvGeom down{1, 2, 2, 0, 1, 0, 1};
      x = vae::conv2d_frames(x, r.resample.weight, r.resample.bias, down);
      if (r.mode == VaeResampleMode::Downsample2d) return x;
      Slot& s = cc.next();
      const Tensor last = vae::slice_frames(x, x.dim(0) - 1, x.dim(0));
      if (!s.seen) {
        s.seen = true;
        s.frames = last;
        return x;
      }
      std::vector<const float*> f{vae::frame_ptr(s.frames, 0)};
      for (int64_t i = 0; i < x.dim(0); ++i) f.push_back(vae::frame_ptr(x, i));
      Tensor y = vae::conv3d(f, x.dim(1), x.dim(2), x.dim(3), r.time_conv.weight, r.time_conv.bias,
                             ConvGeom{2, 1, 1, 0, 0, 0, 0});
      s.frames = last;
      return y;
    }
  }
  WAN_THROW_INTERNAL("unknown resample mode");
}

Tensor middle(const VaeCoder& m, Tensor x, Caches& cc) {
  x = res_block(m.middle0, x, cc);
  x = vae::attention_block(x, m.middle1.norm, m.middle1.to_qkv.weight, m.middle1.to_qkv.bias,
                           m.middle1.proj.weight, m.middle1.proj.bias);
  return res_block(m.middle2, x, cc);
}

Tensor head(const VaeCoder& m, const Tensor& x, Caches& cc) {
  return causal_conv(vae::rms_norm(x, m.head_norm, /*silu=*/true), m.head_conv, 1, cc.next());
}

// Encoder3d on one chunk [T, C, H, W] (frame-major).
Tensor encoder_chunk(const VaeCoder& e, Tensor x, Caches& cc) {
  cc.start_chunk();
  x = causal_conv(x, e.conv1, 1, cc.next());
  for (const VaeStage& st : e.stages) {
    const Tensor in = x;
    for (const VaeResBlock& b : st.res) x = res_block(b, x, cc);
    x = resample(st.resample, x, cc);
    if (st.shortcut) vae::add_inplace(x, vae::avg_down3d(in, st.shortcut_out, st.shortcut_ft, st.shortcut_fs));
  }
  x = middle(e, x, cc);
  return head(e, x, cc);
}

// Decoder3d on one latent frame [1, z, h, w] (frame-major).
Tensor decoder_chunk(const VaeCoder& d, Tensor x, Caches& cc, bool first_chunk) {
  cc.start_chunk();
  x = causal_conv(x, d.conv1, 1, cc.next());
  x = middle(d, x, cc);
  for (const VaeStage& st : d.stages) {
    const Tensor in = x;
    for (const VaeResBlock& b : st.res) x = res_block(b, x, cc);
    x = resample(st.resample, x, cc);
    if (st.shortcut)
      vae::add_inplace(x, vae::dup_up3d(in, st.shortcut_out, st.shortcut_ft, st.shortcut_fs, first_chunk));
  }
  return head(d, x, cc);
}

// inv[c] = 1 / std[c] in float32, as the reference stores it.
std::vector<float> inv_std(const VaeConfig& c) {
  std::vector<float> inv(c.latents_std.size());
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / c.latents_std[i];
  return inv;
}

}  // namespace

size_t vae_decode_bytes(const VaeConfig& c, int64_t T, int64_t h, int64_t w) {
  // Resolution level l (0: latent, 3: the decoder's output) holds dec_dim · dim_mult[3 - l] channels
  // (its stage's width; the stage's input is at most that), 2^l times the latent size, and up to
  // temporal-factor frames per chunk. Per level: the res blocks' convolutions, the up-sampler's
  // time_conv, and at level 0 conv1 + the middle block, at the last level the head.
  const int levels = static_cast<int>(c.dim_mult.size());
  const int tf = vae_temporal_factor(c), sf = vae_spatial_factor(c);
  double caches = 0, working = 0;
  for (int l = 0; l < levels; ++l) {
    const double C = static_cast<double>(c.dec_dim) * c.dim_mult[static_cast<size_t>(levels - 1 - std::min(l, levels - 1))];
    const double Cin = C;  // a stage's first convolution reads at most its width (the up-sampler halves it)
    const double hw = static_cast<double>(h << l) * static_cast<double>(w << l);
    const int convs = 2 * (c.num_res_blocks + 1) + 1 + (l == 0 ? 5 : 0) + (l == levels - 1 ? 1 : 0);
    caches += convs * 2.0 * Cin * hw;
    working = std::max(working, 6.0 * tf * Cin * hw);
  }
  const double F = 1.0 + static_cast<double>(tf) * static_cast<double>(T - 1);
  const double video = 2.0 * F * 3.0 * static_cast<double>(h * sf) * static_cast<double>(w * sf);
  const double latents = 2.0 * c.z_dim * static_cast<double>(T) * static_cast<double>(h * w);
  const double bytes = 4.0 * (caches + working + video + latents);
  return bytes > 1.8e19 ? SIZE_MAX : static_cast<size_t>(bytes);
}

Tensor vae_decode(const VaeConfig& c, const VaeWeights& w, const Tensor& latents, bool clamp,
                  const VaeProgress& progress) {
  vae_validate(c);
  WAN_CHECK(w.conv2.present() && w.decoder.conv1.present(), "vae_decode: decoder weights are not loaded");
  WAN_CHECK(latents.ndim() == 4 && latents.dim(0) == c.z_dim && latents.dim(1) >= 1, "vae_decode: latents ",
            latents.shape().str(), " are not [", c.z_dim, ", T, H, W]");
  WAN_CHECK(dtype_is_float(latents.dtype()), "vae_decode: latents must be floating point");
  // Un-normalise in [T, C, h, w] order: mu = z / (1/std) + mean (the reference divides by the
  // stored reciprocal).
  Tensor z = vae::to_frames(latents);
  const int64_t T = z.dim(0), C = z.dim(1), hw = z.dim(2) * z.dim(3);
  const std::vector<float> inv = inv_std(c);
  float* zp = z.f32();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t i = 0; i < hw; ++i) {
        float& v = zp[(t * C + ch) * hw + i];
        v = v / inv[ch] + c.latents_mean[ch];
      }
  const Tensor x = pointwise_conv(z, w.conv2);

  Caches cc;
  const int tf = vae_temporal_factor(c);
  const int64_t F = 1 + tf * (T - 1);
  Tensor video;  // [F, 3, H, W] frame-major, allocated after the first chunk
  int64_t done = 0;
  for (int64_t t = 0; t < T; ++t) {
    Tensor out = decoder_chunk(w.decoder, vae::slice_frames(x, t, t + 1), cc, t == 0);
    if (c.patch > 1) out = vae::unpatchify(out, c.patch);
    if (!video.defined()) video = Tensor::empty(DType::F32, {F, out.dim(1), out.dim(2), out.dim(3)});
    WAN_ASSERT(done + out.dim(0) <= F, "decoder produced more frames than ", F);
    std::memcpy(video.f32() + done * vae::frame_elems(video), out.f32(), out.nbytes());
    done += out.dim(0);
    if (progress) progress(static_cast<int>(t + 1), static_cast<int>(T));
  }
  WAN_ASSERT(done == F, "decoder produced ", done, " frames, expected ", F);
  if (clamp) vae::clamp_inplace(video, -1.0f, 1.0f);
  return vae::from_frames(video);
}

Tensor vae_decode_tiled(const VaeConfig& c, const VaeWeights& w, const Tensor& latents, const VaeTiling& tiling,
                        bool clamp, const VaeProgress& progress) {
  WAN_CHECK(latents.ndim() == 4, "vae_decode: latents ", latents.shape().str(), " are not [", c.z_dim, ", T, H, W]");
  const int64_t tiles = vae_tile_count(latents.dim(2), latents.dim(3), tiling);
  if (tiles == 1) return vae_decode(c, w, latents, clamp, progress);
  const int T = static_cast<int>(latents.dim(1)), total = static_cast<int>(tiles) * T;
  int done = 0;
  return vae_tiled_decode(latents, tiling, vae_spatial_factor(c), clamp, [&](const Tensor& tile) {
    Tensor v = vae_decode(c, w, tile, /*clamp=*/false, [&](int d, int) {
      if (progress) progress(done + d, total);
    });
    done += T;
    return v;
  });
}

Tensor vae_encode(const VaeConfig& c, const VaeWeights& w, const Tensor& video, const VaeProgress& progress) {
  vae_validate(c);
  WAN_CHECK(w.conv1.present() && w.encoder.conv1.present(), "vae_encode: encoder weights are not loaded");
  WAN_CHECK(video.ndim() == 4 && video.dim(0) == 3, "vae_encode: video ", video.shape().str(),
            " is not [3, F, H, W]");
  WAN_CHECK(dtype_is_float(video.dtype()), "vae_encode: video must be floating point");
  const int tf = vae_temporal_factor(c), sf = vae_spatial_factor(c);
  const int64_t F = video.dim(1);
  WAN_CHECK(F >= 1 && (F - 1) % tf == 0, "vae_encode: ", F, " frames; the VAE takes 1 + ", tf, "k frames");
  WAN_CHECK(video.dim(2) % sf == 0 && video.dim(3) % sf == 0, "vae_encode: frame size ", video.dim(2), "x",
            video.dim(3), " is not a multiple of ", sf);
  Tensor x = vae::to_frames(video);
  if (c.patch > 1) x = vae::patchify(x, c.patch);

  Caches cc;
  const int64_t chunks = 1 + (F - 1) / tf;
  Tensor out;  // [T_lat, 2z, h, w]
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t t0 = i == 0 ? 0 : 1 + tf * (i - 1), t1 = i == 0 ? 1 : 1 + tf * i;
    out = vae::cat_frames(out, encoder_chunk(w.encoder, vae::slice_frames(x, t0, t1), cc));
    if (progress) progress(static_cast<int>(i + 1), static_cast<int>(chunks));
  }
  const Tensor moments = pointwise_conv(out, w.conv1);  // [T, 2z, h, w]: mean | logvar
  const int64_t T = moments.dim(0), hw = moments.dim(2) * moments.dim(3);
  Tensor mu = Tensor::empty(DType::F32, {T, c.z_dim, moments.dim(2), moments.dim(3)});
  const std::vector<float> inv = inv_std(c);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t ch = 0; ch < c.z_dim; ++ch) {
      const float* src = vae::frame_ptr(moments, t) + ch * hw;
      float* dst = mu.f32() + (t * c.z_dim + ch) * hw;
      for (int64_t i = 0; i < hw; ++i) dst[i] = (src[i] - c.latents_mean[ch]) * inv[ch];
    }
  return vae::from_frames(mu);
}

}  // namespace wan
