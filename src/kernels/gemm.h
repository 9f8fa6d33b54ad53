// Linear layers on the GPU through cuBLASLt: y[M, N] = act(x[M, K] · w[N, K]ᵀ + bias[N]), the PyTorch
// Linear convention (w is [out_features, in_features], row-major everywhere).
//
// Invariants: GemmRunner owns the cuBLASLt handle and the plan cache, not the workspace: the caller
// plans the workspace (kWorkspaceBytes is enough for every Hopper algorithm) and keeps it alive and
// unused by other streams while the runner works. Plans (descriptors + the heuristic's best algorithm)
// are cached per (M, N, K, dtypes, bias, activation, pointer alignments, FP8 scale and accumulation modes),
// so a shape's first call queries the heuristic and every later call, including during CUDA-graph capture,
// only launches.
// cublasLtMatmul is deterministic for a fixed plan. Not thread-safe: one runner per stream owner.
// FP8 (opt-in, sm_90): e4m3 operands with per-row fp32 scales (kernels/fp8_quant.h) through cuBLASLt's
// outer-vector scaling; fp8_supported() says whether a device runs it. A shape's first FP8 call with bias
// or GELU may find the fused epilogue refused at launch and switch to the separate one; when that first
// call comes during a CUDA-graph capture, the trial launch runs on a stream of the runner's own, so a
// refusal never reaches the capture.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace wan::cuda {

// Numerics (spec §2.10, §9.9): bf16 x and w with fp32 accumulation (CUBLAS_COMPUTE_32F), bias added and
// the activation applied to the fp32 accumulator, one rounding to the output type (bf16 or fp32). The
// fp32-input variant (time embedding, time projection, head in the reference's fp32 autocast regions)
// uses CUBLAS_COMPUTE_32F too, i.e. no TF32, like PyTorch's default. The bias has the output's dtype
// (cuBLASLt's rule for non-fp8 GEMMs). Act::GeluTanh is cuBLASLt's GELU epilogue, which is the tanh
// approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (checked against both forms in
// tests/gpu/test_gemm.cu). Note the reference rounds the FFN's first Linear to bf16 before its GELU;
// the fused epilogue skips that rounding (strictly closer to the fp32 result).

enum class Act : uint8_t { None, GeluTanh };

// FP8 numerics: y = act(scale_x[m]·scale_w[n]·Σ_k xq[m, k]·wq[n, k] + bias[n]) with e4m3 xq [M, K] and
// wq [N, K] (ops::linear_fp8_ref is the reference, exact sums), an fp32 accumulator (Fp8Accumulate below),
// fp32 scale vectors scale_x [M] (cuBLASLt's B scale)
// and scale_w [N] (A scale) in CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F mode, bias bf16 (cuBLASLt's
// FP8 rule for both bf16 and fp32 outputs), one rounding to the output type. cuBLASLt's FP8 rules
// (cublasLtMatmul docs, "FP8"): TN layout (ours), K % 16 == 0, N·sizeof(y) % 16 == 0 (N % 8 for bf16 y,
// N % 4 for fp32 y), every pointer 16-byte aligned (checked here for xq, wq, y, the scales and the bias),
// any M. Bias and GELU run in cuBLASLt's epilogue when it offers one for the plan; otherwise (no
// algorithm, or a refusal at launch) the GEMM runs without epilogue and bias_act_rows
// (kernels/gemm_epilogue.h) applies them: one more bf16 rounding. Fp8Epilogue::Separate forces that
// path (tests compare both).
enum class Fp8Epilogue : uint8_t { Auto, Separate };

// How cuBLASLt accumulates FP8 products (CUBLASLT_MATMUL_DESC_FAST_ACCUM):
//   Fast (the default, what the engine runs): the tensor cores' own accumulation, whose partial sums keep
//     fewer bits than fp32; Transformer Engine's forward GEMMs run the same way. Against the Fp32 mode's
//     output it differs by 2.5e-3 (K 5120) to 3.6e-3 (K 13824) rel L2, beside the e4m3 scheme's 3.7e-2
//     against fp32 (unchanged in the third digit), and makes the DiT's GEMMs 9-20% faster (bench-gemm,
//     H200; the 720p step's GEMMs 3.04 -> 2.69 s);
//   Fp32: cuBLASLt promotes the partial sums into fp32 every few k-blocks (exact to fp32 rounding, slower).
enum class Fp8Accumulate : uint8_t { Fast, Fp32 };

// True when `device` has compute capability >= 8.9 and a small FP8 outer-vector-scaled GEMM plans and
// runs through GemmRunner (outer-vector scaling is documented for sm_90). Never throws; cached per device;
// false without a device.
bool fp8_supported(int device);

class GemmRunner {
 public:
  // 32 MiB: NVIDIA's recommended cuBLASLt workspace on Hopper (PyTorch uses the same).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // workspace: device memory of workspace_bytes owned by the caller (may be null with 0 bytes, which
  // restricts the heuristic to algorithms without workspace). Creates the handle on the current device.
  GemmRunner(void* workspace, size_t workspace_bytes);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // y bf16 [M, N] = act(x bf16 [M, K] · w bf16 [N, K]ᵀ + bias bf16 [N]); bias may be null.
  void linear(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
              int64_t M, int64_t K, int64_t N, Act act, cudaStream_t stream);
  // Same with an fp32 output and fp32 bias (no rounding of the accumulator to bf16).
  void linear(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t M, int64_t K,
              int64_t N, Act act, cudaStream_t stream);
  // All fp32 (no TF32): the reference's fp32 regions. act must be Act::None.
  void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N, Act act,
              cudaStream_t stream);

  // Untyped entry point behind the three above. in_type: BF16 or F32 (x and w); out_type: BF16 or F32
  // (y and bias); F32 inputs need an F32 output. M == 0 or N == 0 is a no-op; K >= 1.
  void run(const void* x, const void* w, const void* bias, void* y, int64_t M, int64_t K, int64_t N, DType in_type,
           DType out_type, Act act, cudaStream_t stream);

  // FP8: y bf16 [M, N] = act(scale_x[m]·scale_w[n]·(xq[M, K]·wq[N, K]ᵀ) + bias[N]); bias may be null.
  void linear_fp8(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                  const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t M, int64_t K, int64_t N, Act act,
                  cudaStream_t stream);
  // Same with an fp32 output (the bias stays bf16).
  void linear_fp8(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                  const __nv_bfloat16* bias, float* y, int64_t M, int64_t K, int64_t N, Act act, cudaStream_t stream);
  // Untyped FP8 entry point behind the two above; out_type BF16 or F32. M == 0 or N == 0 is a no-op.
  void run_fp8(const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w, const void* bias,
               void* y, int64_t M, int64_t K, int64_t N, DType out_type, Act act, cudaStream_t stream);
  void set_fp8_epilogue(Fp8Epilogue e);
  // For later FP8 calls (plans of both modes are cached apart).
  void set_fp8_accumulate(Fp8Accumulate a);
  Fp8Accumulate fp8_accumulate() const;
  size_t fp8_separate_epilogues() const;  // FP8 calls whose bias / GELU ran in bias_act_rows

  size_t plan_count() const;  // cached plans (for tests and the memory/plan report)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wan::cuda
