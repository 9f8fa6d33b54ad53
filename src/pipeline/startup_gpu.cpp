// GPU fast start (see startup.h): one loader for the text encoder and the experts, the tokenizer on a
// side thread, encoding, warm-up. Without CUDA a stub that throws (plan_generate never asks for it).
#include "pipeline/startup.h"

#include <chrono>
#include <future>

#include "core/error.h"

#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/load_gpu.h"
#endif

namespace wan {

#ifdef WAN_HAVE_CUDA

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int kTextGroup = 0;  // read first: the prompts can be encoded while the experts stream
constexpr int kDiTGroup = 1;

}  // namespace

FastStart gpu_fast_start(const GeneratePlan& p, const DenoiserSpec& spec,
                         const std::vector<std::pair<Expert, int>>& uses, const RunHooks& hooks) {
  WAN_ASSERT(p.fast_start && !p.random_weights, "gpu_fast_start without a fast-start plan");
  const int gpu = parse_device(p.device);
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

  FastStart r;
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
  r.setup = since(t0);

  r.cond = p.prompt_embeds;
  r.uncond = p.negative_embeds;
  if (te) {
    loader->wait_group(kTextGroup);
    r.load_text_encoder = since(t0);
    emit(ProgressEvent::End, Stage::LoadTextEncoder, r.load_text_encoder);
    check_cancel();
    const Clock::time_point t1 = Clock::now();
    emit(ProgressEvent::Begin, Stage::EncodeText, 0);
    const PromptTokenizer tk = tokens.get();
    if (!r.cond.defined()) r.cond = te->encode_ids(tk.ids(p.prompt));
    check_cancel();
    if (!r.uncond.defined()) r.uncond = te->encode_ids(tk.ids(p.negative_prompt));
    r.text_encode = since(t1);
    emit(ProgressEvent::End, Stage::EncodeText, r.text_encode);
    if (!p.keep_text_encoder) te.reset();  // frees its device memory before the DiT's arena exists
  }
  check_cancel();
  const Clock::time_point t2 = Clock::now();
  emit(ProgressEvent::Begin, Stage::WarmUp, 0);
  dit->warm_up(uses);  // arena + plans + graph capture, while the experts stream
  r.warm_up = since(t2);
  emit(ProgressEvent::End, Stage::WarmUp, r.warm_up);

  const cuda::LoadStats st = loader->finish();
  r.load_wall = since(t0);
  loader.reset();
  emit(ProgressEvent::End, Stage::LoadDiT, r.load_wall);
  r.bytes = st.bytes + st.fallback_bytes;
  r.gb_per_s = st.gb_per_s();
  r.dit = std::move(dit);
  r.text = std::move(te);
  return r;
}

#else

FastStart gpu_fast_start(const GeneratePlan& p, const DenoiserSpec&, const std::vector<std::pair<Expert, int>>&,
                         const RunHooks&) {
  WAN_THROW("--device ", p.device, ": this build of wan has no CUDA support (configure with a CUDA toolkit)");
}

#endif

}  // namespace wan
