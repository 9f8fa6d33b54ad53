// The Wan 2.1 / 2.2 VAE encoder on the GPU (see vae_gpu_encoder.h; weights packed by
// vae_gpu_weights.cpp, shared blocks, arena and passes in vae_gpu_engine.cpp): the encoder's chunk
// schedule. Chunk 0 is pixel frame 0, chunk i > 0 frames 1 + 4(i - 1) .. 4i: the patchified frames
// into conv1's staging, the down stages (Wan 2.2: each stage's input kept for its AvgDown3D shortcut),
// the middle block, the head, then conv1 (1×1×1), the mean half and its normalisation in fp32 straight
// into the chunk's latent frame (a 1×1×1 conv per frame equals the reference's conv over all frames).
// Down-sampling: ZeroPad(0, 1, 0, 1) + stride-2 3×3 conv as a stride-2 4×4 conv (vae_gpu_weights.h);
// downsample3d keeps its input's last frame in a 1-frame slot: the first chunk passes through, later
// chunks run the stride-2 time_conv over [kept frame, chunk] (a 3-D cuDNN conv on a plain stream in S).
#include "models/vae/vae_gpu_encoder.h"

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "models/vae/vae_gpu_engine.h"

namespace wan::cuda {

using vae_gpu_detail::ConvShape;
using vae_gpu_detail::DevStage;
using vae_gpu_detail::kH0;
using vae_gpu_detail::kS;
using vae_gpu_detail::Pending;
using vae_gpu_detail::Slot;

struct VaeEncoderGpu::Impl : vae_gpu_detail::Engine {
  explicit Impl(const VaeGpuOptions& o) : Engine(o) {}

  Pending downsample(const DevStage& st, const Pending& P) {
    if (st.mode == VaeResampleMode::None) return P;
    const int64_t T = P.T, H = P.H / 2, W = P.W / 2, C = P.C, HW = H * W;
    const bf16* in = materialize(P).a;
    bf16* out = buf(kH0, T * HW * C * 2);
    ConvShape s;
    s.n = T;
    s.h = P.H;
    s.w = P.W;
    s.c = C;
    s.k = st.rs.cout;
    s.kh = s.kw = 4;
    s.ph = s.pw = 1;
    s.ss = 2;
    run_conv(st.rs, s, in, out);
    const Pending D{out, wp<float>(st.rs.b), nullptr, nullptr, T, H, W, C};
    if (st.mode == VaeResampleMode::Downsample2d) return D;

    const size_t frame = static_cast<size_t>(HW * C);
    Slot& slot = next_slot(frame * 2);
    bf16* kept = slot_ptr(slot);
    if (!slot.seen) {  // first chunk: no time_conv; keep the last frame
      slot.seen = true;
      const Pending X = materialize(D);
      copy_async(kept, X.a + (T - 1) * frame, frame * 2);
      return X;
    }
    // The time stream [kept, chunk frames] in S, then the stride-2 (3, 1, 1) conv without padding.
    bf16* S = buf(kS, (T + 1) * frame * 2);
    copy_async(S, kept, frame * 2);
    fuse(D, nullptr, StageDst{S, StageDst::Plain, static_cast<int32_t>(T), 1}, NormMode::Copy, 0, false);
    ConvShape t;
    t.is3d = true;
    t.d = T + 1;
    t.h = H;
    t.w = W;
    t.c = C;
    t.k = st.tc.cout_pad;
    t.kt = 3;
    t.st = 2;
    const int64_t To = t.out_frames();
    bf16* o = buf(kH0, To * frame * 2);
    run_conv(st.tc, t, S, o);
    copy_async(kept, S + T * frame, frame * 2);
    return Pending{o, wp<float>(st.tc.b), nullptr, nullptr, To, H, W, C};
  }

  // Chunk i of the video (F frames) -> latent frame i of Tl.
  void chunk(int64_t i, const float* video, int64_t F, float* latents, int64_t Tl) {
    slot_i = 0;
    const int64_t n = i == 0 ? 1 : tf, f0 = i == 0 ? 0 : 1 + tf * (i - 1);
    const int64_t Hp = sf * shape.height, Wp = sf * shape.width;  // pixels
    const int64_t H = Hp / net.patch, W = Wp / net.patch, HW = H * W;
    bf16* h0 = buf(kH0, n * HW * net.conv1.cout * 2);
    causal_conv(net.conv1, next_slot(2 * HW * net.in_pad * 2), n, H, W,
                [&](StageDst d) {
                  if (!running()) return;
                  Scope s(this, "video in");
                  vae_video_in(video, F, f0, n, Hp, Wp, net.patch, net.in_pad, d, stream);
                },
                h0);
    Pending P{h0, wp<float>(net.conv1.b), nullptr, nullptr, n, H, W, net.conv1.cout};
    for (const DevStage& st : net.stages) {
      Pending in;
      if (st.shortcut) P = in = stage_input(P);
      for (const auto& b : st.res) P = resblock(b, P);
      P = downsample(st, P);
      if (st.shortcut) P = add_shortcut(st, VaeShortcut::AvgDown, P, in, 0);
    }
    P = resblock(net.mid0, P);
    P = attention(net.mid1, P);
    P = resblock(net.mid2, P);
    WAN_ASSERT(P.T == 1 && P.H == shape.height && P.W == shape.width, "vae encoder: chunk ", i, " ends as ", P.T,
               " frames of ", P.H, "x", P.W);
    bf16* o = buf(kH0, P.H * P.W * net.head.cout_pad * 2);
    causal_conv(net.head, next_slot(2 * P.H * P.W * P.C * 2), 1, P.H, P.W,
                [&](StageDst d) { fuse(P, nullptr, d, NormMode::RmsSilu, net.head_g, true); }, o);
    if (running()) {
      Scope s(this, "latent out");
      vae_latent_out(o, wp<float>(net.head.b), net.z, wp<float>(net.top_w), wp<float>(net.top_b), wp<float>(net.mean),
                     wp<float>(net.inv_std), latents, Tl, i, P.H * P.W, stream);
    }
  }

  void dry_chunks() override {
    chunk(0, nullptr, 1 + tf, nullptr, 2);
    chunk(1, nullptr, 1 + tf, nullptr, 2);
  }
};

VaeEncoderGpu::VaeEncoderGpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VaeEncoderGpu::~VaeEncoderGpu() = default;

namespace {
constexpr const char* kWhat = "GPU VAE encoder";
}  // namespace

size_t VaeEncoderGpu::device_bytes(const VaeConfig& config, VaeGpuShape shape, const VaeGpuOptions& options) {
  return vae_gpu_detail::planned_device_bytes<Impl>(vae_gpu_detail::pack_encoder, kWhat, config, shape, options);
}

std::unique_ptr<VaeEncoderGpu> VaeEncoderGpu::create(const VaeConfig& config, const VaeWeights& weights,
                                                     VaeGpuShape shape, const VaeGpuOptions& options) {
  auto impl = vae_gpu_detail::created<Impl>(vae_gpu_detail::pack_encoder, kWhat, config, weights, shape, options);
  return std::unique_ptr<VaeEncoderGpu>(new VaeEncoderGpu(std::move(impl)));
}

void VaeEncoderGpu::encode(const float* video, int64_t F, float* latents, cudaStream_t stream) {
  Impl& m = *impl_;
  WAN_CHECK(F >= 1 && (F - 1) % m.tf == 0, "GPU VAE encoder: ", F, " frames; the VAE takes 1 + ", m.tf, "k frames");
  WAN_CHECK(video && latents, "GPU VAE encoder: null video or latents");
  m.start_run(stream);
  const int64_t Tl = latent_frames(F);
  for (int64_t i = 0; i < Tl; ++i) m.chunk(i, video, F, latents, Tl);
  m.finish_run();
}

Tensor VaeEncoderGpu::encode(const Tensor& video) {
  const Impl& m = *impl_;
  const int64_t H = m.sf * m.shape.height, W = m.sf * m.shape.width;
  WAN_CHECK(video.ndim() == 4 && video.dim(0) == 3 && video.dim(1) >= 1 && video.dim(2) == H && video.dim(3) == W,
            "GPU VAE encoder: video ", video.shape().str(), " is not [3, F, ", H, ", ", W, "]");
  WAN_CHECK(dtype_is_float(video.dtype()), "GPU VAE encoder: video must be floating point");
  const int64_t F = video.dim(1);
  WAN_CHECK((F - 1) % m.tf == 0, "GPU VAE encoder: ", F, " frames; the VAE takes 1 + ", m.tf, "k frames");
  Tensor out = Tensor::empty(DType::F32, {m.net.z, latent_frames(F), m.shape.height, m.shape.width});
  vae_gpu_detail::run_on_host(video, out, [&](const float* dv, float* dz) { encode(dv, F, dz, nullptr); });
  return out;
}

int64_t VaeEncoderGpu::latent_frames(int64_t F) const { return F < 1 ? 0 : 1 + (F - 1) / impl_->tf; }
int64_t VaeEncoderGpu::z_dim() const { return impl_->net.z; }
int VaeEncoderGpu::spatial_factor() const { return impl_->sf; }
size_t VaeEncoderGpu::weight_bytes() const { return impl_->weights_bytes; }
size_t VaeEncoderGpu::arena_bytes() const { return impl_->arena_size; }
std::string VaeEncoderGpu::plan_str() const { return impl_->plan_str(kWhat); }
std::string VaeEncoderGpu::profile_report() const { return impl_->last_profile; }
std::string VaeEncoderGpu::find_report() const { return impl_->conv->find_report(); }
float VaeEncoderGpu::self_check_max_err() const { return impl_->check_err; }
int64_t VaeEncoderGpu::conv_calls_checked() const { return impl_->checked_calls; }
int64_t VaeEncoderGpu::self_check_nonfinite() const { return impl_->check_nonfinite; }

}  // namespace wan::cuda
