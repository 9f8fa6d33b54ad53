// The UMT5 weight table (see weights.h).
#include "models/umt5/weights.h"

#include "core/error.h"

namespace wan {

WeightTable umt5_weight_table(const T5Config& c) {
  WAN_CHECK(c.dim > 0 && c.dim_attn > 0 && c.dim_ffn > 0 && c.num_heads > 0 && c.num_layers > 0 && c.vocab > 0 &&
                c.dim_attn % c.num_heads == 0,
            "invalid T5 config (dim ", c.dim, ", dim_attn ", c.dim_attn, ", heads ", c.num_heads, ")");
  const DType bf = DType::BF16, f32 = DType::F32;
  WeightTable t;
  auto add = [&](std::string name, Shape shape, WeightClass cls, InitRule init, DType dt, std::string fused = {}) {
    t.push_back({std::move(name), shape, cls, init, dt, std::move(fused)});
  };
  // nn.Linear(in, out, bias=False)
  auto linear = [&](const std::string& m, int64_t in, int64_t out, const std::string& fused = {}) {
    add(m + ".weight", {out, in}, WeightClass::GemmWeight, init_fan_in(in), bf, fused);
  };
  add("token_embedding.weight", {c.vocab, c.dim}, WeightClass::Embedding, init_normal(1.0f), bf);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    add(p + "norm1.weight", {c.dim}, WeightClass::Norm, init_norm_scale(), f32);
    linear(p + "attn.q", c.dim, c.dim_attn, p + "attn.qkv");
    linear(p + "attn.k", c.dim, c.dim_attn, p + "attn.qkv");
    linear(p + "attn.v", c.dim, c.dim_attn, p + "attn.qkv");
    linear(p + "attn.o", c.dim_attn, c.dim);
    add(p + "norm2.weight", {c.dim}, WeightClass::Norm, init_norm_scale(), f32);
    linear(p + "ffn.gate.0", c.dim, c.dim_ffn, p + "ffn.gate_fc1");
    linear(p + "ffn.fc1", c.dim, c.dim_ffn, p + "ffn.gate_fc1");
    linear(p + "ffn.fc2", c.dim_ffn, c.dim);
    add(p + "pos_embedding.embedding.weight", {c.num_buckets, c.num_heads}, WeightClass::Embedding,
        init_normal(1.0f), f32);
  }
  add("norm.weight", {c.dim}, WeightClass::Norm, init_norm_scale(), f32);
  return t;
}

}  // namespace wan
