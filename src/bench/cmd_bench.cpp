// `wan bench`: denoising-step timing of the GPU DiT at a task's real width with random weights drawn on
// the GPU (no files), batch 2 (cond + uncond, the batched CFG of a real step). Prints s/step, a per-op
// breakdown (GEMM, attention, everything else), achieved TFLOP/s against the FLOP count of
// ANCHORS.md, the floor and the gap, and the peak device memory; --json writes all of it.
// What is measured (say it, so numbers are never mistaken for something else):
// - s/step: whole DiTGpu forwards (CUDA-graph replay unless --no-graphs), CUDA events on the stream,
//   median of --steps after --warmup untimed forwards; with fewer layers than the preset has (40, or 30
//   for ti2v-5B), the full-depth figure is EXTRAPOLATED and printed as such (full_depth_step says how);
// - ti2v-5B runs its image mode's timesteps (latent frame 0's tokens at 0, the rest at t) unless --uniform-t;
// - the isolated breakdown (report_breakdown) and the in-step breakdown of the real forward
//   (report_in_step), each described where it is measured;
// - FLOPs and the floor as ANCHORS.md counts them (anchors_flops); --gemm fp8 times FP8 block GEMMs (one
//   GPU; the isolated breakdown, which times bf16 GEMMs, is then skipped).
// `--gpus N` and the parallel options time one layout on N GPUs instead (bench_parallel).
// In a build without CUDA the command parses its options and then fails with one clear error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/commands.h"
#include "api/commands.h"
#include "models/config.h"
#include "core/error.h"
#include "pipeline/files.h"

#include "runtime/dist/parallel_layout.h"
#include "runtime/memory_plan.h"

#ifdef WAN_HAVE_CUDA
#include "kernels/check.h"
#include "bench/dit_bench_gpu.h"
#include "models/dit/block_spill.h"
#include "kernels/gemm.h"
#include "kernels/rng.h"
#endif
#if defined(WAN_HAVE_CUDA) && defined(WAN_HAVE_NCCL)
#include "runtime/dist/comm.h"
#include "runtime/dist/launch.h"
#include "pipeline/parallel_groups.h"
#endif

namespace wan::cli {
namespace {

using Geometry = StepGeometry;

// The command line, read and checked before any device work (in this order: the first bad value is the error).
struct BenchSettings {
  std::string task;
  DiTConfig full;
  Geometry geo;
  std::vector<int> layer_counts;
  long long steps = 0, warmup = 0, batch = 0, seed = 0, reps = 0, device = 0, profile_reps = 0;
  bool graphs = true, breakdown = true, verbose = false, one_latent = true, error_vs_exact = false;
  bool first_frame_t = false;  // TI2V image mode: latent frame 0's tokens at t_first = 0 (DiTShape::first_frame_t)
  std::string json_path, attention_name, gemm;  // gemm: "bf16" | "fp8" (api::gemm_from)
  // --memory-budget: the task's experts (2 for A14B, as a generation holds them) with the fastest weight
  // residency whose plan fits it (0: one expert, resident).
  int64_t memory_budget = 0;
  int64_t host_memory_budget = 0;  // --host-memory-budget: the pinned host memory that residency may hold (0: any)
};

BenchSettings parse_settings(const api::Values& args) {
  BenchSettings o;
  o.task = task_name(task_from_name(args.get_or("task", "t2v-A14B")));
  o.full = dit_preset(o.task);
  o.geo = step_geometry(o.task, o.full, args.get_or("size", default_step_size(o.task)),
                        args.get_int("frames", default_step_frames(o.task)));
  o.layer_counts = parse_layer_counts(args.get_or("layers", std::to_string(o.full.num_layers)), o.full.num_layers);
  o.steps = args.get_int("steps", 3), o.warmup = args.get_int("warmup", 2);
  o.batch = args.get_int("batch", 2), o.seed = args.get_int("seed", 0);
  o.reps = args.get_int("breakdown-reps", 3), o.device = args.device("device");
  o.profile_reps = args.get_int("profile-reps", 2);
  o.graphs = !args.flag("no-graphs"), o.breakdown = !args.flag("no-breakdown");
  o.verbose = args.flag("verbose");
  o.error_vs_exact = args.flag("error-vs-exact");
  o.one_latent = !args.flag("distinct-latents");
  o.first_frame_t = o.task == "ti2v-5B" && !args.flag("uniform-t");
  o.json_path = args.get_or("json", "");
  if (!o.json_path.empty()) check_output_path(o.json_path, "--json");  // before any work
  o.attention_name = api::attention_from(args);
  o.gemm = api::gemm_from(args);
  if (auto b = args.get("memory-budget")) o.memory_budget = api::parse_memory_size(*b, "memory-budget");
  if (auto b = args.get("host-memory-budget"))
    o.host_memory_budget = api::parse_memory_size(*b, "host-memory-budget");
  if (o.memory_budget > 0) o.breakdown = false;  // the isolated ops hold their own weights
  if (args.str("precision") == "fp8") printf("%s\n", api::kPrecisionFp8Note);
  if (o.gemm == "fp8" || o.attention_name == "own-fp8") o.breakdown = false;  // its isolated ops run bf16
  return o;
}

#ifdef WAN_HAVE_CUDA

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// ANCHORS.md rates (H100, measured): FA3-class attention and cuBLAS bf16 GEMM; cuDNN SDPA.
constexpr double kAttnRate = 650e12, kGemmRate = 770e12, kCudnnAttnRate = 567e12;

// ANCHORS.md: self-attention 4·L²·dim per block per sample; linear layers 2·L·(6·dim² + 2·dim·ffn) per
// block per sample (q, k, v, o, cross q, o, FFN). Cross-attention, the text k/v and the embeddings are not
// counted (as in ANCHORS). Floor: attention at 650 TFLOP/s + GEMMs at 770.
struct Flops {
  double self_attn = 0, linear = 0;
  double total() const { return self_attn + linear; }
};
Flops anchors_flops(const DiTConfig& c, int64_t batch, int64_t tokens, int layers) {
  const double L = static_cast<double>(tokens), D = c.dim, F = c.ffn_dim, n = static_cast<double>(batch) * layers;
  return {n * 4.0 * L * L * D, n * 2.0 * L * (6.0 * D * D + 2.0 * D * F)};
}

// The step's latent shape; the TI2V image mode's per-token timesteps when asked for.
cuda::DiTShape step_shape(const BenchSettings& o) {
  cuda::DiTShape s{o.batch, o.geo.T, o.geo.H, o.geo.W, o.one_latent};
  s.first_frame_t = o.first_frame_t;
  return s;
}

// How the step's timesteps are laid out, for the printout and the JSON.
std::string timesteps_text(const cuda::DiTShape& shape, const Geometry& geo) {
  if (!shape.first_frame_t) return cat("per sample: t = ", cuda::kBenchTimestep, " for every token");
  return cat("per token (TI2V image mode): latent frame 0's ", geo.first_frame_tokens, " tokens at t_first = ",
             cuda::kBenchFirstFrameTimestep, ", the other ", geo.tokens - geo.first_frame_tokens, " at t = ",
             cuda::kBenchTimestep);
}

// The fields every `wan bench` JSON starts with (tool, commit, date, device, the run's geometry).
void put_header(nlohmann::json& J, const cuda::BenchDevice& bd, const std::string& task, const Geometry& geo,
                const cuda::DiTShape& shape, bool graphs, const std::string& attention_used, const DiTConfig& full,
                int layers) {
  const char* commit = std::getenv("WAN_COMMIT");
  J["tool"] = "wan bench";
  J["commit"] = commit ? commit : "unknown";
  J["date"] = utc_now();
  J["device"] = {{"name", bd.name}, {"sm_count", bd.sm_count}, {"memory_gib", bd.total_bytes / kGiB},
                 {"driver", bd.driver_version}, {"runtime", bd.runtime_version}, {"cudnn", bd.cudnn_version},
                 {"cublaslt", bd.cublaslt_version}};
  J["task"] = task;
  J["size"] = {geo.width, geo.height};
  J["frames"] = geo.frames;
  J["latent"] = {geo.T, geo.H, geo.W};
  J["tokens_per_sample"] = geo.tokens;
  J["batch"] = shape.batch;
  J["one_latent"] = shape.one_latent;  // every sample's latent is the first (the samplers' CFG batch)
  J["first_frame_t"] = shape.first_frame_t;
  J["timesteps"] = timesteps_text(shape, geo);
  J["graphs"] = graphs;
  J["attention"] = attention_used;
  J["config"] = {{"dim", full.dim},         {"ffn_dim", full.ffn_dim},       {"heads", full.num_heads},
                 {"layers", layers},        {"preset_layers", full.num_layers}, {"in_dim", full.in_dim},
                 {"out_dim", full.out_dim}, {"text_len", full.text_len}};
}
#endif  // WAN_HAVE_CUDA

#if defined(WAN_HAVE_CUDA) && defined(WAN_HAVE_NCCL)
// What rank 0 of a parallel run gathered (rank0 false in every other process).
struct ParallelRuns {
  std::vector<cuda::ForwardTiming> runs;
  std::vector<double> step_ms;  // per layer count: the slowest rank's median
  dist::Layout layout;
  cuda::BenchDevice bd;
  std::string attention_used;
  bool rank0 = false;
};

// Every rank builds and times the model per layer count; rank 0 prints and keeps the results.
ParallelRuns run_parallel(const api::Values& args, const BenchSettings& o, const cuda::DiTShape& shape) {
  using namespace wan::cuda;
  const dist::LaunchOptions lo = dist::parse_launch_options(args.get_or("gpus", ""), args.get_or("devices", ""));
  const bool cfg_flag = args.flag("cfg-parallel");
  const long long U = args.get_int("ulysses", 0), R = args.get_int("ring", 0);
  WAN_CHECK(U >= 0 && U <= 1024 && R >= 0 && R <= 1024, "--ulysses / --ring: expected 1..1024");
  const DiTGpu::Attention attention_req = DiTGpu::parse_attention(o.attention_name);
  const int steps = static_cast<int>(o.steps), warmup = static_cast<int>(o.warmup);
  const DiTConfig& full = o.full;
  const Geometry& geo = o.geo;
  ParallelRuns p;
  dist::launch(lo, [&](dist::RankContext& ctx) {
    const dist::Layout l = dist::resolve_layout(ctx.world, full.num_heads, cfg_flag, static_cast<int>(U),
                                                static_cast<int>(R), o.batch == 2);
    const DiTGpu::Attention attention = DiTGpu::resolve_attention(attention_req);
    if (ctx.rank == 0) {
      p.layout = l, p.rank0 = true, p.bd = bench_device(ctx.device);
      p.attention_used = cuda::attention_label(attention);
      printf("wan bench: %s %lldx%lld, %lld frames, %lld tokens/sample, batch %lld, %d GPUs: %s, %s attention\n",
             o.task.c_str(), (long long)geo.width, (long long)geo.height, (long long)geo.frames, (long long)geo.tokens,
             o.batch, ctx.world, dist::describe(l).c_str(), p.attention_used.c_str());
      fflush(stdout);
    }
    const dist::ParallelGroups groups = dist::make_groups(ctx.comm, l, [&](ncclComm_t c) { ctx.register_comm(c); });
    dist::Comm world(ctx.comm, false);
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    try {
      for (int n : o.layer_counts) {
        DiTConfig c = full;
        c.num_layers = n;
        const ForwardTiming r = time_forward(c, shape, warmup, steps, o.graphs, static_cast<uint64_t>(o.seed),
                                             ctx.device, o.verbose && ctx.rank == 0, attention, groups.view());
        ctx.check_abort();
        const double slowest = world.all_reduce_max_host(r.median_ms, s);
        ctx.check_abort();
        if (ctx.rank == 0) {
          printf("layers %2d: %10.2f ms/step (slowest rank's median; rank 0: median %.2f, min %.2f; %d timed after %d "
                 "warm-up, %s)  create %.1f s, warm-up %.1f s\n",
                 n, slowest, r.median_ms, r.min_ms, steps, warmup, o.graphs ? "graph replay" : "eager", r.create_s,
                 r.warmup_s);
          fflush(stdout);
          p.runs.push_back(r);
          p.step_ms.push_back(slowest);
        }
      }
    } catch (...) {
      cudaStreamDestroy(s);
      throw;
    }
    CUDA_CHECK(cudaStreamDestroy(s));
  });
  return p;
}

// Rank 0: the step at the model's full depth (measured or extrapolated as on one GPU), printed and as JSON.
void report_parallel(const BenchSettings& o, const cuda::DiTShape& shape, const ParallelRuns& p) {
  const std::vector<cuda::ForwardTiming>& runs = p.runs;
  const std::vector<double>& step_ms = p.step_ms;
  const int target = o.full.num_layers;
  size_t lo_i = 0, hi_i = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].layers < runs[lo_i].layers) lo_i = i;
    if (runs[i].layers > runs[hi_i].layers) hi_i = i;
  }
  double step_s = 0, per_block_ms = 0;
  std::string method;
  nlohmann::json J;
  if (runs[hi_i].layers == target) {
    step_s = step_ms[hi_i] / 1e3;
    method = cat("measured (", target, " layers)");
  } else if (runs[hi_i].layers != runs[lo_i].layers) {
    per_block_ms = (step_ms[hi_i] - step_ms[lo_i]) / (runs[hi_i].layers - runs[lo_i].layers);
    J["per_block_ms"] = per_block_ms;
    J["fixed_ms"] = step_ms[lo_i] - runs[lo_i].layers * per_block_ms;
    step_s = per_block_ms * target / 1e3;
    method = cat("extrapolated: (t", runs[hi_i].layers, " - t", runs[lo_i].layers, ")/",
                 runs[hi_i].layers - runs[lo_i].layers, " per block x ", target,
                 " (ANCHORS.md method, non-block time excluded)");
  } else {
    step_s = step_ms[lo_i] * target / runs[lo_i].layers / 1e3;
    method = cat("extrapolated proportionally from ", runs[lo_i].layers, " layer(s)");
  }
  if (runs[hi_i].layers != runs[lo_i].layers) {
    const double pb = (step_ms[hi_i] - step_ms[lo_i]) / (runs[hi_i].layers - runs[lo_i].layers);
    J["extrapolated_step_s"] = pb * target / 1e3;
  }
  const dist::Layout& layout = p.layout;
  printf("s/step at %d layers on %d GPUs (%s): %.3f s  [%s]\n", target, layout.world(), dist::describe(layout).c_str(),
         step_s, method.c_str());
  const Flops fl = anchors_flops(o.full, o.batch, o.geo.tokens, target);
  printf("achieved: %.1f TFLOP/s per GPU over the step (ANCHORS FLOP count)\n", fl.total() / step_s / 1e12 / layout.world());
  put_header(J, p.bd, o.task, o.geo, shape, o.graphs, p.attention_used, o.full, target);
  J["parallel"] = {{"gpus", layout.world()}, {"cfg", layout.cfg}, {"ulysses", layout.ulysses}, {"ring", layout.ring},
                   {"timing", "per layer count: the slowest rank's median of CUDA-event step times"}};
  nlohmann::json jruns = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    const cuda::ForwardTiming& r = runs[i];
    jruns.push_back({{"layers", r.layers},
                     {"median_ms", step_ms[i]},
                     {"rank0_step_ms", r.step_ms},
                     {"rank0_median_ms", r.median_ms},
                     {"create_s", r.create_s},
                     {"warmup_s", r.warmup_s},
                     {"plan_total_bytes", r.plan.total_bytes()},
                     {"rank0_device_used_peak_bytes", r.device_used_peak}});
  }
  J["runs"] = jruns;
  J["step_s"] = {{"layers", target}, {"value", step_s}, {"method", method}};
  J["achieved_tflops_per_gpu"] = fl.total() / step_s / 1e12 / layout.world();
  if (!o.json_path.empty()) write_json_file(o.json_path, J);
}
#endif  // WAN_HAVE_CUDA && WAN_HAVE_NCCL

#ifdef WAN_HAVE_CUDA
// Any of the multi-GPU options: the step of one parallel layout instead.
bool wants_parallel(const api::Values& args) {
  return args.get("gpus") || args.get("devices") || args.get("ulysses") || args.get("ring") ||
         args.flag("cfg-parallel");
}

// `wan bench --gpus N [--cfg-parallel] [--ulysses U] [--ring R]`: the step of one layout on N GPUs. Every
// rank times its own forwards (CUDA events, as one GPU); a step's time is the maximum of the ranks'
// medians (the slowest rank sets the pace). The full-depth figure is measured or extrapolated like the
// single-GPU bench, by the same method, so the two are comparable (efficiency = t1 / (N · tN)).
int bench_parallel(const api::Values& args, const BenchSettings& o) {
#ifndef WAN_HAVE_NCCL
  (void)args, (void)o;
  WAN_THROW("wan bench --gpus/--cfg-parallel/--ulysses/--ring: this wan was built without NCCL");
#else
  const cuda::DiTShape shape = step_shape(o);
  const ParallelRuns p = run_parallel(args, o, shape);
  if (!p.rank0) return 0;  // another process's rank 0 reports
  report_parallel(o, shape, p);
  return 0;
#endif  // WAN_HAVE_NCCL
}

// The single-GPU run's setup: the device, the attention kernel and the batch.
struct StepRig {
  int dev = 0;
  cuda::BenchDevice bd;
  cuda::DiTGpu::Attention attention{};
  const char* attention_used = "";
  cuda::DiTShape shape;
  int target_layers = 0;
  int experts = 1;
  cuda::WeightResidency residency;  // --memory-budget's choice
};

StepRig setup_device(const BenchSettings& o) {
  using namespace wan::cuda;
  StepRig r;
  r.dev = static_cast<int>(o.device);
  r.bd = bench_device(r.dev);
  CUDA_CHECK(cudaSetDevice(r.dev));
  r.attention = DiTGpu::resolve_attention(DiTGpu::parse_attention(o.attention_name));
  r.attention_used = cuda::attention_label(r.attention);
  WAN_CHECK(o.gemm == "bf16" || fp8_supported(r.dev), "wan bench --gemm fp8: device ", r.dev,
            " has no FP8 GEMMs through cuBLASLt (they need an sm_90 GPU)");
  r.shape = step_shape(o);
  r.target_layers = o.full.num_layers;
  if (o.memory_budget > 0) {
    WAN_CHECK(o.layer_counts.size() == 1, "wan bench --memory-budget: one --layers count");
    r.experts = task_from_name(o.task) == Task::TI2V_5B ? 1 : 2;  // A14B: both experts, as a generation holds them
    const size_t budget = static_cast<size_t>(o.memory_budget);
    WAN_CHECK(budget <= r.bd.total_bytes, "wan bench --memory-budget ", memory_str(budget), " is more than device ",
              r.dev, "'s ", memory_str(r.bd.total_bytes));
    DiTConfig c = o.full;
    c.num_layers = o.layer_counts.front();
    size_t smallest = SIZE_MAX;
    bool found = false;
    std::string host_refused;
    // As generate's plan: the budget bounds the memory in use, the context's included; the host budget
    // bounds the pinned memory, and a spill file needs room in its folder.
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t held = total_b - free_b;
    for (const WeightResidency& w : DiTGpu::residencies(r.experts)) {
      const MemoryPlan mp = DiTGpu::plan(c, r.shape, r.experts, 0, {}, DiTGpu::parse_gemm(o.gemm), w);
      const size_t need = held + mp.total_bytes();
      smallest = std::min(smallest, need);
      if (need > budget) continue;
      if (o.host_memory_budget > 0 && mp.host_weight_bytes() > static_cast<size_t>(o.host_memory_budget)) {
        host_refused = cat("; ", w.str(), " pins ", memory_str(mp.host_weight_bytes()), " of host memory, more than "
                           "--host-memory-budget ", memory_str(static_cast<size_t>(o.host_memory_budget)));
        continue;
      }
      if (mp.disk_bytes() > 0 && spill_free_bytes(spill_dir()) < mp.disk_bytes() + (size_t{1} << 30)) {
        host_refused = cat("; ", w.str(), " needs ", memory_str(mp.disk_bytes()), " free in ", spill_dir());
        continue;
      }
      r.residency = w;
      found = true;
      break;
    }
    WAN_CHECK(found, "wan bench --memory-budget ", memory_str(budget), ": no weight residency fits (the smallest "
              "plan needs ", memory_str(smallest), " with the ", memory_str(held), " in use before it", host_refused,
              ")");
    printf("memory budget %s: %d expert(s), weights %s\n", memory_str(budget).c_str(), r.experts,
           r.residency.str().c_str());
  }
  return r;
}

void print_intro(const BenchSettings& o, const StepRig& r) {
  const Geometry& geo = o.geo;
  const cuda::BenchDevice& bd = r.bd;
  printf("wan bench: %s %lldx%lld, %lld frames -> latent %dx%lldx%lldx%lld, %lld tokens/sample, batch %lld, "
         "dim %d, ffn %d, %d layers in the preset, random weights (seed %lld)\n",
         o.task.c_str(), (long long)geo.width, (long long)geo.height, (long long)geo.frames, o.full.in_dim,
         (long long)geo.T, (long long)geo.H, (long long)geo.W, (long long)geo.tokens, o.batch, o.full.dim,
         o.full.ffn_dim, o.full.num_layers, o.seed);
  printf("attention: %s; %s GEMMs; %s; timesteps %s\n", r.attention_used, o.gemm == "fp8" ? "FP8 block" : "bf16",
         r.shape.one_latent ? "one latent for every sample (the first block's self-attention runs once)"
                            : "a latent per sample (--distinct-latents)",
         timesteps_text(r.shape, geo).c_str());
  printf("device %d: %s, %d SMs, %.1f GiB; driver %d, runtime %d, cuDNN %d, cuBLASLt %d\n", r.dev, bd.name.c_str(),
         bd.sm_count, bd.total_bytes / kGiB, bd.driver_version, bd.runtime_version, bd.cudnn_version,
         bd.cublaslt_version);
  fflush(stdout);
}

// The breakdown first, in its own allocation, freed before any model exists.
cuda::IsolatedTimings run_breakdown(const BenchSettings& o, const StepRig& r) {
  cuda::IsolatedTimings iso;
  if (!o.breakdown) return iso;
  DiTConfig one = o.full;
  one.num_layers = 1;
  iso = cuda::time_ops_isolated(one, r.shape, static_cast<int>(o.reps), static_cast<uint64_t>(o.seed) + 17, r.dev,
                                r.attention);
  if (!iso.graph_error.empty()) printf("graph-captured breakdown unavailable: %s\n", iso.graph_error.c_str());
  return iso;
}

// Whole forwards per layer count; after the timed steps of the deepest model, its in-step profile.
struct LayerRuns {
  std::vector<cuda::ForwardTiming> runs;
  std::vector<cuda::OpProfile> profiles;
  int profile_layers = 0;
  const cuda::ForwardTiming *lo = nullptr, *hi = nullptr;  // the fewest and the most layers (the profiled one)
};

nlohmann::json run_json(const cuda::ForwardTiming& r, int n, long long warmup) {
  return {{"layers", n},
          {"step_ms", r.step_ms},
          {"median_ms", r.median_ms},
          {"mean_ms", r.mean_ms},
          {"min_ms", r.min_ms},
          {"warmup", warmup},
          {"create_s", r.create_s},
          {"warmup_s", r.warmup_s},
          {"plan",
           {{"arena_bytes", r.plan.arena_bytes},
            {"weight_bytes", r.plan.weight_bytes},
            {"reserve_bytes", r.plan.reserve_bytes},
            {"total_bytes", r.plan.total_bytes()}}},
          {"device_used_before_bytes", r.device_used_before},
          {"device_used_peak_bytes", r.device_used_peak},
          {"residency", r.plan.residency.str()},
          {"experts", r.plan.experts},
          {"device_weight_bytes", r.plan.device_weight_bytes()},
          {"host_weight_bytes", r.plan.host_weight_bytes()}};
}

void time_layer_counts(const BenchSettings& o, const StepRig& rig, LayerRuns& out, nlohmann::json& J) {
  using namespace wan::cuda;
  nlohmann::json jruns = nlohmann::json::array();
  out.profile_layers = *std::max_element(o.layer_counts.begin(), o.layer_counts.end());
  bool profiled = false;  // profile_layers done (a repeated count is profiled once)
  for (int n : o.layer_counts) {
    DiTConfig c = o.full;
    c.num_layers = n;
    AfterSteps profile;
    if (o.profile_reps > 0 && n == out.profile_layers && !profiled) {
      profiled = true;
      profile = [&](DiTGpu& gpu, const DiTInputs& in, float* y, cudaStream_t s) {
        for (long long i = 0; i < o.profile_reps; ++i)
          out.profiles.push_back(gpu.profile_forward(0, rig.shape, in, y, s));
      };
    }
    const ForwardTiming r = time_forward(c, rig.shape, static_cast<int>(o.warmup), static_cast<int>(o.steps), o.graphs,
                                         static_cast<uint64_t>(o.seed), rig.dev, o.verbose, rig.attention, {}, profile,
                                         DiTGpu::parse_gemm(o.gemm), rig.residency, rig.experts);
    printf("layers %2d: median %10.2f ms/step (mean %.2f, min %.2f; %lld timed after %lld warm-up, %s)  "
           "create %.1f s, warm-up %.1f s\n",
           n, r.median_ms, r.mean_ms, r.min_ms, o.steps, o.warmup,
           o.graphs && !rig.residency.disk ? "graph replay" : "eager", r.create_s, r.warmup_s);
    fflush(stdout);
    jruns.push_back(run_json(r, n, o.warmup));
    out.runs.push_back(r);
  }
  J["runs"] = jruns;
  out.lo = out.hi = &out.runs.front();
  for (const ForwardTiming& r : out.runs) {
    if (r.layers < out.lo->layers) out.lo = &r;
    if (r.layers > out.hi->layers) out.hi = &r;
  }
}

// The step at the model's full depth: measured, or extrapolated (and labelled so). Returns seconds. With
// two or more layer counts by ANCHORS.md's method, (t_b - t_a)/(b - a) per block x the preset's layers (non-block time
// excluded, as the peers were measured); with one count from its per-block share after subtracting the
// isolated non-block time.
double full_depth_step(const BenchSettings& o, const LayerRuns& lr, const cuda::OpBreakdown& br, int target_layers,
                       nlohmann::json& J) {
  using cuda::OpKind;
  double step_s = 0, per_block_ms = 0, fixed_ms = 0;
  std::string method;
  const cuda::ForwardTiming* full_run = nullptr;
  const cuda::ForwardTiming *lo = lr.lo, *hi = lr.hi;
  for (const cuda::ForwardTiming& r : lr.runs)
    if (r.layers == target_layers) full_run = &r;
  if (hi->layers != lo->layers) {
    per_block_ms = (hi->median_ms - lo->median_ms) / (hi->layers - lo->layers);
    fixed_ms = lo->median_ms - lo->layers * per_block_ms;
    J["per_block_ms"] = per_block_ms;
    J["fixed_ms"] = fixed_ms;
    J["extrapolated_step_s"] = per_block_ms * target_layers / 1e3;
    printf("per block (t%d - t%d)/%d: %.2f ms; non-block part %.2f ms\n", hi->layers, lo->layers,
           hi->layers - lo->layers, per_block_ms, fixed_ms);
  }
  if (full_run) {
    step_s = full_run->median_ms / 1e3;
    method = cat("measured (", target_layers, " layers)");
  } else if (hi->layers != lo->layers) {
    step_s = per_block_ms * target_layers / 1e3;
    method = cat("extrapolated: (t", hi->layers, " - t", lo->layers, ")/", hi->layers - lo->layers, " per block x ",
                 target_layers, " (ANCHORS.md method, non-block time excluded)");
  } else if (o.breakdown) {
    const double nb = br.nonblock_ms(OpKind::Gemm) + br.nonblock_ms(OpKind::Attention) + br.nonblock_ms(OpKind::Other);
    const double pb = (lo->median_ms - nb) / lo->layers;
    step_s = (nb + pb * target_layers) / 1e3;
    method = cat("extrapolated from ", lo->layers, " layer(s): isolated non-block time + ", target_layers,
                 " x the remaining per-block time");
  } else {
    step_s = lo->median_ms * target_layers / lo->layers / 1e3;
    method = cat("extrapolated proportionally from ", lo->layers, " layer(s)");
  }
  printf("s/step at %d layers: %.3f s  [%s]\n", target_layers, step_s, method.c_str());
  J["step_s"] = {{"layers", target_layers}, {"value", step_s}, {"method", method}};
  return step_s;
}

// FLOPs, achieved rates, floor and gap (at the full depth).
void report_flops(const BenchSettings& o, int target_layers, double step_s, nlohmann::json& J) {
  const Flops fl = anchors_flops(o.full, o.batch, o.geo.tokens, target_layers);
  const double floor_s = fl.self_attn / kAttnRate + fl.linear / kGemmRate;
  const double floor_cudnn_s = fl.self_attn / kCudnnAttnRate + fl.linear / kGemmRate;
  printf("FLOPs/step (ANCHORS count, %d layers): self-attention %.3f PFLOP + linear %.3f PFLOP = %.3f PFLOP\n",
         target_layers, fl.self_attn / 1e15, fl.linear / 1e15, fl.total() / 1e15);
  printf("achieved: %.1f TFLOP/s over the step; floor %.2f s (attention 650 + GEMM 770 TFLOP/s), step/floor %.3f "
         "(gap %.2f s); floor at cuDNN-speed attention (567) %.2f s, step/floor %.3f\n",
         fl.total() / step_s / 1e12, floor_s, step_s / floor_s, step_s - floor_s, floor_cudnn_s,
         step_s / floor_cudnn_s);
  J["flops"] = {{"self_attention", fl.self_attn}, {"linear", fl.linear}, {"total", fl.total()}, {"layers", target_layers}};
  J["achieved_tflops_step"] = fl.total() / step_s / 1e12;
  J["floor_s"] = {{"attn650_gemm770", floor_s}, {"attn567_gemm770", floor_cudnn_s}};
  J["step_over_floor"] = step_s / floor_s;
}

// The per-op table (graph-captured and eager times side by side); fills the two JSON op lists.
void print_op_table(const cuda::IsolatedTimings& iso, const cuda::OpBreakdown& br, nlohmann::json& jops,
                    nlohmann::json& jeager) {
  using namespace wan::cuda;
  const bool both = !iso.graph.ops.empty();
  printf("per-op breakdown (ops timed in isolation: one block's op sequence and the non-block ops on same-shape\n"
         "buffers, CUDA events between ops, median of %d; 'graph' = captured once with event nodes between the ops\n"
         "and replayed, as the step runs; 'eager' = launched op by op; 'other' = neither GEMM nor attention):\n",
         br.reps);
  printf("  %-38s %-9s %-9s %10s %10s %9s\n", "op", "kind", "count", "graph ms", "eager ms", "TFLOP/s");
  auto row_json = [](const OpTime& o) {
    return nlohmann::json{{"name", o.name}, {"kind", op_kind_name(o.kind)}, {"per_block", o.per_block},
                          {"ms", o.ms}, {"flops", o.flops}};
  };
  jops = nlohmann::json::array(), jeager = nlohmann::json::array();
  for (size_t i = 0; i < iso.eager.ops.size(); ++i) {
    const OpTime& e = iso.eager.ops[i];
    const OpTime& o = br.ops[i];
    const double tf = o.flops > 0 && o.ms > 0 ? o.flops / (o.ms * 1e-3) / 1e12 : 0;
    char rate[32] = "", gms[32] = "-";
    if (tf > 0) std::snprintf(rate, sizeof rate, "%9.1f", tf);
    if (both) std::snprintf(gms, sizeof gms, "%10.3f", o.ms);
    printf("  %-38s %-9s %-9s %10s %10.3f %9s\n", o.name.c_str(), op_kind_name(o.kind),
           o.per_block ? "per block" : "per step", gms, e.ms, rate);
    jops.push_back(row_json(o));
    jeager.push_back(row_json(e));
  }
}

// The isolated breakdown (src/bench/dit_bench_gpu.h): one block's op sequence and the non-block ops
// replayed with events between ops; "other" is everything that is neither a GEMM nor an attention. The
// residual "measured step - isolated GEMM - isolated attention" is also printed, since graph replay hides
// launch gaps that the isolated replay cannot. Reported: per-block sums, the step they model, achieved rates, and the share outside GEMM
// and attention, printed and under J["breakdown"].
void report_breakdown(const cuda::IsolatedTimings& iso, const cuda::OpBreakdown& br, int target_layers, double step_s,
                      nlohmann::json& J) {
  using namespace wan::cuda;
  const bool both = !iso.graph.ops.empty();
  nlohmann::json jops, jeager;
  print_op_table(iso, br, jops, jeager);
  auto sums = [](const OpBreakdown& b) {
    return std::vector<double>{b.block_ms(OpKind::Gemm), b.block_ms(OpKind::Attention), b.block_ms(OpKind::Other)};
  };
  const std::vector<double> bs = sums(br), es = sums(iso.eager);
  const double bg = bs[0], ba = bs[1], bo = bs[2];
  const double ng = br.nonblock_ms(OpKind::Gemm), na = br.nonblock_ms(OpKind::Attention),
               no = br.nonblock_ms(OpKind::Other);
  const double bsum = bg + ba + bo;
  printf("  per block (%s): GEMM %.2f ms (%.1f%%), attention %.2f ms (%.1f%%), other %.2f ms (%.1f%%); sum %.2f ms, "
         "block between two events %.2f ms\n",
         br.mode.c_str(), bg, 100 * bg / bsum, ba, 100 * ba / bsum, bo, 100 * bo / bsum, bsum, br.block_total_ms);
  if (both)
    printf("  per block (eager): GEMM %.2f ms, attention %.2f ms, other %.2f ms; block between two events %.2f ms\n",
           es[0], es[1], es[2], iso.eager.block_total_ms);
  const int N = target_layers;
  const double sg = (N * bg + ng) / 1e3, sa = (N * ba + na) / 1e3, so = (N * bo + no) / 1e3;
  const double modeled = sg + sa + so;
  printf("  per step at %d layers (isolated %s model: %d x block + non-block): GEMM %.3f s, attention %.3f s, "
         "other %.3f s = %.3f s (step above %.3f s)\n",
         N, br.mode.c_str(), N, sg, sa, so, modeled, step_s);
  // Self-attention and the block GEMMs at their own rates (the ANCHORS FLOPs of those ops).
  double self_ms = 0, self_fl = 0;
  for (const OpTime& o : br.ops)
    if (o.kind == OpKind::Attention && o.name.rfind("self", 0) == 0) self_ms += o.ms, self_fl += o.flops;
  const double gemm_tf = br.block_flops(OpKind::Gemm) / (bg * 1e-3) / 1e12;
  const double self_tf = self_ms > 0 ? self_fl / (self_ms * 1e-3) / 1e12 : 0;
  const double other_iso = so / modeled;
  const double other_resid = (step_s - sg - sa) / step_s;
  printf("  achieved (isolated %s): block GEMMs %.1f TFLOP/s, self-attention %.1f TFLOP/s (kernel: %s)\n",
         br.mode.c_str(), gemm_tf, self_tf, iso.self_attention_engine.c_str());
  printf("  time outside GEMM and attention: %.1f%% of the isolated model; measured step minus isolated GEMM and "
         "attention: %.1f%% (target <= 8%%)\n",
         100 * other_iso, 100 * other_resid);
  J["breakdown"] = {
      {"method", "isolated: one block's op sequence and the non-block ops with the engine's kernels on same-shape "
                 "buffers, CUDA events between ops, median over reps; 'ops' from the graph-captured replay (event "
                 "nodes between ops) when available, 'eager_ops' launched op by op"},
      {"mode", br.mode},
      {"graph_error", iso.graph_error},
      {"reps", br.reps},
      {"ops", jops},
      {"eager_ops", jeager},
      {"block_ms", {{"gemm", bg}, {"attention", ba}, {"other", bo}, {"events_total", br.block_total_ms}}},
      {"eager_block_ms", {{"gemm", es[0]}, {"attention", es[1]}, {"other", es[2]},
                          {"events_total", iso.eager.block_total_ms}}},
      {"nonblock_ms", {{"gemm", ng}, {"attention", na}, {"other", no}}},
      {"step_s", {{"layers", N}, {"gemm", sg}, {"attention", sa}, {"other", so}, {"modeled", modeled}}},
      {"achieved_tflops", {{"block_gemm", gemm_tf}, {"self_attention", self_tf}}},
      {"self_attention_engine", iso.self_attention_engine},
      {"other_fraction", {{"isolated_model", other_iso}, {"measured_residual", other_resid}}}};
}

// The in-step profile's medians per category, in seconds.
struct InStep {
  double tot = 0, gm = 0, sa = 0, ca = 0, ot = 0;
};

InStep in_step_medians(const std::vector<cuda::OpProfile>& profiles) {
  using cuda::OpProfile;
  auto med = [&](double (*field)(const OpProfile&)) {
    std::vector<double> v;
    for (const OpProfile& p : profiles) v.push_back(field(p) / 1e3);
    return median_of(v);
  };
  InStep m;
  m.tot = med([](const OpProfile& p) { return p.total_ms; });
  m.gm = med([](const OpProfile& p) { return p.gemm_ms; });
  m.sa = med([](const OpProfile& p) { return p.self_attention_ms; });
  m.ca = med([](const OpProfile& p) { return p.cross_attention_ms; });
  m.ot = med([](const OpProfile& p) { return p.other_ms(); });
  return m;
}

std::string in_step_method(const LayerRuns& lr, long long batch, int target_layers) {
  const cuda::OpProfile& p0 = lr.profiles.front();
  std::string pmethod =
      cat("DiTGpu::profile_forward: ", lr.profiles.size(), " eager forward(s) of the batch-", batch, " step (",
          lr.profile_layers, " layers) right after the timed steps, same model, inputs and stream; CUDA events around "
          "each of its ", p0.gemms, " GEMMs, ", p0.self_attentions, " self- and ", p0.cross_attentions,
          " cross-attentions; total = the forward's first to last event (input staging to output copy); other = "
          "total - GEMM - attention (every other kernel and the gaps); median per category");
  if (lr.profile_layers != target_layers)
    pmethod += cat("; the ", target_layers, "-layer step is extrapolated, so this profiles the ", lr.profile_layers,
                   "-layer forward that ran (its once-per-forward ops weigh more than in the full step)");
  return pmethod;
}

// The in-step breakdown (--profile-reps): after the timed steps, the model with the most layers asked for
// ran eager forwards of the same batch-2 step through DiTGpu::profile_forward, CUDA events around every
// GEMM and attention of the production code path, at the clocks the step ran at; median per category.
// "other" = first event to last minus GEMMs and attentions: every other kernel, the input and output
// copies and the gaps, the direct measurement of the "time outside attention and GEMMs".
void report_in_step(const BenchSettings& o, const LayerRuns& lr, int target_layers, nlohmann::json& J) {
  using cuda::OpProfile;
  const std::vector<OpProfile>& profiles = lr.profiles;
  const int profile_layers = lr.profile_layers;
  const InStep m = in_step_medians(profiles);
  const double tot = m.tot, gm = m.gm, sa = m.sa, ca = m.ca, ot = m.ot;
  const double frac = ot / tot;
  const cuda::ForwardTiming& prun = *lr.hi;  // the deepest model: the one profiled
  const double step_timed_s = prun.median_ms / 1e3;
  const char* step_mode = o.graphs ? "graph replay" : "eager";
  const OpProfile& p0 = profiles.front();
  printf("in-step breakdown (events around each GEMM and attention of the real forward, eager; %d layers, median of "
         "%zu):\n",
         profile_layers, profiles.size());
  printf("  %-16s %9.3f s %6.1f%%  (%d per forward)\n", "GEMM", gm, 100 * gm / tot, p0.gemms);
  printf("  %-16s %9.3f s %6.1f%%  (%d)\n", "self-attention", sa, 100 * sa / tot, p0.self_attentions);
  printf("  %-16s %9.3f s %6.1f%%  (%d)\n", "cross-attention", ca, 100 * ca / tot, p0.cross_attentions);
  printf("  %-16s %9.3f s %6.1f%%  (every other kernel, the input/output copies and the gaps)\n", "other", ot,
         100 * ot / tot);
  printf("  %-16s %9.3f s          first to last event; the timed step (%s, %d layers) %.3f s: profiled eager / "
         "timed = %.3f\n",
         "total", tot, step_mode, prun.layers, step_timed_s, tot / step_timed_s);
  if (profile_layers != target_layers)
    printf("  (the %d-layer step is extrapolated: these are the %d-layer forward's shares)\n", target_layers,
           profile_layers);
  printf("  time outside GEMM and attention in the real forward: %.1f%% (target <= 8%%)\n", 100 * frac);
  nlohmann::json per_rep = nlohmann::json::array();
  for (const OpProfile& p : profiles)
    per_rep.push_back({{"total_s", p.total_ms / 1e3}, {"gemm_s", p.gemm_ms / 1e3},
                       {"self_attention_s", p.self_attention_ms / 1e3},
                       {"cross_attention_s", p.cross_attention_ms / 1e3}, {"other_s", p.other_ms() / 1e3}});
  J["breakdown"]["in_step"] = {{"method", in_step_method(lr, o.batch, target_layers)},
                               {"reps", profiles.size()},
                               {"layers", profile_layers},
                               {"total_s", tot},
                               {"gemm_s", gm},
                               {"self_attention_s", sa},
                               {"cross_attention_s", ca},
                               {"other_s", ot},
                               {"other_fraction", frac},
                               {"graph_step_s", step_timed_s},
                               {"graph_step_mode", step_mode},
                               {"counts", {{"gemm", p0.gemms}, {"self_attention", p0.self_attentions},
                                           {"cross_attention", p0.cross_attentions}}},
                               {"per_rep", per_rep}};
  J["breakdown"]["other_fraction"]["in_step"] = frac;
}

// Memory: the plan (what create() reserved) and what the device showed at its fullest.
void report_memory(const LayerRuns& lr, nlohmann::json& J) {
  const cuda::ForwardTiming& deepest = *lr.hi;  // the most layers: the largest plan and the fullest device
  const size_t peak = deepest.device_used_peak, before = deepest.device_used_before;
  printf("memory (%d layers): plan %.2f GiB = weights %.2f (%d expert(s), %s) + activations %.2f + reserve %.2f; "
         "device used at peak %.2f GiB (cudaMemGetInfo; %.2f GiB before create); pinned host %.2f GiB\n",
         deepest.layers, deepest.plan.total_bytes() / kGiB, deepest.plan.device_weight_bytes() / kGiB,
         deepest.plan.experts, deepest.plan.residency.str().c_str(), deepest.plan.arena_bytes / kGiB,
         deepest.plan.reserve_bytes / kGiB, peak / kGiB, before / kGiB, deepest.plan.host_weight_bytes() / kGiB);
  J["peak_memory"] = {{"device_used_peak_bytes", peak},
                      {"device_used_before_bytes", before},
                      {"plan_total_bytes", deepest.plan.total_bytes()},
                      {"layers", deepest.layers}};
}

// One GPU: the breakdown, the timed forwards, then the step, its FLOPs, breakdowns and memory reported.
int bench_single(const BenchSettings& o) {
  const StepRig rig = setup_device(o);
  nlohmann::json J;
  put_header(J, rig.bd, o.task, o.geo, rig.shape, o.graphs && !rig.residency.disk, rig.attention_used, o.full, rig.target_layers);
  J["gemm"] = o.gemm;
  J["memory_budget_bytes"] = o.memory_budget;
  print_intro(o, rig);
  const cuda::IsolatedTimings iso = run_breakdown(o, rig);
  // The step runs as a graph replay: the graph-captured breakdown is the one to compare with it.
  const cuda::OpBreakdown& br = iso.graph.ops.empty() ? iso.eager : iso.graph;
  LayerRuns lr;
  time_layer_counts(o, rig, lr, J);
  const double step_s = full_depth_step(o, lr, br, rig.target_layers, J);
  report_flops(o, rig.target_layers, step_s, J);
  if (o.breakdown) report_breakdown(iso, br, rig.target_layers, step_s, J);
  if (!lr.profiles.empty()) report_in_step(o, lr, rig.target_layers, J);
  report_memory(lr, J);
  if (o.error_vs_exact) {
    const double e = cuda::forward_error_vs_exact(o.full, rig.shape, static_cast<uint64_t>(o.seed), rig.dev,
                                                  rig.attention, cuda::DiTGpu::parse_gemm(o.gemm));
    printf("error vs exact: %d-block forward output, relative L2 %.4e\n", o.full.num_layers, e);
    J["error_vs_exact"] = {{"layers", o.full.num_layers}, {"rel_l2", e}};
  }
  if (!o.json_path.empty()) write_json_file(o.json_path, J);
  return 0;
}
#endif  // WAN_HAVE_CUDA

}  // namespace

int cmd_bench(int argc, char** argv) {
  const api::Values args = api::parse_argv(bench_spec(), argc, argv);
  if (api::print_help_if_asked(args, bench_spec())) return 0;
  const BenchSettings o = parse_settings(args);
#ifndef WAN_HAVE_CUDA
  (void)o;
  WAN_THROW("wan bench: this wan was built without CUDA; rebuild with a CUDA toolkit (WAN_ENABLE_CUDA=ON)");
#else
  WAN_CHECK(cuda::device_count() > 0, "wan bench: no CUDA device is visible");
  WAN_CHECK(o.gemm == "bf16" || !wants_parallel(args), "wan bench --gemm fp8 runs on one GPU, not with --gpus");
  WAN_CHECK(o.memory_budget == 0 || !wants_parallel(args), "wan bench --memory-budget runs on one GPU, not with --gpus");
  WAN_CHECK(!o.error_vs_exact || !wants_parallel(args), "wan bench --error-vs-exact runs on one GPU, not with --gpus");
  if (wants_parallel(args)) return bench_parallel(args, o);
  return bench_single(o);
#endif
}

}  // namespace wan::cli
