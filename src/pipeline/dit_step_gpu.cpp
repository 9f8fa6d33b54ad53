// See dit_step_gpu.h. Compiled only in CUDA builds.
#ifdef WAN_HAVE_CUDA
#include "pipeline/dit_step_gpu.h"

#include "core/error.h"
#include "kernels/check.h"

namespace wan {

namespace {

cuda::DiTInputs inputs(const float* x, const float* t, const Tensor& ctx, const std::vector<int64_t>& lens) {
  cuda::DiTInputs in;
  in.x = x;
  in.t = t;
  in.context = ctx.f32();
  in.context_dtype = DType::F32;
  in.ctx_rows = ctx.dim(1);
  in.ctx_lens = lens.data();
  return in;
}

}  // namespace

void dit_forward_host(cuda::DiTGpu& dit, int expert, const Tensor& x, int batch, float t, const Tensor& ctx,
                      const std::vector<int64_t>& lens, float* out, cudaStream_t stream) {
  WAN_ASSERT(batch == 1 || batch == 2, "forward: batch ", batch);
  const float tt[2] = {t, t};
  dit.forward(expert, cuda::DiTShape{batch, x.dim(1), x.dim(2), x.dim(3), /*one_latent=*/true},
              inputs(x.f32(), tt, ctx, lens), out, stream);
}

void FusedDiTStep::begin(Sampler& s, const Tensor& x, const DiTConfig& c, int device, cudaStream_t stream) {
  WAN_ASSERT(x.dtype() == DType::F32 && x.ndim() == 4, "sampling latent ", x.shape().str());
  WAN_CHECK(x.dim(0) == c.in_dim && c.out_dim == c.in_dim, "GPU sampling: a latent of ", x.dim(0),
            " channels for a DiT of in_dim ", c.in_dim, " and out_dim ", c.out_dim);
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
  const float t = static_cast<float>(s.timestep());
  const float tt[2] = {t, t};
  const Shape& ls = latent_shape_;
  // x: [n] on the device, the one latent of cond and uncond.
  dit.forward(expert, cuda::DiTShape{batch, ls[1], ls[2], ls[3], /*one_latent=*/true},
              inputs(samp_->x(), tt, ctx, lens), out_.get(), stream);
  const StepCoeffs k = s.take_step();
  samp_->step(k, out_.get(), batch == 2 ? out_.get() + samp_->numel() : nullptr, guide, stream);
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
