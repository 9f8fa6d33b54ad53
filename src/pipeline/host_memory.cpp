// Memory plans of the commands (see host_memory.h).
#include "pipeline/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "models/dit/dit_cpu.h"
#include "models/vae/vae_cpu.h"
#include "pipeline/denoiser.h"
#include "pipeline/models.h"
#include "runtime/memory_plan.h"

namespace wan {

namespace {

int64_t clamp_bytes(double b) { return b > 9e18 ? INT64_MAX : static_cast<int64_t>(b); }

// f32 video [3, F, H, W] and its frame-major twin, as both decoders hand it to the writer.
double video_bytes(const VaeConfig& vae, int64_t t, int64_t h, int64_t w) {
  const double F = 1.0 + vae_temporal_factor(vae) * static_cast<double>(t - 1), sf = vae_spatial_factor(vae);
  return 2.0 * F * 3.0 * static_cast<double>(h) * sf * static_cast<double>(w) * sf * 4.0;
}

// Host bytes of a generate run's activations and outputs at `t` latent frames.
int64_t generate_activation_bytes(const GeneratePlan& p, bool on_gpu, bool decode, int64_t t) {
  const DiTConfig& d = p.ckpt.dit;
  const int64_t h = p.latent_shape[2], w = p.latent_shape[3];
  const int64_t lat = p.latent_shape[0] * t * h * w;
  const int64_t seq = t * (h / d.patch[1]) * (w / d.patch[2]);
  const double dit = on_gpu ? 0.0 : static_cast<double>(dit_forward_bytes(d, 2, seq, 1, 2 * lat));
  double dec = 0;
  if (decode) dec = on_gpu ? video_bytes(p.vae, t, h, w) : static_cast<double>(vae_decode_bytes(p.vae, t, h, w));
  return clamp_bytes(std::max(dit, dec) + 8.0 * static_cast<double>(lat) * 4.0);  // + the sampler's latents
}

void refuse(const std::string& request, int64_t weights, int64_t acts, int64_t phys, const std::string& fits) {
  WAN_THROW(request, " needs ", human_bytes(weights + std::min<int64_t>(acts, INT64_MAX - weights)),
            " of host memory (weights ", human_bytes(weights), " + activations and video ", human_bytes(acts),
            ") but this machine has ", human_bytes(phys), fits.empty() ? "" : "; ", fits);
}

}  // namespace

std::string human_bytes(int64_t b) {
  char buf[32];
  const double v = static_cast<double>(b);
  if (v >= 1e9) snprintf(buf, sizeof buf, "%.1f GB", v / 1e9);
  else if (v >= 1e6) snprintf(buf, sizeof buf, "%.1f MB", v / 1e6);
  else snprintf(buf, sizeof buf, "%.1f kB", v / 1e3);
  return buf;
}

int64_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  int64_t bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  const auto cap = [&bytes](long long v) {
    if (v > 0) bytes = bytes > 0 ? std::min<int64_t>(bytes, v) : v;
  };
  // A container's limit (cgroup v2 memory.max, "max" when none) is what the run really has.
  if (FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r")) {
    long long v = 0;
    if (std::fscanf(f, "%lld", &v) == 1) cap(v);
    std::fclose(f);
  }
  // WAN_HOST_MEMORY=BYTES plans as if the machine had that much (a share of a shared machine).
  if (const char* e = std::getenv("WAN_HOST_MEMORY")) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    WAN_CHECK(end && *end == 0 && v > 0, "WAN_HOST_MEMORY=", e, ": expected a number of bytes");
    cap(v);
  }
  return bytes;
}

void check_generate_host_memory(const GeneratePlan& p, bool on_gpu, bool decode) {
  const int64_t phys = physical_memory_bytes();
  if (phys == 0) return;
  const int64_t weights = on_gpu ? p.host_weights_bytes : p.weights_peak_bytes;
  const int64_t T = p.latent_shape[1];
  const int64_t acts = generate_activation_bytes(p, on_gpu, decode, T);
  if (weights < phys && acts <= phys - weights) return;
  const int64_t fit = weights >= phys ? 0 : largest_fitting(T - 1, [&](int64_t t) {
    return generate_activation_bytes(p, on_gpu, decode, t) <= phys - weights;
  });
  std::string fits = fit >= 1 ? cat("at most ", (fit - 1) * vae_temporal_factor(p.vae) + 1, " frames fit at ", p.width,
                                    "x", p.height)
                     : weights >= phys ? std::string("the weights alone do not fit")
                                       : std::string("not even 1 frame fits at this size");
  if (!on_gpu && p.random_weights) fits += " (random weights are drawn at the full size; use --device cuda)";
  refuse(cat("the run (", p.width, "x", p.height, ", ", p.frames, " frames)"), weights, acts, phys, fits);
}

void check_decode_memory(const VaeConfig& vae, const Shape& latents, const std::string& device) {
  WAN_CHECK(latents.ndim == 4, "latents of shape ", latents.str(), " are not [z, T, h, w]");
  const int64_t T = latents[1], h = latents[2], w = latents[3];
  const bool on_gpu = parse_device(device) >= 0;
  const int sf = vae_spatial_factor(vae);
  const std::string request = cat("decoding ", latents.str(), " latents (", 1 + vae_temporal_factor(vae) * (T - 1),
                                  " frames at ", w * sf, "x", h * sf, ")");
  const int64_t phys = physical_memory_bytes();
  if (phys > 0) {
    const int64_t weights = vae_f32_bytes(vae);
    const int64_t acts =
        clamp_bytes(on_gpu ? video_bytes(vae, T, h, w) : static_cast<double>(vae_decode_bytes(vae, T, h, w)));
    if (weights >= phys || acts > phys - weights)
      refuse(request, weights, acts, phys,
             on_gpu ? "fewer latent frames fit" : "a smaller frame size fits (the decoder's memory scales with it)");
  }
  if (on_gpu) {
    RunMemoryPlan run;
    run.request = request;
    run.add(device, "VAE decoder (weights + activations)", gpu_vae_decoder_bytes(vae, latents, device),
            stage_bit(RunStage::Decode));
    run.what_fits = [](const std::string&, RunStage, size_t) {
      return std::string("the decoder's activations scale with the frame size: a smaller one fits");
    };
    run.check(device, gpu_free_bytes(parse_device(device)));
  }
}

void check_text_encoder_memory(const T5Config& c) {
  const int64_t phys = physical_memory_bytes();
  if (phys == 0) return;
  const int64_t weights = t5_f32_bytes(c);
  // 512 tokens: the residual stream, q/k/v/o and the gated FFN's two halves, plus a score row per head.
  const int64_t acts = 4 * 512 * (8 * static_cast<int64_t>(c.dim) + 3 * static_cast<int64_t>(c.dim_ffn) +
                                  static_cast<int64_t>(c.num_heads) * 512);
  if (weights < phys && acts <= phys - weights) return;
  refuse("encoding a prompt on the CPU (float32 text encoder)", weights, acts, phys, "");
}

void check_forward_memory(const DiTConfig& cfg, int64_t t, int64_t h, int64_t w, int64_t out_elems) {
  WAN_CHECK(t <= kDiTRopePositions && h <= kDiTRopePositions && w <= kDiTRopePositions, "a ", t, "x", h, "x", w,
            " token grid exceeds the DiT's RoPE, which covers ", kDiTRopePositions, " positions per axis");
  const int64_t phys = physical_memory_bytes();
  if (phys == 0) return;
  const int64_t weights = dit_f32_bytes(cfg);
  const int64_t acts = static_cast<int64_t>(std::min<size_t>(dit_forward_bytes(cfg, 1, t * h * w, 1, out_elems), INT64_MAX));
  if (weights < phys && acts <= phys - weights) return;
  refuse(cat("a forward of ", t * h * w, " tokens (", cfg.num_layers, " layers)"), weights, acts, phys,
         "fewer frames, a smaller size or --layers fit");
}

}  // namespace wan
