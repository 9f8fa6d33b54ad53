// GPU denoiser: both experts resident on one device through wan::cuda::DiTGpu (bf16 weights, planned
// arena, batched CFG, CUDA graphs). Compiled only in CUDA builds.
#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/dit_gpu.h"
#include "cuda/rng.h"
#include "cuda/vae_gpu.h"
#include "pipeline/denoiser.h"

namespace wan {

namespace {

cuda::DiTShape max_shape(const DenoiserSpec& spec) {
  const Shape& s = spec.latent_shape;
  return cuda::DiTShape{2, s[1], s[2], s[3]};
}

std::vector<Role> expert_roles(const CheckpointInfo& ckpt, const DenoiserSpec& spec) {
  const bool single = ckpt.has(Role::DiT) && !ckpt.has(Role::DiTHigh);
  std::vector<Role> roles;
  if (spec.use_high) roles.push_back(single ? Role::DiT : Role::DiTHigh);
  if (spec.use_low) roles.push_back(Role::DiTLow);
  return roles;
}

class GpuDenoiser : public Denoiser {
 public:
  GpuDenoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec, int device) : spec_(spec) {
    CUDA_CHECK(cudaSetDevice(device));
    std::vector<std::unique_ptr<WeightStore>> stores;
    std::vector<cuda::DiTWeightSource> sources;
    for (Role r : expert_roles(ckpt, spec)) {
      stores.push_back(open_weights(ckpt, r));
      WeightStore* ws = stores.back().get();
      sources.push_back(cuda::DiTWeightSource::from([ws](const std::string& name) { return ws->get_f32(name); }));
    }
    cuda::DiTGpu::Options opt;
    opt.device = device;
    opt.verbose = spec.verbose;
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

 private:
  DenoiserSpec spec_;
  std::unique_ptr<cuda::DiTGpu> dit_;
  int high_index_ = -1, low_index_ = -1;
  std::vector<float> xb_;
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
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  WAN_CHECK(plan.total_bytes() <= free_b, "--device ", spec.device, ": the DiT needs ",
            plan.total_bytes() >> 20, " MiB (", experts, " expert(s) of ", plan.weight_bytes >> 20,
            " MiB + activations ", plan.arena_bytes >> 20, " MiB) but only ", free_b >> 20, " MiB are free");
}

std::unique_ptr<Denoiser> make_gpu_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec, int device) {
  check_gpu_denoiser_impl(ckpt, spec, device);
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
