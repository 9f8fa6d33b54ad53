// `wan bench-vae`: decode time and peak device memory of the GPU Wan 2.1 VAE decoder (src/models/vae/vae_gpu.h,
// bf16, causal chunk cache) at the real widths with random weights, for the same-run comparison with the
// official fp32 decode (bench/run_vae_bench.sh runs bench/baselines/diffusers_vae.py next).
//
// What is measured (say it, so numbers are never mistaken for something else):
// - weights: the Wan 2.1 VAE preset (base 96, z 16, dim_mult 1 2 4 4) drawn exactly as `wan make-checkpoint`
//   draws its VAE (vae_weight_table + fill_init, component "vae" of --seed; PyTorch-default-like
//   U(±1/√fan_in)), in memory, no files;
// - input: one latent [16, T, H/8, W/8] f32 ~ N(0, 1) (Philox, --seed + 1) on the device, T = (F - 1)/4 + 1;
// - time: VaeDecoderGpu::decode of the whole latent (un-normalise, conv2, the decoder chunk by chunk,
//   clamp) into a device video [3, F, H, W] f32, bracketed by CUDA events on one stream; median (and min)
//   of --reps after --warmup untimed decodes. The plan (create) is timed separately and not in the median;
// - memory: cudaMemGetInfo's used bytes (total - free) sampled before anything of the bench exists, after
//   create and after every decode (nothing is freed in between, so the largest sample is the peak: the
//   CUDA libraries' handles and workspaces, lazily loaded kernels, the weights, the arena, and the latent
//   and video buffers); peak minus the first sample is reported as the decode's peak, next to the plan
//   (weights + arena) and the latent + video bytes;
// - the video is downloaded once at the end and checked finite and within [-1, 1] (the clamp).
// In a build without CUDA the command parses its options and then fails with one clear error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/bench_common.h"
#include "bench/commands.h"
#include "models/config.h"
#include "core/error.h"
#include "core/philox.h"
#include "models/vae/weights.h"
#include "models/weight_spec.h"
#include "models/vae/vae_cpu.h"

#ifdef WAN_HAVE_CUDA
#include "kernels/check.h"
#include "bench/dit_bench_gpu.h"
#include "kernels/rng.h"
#include "models/vae/vae_gpu.h"
#endif

namespace wan::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

#ifdef WAN_HAVE_CUDA

size_t device_used() {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

// The VAE make-checkpoint writes for --seed (same names, shapes and values), as f32 tensors in memory.
VaeWeights make_checkpoint_vae(const VaeConfig& c, uint64_t seed) {
  const WeightTable ps = vae_weight_table(c);
  std::unordered_map<std::string, const WeightSpec*> by_name;
  for (const WeightSpec& p : ps) by_name.emplace(p.name, &p);
  const uint64_t cs = component_seed(seed, "vae");
  return load_vae_weights(c, [&](const std::string& name) {
    const auto it = by_name.find(name);
    WAN_ASSERT(it != by_name.end(), "bench-vae: no generated tensor ", name);
    Tensor t = Tensor::f32(it->second->shape);
    fill_init(*it->second, cs, DType::F32, t.f32());
    return t;
  });
}
#endif  // WAN_HAVE_CUDA

}  // namespace

const api::CommandSpec& bench_vae_spec() {
  static const api::CommandSpec s = [] {
    using api::Kind;
    using api::Option;
    api::CommandSpec c;
    c.name = "bench-vae";
    c.summary = "time the GPU VAE decode with random weights (s, peak memory)";
    c.usage = {"bench-vae [options]"};
    c.about = "Times the GPU VAE decode (Wan 2.1, bf16, causal chunk cache) with random weights at the real widths.";
    api::Option size = api::option("size", Kind::Size, "", "1280x720", "pixel size (multiples of 8)");
    size.check = [](const std::string& t) {
      const api::Size z = api::parse_size(t);
      return z.width % 8 == 0 && z.height % 8 == 0 ? std::string()
                                                   : cat("{} ", t, ": width and height must be multiples of 8");
    };
    Option frames = bench_int_option("frames", "81", 1, 1e6, "pixel frames, 4n+1");
    frames.check = [](const std::string& f) {
      return (std::stoll(f) - 1) % 4 == 0 ? std::string() : cat("{} ", f, ": must be 4n+1");
    };
    api::Option mode =
        api::option("conv-mode", Kind::Enum, "M", "folded2d", "folded2d | conv3d (see src/models/vae/vae_gpu.h)");
    mode.choices = {"folded2d", "conv3d"};
    c.options = {
        size,
        frames,
        bench_int_option("reps", "3", 1, 1000, "timed decodes (median and min)"),
        bench_int_option("warmup", "1", 0, 100, "untimed decodes first"),
        bench_int_option("seed", "0", 0, 9.2e18, "weight seed as `wan make-checkpoint --seed`; latents use seed + 1"),
        mode,
        bench_device_option(),
        bench_json_option(),
        api::option("verbose", Kind::Flag, "", "", "print the decoder's memory and convolution plan"),
    };
    return c;
  }();
  return s;
}

int cmd_bench_vae(int argc, char** argv) {
  const api::Values args = api::parse_argv(bench_vae_spec(), argc, argv);
  if (args.help()) {
    printf("%s", api::help_text(bench_vae_spec()).c_str());
    return 0;
  }
  const std::string size = args.str("size");
  const auto [w_arg, h_arg] = args.size("size");
  const long long width = w_arg, height = h_arg;
  const long long frames = args.get_int("frames", 81), reps = args.get_int("reps", 3);
  const long long warmup = args.get_int("warmup", 1), seed = args.get_int("seed", 0);
  const long long device = args.device("device");
  const std::string mode = args.str("conv-mode");
  const std::string json_path = args.get_or("json", "");
  const bool verbose = args.flag("verbose");

#ifndef WAN_HAVE_CUDA
  (void)width, (void)height, (void)frames, (void)reps, (void)warmup, (void)seed, (void)device, (void)json_path;
  (void)verbose;
  WAN_THROW("wan bench-vae: this wan was built without CUDA; rebuild with a CUDA toolkit (WAN_ENABLE_CUDA=ON)");
#else
  using namespace wan::cuda;
  WAN_CHECK(cuda::device_count() > 0, "wan bench-vae: no CUDA device is visible");
  const int dev = static_cast<int>(device);
  WAN_CHECK(dev < cuda::device_count(), "--device ", device, ": only ", cuda::device_count(), " device(s)");
  CUDA_CHECK(cudaSetDevice(dev));
  CUDA_CHECK(cudaFree(nullptr));  // the context exists before the first memory sample
  const BenchDevice bd = bench_device(dev);
  const VaeConfig cfg = vae_preset("wan2.1");
  const int64_t T = (frames - 1) / 4 + 1, h = height / 8, w = width / 8, F = 1 + 4 * (T - 1);
  const size_t z_n = static_cast<size_t>(16 * T * h * w), v_n = static_cast<size_t>(3 * F * height * width);

  printf("wan bench-vae: Wan 2.1 VAE decode (bf16, %s), %lldx%lld, %lld frames <- latent [16, %lld, %lld, %lld], "
         "random weights (make-checkpoint seed %lld)\n",
         mode.c_str(), width, height, (long long)F, (long long)T, (long long)h, (long long)w, seed);
  printf("device %d: %s, %d SMs, %.1f GiB; driver %d, runtime %d, cuDNN %d\n", dev, bd.name.c_str(), bd.sm_count,
         bd.total_bytes / kGiB, bd.driver_version, bd.runtime_version, bd.cudnn_version);
  fflush(stdout);

  auto t0 = std::chrono::steady_clock::now();
  const VaeWeights weights = make_checkpoint_vae(cfg, static_cast<uint64_t>(seed));
  const double weights_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> z(z_n);
  philox_normal_fill(static_cast<uint64_t>(seed) + 1, 0, z.data(), z_n);

  CUDA_CHECK(cudaDeviceSynchronize());
  const size_t used0 = device_used();
  size_t peak = used0;
  float *dz = nullptr, *dv = nullptr;
  CUDA_CHECK(cudaMalloc(&dz, z_n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&dv, v_n * sizeof(float)));
  struct Free {
    float *a, *b;
    ~Free() {
      cudaFree(a);
      cudaFree(b);
    }
  } free_bufs{dz, dv};
  CUDA_CHECK(cudaMemcpy(dz, z.data(), z_n * sizeof(float), cudaMemcpyHostToDevice));

  VaeGpuOptions o;
  o.conv_mode = mode == "conv3d" ? VaeConvMode::Conv3d : VaeConvMode::Folded2d;
  t0 = std::chrono::steady_clock::now();
  auto dec = VaeDecoderGpu::create(cfg, weights, {h, w}, o);
  CUDA_CHECK(cudaDeviceSynchronize());
  const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t used_after_create = device_used();
  peak = std::max(peak, used_after_create);
  if (verbose) printf("%s", dec->plan_str().c_str());

  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  cudaEvent_t ea, eb;
  CUDA_CHECK(cudaEventCreate(&ea));
  CUDA_CHECK(cudaEventCreate(&eb));
  t0 = std::chrono::steady_clock::now();
  for (long long i = 0; i < warmup; ++i) {
    dec->decode(dz, T, dv, true, st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    peak = std::max(peak, device_used());
  }
  const double warmup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> ms;
  for (long long i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(ea, st));
    dec->decode(dz, T, dv, true, st);
    CUDA_CHECK(cudaEventRecord(eb, st));
    CUDA_CHECK(cudaEventSynchronize(eb));
    float m = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m, ea, eb));
    ms.push_back(m);
    peak = std::max(peak, device_used());
    printf("decode %lld: %.3f s\n", i + 1, m / 1e3);
    fflush(stdout);
  }
  CUDA_CHECK(cudaEventDestroy(ea));
  CUDA_CHECK(cudaEventDestroy(eb));
  CUDA_CHECK(cudaStreamDestroy(st));
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);

  // The video: every element finite and clamped.
  std::vector<float> v(v_n);
  CUDA_CHECK(cudaMemcpy(v.data(), dv, v_n * sizeof(float), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  double sq = 0;
  for (float x : v) {
    if (!std::isfinite(x) || std::fabs(x) > 1.0f) ++bad;
    else sq += static_cast<double>(x) * x;
  }
  const double rms = std::sqrt(sq / static_cast<double>(v_n));

  const size_t peak_bench = peak - used0, io = (z_n + v_n) * sizeof(float);
  const size_t plan = dec->weight_bytes() + dec->arena_bytes();
  printf("decode: median %.3f s, min %.3f s (%lld timed after %lld warm-up; CUDA events); plan %.2f s, warm-up %.2f s, "
         "weights drawn in %.2f s\n",
         median_ms / 1e3, sorted.front() / 1e3, reps, warmup, plan_s, warmup_s, weights_s);
  printf("memory: peak device memory in use %.2f GiB above the %.2f GiB before the bench (cudaMemGetInfo; "
         "plan %.2f GiB = weights %.1f MiB + arena %.2f GiB; latent + video %.2f GiB; rest: CUDA libraries, kernels)\n",
         peak_bench / kGiB, used0 / kGiB, plan / kGiB, dec->weight_bytes() / 1048576.0, dec->arena_bytes() / kGiB,
         io / kGiB);
  printf("video [3, %lld, %lld, %lld]: rms %.4f, %zu non-finite or outside [-1, 1]\n", (long long)F, height, width, rms,
         bad);
  fflush(stdout);

  if (!json_path.empty()) {
    const char* commit = std::getenv("WAN_COMMIT");
    nlohmann::json J;
    J["tool"] = "wan bench-vae";
    J["commit"] = commit ? commit : "unknown";
    J["date"] = utc_now();
    J["device"] = {{"name", bd.name},
                   {"sm_count", bd.sm_count},
                   {"memory_gib", bd.total_bytes / kGiB},
                   {"driver", bd.driver_version},
                   {"runtime", bd.runtime_version},
                   {"cudnn", bd.cudnn_version}};
    J["vae"] = "wan2.1";
    J["dtype"] = "bf16 (fp32 accumulation; see src/models/vae/vae_gpu.h)";
    J["conv_mode"] = mode;
    J["size"] = {width, height};
    J["frames"] = F;
    J["latent"] = {16, T, h, w};
    J["weights"] = "random, as `wan make-checkpoint --seed " + std::to_string(seed) + "` draws the VAE";
    J["decode_ms"] = ms;
    J["median_s"] = median_ms / 1e3;
    J["min_s"] = sorted.front() / 1e3;
    J["warmup"] = warmup;
    J["reps"] = reps;
    J["plan_s"] = plan_s;
    J["method"] = "CUDA events around VaeDecoderGpu::decode (whole latent, clamp) on one stream, median of reps after "
                  "warm-up; memory: cudaMemGetInfo used bytes sampled after create and every decode, minus the "
                  "sample before the bench allocated anything";
    J["memory"] = {{"device_used_before_bytes", used0},
                   {"device_used_after_create_bytes", used_after_create},
                   {"peak_bytes", peak_bench},
                   {"plan_bytes", plan},
                   {"weight_bytes", dec->weight_bytes()},
                   {"arena_bytes", dec->arena_bytes()},
                   {"latent_video_bytes", io}};
    J["video_check"] = {{"bad", bad}, {"rms", rms}};
    write_json_file(json_path, J);
  }
  WAN_ASSERT(bad == 0, "bench-vae: ", bad, " video elements are non-finite or outside [-1, 1]");
  return 0;
#endif
}

}  // namespace wan::cli
