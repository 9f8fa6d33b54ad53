// Multi-GPU `wan generate` (see generate_parallel.h): the rank code (CUDA + NCCL builds): text on rank 0
// and its broadcast, the DiT with the sharded load, the collective denoiser driven by the pipeline's own
// loop, the decode on rank 0; then the entry points. The host part is parallel_request.cpp.
#include "pipeline/generate_parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>

#include "core/clock.h"
#include "core/error.h"
#include "pipeline/denoiser.h"
#include "pipeline/model_cache.h"
#include "pipeline/models.h"
#include "pipeline/pipeline_internal.h"
#include "pipeline/startup.h"
#include "sampler/sampler.h"

#ifdef WAN_HAVE_CUDA
#include "kernels/rng.h"  // device_count
#endif
#ifdef WAN_HAVE_NCCL
#include <cuda_runtime.h>

#include "ckpt/layout.h"
#include "kernels/check.h"
#include "lora/lora_gpu.h"
#include "runtime/load_gpu.h"
#include "sampler/sampler_gpu.h"
#include "pipeline/dit_step_gpu.h"
#include "runtime/dist/comm.h"
#include "pipeline/parallel_groups.h"
#include "pipeline/parallel_rank.h"
#endif

namespace wan {

// ---------------------------------------------------------------------------------------------------
// Rank code (CUDA + NCCL)

#ifdef WAN_HAVE_NCCL

namespace {

using pipeline_detail::uses_expert;
using pipeline_detail::DeviceBytes;
using pipeline_detail::StreamOwner;

// `bytes` of host memory from rank `root` to every rank (in place: the source on root, the destination
// elsewhere), through a device buffer and ncclBroadcast on the world communicator.
void broadcast_host(const dist::RankContext& ctx, dist::Comm& world, cudaStream_t s, void* host, size_t bytes,
                    int root) {
  if (bytes == 0) return;
  DeviceBytes d(bytes);
  if (ctx.rank == root) CUDA_CHECK(cudaMemcpyAsync(d.p, host, bytes, cudaMemcpyHostToDevice, s));
  world.broadcast(d.p, bytes, root, s);
  if (ctx.rank != root) CUDA_CHECK(cudaMemcpyAsync(host, d.p, bytes, cudaMemcpyDeviceToHost, s));
  ctx.sync(s);
}

// Rank 0's sampler state (index and history) to every rank: sizes first, then the vectors. A state
// of n elements holds at most n per vector (Sampler::set_state validates the rest).
void broadcast_sampler_state(const dist::RankContext& ctx, dist::Comm& world, cudaStream_t s, SamplerState* st,
                             size_t numel) {
  int64_t hdr[5] = {st->index, static_cast<int64_t>(st->n), static_cast<int64_t>(st->m_last.size()),
                    static_cast<int64_t>(st->m_prev.size()), static_cast<int64_t>(st->last_sample.size())};
  broadcast_host(ctx, world, s, hdr, sizeof hdr, 0);
  const int64_t n = static_cast<int64_t>(numel);
  WAN_ASSERT(hdr[0] >= 0 && hdr[1] >= 0 && hdr[1] <= n && hdr[2] >= 0 && hdr[2] <= n && hdr[3] >= 0 && hdr[3] <= n &&
                 hdr[4] >= 0 && hdr[4] <= n,
             "sampler state from rank 0: step ", hdr[0], ", ", hdr[1], " elements");
  st->index = static_cast<int>(hdr[0]);
  st->n = static_cast<size_t>(hdr[1]);
  std::vector<float>* vs[3] = {&st->m_last, &st->m_prev, &st->last_sample};
  for (int k = 0; k < 3; ++k) {
    vs[k]->resize(static_cast<size_t>(hdr[2 + k]));
    broadcast_host(ctx, world, s, vs[k]->data(), vs[k]->size() * sizeof(float), 0);
  }
}

// The rank's DiT as the sampling loop sees it (see make_parallel_denoiser in the header). The step is
// the one-GPU GPU denoiser's (denoiser_gpu.cpp, fused sampling): the DiT output in device memory, one
// fused guidance + solver kernel (cuda::SamplerGpu) on this rank's copy of x, ordered on this object's
// stream; the forward is the parallel one, which ends with the whole output on every rank.
class ParallelDenoiser final : public Denoiser {
 public:
  ParallelDenoiser(const dist::RankContext& ctx, const GeneratePlan& p, const dist::Layout& layout,
                   std::unique_ptr<cuda::DiTGpu> dit, std::function<void(int)> before_step)
      : ctx_(ctx), layout_(layout), dit_(std::move(dit)), before_step_(std::move(before_step)) {
    WAN_ASSERT(dit_ != nullptr, "parallel denoiser without a DiT");
    const bool use_high = uses_expert(p.experts, Expert::High);
    high_index_ = use_high ? 0 : -1;  // make_rank_dit's order: expert_roles, high-noise first
    low_index_ = uses_expert(p.experts, Expert::Low) ? (use_high ? 1 : 0) : -1;
  }

  // Collective: every rank runs the parallel forward on the same inputs and gets the whole output.
  void forward(Expert e, const Tensor& x, int batch, float t, const Tensor& ctx, const std::vector<int64_t>& lens,
               float* out) override {
    WAN_ASSERT(layout_.cfg == 1 || batch == 2, "CFG-parallel forward without guidance");
    dit_forward_host(*dit_, index(e), x, batch, t, ctx, lens, cond_, out, stream_.s);
    ctx_.sync(stream_.s);
  }

  void set_condition(const LatentCondition& c) override {
    Denoiser::set_condition(c);
    fused_.set_condition(c);
  }

  // Local: x and the state are the same on every rank (broadcast from rank 0 before).
  void begin_sampling(Sampler& s, const Tensor& x) override {
    fused_.begin(s, x, dit_->config(), ctx_.device, stream_.s);
  }

  // Collective: the parallel forward of step s.index(), then the fused guidance + solver update.
  void guided_step(Sampler& s, Expert e, float guide, const Tensor& ctx, const std::vector<int64_t>& lens) override {
    if (before_step_) before_step_(s.index());
    WAN_ASSERT(layout_.cfg == 1 || ctx.dim(0) == 2, "CFG-parallel step without guidance");
    fused_.step(*dit_, index(e), s, guide, ctx, lens, stream_.s);
    ctx_.sync(stream_.s);
  }

  // Local: this rank's copy (equal on every rank).
  Tensor sync_sampling(Sampler& s) override { return fused_.sync(s, stream_.s); }

  // The DiT back (a session keeps it for the next job); the denoiser is done with it.
  std::unique_ptr<cuda::DiTGpu> release_dit() {
    CUDA_CHECK(cudaStreamSynchronize(stream_.s));
    return std::move(dit_);
  }

 private:
  int index(Expert e) const {
    const int i = e == Expert::High ? high_index_ : low_index_;
    WAN_ASSERT(i >= 0, "expert not loaded");
    return i;
  }

  const dist::RankContext& ctx_;
  dist::Layout layout_;
  StreamOwner stream_;  // first: outlives the buffers and the DiT that use it
  std::unique_ptr<cuda::DiTGpu> dit_;
  std::function<void(int)> before_step_;
  int high_index_ = -1, low_index_ = -1;
  FusedDiTStep fused_;     // x, the DiT output and the history on this rank's device
};

// Stage events: rank 0 passes the caller's hooks, the others none.
using StageEvents = pipeline_detail::StageTimer;

using pipeline_detail::RankKeep;
using pipeline_detail::RankZeroOut;

constexpr int kStatFields = 8;  // the per-rank figures all-gathered after the denoising

using Step = std::function<void()>;

// Step 1 (rank 0): the text encoder is loaded (its fit was checked with the rank's plan), encodes what
// the plan lacks, and is freed before this rank's DiT is created. A session's rank 0 (kept: its model
// cache) takes the kept encoder of the same key, and keeps it after the encoding while keep_room bytes
// stay free beside it (keep_room < 0: never; the DiT is still to be built).
bool encode_text_on_rank0(const dist::RankContext& ctx, const GeneratePlan& p, const RunHooks& hooks,
                          const Step& check, const Step& probe, Timings& tm, Tensor& cond, Tensor& uncond,
                          ModelCache* kept, int64_t keep_room) {
  dist::maybe_fail(ctx, "text");
  std::unique_ptr<GpuTextEncoder> te;
  const std::string key = kept ? pipeline_detail::text_cache_key(p) : std::string();
  const bool reused = kept && kept->text_gpu && kept->text_key == key;
  if (reused) {
    te = std::move(kept->text_gpu);
  } else {
    if (kept) kept->drop_text();
    StageEvents st(hooks, Stage::LoadTextEncoder);
    std::shared_ptr<TextEncoder> cpu;  // unused: rank 0 encodes on its GPU
    pipeline_detail::build_text_encoder(p, ctx.device, te, cpu);
    tm.load_text_encoder = st.end();
    probe();
  }
  check();
  const int n = (cond.defined() ? 0 : 1) + (uncond.defined() ? 0 : 1);
  StageEvents st(hooks, Stage::EncodeText, n);
  int done = 0;
  if (!cond.defined()) {
    cond = te->encode(p.prompt);
    st.advance(++done, "prompt");
  }
  check();
  if (!uncond.defined()) {
    uncond = te->encode(p.negative_prompt);
    st.advance(++done, "negative prompt");
  }
  tm.text_encode = st.end();
  if (kept && keep_room >= 0 && static_cast<int64_t>(gpu_free_bytes(ctx.device)) >= keep_room) {
    kept->text_gpu = std::move(te);
    kept->text_key = key;
  } else if (kept) {
    kept->text_key.clear();
  }
  return reused;
}

// Step 3: text, latents and sampler state from rank 0 (sizes first, then the values), so a seed drawn
// at random (no --seed) or files read per process (embeddings, initial latents, a resumed state) cannot
// make the ranks diverge. On ranks > 0 cond, uncond, x and from are made here.
void share_inputs(const dist::RankContext& ctx, dist::Comm& world, cudaStream_t s, const GeneratePlan& p,
                  const GenerateResult& r, Tensor& cond, Tensor& uncond, Tensor& x, SamplerState& from,
                  LatentCondition& image) {
  const bool r0 = ctx.rank == 0;
  // The image's condition (rank 0 encoded it); its shapes follow from the plan every rank holds.
  if (p.image.defined()) {
    const Shape& ls = p.latent_shape;
    Tensor& t = p.task == Task::I2V_A14B ? image.y : image.first_frame;
    const Shape shape = p.task == Task::I2V_A14B ? Shape{ls[0] + 4, ls[1], ls[2], ls[3]} : Shape{ls[0], 1, ls[2], ls[3]};
    if (!r0) t = Tensor::empty(DType::F32, shape);
    WAN_ASSERT(t.shape() == shape, "image condition ", t.shape().str(), ", expected ", shape.str());
    broadcast_host(ctx, world, s, t.data(), t.nbytes(), 0);
  }
  const int64_t D = p.ckpt.dit.text_dim;
  int64_t hdr[3] = {0, 0, D};
  if (r0) {
    WAN_ASSERT(cond.defined() && uncond.defined() && cond.dim(1) == D && uncond.dim(1) == D, "text width");
    hdr[0] = cond.dim(0);
    hdr[1] = uncond.dim(0);
  }
  broadcast_host(ctx, world, s, hdr, sizeof hdr, 0);
  WAN_ASSERT(hdr[2] == D && hdr[0] >= 1 && hdr[1] >= 1 && hdr[0] <= p.ckpt.dit.text_len && hdr[1] <= p.ckpt.dit.text_len,
             "text sizes from rank 0: ", hdr[0], ", ", hdr[1], " x ", hdr[2]);
  Tensor text = Tensor::empty(DType::F32, Shape{hdr[0] + hdr[1], D});
  if (r0) {
    std::memcpy(text.f32(), cond.f32(), cond.nbytes());
    std::memcpy(text.f32() + hdr[0] * D, uncond.f32(), uncond.nbytes());
  }
  broadcast_host(ctx, world, s, text.data(), text.nbytes(), 0);
  if (!r0) {
    cond = Tensor::empty(DType::F32, Shape{hdr[0], D});
    uncond = Tensor::empty(DType::F32, Shape{hdr[1], D});
    std::memcpy(cond.f32(), text.f32(), cond.nbytes());
    std::memcpy(uncond.f32(), text.f32() + hdr[0] * D, uncond.nbytes());
  }
  x = !r0                      ? Tensor::empty(DType::F32, p.latent_shape)
      : p.resume               ? p.resume->latents.clone()
      : p.init_latents.defined() ? p.init_latents.clone()
                                 : seeded_latents(p.latent_shape, p.seed);
  broadcast_host(ctx, world, s, x.data(), x.nbytes(), 0);
  if (p.resume) from = p.resume->sampler;
  broadcast_sampler_state(ctx, world, s, &from, static_cast<size_t>(x.numel()));
  WAN_CHECK(from.index == r.first_step, "--resume ", p.resume_file, ": rank 0's state continues after step ",
            from.index, " but rank ", ctx.rank, "'s after step ", r.first_step,
            " (every process must read the same state file)");
}

// Step 5: every rank's figures to every rank (fixed-size rows, all-gathered). Collective.
std::vector<double> gather_rank_stats(const dist::RankContext& ctx, dist::Comm& world, cudaStream_t s,
                                      const ParallelRankStats& me) {
  std::vector<double> rows(static_cast<size_t>(ctx.world) * kStatFields, 0.0);
  double* mine = rows.data() + static_cast<size_t>(ctx.rank) * kStatFields;
  const double v[kStatFields] = {static_cast<double>(me.rank),        static_cast<double>(me.device),
                                 static_cast<double>(me.load_bytes),  static_cast<double>(me.load_tensors),
                                 me.load_s,                           me.broadcast_s,
                                 me.dit_s,                            static_cast<double>(me.peak_device_bytes)};
  std::copy(v, v + kStatFields, mine);
  const size_t row = kStatFields * sizeof(double);
  DeviceBytes d(rows.size() * sizeof(double));
  char* base = static_cast<char*>(d.p);
  CUDA_CHECK(cudaMemcpyAsync(base + static_cast<size_t>(ctx.rank) * row, mine, row, cudaMemcpyHostToDevice, s));
  world.all_gather(base + static_cast<size_t>(ctx.rank) * row, base, row, s);
  CUDA_CHECK(cudaMemcpyAsync(rows.data(), base, rows.size() * sizeof(double), cudaMemcpyDeviceToHost, s));
  ctx.sync(s);
  return rows;
}

// The VAE's host weights as rank 0 reads them beside the other work (shared with a session's cache), and
// the seconds the read took.
using SharedVae = std::pair<std::shared_ptr<const VaeWeights>, double>;

// Step 6 (rank 0, not paused): the VAE weights read meanwhile, then the decode.
std::shared_ptr<const VaeWeights> decode_on_rank0(const dist::RankContext& ctx, const GeneratePlan& p,
                                                  const RunHooks& hooks, const Step& check,
                                                  std::future<SharedVae>& vae_read, ParallelRankStats& me,
                                                  GenerateResult& r) {
  Timings& tm = r.timings;
  dist::maybe_fail(ctx, "decode");
  check();
  std::shared_ptr<const VaeWeights> w;
  {
    StageEvents st(hooks, Stage::LoadVae);
    w = vae_read.get().first;  // read meanwhile: the time here is the wait for it
    tm.load_vae = st.end();
  }
  check_gpu_vae(p.vae, cat("cuda:", ctx.device));
  check();
  const int chunks = static_cast<int>(r.latents.dim(1));
  StageEvents st(hooks, Stage::Decode, chunks);
  int64_t peak = 0;
  r.video = gpu_vae_decode_tracked(p.vae, *w, r.latents, ctx.device, &peak);
  me.peak_device_bytes = std::max(me.peak_device_bytes, peak);
  st.advance(chunks, "");
  tm.vae_decode = st.end();
  return w;
}

// Rank 0's result: the gathered rows become the per-rank figures and the run's load totals.
void hand_back(const dist::RankContext& ctx, const std::vector<double>& rows, const ParallelRankStats& me,
               GenerateResult& r, RankZeroOut* out) {
  out->ranks.clear();
  double total_bytes = 0, slowest = 0;
  for (int k = 0; k < ctx.world; ++k) {
    const double* v = rows.data() + static_cast<size_t>(k) * kStatFields;
    ParallelRankStats q;
    q.rank = static_cast<int>(v[0]);
    q.device = static_cast<int>(v[1]);
    q.load_bytes = static_cast<uint64_t>(v[2]);
    q.load_tensors = static_cast<int>(v[3]);
    q.load_s = v[4];
    q.broadcast_s = v[5];
    q.dit_s = v[6];
    q.peak_device_bytes = k == 0 ? me.peak_device_bytes : static_cast<int64_t>(v[7]);
    total_bytes += v[2];
    slowest = std::max(slowest, q.load_s);
    out->ranks.push_back(q);
  }
  r.load_bytes = static_cast<uint64_t>(total_bytes);
  r.load_gb_per_s = slowest > 0 ? total_bytes / slowest / 1e9 : 0;
  out->result = std::move(r);
}

// Whether every rank goes on to the next step: none saw the cancel flag. Collective over the world
// communicator, eager (outside any CUDA graph) and synchronous, so the ranks enter a step's collectives
// only together: a replayed graph's NCCL kernels waiting for a rank that stopped or failed could not be
// unblocked, whereas an eager all-reduce is aborted with the launch when a rank fails. Throws
// StepsStopped on every rank at once (the step's host sync makes its cost nil: the previous step has
// ended).
void agree_step(const dist::RankContext& ctx, dist::Comm& world, cudaStream_t s, const std::atomic<bool>* cancel) {
  ctx.check_abort();
  const bool stop = cancel && cancel->load(std::memory_order_relaxed);
  double any = 0;
  try {
    any = world.all_reduce_max_host(stop ? 1.0 : 0.0, s);
  } catch (const Error&) {
    ctx.check_abort();  // aborted by a failure elsewhere: that failure, not NCCL's
    throw;
  }
  ctx.check_abort();
  if (any > 0) throw pipeline_detail::StepsStopped();
}

// A session's job (keep.keep_dit): whether every rank's kept DiT serves plan p (the same key, a latent
// no larger) and, on rank 0, leaves room for the text and image encoders that run beside it. Agreed
// over the world communicator (one flag per rank, all-gathered), so all ranks reuse or all rebuild (the
// build is collective); a rank that rebuilds frees its kept DiT here, before its memory check. Collective.
bool agree_reuse(const dist::RankContext& ctx, dist::Comm& world, cudaStream_t s, const GeneratePlan& p,
                 const std::string& device, RankKeep& keep) {
  bool mine = keep.dit && keep.key == pipeline_detail::dit_cache_key(p) && p.latent_shape.numel() <= keep.latent;
  if (mine && ctx.rank == 0) {
    const bool text_kept = keep.models.text_gpu && keep.models.text_key == pipeline_detail::text_cache_key(p);
    const size_t t5 = p.needs_text_encoder && !text_kept ? gpu_text_encoder_bytes(p.t5) : 0;
    const size_t enc = p.image.defined() ? gpu_vae_encoder_bytes(p.vae, p.image, device) : 0;
    mine = gpu_free_bytes(ctx.device) >= std::max(t5, enc);
  }
  const int32_t flag = mine ? 1 : 0;
  std::vector<int32_t> flags(static_cast<size_t>(ctx.world), 0);
  DeviceBytes d(flags.size() * sizeof(int32_t));
  int32_t* base = static_cast<int32_t*>(d.p);
  CUDA_CHECK(cudaMemcpyAsync(base + ctx.rank, &flag, sizeof flag, cudaMemcpyHostToDevice, s));
  world.all_gather(base + ctx.rank, base, sizeof flag, s);
  CUDA_CHECK(cudaMemcpyAsync(flags.data(), base, flags.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  ctx.sync(s);
  const bool every = std::all_of(flags.begin(), flags.end(), [](int32_t f) { return f == 1; });
  if (!every) keep.drop_dit();
  return every;
}

// Device bytes a session's rank 0 keeps free beside the models it keeps (the sampler's buffers, the
// decode's inputs and outputs).
constexpr int64_t kKeepMargin = int64_t(1) << 30;

// A session's preload on rank 0, after the DiT: the VAE's host weights, and the text encoder when it
// fits beside the DiT with room for the decoder (as preload_models does on one GPU).
void preload_rank0(const dist::RankContext& ctx, const GeneratePlan& p, const std::string& device,
                   std::future<SharedVae>& vae_read, ModelCache* kept, const std::string& vae_key, int built,
                   int reused, RankZeroOut* out) {
  if (vae_read.valid()) {
    kept->vae = vae_read.get().first;
    kept->vae_key = vae_key;
  }
  const int64_t decoder = static_cast<int64_t>(gpu_vae_decoder_bytes(p.vae, p.latent_shape, device));
  if (p.needs_text_encoder && !(kept->text_gpu && kept->text_key == pipeline_detail::text_cache_key(p)) &&
      static_cast<int64_t>(gpu_free_bytes(ctx.device)) >=
          static_cast<int64_t>(gpu_text_encoder_bytes(p.t5)) + decoder + kKeepMargin) {
    kept->drop_text();
    pipeline_detail::build_text_encoder(p, ctx.device, kept->text_gpu, kept->text_cpu);
    kept->text_key = pipeline_detail::text_cache_key(p);
    ++built;
  }
  out->built = built;
  out->reused = reused;
}

}  // namespace

void pipeline_detail::rank_job(dist::RankContext& ctx, const GeneratePlan& p, const dist::Layout& layout,
                               const RunHooks& caller, bool decode, RankKeep& keep, RankZeroOut* out,
                               bool load_only) {
  WAN_ASSERT(!load_only || keep.keep_dit, "a DiT loaded for no job");
  if (load_only) decode = false;
  const bool r0 = ctx.rank == 0;
  RunHooks hooks;
  hooks.cancel = caller.cancel;
  if (r0) hooks.progress = caller.progress;
  const Step check = [&] {
    ctx.check_abort();
    if (hooks.cancel && hooks.cancel->load(std::memory_order_relaxed))
      throw Error("interrupted (Ctrl-C)", ErrorKind::Internal);
  };
  GenerateResult r;
  Timings& tm = r.timings;
  pipeline_detail::begin_result(p, &r);
  ParallelRankStats me;
  me.rank = ctx.rank;
  me.device = ctx.device;
  r.device_bytes_at_start = me.peak_device_bytes = gpu_memory_in_use(ctx.device);
  const Step probe = [&] { me.peak_device_bytes = std::max(me.peak_device_bytes, gpu_memory_in_use(ctx.device)); };
  dist::Comm world(ctx.comm, false);
  StreamOwner stream;
  const cudaStream_t s = stream.s;
  DenoiserSpec spec = pipeline_detail::denoiser_spec(p);
  spec.device = cat("cuda:", ctx.device);
  spec.parallel = layout;

  // 0. This rank's share of the run-level memory plan, checked before any work on the device. A reused
  // DiT already holds its share (planned for a latent at least as large; agree_reuse checked what runs
  // beside it), so it is not counted again.
  const bool reuse = keep.keep_dit && agree_reuse(ctx, world, s, p, spec.device, keep);
  // Rank 0 of a session keeps its text encoder and VAE weights (keep.models) beside a kept DiT; a DiT to
  // build was planned for a device without them.
  ModelCache* kept = r0 && keep.keep_dit ? &keep.models : nullptr;
  if (kept && !reuse) kept->drop_text();
  GpuDiTMemory mem;
  if (!reuse) {
    mem = plan_gpu_dit_memory(p.ckpt, spec);
    const RunMemoryPlan run = rank_run_memory(p, mem, spec.device, layout, r0, decode && p.stop_after_steps == 0);
    if (p.verbose) std::fprintf(stderr, "rank %d: %s", ctx.rank, run.str().c_str());
    run.check(spec.device, mem.free_bytes);  // the launch names the rank
  }
  if (!keep.groups)
    keep.groups.emplace(dist::make_groups(ctx.comm, layout, [&](ncclComm_t c) { ctx.register_comm(c); }));

  // Rank 0 reads the VAE's weights on a host thread while the rest runs (not for a run that pauses),
  // or takes the kept ones.
  std::future<SharedVae> vae_read;
  const std::string vae_key = pipeline_detail::vae_cache_key(p);
  const bool vae_kept = kept && kept->vae && kept->vae_key == vae_key && !p.image.defined();
  if (vae_kept)
    vae_read = std::async(std::launch::deferred, [w = kept->vae] { return SharedVae(w, 0.0); });
  else if (r0 && (load_only ? kept != nullptr : decode && p.stop_after_steps == 0) && !p.image.defined())
    vae_read = std::async(std::launch::async, [&p] {
      const Clock::time_point t0 = Clock::now();
      auto w = std::make_shared<const VaeWeights>(pipeline_detail::run_vae_weights(p));
      return SharedVae(std::move(w), seconds_since(t0));
    });

  // 1. The text, once, on rank 0 (the other ranks go on to their DiT; resumed: the state's, nothing to encode).
  Tensor cond = p.prompt_embeds, uncond = p.negative_embeds;
  const bool text = r0 && !load_only && p.needs_text_encoder;
  const int64_t text_room =
      reuse ? static_cast<int64_t>(gpu_vae_decoder_bytes(p.vae, p.latent_shape, spec.device)) + kKeepMargin : -1;
  const bool text_reused = text && encode_text_on_rank0(ctx, p, hooks, check, probe, tm, cond, uncond, kept, text_room);
  // I2V / TI2V: rank 0 encodes the image on its GPU; the decode reuses the VAE weights.
  LatentCondition image;
  if (r0 && !load_only && p.image.defined()) {
    VaeWeights w;
    image = pipeline_detail::encode_condition(p, hooks, &w, &tm);
    probe();
    if (decode && p.stop_after_steps == 0)
      vae_read = std::async(std::launch::deferred, [w = std::make_shared<const VaeWeights>(std::move(w))] {
        return SharedVae(w, 0.0);
      });
  }
  const bool vae_weights = r0 && (vae_read.valid() || p.image.defined());
  const int built = (reuse ? 0 : 1) + (text && !text_reused ? 1 : 0) + (vae_weights && !vae_kept ? 1 : 0);
  const int reused = (reuse ? 1 : 0) + (text_reused ? 1 : 0) + (vae_kept ? 1 : 0);
  check();

  // 2. The DiT: drawn, or this rank's share streamed and every share broadcast (ends with a barrier:
  // rank 0's text is ready too); or the kept one, after the same barrier.
  std::unique_ptr<cuda::DiTGpu> dit;
  {
    StageEvents st(hooks, Stage::LoadDiT);
    if (reuse) {
      dit = std::move(keep.dit);
      ctx.barrier();
    } else {
      dit = make_rank_dit(ctx, p, keep.groups->view(), p.verbose && r0, &me, mem.plan);
    }
    tm.load_dit = st.end();
    probe();
  }
  if (load_only) {
    keep.dit = std::move(dit);
    if (!reuse) {
      keep.key = pipeline_detail::dit_cache_key(p);
      keep.latent = p.latent_shape.numel();
    }
    if (r0) preload_rank0(ctx, p, spec.device, vae_read, kept, vae_key, built, reused, out);
    return;
  }

  // 3. The inputs, as rank 0 has them.
  Tensor x;
  SamplerState from;  // step 0: index 0, no history
  share_inputs(ctx, world, s, p, r, cond, uncond, x, from, image);

  // 4. Sampling: the pipeline's own loop (pipeline_internal.h) on the collective denoiser; every rank
  // holds the whole DiT output after each step and keeps x. Before every step the ranks agree to go on
  // (agree_step): a cancel stops all of them at the same step (StepsStopped), and a rank that failed
  // leaves the others in that eager all-reduce, which the launch aborts.
  {
    ParallelDenoiser den(ctx, p, layout, std::move(dit), [&](int index) {
      dist::maybe_fail(ctx, "step");
      dist::maybe_fail(ctx, cat("step", index).c_str());
      agree_step(ctx, world, s, hooks.cancel);
    });
    const auto keep_dit = [&] {
      if (!keep.keep_dit) return;
      keep.dit = den.release_dit();
      if (!reuse) {
        keep.key = pipeline_detail::dit_cache_key(p);
        keep.latent = p.latent_shape.numel();
      }
    };
    den.set_condition(image);
    RunHooks loop;
    loop.progress = hooks.progress;
    try {
      pipeline_detail::denoise(p, den, cond, uncond, x, from.index > 0 ? &from : nullptr, loop, probe, &r);
    } catch (const pipeline_detail::StepsStopped&) {
      keep_dit();  // every rank stopped between steps: nothing is in flight, the DiT serves the next job
      throw;
    }
    keep_dit();
  }  // one-shot: frees the experts before rank 0's VAE decoder is built

  // 5. Every rank's figures to every rank.
  const std::vector<double> rows = gather_rank_stats(ctx, world, s, me);
  if (!r0) return;  // the others wait (in the launch's final barrier, or for a session's next job)

  // 6. Rank 0: the video, or (paused) the state. A kept DiT stays unless the decoder needs its memory.
  if (!r.state && caller.latents_done) caller.latents_done(r.latents);  // kept if the decode fails
  if (decode && !r.state) {
    const size_t need = gpu_vae_decoder_bytes(p.vae, p.latent_shape, spec.device);
    if (kept && kept->text_gpu && gpu_free_bytes(ctx.device) < need) kept->drop_text();
    if (keep.dit && gpu_free_bytes(ctx.device) < need) keep.drop_dit();
    std::shared_ptr<const VaeWeights> w = decode_on_rank0(ctx, p, hooks, check, vae_read, me, r);
    if (kept && !p.image.defined()) {
      kept->vae = std::move(w);
      kept->vae_key = vae_key;
    }
  }
  probe();
  r.peak_device_bytes = me.peak_device_bytes;
  if (r.state) pipeline_detail::complete_state(p, cond, uncond, &r);
  out->built = built;
  out->reused = reused;
  hand_back(ctx, rows, me, r, out);
}

std::unique_ptr<Denoiser> make_parallel_denoiser(const dist::RankContext& ctx, const GeneratePlan& p,
                                                 const dist::Layout& layout, std::unique_ptr<cuda::DiTGpu> dit,
                                                 std::function<void(int)> before_step) {
  return std::make_unique<ParallelDenoiser>(ctx, p, layout, std::move(dit), std::move(before_step));
}

#endif  // WAN_HAVE_NCCL

// ---------------------------------------------------------------------------------------------------
// Entry points

ParallelRun plan_parallel(GenerateOptions o, const ParallelRequest& req, bool decode) {
  o.parallel = true;
  o.decode = decode;
  ParallelRun run;
  run.request = req;
  run.plan = plan_generate(o);
  run.layout = resolve_parallel_layout(req, run.plan);
  // The layout is part of the numerics (it rounds differently from one GPU and from other layouts):
  // a saved state resumes on the layout that saved it.
  pipeline_detail::set_parallel_numerics(run.plan, cat(req.world, " GPUs, ", dist::describe(run.layout)));
  pipeline_detail::check_resume(run.plan);
  run.output_rank = !req.launcher || req.rank == 0;
  return run;
}

ParallelRun run_generate_parallel(GenerateOptions o, const ParallelRequest& req, const RunHooks& hooks, bool decode,
                                  const std::function<void(const GeneratePlan&, const dist::Layout&)>& on_plan) {
  WAN_ASSERT(req.active(), "run_generate_parallel on one GPU");
#ifndef WAN_HAVE_NCCL
  (void)o, (void)hooks, (void)decode, (void)on_plan;
  WAN_THROW("several GPUs (", req.where(), "): this wan was built without NCCL (configure with CUDA and NCCL)");
#else
  ParallelRun run = plan_parallel(std::move(o), req, decode);
  if (run.output_rank && on_plan) on_plan(run.plan, run.layout);
  RankZeroOut zero;
  const GeneratePlan& plan = run.plan;
  const dist::Layout layout = run.layout;
  try {
    dist::launch(req.launch, [&](dist::RankContext& ctx) {
      RankKeep keep;  // one job: nothing kept
      pipeline_detail::rank_job(ctx, plan, layout, hooks, decode, keep, &zero);
    });
  } catch (const Error&) {
    if (hooks.cancel && hooks.cancel->load()) throw Cancelled();
    throw;
  }
  if (!run.output_rank) return run;
  run.result = std::move(zero.result);
  run.ranks = std::move(zero.ranks);
  return run;
#endif
}

}  // namespace wan
