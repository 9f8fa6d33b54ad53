// CPU denoiser and the device-independent parts of the factory; in a CPU-only build, the stubs of the
// GPU entry points (denoiser.h), so the dispatch needs no #ifdef.
#include "pipeline/denoiser.h"

#include <cstring>

#include "models/dit/dit_cpu.h"
#include "pipeline/models.h"
#include "pipeline/pipeline_internal.h"

namespace wan {

void hold_first_frame(Tensor& x, const Tensor& first) {
  WAN_ASSERT(x.dtype() == DType::F32 && first.dtype() == DType::F32 && x.ndim() == 4 && first.ndim() == 4 &&
                 first.dim(0) == x.dim(0) && first.dim(1) == 1 && first.dim(2) == x.dim(2) && first.dim(3) == x.dim(3),
             "hold_first_frame: latent ", x.shape().str(), ", first frame ", first.shape().str());
  // (1 - mask)·z + mask·x with mask 0 on frame 0 and 1 elsewhere is exactly a copy of frame 0.
  const int64_t hw = x.dim(2) * x.dim(3), T = x.dim(1);
  for (int64_t c = 0; c < x.dim(0); ++c)
    std::memcpy(x.f32() + c * T * hw, first.f32() + c * hw, static_cast<size_t>(hw) * 4);
}

void Denoiser::begin_sampling(Sampler& s, const Tensor& x) {
  WAN_ASSERT(x.dtype() == DType::F32 && x.ndim() == 4, "sampling latent ", x.shape().str());
  (void)s.state();  // throws unless s holds its history
  host_x_ = x.clone();
  if (cond_.first_frame.defined()) hold_first_frame(host_x_, cond_.first_frame);
}

void Denoiser::guided_step(Sampler& s, Expert e, float guide, const Tensor& ctx, const std::vector<int64_t>& lens) {
  WAN_ASSERT(host_x_.defined(), "guided_step() before begin_sampling()");
  const int batch = static_cast<int>(ctx.dim(0));
  WAN_ASSERT(batch == 1 || batch == 2, "guided_step: batch ", batch);
  const size_t n = static_cast<size_t>(host_x_.numel());
  host_out_.resize(n * static_cast<size_t>(batch));
  host_v_.resize(n);
  forward(e, host_x_, batch, s.model_timestep(), ctx, lens, host_out_.data());
  if (batch == 2) cfg_combine(host_out_.data(), host_out_.data() + n, guide, host_v_.data(), n);
  else std::memcpy(host_v_.data(), host_out_.data(), n * 4);
  s.step(host_v_.data(), host_x_.f32(), n);
  if (cond_.first_frame.defined()) hold_first_frame(host_x_, cond_.first_frame);
}

Tensor Denoiser::sync_sampling(Sampler& s) {
  (void)s;  // the host path's history is in s already
  WAN_ASSERT(host_x_.defined(), "sync_sampling() before begin_sampling()");
  return host_x_.clone();
}

namespace {

class CpuDenoiser : public Denoiser {
 public:
  CpuDenoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec) : cfg_(ckpt.dit) {
    const bool single = ckpt.has(Role::DiT) && !ckpt.has(Role::DiTHigh);
    if (spec.random_weights) {
      if (spec.use_high) high_ = random_dit_weights(ckpt.dit, spec.seed_high, spec.lora_high);
      if (spec.use_low) low_ = random_dit_weights(ckpt.dit, spec.seed_low, spec.lora_low);
      return;
    }
    if (spec.use_high) high_ = load_dit(ckpt, single ? Role::DiT : Role::DiTHigh, spec.lora_high);
    if (spec.use_low) low_ = load_dit(ckpt, Role::DiTLow, spec.lora_low);
  }
  void forward(Expert e, const Tensor& x, int batch, float t, const Tensor& ctx, const std::vector<int64_t>& lens,
               float* out) override {
    const int64_t n = x.numel();
    // I2V: the condition's channels follow the latent's in every sample.
    const int64_t ny = cond_.y.defined() ? cond_.y.numel() : 0;
    const int64_t cin = x.dim(0) + (ny ? cond_.y.dim(0) : 0);
    Tensor xb = Tensor::empty(DType::F32, Shape{batch, cin, x.dim(1), x.dim(2), x.dim(3)});
    for (int b = 0; b < batch; ++b) {
      std::memcpy(xb.f32() + b * (n + ny), x.f32(), static_cast<size_t>(n) * 4);
      if (ny) std::memcpy(xb.f32() + b * (n + ny) + n, cond_.y.f32(), static_cast<size_t>(ny) * 4);
    }
    Tensor y = dit_forward(cfg_, e == Expert::High ? high_ : low_, xb, timesteps(x, batch, t), ctx, lens);
    WAN_ASSERT(y.numel() == n * batch, "DiT output ", y.shape().str());
    std::memcpy(out, y.f32(), static_cast<size_t>(y.numel()) * 4);
  }

 private:
  // [batch] (one per sample), or with a held first frame [batch, seq_len] per token (official TI2V:
  // the mask subsampled at the patch grid times t, so frame 0's tokens are at 0).
  Tensor timesteps(const Tensor& x, int batch, float t) const {
    if (!cond_.first_frame.defined()) {
      Tensor tt = Tensor::f32(Shape{batch});
      for (int b = 0; b < batch; ++b) tt.f32()[b] = t;
      return tt;
    }
    const int64_t per_frame = (x.dim(2) / cfg_.patch[1]) * (x.dim(3) / cfg_.patch[2]);
    const int64_t seq = (x.dim(1) / cfg_.patch[0]) * per_frame;
    Tensor tt = Tensor::f32(Shape{batch, seq});
    for (int b = 0; b < batch; ++b)
      for (int64_t i = 0; i < seq; ++i) tt.f32()[b * seq + i] = i < per_frame ? 0.0f : t;
    return tt;
  }

  DiTConfig cfg_;
  DiTWeights high_, low_;
};

}  // namespace

int parse_device(const std::string& device) {
  if (device == "cpu") return -1;
  if (device.rfind("cuda", 0) == 0) {
    const std::string rest = device.substr(4);
    if (rest.empty()) return 0;
    if (rest[0] == ':' && rest.size() > 1 && rest.size() < 6 &&
        rest.find_first_not_of("0123456789", 1) == std::string::npos)
      return std::stoi(rest.substr(1));
  }
  WAN_THROW("--device '", device, "' is not cpu, cuda or cuda:<index>");
}

DenoiserSpec pipeline_detail::denoiser_spec(const GeneratePlan& p) {
  DenoiserSpec spec;
  spec.device = p.device;
  spec.use_high = pipeline_detail::uses_expert(p.experts, Expert::High);
  spec.use_low = pipeline_detail::uses_expert(p.experts, Expert::Low);
  spec.latent_shape = p.latent_shape;
  spec.first_frame_t = p.task == Task::TI2V_5B && p.image.defined();
  spec.verbose = p.verbose;
  spec.attention = p.attention;
  spec.gemm = p.gemm;
  spec.random_weights = p.random_weights;
  spec.seed_high = random_expert_seed(p.weights_seed, p.task, true);
  spec.seed_low = random_expert_seed(p.weights_seed, p.task, false);
  spec.dit_plan = p.dit_memory;
  spec.residency = p.residency;
  spec.lora_high = p.lora_high;
  spec.lora_low = p.lora_low;
  return spec;
}

std::unique_ptr<Denoiser> make_denoiser(const CheckpointInfo& ckpt, const DenoiserSpec& spec) {
  const int device = parse_device(spec.device);
  if (device < 0) return std::make_unique<CpuDenoiser>(ckpt, spec);
  return make_gpu_denoiser(ckpt, spec, device);
}

#ifndef WAN_HAVE_CUDA
// A CPU-only build: the GPU entry points (denoiser_gpu.cpp in CUDA builds) refuse.
namespace {
[[noreturn]] void no_cuda(const std::string& device) {
  WAN_THROW("--device ", device, ": this build of wan has no CUDA support (configure with a CUDA toolkit)");
}
}  // namespace

GpuDiTMemory plan_gpu_dit_memory(const CheckpointInfo&, const DenoiserSpec& spec) { no_cuda(spec.device); }
std::unique_ptr<Denoiser> make_gpu_denoiser(const CheckpointInfo&, const DenoiserSpec& spec, int) {
  no_cuda(spec.device);
}
void check_gpu_vae(const VaeConfig&, const std::string& device) { no_cuda(device); }
size_t gpu_vae_decoder_bytes(const VaeConfig&, const Shape&, const std::string& device, bool) {
  no_cuda(device);
  return 0;
}
Tensor gpu_vae_decode(const VaeConfig&, const VaeWeights&, const Tensor&, int device) {
  WAN_THROW("device ", device, ": this build of wan has no CUDA support");
}
size_t gpu_vae_encoder_bytes(const VaeConfig&, const Tensor&, const std::string& device) {
  no_cuda(device);
  return 0;
}
Tensor gpu_vae_encode(const VaeConfig&, const VaeWeights&, const Tensor&, int device) {
  WAN_THROW("device ", device, ": this build of wan has no CUDA support");
}
#endif

}  // namespace wan
