// The DiT as the sampling loop sees it: one forward of an expert on a batch (cond[, uncond]) of the
// same latent. Two implementations: the CPU float32 reference (wan::dit_forward) and, in CUDA builds,
// the GPU engine (wan::cuda::DiTGpu: bf16 numerics, both experts resident, CUDA graphs).
// Invariants: make_denoiser() does all loading before the first step; on the GPU the memory fit is
// the run-level plan's (plan_gpu_dit_memory feeds it, DenoiserSpec::dit_plan carries the DiT's share
// to creation, which then only allocates); forward() writes batch × numel(x) floats to out, cond first.
// GPU entry points are defined in denoiser_gpu.cpp; a CPU-only build's stubs (denoiser.cpp) throw.
// Sampling through a denoiser (begin_sampling / guided_step / sync_sampling) keeps the latent and the
// solver's multistep history where the model runs: host memory on the CPU (forward, cfg_combine,
// Sampler::step: the reference path), device memory on the GPU, where guidance and the solver update
// are one fused fp32 kernel per step (cuda::SamplerGpu) reading the DiT's output on the device, bit-
// identical to the host path for the same DiT outputs.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/layout.h"
#include "runtime/dist/parallel_layout.h"
#include "core/tensor.h"
#include "lora/lora.h"
#include "sampler/sampler.h"
#include "models/vae/vae_cpu.h"

namespace wan {

namespace cuda {
class DeviceLoader;  // runtime/load_gpu.h (CUDA builds)
struct MemoryPlan;   // models/dit/dit_gpu.h (CUDA builds)
}

// What the DiT sees besides the noisy latent x (spec §1.4), the same for the conditional and the
// unconditional pass:
//   y:           I2V [4 + z, T, H, W] (mask, then the VAE latent of the image video), concatenated after
//                x's channels (in_dim = z + 4 + z).
//   first_frame: TI2V image mode [z, 1, H, W]: latent frame 0 is held at it (when sampling begins and
//                after every solver update, as the official loop does) and its tokens run at timestep 0.
struct LatentCondition {
  Tensor y, first_frame;
  bool empty() const { return !y.defined() && !first_frame.defined(); }
};

// Sets latent frame 0 of x [z, T, H, W] f32 to first [z, 1, H, W] (host memory).
void hold_first_frame(Tensor& x, const Tensor& first);

class Denoiser {
 public:
  virtual ~Denoiser() = default;
  // x [z, T, H, W] f32 (the noisy latent; the condition is added here); ctx [batch, rows, text_dim] f32
  // with lens[b] real rows; out [batch, z, T, H, W].
  virtual void forward(Expert e, const Tensor& x, int batch, float t, const Tensor& ctx,
                       const std::vector<int64_t>& lens, float* out) = 0;
  // The run's condition (empty for T2V and TI2V's text mode); set before begin_sampling.
  virtual void set_condition(const LatentCondition& c) { cond_ = c; }

  // Starts a run on x [z, T, H, W] f32 from the state of s: step 0, or a state restored with
  // Sampler::set_state() to resume. s must hold its history (a fresh sampler, or sync_sampling()).
  virtual void begin_sampling(Sampler& s, const Tensor& x);
  // Step s.index(): forward of expert e at t = s.timestep() on the current x with ctx [batch, rows,
  // text_dim] / lens; batch 2 = (cond, uncond) combined as cfg_combine(cond, uncond, guide), batch 1
  // = the conditional output alone (guide unused); then the solver update. Advances s.
  virtual void guided_step(Sampler& s, Expert e, float guide, const Tensor& ctx, const std::vector<int64_t>& lens);
  // The current x (a host copy) and the run's history brought back into s, so that s.state() gives
  // the resumable state (save it with x). The run may go on with guided_step() afterwards.
  virtual Tensor sync_sampling(Sampler& s);
  // Prepares the (expert, batch) forwards the run will make at latent shape [z, T, H, W] (no larger
  // than the one the denoiser was planned for) without running them (GPU: allocates a deferred arena,
  // builds every GEMM / attention plan and captures the CUDA graphs, DiTGpu::warm_up); nothing to do on
  // the CPU.
  virtual void warm_up(const std::vector<std::pair<Expert, int>>& uses, const Shape& latent) {
    (void)uses, (void)latent;
  }

 protected:
  LatentCondition cond_;
  // The host path's run state (also the GPU denoiser's with DenoiserSpec::fused_sampler off).
  Tensor host_x_;
  std::vector<float> host_out_, host_v_;
};

struct DenoiserSpec {
  std::string device = "cpu";  // "cpu" | "cuda" | "cuda:<i>"
  bool use_high = true, use_low = true;
  Shape latent_shape;          // [z, T, H, W]: the GPU arena is planned for it (batch 2)
  bool first_frame_t = false;  // TI2V image mode: frame 0's tokens at their own timestep (cuda::DiTShape)
  dist::Layout parallel;       // several GPUs: the DiT's layout (each rank plans its share); one GPU: {}
  bool verbose = false;        // print the GPU memory plan
  // --weights random: every expert drawn from the engine RNG (GPU: DiTWeightSource::random_weights;
  // CPU: random_dit_weights, the same values) with these seeds instead of loaded from the checkpoint.
  bool random_weights = false;
  uint64_t seed_high = 0, seed_low = 0;
  // LoRA terms merged into each expert's weights as they load or after the draw (null: none; the
  // single TI2V-5B model takes lora_high).
  std::shared_ptr<const LoraSet> lora_high, lora_low;
  // GPU: the DiT's arena plan (plan_gpu_dit_memory's), already checked against the device as part of
  // the run-level memory plan: creation then only allocates. Null: make_denoiser checks the DiT's fit
  // itself (callers without a run plan).
  std::shared_ptr<const cuda::MemoryPlan> dit_plan;
  // GPU: guidance + solver update fused on the device (the default). Off: the DiT output goes to the
  // host for cfg_combine + Sampler::step each step (the pre-fusion path, kept for tests).
  bool fused_sampler = true;
  // GPU attention kernel: "auto" (the engine's own on sm_90, cuDNN elsewhere) | "own" | "cudnn".
  std::string attention = "auto";
  // GPU block GEMMs: "bf16" (exact) | "fp8" (cuda::DiTGemm::Fp8; refused where cuda::fp8_supported is false).
  std::string gemm = "bf16";
  // GPU fast start: the experts' weights are added to this not yet started loader as
  // completion group `loader_group` instead of being loaded by make_denoiser (the caller starts the
  // loader and waits for it before the first step), and the activation arena is allocated in
  // warm_up(). Without a loader the weights still stream from the files, inside make_denoiser.
  cuda::DeviceLoader* loader = nullptr;
  int loader_group = 1;
  // GPU, one device: where the experts' weights live (issue 27), as an index into the GPU DiT's
  // residencies, fastest first (cuda::DiTGpu::residencies: 0 = resident, then expert swap, then block
  // streaming); plan_gpu_run picks the first that fits the budget. dit_plan, when given, carries it too.
  int residency = 0;
};

// Loads the experts the schedule uses (CPU f32, or uploaded to the GPU).
std::unique_ptr<Denoiser> make_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec);

// Parses "cuda" / "cuda:<i>" (device index) or "cpu" (-1); throws wan::Error otherwise.
int parse_device(const std::string& device);

// The GPU DiT's share of a run's device memory: the inputs of the run-level plan (runtime/memory_plan.h).
struct GpuDiTMemory {
  std::shared_ptr<const cuda::MemoryPlan> plan;  // DiTGpu::plan at the spec's shape: for DenoiserSpec::dit_plan
  int experts = 0;
  size_t weight_bytes = 0;   // one expert
  size_t device_weight_bytes = 0;  // what the experts hold on the device under the spec's residency
  size_t host_weight_bytes = 0;    // the pinned host memory the residency holds (0: resident)
  std::string residency;           // its name ("resident", "expert swap", "block streaming (3 slots)")
  bool streams = false;            // block streaming: each forward copies every block (block_bytes each)
  size_t disk_bytes = 0;           // block streaming from disk: the spill file (0: none)
  int64_t chunk_rows = 0;          // rows per chunk when the activations are chunked (0: whole rows)
  size_t block_bytes = 0;
  int residencies = 1;             // how many DenoiserSpec::residency choices there are
  size_t arena_bytes = 0;    // activations + workspaces (cuDNN's attention workspace excluded: known at creation)
  size_t reserve_bytes = 0;  // kept free for handles, kernels and graphs
  size_t sampler_bytes = 0;  // the fused sampler's device state (with I2V's DiT input and TI2V's held frame)
  size_t staging_bytes = 0;  // the fast start's loader staging (DeviceLoader::device_bytes)
  size_t free_bytes = 0;     // free on the device now (plan_gpu_run: the budget when smaller)
  size_t total_bytes = 0;    // the device's memory
  // device weights + arena + reserve + sampler at `latent_frames` latent frames of the spec's size (what fits).
  std::function<size_t(int64_t latent_frames)> bytes_at_frames;
};
// Throws one clear wan::Error unless the CUDA path can run `spec` on this machine (built with CUDA, the
// device exists, the task, the attention kernel and the GEMM kind are supported there), else returns the DiT's memory
// plan and the device's free memory. Host arithmetic and one cudaMemGetInfo: no allocation.
GpuDiTMemory plan_gpu_dit_memory(const CheckpointInfo& ckpt, const DenoiserSpec& spec);

// GPU entry points of make_denoiser / the pipeline (denoiser_gpu.cpp; a CPU-only build's throw).
std::unique_ptr<Denoiser> make_gpu_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec, int device);
// The VAE decode on the GPU (Wan 2.1 VAE, bf16, wan::cuda::VaeDecoderGpu).
// check_gpu_vae: throws one clear wan::Error unless this build and VAE can decode on `device`.
void check_gpu_vae(const VaeConfig& vae, const std::string& device);
// check_gpu_vae, then the decoder's device bytes for latents [z, T, h, w] (VaeDecoderGpu::device_bytes:
// planned on shapes, nothing allocated). `upper_bound`: the convolution workspace counted at its limit
// instead of cuDNN's choices (VaeGpuOptions::workspace_bound: no cuDNN query, at most 1 GiB more).
size_t gpu_vae_decoder_bytes(const VaeConfig& vae, const Shape& latent_shape, const std::string& device,
                             bool upper_bound = false);
// latents [z, T, h, w] f32 (host) -> video [3, F, H, W] f32 in [-1, 1] (host).
Tensor gpu_vae_decode(const VaeConfig& vae, const VaeWeights& w, const Tensor& latents, int device);
// check_gpu_vae, then the image encoder's device bytes for the frames of `image` [3, H, W]
// (VaeEncoderGpu::device_bytes: planned on shapes, nothing allocated).
size_t gpu_vae_encoder_bytes(const VaeConfig& vae, const Tensor& image, const std::string& device);
// video [3, F, H, W] f32 in [-1, 1] (host) -> normalised posterior mean [z, T, h, w] f32 (host), on the GPU
// (bf16, wan::cuda::VaeEncoderGpu).
Tensor gpu_vae_encode(const VaeConfig& vae, const VaeWeights& w, const Tensor& video, int device);

}  // namespace wan
