// GPU denoiser: both experts resident on one device through wan::cuda::DiTGpu (bf16 weights, planned
// arena, batched CFG, CUDA graphs). Compiled only in CUDA builds. Checkpoint weights stream from the
// files (cuda/load_gpu.h), inside make_denoiser or through the caller's loader (DenoiserSpec::loader,
// the fast start of pipeline/startup.h); warm_up() captures the graphs before the first step.
// Sampling (fused_sampler, the default): x, the DiT output and the solver history stay in device
// memory (cuda::SamplerGpu, x kept as the [2, n] CFG batch the DiT reads); each step is the DiT
// forward, then one fused guidance + solver kernel with coefficients from Sampler::take_step().
#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/dit_gpu.h"
#include "cuda/load_gpu.h"
#include "cuda/rng.h"
#include "cuda/sampler_gpu.h"
#include "cuda/vae_gpu.h"
#include "pipeline/denoiser.h"
#include "pipeline/pipeline_internal.h"

namespace wan {

namespace {

cuda::DiTShape max_shape(const DenoiserSpec& spec) {
  const Shape& s = spec.latent_shape;
  return cuda::DiTShape{2, s[1], s[2], s[3]};
}

// Device bytes of the fused sampler next to the DiT: x (2 copies), the DiT output (2 samples), and
// the history (m_last, m_prev, last_sample at most).
size_t sampler_bytes(const DenoiserSpec& spec) {
  return spec.fused_sampler ? static_cast<size_t>(spec.latent_shape.numel()) * 4 * 7 : 0;
}

struct CudaFree {
  void operator()(float* p) const { cudaFree(p); }
};

std::vector<Role> expert_roles(const CheckpointInfo& ckpt, const DenoiserSpec& spec) {
  return pipeline_detail::expert_roles(ckpt, spec.use_high, spec.use_low);
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
    // Checkpoint weights stream from the files (cuda/load_gpu.h); the stores stay open while a
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
    cuda::DiTGpu::Options opt;
    opt.device = device;
    opt.verbose = spec.verbose;
    opt.attention = cuda::DiTGpu::parse_attention(spec.attention);
    opt.defer_arena = spec.loader != nullptr && !spec.random_weights;
    dit_ = std::make_unique<cuda::DiTGpu>(cuda::DiTGpu::create(ckpt.dit, sources, max_shape(spec), opt));
    high_index_ = spec.use_high ? 0 : -1;
    low_index_ = spec.use_low ? (spec.use_high ? 1 : 0) : -1;
  }
  void forward(Expert e, const Tensor& x, int batch, float t, const Tensor& ctx, const std::vector<int64_t>& lens,
               float* out) override {
    const int expert = e == Expert::High ? high_index_ : low_index_;
    WAN_ASSERT(expert >= 0, "expert not loaded");
    const int64_t n = x.numel();
    xb_.resize(static_cast<size_t>(n * batch));
    for (int b = 0; b < batch; ++b) std::memcpy(xb_.data() + b * n, x.f32(), static_cast<size_t>(n) * 4);
    std::vector<float> tt(static_cast<size_t>(batch), t);
    cuda::DiTInputs in;
    in.x = xb_.data();
    in.t = tt.data();
    in.context = ctx.f32();
    in.context_dtype = DType::F32;
    in.ctx_rows = ctx.dim(1);
    in.ctx_lens = lens.data();
    cuda::DiTShape shape{batch, x.dim(1), x.dim(2), x.dim(3)};
    dit_->forward(expert, shape, in, out, nullptr);
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  void begin_sampling(Sampler& s, const Tensor& x) override {
    if (!spec_.fused_sampler) return Denoiser::begin_sampling(s, x);
    WAN_ASSERT(x.dtype() == DType::F32 && x.ndim() == 4, "sampling latent ", x.shape().str());
    const DiTConfig& c = dit_->config();
    WAN_CHECK(x.dim(0) == c.in_dim && c.out_dim == c.in_dim, "GPU sampling: a latent of ", x.dim(0),
              " channels for a DiT of in_dim ", c.in_dim, " and out_dim ", c.out_dim);
    const SamplerState st = s.state();  // throws unless s holds its history
    const size_t n = static_cast<size_t>(x.numel());
    CUDA_CHECK(cudaSetDevice(device_));
    if (!samp_ || samp_->numel() != n || samp_->solver() != s.solver()) {
      samp_.reset();
      out_.reset();
      samp_ = std::make_unique<cuda::SamplerGpu>(s.solver(), n, /*x_copies=*/2, device_);
      float* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, 2 * n * 4));
      out_.reset(p);
    }
    samp_->set_x(x.f32());
    samp_->upload_state(st);
    latent_shape_ = x.shape();
  }

  void guided_step(Sampler& s, Expert e, float guide, const Tensor& ctx, const std::vector<int64_t>& lens) override {
    if (!spec_.fused_sampler) return Denoiser::guided_step(s, e, guide, ctx, lens);
    WAN_ASSERT(samp_ && samp_->index() == s.index(), "guided_step: the GPU sampler is at step ",
               samp_ ? samp_->index() : -1, ", the sampler at ", s.index());
    const int expert = e == Expert::High ? high_index_ : low_index_;
    WAN_ASSERT(expert >= 0, "expert not loaded");
    const int batch = static_cast<int>(ctx.dim(0));
    WAN_ASSERT(batch == 1 || batch == 2, "guided_step: batch ", batch);
    std::vector<float> tt(static_cast<size_t>(batch), static_cast<float>(s.timestep()));
    cuda::DiTInputs in;
    in.x = samp_->x();  // [2, n] on the device: the first `batch` copies are read
    in.t = tt.data();
    in.context = ctx.f32();
    in.context_dtype = DType::F32;
    in.ctx_rows = ctx.dim(1);
    in.ctx_lens = lens.data();
    const Shape& ls = latent_shape_;
    dit_->forward(expert, cuda::DiTShape{batch, ls[1], ls[2], ls[3]}, in, out_.get(), nullptr);
    const StepCoeffs c = s.take_step();
    samp_->step(c, out_.get(), batch == 2 ? out_.get() + samp_->numel() : nullptr, guide, nullptr);
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  void warm_up(const std::vector<std::pair<Expert, int>>& uses) override {
    std::vector<std::pair<int, cuda::DiTShape>> u;
    const Shape& ls = spec_.latent_shape;
    for (const auto& [e, batch] : uses) {
      const int expert = e == Expert::High ? high_index_ : low_index_;
      if (expert >= 0) u.push_back({expert, cuda::DiTShape{batch, ls[1], ls[2], ls[3]}});
    }
    CUDA_CHECK(cudaSetDevice(device_));
    dit_->warm_up(u);
  }

  Tensor sync_sampling(Sampler& s) override {
    if (!spec_.fused_sampler) return Denoiser::sync_sampling(s);
    WAN_ASSERT(samp_ && samp_->index() == s.index(), "sync_sampling: the GPU sampler is at step ",
               samp_ ? samp_->index() : -1, ", the sampler at ", s.index());
    Tensor x = Tensor::empty(DType::F32, latent_shape_);
    samp_->get_x(x.f32());
    s.set_state(samp_->download_state());
    return x;
  }

 private:
  DenoiserSpec spec_;
  int device_ = 0;
  std::vector<std::unique_ptr<WeightStore>> stores_;  // the experts' (checkpoint weights)
  std::unique_ptr<cuda::DiTGpu> dit_;
  int high_index_ = -1, low_index_ = -1;
  std::vector<float> xb_;
  // fused sampling
  std::unique_ptr<cuda::SamplerGpu> samp_;
  std::unique_ptr<float, CudaFree> out_;  // the DiT output [2, n]
  Shape latent_shape_;
};

}  // namespace

void check_gpu_denoiser_impl(const CheckpointInfo& ckpt, const DenoiserSpec& spec, int device) {
  const int n = cuda::device_count();
  WAN_CHECK(n > 0, "--device ", spec.device, ": no CUDA device is available on this machine");
  WAN_CHECK(device < n, "--device ", spec.device, ": this machine has ", n, " CUDA device(s)");
  WAN_CHECK(ckpt.dit.model_type != "ti2v", "--device ", spec.device,
            ": per-token timesteps (TI2V) are not supported on the GPU yet");
  const int experts = static_cast<int>(expert_roles(ckpt, spec).size());
  const cuda::MemoryPlan plan = cuda::DiTGpu::plan(ckpt.dit, max_shape(spec), experts);
  CUDA_CHECK(cudaSetDevice(device));
  // --attention own on a device without the sm_90a kernel: one clear error before any work.
  (void)cuda::DiTGpu::resolve_attention(cuda::DiTGpu::parse_attention(spec.attention));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t sampler_b = sampler_bytes(spec);
  WAN_CHECK(plan.total_bytes() + sampler_b + spec.other_device_bytes <= free_b, "--device ", spec.device,
            ": the DiT needs ", (plan.total_bytes() + sampler_b) >> 20, " MiB (", experts, " expert(s) of ",
            plan.weight_bytes >> 20, " MiB + activations ", plan.arena_bytes >> 20, " MiB + sampler ",
            sampler_b >> 20, " MiB)",
            spec.other_device_bytes ? cat(" next to the text encoder's ", spec.other_device_bytes >> 20,
                                          " MiB (--keep-text-encoder)")
                                    : std::string(),
            " but only ", free_b >> 20, " MiB are free");
}

bool gpu_concurrent_load_fits_impl(const CheckpointInfo& ckpt, const DenoiserSpec& spec, size_t other_bytes) {
  const int device = parse_device(spec.device);
  if (device < 0 || device >= cuda::device_count()) return false;
  const int experts = static_cast<int>(expert_roles(ckpt, spec).size());
  const cuda::MemoryPlan plan = cuda::DiTGpu::plan(ckpt.dit, max_shape(spec), experts);
  CUDA_CHECK(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = plan.weight_bytes * static_cast<size_t>(experts) + plan.reserve_bytes + other_bytes +
                      cuda::DeviceLoader::device_bytes(cuda::LoadOptions::tuned(device));
  return need <= free_b;
}

std::unique_ptr<Denoiser> make_gpu_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec, int device) {
  // With a loader (fast start) the text encoder is resident now and the arena comes in warm_up(),
  // after the encoding, the encoder freed first unless kept (pipeline/startup.h): plan_generate checked
  // both phases; DiTGpu::create checks the weights, warm_up the arena.
  if (!spec.loader) check_gpu_denoiser_impl(ckpt, spec, device);
  return std::make_unique<GpuDenoiser>(ckpt, spec, device);
}

void check_gpu_vae_impl(const VaeConfig& vae, const std::string& device) {
  const int index = parse_device(device);
  const int n = cuda::device_count();
  WAN_CHECK(n > 0, "--device ", device, ": no CUDA device is available on this machine");
  WAN_CHECK(index < n, "--device ", device, ": this machine has ", n, " CUDA device(s)");
  WAN_CHECK(vae.version == 21, "--device ", device, ": the GPU VAE decoder supports the Wan 2.1 VAE only (this ",
            "checkpoint has the Wan ", vae.version / 10, ".", vae.version % 10, " VAE)");
  // The decoder's narrowest convolution has base_dim / 2 input channels; its kernels need multiples of 8.
  WAN_CHECK(vae.base_dim % 16 == 0 && vae.dec_dim % 16 == 0, "--device ", device,
            ": the GPU VAE decoder needs channel widths that are multiples of 8 (this VAE's base width is ",
            vae.dec_dim, "; the released Wan 2.1 VAE has 96)");
}

Tensor gpu_vae_decode_impl(const VaeConfig& vae, const VaeWeights& w, const Tensor& latents, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  auto dec = cuda::VaeDecoderGpu::create(vae, w, cuda::VaeGpuShape{latents.dim(2), latents.dim(3)});
  return dec->decode(latents, /*clamp=*/true);
}

}  // namespace wan
#endif  // WAN_HAVE_CUDA
