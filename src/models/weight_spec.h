// One row of a model's weight table, and the random-weight rules every part of the engine shares.
// Each model has one table (models/dit/weights.h, models/umt5/weights.h, models/vae/weights.h) built from
// its config: layout detection, make-checkpoint, the CPU forward's loading, the GPU upload and
// `--weights random` all read it, so a tensor's name, shape, storage and initialisation are written once.
// Two random draws read a row's InitRule:
// - the checkpoint writer's (make-checkpoint): Uniform U(±scale), Normal scale·n, NormalAround1 1 + scale·n
//   with n a bell-shaped Irwin-Hall draw keyed by (component seed, name) — fill_init;
// - the engine's (`--weights random`, CPU and GPU alike): a Philox normal of the same variance
//   (normal_draw) keyed by random_weight_key(expert seed, name), stored in the row's device dtype.
// Invariant: an element's value depends only on (seed, component, official name, index), never on the
// order tensors or elements are produced, so layouts and devices agree.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "models/config.h"

namespace wan {

// What a tensor is to the forward; LoRA and FP8 key off it (only GemmWeight rows take either).
enum class WeightClass : uint8_t {
  GemmWeight,  // [out, in] matrix (or a conv kernel run as one GEMM: the patch embedding)
  GemmBias,    // [out]
  Norm,        // a norm's scale
  NormBias,    // a norm's shift
  Modulation,  // AdaLN tables
  Embedding,   // lookup tables (tokens, relative positions)
  Conv,        // VAE convolution kernel
  ConvBias,    // VAE convolution bias
};

enum class InitKind : uint8_t {
  Uniform,       // U(-scale, scale)
  Normal,        // scale · n
  NormalAround1  // 1 + scale · n
};
struct InitRule {
  InitKind kind = InitKind::Uniform;
  float scale = 0.f;
  int64_t fan_in = 0;  // init_fan_in's: the engine's draw derives its scale from it, not from the rounded scale
};
InitRule init_fan_in(int64_t fan_in);  // PyTorch's Linear / ConvNd default: U(±1/sqrt(fan_in))
InitRule init_normal(float std);
InitRule init_norm_scale();  // 1 + 0.05 n: a forgotten norm weight shows
InitRule init_norm_bias();   // 0.05 n

struct WeightSpec {
  std::string name;  // the official state-dict name
  Shape shape;       // from the config
  WeightClass cls = WeightClass::GemmWeight;
  InitRule init;
  DType device_dtype = DType::BF16;  // what the GPU forward reads (F32 where the reference computes in fp32)
  // Non-empty: a GEMM operand the GPU places contiguously with the other rows of the same group (q|k|v),
  // in table order, so one GEMM reads them all.
  std::string fused;
};
using WeightTable = std::vector<WeightSpec>;

std::map<std::string, Shape> shape_map(const WeightTable& t);
int64_t param_count(const WeightTable& t);
uint64_t total_bytes(const WeightTable& t, DType dtype);

// ---- the checkpoint writer's draw ----
// Seed of one component ("high_noise_model", "low_noise_model", "dit", "t5", "vae") of user seed `seed`.
uint64_t component_seed(uint64_t seed, std::string_view component);
// The DiT component of a task: A14B experts "high_noise_model" / "low_noise_model", the TI2V-5B DiT "dit".
uint64_t dit_seed(uint64_t seed, Task task, bool high_noise);
uint64_t tensor_key(uint64_t component_seed, std::string_view name);
float bell_draw(uint64_t key, uint64_t index);  // unit variance, |x| < 3.47
float init_value(const InitRule& rule, uint64_t key, uint64_t index);
// Fills dst (shape.numel() elements of F32, BF16 or F16) in parallel.
void fill_init(const WeightSpec& w, uint64_t component_seed, DType dtype, void* dst);

// ---- the engine's draw (`--weights random`) ----
// A normal draw with the rule's variance: value = n·scale + offset, n ~ philox_normal.
struct NormalDraw {
  float scale = 0.f, offset = 0.f;
};
NormalDraw normal_draw(const InitRule& r);
uint64_t random_weight_key(uint64_t seed, std::string_view official_name);
// One tensor exactly as the GPU draws it, in f32: fp32 rows n·scale + offset, bf16 rows rounded once
// (after the offset is added); e4m3 rows (the GPU DiT's FP8 GEMM weights) unrounded, the values the GPU
// then merges and quantises. Separate multiply and add, as the GPU's _rn intrinsics.
Tensor draw_random_weight(const WeightSpec& w, uint64_t seed);

// Finds a row by name (throws wan::Error naming the table and the tensor).
const WeightSpec& find_weight(const WeightTable& t, const std::string& name, const char* what);

}  // namespace wan
