// Random VAE weights and latents at a configuration's sizes, shared by the CPU and GPU VAE tests: conv
// weights N(0, 1/(3·fan_in)) (PyTorch's default uniform init has that variance), biases N(0, 0.02²),
// norm gammas 1 + N(0, 0.1²); latents N(0, 1). Host code only.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "core/philox.h"
#include "models/config.h"
#include "models/vae/weights.h"

namespace wan::test {

inline VaeWeights random_vae_test_weights(const VaeConfig& c, uint64_t seed) {
  const auto specs = vae_tensor_specs(c);
  return load_vae_weights(c, [&](const std::string& name) {
    Shape shape;
    for (const auto& [n, s] : specs)
      if (n == name) shape = s;
    Tensor t = Tensor::f32(shape);
    uint64_t h = seed;
    for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
    philox_normal_fill(h, 0, t.f32(), static_cast<size_t>(t.numel()));
    float scale = 0.02f, offset = 0.0f;
    if (name.size() > 6 && name.compare(name.size() - 6, 6, "weight") == 0) {
      scale = 1.0f / std::sqrt(3.0f * static_cast<float>(t.numel() / shape[0]));
    } else if (name.size() > 5 && name.compare(name.size() - 5, 5, "gamma") == 0) {
      scale = 0.1f;
      offset = 1.0f;
    }
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = t.f32()[i] * scale + offset;
    return t;
  });
}

// Normal(0, 1) latents [z, T, h, w].
inline Tensor random_vae_test_latents(int64_t z, int64_t T, int64_t h, int64_t w, uint64_t seed) {
  Tensor t = Tensor::f32({z, T, h, w});
  philox_normal_fill(seed, 0, t.f32(), static_cast<size_t>(t.numel()));
  return t;
}

}  // namespace wan::test
