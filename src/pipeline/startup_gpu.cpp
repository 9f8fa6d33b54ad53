// GPU fast start (see startup.h): one loader for the text encoder and the experts, the tokenizer on a
// side thread, the encoding, then the warm-up while the experts stream. Without CUDA a stub that
// throws (plan_generate never asks for it).
#include "pipeline/startup.h"

#include <cstdlib>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/error.h"

#ifdef WAN_HAVE_CUDA
#include "runtime/load_gpu.h"
#endif

namespace wan {

namespace {

// Process age at the static initialisation of this file: the shared libraries (CUDA, cuDNN, cuBLAS,
// ...) are mapped and relocated by then, so it bounds what the process start costs before main.
const double g_libraries_loaded_at = process_age_seconds();

}  // namespace

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
    if (!p.keep_text_encoder) te.reset();  // its device memory is the arena's
  }
  check_cancel();
  const Clock::time_point t2 = Clock::now();
  emit(ProgressEvent::Begin, Stage::WarmUp, 0);
  dit->warm_up(uses);  // arena + plans + graph capture, while the experts stream
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
