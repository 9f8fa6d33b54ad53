// UMT5 encoder, float32 CPU reference (see umt5_cpu.h for the maths and its invariants).
#include "models/umt5/umt5_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ckpt/names.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "models/umt5/weights.h"
#include "ops/cpu_ops.h"

namespace wan {

namespace {

Tensor load_checked(const T5TensorLoader& load, const std::string& name, const Shape& want) {
  Tensor t;
  WAN_WITH_CONTEXT("T5 weight " + name, t = load(name));
  WAN_CHECK(t.defined(), "T5 weight ", name, ": loader returned no tensor");
  WAN_CHECK(t.shape() == want, "T5 weight ", name, ": shape ", t.shape().str(), ", expected ", want.str());
  WAN_CHECK(dtype_is_float(t.dtype()), "T5 weight ", name, ": dtype ", dtype_name(t.dtype()), " is not a float type");
  Tensor f = t.to_f32();
  WAN_CHECK(f.view().is_contiguous(), "T5 weight ", name, ": not contiguous");
  return f;
}

}  // namespace

T5Weights load_t5_weights(const T5Config& cfg, const T5TensorLoader& load) {
  WAN_CHECK(cfg.num_heads > 0 && cfg.dim_attn % cfg.num_heads == 0, "T5 config: dim_attn ", cfg.dim_attn,
            " is not a multiple of num_heads ", cfg.num_heads);
  WAN_CHECK(cfg.num_buckets >= 2 && cfg.num_buckets % 2 == 0, "T5 config: num_buckets ", cfg.num_buckets,
            " must be even (bidirectional)");
  // Names and shapes from the weight table (models/umt5/weights.h).
  const std::map<std::string, Shape> shapes = shape_map(umt5_weight_table(cfg));
  auto get = [&](const std::string& name) {
    auto it = shapes.find(name);
    WAN_ASSERT(it != shapes.end(), "T5 weight ", name, " is not in the weight table");
    return load_checked(load, name, it->second);
  };
  T5Weights w;
  w.token_embedding = get("token_embedding.weight");
  w.norm = get("norm.weight");
  w.blocks.resize(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    T5Block& b = w.blocks[static_cast<size_t>(i)];
    b.norm1 = get(p + "norm1.weight");
    b.q = get(p + "attn.q.weight");
    b.k = get(p + "attn.k.weight");
    b.v = get(p + "attn.v.weight");
    b.o = get(p + "attn.o.weight");
    b.pos_embedding = get(p + "pos_embedding.embedding.weight");
    b.norm2 = get(p + "norm2.weight");
    b.ffn_gate = get(p + "ffn.gate.0.weight");
    b.ffn_fc1 = get(p + "ffn.fc1.weight");
    b.ffn_fc2 = get(p + "ffn.fc2.weight");
  }
  return w;
}

T5TensorLoader t5_hf_loader(const SafetensorsSet& set) {
  return [&set](const std::string& official) -> Tensor {
    std::string hf = t5_official_to_hf(official);
    WAN_CHECK(!hf.empty(), "not a T5 tensor name: ", official);
    if (hf == "shared.weight" && !set.contains(hf) && set.contains("encoder.embed_tokens.weight"))
      hf = "encoder.embed_tokens.weight";
    WAN_CHECK(set.contains(hf), set.source(), ": missing tensor ", hf, " (official ", official, ")");
    return set.get(hf).to_f32();
  };
}

namespace {

// One encoder block in place on x [L, dim]. bucket_of[rel + L - 1] = bucket of rel.
void t5_block(const T5Config& cfg, const T5Block& b, float* x, const int32_t* mask, int64_t L,
              const std::vector<int>& bucket_of) {
  const int64_t D = cfg.dim, A = cfg.dim_attn, F = cfg.dim_ffn, H = cfg.num_heads, Dh = A / H;
  std::vector<float> a(static_cast<size_t>(L * D));
  std::vector<float> q(static_cast<size_t>(L * A)), k(q.size()), v(q.size()), att(q.size());
  std::vector<float> y(static_cast<size_t>(L * D));

  // ---- self-attention ----
  ops::rms_norm(x, b.norm1.f32(), a.data(), L, D, cfg.eps);
  ops::linear(a.data(), b.q.f32(), nullptr, q.data(), L, D, A);  // [L, H*Dh]
  ops::linear(a.data(), b.k.f32(), nullptr, k.data(), L, D, A);
  ops::linear(a.data(), b.v.f32(), nullptr, v.data(), L, D, A);
  const float* bias = b.pos_embedding.f32();  // [num_buckets, H]
  parallel_for(H * L, 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(static_cast<size_t>(L));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / L, i = t % L;
      const float* qi = q.data() + i * A + h * Dh;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < L; ++j) {
        if (mask && mask[j] == 0) continue;
        const float* kj = k.data() + j * A + h * Dh;
        float s = 0.f;
        for (int64_t d = 0; d < Dh; ++d) s += qi[d] * kj[d];
        s += bias[bucket_of[static_cast<size_t>(j - i + L - 1)] * H + h];
        p[static_cast<size_t>(j)] = s;
        mx = std::max(mx, s);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < L; ++j) {
        if (mask && mask[j] == 0) continue;
        const float e = std::exp(p[static_cast<size_t>(j)] - mx);
        p[static_cast<size_t>(j)] = e;
        sum += e;
      }
      const float inv = 1.f / sum;
      float* oi = att.data() + i * A + h * Dh;
      std::fill(oi, oi + Dh, 0.f);
      for (int64_t j = 0; j < L; ++j) {
        if (mask && mask[j] == 0) continue;
        const float pj = p[static_cast<size_t>(j)] * inv;
        const float* vj = v.data() + j * A + h * Dh;
        for (int64_t d = 0; d < Dh; ++d) oi[d] += pj * vj[d];
      }
    }
  });
  ops::linear(att.data(), b.o.f32(), nullptr, y.data(), L, A, D);
  ops::add_inplace(x, y.data(), L * D);

  // ---- gated-GELU feed-forward ----
  ops::rms_norm(x, b.norm2.f32(), a.data(), L, D, cfg.eps);
  std::vector<float> g(static_cast<size_t>(L * F)), h(g.size());
  ops::linear(a.data(), b.ffn_gate.f32(), nullptr, g.data(), L, D, F);
  ops::gelu_tanh(g.data(), g.data(), L * F);
  ops::linear(a.data(), b.ffn_fc1.f32(), nullptr, h.data(), L, D, F);
  parallel_for(L * F, 1 << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) h[static_cast<size_t>(i)] *= g[static_cast<size_t>(i)];
  });
  ops::linear(h.data(), b.ffn_fc2.f32(), nullptr, y.data(), L, F, D);
  ops::add_inplace(x, y.data(), L * D);
}

}  // namespace

Tensor t5_forward(const T5Config& cfg, const T5Weights& w, const int32_t* ids, const int32_t* mask, int64_t L) {
  WAN_CHECK(L >= 1, "T5 forward: empty input");
  WAN_CHECK(static_cast<int>(w.blocks.size()) == cfg.num_layers, "T5 forward: weights have ", w.blocks.size(),
            " blocks, config ", cfg.num_layers);
  if (mask) {
    bool any = false;
    for (int64_t j = 0; j < L; ++j) any = any || mask[j] != 0;
    WAN_CHECK(any, "T5 forward: the attention mask has no real token");
  }
  const int64_t D = cfg.dim;
  Tensor x = Tensor::empty(DType::F32, {L, D});
  const float* emb = w.token_embedding.f32();
  for (int64_t i = 0; i < L; ++i) {
    WAN_CHECK(ids[i] >= 0 && ids[i] < cfg.vocab, "T5 forward: token id ", ids[i], " at position ", i,
              " is outside the vocabulary [0, ", cfg.vocab, ")");
    std::copy(emb + static_cast<int64_t>(ids[i]) * D, emb + (static_cast<int64_t>(ids[i]) + 1) * D, x.f32() + i * D);
  }
  std::vector<int> bucket_of(static_cast<size_t>(2 * L - 1));
  for (int64_t r = -(L - 1); r <= L - 1; ++r)
    bucket_of[static_cast<size_t>(r + L - 1)] = t5_relative_bucket(r, cfg.num_buckets, cfg.max_distance);
  for (const T5Block& b : w.blocks) t5_block(cfg, b, x.f32(), mask, L, bucket_of);
  Tensor out = Tensor::empty(DType::F32, {L, D});
  ops::rms_norm(x.f32(), w.norm.f32(), out.f32(), L, D, cfg.eps);
  return out;
}

Tensor t5_encode(const T5Config& cfg, const T5Weights& w, const int32_t* ids, int64_t length) {
  return t5_forward(cfg, w, ids, nullptr, length);
}

}  // namespace wan
