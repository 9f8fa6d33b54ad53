// `wan forward --model PATH ...`: one CPU float32 DiT forward on random inputs drawn with the engine
// RNG (Philox), for smoke-testing a checkpoint end to end through layout detection, weight loading
// and the reference forward. Prints the output shape, its statistics and the timings; optionally
// saves inputs and output to a safetensors file.
// Inputs: latent x [1, in_dim, T_lat, H_lat, W_lat] ~ N(0,1) (I2V: the 20 conditioning channels are
// random too), timestep t = trunc(1000·u), context [1, prompt_len, text_dim] ~ N(0,1). Streams:
// x is philox_normal(seed, i), the context continues at offset 2^40, t uses philox_uniform(seed, 0).
// The weights are held in f32 (4 bytes per parameter); --layers runs only the first N blocks so a
// 14B checkpoint can be smoke-tested on a machine without ~57 GB of RAM.
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/layout.h"
#include "api/commands.h"
#include "cli/commands.h"
#include "core/clock.h"
#include "core/philox.h"
#include "core/thread_pool.h"
#include "models/dit/dit_cpu.h"
#include "formats/safetensors.h"
#include "pipeline/files.h"
#include "pipeline/host_memory.h"

namespace wan::cli {
namespace {

constexpr uint64_t kContextStreamOffset = uint64_t{1} << 40;

Role pick_dit_role(const CheckpointInfo& info, const std::string& expert) {
  WAN_CHECK(expert == "high" || expert == "low", "--expert must be high or low, got '", expert, "'");
  const Role want = expert == "high" ? Role::DiTHigh : Role::DiTLow;
  if (info.has(want)) return want;
  if (info.has(Role::DiT)) return Role::DiT;  // single-expert model or a lone expert of unknown kind
  const Role other = want == Role::DiTHigh ? Role::DiTLow : Role::DiTHigh;
  WAN_CHECK(!info.has(other), info.root, ": holds only the ", role_name(other), " expert, not ", role_name(want));
  WAN_THROW(info.root, ": checkpoint has no DiT");
}

struct Stats {
  double mean = 0, std = 0, min = INFINITY, max = -INFINITY;
  int64_t nonfinite = 0;
};
Stats stats(const Tensor& t) {
  Stats s;
  double sum = 0, sq = 0;
  int64_t n = 0;
  const float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(p[i])) {
      ++s.nonfinite;
      continue;
    }
    sum += p[i];
    sq += static_cast<double>(p[i]) * p[i];
    s.min = std::min(s.min, static_cast<double>(p[i]));
    s.max = std::max(s.max, static_cast<double>(p[i]));
    ++n;
  }
  if (n > 0) {
    s.mean = sum / n;
    s.std = std::sqrt(std::max(0.0, sq / n - s.mean * s.mean));
  }
  return s;
}


}  // namespace

int cmd_forward(int argc, char** argv) {
  const api::Values args = api::parse_argv(api::forward_spec(), argc, argv);
  if (api::print_help_if_asked(args, api::forward_spec())) return 0;
  const std::string model = args.require("model");
  const long long frames = args.get_int("frames", 5);
  const long long seed = args.get_int("seed", 0);
  const long long prompt_len = args.get_int("prompt-len", 16);
  const std::string size = args.str("size");
  const auto [w_arg, h_arg] = args.size("size");
  const long long width = w_arg, height = h_arg;

  // The output is checked now, not after the forward: writable, and not one of the checkpoint's files.
  const std::optional<std::string> output = args.get("output");
  if (output) check_output_path(*output, "--output");
  const CheckpointInfo info = detect_checkpoint(model);
  if (output) check_outputs_distinct({{"--output", *output}}, checkpoint_input_files(info));
  DiTConfig cfg = info.dit;
  const Role role = pick_dit_role(info, args.str("expert"));
  if (auto layers = args.get("layers")) {
    const long long n = args.get_int("layers", 0);
    WAN_CHECK(n >= 1 && n <= cfg.num_layers, "--layers ", *layers, ": must be in [1, ", cfg.num_layers, "]");
    cfg.num_layers = static_cast<int>(n);
  }
  WAN_CHECK(prompt_len >= 1 && prompt_len <= cfg.text_len, "--prompt-len ", prompt_len, ": must be in [1, ",
            cfg.text_len, "]");
  // Latent geometry: VAE stride 4 in time, 8 (Wan2.1 VAE) or 16 (Wan2.2 VAE, TI2V-5B) in space; the
  // latent H and W must then be multiples of the DiT patch.
  const int sstride = info.task == Task::TI2V_5B ? 16 : 8;
  const int64_t T = (frames - 1) / 4 + 1;
  WAN_CHECK(width % (sstride * cfg.patch[2]) == 0 && height % (sstride * cfg.patch[1]) == 0, "--size ", size,
            ": width and height must be multiples of ", sstride * cfg.patch[2], " for ", task_name(info.task));
  const int64_t H = height / sstride, W = width / sstride;
  const int64_t L = (T / cfg.patch[0]) * (H / cfg.patch[1]) * (W / cfg.patch[2]);
  check_forward_memory(cfg, T / cfg.patch[0], H / cfg.patch[1], W / cfg.patch[2], cfg.out_dim * T * H * W);

  printf("model:   %s (%s, %s, %s)\n", info.root.c_str(), layout_name(info.layout), task_name(info.task),
         role_name(role));
  printf("dit:     dim %d, ffn %d, heads %d, layers %d%s, in %d, out %d, text_dim %d\n", cfg.dim, cfg.ffn_dim,
         cfg.num_heads, cfg.num_layers, cfg.num_layers < info.dit.num_layers ? cat(" of ", info.dit.num_layers).c_str() : "",
         cfg.in_dim, cfg.out_dim, cfg.text_dim);
  printf("input:   %lld frames %lldx%lld -> latent [1, %d, %lld, %lld, %lld], %lld tokens, prompt %lld tokens, seed %lld\n",
         frames, width, height, cfg.in_dim, static_cast<long long>(T), static_cast<long long>(H),
         static_cast<long long>(W), static_cast<long long>(L), prompt_len, seed);

  // ---- weights ----
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<WeightStore> store = open_weights(info, role);
  DiTWeights weights;
  WAN_WITH_CONTEXT(cat("loading ", role_name(role)),
                   weights = load_dit_weights(cfg, [&](const std::string& n) { return store->get_f32(n); }));
  int64_t params = 0;
  for (const auto& [name, shape] : dit_expected_shapes(cfg)) params += shape.numel();
  printf("weights: %.1f MiB f32 loaded in %.2f s\n", static_cast<double>(params) * 4.0 / (1 << 20), seconds_since(t0));

  // ---- inputs ----
  Tensor x = Tensor::empty(DType::F32, {1, cfg.in_dim, T, H, W});
  philox_normal_fill(static_cast<uint64_t>(seed), 0, x.f32(), static_cast<size_t>(x.numel()));
  Tensor ctx = Tensor::empty(DType::F32, {1, prompt_len, cfg.text_dim});
  philox_normal_fill(static_cast<uint64_t>(seed), kContextStreamOffset, ctx.f32(), static_cast<size_t>(ctx.numel()));
  Tensor t = Tensor::empty(DType::F32, {1});
  t.f32()[0] = std::floor(philox_uniform(static_cast<uint64_t>(seed), 0) * 1000.0f);
  printf("timestep: %.0f\n", t.f32()[0]);

  // ---- forward ----
  t0 = std::chrono::steady_clock::now();
  Tensor v = dit_forward(cfg, weights, x, t, ctx, {prompt_len}, L);
  const double secs = seconds_since(t0);
  const Stats s = stats(v);
  printf("output:  %s velocity\n", v.shape().str().c_str());
  printf("stats:   mean %.6g  std %.6g  min %.6g  max %.6g%s\n", s.mean, s.std, s.min, s.max,
         s.nonfinite ? cat("  NON-FINITE ", s.nonfinite).c_str() : "");
  printf("time:    %.3f s forward (%d threads)\n", secs, num_threads());

  if (const auto& out = output) {
    write_safetensors(*out, {{"x", x}, {"t", t}, {"context", ctx}, {"velocity", v}},
                      {{"model", info.root},
                       {"role", role_name(role)},
                       {"seed", std::to_string(seed)},
                       {"layers", std::to_string(cfg.num_layers)}});
    printf("saved:   %s\n", out->c_str());
  }
  return s.nonfinite ? 1 : 0;
}

}  // namespace wan::cli
