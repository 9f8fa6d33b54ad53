// The GPU denoising step shared by the one-GPU denoiser (denoiser_gpu.cpp) and every rank of a multi-GPU
// run (generate_parallel.cpp): both drive a cuda::DiTGpu (the multi-GPU one configured for its shard of
// the sequence / batch) and differ only in the stream they order work on and how they wait for it.
//   - dit_forward_host: the plain forward (Denoiser::forward): x [z, T, H, W] host f32, the latent of
//     every sample (DiTShape::one_latent), timestep t for every sample, context [batch, rows, text_dim] f32,
//     with the run's condition (denoiser.h LatentCondition: I2V's y after x, TI2V's frame 0 at t = 0).
//   - FusedDiTStep: the fused sampling state (x [n], the one latent of the DiT's CFG batch; the DiT
//     output; the solver history: cuda::SamplerGpu); begin() checks the latent against the DiT's config
//     and uploads x and the sampler's state, step() runs the forward of step s.index() and the fused
//     guidance + solver update, sync() brings x and the history back into s. With a condition
//     (set_condition before begin): I2V's y waits on the device after x's channels in the DiT's input
//     (x is copied next to it before each forward); TI2V's first frame is copied into x at begin() and
//     after every update, and the DiT runs frame 0's tokens at t = 0.
// Invariants: nothing here synchronises the stream (the callers do, each its own way); the objects
// belong to the device that was current at begin() and must be used with it current.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "core/tensor.h"
#include "models/dit/dit_gpu.h"
#include "pipeline/denoiser.h"
#include "sampler/sampler_gpu.h"
#include "sampler/sampler.h"

namespace wan {

void dit_forward_host(cuda::DiTGpu& dit, int expert, const Tensor& x, int batch, float t, const Tensor& ctx,
                      const std::vector<int64_t>& lens, const LatentCondition& cond, float* out, cudaStream_t stream);

class FusedDiTStep {
 public:
  // Before begin(), which uploads it (empty: none).
  void set_condition(const LatentCondition& c);
  void begin(Sampler& s, const Tensor& x, const DiTConfig& c, int device, cudaStream_t stream);
  // ctx [batch, rows, text_dim] f32 (batch 2: cond, uncond, combined with `guide`; 1: the conditional
  // output alone).
  void step(cuda::DiTGpu& dit, int expert, Sampler& s, float guide, const Tensor& ctx,
            const std::vector<int64_t>& lens, cudaStream_t stream);
  Tensor sync(Sampler& s, cudaStream_t stream);

 private:
  struct CudaFree {
    void operator()(float* p) const { cudaFree(p); }
  };
  void check_index(const Sampler& s, const char* what) const;
  std::unique_ptr<cuda::SamplerGpu> samp_;  // x [n] and the history
  std::unique_ptr<float, CudaFree> out_;    // the DiT output [2, n] f32
  std::unique_ptr<float, CudaFree> input_;  // I2V: the DiT input [x (n), y] (y uploaded once)
  std::unique_ptr<float, CudaFree> first_;  // TI2V image mode: the held frame 0 [z, 1, H, W]
  LatentCondition cond_;
  Shape first_shape_;
  Shape latent_shape_;
  void hold_first_frame(cudaStream_t stream);
};

}  // namespace wan
