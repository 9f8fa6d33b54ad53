// Fused flash attention through cuDNN's graph (backend) API, for the DiT's self- and cross-attention.
//
// Invariants: one execution plan per AttentionShape, built on first use and cached for the life of the
// object (so build plans before a CUDA-graph capture: workspace_size() or prepare() do that); run() only
// builds a variant pack and calls cudnnBackendExecute, which is capturable. The caller owns the
// workspace and sizes it with workspace_size(). Pointers must be 16-byte aligned, token strides
// multiples of 8 elements. Not thread-safe: one object per thread/stream owner.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace wan::cuda {

// O = softmax(Q·Kᵀ·scale)·V per (sample, head), non-causal, head dim 128, bf16 Q/K/V, fp32 softmax and
// accumulation inside cuDNN's fused kernel (the graph matmul → scale → padding mask → softmax → matmul
// that cuDNN recognises as one flash-attention engine). Layouts are the ones the projections write:
//   Q [B, Lq, H, 128], K and V [B, Lk, H, 128], O [B, Lq, H, 128]   (token-major "BSHD")
// with a free token stride per tensor (elements between consecutive tokens; 0 = H·128, i.e. dense), so
// Q/K/V may be views into a fused QKV projection output [B, L, 3, H, 128] (token stride 3·H·128). The
// batch stride is always L·token_stride.
// Masking: when `masked`, keys j >= k_lens[b] are excluded (1 <= k_lens[b] <= Lk), the semantics of
// wan::ops::attention; k_lens is an int32 [B] array in DEVICE memory.
// Output is bf16 only: cuDNN (library 9.14 on the H100 device) accepts an fp32 O tensor in the graph,
// but its fused engine writes bf16 into it (measured), so AttnOutType::F32 is refused with a clear error.
// Optional log-sum-exp output lse [B, H, Lq] fp32 (natural log of Σ_j exp(s_ij), s = q·k·scale over the
// unmasked keys), which ring attention uses to merge partial results.

enum class AttnOutType : uint8_t { BF16, F32 };

// Everything that selects an execution plan (the cache key).
struct AttentionShape {
  int64_t B = 1, Lq = 1, Lk = 1, H = 1;
  int64_t D = 128;                                 // only 128 is supported
  int64_t q_ld = 0, k_ld = 0, v_ld = 0, o_ld = 0;  // token strides in elements; 0 = H·D
  bool masked = false;                             // per-sample key lengths (k_lens)
  bool lse = false;                                // write the log-sum-exp [B, H, Lq]
  AttnOutType out = AttnOutType::BF16;             // only BF16: F32 is refused (see attention_cudnn.cpp)
  bool operator==(const AttentionShape&) const = default;
};

struct AttentionArgs {
  const void* q = nullptr;          // bf16 [B, Lq, H, D] (token stride q_ld)
  const void* k = nullptr;          // bf16 [B, Lk, H, D] (token stride k_ld)
  const void* v = nullptr;          // bf16 [B, Lk, H, D] (token stride v_ld)
  void* o = nullptr;                // bf16 [B, Lq, H, D] (token stride o_ld)
  const int32_t* k_lens = nullptr;  // device int32 [B]; required iff shape.masked
  float* lse = nullptr;             // device f32 [B, H, Lq]; required iff shape.lse
  float scale = 0.0f;               // 0 = 1/sqrt(D)
};

class CudnnAttention {
 public:
  // Creates the cuDNN handle on the current device. Throws wan::Error when cuDNN is absent.
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Builds (or finds) the plan for `s` and returns its workspace size in bytes. Throws wan::Error for an
  // unsupported shape, or with cuDNN's reasons when no engine supports the graph.
  size_t workspace_size(const AttentionShape& s);
  void prepare(const AttentionShape& s) { (void)workspace_size(s); }
  // Enqueues the attention on `stream`. workspace must hold workspace_size(s) bytes (may be null when 0).
  void run(const AttentionShape& s, const AttentionArgs& a, void* workspace, size_t workspace_bytes,
           cudaStream_t stream);

  size_t plans_built() const;                     // number of distinct plans built so far (cache misses)
  std::string describe(const AttentionShape& s);  // engine chosen for s (for logs), builds the plan

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

bool cudnn_available();  // compiled with cuDNN and a device is present

}  // namespace wan::cuda
