// `wan bench-vae`: decode time and peak device memory of the GPU Wan 2.1 VAE decoder (src/models/vae/vae_gpu.h,
// bf16, causal chunk cache) at the real widths with random weights, for the same-run comparison with the
// official fp32 decode (bench/run_vae_bench.sh runs bench/baselines/diffusers_vae.py next).
// What is measured (say it, so numbers are never mistaken for something else):
// - weights: the Wan 2.1 VAE preset drawn exactly as `wan make-checkpoint` draws its VAE, in memory;
// - input: one latent [16, T, H/8, W/8] f32 ~ N(0, 1) (Philox, --seed + 1) on the device, T = (F - 1)/4 + 1;
// - time: VaeDecoderGpu::decode of the whole latent into a device video [3, F, H, W] f32, bracketed by
//   CUDA events on one stream; median (and min) of --reps after --warmup untimed decodes; the plan
//   (create) is timed separately and not in the median;
// - memory: cudaMemGetInfo's used bytes, peak minus the sample before the bench (run_vae_bench);
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
#include "pipeline/files.h"
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

// The command line, read and checked before any device work.
struct VaeSettings {
  std::string size, mode, json_path;
  long long width = 0, height = 0, frames = 0, reps = 0, warmup = 0, seed = 0, device = 0;
  bool verbose = false;
};

VaeSettings parse_settings(const api::Values& args) {
  VaeSettings s;
  s.size = args.str("size");
  const auto [w_arg, h_arg] = args.size("size");
  s.width = w_arg, s.height = h_arg;
  s.frames = args.get_int("frames", 81), s.reps = args.get_int("reps", 3);
  s.warmup = args.get_int("warmup", 1), s.seed = args.get_int("seed", 0);
  s.device = args.device("device");
  s.mode = args.str("conv-mode");
  s.json_path = args.get_or("json", "");
  if (!s.json_path.empty()) check_output_path(s.json_path, "--json");  // before any work
  s.verbose = args.flag("verbose");
  return s;
}

#ifdef WAN_HAVE_CUDA
using namespace wan::cuda;

size_t device_used() {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

// The VAE make-checkpoint writes for --seed (same names, shapes and values), as f32 tensors in memory:
// base 96, z 16, dim_mult 1 2 4 4, vae_weight_table + fill_init, component "vae" of --seed
// (PyTorch-default-like U(±1/√fan_in)).
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

// The latent and video geometry: latent [16, T, h, w], video [3, F, height, width].
struct VaeShape {
  int64_t T = 0, h = 0, w = 0, F = 0;
  size_t z_n = 0, v_n = 0;
};

VaeShape vae_shape(const VaeSettings& s) {
  VaeShape g;
  g.T = (s.frames - 1) / 4 + 1, g.h = s.height / 8, g.w = s.width / 8, g.F = 1 + 4 * (g.T - 1);
  g.z_n = static_cast<size_t>(16 * g.T * g.h * g.w), g.v_n = static_cast<size_t>(3 * g.F * s.height * s.width);
  return g;
}

void print_intro(const VaeSettings& s, const VaeShape& g, int dev, const cuda::BenchDevice& bd) {
  printf("wan bench-vae: Wan 2.1 VAE decode (bf16, %s), %lldx%lld, %lld frames <- latent [16, %lld, %lld, %lld], "
         "random weights (make-checkpoint seed %lld)\n",
         s.mode.c_str(), s.width, s.height, (long long)g.F, (long long)g.T, (long long)g.h, (long long)g.w, s.seed);
  printf("device %d: %s, %d SMs, %.1f GiB; driver %d, runtime %d, cuDNN %d\n", dev, bd.name.c_str(), bd.sm_count,
         bd.total_bytes / kGiB, bd.driver_version, bd.runtime_version, bd.cudnn_version);
  fflush(stdout);
}

// What one run measured: times, the memory samples and the video check.
struct VaeResult {
  double weights_s = 0, plan_s = 0, warmup_s = 0;
  std::vector<double> ms;  // per timed decode
  double median_ms = 0, min_ms = 0;
  size_t used0 = 0, used_after_create = 0, peak = 0;  // cudaMemGetInfo used bytes
  size_t weight_bytes = 0, arena_bytes = 0;
  size_t bad = 0;  // video elements non-finite or outside [-1, 1]
  double rms = 0;
};

double elapsed_s(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --warmup untimed decodes, then --reps decodes bracketed by CUDA events; the used memory sampled after each.
void time_decodes(VaeDecoderGpu& dec, const VaeSettings& s, int64_t T, const float* dz, float* dv, VaeResult& r) {
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  cudaEvent_t ea, eb;
  CUDA_CHECK(cudaEventCreate(&ea));
  CUDA_CHECK(cudaEventCreate(&eb));
  const auto t0 = std::chrono::steady_clock::now();
  for (long long i = 0; i < s.warmup; ++i) {
    dec.decode(dz, T, dv, true, st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    r.peak = std::max(r.peak, device_used());
  }
  r.warmup_s = elapsed_s(t0);
  for (long long i = 0; i < s.reps; ++i) {
    CUDA_CHECK(cudaEventRecord(ea, st));
    dec.decode(dz, T, dv, true, st);
    CUDA_CHECK(cudaEventRecord(eb, st));
    CUDA_CHECK(cudaEventSynchronize(eb));
    float m = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m, ea, eb));
    r.ms.push_back(m);
    r.peak = std::max(r.peak, device_used());
    printf("decode %lld: %.3f s\n", i + 1, m / 1e3);
    fflush(stdout);
  }
  CUDA_CHECK(cudaEventDestroy(ea));
  CUDA_CHECK(cudaEventDestroy(eb));
  CUDA_CHECK(cudaStreamDestroy(st));
  r.median_ms = median_of(r.ms);
  r.min_ms = *std::min_element(r.ms.begin(), r.ms.end());
}

// The video: every element finite and clamped.
void check_video(const float* dv, size_t v_n, VaeResult& r) {
  std::vector<float> v(v_n);
  CUDA_CHECK(cudaMemcpy(v.data(), dv, v_n * sizeof(float), cudaMemcpyDeviceToHost));
  double sq = 0;
  for (float x : v) {
    if (!std::isfinite(x) || std::fabs(x) > 1.0f) ++r.bad;
    else sq += static_cast<double>(x) * x;
  }
  r.rms = std::sqrt(sq / static_cast<double>(v_n));
}

// Draws the weights and the latent, plans the decoder, times its decodes and checks the last video. The
// used memory is sampled before anything of the bench exists, after create and after every decode
// (nothing is freed in between, so the largest sample is the peak: the CUDA libraries' handles and
// workspaces, lazily loaded kernels, the weights, the arena, and the latent and video buffers).
VaeResult run_vae_bench(const VaeSettings& s, const VaeShape& g) {
  const VaeConfig cfg = vae_preset("wan2.1");
  VaeResult r;
  auto t0 = std::chrono::steady_clock::now();
  const VaeWeights weights = make_checkpoint_vae(cfg, static_cast<uint64_t>(s.seed));
  r.weights_s = elapsed_s(t0);
  std::vector<float> z(g.z_n);
  philox_normal_fill(static_cast<uint64_t>(s.seed) + 1, 0, z.data(), g.z_n);

  CUDA_CHECK(cudaDeviceSynchronize());
  r.used0 = device_used();
  r.peak = r.used0;
  DevMem<float> dz(g.z_n), dv(g.v_n);
  CUDA_CHECK(cudaMemcpy(dz.p, z.data(), g.z_n * sizeof(float), cudaMemcpyHostToDevice));

  VaeGpuOptions o;
  o.conv_mode = s.mode == "conv3d" ? VaeConvMode::Conv3d : VaeConvMode::Folded2d;
  t0 = std::chrono::steady_clock::now();
  auto dec = VaeDecoderGpu::create(cfg, weights, {g.h, g.w}, o);
  CUDA_CHECK(cudaDeviceSynchronize());
  r.plan_s = elapsed_s(t0);
  r.used_after_create = device_used();
  r.peak = std::max(r.peak, r.used_after_create);
  if (s.verbose) printf("%s", dec->plan_str().c_str());
  r.weight_bytes = dec->weight_bytes(), r.arena_bytes = dec->arena_bytes();

  time_decodes(*dec, s, g.T, dz.p, dv.p, r);
  check_video(dv.p, g.v_n, r);
  return r;
}

void print_summary(const VaeSettings& s, const VaeShape& g, const VaeResult& r) {
  const size_t peak_bench = r.peak - r.used0, io = (g.z_n + g.v_n) * sizeof(float);
  const size_t plan = r.weight_bytes + r.arena_bytes;
  printf("decode: median %.3f s, min %.3f s (%lld timed after %lld warm-up; CUDA events); plan %.2f s, warm-up %.2f s, "
         "weights drawn in %.2f s\n",
         r.median_ms / 1e3, r.min_ms / 1e3, s.reps, s.warmup, r.plan_s, r.warmup_s, r.weights_s);
  printf("memory: peak device memory in use %.2f GiB above the %.2f GiB before the bench (cudaMemGetInfo; "
         "plan %.2f GiB = weights %.1f MiB + arena %.2f GiB; latent + video %.2f GiB; rest: CUDA libraries, kernels)\n",
         peak_bench / kGiB, r.used0 / kGiB, plan / kGiB, r.weight_bytes / 1048576.0, r.arena_bytes / kGiB,
         io / kGiB);
  printf("video [3, %lld, %lld, %lld]: rms %.4f, %zu non-finite or outside [-1, 1]\n", (long long)g.F, s.height,
         s.width, r.rms, r.bad);
  fflush(stdout);
}

nlohmann::json result_json(const VaeSettings& s, const VaeShape& g, const cuda::BenchDevice& bd, const VaeResult& r) {
  nlohmann::json J;
  put_tool_header(J, "wan bench-vae");
  J["device"] = bench_device_json(bd);
  J["vae"] = "wan2.1";
  J["dtype"] = "bf16 (fp32 accumulation; see src/models/vae/vae_gpu.h)";
  J["conv_mode"] = s.mode;
  J["size"] = {s.width, s.height};
  J["frames"] = g.F;
  J["latent"] = {16, g.T, g.h, g.w};
  J["weights"] = "random, as `wan make-checkpoint --seed " + std::to_string(s.seed) + "` draws the VAE";
  J["decode_ms"] = r.ms;
  J["median_s"] = r.median_ms / 1e3;
  J["min_s"] = r.min_ms / 1e3;
  J["warmup"] = s.warmup;
  J["reps"] = s.reps;
  J["plan_s"] = r.plan_s;
  J["method"] = "CUDA events around VaeDecoderGpu::decode (whole latent, clamp) on one stream, median of reps after "
                "warm-up; memory: cudaMemGetInfo used bytes sampled after create and every decode, minus the "
                "sample before the bench allocated anything";
  J["memory"] = {{"device_used_before_bytes", r.used0},
                 {"device_used_after_create_bytes", r.used_after_create},
                 {"peak_bytes", r.peak - r.used0},
                 {"plan_bytes", r.weight_bytes + r.arena_bytes},
                 {"weight_bytes", r.weight_bytes},
                 {"arena_bytes", r.arena_bytes},
                 {"latent_video_bytes", (g.z_n + g.v_n) * sizeof(float)}};
  J["video_check"] = {{"bad", r.bad}, {"rms", r.rms}};
  return J;
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
  if (api::print_help_if_asked(args, bench_vae_spec())) return 0;
  const VaeSettings s = parse_settings(args);
#ifndef WAN_HAVE_CUDA
  (void)s;
  WAN_THROW("wan bench-vae: this wan was built without CUDA; rebuild with a CUDA toolkit (WAN_ENABLE_CUDA=ON)");
#else
  // The context exists before the first memory sample.
  const int dev = select_bench_device(s.device, "wan bench-vae: no CUDA device is visible");
  const cuda::BenchDevice bd = cuda::bench_device(dev);
  const VaeShape g = vae_shape(s);
  print_intro(s, g, dev, bd);
  const VaeResult r = run_vae_bench(s, g);
  print_summary(s, g, r);
  if (!s.json_path.empty()) write_json_file(s.json_path, result_json(s, g, bd, r));
  WAN_ASSERT(r.bad == 0, "bench-vae: ", r.bad, " video elements are non-finite or outside [-1, 1]");
  return 0;
#endif
}

}  // namespace wan::cli
