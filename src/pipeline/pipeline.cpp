// Planning and running the Wan 2.2 pipeline on the CPU (see pipeline.h for the flow and invariants).
#include "pipeline/pipeline.h"

#include "pipeline/denoiser.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/philox.h"
#include "dit/dit.h"
#include "pipeline/files.h"
#include "pipeline/models.h"

namespace wan {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string human_bytes(int64_t b) {
  char buf[32];
  const double v = static_cast<double>(b);
  if (v >= 1e9) snprintf(buf, sizeof buf, "%.1f GB", v / 1e9);
  else if (v >= 1e6) snprintf(buf, sizeof buf, "%.1f MB", v / 1e6);
  else snprintf(buf, sizeof buf, "%.1f kB", v / 1e3);
  return buf;
}

int parse_positive_int(const std::string& s, const std::string& what) {
  WAN_CHECK(!s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos, what, ": '", s,
            "' is not a positive integer");
  int v = std::stoi(s);
  WAN_CHECK(v > 0, what, ": '", s, "' is not a positive integer");
  return v;
}

float parse_float(const std::string& s, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  float v = std::strtof(s.c_str(), &end);
  WAN_CHECK(!s.empty() && end && *end == 0 && errno == 0 && std::isfinite(v), what, ": '", s, "' is not a number");
  return v;
}

void check_cancel(const RunHooks& h) {
  if (h.cancel && h.cancel->load(std::memory_order_relaxed)) throw Cancelled();
}

// Begin/End events of a stage and its duration.
class StageTimer {
 public:
  StageTimer(const RunHooks& h, Stage s, int total = 0) : h_(h), s_(s), total_(total), t0_(Clock::now()) {
    check_cancel(h_);
    emit(ProgressEvent::Begin, 0, "");
  }
  void advance(int done, const std::string& detail = "") { emit(ProgressEvent::Advance, done, detail); }
  double end() {
    double s = seconds_since(t0_);
    emit(ProgressEvent::End, total_, "");
    return s;
  }
  double elapsed() const { return seconds_since(t0_); }

 private:
  void emit(ProgressEvent::Kind k, int done, const std::string& detail) {
    if (!h_.progress) return;
    ProgressEvent e;
    e.kind = k;
    e.stage = s_;
    e.done = done;
    e.total = total_;
    e.seconds = seconds_since(t0_);
    e.detail = detail;
    h_.progress(e);
  }
  const RunHooks& h_;
  Stage s_;
  int total_;
  Clock::time_point t0_;
};

// Context batch [B, Lmax, D] (rows past each prompt's length are zero) and the lengths.
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

int64_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

}  // namespace

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::LoadTextEncoder: return "load text encoder";
    case Stage::EncodeText: return "encode text";
    case Stage::LoadDiT: return "load DiT";
    case Stage::Denoise: return "denoise";
    case Stage::LoadVae: return "load VAE";
    case Stage::Decode: return "VAE decode";
  }
  return "?";
}

int task_fps(Task t) { return t == Task::TI2V_5B ? 24 : 16; }

double Timings::mean_step() const {
  if (step_seconds.empty()) return 0;
  double s = 0;
  for (double x : step_seconds) s += x;
  return s / static_cast<double>(step_seconds.size());
}

void parse_size(const std::string& s, int* width, int* height) {
  size_t sep = s.find_first_of("x*X");
  WAN_CHECK(sep != std::string::npos, "--size: '", s, "' is not WIDTHxHEIGHT (e.g. 1280x720 or 1280*720)");
  *width = parse_positive_int(s.substr(0, sep), "--size width");
  *height = parse_positive_int(s.substr(sep + 1), "--size height");
}

void parse_guide_scale(const std::string& s, float* low, float* high) {
  size_t comma = s.find(',');
  if (comma == std::string::npos) {
    *low = *high = parse_float(s, "--guide-scale");
    return;
  }
  *low = parse_float(s.substr(0, comma), "--guide-scale (low-noise value)");
  *high = parse_float(s.substr(comma + 1), "--guide-scale (high-noise value)");
}

Tensor seeded_latents(const Shape& shape, uint64_t seed) {
  Tensor x = Tensor::f32(shape);
  philox_normal_fill(seed, 0, x.f32(), static_cast<size_t>(x.numel()));
  return x;
}

int64_t peak_rss_bytes() {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

static DenoiserSpec denoiser_spec(const GeneratePlan& p) {
  DenoiserSpec spec;
  spec.device = p.device;
  spec.use_high = uses_expert(p.experts, Expert::High);
  spec.use_low = uses_expert(p.experts, Expert::Low);
  spec.latent_shape = p.latent_shape;
  spec.verbose = p.verbose;
  return spec;
}

GeneratePlan plan_generate(const GenerateOptions& o) {
  GeneratePlan p;
  // Device first: the cheapest check, and the CUDA path must not silently fall back to the CPU.
  p.device = o.device;
  p.verbose = o.verbose;
  const bool on_gpu = parse_device(o.device) >= 0;

  WAN_CHECK(!o.model.empty(), "missing --model (a checkpoint folder or file)");
  p.ckpt = detect_checkpoint(o.model);
  p.task = p.ckpt.task;
  if (o.task && *o.task != p.ckpt.task)
    WAN_THROW("--task ", task_name(*o.task), ": ", p.ckpt.root, " holds a ", task_name(p.ckpt.task), " model");
  WAN_CHECK(p.task == Task::T2V_A14B, "task ", task_name(p.task),
            ": this pipeline is not implemented yet (only t2v-A14B runs for now)");
  const SamplingDefaults d = sampling_defaults(task_name(p.task));
  const DiTConfig& dit = p.ckpt.dit;
  p.fps = task_fps(p.task);

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
  if (p.needs_text_encoder) {
    const char* why = p.prompt_embeds.defined() ? " (needed for the negative prompt; or pass --negative-prompt-embeds)"
                                                : " (needed for the prompt; or pass --prompt-embeds)";
    WAN_CHECK(p.ckpt.has(Role::TextEncoder), p.ckpt.root, ": checkpoint has no text encoder", why);
    WAN_CHECK(p.ckpt.has(Role::Tokenizer), p.ckpt.root, ": checkpoint has no tokenizer", why);
    p.t5 = t5_config_for(p.ckpt);
    WAN_CHECK(p.t5.dim == dit.text_dim, p.ckpt.root, ": the text encoder's width ", p.t5.dim,
              " differs from the DiT's text_dim ", dit.text_dim);
  }

  // Video geometry: explicit options, else the initial latents' shape, else the task's defaults.
  WAN_CHECK(p.ckpt.has(Role::Vae), p.ckpt.root, ": checkpoint has no VAE");
  p.vae = vae_config_for(p.ckpt);
  const int sf = vae_spatial_factor(p.vae), tf = vae_temporal_factor(p.vae);
  const int multiple = sf * dit.patch[1];
  if (!o.init_latents_file.empty()) WAN_WITH_CONTEXT("--init-latents", p.init_latents = read_latents(o.init_latents_file));
  p.width = o.width.value_or(1280);
  p.height = o.height.value_or(720);
  p.frames = o.frames.value_or(81);
  if (p.init_latents.defined()) {
    if (!o.width) p.width = static_cast<int>(p.init_latents.dim(3)) * sf;
    if (!o.height) p.height = static_cast<int>(p.init_latents.dim(2)) * sf;
    if (!o.frames) p.frames = static_cast<int>(p.init_latents.dim(1) - 1) * tf + 1;
  }
  WAN_CHECK(p.width > 0 && p.height > 0 && p.width % multiple == 0 && p.height % multiple == 0, "--size ", p.width, "x",
            p.height, ": width and height must be positive multiples of ", multiple);
  WAN_CHECK(p.frames >= 1 && (p.frames - 1) % tf == 0, "--frames ", p.frames, ": must be ", tf, "n+1 (1, ", 1 + tf,
            ", ", 1 + 2 * tf, ", ..., 81)");
  p.latent_shape = Shape{p.vae.z_dim, (p.frames - 1) / tf + 1, p.height / sf, p.width / sf};
  WAN_CHECK(p.vae.z_dim == dit.in_dim && dit.out_dim == dit.in_dim, p.ckpt.root, ": the VAE's z_dim ", p.vae.z_dim,
            " does not match the DiT's in/out channels ", dit.in_dim, "/", dit.out_dim);
  p.seq_len = p.latent_shape[1] * (p.latent_shape[2] / dit.patch[1]) * (p.latent_shape[3] / dit.patch[2]);
  if (p.init_latents.defined())
    WAN_CHECK(p.init_latents.shape() == p.latent_shape, "--init-latents ", o.init_latents_file, ": shape ",
              p.init_latents.shape().str(), " does not match ", p.latent_shape.str(), " of ", p.width, "x", p.height,
              ", ", p.frames, " frames");

  // Sampling.
  p.sampler.solver = o.solver;
  p.sampler.schedule = o.schedule;
  p.sampler.steps = o.steps.value_or(d.steps);
  WAN_CHECK(p.sampler.steps >= 1 && p.sampler.steps <= 10000, "--steps ", p.sampler.steps, ": must be in 1..10000");
  std::optional<double> flow_shift = o.schedule == ScheduleKind::Diffusers ? diffusers_flow_shift(p.ckpt) : std::nullopt;
  p.sampler.shift = o.shift.value_or(flow_shift.value_or(d.shift));
  WAN_CHECK(std::isfinite(p.sampler.shift) && p.sampler.shift > 0, "--shift ", p.sampler.shift, ": must be positive");
  p.guide_low = o.guide_low.value_or(d.guide_low);
  p.guide_high = o.guide_high.value_or(d.guide_high);
  p.boundary = diffusers_boundary_ratio(p.ckpt).value_or(d.boundary);
  p.schedule = make_schedule(p.sampler);
  p.experts = ExpertSchedule::make(p.schedule.timesteps, p.boundary, p.guide_low, p.guide_high,
                                   p.sampler.num_train_timesteps);

  if (o.seed) {
    p.seed = *o.seed;
  } else {
    std::random_device rd;
    p.seed = ((static_cast<uint64_t>(rd()) << 32) | rd()) & 0x7FFFFFFFFFFFFFFFull;
    p.seed_random = true;
  }

  // Memory plan: the text encoder is released before the DiT loads, the DiT before the VAE.
  int experts_used = (uses_expert(p.experts, Expert::High) ? 1 : 0) + (uses_expert(p.experts, Expert::Low) ? 1 : 0);
  p.weights_peak_bytes = std::max(experts_used * dit_f32_bytes(dit), p.needs_text_encoder ? t5_f32_bytes(p.t5) : 0);
  if (on_gpu) {
    check_gpu_denoiser(p.ckpt, denoiser_spec(p));
    if (o.decode) check_gpu_vae(p.vae, p.device);
  }
  const int64_t phys = physical_memory_bytes();
  WAN_CHECK(phys == 0 || p.weights_peak_bytes < phys, "the float32 CPU path needs ", human_bytes(p.weights_peak_bytes),
            " for weights alone but this machine has ", human_bytes(phys), " of memory");
  return p;
}

std::string GeneratePlan::describe() const {
  std::ostringstream os;
  os << "model    " << ckpt.root << " (" << layout_name(ckpt.layout) << ", " << task_name(task) << ")\n";
  os << "device   " << (device == "cpu" ? "cpu (float32 reference)" : cat(device, " (DiT and VAE decode in bf16; text encoder on the CPU)")) << "\n";
  os << "video    " << width << "x" << height << ", " << frames << " frames at " << fps << " fps; latents "
     << latent_shape.str() << ", " << seq_len << " tokens\n";
  os << "sampler  " << solver_name(sampler.solver) << ", " << sampler.steps << " steps, " << schedule_name(sampler.schedule)
     << " schedule, shift " << sampler.shift << ", timesteps " << schedule.timesteps.front();
  if (schedule.timesteps.size() > 1) os << " .. " << schedule.timesteps.back();
  os << "\n";
  const int high = experts.num_high(), low = static_cast<int>(experts.steps.size()) - high;
  auto steps = [](int n) { return cat(n, n == 1 ? " step" : " steps"); };
  os << "experts  high-noise " << steps(high) << " (guide " << guide_high << "), low-noise " << steps(low) << " (guide "
     << guide_low << "), boundary " << boundary << "\n";
  if (init_latents.defined()) os << "seed     unused (initial latents given)\n";
  else os << "seed     " << seed << (seed_random ? " (random)" : "") << "\n";
  auto text = [&](const Tensor& e, const std::string& s) {
    if (e.defined()) return cat("embeddings, ", e.dim(0), " tokens");
    if (s.size() <= 60) return cat("\"", s, "\"");
    size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // UTF-8 boundary
    return cat("\"", s.substr(0, cut), "...\"");
  };
  os << "prompt   " << text(prompt_embeds, prompt) << "\n";
  os << "negative " << text(negative_embeds, negative_prompt) << "\n";
  os << "memory   f32 weights: DiT " << human_bytes(dit_f32_bytes(ckpt.dit)) << " per expert";
  if (needs_text_encoder) os << ", text encoder " << human_bytes(t5_f32_bytes(t5));
  os << "; at most " << human_bytes(weights_peak_bytes) << " held at once\n";
  return os.str();
}

Tensor decode_latents(const CheckpointInfo& ckpt, const VaeConfig& vae, const Tensor& latents, const RunHooks& hooks,
                      Timings* timings, const std::string& device) {
  WAN_CHECK(latents.ndim() == 4 && latents.dim(0) == vae.z_dim, "latents of shape ", latents.shape().str(),
            " do not fit the VAE (", vae.z_dim, " channels)");
  const int gpu = parse_device(device);
  if (gpu >= 0) check_gpu_vae(vae, device);
  VaeWeights w;
  {
    StageTimer st(hooks, Stage::LoadVae);
    w = load_vae(ckpt, vae);
    double s = st.end();
    if (timings) timings->load_vae += s;
  }
  const int chunks = static_cast<int>(latents.dim(1));  // the decoder runs one latent frame at a time
  if (gpu >= 0) {
    check_cancel(hooks);
    StageTimer st(hooks, Stage::Decode, chunks);
    Tensor video = gpu_vae_decode(vae, w, latents, gpu);
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

GenerateResult run_generate(const GeneratePlan& p, const RunHooks& hooks, bool decode) {
  GenerateResult r;
  Timings& tm = r.timings;
  const DiTConfig& dit = p.ckpt.dit;

  // 1. Text: load the encoder only when a prompt must be encoded; release it before the DiT loads.
  Tensor cond = p.prompt_embeds, uncond = p.negative_embeds;
  if (p.needs_text_encoder) {
    TextEncoder te;
    {
      StageTimer st(hooks, Stage::LoadTextEncoder);
      te = load_text_encoder(p.ckpt);
      tm.load_text_encoder = st.end();
    }
    const int n = (cond.defined() ? 0 : 1) + (uncond.defined() ? 0 : 1);
    StageTimer st(hooks, Stage::EncodeText, n);
    int done = 0;
    if (!cond.defined()) {
      cond = encode_prompt(te, p.prompt);
      st.advance(++done, "prompt");
    }
    if (!uncond.defined()) {
      check_cancel(hooks);
      uncond = encode_prompt(te, p.negative_prompt);
      st.advance(++done, "negative prompt");
    }
    tm.text_encode = st.end();
  }
  WAN_ASSERT(cond.dim(1) == dit.text_dim && uncond.dim(1) == dit.text_dim, "text width");

  // 2. Initial latents.
  Tensor x = p.init_latents.defined() ? p.init_latents.clone() : seeded_latents(p.latent_shape, p.seed);

  {
    // 3. Experts actually used by the schedule, on the CPU or uploaded to the GPU.
    std::unique_ptr<Denoiser> dit_model;
    {
      const DenoiserSpec spec = denoiser_spec(p);
      StageTimer st(hooks, Stage::LoadDiT, (spec.use_high ? 1 : 0) + (spec.use_low ? 1 : 0));
      dit_model = make_denoiser(p.ckpt, spec);
      tm.load_dit = st.end();
    }

    // 4. Sampling.
    Sampler sampler(p.sampler);
    WAN_ASSERT(sampler.timesteps() == p.schedule.timesteps, "schedule differs from the plan");
    std::vector<int64_t> lens_cfg, lens_cond;
    const Tensor ctx_cfg = context_batch({&cond, &uncond}, &lens_cfg);
    const Tensor ctx_cond = context_batch({&cond}, &lens_cond);
    const size_t n = static_cast<size_t>(x.numel());
    std::vector<float> v(n), out(2 * n);
    StageTimer st(hooks, Stage::Denoise, sampler.steps());
    for (int i = 0; i < sampler.steps(); ++i) {
      check_cancel(hooks);
      const auto t0 = Clock::now();
      const ExpertStep& es = p.experts.steps[static_cast<size_t>(i)];
      const float t = static_cast<float>(sampler.timestep());
      // A guide scale of 1 makes the guided velocity the conditional one: skip the other half.
      const bool cfg = es.guide != 1.0f;
      const int batch = cfg ? 2 : 1;
      dit_model->forward(es.expert, x, batch, t, cfg ? ctx_cfg : ctx_cond, cfg ? lens_cfg : lens_cond, out.data());
      if (cfg) cfg_combine(out.data(), out.data() + n, es.guide, v.data(), n);
      else std::memcpy(v.data(), out.data(), n * 4);
      sampler.step(v.data(), x.f32(), n);
      tm.step_seconds.push_back(seconds_since(t0));
      st.advance(i + 1, cat("t=", static_cast<int64_t>(t), es.expert == Expert::High ? " high" : " low"));
    }
    tm.denoise = st.end();
  }
  r.latents = x;
  if (decode) r.video = decode_latents(p.ckpt, p.vae, x, hooks, &tm, p.device);
  return r;
}

}  // namespace wan
