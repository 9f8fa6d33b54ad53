// UMT5-XXL text encoder on one GPU (spec §4.1, §4.2) with the reference's bf16 numerics: bf16 weights
// and GEMM inputs with fp32 accumulation (cuBLASLt / cuBLAS), the residual stream, RMSNorm maths,
// relative position bias and softmax in fp32. The CPU float32 reference is wan::t5_forward / t5_encode
// (models/umt5/umt5_cpu.h).
//
// Invariants: encode() runs on an internal stream and returns host fp32 [length, dim] for the first
// `length` tokens only, which is exact (see t5_encode: every key attended to is a real token).
// Deterministic: the same ids give bit-identical output (no atomics, fixed GEMM plans). Destroying the
// object frees all device memory (the pipeline frees the encoder after encoding). Not thread-safe.
// Files: umt5_gpu.cpp (weights, plan, forward), kernels/t5_kernels.cu (norm, gather, GELU-mul,
// softmax).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ckpt/layout.h"  // RawSpan
#include "models/config.h"
#include "core/tensor.h"

#include <functional>
#include <optional>
#include <string>

namespace wan {
struct T5Weights;
}

namespace wan::cuda {

class DeviceLoader;  // runtime/load_gpu.h

// Where the weights come from: official T5Encoder names (spec §4.4, e.g. "blocks.3.attn.q.weight"),
// any float dtype, fetched one tensor at a time (host memory peaks at one tensor plus a 16 MB staging
// buffer, not 22 GB of f32); or drawn on the GPU from the engine RNG at the real sizes, for
// `--weights random` benchmarks: tensor `name` element i = round(philox_normal(random_weight_seed(seed,
// name), i)·scale + offset) to its storage dtype (as DiTGpu), with PyTorch's default init in spirit:
// Linear weights N(0, 1/(3·fan_in)) (≈ U(±1/√fan_in)), token and relative-position embeddings N(0, 1)
// (nn.Embedding), norm weights 1 + N(0, 0.05²).
struct T5WeightSource {
  std::function<Tensor(const std::string& official_name)> get;  // used when !random
  bool random = false;
  uint64_t seed = 0;
  // Streaming (as DiTWeightSource in dit_gpu.h): with `span` the weights go file -> pinned
  // staging -> device, converted on the GPU; with `loader` too, the constructor only adds them to that
  // loader (not started; completion group `group`) and encode() must wait until the group is loaded.
  std::function<std::optional<RawSpan>(const std::string& official_name)> span;
  DeviceLoader* loader = nullptr;
  int group = 0;
};

// Numerics, per block (roundings where the official T5Encoder with bf16 weights rounds, spec §4.2, §9.12):
// - x = embedding rows gathered from the bf16 table, kept in fp32 (the residual stream);
// - a = bf16(bf16(x·r)·w), r = 1/√(mean(x²) + eps) in fp32 (T5LayerNorm: normalised value cast to the
//   weight dtype, then × weight); norm weights are stored fp32 (bf16 checkpoints are exact in fp32);
// - qkv = a·[Wq|Wk|Wv]ᵀ (one GEMM, bf16 out); per head S = q·kᵀ (cuBLAS strided-batched, fp32 out, no
//   1/√d); S += pos_bias[bucket(j − i), head] (fp32); P = bf16(softmax(S) over the `length` keys, fp32);
//   o = P·v (fp32 accumulation, bf16 out); x += bf16(o·Woᵀ) (fp32 add);
// - a = norm2(x); [g|f] = a·[Wgate|Wfc1]ᵀ (one GEMM, bf16 out); h = bf16(bf16(gelu_tanh(g))·f) (GELU in
//   fp32); x += bf16(h·Wfc2ᵀ);
// - final norm like the others: the output is bf16(bf16(x·r)·w), the reference's bf16 output, returned
//   as exact f32 values.
// Deliberate differences from the official bf16 run, all towards the exact maths: its residual stream
// and its scores + bias are bf16 tensors (bf16 weights outside autocast), here fp32; its GELU's
// intermediate ops round to bf16, here one fp32 evaluation rounded once.
//
// Memory: one device allocation holds every weight (GEMM weights bf16, q|k|v and gate|fc1 placed
// consecutively so each pair/triple is one GEMM operand; token embedding bf16; norms and relative
// position tables fp32): weight_bytes(umt5-xxl) ≈ 11.4 GB. One activation arena, sized at construction
// for 512 tokens (≈ 0.2 GB at umt5-xxl incl. the cuBLAS/cuBLASLt workspaces), serves every encode().
// The constructor checks weights + arena + a 512 MiB reserve against cudaMemGetInfo before allocating.
class T5EncoderGpu {
 public:
  // Uploads (or draws) the weights on `device`. Throws wan::Error (BadInput) with the bytes needed vs
  // free when they do not fit, before allocating anything; shape mismatches name the tensor. Config
  // limits: dim, dim_attn, dim_ffn and head_dim multiples of 8, num_buckets even and >= 4.
  T5EncoderGpu(const T5Config& cfg, const T5WeightSource& src, int device);
  // Convenience: from the CPU reference's loaded weights (tests).
  T5EncoderGpu(const T5Config& cfg, const T5Weights& w, int device);
  ~T5EncoderGpu();
  T5EncoderGpu(const T5EncoderGpu&) = delete;
  T5EncoderGpu& operator=(const T5EncoderGpu&) = delete;

  // ids[0 .. length) (1 <= length <= 512, every id in [0, vocab)) -> host f32 [length, dim]; anything
  // else throws wan::Error (BadInput) before any device work.
  Tensor encode(const int32_t* ids, int64_t length);

  size_t weight_bytes() const;                      // device bytes of the uploaded weights
  static size_t weight_bytes(const T5Config& cfg);  // same, from the config alone (planning)
  // Everything the constructor needs free on the device: weights + activation arena + reserve.
  static size_t device_bytes(const T5Config& cfg);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace wan::cuda
