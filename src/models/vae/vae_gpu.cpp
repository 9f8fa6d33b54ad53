// The Wan 2.1 / 2.2 VAE decoder on the GPU (see vae_gpu.h; weights packed by vae_gpu_weights.cpp,
// shared blocks, arena and passes in vae_gpu_engine.cpp): the decoder's chunk schedule. One latent
// frame per chunk: the latent input (un-normalise + conv2 in fp32) into conv1's staging, the middle
// block, the up stages (Wan 2.2: each stage's input kept for its DupUp3D shortcut, whose first chunk
// drops ft - 1 frames like the skipped time_conv), the head and the output (un-patchify for Wan 2.2).
#include "models/vae/vae_gpu.h"

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "models/vae/vae_gpu_engine.h"

namespace wan::cuda {

using vae_gpu_detail::ConvShape;
using vae_gpu_detail::DevStage;
using vae_gpu_detail::kH0;
using vae_gpu_detail::kU;
using vae_gpu_detail::Pending;
using vae_gpu_detail::Slot;

struct VaeDecoderGpu::Impl : vae_gpu_detail::Engine {
  explicit Impl(const VaeGpuOptions& o) : Engine(o) {}
  std::vector<uint8_t> packed;  // the weights' device image between plan() and allocate()
  bool is_allocated = false;

  Pending resample(const DevStage& st, const Pending& P) {
    if (st.mode == VaeResampleMode::None) return P;
    const int64_t T = P.T, H = P.H, W = P.W, C = P.C, HW = H * W;
    const bf16* up_in = nullptr;
    const float* up_bias = nullptr;
    int split = 1;
    if (st.mode == VaeResampleMode::Upsample3d) {
      Slot& slot = next_slot(2 * HW * C * 2);
      if (!slot.seen) {  // "Rep": no time_conv, no frame doubling; the slot stays zero
        slot.seen = true;
        up_in = materialize(P).a;
      } else {
        bf16* tc = buf(kH0, T * HW * 2 * C * 2);
        causal_conv(st.tc, slot, T, H, W, [&](StageDst d) { fuse(P, nullptr, d, NormMode::Copy, 0, false); }, tc);
        up_in = tc;
        up_bias = wp<float>(st.tc.b);
        split = 2;
      }
    } else {
      up_in = materialize(P).a;
    }
    const int64_t T2 = T * split;
    bf16* U = buf(kU, T2 * 4 * HW * C * 2);
    if (running()) {
      Scope s(this, "upsample");
      vae_upsample2x(up_in, up_bias, U, T, H, W, C, split, stream);
    }
    bf16* out = buf(kH0, T2 * 4 * HW * st.rs.cout * 2);
    ConvShape s;
    s.n = T2;
    s.h = 2 * H;
    s.w = 2 * W;
    s.c = C;
    s.k = st.rs.cout;
    s.kh = s.kw = 3;
    s.ph = s.pw = 1;
    run_conv(st.rs, s, U, out);
    return Pending{out, wp<float>(st.rs.b), nullptr, nullptr, T2, 2 * H, 2 * W, st.rs.cout};
  }

  // One latent frame t of Tl -> video frames f0.. (1 for the first chunk, 4 later).
  void chunk(int64_t t, const float* latents, int64_t Tl, float* video, int64_t F, int64_t& f0, bool clamp) {
    slot_i = 0;
    const int64_t h = shape.height, w = shape.width, HW = h * w;
    bf16* h0 = buf(kH0, HW * net.conv1.cout * 2);
    causal_conv(net.conv1, next_slot(2 * HW * net.z * 2), 1, h, w,
                [&](StageDst d) {
                  if (!running()) return;
                  Scope s(this, "latent in");
                  vae_latent_in(latents, net.z, Tl, t, HW, wp<float>(net.inv_std), wp<float>(net.mean),
                                wp<float>(net.top_w), wp<float>(net.top_b), d, stream);
                },
                h0);
    Pending P{h0, wp<float>(net.conv1.b), nullptr, nullptr, 1, h, w, net.conv1.cout};
    P = resblock(net.mid0, P);
    P = attention(net.mid1, P);
    P = resblock(net.mid2, P);
    for (const DevStage& st : net.stages) {
      Pending in;
      if (st.shortcut) P = in = stage_input(P);
      for (const auto& b : st.res) P = resblock(b, P);
      P = resample(st, P);
      if (st.shortcut) P = add_shortcut(st, VaeShortcut::DupUp, P, in, t == 0 ? st.sc_ft - 1 : 0);
    }
    bf16* o = buf(kH0, P.T * P.H * P.W * net.head.cout_pad * 2);
    causal_conv(net.head, next_slot(2 * P.H * P.W * P.C * 2), P.T, P.H, P.W,
                [&](StageDst d) { fuse(P, nullptr, d, NormMode::RmsSilu, net.head_g, true); }, o);
    if (running()) {
      Scope s(this, "video out");
      vae_video_out(o, net.head.cout_pad, wp<float>(net.head.b), P.T, P.H, P.W, net.patch, video, F, f0, clamp, stream);
    }
    f0 += P.T;
  }

  void dry_chunks() override {
    int64_t f0 = 0;
    const int64_t F = 1 + tf;
    chunk(0, nullptr, 2, nullptr, F, f0, true);
    chunk(1, nullptr, 2, nullptr, F, f0, true);
    WAN_ASSERT(f0 == F, "vae decoder: planned chunks produce ", f0, " frames, expected ", F);
  }
};

VaeDecoderGpu::VaeDecoderGpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VaeDecoderGpu::~VaeDecoderGpu() = default;

namespace {
constexpr const char* kWhat = "GPU VAE decoder";
}  // namespace

size_t VaeDecoderGpu::device_bytes(const VaeConfig& config, VaeGpuShape shape, const VaeGpuOptions& options) {
  return vae_gpu_detail::planned_device_bytes<Impl>(vae_gpu_detail::pack_decoder, kWhat, config, shape, options);
}

std::unique_ptr<VaeDecoderGpu> VaeDecoderGpu::create(const VaeConfig& config, const VaeWeights& weights,
                                                     VaeGpuShape shape, const VaeGpuOptions& options) {
  auto dec = plan(config, weights, shape, options);
  dec->allocate();
  return dec;
}

std::unique_ptr<VaeDecoderGpu> VaeDecoderGpu::plan(const VaeConfig& config, const VaeWeights& weights,
                                                   VaeGpuShape shape, const VaeGpuOptions& options) {
  std::vector<uint8_t> image;
  auto impl =
      vae_gpu_detail::planned<Impl>(vae_gpu_detail::pack_decoder, kWhat, config, weights, shape, options, &image);
  impl->packed = std::move(image);
  return std::unique_ptr<VaeDecoderGpu>(new VaeDecoderGpu(std::move(impl)));
}

void VaeDecoderGpu::allocate() {
  Impl& m = *impl_;
  WAN_CHECK(!m.is_allocated, kWhat, ": allocated twice");
  m.allocate(m.packed, kWhat);
  m.is_allocated = true;
  std::vector<uint8_t>().swap(m.packed);  // on the device now
}

bool VaeDecoderGpu::allocated() const { return impl_->is_allocated; }

void VaeDecoderGpu::decode(const float* latents, int64_t T, float* video, bool clamp, cudaStream_t stream,
                           const ChunkFn& chunk_enqueued) {
  Impl& m = *impl_;
  WAN_CHECK(m.is_allocated, "GPU VAE decoder: decode before allocate()");
  WAN_CHECK(T >= 1, "GPU VAE decoder: ", T, " latent frames");
  WAN_CHECK(latents && video, "GPU VAE decoder: null latents or video");
  m.start_run(stream);
  const int64_t F = frames_out(T);
  int64_t f0 = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t from = f0;
    m.chunk(t, latents, T, video, F, f0, clamp);
    if (chunk_enqueued) chunk_enqueued(from, f0);
  }
  WAN_ASSERT(f0 == F, "GPU VAE decoder produced ", f0, " frames, expected ", F);
  m.finish_run();
}

Tensor VaeDecoderGpu::decode(const Tensor& latents, bool clamp) {
  const Impl& m = *impl_;
  WAN_CHECK(latents.ndim() == 4 && latents.dim(0) == m.net.z && latents.dim(1) >= 1 &&
                latents.dim(2) == m.shape.height && latents.dim(3) == m.shape.width,
            "GPU VAE decoder: latents ", latents.shape().str(), " are not [", m.net.z, ", T, ", m.shape.height, ", ",
            m.shape.width, "]");
  const int64_t T = latents.dim(1), H = m.sf * m.shape.height, W = m.sf * m.shape.width;
  Tensor out = Tensor::empty(DType::F32, {3, frames_out(T), H, W});
  vae_gpu_detail::run_on_host(latents, out, [&](const float* dz, float* dv) { decode(dz, T, dv, clamp, nullptr); });
  return out;
}

Tensor VaeDecoderGpu::decode_tiled(const Tensor& latents, const VaeTiling& tiling, bool clamp,
                                  const std::function<void(int64_t)>& tile_done) {
  const Impl& m = *impl_;
  WAN_CHECK(latents.ndim() == 4, "GPU VAE decoder: latents ", latents.shape().str(), " are not [z, T, h, w]");
  const auto [th, tw] = vae_tile_size(latents.dim(2), latents.dim(3), tiling);
  WAN_CHECK(th == m.shape.height && tw == m.shape.width, "GPU VAE decoder: planned for latents ", m.shape.height, "x",
            m.shape.width, ", the tiles of ", latents.dim(2), "x", latents.dim(3), " are ", th, "x", tw);
  int64_t done = 0;
  return vae_tiled_decode(latents, tiling, m.sf, clamp, [&](const Tensor& tile) {
    Tensor v = decode(tile, /*clamp=*/false);
    if (tile_done) tile_done(++done);
    return v;
  });
}

int64_t VaeDecoderGpu::frames_out(int64_t T) const { return T < 1 ? 0 : 1 + impl_->tf * (T - 1); }
int64_t VaeDecoderGpu::z_dim() const { return impl_->net.z; }
int VaeDecoderGpu::spatial_factor() const { return impl_->sf; }
size_t VaeDecoderGpu::weight_bytes() const { return impl_->weights_bytes; }
size_t VaeDecoderGpu::arena_bytes() const { return impl_->arena_size; }
std::string VaeDecoderGpu::plan_str() const { return impl_->plan_str("GPU VAE decoder"); }
std::string VaeDecoderGpu::profile_report() const { return impl_->last_profile; }
std::string VaeDecoderGpu::find_report() const { return impl_->conv->find_report(); }
float VaeDecoderGpu::self_check_max_err() const { return impl_->check_err; }
int64_t VaeDecoderGpu::self_check_nonfinite() const { return impl_->check_nonfinite; }
int64_t VaeDecoderGpu::conv_calls_checked() const { return impl_->checked_calls; }

}  // namespace wan::cuda
