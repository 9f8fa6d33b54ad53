// GPU-test helpers that know the engine's types (Tensor, the DiT's inputs), apart from gpu_test_util.h so
// that tests of single kernels do not see them.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "core/tensor.h"
#include "lora/lora.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/weights.h"
#include "testing/make_lora.h"
#include "gpu_test_util.h"

namespace wan::gpu_test {

// ||a - b|| / ||b|| of two f32 tensors of one shape; infinite (and a failure) for other shapes, and
// infinite when a holds a non-finite value.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (!(a.shape() == b.shape())) return INFINITY;
  double d = 0, n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.f32()[i], y = b.f32()[i];
    if (!std::isfinite(x)) return INFINITY;
    d += (x - y) * (x - y);
    n += y * y;
  }
  return std::sqrt(d / n);
}
// The host inputs of one DiT forward (cuda::DiTGpu::forward): latents, timesteps and f32 text states.
// t_first (one per sample, used iff shape.first_frame_t): the timestep of latent frame 0's tokens.
struct DiTHostInputs {
  cuda::DiTShape shape;
  std::vector<float> x, t, ctx, t_first;
  std::vector<int64_t> lens;
  int64_t ctx_rows = 128;
  cuda::DiTInputs in() const {
    cuda::DiTInputs i;
    i.x = x.data(), i.t = t.data(), i.context = ctx.data(), i.context_dtype = DType::F32;
    i.ctx_rows = ctx_rows, i.ctx_lens = lens.data();
    i.t_first = shape.first_frame_t ? t_first.data() : nullptr;
    return i;
  }
  // The reference's timesteps (wan::dit_forward): [B] per sample, or with shape.first_frame_t per token
  // [B, f·h·w]: t_first[b] for the first (H/ph)·(W/pw) tokens of sample b (latent frame 0), t[b] after.
  Tensor cpu_t(const DiTConfig& c) const {
    const int64_t B = shape.batch;
    if (!shape.first_frame_t) {
      Tensor r = Tensor::empty(DType::F32, {B});
      std::copy(t.begin(), t.end(), r.f32());
      return r;
    }
    EXPECT_EQ(t_first.size(), static_cast<size_t>(B));
    const int64_t hw = (shape.height / c.patch[1]) * (shape.width / c.patch[2]);
    const int64_t L = (shape.frames / c.patch[0]) * hw;
    Tensor r = Tensor::empty(DType::F32, {B, L});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < L; ++n) r.f32()[b * L + n] = n < hw ? t_first[b] : t[b];
    return r;
  }
  Tensor cpu_x(const DiTConfig& c) const {
    Tensor r = Tensor::empty(DType::F32, {shape.batch, c.in_dim, shape.frames, shape.height, shape.width});
    EXPECT_EQ(x.size(), static_cast<size_t>(r.numel()));
    std::copy(x.begin(), x.end(), r.f32());
    return r;
  }
  Tensor cpu_ctx(const DiTConfig& c) const {
    Tensor r = Tensor::empty(DType::F32, {shape.batch, ctx_rows, c.text_dim});
    EXPECT_EQ(ctx.size(), static_cast<size_t>(r.numel()));
    std::copy(ctx.begin(), ctx.end(), r.f32());
    return r;
  }
  size_t out_numel(const DiTConfig& c) const {
    return static_cast<size_t>(shape.batch * c.out_dim * shape.frames * shape.height * shape.width);
  }
};
// x ~ N(0, 1) from `seed`, the text states ~ N(0, 0.2²) from seed + 1; one timestep and one text length
// per sample.
inline DiTHostInputs dit_host_inputs(const DiTConfig& c, const cuda::DiTShape& s, uint64_t seed, std::vector<float> t,
                                     std::vector<int64_t> lens, int64_t ctx_rows = 128) {
  DiTHostInputs f;
  f.shape = s;
  f.x = randn(seed, static_cast<size_t>(s.batch * c.in_dim * s.frames * s.height * s.width), 1.0f);
  f.t = std::move(t);
  f.lens = std::move(lens);
  f.ctx_rows = ctx_rows;
  f.ctx = randn(seed + 1, static_cast<size_t>(s.batch * ctx_rows * c.text_dim), 0.2f);
  EXPECT_EQ(f.t.size(), static_cast<size_t>(s.batch));
  EXPECT_EQ(f.lens.size(), static_cast<size_t>(s.batch));
  return f;
}

// A LoRA set for `cfg` read from `dir`/lora.safetensors, which it writes: one kohya file of rank 4 (alpha 2,
// up factors ~ N(0, 0.05²), seed 21) on every projection, strength 1.1, for the high-noise expert.
inline std::shared_ptr<const LoraSet> tiny_kohya_lora(const DiTConfig& cfg, const std::string& dir) {
  gen::MakeLoraOptions l;
  l.dit = cfg;
  l.rank = 4;
  l.alpha = 2.0f;
  l.format = gen::LoraFormat::Kohya;
  l.dtype = DType::F32;
  l.seed = 21;
  l.up_std = 0.05f;
  l.out = dir + "/lora.safetensors";
  gen::make_lora(l);
  return std::make_shared<const LoraSet>(
      load_lora_set({{l.out, 1.1f, LoraExpert::All}}, LoraExpert::High, dit_weight_table(cfg)));
}

}  // namespace wan::gpu_test
