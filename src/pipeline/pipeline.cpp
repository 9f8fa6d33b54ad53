// Planning and running the Wan 2.2 pipeline on the CPU or one GPU (see pipeline.h for the flow and
// invariants), and the denoising loop every run shares, multi-GPU ranks included (pipeline_internal.h).
#include "pipeline/pipeline.h"

#include "pipeline/denoiser.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <future>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/philox.h"
#include "models/dit/dit_cpu.h"
#include "pipeline/files.h"
#include "pipeline/host_memory.h"
#include "pipeline/models.h"
#include "pipeline/startup.h"
#include "pipeline/checkpoint_check.h"
#include "pipeline/conditioning.h"
#include "pipeline/model_cache.h"
#include "pipeline/pipeline_internal.h"
#include "runtime/memory_plan.h"
#include "sampler/presets.h"

namespace wan {

namespace pipeline_detail {

Tensor context_batch(const std::vector<const Tensor*>& embeds, std::vector<int64_t>* lens) {
  int64_t lmax = 0;
  const int64_t D = embeds[0]->dim(1);
  for (const Tensor* e : embeds) lmax = std::max(lmax, e->dim(0));
  Tensor ctx = Tensor::f32(Shape{static_cast<int64_t>(embeds.size()), lmax, D});
  lens->clear();
  for (size_t b = 0; b < embeds.size(); ++b) {
    const Tensor& e = *embeds[b];
    WAN_ASSERT(e.dim(1) == D, "text widths differ");
    std::memcpy(ctx.f32() + static_cast<int64_t>(b) * lmax * D, e.f32(), static_cast<size_t>(e.numel()) * 4);
    lens->push_back(e.dim(0));
  }
  return ctx;
}

bool uses_expert(const ExpertSchedule& es, Expert e) {
  for (const ExpertStep& s : es.steps)
    if (s.expert == e) return true;
  return false;
}

}  // namespace pipeline_detail

namespace {

using pipeline_detail::check_cancel;
using pipeline_detail::context_batch;
using pipeline_detail::decode_with;
using pipeline_detail::StageTimer;
using pipeline_detail::uses_expert;


}  // namespace

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::LoadTextEncoder: return "load text encoder";
    case Stage::EncodeText: return "encode text";
    case Stage::LoadDiT: return "load DiT";
    case Stage::Denoise: return "denoise";
    case Stage::LoadVae: return "load VAE";
    case Stage::Decode: return "VAE decode";
    case Stage::WarmUp: return "warm-up";
    case Stage::EncodeImage: return "encode image";
  }
  return "?";
}

int task_fps(Task t) { return t == Task::TI2V_5B ? 24 : 16; }

Timings merge_timings(const Timings& a, const Timings& b) {
  Timings t;
  t.load_text_encoder = a.load_text_encoder + b.load_text_encoder;
  t.text_encode = a.text_encode + b.text_encode;
  t.load_dit = a.load_dit + b.load_dit;
  t.denoise = a.denoise + b.denoise;
  t.load_vae = a.load_vae + b.load_vae;
  t.vae_decode = a.vae_decode + b.vae_decode;
  t.warm_up = a.warm_up + b.warm_up;
  t.image_encode = a.image_encode + b.image_encode;
  // Overlapped loads: each process's wall time, or its parts when it loaded one after the other.
  t.load_wall = a.load_wall > 0 || b.load_wall > 0 ? a.load() + b.load() : 0;
  t.startup = a.startup > 0 ? a.startup : b.startup;  // the whole run's first step
  t.step_seconds = a.step_seconds;
  t.step_seconds.insert(t.step_seconds.end(), b.step_seconds.begin(), b.step_seconds.end());
  return t;
}

double Timings::mean_step() const {
  if (step_seconds.empty()) return 0;
  double s = 0;
  for (double x : step_seconds) s += x;
  return s / static_cast<double>(step_seconds.size());
}

Tensor seeded_latents(const Shape& shape, uint64_t seed) {
  Tensor x = Tensor::f32(shape);
  philox_normal_fill(seed, 0, x.f32(), static_cast<size_t>(x.numel()));
  return x;
}

double process_age_seconds() {
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (!f) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Field 22 (starttime, clock ticks since boot) counts from the last ')' (the command may hold spaces).
  const char* q = std::strrchr(buf, ')');
  if (!q) return 0;
  unsigned long long start = 0;
  int field = 2;
  for (const char* c = q + 1; *c; ++c) {
    if (*c != ' ') continue;
    if (++field == 22) {
      start = std::strtoull(c + 1, nullptr, 10);
      break;
    }
  }
  struct timespec now {};
  const long hz = sysconf(_SC_CLK_TCK);
  if (start == 0 || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return 0;
  const double age = static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9 - static_cast<double>(start) / hz;
  return age > 0 ? age : 0;
}

int64_t peak_rss_bytes() {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

namespace {
// plan_generate's steps, in order: each validates its options and fills its part of p.

std::future<void> plan_device(const GenerateOptions& o, GeneratePlan& p) {
  // Device first: the cheapest check, and the CUDA path must not silently fall back to the CPU.
  p.device = o.device;
  p.verbose = o.verbose;
  const bool on_gpu = parse_device(o.device) >= 0;
  WAN_CHECK_OPTION("gemm", o.gemm == "bf16" || o.gemm == "fp8", "{}: expected bf16 or fp8, got '", o.gemm, "'");
  WAN_CHECK_OPTION("gemm", on_gpu || o.gemm == "bf16", "{} fp8: FP8 GEMMs run in the GPU DiT only (--device cuda)");
  p.gemm = o.gemm;
  WAN_CHECK_OPTION("attention",
                   o.attention == "auto" || o.attention == "own" || o.attention == "cudnn" || o.attention == "own-fp8",
                   "{}: expected auto, own, cudnn or own-fp8, got '", o.attention, "'");
  WAN_CHECK_OPTION("attention", on_gpu || o.attention == "auto", "{} ", o.attention, " applies to --device cuda only");
  p.attention = o.attention;
  // The CUDA context is created while the checkpoint is read (the future waits for it on return).
  return on_gpu ? gpu_prewarm(parse_device(o.device)) : std::future<void>();
}

bool has_components(const ComponentFiles& f) {
  return !(f.dit.empty() && f.dit_high.empty() && f.dit_low.empty() && f.text_encoder.empty() && f.vae.empty() &&
           f.tokenizer.empty());
}

// Weights and task; returns the configuration's sizes for random weights without a model.
std::optional<ModelPreset> plan_weights(const GenerateOptions& o, GeneratePlan& p) {
  // Weights: the checkpoint's, or random at the sizes of the checkpoint or of a configuration.
  p.random_weights = o.random_weights;
  p.weights_seed = o.weights_seed;
  std::optional<ModelPreset> sizes;  // random weights without a model
  if (!o.random_weights) {
    WAN_CHECK_OPTION("config", o.config.empty(), "{} NAME needs --weights random (a checkpoint has its own sizes)");
    WAN_CHECK_OPTION("layers", o.layers == 0, "{} N needs --weights random (a checkpoint has its own sizes)");
    WAN_CHECK(!o.model.empty() || has_components(o.components),
              "missing --model (a checkpoint folder or file) or ComfyUI component files (--dit-high/--dit-low or "
              "--dit, --text-encoder, --vae, --tokenizer), or --weights random with --task");
  } else if (!o.model.empty()) {
    WAN_CHECK_OPTION("config", o.config.empty() && o.layers == 0,
                     "{} / --layers: with --model the random weights take the checkpoint's sizes");
  } else {
    const Task task = o.task.value_or(Task::T2V_A14B);
    sizes = model_preset(o.config.empty() ? std::string(task_name(task)) : o.config, o.layers);
    WAN_CHECK_OPTION("task", !o.task || *o.task == sizes->task, "{} ", task_name(*o.task), ": --config ", o.config,
                     " is a ", task_name(sizes->task), " configuration");
    const std::string task_sizes = task_name(sizes->task);  // "t2v-A14B", not model_preset's lower case
    std::string name = sizes->name;
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::string lower_task = task_sizes;
    for (char& ch : lower_task) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    p.ckpt.root = cat(name == lower_task ? task_sizes : sizes->name, " sizes");
    p.ckpt.layout = Layout::Official;
    p.ckpt.task = sizes->task;
    p.ckpt.dit = sizes->dit;
    p.ckpt.vae_version = sizes->vae.version;
  }
  if (has_components(o.components)) {
    WAN_CHECK_OPTION("model", o.model.empty(), "{} and component files (--dit*, --text-encoder, --vae, --tokenizer) "
                     "are two ways to give the weights: use one");
    p.ckpt = detect_components(o.components, o.task);
  } else if (!o.model.empty()) {
    p.ckpt = detect_checkpoint(o.model);
    if (o.task && *o.task != p.ckpt.task)
      WAN_THROW_OPTION("task", "{} ", task_name(*o.task), ": ", p.ckpt.root, " holds a ", task_name(p.ckpt.task),
                       " model");
  }
  p.task = p.ckpt.task;
  p.weights = p.random_weights ? cat("random (seed ", p.weights_seed, ", ", p.ckpt.root, ")") : "checkpoint";
  p.fps = task_fps(p.task);
  return sizes;
}

void plan_text(const GenerateOptions& o, const std::optional<ModelPreset>& sizes, GeneratePlan& p) {
  const DiTConfig& dit = p.ckpt.dit;
  // Text. Exactly one source per prompt; decide what must be encoded.
  WAN_CHECK(o.prompt || !o.prompt_embeds_file.empty(), "missing --prompt TEXT (or --prompt-embeds FILE)");
  WAN_CHECK(!(o.prompt && !o.prompt_embeds_file.empty()), "give --prompt or --prompt-embeds, not both");
  WAN_CHECK(!(o.negative_prompt && !o.negative_embeds_file.empty()),
            "give --negative-prompt or --negative-prompt-embeds, not both");
  auto read_embeds = [&](const std::string& file, const char* opt) {
    Tensor e;
    WAN_WITH_CONTEXT(opt, e = read_prompt_embeds(file));
    WAN_CHECK(e.dim(1) == dit.text_dim, opt, " ", file, ": embeddings are ", e.dim(1), " wide but the DiT's text_dim is ",
              dit.text_dim);
    WAN_CHECK(e.dim(0) <= dit.text_len, opt, " ", file, ": ", e.dim(0), " tokens, more than text_len ", dit.text_len);
    return e;
  };
  if (!o.prompt_embeds_file.empty()) p.prompt_embeds = read_embeds(o.prompt_embeds_file, "--prompt-embeds");
  else p.prompt = *o.prompt;
  if (!o.negative_embeds_file.empty()) {
    p.negative_embeds = read_embeds(o.negative_embeds_file, "--negative-prompt-embeds");
  } else {
    p.negative_prompt = o.negative_prompt.value_or("");
    if (p.negative_prompt.empty()) p.negative_prompt = kDefaultNegativePrompt;
  }
  p.needs_text_encoder = !p.prompt_embeds.defined() || !p.negative_embeds.defined();
  if (p.needs_text_encoder && p.random_weights) {
    // Random weights: the configuration's encoder (or the checkpoint's sizes); its tokenizer or stand-in ids.
    p.t5 = sizes ? sizes->t5 : p.ckpt.has(Role::TextEncoder) ? t5_config_for(p.ckpt) : t5_preset("umt5-xxl");
    p.stand_in_tokens = !p.ckpt.has(Role::Tokenizer);
    WAN_CHECK(p.t5.dim == dit.text_dim, p.ckpt.root, ": the text encoder's width ", p.t5.dim,
              " differs from the DiT's text_dim ", dit.text_dim);
  } else if (p.needs_text_encoder) {
    const char* why = p.prompt_embeds.defined() ? " (needed for the negative prompt; or pass --negative-prompt-embeds)"
                                                : " (needed for the prompt; or pass --prompt-embeds)";
    WAN_CHECK(p.ckpt.has(Role::TextEncoder), p.ckpt.root, ": checkpoint has no text encoder", why);
    WAN_CHECK(p.ckpt.has(Role::Tokenizer), p.ckpt.root, ": checkpoint has no tokenizer", why);
    p.t5 = t5_config_for(p.ckpt);
    WAN_CHECK(p.t5.dim == dit.text_dim, p.ckpt.root, ": the text encoder's width ", p.t5.dim,
              " differs from the DiT's text_dim ", dit.text_dim);
  }
}

void plan_video(const GenerateOptions& o, const std::optional<ModelPreset>& sizes, GeneratePlan& p) {
  const DiTConfig& dit = p.ckpt.dit;
  // Video geometry: explicit options, else the initial latents' shape, else the task's defaults.
  if (sizes) {
    p.vae = sizes->vae;
  } else if (p.random_weights && !p.ckpt.has(Role::Vae)) {
    p.vae = vae_preset(p.ckpt.vae_version == 22 ? "wan2.2" : "wan2.1");
  } else {
    WAN_CHECK(p.ckpt.has(Role::Vae), p.ckpt.root, ": checkpoint has no VAE");
    p.vae = vae_config_for(p.ckpt);
  }
  const int sf = vae_spatial_factor(p.vae), tf = vae_temporal_factor(p.vae);
  const int multiple = sf * dit.patch[1];
  if (!o.init_latents_file.empty()) WAN_WITH_CONTEXT("--init-latents", p.init_latents = read_latents(o.init_latents_file));
  const bool ti2v = p.task == Task::TI2V_5B;
  p.width = o.width.value_or(1280);
  p.height = o.height.value_or(ti2v ? 704 : 720);
  p.frames = o.frames.value_or(ti2v ? 121 : 81);
  if (p.init_latents.defined()) {
    if (!o.width) p.width = static_cast<int>(p.init_latents.dim(3)) * sf;
    if (!o.height) p.height = static_cast<int>(p.init_latents.dim(2)) * sf;
    if (!o.frames) p.frames = static_cast<int>(p.init_latents.dim(1) - 1) * tf + 1;
  }
  const SourceImages images = plan_images(o, p);  // reads --image; I2V / TI2V may take the video size from it
  WAN_CHECK_OPTION("size", p.width > 0 && p.height > 0 && p.width % multiple == 0 && p.height % multiple == 0, "{} ",
                   p.width, "x", p.height, ": width and height must be positive multiples of ", multiple);
  WAN_CHECK_OPTION("frames", p.frames >= 1 && (p.frames - 1) % tf == 0, "{} ", p.frames, ": must be ", tf, "n+1 (1, ",
                   1 + tf, ", ", 1 + 2 * tf, ", ..., 81)");
  p.latent_shape = Shape{p.vae.z_dim, (p.frames - 1) / tf + 1, p.height / sf, p.width / sf};
  // I2V's DiT also reads the condition y (a 4-channel mask and the image's latent) after the latent.
  const int in_dim = p.task == Task::I2V_A14B ? 2 * p.vae.z_dim + 4 : p.vae.z_dim;
  WAN_CHECK(dit.in_dim == in_dim && dit.out_dim == p.vae.z_dim, p.ckpt.root, ": the VAE's z_dim ", p.vae.z_dim,
            " does not match the DiT's in/out channels ", dit.in_dim, "/", dit.out_dim, " (", task_name(p.task),
            " needs ", in_dim, "/", p.vae.z_dim, ")");
  p.seq_len = p.latent_shape[1] * (p.latent_shape[2] / dit.patch[1]) * (p.latent_shape[3] / dit.patch[2]);
  // The DiT's RoPE covers kDiTRopePositions positions per axis: refused here, not in the first forward.
  const int64_t axis[3] = {p.latent_shape[1] / dit.patch[0], p.latent_shape[2] / dit.patch[1],
                           p.latent_shape[3] / dit.patch[2]};
  WAN_CHECK_OPTION("frames", axis[0] <= kDiTRopePositions, "{} ", p.frames, ": ", axis[0],
                   " latent frames exceed the DiT's RoPE, which covers ", kDiTRopePositions,
                   " positions per axis (at most ", (kDiTRopePositions * dit.patch[0] - 1) * tf + 1, " frames)");
  WAN_CHECK_OPTION("size", axis[1] <= kDiTRopePositions && axis[2] <= kDiTRopePositions, "{} ", p.width, "x", p.height,
                   ": ", axis[2], "x", axis[1], " tokens exceed the DiT's RoPE, which covers ", kDiTRopePositions,
                   " positions per axis (at most ", kDiTRopePositions * multiple, " pixels per side)");
  if (p.init_latents.defined())
    WAN_CHECK_OPTION("init-latents", p.init_latents.shape() == p.latent_shape, "{} ", o.init_latents_file, ": shape ",
                     p.init_latents.shape().str(), " does not match ", p.latent_shape.str(), " of ", p.width, "x",
                     p.height, ", ", p.frames, " frames");
  size_images(images, p);  // the images at the video's size, as the task's reference sizes them
}

// Runs f; a plain BadInput error from it becomes one about option `key` ("--key: <message>").
template <typename F>
void as_option(const char* key, F&& f) {
  try {
    f();
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::BadInput) throw;
    throw OptionError(key, cat("{}: ", e.what()));
  }
}

// Sampling: the user's options, else the preset's, else the task's defaults (with what a diffusers
// checkpoint's scheduler and model_index override), resolved by sampler/presets.h.
void plan_sampling(const GenerateOptions& o, GeneratePlan& p) {
  const Preset* preset = nullptr;
  if (!o.preset.empty()) as_option("preset", [&] { preset = &find_preset(o.preset); });
  p.preset = o.preset;
  SamplingDefaults base = sampling_defaults(task_name(p.task));
  const ScheduleKind grid = o.schedule.value_or(preset ? preset->schedule : ScheduleKind::Official);
  if (grid == ScheduleKind::Diffusers) base.shift = diffusers_flow_shift(p.ckpt).value_or(base.shift);
  base.boundary = diffusers_boundary_ratio(p.ckpt).value_or(base.boundary);
  if (o.steps)
    WAN_CHECK_OPTION("steps", *o.steps >= 1 && *o.steps <= 10000, "{} ", *o.steps, ": must be in 1..10000");
  if (o.shift)
    WAN_CHECK_OPTION("shift", std::isfinite(*o.shift) && *o.shift > 0, "{} ", *o.shift, ": must be positive");
  SamplingOptions user;
  user.solver = o.solver;
  user.schedule = o.schedule;
  user.steps = o.steps;
  user.timesteps = o.timesteps;
  user.shift = o.shift;
  user.guide_low = o.guide_low;
  user.guide_high = o.guide_high;
  ResolvedSampling r;
  as_option(preset ? "preset" : "timesteps", [&] { r = resolve_sampling(task_name(p.task), base, preset, user); });
  p.sampler = r.sampler;
  p.guide_low = r.guide_low;
  p.guide_high = r.guide_high;
  p.boundary = r.boundary;
  as_option(o.timesteps.empty() ? "steps" : "timesteps", [&] { p.schedule = make_schedule(p.sampler); });
  p.experts = ExpertSchedule::make(p.schedule, p.boundary, p.guide_low, p.guide_high, p.sampler.num_train_timesteps);
}

void plan_resume(const GenerateOptions& o, GeneratePlan& p) {
  const DiTConfig& dit = p.ckpt.dit;
  // Pausing / resuming: the state is read (and checked) now, before anything heavy.
  if (!o.resume_file.empty()) {
    p.resume_file = o.resume_file;
    std::shared_ptr<RunState> st;
    WAN_WITH_CONTEXT("--resume", st = std::make_shared<RunState>(read_run_state(o.resume_file)));
    p.resume = st;
  }
  if (o.seed) {
    p.seed = *o.seed;
  } else if (p.resume) {  // the saved run's seed, when it had one
    auto fp = nlohmann::json::parse(p.resume->fingerprint, nullptr, false);
    const std::string noise = fp.is_object() && fp.contains("noise") && fp["noise"].is_string() ? fp["noise"].get<std::string>() : "";
    char* end = nullptr;
    const unsigned long long v = noise.rfind("seed ", 0) == 0 ? std::strtoull(noise.c_str() + 5, &end, 10) : 0;
    if (end && *end == 0 && end != noise.c_str() + 5) {
      p.seed = v;
      p.seed_from_state = true;
    }
  } else {
    std::random_device rd;
    p.seed = ((static_cast<uint64_t>(rd()) << 32) | rd()) & 0x7FFFFFFFFFFFFFFFull;
    p.seed_random = true;
  }

  p.fingerprint = plan_fingerprint(p);
  WAN_CHECK_OPTION("stop-after-steps", o.stop_after_steps >= 0 && o.stop_after_steps <= p.sampler.steps, "{} ",
                   o.stop_after_steps, ": must be in 1..", p.sampler.steps, " (the run's steps)");
  p.stop_after_steps = o.stop_after_steps;
  if (p.resume) {
    if (!o.parallel) pipeline_detail::check_resume(p);  // several GPUs: once the layout is known
    WAN_CHECK_OPTION("resume",
                     p.resume->step <= p.sampler.steps && p.resume->latents.shape() == p.latent_shape &&
                         p.resume->prompt_embeds.dim(1) == dit.text_dim,
                     "{} ", p.resume_file, ": the state does not fit this run (step ", p.resume->step, ", latents ",
                     p.resume->latents.shape().str(), ")");
    WAN_CHECK_OPTION("stop-after-steps", p.stop_after_steps == 0 || p.stop_after_steps > p.resume->step, "{} ",
                     p.stop_after_steps, ": the resumed state is already at step ", p.resume->step);
    // The text comes from the state: nothing to encode.
    p.prompt_embeds = p.resume->prompt_embeds;
    p.negative_embeds = p.resume->negative_embeds;
    p.needs_text_encoder = false;
  }
}

// The files the run could read, checked before any heavy stage: every header and byte range, and each
// component's tensors against its config (both experts, whatever the schedule gives them).
void plan_checkpoint(const GenerateOptions& o, const GeneratePlan& p) {
  if (p.random_weights) return;
  std::vector<Role> roles = {Role::DiT, Role::DiTHigh, Role::DiTLow};
  if (p.needs_text_encoder) roles.push_back(Role::TextEncoder);
  if (o.decode) roles.push_back(Role::Vae);
  validate_checkpoint(p.ckpt, roles, KnownConfigs{&p.t5, &p.vae});  // inferred by plan_text / plan_video
}

// Memory: host (the weights held at once) and the GPU run's device plan, checked before any heavy work.
void plan_memory(const GenerateOptions& o, GeneratePlan& p) {
  const bool on_gpu = parse_device(o.device) >= 0;
  // The text encoder is released before the DiT loads (unless kept on the GPU), the DiT before the VAE.
  WAN_CHECK_OPTION("keep-text-encoder", !o.keep_text_encoder || on_gpu,
                   "{}: only with --device cuda (the CPU path releases the "
                   "text encoder before the DiT loads)");
  int experts_used = (uses_expert(p.experts, Expert::High) ? 1 : 0) + (uses_expert(p.experts, Expert::Low) ? 1 : 0);
  p.weights_peak_bytes =
      std::max(experts_used * dit_f32_bytes(p.ckpt.dit), p.needs_text_encoder ? t5_f32_bytes(p.t5) : 0);
  // The host first (cheap, and a GPU run's video comes back to it), then the devices.
  if (on_gpu) p.host_weights_bytes = gpu_host_weights_bytes(p);
  for (const char* key : {"memory-budget", "host-memory-budget"}) {
    const bool given = std::string(key) == "memory-budget" ? o.memory_budget > 0 : o.host_memory_budget > 0;
    WAN_CHECK_OPTION(key, !given || on_gpu, "{}: only with --device cuda (it budgets the GPU run)");
    WAN_CHECK_OPTION(key, !given || !o.parallel, "{}: one GPU for now (each rank of a parallel layout holds its share "
                     "of the weights resident)");
  }
  p.memory_budget = o.memory_budget;
  p.plan_as_owner = o.plan_as_owner;
  p.host_memory_budget = o.host_memory_budget;
  check_generate_host_memory(p, on_gpu, o.decode);
  pipeline_detail::plan_vae_tiling(o, p);
  if (on_gpu) plan_gpu_run(o.parallel, o.decode, o.keep_text_encoder, p);
}
}  // namespace

GeneratePlan plan_generate(const GenerateOptions& o) {
  GeneratePlan p;
  const std::future<void> cuda_context = plan_device(o, p);  // waits for the context on return
  const std::optional<ModelPreset> sizes = plan_weights(o, p);
  WAN_CHECK_OPTION("gemm", p.gemm == "bf16" || !p.ckpt.gguf,
                   "{} fp8: a GGUF DiT is not quantised to FP8 (use --gemm bf16)");
  plan_text(o, sizes, p);
  plan_video(o, sizes, p);
  plan_sampling(o, p);
  pipeline_detail::plan_lora(o.loras, p);
  plan_resume(o, p);
  plan_checkpoint(o, p);
  plan_memory(o, p);
  check_generate_outputs(o, p);  // no output may be one of the files just read
  return p;
}

namespace pipeline_detail {

std::vector<std::pair<Expert, int>> forward_uses(const GeneratePlan& p, int first_step) {
  std::vector<std::pair<Expert, int>> uses;
  for (size_t i = static_cast<size_t>(first_step); i < p.experts.steps.size(); ++i) {
    const ExpertStep& es = p.experts.steps[i];
    const std::pair<Expert, int> u{es.expert, es.guide != 1.0f ? 2 : 1};
    if (std::find(uses.begin(), uses.end(), u) == uses.end()) uses.push_back(u);
  }
  return uses;
}

void build_text_encoder(const GeneratePlan& p, int gpu, std::unique_ptr<GpuTextEncoder>& te_gpu,
                        std::shared_ptr<TextEncoder>& te) {
  PromptTokenizer tokens = load_prompt_tokenizer(&p.ckpt, p.t5.vocab, /*allow_stand_in=*/p.random_weights);
  const uint64_t t5_seed = random_t5_seed(p.weights_seed);
  if (gpu >= 0)
    te_gpu = make_gpu_text_encoder(p.ckpt, p.t5, p.random_weights, t5_seed, std::move(tokens), gpu);
  else
    te = std::make_shared<TextEncoder>(p.random_weights ? random_text_encoder(p.t5, t5_seed, std::move(tokens))
                                                        : load_text_encoder(p.ckpt));
}

void set_parallel_numerics(GeneratePlan& p, const std::string& parallel) {
  p.parallel = parallel;
  auto j = nlohmann::ordered_json::parse(p.fingerprint, nullptr, false);
  WAN_ASSERT(j.is_object() && j.contains("numerics"), "set_parallel_numerics: the plan has no fingerprint");
  j["numerics"] = pipeline_detail::fingerprint_numerics(p);
  p.fingerprint = j.dump();
}

void check_resume(const GeneratePlan& p) {
  if (!p.resume) return;
  const std::string diff = fingerprint_differences(p.resume->fingerprint, p.fingerprint);
  WAN_CHECK_OPTION("resume", diff.empty(), "{} ", p.resume_file, ": the state was saved by a different run: ", diff);
}

void begin_result(const GeneratePlan& p, GenerateResult* r) {
  if (!p.resume) return;
  r->first_step = p.resume->step;
  r->earlier = p.resume->timings;
  r->earlier_peak_device_bytes = p.resume->peak_device_bytes;
  r->earlier_peak_rss_bytes = p.resume->peak_rss_bytes;
}

void complete_state(const GeneratePlan& p, const Tensor& cond, const Tensor& uncond, GenerateResult* r) {
  WAN_ASSERT(r->state.has_value(), "complete_state of a run that did not pause");
  RunState& s = *r->state;
  s.prompt_embeds = cond;
  s.negative_embeds = uncond;
  s.fingerprint = p.fingerprint;
  s.timings = merge_timings(r->earlier, r->timings);
  s.peak_device_bytes = std::max(r->earlier_peak_device_bytes, r->peak_device_bytes);
  s.peak_rss_bytes = std::max(r->earlier_peak_rss_bytes, peak_rss_bytes());
}

void denoise(const GeneratePlan& p, Denoiser& dit, const Tensor& cond, const Tensor& uncond, const Tensor& x,
             const SamplerState* from, const RunHooks& hooks, const std::function<void()>& after_step,
             GenerateResult* r) {
  Timings& tm = r->timings;
  Sampler sampler(p.sampler);
  WAN_ASSERT(sampler.timesteps() == p.schedule.timesteps, "schedule differs from the plan");
  if (from) sampler.set_state(*from);  // --resume: continue after the saved step
  const int first = sampler.index();
  WAN_ASSERT(first == r->first_step, "the sampler state is at step ", first, ", the run's first step is ", r->first_step);
  // After each step: the caller's probe; at --stop-after-steps keep the state and stop.
  auto stop_here = [&](int steps_done) {
    if (after_step) after_step();
    if (steps_done != p.stop_after_steps) return false;
    r->state.emplace();
    r->state->step = steps_done;
    r->state->latents = dit.sync_sampling(sampler);  // x and the history, from where they live
    r->state->sampler = sampler.state();
    return true;
  };
  std::vector<int64_t> lens_cfg, lens_cond;
  const Tensor ctx_cfg = context_batch({&cond, &uncond}, &lens_cfg);
  const Tensor ctx_cond = context_batch({&cond}, &lens_cond);
  // x and the solver history now live where the DiT runs (GPU: guidance + solver update fused).
  dit.begin_sampling(sampler, x);
  StageTimer st(hooks, Stage::Denoise, sampler.steps() - first);
  for (int i = first; i < sampler.steps(); ++i) {
    check_cancel(hooks);
    if (i == first) tm.startup = process_age_seconds();
    const auto t0 = Clock::now();
    const ExpertStep& es = p.experts.steps[static_cast<size_t>(i)];
    const float t = sampler.model_timestep();
    // A guide scale of 1 makes the guided velocity the conditional one: skip the other half.
    const bool cfg = es.guide != 1.0f;
    dit.guided_step(sampler, es.expert, es.guide, cfg ? ctx_cfg : ctx_cond, cfg ? lens_cfg : lens_cond);
    tm.step_seconds.push_back(seconds_since(t0));
    st.advance(i + 1 - first, cat("t=", static_cast<int64_t>(t), es.expert == Expert::High ? " high" : " low"));
    if (stop_here(i + 1)) break;
  }
  r->latents = dit.sync_sampling(sampler);
  tm.denoise = st.end();
}

}  // namespace pipeline_detail

namespace {

// The sequential text stage: load the encoder only when a prompt must be encoded, encode what the plan
// lacks, then release it before the DiT loads (on the GPU unless --keep-text-encoder: it then lives next
// to the DiT until the denoising ends).
// With a cache (model_cache.h) the encoder comes from it when its key matches and goes back to it after
// the encoding; the DiT's make_room frees it when the DiT needs the memory.
void run_text_stage(const GeneratePlan& p, const RunHooks& hooks, int gpu, const std::function<void()>& probe,
                    Tensor& cond, Tensor& uncond, std::unique_ptr<GpuTextEncoder>& te_gpu, Timings& tm,
                    ModelCache* cache) {
  std::shared_ptr<TextEncoder> te;
  std::function<Tensor(const std::string&)> encode;
  const std::string key = cache ? pipeline_detail::text_cache_key(p) : std::string();
  if (cache && cache->text_key != key) cache->drop_text();
  {
    StageTimer st(hooks, Stage::LoadTextEncoder);
    if (cache && (cache->text_gpu || cache->text_cpu)) {
      te_gpu = std::move(cache->text_gpu);
      te = std::move(cache->text_cpu);
      ++cache->stats.reused;
    } else {
      if (cache) pipeline_detail::make_room(*cache, gpu, static_cast<int64_t>(p.t5_device_bytes));
      pipeline_detail::build_text_encoder(p, gpu, te_gpu, te);
      if (cache) ++cache->stats.built;
    }
    if (gpu >= 0) encode = [&](const std::string& s) { return te_gpu->encode(s); };
    else encode = [&](const std::string& s) { return encode_prompt(*te, s); };
    tm.load_text_encoder = st.end();
    probe();
  }
  const int n = (cond.defined() ? 0 : 1) + (uncond.defined() ? 0 : 1);
  StageTimer st(hooks, Stage::EncodeText, n);
  int done = 0;
  if (!cond.defined()) {
    cond = encode(p.prompt);
    st.advance(++done, "prompt");
  }
  if (!uncond.defined()) {
    check_cancel(hooks);
    uncond = encode(p.negative_prompt);
    st.advance(++done, "negative prompt");
  }
  tm.text_encode = st.end();
  probe();
  if (cache && !p.keep_text_encoder && (gpu >= 0 || pipeline_detail::cpu_may_keep(p))) {
    cache->text_gpu = std::move(te_gpu);
    cache->text_cpu = std::move(te);
    cache->text_key = key;
  }
  if (!p.keep_text_encoder) te_gpu.reset();  // frees its device memory before the DiT is created
}

// The sequential start (no fast start, or the DiT from a cache): text (run_text_stage), the image's
// condition, the experts the schedule uses (from the cache when they match), then (GPU) the warm-up.
std::unique_ptr<Denoiser> sequential_start(const GeneratePlan& p, const RunHooks& hooks, int gpu,
                                           const std::function<void()>& probe, const DenoiserSpec& spec,
                                           const std::vector<std::pair<Expert, int>>& uses, Tensor& cond,
                                           Tensor& uncond, std::unique_ptr<GpuTextEncoder>& te_gpu,
                                           LatentCondition& condition, VaeWeights& vae_weights, Timings& tm,
                                           ModelCache* cache) {
  std::unique_ptr<Denoiser> dit_model;
  // 1. Text (see run_text_stage).
  if (p.needs_text_encoder) run_text_stage(p, hooks, gpu, probe, cond, uncond, te_gpu, tm, cache);
  if (p.image.defined()) {
    if (cache) pipeline_detail::make_room(*cache, gpu, p.vae_encoder_device_bytes);
    condition = pipeline_detail::encode_condition(p, hooks, &vae_weights, &tm);
    probe();
  }
  // 3. Experts actually used by the schedule, on the CPU or streamed to the GPU, then (GPU) the warm-up.
  {
    StageTimer st(hooks, Stage::LoadDiT, (spec.use_high ? 1 : 0) + (spec.use_low ? 1 : 0));
    if (cache && cache->dit) {
      dit_model = std::move(cache->dit);
      ++cache->stats.reused;
    } else {
      if (cache && p.memory)
        pipeline_detail::make_room(*cache, gpu,
                                   static_cast<int64_t>(p.memory->stage_peak(p.device, RunStage::Denoise)));
      dit_model = make_denoiser(p.ckpt, spec);
      if (cache) ++cache->stats.built;
    }
    tm.load_dit = st.end();
    probe();
  }
  if (gpu >= 0) {
    StageTimer st(hooks, Stage::WarmUp);
    dit_model->warm_up(uses, p.latent_shape);
    tm.warm_up = st.end();
    probe();
  }
  return dit_model;
}

}  // namespace

GenerateResult run_generate(const GeneratePlan& p, const RunHooks& hooks, bool decode, ModelCache* cache) {
  GenerateResult r;
  Timings& tm = r.timings;
  const DiTConfig& dit = p.ckpt.dit;
  const int gpu = parse_device(p.device);
  // Device memory in use, sampled at stage ends and after every step (GPU runs).
  auto probe = [&] {
    if (gpu >= 0) r.peak_device_bytes = std::max(r.peak_device_bytes, gpu_memory_in_use(gpu));
  };
  if (gpu >= 0) r.device_bytes_at_start = r.peak_device_bytes = gpu_memory_in_use(gpu);
  pipeline_detail::begin_result(p, &r);

  const std::vector<std::pair<Expert, int>> uses = pipeline_detail::forward_uses(p, r.first_step);
  const DenoiserSpec spec = pipeline_detail::denoiser_spec(p);
  Tensor cond = p.prompt_embeds, uncond = p.negative_embeds;
  std::unique_ptr<GpuTextEncoder> te_gpu;
  std::unique_ptr<Denoiser> dit_model;
  // The decode's inputs get ready on a host thread while the DiT denoises: the VAE's weights read (or
  // drawn) and, on a GPU, the decoder planned (host work: ~1 s at 720p, measured). Started with the
  // sampling, not earlier: its cuDNN queries beside the text encoder and the DiT load slowed those.
  std::future<pipeline_detail::VaeAhead> vae_ahead;
  // I2V / TI2V: the image is encoded first (VAE weights kept for the decode), before the DiT's memory
  // is taken; on the CPU after the text encoder is released.
  VaeWeights vae_weights;
  LatentCondition condition;
  // A cache: the DiT is reused when its key matches and its plan covers this latent; otherwise it is
  // freed first. The fast start loads the text encoder and the DiT together onto a device it plans as empty.
  const std::string dit_key = cache ? pipeline_detail::dit_cache_key(p) : std::string();
  if (cache && !pipeline_detail::dit_serves(*cache, p, dit_key)) cache->drop_dit();
  const bool fast = p.fast_start && !(cache && cache->dit);
  if (cache && fast) cache->drop_text();
  if (p.image.defined() && fast) condition = pipeline_detail::encode_condition(p, hooks, &vae_weights, &tm);
  if (fast) {
    // 1-3. Text encoder and experts stream in together; encoding and warm-up overlap the load.
    FastStart fs = gpu_fast_start(p, spec, uses, hooks);
    cond = fs.cond;
    uncond = fs.uncond;
    te_gpu = std::move(fs.text);
    dit_model = std::move(fs.dit);
    tm.load_text_encoder = fs.load_text_encoder;
    tm.text_encode = fs.text_encode;
    tm.warm_up = fs.warm_up;
    tm.load_dit = fs.load_wall;
    tm.load_wall = fs.load_wall;
    r.load_bytes = fs.bytes;
    r.load_gb_per_s = fs.gb_per_s;
    r.load_setup_s = fs.setup;
    if (cache) ++cache->stats.built;
    if (cache && te_gpu) {  // a server's plan kept it (its bytes are in every stage): the next job's
      cache->text_gpu = std::move(te_gpu);
      cache->text_key = pipeline_detail::text_cache_key(p);
      ++cache->stats.built;
    }
    probe();
  } else {
    dit_model = sequential_start(p, hooks, gpu, probe, spec, uses, cond, uncond, te_gpu, condition, vae_weights, tm,
                                 cache);
  }
  WAN_ASSERT(cond.dim(1) == dit.text_dim && uncond.dim(1) == dit.text_dim, "text width");

  // 2. Initial latents (resumed: the saved ones).
  Tensor x = p.resume                     ? p.resume->latents.clone()
             : p.init_latents.defined() ? p.init_latents.clone()
                                        : seeded_latents(p.latent_shape, p.seed);

  // 4. Sampling (the loop every run shares; --resume: from the saved sampler state).
  if (decode && p.stop_after_steps == 0 && !p.image.defined() && (p.fast_start || gpu >= 0))
    vae_ahead = std::async(std::launch::async, [&p, gpu, cache] {
      pipeline_detail::VaeAhead a;
      const auto t0 = Clock::now();
      a.weights = pipeline_detail::cached_vae_weights(p, cache);
      a.read_s = seconds_since(t0);
      if (gpu >= 0)
        a.decoder = plan_gpu_vae_decoder(p.vae, a.weights, p.latent_shape[2], p.latent_shape[3], gpu, p.vae_tiling);
      return a;
    });
  dit_model->set_condition(condition);
  pipeline_detail::denoise(p, *dit_model, cond, uncond, x, p.resume ? &p.resume->sampler : nullptr, hooks, probe, &r);
  if (cache && (gpu >= 0 || pipeline_detail::cpu_may_keep(p))) {  // kept for the next run unless the decode needs it
    pipeline_detail::keep_dit(*cache, p, dit_key, std::move(dit_model));
    if (decode && p.stop_after_steps == 0)
      pipeline_detail::make_room(*cache, gpu, p.vae_device_bytes);
  }
  dit_model.reset();  // frees the experts before the VAE decoder is built
  if (r.state) {  // paused: the state carries the text and the timings so far; no decode
    pipeline_detail::complete_state(p, cond, uncond, &r);
    return r;
  }
  te_gpu.reset();
  if (hooks.latents_done) hooks.latents_done(r.latents);  // kept even if the decode fails or is cancelled
  if (decode) {
    auto get = [&] {
      if (vae_ahead.valid()) return vae_ahead.get();
      pipeline_detail::VaeAhead a;
      if (vae_weights.decoder.conv1.present())
        a.weights = std::move(vae_weights);  // read for the image encode
      else
        a.weights = pipeline_detail::cached_vae_weights(p, cache);
      return a;
    };
    r.video = decode_with(get, p.vae, r.latents, hooks, &tm, p.device, &r.peak_device_bytes, p.vae_tiling);
  }
  return r;
}

}  // namespace wan
