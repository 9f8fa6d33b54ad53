// What the GPU VAE tests (test_vae_gpu*.cu) share: random VAEs and inputs, and the precision baseline,
// the VAE computed plainly in bf16 on the CPU (bf16 weights, every op's output rounded to bf16, the
// reference's chunked causal schedule of src/models/vae/vae_cpu.cpp re-stated with rounding). The rule
// (issue 4): the GPU's relative L2 error against the fp32 CPU reference (vae_encode / vae_decode) is
// at most twice that baseline's. Both coders, Wan 2.1 and Wan 2.2.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../cpu/vae_test_weights.h"
#include "core/philox.h"
#include "gpu_test_util.h"
#include "models/config.h"
#include "models/vae/weights.h"
#include "ops/vae_ops.h"

namespace wan::vae_gpu_test {

using gpu_test::Err;
using gpu_test::error_vs;  // overloaded for tensors below
using gpu_test::rb;

// error_vs over two fp32 tensors, whose shapes must agree.
inline Err error_vs(const Tensor& out, const Tensor& ref) {
  EXPECT_EQ(out.shape().str(), ref.shape().str());
  const size_t n = static_cast<size_t>(std::min(out.numel(), ref.numel()));
  return gpu_test::error_vs(std::vector<float>(out.f32(), out.f32() + n), std::vector<float>(ref.f32(), ref.f32() + n));
}

// ---- random models and inputs ----

// Random weights and latents (tests/cpu/vae_test_weights.h, shared with the CPU tests).
inline VaeWeights random_weights(const VaeConfig& c, uint64_t seed) { return test::random_vae_test_weights(c, seed); }
inline Tensor random_latents(int64_t z, int64_t T, int64_t h, int64_t w, uint64_t seed) {
  return test::random_vae_test_latents(z, T, h, w, seed);
}

// A video [3, F, H, W] in [-1, 1]: a smooth pattern plus noise (0.5·tanh of normals); frames from
// zero_from on are all zero (the I2V input: one image, then zero frames).
inline Tensor random_video(int64_t F, int64_t H, int64_t W, uint64_t seed, int64_t zero_from = -1) {
  Tensor t = Tensor::f32({3, F, H, W});
  philox_normal_fill(seed, 0, t.f32(), static_cast<size_t>(t.numel()));
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t f = 0; f < F; ++f)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) {
          float& v = t.f32()[((c * F + f) * H + y) * W + x];
          const float smooth =
              0.5f * std::sin(0.21f * static_cast<float>(x + 2 * c) + 0.13f * static_cast<float>(y + f));
          v = (zero_from >= 0 && f >= zero_from) ? 0.0f : std::tanh(smooth + 0.5f * v);
        }
  return t;
}

// ---- the plain-bf16 baseline ----

inline void round_inplace(Tensor& t) {
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rb(p[i]);
}
inline Tensor rt(Tensor t) {
  round_inplace(t);
  return t;
}
inline Tensor rounded_copy(const Tensor& t) { return t.defined() ? rt(t.to_f32().clone()) : t; }
inline void round_conv(VaeConv& c) {
  c.weight = rounded_copy(c.weight);
  c.bias = rounded_copy(c.bias);
}
inline void round_res(VaeResBlock& b) {
  b.norm1 = rounded_copy(b.norm1);
  b.norm2 = rounded_copy(b.norm2);
  round_conv(b.conv1);
  round_conv(b.conv2);
  round_conv(b.shortcut);
}
inline void round_coder(VaeCoder& d) {
  round_conv(d.conv1);
  round_res(d.middle0);
  round_res(d.middle2);
  d.middle1.norm = rounded_copy(d.middle1.norm);
  round_conv(d.middle1.to_qkv);
  round_conv(d.middle1.proj);
  for (VaeStage& st : d.stages) {
    for (VaeResBlock& b : st.res) round_res(b);
    round_conv(st.resample.resample);
    round_conv(st.resample.time_conv);
  }
  d.head_norm = rounded_copy(d.head_norm);
  round_conv(d.head_conv);
}
// One coder rounded (the other shared as it is); the top-level 1×1×1 convs stay fp32 (the GPU runs
// them in fp32 too).
inline VaeWeights rounded_weights(const VaeWeights& w, bool encoder) {
  VaeWeights r = w;
  round_coder(encoder ? r.encoder : r.decoder);
  return r;
}

// The reference's per-conv history (vae_cpu.cpp keeps its own private): the last 2 input frames, or
// downsample3d's kept frame.
struct Slot {
  bool seen = false;  // upsample3d "Rep" / downsample3d first chunk done
  Tensor frames;      // [n <= 2, C, H, W]
};
struct Caches {
  std::vector<Slot> slots;
  size_t i = 0;
  void start_chunk() { i = 0; }
  Slot& next() {
    if (i == slots.size()) slots.emplace_back();
    return slots[i++];
  }
};
inline Tensor causal_conv(const Tensor& x, const VaeConv& c, int pad_hw, Slot& s) {
  const int64_t hist = c.weight.dim(2) - 1, cached = s.frames.defined() ? s.frames.dim(0) : 0;
  std::vector<const float*> f;
  for (int64_t i = cached; i < hist; ++i) f.push_back(nullptr);
  for (int64_t i = 0; i < cached; ++i) f.push_back(vae::frame_ptr(s.frames, i));
  for (int64_t i = 0; i < x.dim(0); ++i) f.push_back(vae::frame_ptr(x, i));
  Tensor y = vae::conv3d(f, x.dim(1), x.dim(2), x.dim(3), c.weight, c.bias, vae::ConvGeom::same(pad_hw));
  const Tensor all = vae::cat_frames(s.frames, x);
  s.frames = vae::slice_frames(all, std::max<int64_t>(0, all.dim(0) - hist), all.dim(0));
  return y;
}
inline Tensor pointwise_conv(const Tensor& x, const VaeConv& c) {
  return vae::conv3d(vae::frame_list(x), x.dim(1), x.dim(2), x.dim(3), c.weight, c.bias, vae::ConvGeom{});
}

inline Tensor res_bf16(const VaeResBlock& b, const Tensor& x, Caches& cc) {
  const Tensor h = b.shortcut.present() ? rt(pointwise_conv(x, b.shortcut)) : x;
  Tensor a = rt(vae::rms_norm(x, b.norm1, true));
  a = rt(causal_conv(a, b.conv1, 1, cc.next()));
  a = rt(vae::rms_norm(a, b.norm2, true));
  a = rt(causal_conv(a, b.conv2, 1, cc.next()));
  vae::add_inplace(a, h);
  return rt(a);
}

inline Tensor middle_bf16(const VaeCoder& d, Tensor x, Caches& cc) {
  x = res_bf16(d.middle0, x, cc);
  x = rt(vae::attention_block(x, d.middle1.norm, d.middle1.to_qkv.weight, d.middle1.to_qkv.bias, d.middle1.proj.weight,
                              d.middle1.proj.bias));
  return res_bf16(d.middle2, x, cc);
}

inline Tensor head_bf16(const VaeCoder& d, const Tensor& x, Caches& cc) {
  return rt(causal_conv(rt(vae::rms_norm(x, d.head_norm, true)), d.head_conv, 1, cc.next()));
}

inline Tensor resample_bf16(const VaeResample& r, Tensor x, Caches& cc) {
  switch (r.mode) {
    case VaeResampleMode::None:
      return x;
    case VaeResampleMode::Upsample3d: {
      Slot& s = cc.next();
      if (!s.seen) {
        s.seen = true;
      } else {
        const int64_t T = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
        x = rt(causal_conv(x, r.time_conv, 0, s)).reshape(Shape{2 * T, C, H, W});
      }
      [[fallthrough]];
    }
    case VaeResampleMode::Upsample2d:
      return rt(vae::conv2d_frames(vae::upsample_nearest2x(x), r.resample.weight, r.resample.bias,
                                   vae::ConvGeom::same(1)));
    default:
      break;
  }
  x = rt(vae::conv2d_frames(x, r.resample.weight, r.resample.bias, vae::ConvGeom{1, 2, 2, 0, 1, 0, 1}));
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
  Tensor y = rt(vae::conv3d(f, x.dim(1), x.dim(2), x.dim(3), r.time_conv.weight, r.time_conv.bias,
                            vae::ConvGeom{2, 1, 1, 0, 0, 0, 0}));
  s.frames = last;  // after the conv: f points into the old kept frame
  return y;
}

// One stage (residual blocks, resampler, Wan 2.2 shortcut) of either coder.
inline Tensor stage_bf16(const VaeStage& st, Tensor x, Caches& cc, bool decoder, bool first_chunk) {
  const Tensor in = x;
  for (const VaeResBlock& b : st.res) x = res_bf16(b, x, cc);
  x = resample_bf16(st.resample, x, cc);
  if (!st.shortcut) return x;
  vae::add_inplace(x, decoder ? vae::dup_up3d(in, st.shortcut_out, st.shortcut_ft, st.shortcut_fs, first_chunk)
                              : vae::avg_down3d(in, st.shortcut_out, st.shortcut_ft, st.shortcut_fs));
  return rt(x);
}

inline Tensor decode_bf16_plain(const VaeConfig& c, const VaeWeights& w32, const Tensor& latents, bool clamp) {
  const VaeWeights w = rounded_weights(w32, false);
  const VaeCoder& d = w.decoder;
  Tensor z = vae::to_frames(latents);
  const int64_t T = z.dim(0), C = z.dim(1), hw = z.dim(2) * z.dim(3);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t i = 0; i < hw; ++i) {
        float& v = z.f32()[(t * C + ch) * hw + i];
        v = v / (1.0f / c.latents_std[ch]) + c.latents_mean[ch];
      }
  const Tensor x0 = rt(pointwise_conv(z, w.conv2));
  Caches cc;
  Tensor video;
  for (int64_t t = 0; t < T; ++t) {
    cc.start_chunk();
    Tensor x = rt(causal_conv(vae::slice_frames(x0, t, t + 1), d.conv1, 1, cc.next()));
    x = middle_bf16(d, x, cc);
    for (const VaeStage& st : d.stages) x = stage_bf16(st, x, cc, true, t == 0);
    x = head_bf16(d, x, cc);
    if (c.patch > 1) x = vae::unpatchify(x, c.patch);
    video = vae::cat_frames(video, x);
  }
  if (clamp) vae::clamp_inplace(video, -1.0f, 1.0f);
  return vae::from_frames(video);
}

inline Tensor encode_bf16_plain(const VaeConfig& c, const VaeWeights& w32, const Tensor& video) {
  const VaeWeights w = rounded_weights(w32, true);
  const VaeCoder& e = w.encoder;
  Tensor x = vae::to_frames(video);
  if (c.patch > 1) x = vae::patchify(x, c.patch);
  x = rt(x);
  const int tf = vae_temporal_factor(c);
  const int64_t chunks = 1 + (x.dim(0) - 1) / tf;
  Caches cc;
  Tensor out;
  for (int64_t i = 0; i < chunks; ++i) {
    cc.start_chunk();
    const int64_t t0 = i == 0 ? 0 : 1 + tf * (i - 1), t1 = i == 0 ? 1 : 1 + tf * i;
    Tensor y = rt(causal_conv(vae::slice_frames(x, t0, t1), e.conv1, 1, cc.next()));
    for (const VaeStage& st : e.stages) y = stage_bf16(st, y, cc, false, i == 0);
    y = middle_bf16(e, y, cc);
    out = vae::cat_frames(out, head_bf16(e, y, cc));
  }
  const Tensor moments = pointwise_conv(out, w.conv1);  // fp32, as on the GPU
  const int64_t T = moments.dim(0), hw = moments.dim(2) * moments.dim(3);
  Tensor mu = Tensor::f32({T, c.z_dim, moments.dim(2), moments.dim(3)});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t ch = 0; ch < c.z_dim; ++ch)
      for (int64_t i = 0; i < hw; ++i)
        mu.f32()[(t * c.z_dim + ch) * hw + i] =
            (vae::frame_ptr(moments, t)[ch * hw + i] - c.latents_mean[ch]) * (1.0f / c.latents_std[ch]);
  return vae::from_frames(mu);
}

// The rule, printed and asserted: GPU error at most twice the baseline's; the baseline itself sane.
inline void expect_within_2x_baseline(const Err& gpu, const Err& base, const std::string& what) {
  std::printf("[ %s ] GPU rel L2 %.3e (%.2fx plain bf16 %.3e), max abs %.3e\n", what.c_str(), gpu.rel_l2,
              gpu.rel_l2 / std::max(base.rel_l2, 1e-30), base.rel_l2, gpu.max_abs);
  std::fflush(stdout);
  EXPECT_EQ(gpu.nonfinite, 0u) << what << ": unwritten or non-finite outputs";
  EXPECT_GT(base.rel_l2, 0.0) << what << ": the baseline is not rounded";
  EXPECT_LT(base.rel_l2, 0.1) << what << ": the plain-bf16 baseline is far from the fp32 reference";
  EXPECT_LE(gpu.rel_l2, 2.0 * base.rel_l2) << what << ": GPU rel L2 " << gpu.rel_l2 << " vs plain bf16 " << base.rel_l2;
}

}  // namespace wan::vae_gpu_test
