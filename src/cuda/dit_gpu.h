// The Wan DiT (official WanModel, spec §2) forward on one GPU with the reference's bf16 numerics
// (spec §2.10): bf16 weights and GEMM inputs with fp32 accumulation (cuBLASLt), the residual stream,
// norms, modulation, RoPE, time embedding and output head in fp32, cuDNN fused flash attention.
// Classifier-free guidance runs as one batch (cond, uncond), so each weight is read once per step.
//
// Memory is planned, not discovered: one device allocation per expert holds all its weights (bf16 for
// GEMM weights and q/k norm weights; fp32 for the modulation tables, norm3, the time MLP/projection and
// the head, which the reference computes in fp32), and one activation arena, sized by DiTGpu::plan()
// from (config, max latent shape, batch) before anything is allocated, holds every activation and the
// cuBLASLt/cuDNN workspaces. create() throws one wan::Error naming what would fit when the plan does not.
//
// Invariants:
// - Sequence length = f·h·w (the single-GPU official seq_len): no padding rows, so self-attention
//   attends to every key (the reference's k_lens = seq_lens is the full length); cross-attention attends
//   to all text_len slots, zero-padded prompts included (spec §2.5).
// - One timestep per sample (T2V/I2V A14B); the per-token timesteps of TI2V are not supported here.
// - forward() is deterministic: the same inputs give bit-identical outputs, graph replay or not.
// - The first forward of an (expert, shape) runs eagerly (it builds every cuBLASLt/cuDNN plan); the
//   second captures a CUDA graph of the whole forward, later ones replay it. Inputs are copied into
//   fixed arena buffers before the graph, the output copied out after it.
// - All work runs on an internal stream ordered after / before the caller's stream with events.
// - Not thread-safe; one object per device. Files: dit_gpu.cpp (plan, forward, graphs),
//   dit_gpu_weights.cpp (weight table, upload, random draw), dit_gpu_kernels.cu (init kernels).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"  // DiTConfig (used as plain data: wan_cuda does not link wan_config)
#include "core/tensor.h"

namespace wan::cuda {

// Latent geometry of one forward: x is [batch, in_dim, frames, height, width] (latent units; height and
// width multiples of the patch).
struct DiTShape {
  int64_t batch = 2;  // samples: 2 for CFG (cond, uncond)
  int64_t frames = 1, height = 2, width = 2;
  bool operator==(const DiTShape&) const = default;
};

// Where an expert's weights come from: a name -> tensor callback (official names, any float dtype,
// converted on the host), or drawn on the GPU from the engine RNG at the real sizes (no files).
using DiTWeightGetter = std::function<Tensor(const std::string& official_name)>;
struct DiTWeightSource {
  DiTWeightGetter get;  // used when !random
  bool random = false;
  uint64_t seed = 0;
  static DiTWeightSource from(DiTWeightGetter g) { return {std::move(g), false, 0}; }
  static DiTWeightSource random_weights(uint64_t seed) { return {{}, true, seed}; }
};

// Random weights: tensor `name` element i = round(philox_normal(random_weight_seed(seed, name), i) ·
// scale + offset) to its storage dtype. Scales follow PyTorch's default init in spirit: Linear/Conv
// weights and biases U(-1/√fan_in, 1/√fan_in) approximated by N(0, 1/(3·fan_in)); modulation tables
// N(0, 1/dim) (the official init); norm weights 1 + N(0, 0.05²); norm3 bias N(0, 0.05²).
uint64_t random_weight_seed(uint64_t seed, const std::string& official_name);

// The arena layout of one (config, shape): every buffer's byte offset and size. Views alias a region
// whose live ranges never overlap (e.g. the FFN hidden reuses the QKV region).
struct MemoryPlan {
  struct Buffer {
    std::string name;
    size_t offset = 0, bytes = 0;
    bool view = false;  // aliases part of an earlier buffer
  };
  DiTShape shape;
  int experts = 1;
  std::vector<Buffer> buffers;
  size_t arena_bytes = 0;   // activations + workspaces
  size_t weight_bytes = 0;  // one expert
  size_t reserve_bytes = 0; // headroom kept free for handles, kernels and graphs
  size_t total_bytes() const { return arena_bytes + weight_bytes * static_cast<size_t>(experts) + reserve_bytes; }
  const Buffer& get(const std::string& name) const;  // throws wan::Error for an unknown name
  std::string str() const;                           // the table in MiB
};

// Inputs of one forward. Host or device pointers where stated (copied with cudaMemcpyDefault).
struct DiTInputs {
  const float* x = nullptr;           // [B, in_dim, T, H, W] f32 latents (I2V: y already concatenated)
  const float* t = nullptr;           // [B] host: one timestep per sample
  const void* context = nullptr;      // [B, ctx_rows, text_dim] text encoder output
  DType context_dtype = DType::F32;   // F32 or BF16
  int64_t ctx_rows = 0;               // rows per sample in `context` (1 <= ctx_rows <= text_len)
  const int64_t* ctx_lens = nullptr;  // [B] host: real rows per sample; rows beyond are zero-padded
};

class DiTGpu {
 public:
  // Attention kernel: Auto = the engine's own Hopper kernel (attention_own.h) on sm_90, cuDNN elsewhere.
  enum class Attention { Auto, Cudnn, Own };
  struct Options {
    int device = 0;
    bool use_graphs = true;
    bool verbose = false;  // print the memory plan (MiB) to stderr at create
    Attention attention = Attention::Auto;
  };
  // "auto" | "cudnn" | "own"; throws wan::Error otherwise.
  static Attention parse_attention(const std::string& s);
  // The kernel `a` resolves to on the current device (never Auto); Own on a non-sm_90 device throws.
  static Attention resolve_attention(Attention a);
  Attention attention() const;  // what this object runs

  // Plans the arena for max_shape, checks that experts.size() weight sets plus the arena fit the free
  // device memory (throws before allocating anything when they do not, naming the frames that fit),
  // then allocates, uploads or draws the weights. Every later forward must fit max_shape (batch <=
  // max batch, tokens <= max tokens).
  static DiTGpu create(const DiTConfig& cfg, const std::vector<DiTWeightSource>& experts, const DiTShape& max_shape,
                       const Options& opt);
  static DiTGpu create(const DiTConfig& cfg, const std::vector<DiTWeightSource>& experts, const DiTShape& max_shape) {
    return create(cfg, experts, max_shape, Options{});
  }
  // The plan create() would use; attn_workspace = cuDNN's workspace for the shape's attentions (create
  // asks cuDNN; 0 is the usual value on Hopper). Pure host arithmetic.
  static MemoryPlan plan(const DiTConfig& cfg, const DiTShape& shape, int experts, size_t attn_workspace = 0);

  DiTGpu(DiTGpu&&) noexcept;
  DiTGpu& operator=(DiTGpu&&) noexcept;
  ~DiTGpu();

  // Velocity prediction out[B, out_dim, T, H, W] f32 (host or device memory) of expert `expert` for
  // `shape`. Ordered on `stream` (may be 0); returns without synchronising when out is device memory.
  void forward(int expert, const DiTShape& shape, const DiTInputs& in, float* out, cudaStream_t stream);

  const MemoryPlan& memory_plan() const;
  const DiTConfig& config() const;
  int experts() const;
  void set_use_graphs(bool on);   // off: every forward runs eagerly (for tests and profiling)
  size_t graphs_captured() const; // distinct (expert, shape) graphs instantiated so far
  // A copy of one weight as stored on the device, converted to an F32 host tensor with its official
  // shape (for CPU references of random-weight models).
  Tensor download_weight(int expert, const std::string& official_name) const;

  struct Impl;

 private:
  explicit DiTGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wan::cuda
