// See dit_step_gpu.h. Compiled only in CUDA builds.
#ifdef WAN_HAVE_CUDA
#include "pipeline/dit_step_gpu.h"

#include <cstring>

#include "core/error.h"
#include "kernels/check.h"

namespace wan {

namespace {

// TI2V image mode: frame 0's tokens run at timestep 0 (the official mask times t).
constexpr float kZeros[2] = {0.0f, 0.0f};

cuda::DiTInputs inputs(const float* x, const float* t, const Tensor& ctx, const std::vector<int64_t>& lens,
                       bool first_frame_at_zero) {
  cuda::DiTInputs in;
  in.x = x;
  in.t = t;
  if (first_frame_at_zero) in.t_first = kZeros;
  in.context = ctx.f32();
  in.context_dtype = DType::F32;
  in.ctx_rows = ctx.dim(1);
  in.ctx_lens = lens.data();
  return in;
}

// The samplers' forward: one latent for every sample; TI2V image mode: frame 0 at its own timestep.
cuda::DiTShape shape(int batch, const Shape& latent, bool first_frame_t) {
  cuda::DiTShape s{batch, latent[1], latent[2], latent[3], /*one_latent=*/true};
  s.first_frame_t = first_frame_t;
  return s;
}

}  // namespace

void dit_forward_host(cuda::DiTGpu& dit, int expert, const Tensor& x, int batch, float t, const Tensor& ctx,
                      const std::vector<int64_t>& lens, const LatentCondition& cond, float* out, cudaStream_t stream) {
  WAN_ASSERT(batch == 1 || batch == 2, "forward: batch ", batch);
  const float tt[2] = {t, t};
  Tensor xin = x;
  if (cond.y.defined()) {  // [x, y] channels: the DiT's input of one latent
    xin = Tensor::empty(DType::F32, Shape{x.dim(0) + cond.y.dim(0), x.dim(1), x.dim(2), x.dim(3)});
    std::memcpy(xin.f32(), x.f32(), x.nbytes());
    std::memcpy(xin.f32() + x.numel(), cond.y.f32(), cond.y.nbytes());
  }
  dit.forward(expert, shape(batch, x.shape(), cond.first_frame.defined()),
              inputs(xin.f32(), tt, ctx, lens, cond.first_frame.defined()), out, stream);
}

void FusedDiTStep::set_condition(const LatentCondition& c) { cond_ = c; }

void FusedDiTStep::hold_first_frame(cudaStream_t stream) {
  if (!first_) return;
  const Shape& ls = latent_shape_;
  WAN_ASSERT(first_shape_[0] == ls[0] && first_shape_[2] == ls[2] && first_shape_[3] == ls[3],
             "held first frame ", first_shape_.str(), " for latents ", ls.str());
  // Channel c's frame 0 is the first H·W floats of its T·H·W block.
  const size_t hw = static_cast<size_t>(ls[2] * ls[3]) * sizeof(float);
  CUDA_CHECK(cudaMemcpy2DAsync(samp_->x(), hw * static_cast<size_t>(ls[1]), first_.get(), hw, hw,
                               static_cast<size_t>(ls[0]), cudaMemcpyDeviceToDevice, stream));
}

void FusedDiTStep::begin(Sampler& s, const Tensor& x, const DiTConfig& c, int device, cudaStream_t stream) {
  WAN_ASSERT(x.dtype() == DType::F32 && x.ndim() == 4, "sampling latent ", x.shape().str());
  const int64_t y_ch = cond_.y.defined() ? cond_.y.dim(0) : 0;
  WAN_CHECK(x.dim(0) + y_ch == c.in_dim && c.out_dim == x.dim(0), "GPU sampling: a latent of ", x.dim(0),
            " channels (and ", y_ch, " of condition) for a DiT of in_dim ", c.in_dim, " and out_dim ", c.out_dim);
  const SamplerState st = s.state();  // throws unless s holds its history
  const size_t n = static_cast<size_t>(x.numel());
  CUDA_CHECK(cudaSetDevice(device));
  if (!samp_ || samp_->numel() != n || samp_->solver() != s.solver()) {
    samp_.reset();
    out_.reset();
    samp_ = std::make_unique<cuda::SamplerGpu>(s.solver(), n, device);
    float* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, 2 * n * sizeof(float)));
    out_.reset(p);
  }
  samp_->set_x(x.f32(), stream);
  samp_->upload_state(st, stream);
  latent_shape_ = x.shape();
  // The condition, uploaded once per run (synchronously: the host tensors are pageable).
  input_.reset();
  first_.reset();
  auto device_floats = [](size_t count) {
    float* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, count * sizeof(float)));
    return std::unique_ptr<float, CudaFree>(p);
  };
  if (cond_.y.defined()) {  // the DiT input [x, y]: y after x's n floats
    WAN_CHECK(cond_.y.ndim() == 4 && cond_.y.dim(0) + x.dim(0) == c.in_dim && cond_.y.dim(1) == x.dim(1) &&
                  cond_.y.dim(2) == x.dim(2) && cond_.y.dim(3) == x.dim(3),
              "GPU sampling: condition ", cond_.y.shape().str(), " for latents ", x.shape().str(), " and in_dim ", c.in_dim);
    input_ = device_floats(n + static_cast<size_t>(cond_.y.numel()));
    CUDA_CHECK(cudaMemcpyAsync(input_.get() + n, cond_.y.f32(), cond_.y.nbytes(), cudaMemcpyHostToDevice, stream));
  }
  if (cond_.first_frame.defined()) {
    first_ = device_floats(static_cast<size_t>(cond_.first_frame.numel()));
    first_shape_ = cond_.first_frame.shape();
    CUDA_CHECK(cudaMemcpyAsync(first_.get(), cond_.first_frame.f32(), cond_.first_frame.nbytes(),
                               cudaMemcpyHostToDevice, stream));
    hold_first_frame(stream);
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void FusedDiTStep::check_index(const Sampler& s, const char* what) const {
  WAN_ASSERT(samp_ && samp_->index() == s.index(), what, ": the GPU sampler is at step ", samp_ ? samp_->index() : -1,
             ", the sampler at ", s.index());
}

void FusedDiTStep::step(cuda::DiTGpu& dit, int expert, Sampler& s, float guide, const Tensor& ctx,
                        const std::vector<int64_t>& lens, cudaStream_t stream) {
  check_index(s, "guided_step");
  const int batch = static_cast<int>(ctx.dim(0));
  WAN_ASSERT(batch == 1 || batch == 2, "guided_step: batch ", batch);
  const float t = s.model_timestep();
  const float tt[2] = {t, t};
  const Shape& ls = latent_shape_;
  // x: [n] on the device, the one latent of cond and uncond (I2V: copied in front of y).
  const float* xin = samp_->x();
  if (input_) {
    CUDA_CHECK(cudaMemcpyAsync(input_.get(), samp_->x(), samp_->numel() * sizeof(float), cudaMemcpyDeviceToDevice,
                               stream));
    xin = input_.get();
  }
  dit.forward(expert, shape(batch, ls, first_ != nullptr), inputs(xin, tt, ctx, lens, first_ != nullptr), out_.get(),
              stream);
  const StepCoeffs k = s.take_step();
  samp_->step(k, out_.get(), batch == 2 ? out_.get() + samp_->numel() : nullptr, guide, stream);
  hold_first_frame(stream);  // TI2V image mode: frame 0 back to the image's latent
}

Tensor FusedDiTStep::sync(Sampler& s, cudaStream_t stream) {
  check_index(s, "sync_sampling");
  Tensor x = Tensor::empty(DType::F32, latent_shape_);
  samp_->get_x(x.f32(), stream);
  s.set_state(samp_->download_state(stream));
  return x;
}

}  // namespace wan

#endif  // WAN_HAVE_CUDA
