// The VAE stages: load (or draw) the VAE weights, then decode the latents on the GPU or the CPU, timed as
// the LoadVae and Decode stages and cancellable between latent frames; and the image encode of I2V /
// TI2V (the EncodeImage stage), whose weights the decode then reuses.
#include <algorithm>
#include <functional>
#include <vector>

#include "formats/video.h"

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

Tensor decode_with(const std::function<VaeAhead()>& get, const VaeConfig& vae, const Tensor& latents,
                   const RunHooks& hooks, Timings* timings, const std::string& device, int64_t* peak_device_bytes,
                   const VaeTiling& tiling) {
  WAN_CHECK(latents.ndim() == 4 && latents.dim(0) == vae.z_dim, "latents of shape ", latents.shape().str(),
            " do not fit the VAE (", vae.z_dim, " channels)");
  const int gpu = parse_device(device);
  if (gpu >= 0) check_gpu_vae(vae, device);
  VaeAhead ahead;
  {
    StageTimer st(hooks, Stage::LoadVae);
    ahead = get();
    double s = st.end();
    if (timings) timings->load_vae += ahead.read_s >= 0 ? ahead.read_s : s;  // read ahead: its own time
  }
  // The decoder runs one latent frame at a time, per tile.
  const int64_t tiles = vae_tile_count(latents.dim(2), latents.dim(3), tiling);
  const int chunks = static_cast<int>(latents.dim(1) * tiles);
  const int sf = vae_spatial_factor(vae);
  const int F = static_cast<int>(1 + vae_temporal_factor(vae) * (latents.dim(1) - 1));
  const int H = static_cast<int>(sf * latents.dim(2)), W = static_cast<int>(sf * latents.dim(3));
  StageTimer st(hooks, Stage::Decode, chunks);
  auto advance = [&](int done) {
    st.advance(done);
    check_cancel(hooks);
  };
  Tensor video;
  if (gpu >= 0) {
    check_cancel(hooks);
    if (!ahead.decoder)
      ahead.decoder = plan_gpu_vae_decoder(vae, ahead.weights, latents.dim(2), latents.dim(3), gpu, tiling);
    int64_t peak = 0;
    if (hooks.streams_video() && tiles == 1) {  // tiles are blended on the host: streamed below, whole
      uint8_t* rgb = hooks.video_begin(F, H, W);
      int done = 0;
      ahead.decoder->decode(latents, &peak, rgb, [&](int ready) {
        hooks.video_ready(ready);
        advance(++done);
      });
    } else {
      video = ahead.decoder->decode(latents, &peak, nullptr, advance);
      st.advance(chunks);
    }
    if (peak_device_bytes) *peak_device_bytes = std::max(*peak_device_bytes, peak);
  } else {
    video = vae_decode_tiled(vae, ahead.weights, latents, tiling, /*clamp=*/true, [&](int done, int) { advance(done); });
  }
  if (video.defined() && hooks.streams_video()) {
    const std::vector<uint8_t> rgb = video_to_rgb8(video.f32(), F, H, W);
    std::copy(rgb.begin(), rgb.end(), hooks.video_begin(F, H, W));
    hooks.video_ready(F);
    video = Tensor();
  }
  double s = st.end();
  if (timings) timings->vae_decode += s;
  return video;
}

void plan_vae_tiling(const GenerateOptions& o, GeneratePlan& p) {
  p.vae_tile = o.vae_tile;
  p.vae_tiling = {};
  if (o.vae_tile.mode != VaeTileRequest::Fixed || !o.decode) return;
  WAN_CHECK_OPTION("vae-tile", !o.parallel, "{}: one GPU for now (rank 0 decodes untiled)");
  const int sf = vae_spatial_factor(p.vae);
  WAN_CHECK_OPTION("vae-tile", o.vae_tile.width % (4 * sf) == 0 && o.vae_tile.height % (4 * sf) == 0, "{} ",
                   o.vae_tile.width, "x", o.vae_tile.height, ": this VAE's tiles are multiples of ", 4 * sf, " pixels");
  p.vae_tiling = vae_tiling_from_pixels(o.vae_tile.height, o.vae_tile.width, sf);
}

std::string vae_tiling_str(const VaeTiling& t, const VaeConfig& vae, const Shape& latents) {
  const int64_t h = latents[2], w = latents[3], sf = vae_spatial_factor(vae);
  if (vae_tile_count(h, w, t) <= 1) return "untiled";
  const auto [th, tw] = vae_tile_size(h, w, t);
  return cat(vae_tile_count(h, w, t), " tiles of ", sf * tw, "x", sf * th, " pixels, overlap at least ",
             sf * t.overlap_w, "x", sf * t.overlap_h);
}

VaeWeights run_vae_weights(const GeneratePlan& p) {
  return p.random_weights ? random_vae_weights(p.vae, random_vae_seed(p.weights_seed)) : load_vae(p.ckpt, p.vae);
}

LatentCondition encode_condition(const GeneratePlan& p, const RunHooks& hooks, VaeWeights* weights, Timings* timings) {
  WAN_ASSERT(p.image.defined(), "encode_condition without an image");
  const int gpu = parse_device(p.device);
  if (!weights->encoder.conv1.present()) {
    StageTimer st(hooks, Stage::LoadVae);
    *weights = run_vae_weights(p);
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
  return pipeline_detail::decode_with(
      [&] {
        pipeline_detail::VaeAhead a;
        a.weights = load_vae(ckpt, vae);
        return a;
      },
      vae, latents, hooks, timings, device, peak_device_bytes);
}

}  // namespace wan
