// The VAE stages: load (or draw) the VAE weights, then decode the latents on the GPU or the CPU, timed as
// the LoadVae and Decode stages and cancellable between latent frames; and the image encode of I2V /
// TI2V (the EncodeImage stage), whose weights the decode then reuses.
#include <algorithm>
#include <functional>

#include "pipeline/conditioning.h"
#include "pipeline/denoiser.h"
#include "pipeline/host_memory.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_internal.h"

namespace wan {

using pipeline_detail::check_cancel;
using pipeline_detail::StageTimer;

namespace pipeline_detail {

Tensor decode_with(const std::function<VaeWeights()>& load, const VaeConfig& vae, const Tensor& latents,
                   const RunHooks& hooks, Timings* timings, const std::string& device, int64_t* peak_device_bytes) {
  WAN_CHECK(latents.ndim() == 4 && latents.dim(0) == vae.z_dim, "latents of shape ", latents.shape().str(),
            " do not fit the VAE (", vae.z_dim, " channels)");
  const int gpu = parse_device(device);
  if (gpu >= 0) check_gpu_vae(vae, device);
  VaeWeights w;
  {
    StageTimer st(hooks, Stage::LoadVae);
    w = load();
    double s = st.end();
    if (timings) timings->load_vae += s;
  }
  const int chunks = static_cast<int>(latents.dim(1));  // the decoder runs one latent frame at a time
  if (gpu >= 0) {
    check_cancel(hooks);
    StageTimer st(hooks, Stage::Decode, chunks);
    int64_t peak = 0;
    Tensor video = gpu_vae_decode_tracked(vae, w, latents, gpu, &peak);
    if (peak_device_bytes) *peak_device_bytes = std::max(*peak_device_bytes, peak);
    st.advance(chunks);
    double s = st.end();
    if (timings) timings->vae_decode += s;
    return video;
  }
  StageTimer st(hooks, Stage::Decode, chunks);
  Tensor video = vae_decode(vae, w, latents, /*clamp=*/true, [&](int done, int) {
    st.advance(done);
    check_cancel(hooks);
  });
  double s = st.end();
  if (timings) timings->vae_decode += s;
  return video;
}

LatentCondition encode_condition(const GeneratePlan& p, const RunHooks& hooks, VaeWeights* weights, Timings* timings) {
  WAN_ASSERT(p.image.defined(), "encode_condition without an image");
  const int gpu = parse_device(p.device);
  if (!weights->encoder.conv1.present()) {
    StageTimer st(hooks, Stage::LoadVae);
    *weights = p.random_weights ? random_vae_weights(p.vae, random_vae_seed(p.weights_seed)) : load_vae(p.ckpt, p.vae);
    timings->load_vae += st.end();
  }
  StageTimer st(hooks, Stage::EncodeImage);
  const LatentCondition c = build_condition(p.task, p.image, p.last_image, p.frames, [&](const Tensor& video) {
    if (gpu >= 0) return gpu_vae_encode(p.vae, *weights, video, gpu);
    return vae_encode(p.vae, *weights, video, [&](int, int) { check_cancel(hooks); });
  });
  timings->image_encode += st.end();
  return c;
}

}  // namespace pipeline_detail

Tensor decode_latents(const CheckpointInfo& ckpt, const VaeConfig& vae, const Tensor& latents, const RunHooks& hooks,
                      Timings* timings, const std::string& device, int64_t* peak_device_bytes) {
  if (parse_device(device) >= 0) check_gpu_vae(vae, device);
  check_decode_memory(vae, latents.shape(), device);  // before the VAE loads
  return pipeline_detail::decode_with([&] { return load_vae(ckpt, vae); }, vae, latents, hooks, timings, device, peak_device_bytes);
}

}  // namespace wan
