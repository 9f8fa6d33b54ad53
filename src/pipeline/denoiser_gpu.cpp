// GPU denoiser: both experts resident on one device through wan::cuda::DiTGpu (bf16 weights, planned
// arena, batched CFG, CUDA graphs). Compiled only in CUDA builds. Checkpoint weights stream from the
// files (runtime/load_gpu.h), inside make_denoiser or through the caller's loader (DenoiserSpec::loader,
// the fast start of pipeline/startup.h); warm_up() captures the graphs before the first step.
// Sampling (fused_sampler, the default): x, the DiT output and the solver history stay in device
// memory (cuda::SamplerGpu, x read by the DiT as the one latent of its CFG batch); each step is the DiT
// forward, then one fused guidance + solver kernel with coefficients from Sampler::take_step().
// Also the other GPU entry points of denoiser.h: the DiT's share of the run-level memory plan and the
// VAE decode. Creation only allocates when the caller passes the plan it checked (DenoiserSpec::dit_plan).
#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/check.h"
#include "kernels/gemm.h"
#include "lora/lora_gpu.h"
#include "models/dit/dit_gpu.h"
#include "runtime/load_gpu.h"
#include "runtime/memory_plan.h"
#include "kernels/rng.h"
#include "sampler/sampler_gpu.h"
#include "models/vae/vae_gpu.h"
#include "models/vae/vae_gpu_encoder.h"
#include "pipeline/denoiser.h"
#include "pipeline/dit_step_gpu.h"
#include "pipeline/pipeline_internal.h"

namespace wan {

namespace {

cuda::DiTShape max_shape(const DenoiserSpec& spec) {
  const Shape& s = spec.latent_shape;
  cuda::DiTShape shape{2, s[1], s[2], s[3]};
  shape.first_frame_t = spec.first_frame_t;
  return shape;
}

// Device bytes of the fused sampler next to the DiT: x, the DiT output (2 samples), and the history
// (m_last, m_prev, last_sample at most); with a condition (FusedDiTStep) I2V's DiT input [x, y] of in_dim
// channels and TI2V's held first frame.
size_t sampler_bytes(const DenoiserSpec& spec, int in_dim) {
  if (!spec.fused_sampler) return 0;
  const Shape& s = spec.latent_shape;
  const size_t n = static_cast<size_t>(s.numel()), frame = static_cast<size_t>(s[0] * s[2] * s[3]);
  const size_t input = in_dim != s[0] ? n / static_cast<size_t>(s[0]) * static_cast<size_t>(in_dim) : 0;
  return (n * 6 + input + (spec.first_frame_t ? frame : 0)) * 4;
}

std::vector<Role> expert_roles(const CheckpointInfo& ckpt, const DenoiserSpec& spec) {
  return pipeline_detail::expert_roles(ckpt, spec.use_high, spec.use_low);
}

// The LoRA sets of the experts used, in the DiT's expert order (high-noise first).
std::vector<std::shared_ptr<const LoraSet>> used_loras(const DenoiserSpec& spec) {
  std::vector<std::shared_ptr<const LoraSet>> v;
  if (spec.use_high) v.push_back(spec.lora_high);
  if (spec.use_low) v.push_back(spec.lora_low);
  return v;
}

cuda::WeightResidency residency_of(const DenoiserSpec& spec, int experts) {
  const std::vector<cuda::WeightResidency> all = cuda::DiTGpu::residencies(experts);
  WAN_ASSERT(spec.residency >= 0 && spec.residency < static_cast<int>(all.size()), "residency choice ",
             spec.residency, " of ", all.size());
  return all[static_cast<size_t>(spec.residency)];
}

class GpuDenoiser : public Denoiser {
 public:
  GpuDenoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec, int device) : spec_(spec), device_(device) {
    CUDA_CHECK(cudaSetDevice(device));
    std::vector<cuda::DiTWeightSource> sources;
    if (spec.random_weights) {  // drawn on the GPU at the real sizes
      if (spec.use_high) sources.push_back(cuda::DiTWeightSource::random_weights(spec.seed_high));
      if (spec.use_low) sources.push_back(cuda::DiTWeightSource::random_weights(spec.seed_low));
    }
    const std::vector<std::shared_ptr<const LoraSet>> loras = used_loras(spec);
    // Checkpoint weights stream from the files (runtime/load_gpu.h); the stores stay open while a
    // deferred load (spec.loader) may still call their getters.
    for (Role r : spec.random_weights ? std::vector<Role>{} : expert_roles(ckpt, spec)) {
      stores_.push_back(open_weights(ckpt, r));
      WeightStore* ws = stores_.back().get();
      cuda::DiTWeightSource src = cuda::DiTWeightSource::from([ws](const std::string& name) { return ws->get_f32(name); });
      src.span = [ws](const std::string& name) { return ws->raw_span(name); };
      src.loader = spec.loader;
      src.group = spec.loader_group;
      sources.push_back(std::move(src));
    }
    for (size_t i = 0; i < sources.size(); ++i) sources[i].merge = cuda::lora_merge_hooks(loras[i]);
    cuda::DiTGpu::Options opt;
    opt.device = device;
    opt.verbose = spec.verbose;
    opt.attention = cuda::DiTGpu::parse_attention(spec.attention);
    opt.gemm = cuda::DiTGpu::parse_gemm(spec.gemm);
    opt.defer_arena = spec.loader != nullptr && !spec.random_weights;
    opt.planned = spec.dit_plan;
    opt.residency = spec.dit_plan ? spec.dit_plan->residency : residency_of(spec, static_cast<int>(sources.size()));
    dit_ = std::make_unique<cuda::DiTGpu>(cuda::DiTGpu::create(ckpt.dit, sources, max_shape(spec), opt));
    high_index_ = spec.use_high ? 0 : -1;
    low_index_ = spec.use_low ? (spec.use_high ? 1 : 0) : -1;
  }
  void forward(Expert e, const Tensor& x, int batch, float t, const Tensor& ctx, const std::vector<int64_t>& lens,
               float* out) override {
    dit_forward_host(*dit_, index(e), x, batch, t, ctx, lens, cond_, out, nullptr);
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  void set_condition(const LatentCondition& c) override {
    Denoiser::set_condition(c);
    fused_.set_condition(c);
  }

  void begin_sampling(Sampler& s, const Tensor& x) override {
    if (!spec_.fused_sampler) return Denoiser::begin_sampling(s, x);
    fused_.begin(s, x, dit_->config(), device_, nullptr);
  }

  void guided_step(Sampler& s, Expert e, float guide, const Tensor& ctx, const std::vector<int64_t>& lens) override {
    if (!spec_.fused_sampler) return Denoiser::guided_step(s, e, guide, ctx, lens);
    fused_.step(*dit_, index(e), s, guide, ctx, lens, nullptr);
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  void warm_up(const std::vector<std::pair<Expert, int>>& uses, const Shape& ls) override {
    std::vector<std::pair<int, cuda::DiTShape>> u;
    for (const auto& [e, batch] : uses) {
      const int expert = e == Expert::High ? high_index_ : low_index_;
      cuda::DiTShape shape{batch, ls[1], ls[2], ls[3], /*one_latent=*/true};
      shape.first_frame_t = spec_.first_frame_t;
      if (expert >= 0) u.push_back({expert, shape});
    }
    CUDA_CHECK(cudaSetDevice(device_));
    dit_->warm_up(u);
  }

  Tensor sync_sampling(Sampler& s) override {
    if (!spec_.fused_sampler) return Denoiser::sync_sampling(s);
    return fused_.sync(s, nullptr);
  }

 private:
  int index(Expert e) const {
    const int i = e == Expert::High ? high_index_ : low_index_;
    WAN_ASSERT(i >= 0, "expert not loaded");
    return i;
  }

  DenoiserSpec spec_;
  int device_ = 0;
  std::vector<std::unique_ptr<WeightStore>> stores_;  // the experts' (checkpoint weights)
  std::unique_ptr<cuda::DiTGpu> dit_;
  int high_index_ = -1, low_index_ = -1;
  FusedDiTStep fused_;     // fused sampling (spec_.fused_sampler)
};

}  // namespace

GpuDiTMemory plan_gpu_dit_memory(const CheckpointInfo& ckpt, const DenoiserSpec& spec) {
  const int device = parse_device(spec.device);
  WAN_ASSERT(device >= 0, "plan_gpu_dit_memory on the CPU");
  const int n = cuda::device_count();
  WAN_CHECK(n > 0, "--device ", spec.device, ": no CUDA device is available on this machine");
  WAN_CHECK(device < n, "--device ", spec.device, ": this machine has ", n, " CUDA device(s)");
  GpuDiTMemory m;
  m.experts = static_cast<int>(expert_roles(ckpt, spec).size());
  const cuda::DiTGpu::Gemm gemm = cuda::DiTGpu::parse_gemm(spec.gemm);
  const cuda::WeightResidency res = residency_of(spec, m.experts);
  m.residencies = static_cast<int>(cuda::DiTGpu::residencies(m.experts).size());
  WAN_CHECK(res == cuda::WeightResidency::resident() || !spec.parallel.active(),
            "--memory-budget: swapping or streaming the weights runs on one GPU (each rank of ",
            dist::describe(spec.parallel), " holds its share resident)");
  auto plan = std::make_shared<cuda::MemoryPlan>(
      cuda::DiTGpu::plan(ckpt.dit, max_shape(spec), m.experts, 0, spec.parallel, gemm, res));
  CUDA_CHECK(cudaSetDevice(device));
  // --attention own on a device without the sm_90a kernel, --gemm fp8 on one without FP8 GEMMs: one
  // clear error before any work.
  (void)cuda::DiTGpu::resolve_attention(cuda::DiTGpu::parse_attention(spec.attention));
  WAN_CHECK(gemm == cuda::DiTGpu::Gemm::Bf16 || cuda::fp8_supported(device), "--gemm fp8: device ", spec.device,
            " has no FP8 GEMMs through cuBLASLt (they need an sm_90 GPU); use --gemm bf16");
  CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  m.weight_bytes = plan->weight_bytes;
  m.device_weight_bytes = plan->device_weight_bytes();
  m.host_weight_bytes = plan->host_weight_bytes();
  m.residency = res.str();
  m.streams = res.mode == cuda::WeightResidency::Mode::StreamBlocks;
  m.chunk_rows = plan->chunk_rows;
  m.disk_bytes = plan->disk_bytes();
  m.block_bytes = plan->block_bytes;
  m.arena_bytes = plan->arena_bytes;
  m.reserve_bytes = plan->reserve_bytes;
  m.sampler_bytes = sampler_bytes(spec, ckpt.dit.in_dim);
  m.staging_bytes = cuda::DeviceLoader::device_bytes(cuda::LoadOptions::tuned(device));
  m.plan = std::move(plan);
  m.bytes_at_frames = [cfg = ckpt.dit, spec, experts = m.experts, res](int64_t frames) {
    DenoiserSpec s = spec;
    s.latent_shape = Shape{spec.latent_shape[0], frames, spec.latent_shape[2], spec.latent_shape[3]};
    const cuda::DiTGpu::Gemm g = cuda::DiTGpu::parse_gemm(s.gemm);
    return cuda::DiTGpu::plan(cfg, max_shape(s), experts, 0, s.parallel, g, res).total_bytes() +
           sampler_bytes(s, cfg.in_dim);
  };
  return m;
}

std::unique_ptr<Denoiser> make_gpu_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec, int device) {
  // Without a run-level plan (callers outside plan_generate) the DiT's own need is checked here; with
  // a loader (the fast start) the caller has planned the run. DiTGpu::create checks its own fit too.
  if (!spec.dit_plan && !spec.loader) {
    const GpuDiTMemory m = plan_gpu_dit_memory(ckpt, spec);
    RunMemoryPlan run;
    run.request = cat(m.experts, " expert(s), latent ", spec.latent_shape.str());
    const StageSet denoise = stage_bit(RunStage::Denoise);
    run.add(spec.device, "DiT weights", m.device_weight_bytes, denoise);
    run.add(spec.device, "DiT activations", m.arena_bytes, denoise);
    run.add(spec.device, "sampler", m.sampler_bytes, denoise);
    run.add(spec.device, "reserve", m.reserve_bytes, denoise);
    run.check(m.free_bytes);
  }
  return std::make_unique<GpuDenoiser>(ckpt, spec, device);
}

void check_gpu_vae(const VaeConfig& vae, const std::string& device) {
  const int index = parse_device(device);
  const int n = cuda::device_count();
  WAN_CHECK(n > 0, "--device ", device, ": no CUDA device is available on this machine");
  WAN_CHECK(index < n, "--device ", device, ": this machine has ", n, " CUDA device(s)");
  // The narrowest convolution has base_dim / 2 input channels (Wan 2.1's halving up-samplers); the
  // kernels need multiples of 8.
  WAN_CHECK(vae.base_dim % 16 == 0 && vae.dec_dim % 16 == 0, "--device ", device,
            ": the GPU VAE needs channel widths that are multiples of 16 (this VAE's are ", vae.base_dim, " and ",
            vae.dec_dim, "; the released VAEs have 96, and 160 / 256)");
}

size_t gpu_vae_decoder_bytes(const VaeConfig& vae, const Shape& latent_shape, const std::string& device,
                             bool upper_bound) {
  check_gpu_vae(vae, device);
  CUDA_CHECK(cudaSetDevice(parse_device(device)));
  cuda::VaeGpuOptions o;
  o.workspace_bound = upper_bound;
  // Besides the decoder: its input and output on the device (pipeline/text_gpu.cpp's decoders: the
  // latents f32, the video f32 and, streamed, its uint8 frames), 1.5 GiB at 1280x704 and 121 frames.
  const int64_t sf = vae_spatial_factor(vae);
  const auto F = static_cast<size_t>(1 + vae_temporal_factor(vae) * (latent_shape[1] - 1));
  const auto pixels = static_cast<size_t>(sf * latent_shape[2] * sf * latent_shape[3]);
  const size_t io = static_cast<size_t>(latent_shape.numel()) * 4 + 3 * F * pixels * 4 + F * pixels * 3;
  return cuda::VaeDecoderGpu::device_bytes(vae, cuda::VaeGpuShape{latent_shape[2], latent_shape[3]}, o) + io;
}

size_t gpu_vae_encoder_bytes(const VaeConfig& vae, const Tensor& image, const std::string& device) {
  check_gpu_vae(vae, device);
  CUDA_CHECK(cudaSetDevice(parse_device(device)));
  const int sf = vae_spatial_factor(vae);
  return cuda::VaeEncoderGpu::device_bytes(vae, cuda::VaeGpuShape{image.dim(1) / sf, image.dim(2) / sf});
}

Tensor gpu_vae_encode(const VaeConfig& vae, const VaeWeights& w, const Tensor& video, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  const int sf = vae_spatial_factor(vae);
  auto enc = cuda::VaeEncoderGpu::create(vae, w, cuda::VaeGpuShape{video.dim(2) / sf, video.dim(3) / sf});
  return enc->encode(video);
}

Tensor gpu_vae_decode(const VaeConfig& vae, const VaeWeights& w, const Tensor& latents, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  auto dec = cuda::VaeDecoderGpu::create(vae, w, cuda::VaeGpuShape{latents.dim(2), latents.dim(3)});
  return dec->decode(latents, /*clamp=*/true);
}

}  // namespace wan
#endif  // WAN_HAVE_CUDA
