// The GPU DiT's weight allocation: table of official tensors (dtype, shape, placement), host upload,
// random draw on the GPU, download. See dit_gpu_weights.h for the layout rules.
#include "models/dit/dit_gpu_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "kernels/affine.h"
#include "runtime/load_gpu.h"
#include "kernels/rng.h"

namespace wan::cuda {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}
}  // namespace

uint64_t random_weight_seed(uint64_t seed, const std::string& official_name) {
  return splitmix64(splitmix64(seed) ^ fnv1a64(official_name));
}

namespace dit_gpu_detail {

namespace {

constexpr size_t kStagingFloats = size_t{8} << 20;  // host bf16 conversion chunk (16 MB)

}  // namespace

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

float TableBuilder::linear_scale(int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(3.0 * fan_in)); }

void TableBuilder::append(const std::string& name, DType t, Shape s, float scale, float offset) {
  WAN_ASSERT(table_.bytes % 16 == 0, "weight ", name, " would start unaligned at byte ", table_.bytes);
  put(name, t, s, scale, offset, table_.bytes);
}

void TableBuilder::put(const std::string& name, DType t, Shape s, float scale, float offset, size_t at) {
  WeightEntry e;
  e.name = name;
  e.dtype = t;
  e.shape = s;
  e.offset = at;
  e.bytes = static_cast<size_t>(s.numel()) * dtype_size(t);
  e.scale = scale;
  e.offset_value = offset;
  WAN_ASSERT(!table_.index.count(name), "duplicate weight ", name);
  table_.index[name] = table_.entries.size();
  table_.entries.push_back(e);
  table_.bytes = at + e.bytes;
}

const WeightEntry& WeightTable::at(const std::string& name) const {
  auto it = index.find(name);
  WAN_CHECK(it != index.end(), "DiT GPU weights: no tensor named '", name, "'");
  return entries[it->second];
}

void check_config(const DiTConfig& c) {
  WAN_CHECK(c.dim > 0 && c.num_heads > 0 && c.dim % c.num_heads == 0 && c.dim / c.num_heads == 128,
            "DiT GPU: dim ", c.dim, " / heads ", c.num_heads, " must give head_dim 128 (the attention kernel's)");
  WAN_CHECK(c.ffn_dim > 0 && c.ffn_dim % 8 == 0, "DiT GPU: ffn_dim ", c.ffn_dim, " must be a positive multiple of 8");
  WAN_CHECK(c.text_dim > 0 && c.text_dim % 8 == 0, "DiT GPU: text_dim ", c.text_dim, " must be a multiple of 8");
  WAN_CHECK(c.freq_dim > 0 && c.freq_dim % 8 == 0, "DiT GPU: freq_dim ", c.freq_dim, " must be a multiple of 8");
  WAN_CHECK(c.text_len >= 1 && c.num_layers >= 1 && c.in_dim >= 1 && c.out_dim >= 1,
            "DiT GPU: text_len, num_layers, in_dim and out_dim must be positive");
  WAN_CHECK(c.patch[0] >= 1 && c.patch[1] >= 1 && c.patch[2] >= 1, "DiT GPU: bad patch size");
  const int64_t P = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  WAN_CHECK(c.in_dim * P % 8 == 0, "DiT GPU: in_dim·patch volume ", c.in_dim * P, " must be a multiple of 8");
  WAN_CHECK(c.eps > 0.0f, "DiT GPU: eps must be positive");
}

WeightTable build_weight_table(const DiTConfig& c) {
  check_config(c);
  const int64_t D = c.dim, F = c.ffn_dim, P = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  const float sD = TableBuilder::linear_scale(D);
  const float mod_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  constexpr float kNormScale = 0.05f;
  const DType bf = DType::BF16, f32 = DType::F32;
  TableBuilder t;
  const float s_patch = TableBuilder::linear_scale(c.in_dim * P);
  t.add("patch_embedding.weight", bf, {D, c.in_dim, c.patch[0], c.patch[1], c.patch[2]}, s_patch);
  t.add("patch_embedding.bias", bf, {D}, s_patch);
  t.linear("text_embedding.0", bf, D, c.text_dim);
  t.linear("text_embedding.2", bf, D, D);
  t.linear("time_embedding.0", f32, D, c.freq_dim);
  t.linear("time_embedding.2", f32, D, D);
  t.linear("time_projection.1", f32, 6 * D, D);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    t.add(p + "modulation", f32, {1, 6, D}, mod_scale);
    // self-attention q|k|v weights [3D, D], then q|k|v biases [3D]: one fused GEMM
    t.add(p + "self_attn.q.weight", bf, {D, D}, sD);
    t.append(p + "self_attn.k.weight", bf, {D, D}, sD);
    t.append(p + "self_attn.v.weight", bf, {D, D}, sD);
    t.add(p + "self_attn.q.bias", bf, {D}, sD);
    t.append(p + "self_attn.k.bias", bf, {D}, sD);
    t.append(p + "self_attn.v.bias", bf, {D}, sD);
    t.linear(p + "self_attn.o", bf, D, D);
    t.add(p + "self_attn.norm_q.weight", bf, {D}, kNormScale, 1.0f);
    t.add(p + "self_attn.norm_k.weight", bf, {D}, kNormScale, 1.0f);
    t.add(p + "norm3.weight", f32, {D}, kNormScale, 1.0f);
    t.add(p + "norm3.bias", f32, {D}, kNormScale);
    t.linear(p + "cross_attn.q", bf, D, D);
    // cross-attention k|v weights [2D, D] and biases [2D]: one fused GEMM over the text context
    t.add(p + "cross_attn.k.weight", bf, {D, D}, sD);
    t.append(p + "cross_attn.v.weight", bf, {D, D}, sD);
    t.add(p + "cross_attn.k.bias", bf, {D}, sD);
    t.append(p + "cross_attn.v.bias", bf, {D}, sD);
    t.linear(p + "cross_attn.o", bf, D, D);
    t.add(p + "cross_attn.norm_q.weight", bf, {D}, kNormScale, 1.0f);
    t.add(p + "cross_attn.norm_k.weight", bf, {D}, kNormScale, 1.0f);
    t.linear(p + "ffn.0", bf, F, D);
    t.linear(p + "ffn.2", bf, D, F);
  }
  t.add("head.modulation", f32, {1, 2, D}, mod_scale);
  t.linear("head.head", f32, c.out_dim * P, D);
  return t.take();
}

void upload_weights(const WeightTable& table, void* dev, const DiTWeightGetter& get, const char* what,
                    const DiTWeightSpan& span, DeviceLoader* loader, int group) {
  WAN_CHECK(static_cast<bool>(get), what, " GPU weights: no weight callback");
  if (span || loader) {  // streaming (load_gpu.h)
    std::vector<LoadTarget> targets = weight_targets(table, dev, get, what, span, group);
    if (loader) {
      for (LoadTarget& t : targets) loader->add(std::move(t));
      return;
    }
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    load_to_device(std::move(targets), LoadOptions::tuned(device));
    return;
  }
  std::vector<uint16_t> staging;
  for (const WeightEntry& e : table.entries) {
    Tensor t;
    WAN_WITH_CONTEXT(cat(what, " weight ", e.name), t = get(e.name));
    WAN_CHECK(t.defined(), what, " weight ", e.name, ": missing");
    WAN_CHECK(t.shape() == e.shape, what, " weight ", e.name, ": shape ", t.shape().str(), ", expected ",
              e.shape.str());
    WAN_CHECK(dtype_is_float(t.dtype()), what, " weight ", e.name, ": dtype ", dtype_name(t.dtype()),
              " is not a float type");
    char* dst = static_cast<char*>(dev) + e.offset;
    if (t.dtype() == e.dtype && t.view().is_contiguous()) {
      CUDA_CHECK(cudaMemcpy(dst, t.data(), e.bytes, cudaMemcpyHostToDevice));
      continue;
    }
    Tensor f = (t.dtype() == DType::F32 && t.view().is_contiguous()) ? t : t.to_f32();
    t = Tensor();
    if (e.dtype == DType::F32) {
      CUDA_CHECK(cudaMemcpy(dst, f.data(), e.bytes, cudaMemcpyHostToDevice));
      continue;
    }
    const size_t n = static_cast<size_t>(f.numel());
    staging.resize(std::min(n, kStagingFloats));
    for (size_t i0 = 0; i0 < n; i0 += kStagingFloats) {
      const size_t m = std::min(kStagingFloats, n - i0);
      convert_from_f32(DType::BF16, f.f32() + i0, staging.data(), m);
      CUDA_CHECK(cudaMemcpy(dst + i0 * 2, staging.data(), m * 2, cudaMemcpyHostToDevice));
    }
  }
}

std::vector<LoadTarget> weight_targets(const WeightTable& table, void* dev, const DiTWeightGetter& get, const char* what,
                                       const DiTWeightSpan& span, int group) {
  std::vector<LoadTarget> targets;
  targets.reserve(table.entries.size());
  for (const WeightEntry& e : table.entries) {
    LoadTarget t;
    t.name = cat(what, " weight ", e.name);
    if (span) WAN_WITH_CONTEXT(t.name, t.span = span(e.name));
    if (!t.span) t.fallback = [get, name = e.name] { return get(name); };
    t.dst = static_cast<char*>(dev) + e.offset;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.group = group;
    targets.push_back(std::move(t));
  }
  return targets;
}

size_t max_small_floats(const WeightTable& table) {
  size_t m = 0;
  for (const WeightEntry& e : table.entries)
    if (e.dtype == DType::BF16 && e.offset_value != 0.0f) m = std::max(m, static_cast<size_t>(e.shape.numel()));
  return m;
}

void draw_random_weights(const WeightTable& table, void* dev, uint64_t seed, float* scratch, size_t scratch_floats,
                         cudaStream_t stream) {
  for (const WeightEntry& e : table.entries) {
    const uint64_t s = random_weight_seed(seed, e.name);
    const int64_t n = e.shape.numel();
    void* p = static_cast<char*>(dev) + e.offset;
    if (e.dtype == DType::F32) {
      philox_normal_fill(static_cast<float*>(p), static_cast<size_t>(n), s, 0, stream);
      affine_f32(static_cast<float*>(p), n, e.scale, e.offset_value, stream);
    } else if (e.offset_value == 0.0f) {
      philox_normal_fill_bf16(static_cast<uint16_t*>(p), static_cast<size_t>(n), s, 0, e.scale, stream);
    } else {
      WAN_ASSERT(static_cast<size_t>(n) <= scratch_floats, "random weight scratch too small for ", e.name);
      philox_normal_fill(scratch, static_cast<size_t>(n), s, 0, stream);
      affine_f32_to_bf16(scratch, static_cast<__nv_bfloat16*>(p), n, e.scale, e.offset_value, stream);
    }
  }
}

Tensor download_weight(const WeightTable& table, const void* dev, const std::string& name) {
  const WeightEntry& e = table.at(name);
  Tensor out = Tensor::empty(DType::F32, e.shape);
  if (e.dtype == DType::F32) {
    CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const char*>(dev) + e.offset, e.bytes, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(e.shape.numel()));
    CUDA_CHECK(cudaMemcpy(h.data(), static_cast<const char*>(dev) + e.offset, e.bytes, cudaMemcpyDeviceToHost));
    convert_to_f32(DType::BF16, h.data(), out.f32(), h.size());
  }
  return out;
}

}  // namespace dit_gpu_detail
}  // namespace wan::cuda
