// The GPU parts of the pipeline outside the DiT (see models.h): the UMT5 text encoder on the GPU
// (wan::cuda::T5EncoderGpu, bf16) with its tokenizer, its memory check, the device-memory probe of the
// timing report, and the GPU VAE decode with that probe. Compiled only in CUDA builds (the stubs of a
// CPU-only build are in models.cpp).
#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <future>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/rng.h"
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

Tensor gpu_vae_decode_tracked(const VaeConfig& vae, const VaeWeights& w, const Tensor& latents, int device,
                              int64_t* in_use_peak) {
  CUDA_CHECK(cudaSetDevice(device));
  auto dec = cuda::VaeDecoderGpu::create(vae, w, cuda::VaeGpuShape{latents.dim(2), latents.dim(3)});
  int64_t peak = gpu_memory_in_use(device);
  Tensor video = dec->decode(latents, /*clamp=*/true);
  peak = std::max(peak, gpu_memory_in_use(device));
  if (in_use_peak) *in_use_peak = std::max(*in_use_peak, peak);
  return video;
}

}  // namespace wan
#endif  // WAN_HAVE_CUDA
