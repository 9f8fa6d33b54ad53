// The DiT weight table (see weights.h).
#include "models/dit/weights.h"

#include <cmath>

#include "core/error.h"

namespace wan {

WeightTable dit_weight_table(const DiTConfig& c) {
  const int64_t D = c.dim, F = c.ffn_dim;
  const int64_t P = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  const DType bf = DType::BF16, f32 = DType::F32;
  const InitRule modulation = init_normal(static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
  WeightTable t;
  auto add = [&](std::string name, Shape shape, WeightClass cls, InitRule init, DType dt, std::string fused = {}) {
    t.push_back({std::move(name), shape, cls, init, dt, std::move(fused)});
  };
  // nn.Linear(in, out): weight [out, in] and bias [out], both U(±1/sqrt(in)).
  auto linear = [&](const std::string& m, int64_t in, int64_t out, DType dt, const std::string& fused = {}) {
    add(m + ".weight", {out, in}, WeightClass::GemmWeight, init_fan_in(in), dt, fused.empty() ? "" : fused + ".weight");
    add(m + ".bias", {out}, WeightClass::GemmBias, init_fan_in(in), dt, fused.empty() ? "" : fused + ".bias");
  };
  add("patch_embedding.weight", {D, c.in_dim, c.patch[0], c.patch[1], c.patch[2]}, WeightClass::GemmWeight,
      init_fan_in(c.in_dim * P), bf);
  add("patch_embedding.bias", {D}, WeightClass::GemmBias, init_fan_in(c.in_dim * P), bf);
  linear("text_embedding.0", c.text_dim, D, bf);
  linear("text_embedding.2", D, D, bf);
  linear("time_embedding.0", c.freq_dim, D, f32);
  linear("time_embedding.2", D, D, f32);
  linear("time_projection.1", D, 6 * D, f32);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    for (const char* a : {"self_attn", "cross_attn"}) {
      const std::string m = p + a;
      const bool self = a[0] == 's';
      linear(m + ".q", D, D, bf, self ? m + ".qkv" : "");
      linear(m + ".k", D, D, bf, self ? m + ".qkv" : m + ".kv");
      linear(m + ".v", D, D, bf, self ? m + ".qkv" : m + ".kv");
      linear(m + ".o", D, D, bf);
      add(m + ".norm_q.weight", {D}, WeightClass::Norm, init_norm_scale(), bf);
      add(m + ".norm_k.weight", {D}, WeightClass::Norm, init_norm_scale(), bf);
      if (self) {
        // norm3 (the affine cross-attention pre-norm) is registered between the two attentions.
        add(p + "norm3.weight", {D}, WeightClass::Norm, init_norm_scale(), f32);
        add(p + "norm3.bias", {D}, WeightClass::NormBias, init_norm_bias(), f32);
      }
    }
    linear(p + "ffn.0", D, F, bf);
    linear(p + "ffn.2", F, D, bf);
    add(p + "modulation", {1, 6, D}, WeightClass::Modulation, modulation, f32);
  }
  linear("head.head", D, static_cast<int64_t>(c.out_dim) * P, f32);
  add("head.modulation", {1, 2, D}, WeightClass::Modulation, modulation, f32);
  return t;
}

std::map<std::string, Shape> dit_expected_shapes(const DiTConfig& c) { return shape_map(dit_weight_table(c)); }

}  // namespace wan
