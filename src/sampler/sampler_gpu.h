// The sampler's state on the GPU and its fused step: classifier-free guidance and the solver update
// (flow UniPC bh2 + UniC, flow DPM++ 2M, Euler, step-distill) as ONE elementwise fp32 kernel per
// step, reading the DiT's output where it lies in device memory. The scalar coefficients come from
// the host (wan::Sampler::take_step(): schedule and index only); the per-element arithmetic is the
// CPU's own step_element() (sampler/sampler_step.h) compiled for the device.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "sampler/sampler_step.h"

namespace wan::cuda {

// Numerics: bit-identical to wan::cfg_combine + wan::Sampler::step on the CPU for the same inputs:
// every op an explicit round-to-nearest intrinsic (no fma contraction), the reference's order.
// Without an uncond input the guided output is cond itself (the pipeline's guide = 1 batch-1 path).
//
// State (device memory, this object's allocations): x [n] (the DiT reads its CFG batch from it as one
// latent for cond and uncond, DiTShape::one_latent), and the history of sampler_step.h: m_last, m_prev
// (UniPC, DPM++), last_sample (UniPC), zero before the first step. Their roles swap after each step by
// pointer, never by copying.
// Vector access: float4 loads/stores when every pointer of a launch is 16-byte aligned (any n:
// the n mod 4 tail runs scalar); any misaligned pointer (e.g. uncond = cond + n with odd n) makes the
// whole launch scalar. Both give the same bits.
// Not thread-safe. Work is ordered on the caller's stream; upload/download calls synchronise it.

class SamplerGpu {
 public:
  // Allocates and zeroes the state for samples of n elements on `device` (throws wan::Error on n = 0).
  SamplerGpu(SolverKind solver, size_t n, int device = 0);
  SamplerGpu(SamplerGpu&&) noexcept;
  SamplerGpu& operator=(SamplerGpu&&) noexcept;
  SamplerGpu(const SamplerGpu&) = delete;
  SamplerGpu& operator=(const SamplerGpu&) = delete;
  ~SamplerGpu();

  SolverKind solver() const { return solver_; }
  size_t numel() const { return n_; }
  int index() const { return index_; }  // steps applied so far
  int device() const { return device_; }

  // The sample, device memory [n].
  float* x() { return x_; }
  const float* x() const { return x_; }
  // n floats (host or device memory) into x; synchronous.
  void set_x(const float* src, cudaStream_t stream = nullptr);
  // x into dst (n floats, host or device memory); synchronous.
  void get_x(float* dst, cudaStream_t stream = nullptr) const;

  // One guided step, ordered on `stream`: v = uncond + guide * (cond - uncond) (v = cond when uncond
  // is null), then the solver update with `c`, which must be the coefficients of step index() for
  // this solver (take_step() of a Sampler on the same schedule). cond/uncond: n floats of device
  // memory each (any alignment; they may be the two halves of the DiT's [2, n] output); they must
  // not overlap the state.
  void step(const StepCoeffs& c, const float* cond, const float* uncond, float guide, cudaStream_t stream = nullptr);

  // The resumable state (index and history as host vectors, the layout of Sampler::state()); x is
  // separate (get_x). Synchronous.
  SamplerState download_state(cudaStream_t stream = nullptr) const;
  // Restores index and history (validated like Sampler::set_state: the index is not checked
  // against a schedule, which this object does not know). Synchronous.
  void upload_state(const SamplerState& st, cudaStream_t stream = nullptr);

 private:
  void release() noexcept;

  SolverKind solver_;
  size_t n_ = 0;
  int device_ = 0, index_ = 0;
  float* x_ = nullptr;
  float* m_last_ = nullptr;
  float* m_prev_ = nullptr;
  float* xs_ = nullptr;
};

}  // namespace wan::cuda
