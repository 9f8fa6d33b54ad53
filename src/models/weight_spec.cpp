// Weight-table rows and the two random draws (see weight_spec.h).
#include "models/weight_spec.h"

#include <cmath>

#include "core/error.h"
#include "core/hash.h"
#include "core/philox.h"
#include "core/thread_pool.h"

namespace wan {

InitRule init_fan_in(int64_t fan_in) {
  WAN_ASSERT(fan_in > 0, "fan_in ", fan_in);
  return {InitKind::Uniform, static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))), fan_in};
}
InitRule init_normal(float std) { return {InitKind::Normal, std}; }
InitRule init_norm_scale() { return {InitKind::NormalAround1, 0.05f}; }
InitRule init_norm_bias() { return {InitKind::Normal, 0.05f}; }

std::map<std::string, Shape> shape_map(const WeightTable& t) {
  std::map<std::string, Shape> m;
  for (const WeightSpec& w : t) m.emplace(w.name, w.shape);
  return m;
}

int64_t param_count(const WeightTable& t) {
  int64_t n = 0;
  for (const WeightSpec& w : t) n += w.shape.numel();
  return n;
}

uint64_t total_bytes(const WeightTable& t, DType dtype) {
  return static_cast<uint64_t>(param_count(t)) * dtype_size(dtype);
}

const WeightSpec& find_weight(const WeightTable& t, const std::string& name, const char* what) {
  for (const WeightSpec& w : t)
    if (w.name == name) return w;
  WAN_THROW(what, " weights: no tensor named '", name, "'");
}

uint64_t component_seed(uint64_t seed, std::string_view component) {
  return splitmix64(splitmix64(seed) ^ fnv1a64(component));
}

uint64_t dit_seed(uint64_t seed, Task task, bool high_noise) {
  if (task == Task::TI2V_5B) return component_seed(seed, "dit");
  return component_seed(seed, high_noise ? "high_noise_model" : "low_noise_model");
}

uint64_t tensor_key(uint64_t component_seed, std::string_view name) {
  // Two rounds so that names differing in one byte give unrelated keys.
  return splitmix64(splitmix64(component_seed ^ fnv1a64(name)) + 0x632BE59BD9B4E019ull);
}

float bell_draw(uint64_t key, uint64_t index) {
  Philox4 ctr{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0x6E657767u /*"gwen"*/}};
  Philox4 r = philox4x32_10(ctr, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
  // Four uniforms on [0, 2^24): the sum has mean 2 (2^24 - 1) and variance (2^48 - 1) / 3.
  int64_t s = 0;
  for (uint32_t v : r.v) s += static_cast<int64_t>(v >> 8);
  s -= 2 * ((int64_t{1} << 24) - 1);
  // s / 2^24 is exact in double; sqrt(3) brings the variance to 1 (up to 2^-48).
  return static_cast<float>(static_cast<double>(s) * (1.7320508075688772 / 16777216.0));
}

float init_value(const InitRule& rule, uint64_t key, uint64_t index) {
  switch (rule.kind) {
    case InitKind::Uniform: {
      // philox_uniform is in [0, 1) with 24 bits: 2u - 1 is exact and lies in [-1, 1).
      float u = philox_uniform(key, index);
      return (2.0f * u - 1.0f) * rule.scale;
    }
    case InitKind::Normal:
      return bell_draw(key, index) * rule.scale;
    case InitKind::NormalAround1:
      return 1.0f + bell_draw(key, index) * rule.scale;
  }
  return 0.f;
}

void fill_init(const WeightSpec& p, uint64_t component_seed, DType dtype, void* dst) {
  WAN_ASSERT(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16, "dtype ", dtype_name(dtype));
  const uint64_t key = tensor_key(component_seed, p.name);
  const int64_t n = p.shape.numel();
  const InitRule rule = p.init;
  parallel_for(n, 1 << 15, [&](int64_t begin, int64_t end) {
    switch (dtype) {
      case DType::F32: {
        float* d = static_cast<float*>(dst);
        for (int64_t i = begin; i < end; ++i) d[i] = init_value(rule, key, static_cast<uint64_t>(i));
        break;
      }
      case DType::BF16: {
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (int64_t i = begin; i < end; ++i) d[i] = f32_to_bf16(init_value(rule, key, static_cast<uint64_t>(i)));
        break;
      }
      default: {
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (int64_t i = begin; i < end; ++i) d[i] = f32_to_f16(init_value(rule, key, static_cast<uint64_t>(i)));
        break;
      }
    }
  });
}


NormalDraw normal_draw(const InitRule& r) {
  switch (r.kind) {
    case InitKind::Uniform:  // U(±1/sqrt(fan_in)) has variance 1/(3·fan_in)
      if (r.fan_in > 0) return {static_cast<float>(1.0 / std::sqrt(3.0 * static_cast<double>(r.fan_in))), 0.f};
      return {static_cast<float>(static_cast<double>(r.scale) / std::sqrt(3.0)), 0.f};
    case InitKind::Normal:
      return {r.scale, 0.f};
    case InitKind::NormalAround1:
      return {r.scale, 1.f};
  }
  return {};
}

uint64_t random_weight_key(uint64_t seed, std::string_view official_name) {
  return splitmix64(splitmix64(seed) ^ fnv1a64(official_name));
}

Tensor draw_random_weight(const WeightSpec& w, uint64_t seed) {
  const NormalDraw d = normal_draw(w.init);
  Tensor t = Tensor::empty(DType::F32, w.shape);
  float* p = t.f32();
  const size_t n = static_cast<size_t>(t.numel());
  philox_normal_fill(random_weight_key(seed, w.name), 0, p, n);
  const bool bf16 = w.device_dtype == DType::BF16;
  for (size_t i = 0; i < n; ++i) {
    float v = p[i] * d.scale;
    if (!bf16 || d.offset != 0.0f) v = v + d.offset;
    p[i] = bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
  }
  return t;
}

}  // namespace wan
