// Deterministic random weights: per-tensor Philox keys and parallel, order-independent fills.
#include "testing/weight_init.h"

#include <cmath>

#include "core/error.h"
#include "core/philox.h"
#include "core/thread_pool.h"

namespace wan::gen {

InitRule init_fan_in(int64_t fan_in) {
  WAN_ASSERT(fan_in > 0, "fan_in ", fan_in);
  return {InitKind::Uniform, static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)))};
}
InitRule init_normal(float std) { return {InitKind::Normal, std}; }
InitRule init_norm_scale() { return {InitKind::NormalAround1, 0.05f}; }
InitRule init_norm_bias() { return {InitKind::Normal, 0.05f}; }

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t component_seed(uint64_t seed, std::string_view component) {
  return splitmix64(splitmix64(seed) ^ fnv1a64(component));
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

void fill_param(const ParamSpec& p, uint64_t component_seed, DType dtype, void* dst) {
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

uint64_t total_bytes(const std::vector<ParamSpec>& ps, DType dtype) {
  uint64_t t = 0;
  for (const ParamSpec& p : ps) t += static_cast<uint64_t>(p.shape.numel()) * dtype_size(dtype);
  return t;
}

}  // namespace wan::gen
