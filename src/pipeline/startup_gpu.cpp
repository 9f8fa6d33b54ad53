// GPU fast start (see startup.h): one loader for the text encoder and the experts, the tokenizer on a
// side thread, the encoding, then the warm-up while the experts stream. Without CUDA a stub that
// throws (plan_generate never asks for it). The run-level memory plan that chooses it is plain
// arithmetic, built in every build.
#include "pipeline/startup.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/error.h"
#include "pipeline/host_memory.h"
#include "pipeline/pipeline_internal.h"

#ifdef WAN_HAVE_CUDA
#include "models/dit/block_spill.h"
#include "runtime/load_gpu.h"
#endif

namespace wan {

namespace {

// Device bytes a merged load needs besides the weights (lora_gpu.h): `in_flight` fp32 work buffers of
// the largest targeted tensor (the loader assembles the few tensors its staging ring spans at once)
// and the largest target's factors widened to f32 at worst.
size_t lora_merge_bytes(const LoraSet& set, int in_flight = 4) {
  size_t work = 0, factors = 0;
  for (const auto& [name, t] : set.targets) {
    if (!t.active()) continue;
    work = std::max(work, static_cast<size_t>(t.shape.numel()) * 4);
    size_t f = 0;
    for (const LoraLowRank& lr : t.low_rank) f += static_cast<size_t>(lr.up.numel() + lr.down.numel()) * 4;
    for (const LoraFull& d : t.full) f += static_cast<size_t>(d.delta.numel()) * 4;
    factors = std::max(factors, f);
  }
  return work * static_cast<size_t>(in_flight) + factors;
}

// Process age at the static initialisation of this file: the shared libraries (CUDA, cuDNN, cuBLAS,
// ...) are mapped and relocated by then, so it bounds what the process start costs before main.
const double g_libraries_loaded_at = process_age_seconds();

// `fast`: the text encoder and the experts stream in together, so the load and the encoding hold
// both, with the loader's staging; else each model loads within its own stage. `dev` is the device
// planned, `t5_bytes` the text encoder's share of it (0: the text is encoded elsewhere or not at all)
// and `vae_bytes` the decoder's (0: no decode there).
RunMemoryPlan run_memory(const GeneratePlan& p, const GpuDiTMemory& m, bool fast, const std::string& dev,
                         size_t t5_bytes, size_t vae_bytes, size_t encoder_bytes) {
  RunMemoryPlan run;
  const bool text = t5_bytes > 0;
  const StageSet denoise = stage_bit(RunStage::Denoise);
  const StageSet loading = fast ? stage_bit(RunStage::Load) | (text ? stage_bit(RunStage::TextEncode) : 0) : StageSet{0};
  // A server (plan_as_owner) keeps its text encoder and DiT (weights, arena, reserve) resident from one
  // job to the next (model_cache.h): they are counted in every stage, so the residency chosen lets them
  // stay, and the decoder and image encoder fit next to them.
  const StageSet kept = p.plan_as_owner ? kAllStages : StageSet{0};
  run.request = cat(p.width, "x", p.height, ", ", p.frames, " frames, ", m.experts,
                    m.experts == 1 ? " expert" : " experts", " (", m.residency, ")",
                    text ? (p.keep_text_encoder ? ", text encoder kept" : ", text encoder freed first") : "");
  if (text)
    run.add(dev, "text encoder (weights + activations)", t5_bytes,
            stage_bit(RunStage::TextEncode) | loading | (p.keep_text_encoder ? denoise : StageSet{0}) | kept);
  using pipeline_detail::uses_expert;
  const bool high = uses_expert(p.experts, Expert::High), low = uses_expert(p.experts, Expert::Low);
  if (m.host_weight_bytes == 0) {
    for (Role r : pipeline_detail::expert_roles(p.ckpt, high, low))
      run.add(dev, r == Role::DiTLow ? "low-noise expert weights" : "high-noise expert weights", m.weight_bytes,
              loading | denoise | kept);
  } else {  // the rest waits in pinned host memory (dit_gpu.h WeightResidency)
    run.add(dev, cat("DiT weights, ", m.residency), m.device_weight_bytes, denoise | kept);
  }
  if (fast) run.add(dev, "loader staging", m.staging_bytes, loading);
  // LoRA: tensors assembled in fp32 and one tensor's factors while the weights load (lora_gpu.h); the
  // arena may already be there (no fast start), so counted with the denoise stage too.
  size_t lora = 0;
  for (const auto& s : {p.lora_high, p.lora_low})
    if (s) lora = std::max(lora, lora_merge_bytes(*s));
  // FP8 GEMMs: each block GEMM weight is assembled in fp32 before its quantisation (load_gpu.h), in
  // the LoRA merge's work buffers; as many in flight.
  const bool fp8 = p.gemm == "fp8";
  const size_t largest = static_cast<size_t>(p.ckpt.dit.ffn_dim) * static_cast<size_t>(p.ckpt.dit.dim) * 4;
  if (fp8) lora = std::max(lora, largest * 4);
  if (lora > 0)
    run.add(dev, fp8 ? "LoRA merge / FP8 quantisation (fp32 work, during the load)"
                     : "LoRA merge (fp32 work, during the load)",
            lora, loading | denoise);
  run.add(dev, "DiT activations", m.arena_bytes, denoise | kept);
  run.add(dev, "sampler state", m.sampler_bytes, denoise);
  run.add(dev, "DiT reserve", m.reserve_bytes, loading | denoise | kept);
  // I2V / TI2V: the image is encoded before the DiT loads (and after the text encoder is freed).
  if (encoder_bytes > 0)
    run.add(dev, "VAE encoder (weights + activations)", encoder_bytes, stage_bit(RunStage::ImageEncode));
  // The decoder is built after the DiT is freed.
  if (vae_bytes > 0) run.add(dev, "VAE decoder (weights + activations)", vae_bytes, stage_bit(RunStage::Decode));
  // What fits: the largest frame count at this size whose denoise stage fits.
  const size_t kept_text = p.keep_text_encoder || p.plan_as_owner ? t5_bytes : 0;
  const int tf = vae_temporal_factor(p.vae);
  const bool off = p.vae_tile.mode == VaeTileRequest::Off;
  run.what_fits = [m, kept_text, tf, off, w = p.width, h = p.height, T = p.latent_shape[1]](const std::string&, RunStage st,
                                                                                   size_t free_bytes) -> std::string {
    if (st == RunStage::Decode || st == RunStage::ImageEncode)
      return cat("the VAE's activations scale with the frame size, not the frame count: a smaller size than ", w,
                 "x", h, " fits", off ? ", or --vae-tile auto" : "");
    if (st != RunStage::Denoise) return {};
    const int64_t fit = largest_fitting(T - 1, [&](int64_t t) { return m.bytes_at_frames(t) + kept_text <= free_bytes; });
    if (fit >= 1)
      return cat("at most ", (fit - 1) * tf + 1, " frames fit at ", w, "x", h, " (", fit, " latent frames, ",
                 m.residency, ")");
    return cat("not even 1 frame fits at ", w, "x", h, " (the weights on the device alone take ",
               memory_str(m.device_weight_bytes), ", ", m.residency, ")");
  };
  return run;
}

}  // namespace

double residency_cost_seconds(const GeneratePlan& p, const GpuDiTMemory& m) {
  // Chunked rows: norm1 twice and smaller GEMMs, counted as 1% of each block's compute, so that whole rows
  // win wherever they fit.
  const DiTConfig& c = p.ckpt.dit;
  const double L = static_cast<double>(p.seq_len), D = c.dim, F = c.ffn_dim;
  auto block_seconds = [&](const ExpertStep& es) {
    const double batch = es.guide != 1.0f ? 2 : 1;
    return batch * (4.0 * L * L * D + 2.0 * L * (6.0 * D * D + 2.0 * D * F)) / kResidencyFlops;
  };
  double chunking = 0;
  if (m.chunk_rows > 0)
    for (const ExpertStep& es : p.experts.steps) chunking += 0.01 * c.num_layers * block_seconds(es);
  if (m.host_weight_bytes == 0) return chunking;
  const int steps = static_cast<int>(p.experts.steps.size());
  if (!m.streams) {  // SwapExperts: a copy at every change of expert
    int changes = 0;
    for (int i = 0; i < steps; ++i)
      if (i == 0 || p.experts.steps[static_cast<size_t>(i)].expert != p.experts.steps[static_cast<size_t>(i) - 1].expert)
        ++changes;
    return chunking + changes * static_cast<double>(m.weight_bytes) / kResidencyPcie;
  }
  // StreamBlocks: per forward, each block's copy beyond one block's compute (ANCHORS.md's count: attention
  // 4·L²·D and the linear layers 2·L·(6D² + 2DF) per sample).
  double cost = chunking;
  for (const ExpertStep& es : p.experts.steps) {
    const double block_s = block_seconds(es);
    const double copy_s = static_cast<double>(m.block_bytes) / (m.disk_bytes > 0 ? kResidencyDisk : kResidencyPcie);
    cost += c.num_layers * std::max(0.0, copy_s - block_s);
  }
  return cost;
}

// The residency (DenoiserSpec::residency) of a one-GPU run: the cheapest (residency_cost_seconds) whose
// run plan fits the budget (the free memory, or --memory-budget when smaller) and whose pinned host copies
// fit the host budget; sets p.memory, p.dit_memory, p.fast_start, p.residency. Refuses in one line when
// none does, naming the smallest budget that would work.
void choose_residency(GeneratePlan& p, DenoiserSpec spec, GpuDiTMemory m, bool decode) {
  // As the device's owner (a server's cache frees what the run needs): its capacity less the context's.
  constexpr size_t kContextMargin = size_t{1} << 30;
  const size_t free_now = p.plan_as_owner && m.total_bytes > kContextMargin ? m.total_bytes - kContextMargin
                                                                              : m.free_bytes;
  const size_t budget = static_cast<size_t>(p.memory_budget);
  if (p.memory_budget > 0)
    WAN_CHECK_OPTION("memory-budget", budget <= m.total_bytes, "{} ", memory_str(budget), " is more than device ",
                     p.device, "'s ", memory_str(m.total_bytes));
  // A budget bounds the device's memory in use, so what the device holds before the run (its CUDA
  // context, other processes; a server's plan: the context margin) comes off it first.
  const size_t held = p.plan_as_owner ? std::min(kContextMargin, m.total_bytes) : m.total_bytes - m.free_bytes;
  const size_t run_budget = budget > held ? budget - held : 0;
  const size_t limit = p.memory_budget > 0 ? std::min(run_budget, free_now) : free_now;
  const std::string what = p.memory_budget > 0 && run_budget <= free_now
                               ? cat("the budget of ", memory_str(budget), " less the ", memory_str(held),
                                     " the device holds before the run")
                               : cat("the free memory of ", p.device, ", ", memory_str(free_now));
  int64_t host_limit = p.host_memory_budget;
  if (host_limit == 0) host_limit = std::max<int64_t>(0, physical_memory_bytes() * 9 / 10 - p.host_weights_bytes);
  std::string host_refused;
  size_t smallest = SIZE_MAX;
  std::string smallest_refusal;
  RunStage smallest_stage = RunStage::Denoise;
  std::shared_ptr<RunMemoryPlan> best;
  std::shared_ptr<const cuda::MemoryPlan> best_dit;
  double best_cost = 0;
  bool best_fast = false;
  // The decoder's bytes per decode tiling: the first's (plan_gpu_run's bound) until it does not fit, then
  // the exact figures (cuDNN's choices), asked once each, only for the tilings tried.
  const std::vector<VaeTiling> tilings = decode ? vae_tiling_candidates(p) : std::vector<VaeTiling>{p.vae_tiling};
  std::vector<int64_t> vae_bytes(tilings.size(), -1);
  bool exact = false;
  const int64_t bound = p.vae_device_bytes;
  auto decoder_bytes = [&](size_t k) {
    if (k == 0 && !exact) return bound;
    if (vae_bytes[k] < 0) {
      const auto [th, tw] = vae_tile_size(p.latent_shape[2], p.latent_shape[3], tilings[k]);
      const Shape tile{p.latent_shape[0], p.latent_shape[1], th, tw};
      vae_bytes[k] = static_cast<int64_t>(gpu_vae_decoder_bytes(p.vae, tile, p.device));
    }
    return vae_bytes[k];
  };
  size_t best_tiling = 0;
  for (int c = 0; c < m.residencies; ++c) {
    if (c > 0) {
      spec.residency = c;
      m = plan_gpu_dit_memory(p.ckpt, spec);
    }
    m.free_bytes = limit;
    auto run = std::make_shared<RunMemoryPlan>();
    bool fast = false;
    const size_t k = fit_decode_tiling(tilings.size(), [&](size_t i) {
      p.vae_device_bytes = decode ? decoder_bytes(i) : 0;
      RunMemoryPlan r = gpu_run_memory(p, m, decode, &fast);
      if (decode && i == 0 && !exact && !r.refusal(p.device, limit).empty()) {  // the exact bytes, once
        exact = true;
        p.vae_device_bytes = decoder_bytes(0);
        r = gpu_run_memory(p, m, decode, &fast);
      }
      return r;
    }, p.device, limit, run.get());
    p.fast_start = fast;
    const size_t peak = run->peak(p.device);
    if (peak < smallest) {
      smallest = peak;
      smallest_refusal = run->refusal(p.device, limit);
      smallest_stage = run->peak_stage(p.device);
    }
    if (peak > limit) continue;
    if (static_cast<int64_t>(m.host_weight_bytes) > host_limit) {
      host_refused = cat(m.residency, " fits the device but pins ", memory_str(m.host_weight_bytes),
                         " of host memory, more than the host budget of ", memory_str(static_cast<size_t>(host_limit)));
      continue;
    }
    if (m.disk_bytes > 0 && best) continue;  // the spill file only when nothing in memory fits
#ifdef WAN_HAVE_CUDA  // (a CPU build plans no GPU residency)
    if (m.disk_bytes > 0) {
      const std::string dir = cuda::spill_dir();
      const size_t room = cuda::spill_free_bytes(dir);
      if (room < m.disk_bytes + (size_t{1} << 30)) {
        host_refused = cat(m.residency, " fits the device but needs ", memory_str(m.disk_bytes), " free in ", dir,
                           " for its spill file, which has ", memory_str(room), " (set TMPDIR to a roomier folder)");
        continue;
      }
    }
#endif
    const double cost = residency_cost_seconds(p, m);
    if (!best || cost < best_cost) {
      best_cost = cost;
      p.residency = c;
      p.residency_name = m.residency;
      best = std::move(run);
      best_dit = m.plan;
      best_fast = p.fast_start;
      best_tiling = k;
    }
    if (cost == 0) break;  // nothing is cheaper than free
  }
  if (best) {
    p.memory = std::move(best);
    p.dit_memory = std::move(best_dit);
    p.fast_start = best_fast;
    if (decode) {
      p.vae_tiling = tilings[best_tiling];
      p.vae_device_bytes = decoder_bytes(best_tiling);
    }
    return;
  }
  if (!host_refused.empty()) throw Error(cat("device ", p.device, ": ", host_refused, " (--host-memory-budget)"));
  const std::string why = smallest_stage == RunStage::Denoise
                              ? cat(" (with the weights ", m.residency, ", the least device memory of any plan)")
                              : cat(" (the ", run_stage_name(smallest_stage), " stage, whatever the DiT's residency)");
  const size_t need = smallest + (p.memory_budget > 0 ? held : 0);
  const size_t mib = (need + (size_t{1} << 20) - 1) >> 20;  // rounded up: a budget that runs it
  throw Error(cat(smallest_refusal.empty() ? cat("the run does not fit ", what) : smallest_refusal, why,
                  "; the smallest budget that runs it: --memory-budget ", mib, "MiB"));
}

std::vector<VaeTiling> vae_tiling_candidates(const GeneratePlan& p) {
  if (p.vae_tile.mode == VaeTileRequest::Fixed) return {p.vae_tiling};
  std::vector<VaeTiling> c{VaeTiling{}};
  if (p.vae_tile.mode == VaeTileRequest::Off) return c;
  const int64_t h = p.latent_shape[2], w = p.latent_shape[3];
  for (int64_t px : {512, 384, 256}) {
    const VaeTiling t = vae_tiling_from_pixels(px, px, vae_spatial_factor(p.vae));
    if (vae_tile_count(h, w, t) > vae_tile_count(h, w, c.back())) c.push_back(t);
  }
  return c;
}

size_t fit_decode_tiling(size_t n, const std::function<RunMemoryPlan(size_t)>& run_at, const std::string& device,
                         size_t limit, RunMemoryPlan* run) {
  WAN_ASSERT(n >= 1, "no decode tiling to try");
  for (size_t i = 0;; ++i) {
    *run = run_at(i);
    if (i + 1 == n || run->peak(device) <= limit || run->stage_peak(device, RunStage::Decode) <= limit) return i;
  }
}

RunMemoryPlan gpu_run_memory(const GeneratePlan& p, const GpuDiTMemory& m, bool decode, bool* fast_start) {
  *fast_start = false;
  const size_t t5 = p.text_on_gpu ? static_cast<size_t>(p.t5_device_bytes) : 0;
  const size_t vae = decode ? static_cast<size_t>(p.vae_device_bytes) : 0;
  const size_t enc = static_cast<size_t>(p.vae_encoder_device_bytes);
  // Random weights are drawn on the GPU: nothing streams. Swapped or streamed weights are filled through
  // the arena (dit_gpu_residency.cpp): no fast start.
  if (p.random_weights || m.host_weight_bytes > 0) return run_memory(p, m, false, p.device, t5, vae, enc);
  RunMemoryPlan fast = run_memory(p, m, true, p.device, t5, vae, enc);
  *fast_start = fast.stage_peak(p.device, RunStage::Load) <= m.free_bytes;
  return *fast_start ? fast : run_memory(p, m, false, p.device, t5, vae, enc);
}

RunMemoryPlan rank_run_memory(const GeneratePlan& p, const GpuDiTMemory& m, const std::string& device,
                              const dist::Layout& layout, bool rank0, bool decode) {
  const size_t t5 = rank0 && p.needs_text_encoder ? gpu_text_encoder_bytes(p.t5) : 0;
  const size_t vae = rank0 && decode ? gpu_vae_decoder_bytes(p.vae, p.latent_shape, device) : 0;
  const size_t enc = rank0 && p.image.defined() ? gpu_vae_encoder_bytes(p.vae, p.image, device) : 0;
  RunMemoryPlan run = run_memory(p, m, false, device, t5, vae, enc);
  run.request += cat(", ", "this rank's share of ", dist::describe(layout));
  return run;
}

void plan_gpu_run(bool parallel, bool decode, bool keep_text_encoder, GeneratePlan& p) {
  p.text_on_gpu = p.needs_text_encoder;
  p.keep_text_encoder = keep_text_encoder && p.text_on_gpu;
  // Several GPUs: each rank plans its own share (rank_run_memory) once the layout is known.
  if (!parallel) {
    // The DiT's share first: it also checks the build, the device and the attention kernel. The text
    // encoder's and the decoder's bytes are inputs: their fits are the plan's stages.
    // The decoder's bytes come from planning it on shapes (host work that runs beside the DiT's
    // plan), first with its convolution workspace at the limit: cuDNN's algorithm queries would be
    // the plan's critical path, and the decoder makes them itself while the DiT runs. Only when that
    // upper bound does not fit are they made here, for the exact figure.
    const auto t0 = Clock::now();
    double vae_s = 0;
    std::future<int64_t> vae_bytes;
    if (decode)
      vae_bytes = std::async(std::launch::async, [&p, &vae_s] {
        const auto t = Clock::now();
        const auto [th, tw] = vae_tile_size(p.latent_shape[2], p.latent_shape[3], p.vae_tiling);
        const Shape tile{p.latent_shape[0], p.latent_shape[1], th, tw};
        const auto b = static_cast<int64_t>(gpu_vae_decoder_bytes(p.vae, tile, p.device, true));
        vae_s = seconds_since(t);
        return b;
      });
    DenoiserSpec spec = pipeline_detail::denoiser_spec(p);
    GpuDiTMemory m = plan_gpu_dit_memory(p.ckpt, spec);
    const double dit_s = seconds_since(t0);
    if (p.text_on_gpu) p.t5_device_bytes = static_cast<int64_t>(gpu_text_encoder_bytes(p.t5));
    if (vae_bytes.valid()) p.vae_device_bytes = vae_bytes.get();
    if (p.image.defined())
      p.vae_encoder_device_bytes = static_cast<int64_t>(gpu_vae_encoder_bytes(p.vae, p.image, p.device));
    char note[128];
    std::snprintf(note, sizeof note, "planned in %.2f s (DiT %.2f s; VAE decoder %.2f s beside it)", seconds_since(t0),
                  dit_s, vae_s);
    p.memory_plan_note = note;
    choose_residency(p, spec, m, decode);
  }
  if (decode && parallel) check_gpu_vae(p.vae, p.device);  // its bytes: rank 0's plan
}

int64_t gpu_host_weights_bytes(const GeneratePlan& p) {
  // The VAE's f32 weights, plus one tensor at a time while uploading (the largest: the text encoder's
  // embedding table, converted per tensor on the GPU's side).
  int64_t bytes = vae_f32_bytes(p.vae);
  if (!p.random_weights && p.needs_text_encoder) bytes += static_cast<int64_t>(p.t5.vocab) * p.t5.dim * 4;
  return bytes;
}

std::string startup_trace_json(const FastStart& fs) {
  nlohmann::ordered_json j;
  j["version"] = kStartupTraceVersion;
  j["setup_s"] = fs.setup;
  j["loader_setup_s"] = fs.loader_setup;
  j["load_text_encoder_s"] = fs.load_text_encoder;
  j["text_encode_s"] = fs.text_encode;
  j["warm_up_s"] = fs.warm_up;
  j["load_wall_s"] = fs.load_wall;
  j["staging_free_s"] = fs.staging_free;
  j["bytes"] = fs.bytes;
  j["gb_per_s"] = fs.gb_per_s;
  const StartupMarks& m = fs.marks;
  nlohmann::ordered_json mk;
  mk["libraries_loaded"] = m.libraries_loaded;
  mk["entered"] = m.entered;
  mk["loader_started"] = m.loader_started;
  mk["streaming"] = m.streaming;
  mk["text_resident"] = m.text_resident;
  mk["text_encoded"] = m.text_encoded;
  mk["warm_up_done"] = m.warm_up_done;
  mk["weights_resident"] = m.weights_resident;
  mk["returned"] = m.returned;
  j["marks"] = mk;
  return j.dump(2) + "\n";
}

#ifdef WAN_HAVE_CUDA

namespace {

constexpr int kTextGroup = 0;  // read first: the prompts can be encoded while the experts stream
constexpr int kDiTGroup = 1;

void write_trace(const FastStart& fs) {
  const char* path = std::getenv("WAN_STARTUP_TRACE");
  if (!path || !*path) return;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  WAN_CHECK(f.good(), "WAN_STARTUP_TRACE=", path, ": cannot write");
  f << startup_trace_json(fs);
  WAN_CHECK(f.good(), "WAN_STARTUP_TRACE=", path, ": write failed");
}

}  // namespace

FastStart gpu_fast_start(const GeneratePlan& p, const DenoiserSpec& spec,
                         const std::vector<std::pair<Expert, int>>& uses, const RunHooks& hooks) {
  WAN_ASSERT(p.fast_start && !p.random_weights, "gpu_fast_start without a fast-start plan");
  const int gpu = parse_device(p.device);
  FastStart r;
  r.marks.libraries_loaded = g_libraries_loaded_at;
  r.marks.entered = process_age_seconds();
  const Clock::time_point t0 = Clock::now();
  auto emit = [&](ProgressEvent::Kind k, Stage s, double seconds) {
    if (!hooks.progress) return;
    ProgressEvent e;
    e.kind = k;
    e.stage = s;
    e.seconds = seconds;
    hooks.progress(e);
  };
  auto check_cancel = [&] {
    if (hooks.cancel && hooks.cancel->load(std::memory_order_relaxed)) throw Cancelled();
  };
  check_cancel();

  // The tokenizer (sentencepiece model) loads while the weights stream.
  std::future<PromptTokenizer> tokens;
  if (p.needs_text_encoder)
    tokens = std::async(std::launch::async, [&p] { return load_prompt_tokenizer(&p.ckpt, p.t5.vocab, false); });

  std::unique_ptr<GpuTextEncoder> te;
  std::unique_ptr<Denoiser> dit;
  // Declared after what it fills: on an error it is destroyed first (stopped, copies quiesced).
  auto loader = std::make_unique<cuda::DeviceLoader>(cuda::LoadOptions::tuned(gpu));
  loader->add_group(kTextGroup);  // read first, whichever object registers its tensors first
  loader->add_group(kDiTGroup);
  emit(ProgressEvent::Begin, Stage::LoadDiT, 0);
  DenoiserSpec s = spec;
  s.loader = loader.get();
  s.loader_group = kDiTGroup;
  {
    // The DiT object (stores, weight allocations, targets) is set up on another thread while this one
    // sets up the text encoder (stores, allocations, cuBLAS handles): the stream starts sooner.
    std::future<std::unique_ptr<Denoiser>> dit_setup =
        std::async(std::launch::async, [&p, &s] { return make_denoiser(p.ckpt, s); });
    try {
      if (p.needs_text_encoder) {
        emit(ProgressEvent::Begin, Stage::LoadTextEncoder, 0);
        te = make_gpu_text_encoder(p.ckpt, p.t5, false, 0, PromptTokenizer{}, gpu, loader.get(), kTextGroup);
      }
    } catch (...) {
      dit_setup.wait();  // the DiT (and its weights) go with the future; nothing was started
      throw;
    }
    dit = dit_setup.get();
  }

  loader->start();
  r.setup = seconds_since(t0);
  r.marks.loader_started = process_age_seconds();

  r.cond = p.prompt_embeds;
  r.uncond = p.negative_embeds;
  if (te) {
    loader->wait_group(kTextGroup);
    r.load_text_encoder = seconds_since(t0);
    r.marks.text_resident = process_age_seconds();
    emit(ProgressEvent::End, Stage::LoadTextEncoder, r.load_text_encoder);
    check_cancel();
    const Clock::time_point t1 = Clock::now();
    emit(ProgressEvent::Begin, Stage::EncodeText, 0);
    const PromptTokenizer tk = tokens.get();
    if (!r.cond.defined()) r.cond = te->encode_ids(tk.ids(p.prompt));
    check_cancel();
    if (!r.uncond.defined()) r.uncond = te->encode_ids(tk.ids(p.negative_prompt));
    r.text_encode = seconds_since(t1);
    r.marks.text_encoded = process_age_seconds();
    emit(ProgressEvent::End, Stage::EncodeText, r.text_encode);
    // Its device memory is the arena's, unless it stays: --keep-text-encoder, or a server's plan, which
    // counts it in every stage so the model cache keeps it (model_cache.h) for later prompts.
    if (!p.keep_text_encoder && !p.plan_as_owner) te.reset();
    else te->set_tokenizer(tk);
  }
  check_cancel();
  const Clock::time_point t2 = Clock::now();
  emit(ProgressEvent::Begin, Stage::WarmUp, 0);
  dit->warm_up(uses, p.latent_shape);  // arena + plans + graph capture, while the experts stream
  r.warm_up = seconds_since(t2);
  r.marks.warm_up_done = process_age_seconds();
  emit(ProgressEvent::End, Stage::WarmUp, r.warm_up);

  const cuda::LoadStats st = loader->finish();
  // The load thread's own clock, from its start (just before loader_started).
  r.marks.streaming = r.marks.loader_started + st.setup_seconds;
  r.marks.weights_resident = r.marks.loader_started + st.seconds;
  r.loader_setup = st.setup_seconds;
  r.staging_free = st.free_seconds;
  r.load_wall = seconds_since(t0);
  loader.reset();
  emit(ProgressEvent::End, Stage::LoadDiT, r.load_wall);
  r.bytes = st.bytes + st.fallback_bytes;
  r.gb_per_s = st.gb_per_s();
  r.dit = std::move(dit);
  r.text = std::move(te);
  r.marks.returned = process_age_seconds();
  write_trace(r);
  return r;
}

#else

FastStart gpu_fast_start(const GeneratePlan& p, const DenoiserSpec&, const std::vector<std::pair<Expert, int>>&,
                         const RunHooks&) {
  WAN_THROW("--device ", p.device, ": this build of wan has no CUDA support (configure with a CUDA toolkit)");
}

#endif

}  // namespace wan
