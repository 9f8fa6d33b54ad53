// `wan bench-vae`: time and peak device memory of the GPU VAE (src/models/vae/vae_gpu.h decoder,
// vae_gpu_encoder.h encoder; bf16, causal chunk cache) of Wan 2.1 or Wan 2.2 at the real widths with random
// weights, for the same-run comparison with the official fp32 VAE (bench/run_vae_bench.sh runs
// bench/baselines/diffusers_vae.py next). What is measured (say it, so numbers are never mistaken):
// - weights: the --vae preset drawn exactly as `wan make-checkpoint` draws its VAE, in memory;
// - decode input: a latent [z, T, H/sf, W/sf] f32 ~ N(0, 1) (Philox, --seed + 1), T = (F - 1)/4 + 1,
//   sf = 8 (Wan 2.1) or 16 (Wan 2.2); encode input: a video [3, F, H, W] whose frame 0 is an image
//   uniform in [-1, 1) (Philox, --seed + 1) and whose other frames are zero (the I2V conditioning video;
//   F = 1 is TI2V's single image);
// - time: one decode (or encode) of the whole input between device buffers, bracketed by CUDA events
//   on one stream; median (and min) of --reps after --warmup untimed runs; create is timed apart;
// - memory: cudaMemGetInfo's used bytes, peak minus the sample before the bench (run_vae_bench), next to
//   the plan (weights + arena) and the planner's own figure (device_bytes);
// - the output is downloaded once at the end: a video checked finite and within [-1, 1] (the clamp),
//   latents checked finite.
// In a build without CUDA the command parses its options and then fails with one clear error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
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
#include "models/vae/vae_gpu_encoder.h"
#endif

namespace wan::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The command line, read and checked before any device work. Size and frames default per VAE and
// direction: the sizes the released models run (Wan 2.1 720p, 81 frames; Wan 2.2 1280x704, 121 frames
// decoded, one frame encoded: TI2V's image).
struct VaeSettings {
  std::string vae, size, mode, json_path;
  bool encode = false;
  long long width = 0, height = 0, frames = 0, reps = 0, warmup = 0, seed = 0, device = 0;
  bool verbose = false;
};

VaeSettings parse_settings(const api::Values& args) {
  VaeSettings s;
  s.vae = args.str("vae");
  s.encode = args.flag("encode");
  const bool v22 = s.vae == "wan2.2";
  s.size = args.get_or("size", v22 ? "1280x704" : "1280x720");
  const api::Size z = api::parse_size(s.size, "size");
  s.width = z.width, s.height = z.height;
  const int sf = v22 ? 16 : 8;
  WAN_CHECK_OPTION("size", s.width % sf == 0 && s.height % sf == 0, "{} ", s.size,
                   ": width and height must be multiples of ", sf, " for ", s.vae);
  s.frames = args.get_int("frames", v22 ? (s.encode ? 1 : 121) : 81);
  s.reps = args.get_int("reps", 3);
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
// vae_weight_table + fill_init, component "vae" of --seed (PyTorch-default-like U(±1/√fan_in)).
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

// The latent and video geometry: latent [z, T, h, w], video [3, F, height, width].
struct VaeShape {
  int64_t z = 0, T = 0, h = 0, w = 0, F = 0;
  int sf = 8;
  size_t z_n = 0, v_n = 0;
};

VaeShape vae_shape(const VaeSettings& s, const VaeConfig& c) {
  VaeShape g;
  g.z = c.z_dim, g.sf = 8 * c.patch;
  g.T = (s.frames - 1) / 4 + 1, g.h = s.height / g.sf, g.w = s.width / g.sf, g.F = 1 + 4 * (g.T - 1);
  g.z_n = static_cast<size_t>(g.z * g.T * g.h * g.w), g.v_n = static_cast<size_t>(3 * g.F * s.height * s.width);
  return g;
}

std::string vae_title(const VaeSettings& s) { return s.vae == "wan2.2" ? "Wan 2.2" : "Wan 2.1"; }
const char* op_name(const VaeSettings& s) { return s.encode ? "encode" : "decode"; }

std::string latent_str(const VaeShape& g) { return cat("[", g.z, ", ", g.T, ", ", g.h, ", ", g.w, "]"); }

void print_intro(const VaeSettings& s, const VaeShape& g, int dev, const cuda::BenchDevice& bd) {
  if (s.encode)
    printf("wan bench-vae: %s VAE encode (bf16, %s), %lldx%lld, %lld frames (frame 0 a random image, %lld zero) "
           "-> latent %s, random weights (make-checkpoint seed %lld)\n",
           vae_title(s).c_str(), s.mode.c_str(), s.width, s.height, (long long)g.F, (long long)g.F - 1,
           latent_str(g).c_str(), s.seed);
  else
    printf("wan bench-vae: %s VAE decode (bf16, %s), %lldx%lld, %lld frames <- latent %s, random weights "
           "(make-checkpoint seed %lld)\n",
           vae_title(s).c_str(), s.mode.c_str(), s.width, s.height, (long long)g.F, latent_str(g).c_str(), s.seed);
  printf("device %d: %s, %d SMs, %.1f GiB; driver %d, runtime %d, cuDNN %d\n", dev, bd.name.c_str(), bd.sm_count,
         bd.total_bytes / kGiB, bd.driver_version, bd.runtime_version, bd.cudnn_version);
  fflush(stdout);
}

// What one run measured: times, the memory samples and the output check.
struct VaeResult {
  double weights_s = 0, plan_s = 0, warmup_s = 0;
  std::vector<double> ms;  // per timed run
  double median_ms = 0, min_ms = 0;
  size_t used0 = 0, used_after_create = 0, peak = 0;  // cudaMemGetInfo used bytes
  size_t weight_bytes = 0, arena_bytes = 0, planned_bytes = 0;
  size_t bad = 0;  // output elements non-finite (or, for a video, outside [-1, 1])
  double rms = 0;
};

double elapsed_s(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --warmup untimed runs, then --reps runs bracketed by CUDA events; the used memory sampled after each.
void time_runs(const VaeSettings& s, const std::function<void(cudaStream_t)>& run, VaeResult& r) {
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  cudaEvent_t ea, eb;
  CUDA_CHECK(cudaEventCreate(&ea));
  CUDA_CHECK(cudaEventCreate(&eb));
  const auto t0 = std::chrono::steady_clock::now();
  for (long long i = 0; i < s.warmup; ++i) {
    run(st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    r.peak = std::max(r.peak, device_used());
  }
  r.warmup_s = elapsed_s(t0);
  for (long long i = 0; i < s.reps; ++i) {
    CUDA_CHECK(cudaEventRecord(ea, st));
    run(st);
    CUDA_CHECK(cudaEventRecord(eb, st));
    CUDA_CHECK(cudaEventSynchronize(eb));
    float m = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m, ea, eb));
    r.ms.push_back(m);
    r.peak = std::max(r.peak, device_used());
    printf("%s %lld: %.3f s\n", op_name(s), i + 1, m / 1e3);
    fflush(stdout);
  }
  CUDA_CHECK(cudaEventDestroy(ea));
  CUDA_CHECK(cudaEventDestroy(eb));
  CUDA_CHECK(cudaStreamDestroy(st));
  r.median_ms = median_of(r.ms);
  r.min_ms = *std::min_element(r.ms.begin(), r.ms.end());
}

// The output: every element finite, and a video clamped to [-1, 1].
void check_output(const float* d, size_t n, bool clamped, VaeResult& r) {
  std::vector<float> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  double sq = 0;
  for (float x : v) {
    if (!std::isfinite(x) || (clamped && std::fabs(x) > 1.0f)) ++r.bad;
    else sq += static_cast<double>(x) * x;
  }
  r.rms = std::sqrt(sq / static_cast<double>(n));
}

// Plans the decoder or encoder (Model), times `run` on it and asks the planner for its own figure. The
// planner's query comes after the timed runs so anything it creates is not in the peak.
template <class Model, class Run>
void plan_and_time(const VaeSettings& s, const VaeConfig& cfg, const VaeWeights& weights, const VaeShape& g, Run run,
                   VaeResult& r) {
  VaeGpuOptions o;
  o.conv_mode = s.mode == "conv3d" ? VaeConvMode::Conv3d : VaeConvMode::Folded2d;
  const auto t0 = std::chrono::steady_clock::now();
  auto m = Model::create(cfg, weights, {g.h, g.w}, o);
  CUDA_CHECK(cudaDeviceSynchronize());
  r.plan_s = elapsed_s(t0);
  r.used_after_create = device_used();
  r.peak = std::max(r.peak, r.used_after_create);
  if (s.verbose) printf("%s", m->plan_str().c_str());
  r.weight_bytes = m->weight_bytes(), r.arena_bytes = m->arena_bytes();
  time_runs(s, [&](cudaStream_t st) { run(*m, st); }, r);
  r.planned_bytes = Model::device_bytes(cfg, {g.h, g.w}, o);
}

// The encoder's input: frame 0 uniform in [-1, 1), the other frames zero.
std::vector<float> conditioning_video(const VaeSettings& s, const VaeShape& g) {
  std::vector<float> v(g.v_n, 0.0f);
  const size_t hw = static_cast<size_t>(s.height * s.width), frame_stride = static_cast<size_t>(g.F) * hw;
  for (size_t c = 0; c < 3; ++c)
    for (size_t i = 0; i < hw; ++i)
      v[c * frame_stride + i] = 2.0f * philox_uniform(static_cast<uint64_t>(s.seed) + 1, c * hw + i) - 1.0f;
  return v;
}

// Draws the weights and the input, plans the decoder (or encoder), times it and checks the last output.
// The used memory is sampled before anything of the bench exists, after create and after every run
// (nothing is freed in between, so the largest sample is the peak: the CUDA libraries' handles and
// workspaces, lazily loaded kernels, the weights, the arena, and the latent and video buffers).
VaeResult run_vae_bench(const VaeSettings& s, const VaeConfig& cfg, const VaeShape& g) {
  VaeResult r;
  const auto t0 = std::chrono::steady_clock::now();
  const VaeWeights weights = make_checkpoint_vae(cfg, static_cast<uint64_t>(s.seed));
  r.weights_s = elapsed_s(t0);
  std::vector<float> in;
  if (s.encode) {
    in = conditioning_video(s, g);
  } else {
    in.resize(g.z_n);
    philox_normal_fill(static_cast<uint64_t>(s.seed) + 1, 0, in.data(), g.z_n);
  }

  CUDA_CHECK(cudaDeviceSynchronize());
  r.used0 = device_used();
  r.peak = r.used0;
  DevMem<float> dz(g.z_n), dv(g.v_n);
  CUDA_CHECK(cudaMemcpy(s.encode ? dv.p : dz.p, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
  if (s.encode) {
    plan_and_time<VaeEncoderGpu>(
        s, cfg, weights, g, [&](VaeEncoderGpu& e, cudaStream_t st) { e.encode(dv.p, g.F, dz.p, st); }, r);
    check_output(dz.p, g.z_n, false, r);
  } else {
    plan_and_time<VaeDecoderGpu>(
        s, cfg, weights, g, [&](VaeDecoderGpu& d, cudaStream_t st) { d.decode(dz.p, g.T, dv.p, true, st); }, r);
    check_output(dv.p, g.v_n, true, r);
  }
  return r;
}

void print_summary(const VaeSettings& s, const VaeShape& g, const VaeResult& r) {
  const size_t peak_bench = r.peak - r.used0, io = (g.z_n + g.v_n) * sizeof(float);
  const size_t plan = r.weight_bytes + r.arena_bytes;
  printf("%s: median %.3f s, min %.3f s (%lld timed after %lld warm-up; CUDA events); plan %.2f s, warm-up %.2f s, "
         "weights drawn in %.2f s\n",
         op_name(s), r.median_ms / 1e3, r.min_ms / 1e3, s.reps, s.warmup, r.plan_s, r.warmup_s, r.weights_s);
  printf("memory: peak device memory in use %.2f GiB above the %.2f GiB before the bench (cudaMemGetInfo; "
         "plan %.2f GiB = weights %.1f MiB + arena %.2f GiB, planner's device_bytes %.2f GiB; latent + video "
         "%.2f GiB; rest: CUDA libraries, kernels)\n",
         peak_bench / kGiB, r.used0 / kGiB, plan / kGiB, r.weight_bytes / 1048576.0, r.arena_bytes / kGiB,
         r.planned_bytes / kGiB, io / kGiB);
  if (s.encode)
    printf("latent %s: rms %.4f, %zu non-finite\n", latent_str(g).c_str(), r.rms, r.bad);
  else
    printf("video [3, %lld, %lld, %lld]: rms %.4f, %zu non-finite or outside [-1, 1]\n", (long long)g.F, s.height,
           s.width, r.rms, r.bad);
  fflush(stdout);
}

nlohmann::json result_json(const VaeSettings& s, const VaeShape& g, const cuda::BenchDevice& bd, const VaeResult& r) {
  nlohmann::json J;
  put_tool_header(J, "wan bench-vae");
  J["device"] = bench_device_json(bd);
  J["vae"] = s.vae;
  J["op"] = op_name(s);
  J["dtype"] = "bf16 (fp32 accumulation; see src/models/vae/vae_gpu.h, vae_gpu_encoder.h)";
  J["conv_mode"] = s.mode;
  J["size"] = {s.width, s.height};
  J["frames"] = g.F;
  J["latent"] = {g.z, g.T, g.h, g.w};
  J["video"] = {3, g.F, s.height, s.width};
  J["input"] = s.encode ? "video: frame 0 uniform in [-1, 1) (Philox, seed + 1), the other frames zero; output: the "
                          "normalised posterior mean"
                        : "latent ~ N(0, 1) (Philox, seed + 1); output: the clamped video";
  J["weights"] = "random, as `wan make-checkpoint --seed " + std::to_string(s.seed) + "` draws the VAE";
  J[std::string(op_name(s)) + "_ms"] = r.ms;
  J["median_s"] = r.median_ms / 1e3;
  J["min_s"] = r.min_ms / 1e3;
  J["warmup"] = s.warmup;
  J["reps"] = s.reps;
  J["plan_s"] = r.plan_s;
  J["weights_s"] = r.weights_s;
  J["method"] = std::string("CUDA events around ") + (s.encode ? "VaeEncoderGpu::encode" : "VaeDecoderGpu::decode") +
                " (whole input, device buffers) on one stream, median of reps after warm-up; memory: "
                "cudaMemGetInfo used bytes sampled after create and every run, minus the sample before the bench "
                "allocated anything";
  J["memory"] = {{"device_used_before_bytes", r.used0},
                 {"device_used_after_create_bytes", r.used_after_create},
                 {"peak_bytes", r.peak - r.used0},
                 {"plan_bytes", r.weight_bytes + r.arena_bytes},
                 {"planned_device_bytes", r.planned_bytes},
                 {"weight_bytes", r.weight_bytes},
                 {"arena_bytes", r.arena_bytes},
                 {"latent_video_bytes", (g.z_n + g.v_n) * sizeof(float)}};
  J[s.encode ? "latent_check" : "video_check"] = {{"bad", r.bad}, {"rms", r.rms}};
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
    c.summary = "time the GPU VAE decode or encode with random weights (s, peak memory)";
    c.usage = {"bench-vae [options]"};
    c.about = "Times the GPU VAE decode (or, with --encode, encode) of Wan 2.1 or Wan 2.2 (bf16, causal chunk "
              "cache) with random weights at the real widths.";
    api::Option vae =
        api::option("vae", Kind::Enum, "V", "wan2.1", "wan2.1 (z 16, stride 8) | wan2.2 (z 48, stride 16)");
    vae.choices = {"wan2.1", "wan2.2"};
    api::Option size = api::option("size", Kind::Size, "", "1280x720, wan2.2 1280x704",
                                   "pixel size (multiples of 8, wan2.2 16)");
    size.check = [](const std::string& t) {
      const api::Size z = api::parse_size(t);
      return z.width % 8 == 0 && z.height % 8 == 0 ? std::string()
                                                   : cat("{} ", t, ": width and height must be multiples of 8");
    };
    Option frames = bench_int_option("frames", "81, wan2.2 121 (--encode: 1)", 1, 1e6,
                                     "pixel frames, 4n+1 (encode: frame 0 a random image, the rest zero)");
    frames.check = [](const std::string& f) {
      return (std::stoll(f) - 1) % 4 == 0 ? std::string() : cat("{} ", f, ": must be 4n+1");
    };
    api::Option mode =
        api::option("conv-mode", Kind::Enum, "M", "folded2d", "folded2d | conv3d (see src/models/vae/vae_gpu.h)");
    mode.choices = {"folded2d", "conv3d"};
    c.options = {
        vae,
        api::option("encode", Kind::Flag, "", "", "time the encoder (video -> posterior mean) instead of the decoder"),
        size,
        frames,
        bench_int_option("reps", "3", 1, 1000, "timed runs (median and min)"),
        bench_int_option("warmup", "1", 0, 100, "untimed runs first"),
        bench_int_option("seed", "0", 0, 9.2e18, "weight seed as `wan make-checkpoint --seed`; inputs use seed + 1"),
        mode,
        bench_device_option(),
        bench_json_option(),
        api::option("verbose", Kind::Flag, "", "", "print the decoder's (encoder's) memory and convolution plan"),
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
  const VaeConfig cfg = vae_preset(s.vae);
  const VaeShape g = vae_shape(s, cfg);
  print_intro(s, g, dev, bd);
  const VaeResult r = run_vae_bench(s, cfg, g);
  print_summary(s, g, r);
  if (!s.json_path.empty()) write_json_file(s.json_path, result_json(s, g, bd, r));
  WAN_ASSERT(r.bad == 0, "bench-vae: ", r.bad, s.encode ? " latent elements are non-finite"
                                                        : " video elements are non-finite or outside [-1, 1]");
  return 0;
#endif
}

}  // namespace wan::cli
