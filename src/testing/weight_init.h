// Deterministic random weights for generated checkpoints.
// Invariant: the value of element i of a tensor depends only on (component seed, tensor name, i),
// never on the order in which tensors or elements are produced, so tensors can be written one at a
// time, filled in parallel, and compared across layouts (a tensor has the same values in the
// official and the diffusers layout because its key comes from its official name).
// Scales follow PyTorch's default initialisation (nn.Linear / nn.ConvNd: U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)) for weight and bias; nn.Embedding: N(0, 1)) and WanModel's modulation
// (N(0, 1)/sqrt(dim)), so activations stay finite and non-degenerate at the real depths.
// "Normal" draws are the centred, unit-variance sum of the four 24-bit lanes of one Philox4x32-10
// block (Irwin-Hall with n = 4: bell-shaped, |x| < 3.47). It is computed with integer arithmetic and
// one double multiply, so it is bit-identical on every machine, and costs a tenth of philox_normal
// (whose exact log/cos dominate the time of a tiny checkpoint's 16M-row embedding table).
// Norm scales are 1 + 0.05 N(0, 1) and norm biases 0.05 N(0, 1) rather than exactly 1 and 0, so that
// an engine that forgets to apply them produces a visibly different result.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace wan::gen {

enum class InitKind : uint8_t {
  Uniform,       // U(-scale, scale)
  Normal,        // scale * n, n ~ unit-variance bell (see above)
  NormalAround1  // 1 + scale * n
};

struct InitRule {
  InitKind kind = InitKind::Uniform;
  float scale = 0.f;
};

// Linear / conv weight or bias with the given fan-in (in_features * kernel volume).
InitRule init_fan_in(int64_t fan_in);
InitRule init_normal(float std);
InitRule init_norm_scale();  // gamma / RMSNorm weight / LayerNorm weight
InitRule init_norm_bias();   // LayerNorm bias

// One tensor to generate, under its official (internal) name.
struct ParamSpec {
  std::string name;
  Shape shape;
  InitRule init;
};

uint64_t fnv1a64(std::string_view s);
uint64_t splitmix64(uint64_t x);
// Seed of one component (e.g. "high_noise_model", "t5", "vae") of a checkpoint with user seed `seed`.
uint64_t component_seed(uint64_t seed, std::string_view component);
// Philox key of one tensor of a component.
uint64_t tensor_key(uint64_t component_seed, std::string_view name);

// Unit-variance bell-shaped draw for element `index` of stream `key` (see above).
float bell_draw(uint64_t key, uint64_t index);

// Value of element `index` (f32, before any dtype rounding).
float init_value(const InitRule& rule, uint64_t key, uint64_t index);

// Fills dst (shape.numel() elements of dtype, which must be F32, BF16 or F16) in parallel.
void fill_param(const ParamSpec& p, uint64_t component_seed, DType dtype, void* dst);

// Total bytes of the specs at dtype.
uint64_t total_bytes(const std::vector<ParamSpec>& ps, DType dtype);

}  // namespace wan::gen
