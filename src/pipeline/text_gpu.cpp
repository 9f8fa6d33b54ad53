// The GPU parts of the pipeline outside the DiT (see models.h): the UMT5 text encoder on the GPU
// (wan::cuda::T5EncoderGpu, bf16) with its tokenizer, its memory check, the device-memory probe of the
// timing report, and the GPU VAE decode with that probe (planned ahead on any thread; streamed out as
// uint8 frames chunk by chunk, or decoded in spatial tiles). Compiled only in CUDA builds (the stubs of a
// CPU-only build are in models.cpp).
#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <future>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/rng.h"
#include "kernels/vae_kernels.h"
#include "models/umt5/umt5_gpu.h"
#include "models/vae/vae_gpu.h"
#include "pipeline/denoiser.h"
#include "pipeline/models.h"

namespace wan {

namespace {

class GpuT5 : public GpuTextEncoder {
 public:
  GpuT5(const CheckpointInfo& info, const T5Config& c, bool random, uint64_t seed, PromptTokenizer tokens, int device,
        cuda::DeviceLoader* loader, int group)
      : tokens_(std::move(tokens)), device_(device) {
    CUDA_CHECK(cudaSetDevice(device));
    cuda::T5WeightSource src;
    if (random) {
      src.random = true;
      src.seed = seed;
    } else {
      // Streamed from the file (tensors without a byte range: as stored, converted per tensor). The
      // store stays open while a deferred load (loader) may still call the getter.
      WAN_WITH_CONTEXT("loading the text encoder", store_ = open_weights(info, Role::TextEncoder));
      WeightStore* ws = store_.get();
      src.get = [ws](const std::string& name) { return ws->get(name); };
      src.span = [ws](const std::string& name) { return ws->raw_span(name); };
      src.loader = loader;
      src.group = group;
    }
    WAN_WITH_CONTEXT("loading the text encoder on the GPU", t5_ = std::make_unique<cuda::T5EncoderGpu>(c, src, device));
  }
  Tensor encode(const std::string& prompt) override { return encode_ids(tokens_.ids(prompt)); }
  void set_tokenizer(PromptTokenizer tokens) override { tokens_ = std::move(tokens); }
  Tensor encode_ids(const std::vector<int32_t>& ids) override {
    CUDA_CHECK(cudaSetDevice(device_));
    return t5_->encode(ids.data(), static_cast<int64_t>(ids.size()));
  }
  size_t device_bytes() const override { return t5_->weight_bytes(); }

 private:
  PromptTokenizer tokens_;
  int device_;
  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<cuda::T5EncoderGpu> t5_;
};

}  // namespace

std::unique_ptr<GpuTextEncoder> make_gpu_text_encoder(const CheckpointInfo& info, const T5Config& c, bool random,
                                                      uint64_t t5_seed, PromptTokenizer tokens, int device,
                                                      cuda::DeviceLoader* loader, int loader_group) {
  return std::make_unique<GpuT5>(info, c, random, t5_seed, std::move(tokens), device, loader, loader_group);
}

size_t gpu_text_encoder_bytes(const T5Config& c) { return cuda::T5EncoderGpu::device_bytes(c); }

size_t gpu_free_bytes(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

int64_t gpu_memory_in_use(int device) {
  if (device < 0 || device >= cuda::device_count()) return 0;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
  size_t free_b = 0, total_b = 0;
  int64_t used = 0;
  if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    used = static_cast<int64_t>(total_b - free_b);
  cudaGetLastError();
  cudaSetDevice(prev);
  return used;
}

std::future<void> gpu_prewarm(int device) {
  return std::async(std::launch::async, [device] {
    if (cudaSetDevice(device) == cudaSuccess) cudaFree(nullptr);  // creates the context
    cudaGetLastError();
  });
}

namespace {

// Device buffers and streams of one streamed decode, released (after the stream drains) on every path.
struct StreamedDecodeResources {
  float* latents = nullptr;
  float* video = nullptr;
  uint8_t* rgb = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;
  ~StreamedDecodeResources() {
    if (stream) cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
    cudaFree(rgb);
    cudaFree(video);
    cudaFree(latents);
    cudaGetLastError();
  }
};

class PlannedVaeDecoder : public GpuVaeDecoder {
 public:
  PlannedVaeDecoder(const VaeConfig& vae, const VaeWeights& w, int64_t h, int64_t wd, int device)
      : device_(device), h_(h), w_(wd) {
    CUDA_CHECK(cudaSetDevice(device));
    dec_ = cuda::VaeDecoderGpu::plan(vae, w, cuda::VaeGpuShape{h, wd});
  }

  Tensor decode(const Tensor& latents, int64_t* in_use_peak, uint8_t* rgb,
                const std::function<void(int)>& ready) override {
    CUDA_CHECK(cudaSetDevice(device_));
    if (!dec_->allocated()) dec_->allocate();
    int64_t peak = gpu_memory_in_use(device_);
    Tensor video;
    if (rgb)
      decode_streamed(latents, rgb, ready, peak);
    else
      video = dec_->decode(latents, /*clamp=*/true);
    peak = std::max(peak, gpu_memory_in_use(device_));
    if (in_use_peak) *in_use_peak = std::max(*in_use_peak, peak);
    return video;
  }

 private:
  // Every chunk's frames are quantised on the device behind it and copied out as soon as its event
  // fires, while the device already works on the next chunks: the host gets the video in pieces.
  void decode_streamed(const Tensor& latents, uint8_t* rgb, const std::function<void(int)>& ready, int64_t& peak) {
    WAN_CHECK(latents.ndim() == 4 && latents.dim(0) == dec_->z_dim() && latents.dim(1) >= 1 &&
                  latents.dim(2) == h_ && latents.dim(3) == w_,
              "GPU VAE decoder: latents ", latents.shape().str(), " are not [", dec_->z_dim(), ", T, ", h_, ", ", w_,
              "]");
    const Tensor z = latents.to_f32();
    const int64_t T = z.dim(1), F = dec_->frames_out(T), sf = dec_->spatial_factor();
    const int64_t HW = sf * z.dim(2) * sf * z.dim(3);
    StreamedDecodeResources r;
    CUDA_CHECK(cudaMalloc(&r.latents, z.nbytes()));
    CUDA_CHECK(cudaMalloc(&r.video, size_t(3 * F * HW) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&r.rgb, size_t(F * HW * 3)));
    CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMemcpy(r.latents, z.f32(), z.nbytes(), cudaMemcpyHostToDevice));
    std::vector<std::pair<int64_t, int64_t>> chunks;
    dec_->decode(r.latents, T, r.video, /*clamp=*/true, r.stream, [&](int64_t f0, int64_t f1) {
      cuda::vae_video_rgb8(r.video, F, HW, f0, f1, r.rgb + f0 * HW * 3, r.stream);
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      r.events.push_back(e);
      CUDA_CHECK(cudaEventRecord(e, r.stream));
      chunks.emplace_back(f0, f1);
    });
    peak = std::max(peak, gpu_memory_in_use(device_));
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto [f0, f1] = chunks[i];
      CUDA_CHECK(cudaEventSynchronize(r.events[i]));
      const size_t off = size_t(f0 * HW * 3);
      // Pageable destination: a plain copy, ordered after the event, not after the decode's later work.
      CUDA_CHECK(cudaMemcpy(rgb + off, r.rgb + off, size_t((f1 - f0) * HW * 3), cudaMemcpyDeviceToHost));
      ready(static_cast<int>(f1));
    }
  }

  int device_;
  int64_t h_, w_;
  std::unique_ptr<cuda::VaeDecoderGpu> dec_;
};

// One decoder planned for the tile; the video is blended on the host (VaeDecoderGpu::decode_tiled).
class TiledVaeDecoder : public GpuVaeDecoder {
 public:
  TiledVaeDecoder(const VaeConfig& vae, const VaeWeights& w, int64_t h, int64_t wd, int device, const VaeTiling& t)
      : device_(device), tiling_(t) {
    CUDA_CHECK(cudaSetDevice(device));
    const auto [th, tw] = vae_tile_size(h, wd, t);
    dec_ = cuda::VaeDecoderGpu::plan(vae, w, cuda::VaeGpuShape{th, tw});
  }

  Tensor decode(const Tensor& latents, int64_t* in_use_peak, uint8_t* rgb,
                const std::function<void(int)>& ready) override {
    WAN_ASSERT(rgb == nullptr, "a tiled GPU VAE decode does not stream its frames");
    CUDA_CHECK(cudaSetDevice(device_));
    if (!dec_->allocated()) dec_->allocate();
    int64_t peak = gpu_memory_in_use(device_);
    const int64_t T = latents.dim(1);
    Tensor video = dec_->decode_tiled(latents, tiling_, /*clamp=*/true, [&](int64_t tiles) {
      peak = std::max(peak, gpu_memory_in_use(device_));
      if (ready) ready(static_cast<int>(tiles * T));
    });
    if (in_use_peak) *in_use_peak = std::max(*in_use_peak, peak);
    return video;
  }

 private:
  int device_;
  VaeTiling tiling_;
  std::unique_ptr<cuda::VaeDecoderGpu> dec_;
};

}  // namespace

std::unique_ptr<GpuVaeDecoder> plan_gpu_vae_decoder(const VaeConfig& vae, const VaeWeights& w, int64_t latent_h,
                                                    int64_t latent_w, int device, const VaeTiling& tiling) {
  if (vae_tile_count(latent_h, latent_w, tiling) > 1)
    return std::make_unique<TiledVaeDecoder>(vae, w, latent_h, latent_w, device, tiling);
  return std::make_unique<PlannedVaeDecoder>(vae, w, latent_h, latent_w, device);
}

Tensor gpu_vae_decode_tracked(const VaeConfig& vae, const VaeWeights& w, const Tensor& latents, int device,
                              int64_t* in_use_peak) {
  return plan_gpu_vae_decoder(vae, w, latents.dim(2), latents.dim(3), device)->decode(latents, in_use_peak, nullptr, {});
}

}  // namespace wan
#endif  // WAN_HAVE_CUDA
