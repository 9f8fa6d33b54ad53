// `wan generate` on several GPUs: the T2V pipeline of pipeline.h with the DiT's sequence- and
// CFG-parallel forward (models/dit/dit_gpu.h Options::parallel) on every rank of a dist::launch, started
// either as one thread per local GPU (--gpus N, --devices 0,1,...) or as one process per GPU by mpirun /
// srun / WAN_RANK (runtime/dist/launch.h): the same rank code either way. How a run proceeds on
// each rank, how it fails and its numerics: above run_generate_parallel.
// Not supported with several GPUs (one clear error): --keep-text-encoder, --device cpu. CFG-parallel
// needs every step guided (guide scale != 1).
//
// Invariants: every check that depends only on the options (flags, layout products, heads, CFG)
// happens before any device work and before the launch; each rank checks its share of the run-level
// memory plan (text encoder and decoder on rank 0, the DiT's plan for the layout) first thing inside
// the launch, so a rank that cannot fit ends all before any model is loaded.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dist/launch.h"
#include "runtime/dist/parallel_layout.h"
#include "pipeline/pipeline.h"

#ifdef WAN_HAVE_NCCL
#include "models/dit/dit_gpu.h"
#include "pipeline/denoiser.h"
#endif

namespace wan {

// ---- options (host only: tested without GPUs) ----

// The command line's multi-GPU options as given (nullopt / empty = absent).
struct ParallelArgs {
  std::string gpus, devices;                // --gpus N | --devices 0,1,...
  bool cfg = false;                         // --cfg-parallel
  std::optional<std::string> ulysses, ring; // --ulysses U, --ring R
  std::optional<std::string> device;        // --device, when given
};

struct ParallelRequest {
  dist::LaunchOptions launch;  // in-process: one rank per device; launcher: devices by local rank
  bool launcher = false;       // one process per rank (mpirun / srun / WAN_RANK, world > 1)
  std::string launcher_name;   // "WAN", "OMPI", "PMI", "SLURM"
  int rank = 0;                // this process's rank (launcher), else 0
  int world = 1;               // ranks of the run
  bool cfg = false;            // --cfg-parallel
  int ulysses = 0, ring = 0;   // 0: not given (the automatic choice fills them)
  int device = -1;             // this process's first GPU (in-process: rank 0's), -1: not decided here
  bool active() const { return world > 1; }
  std::string where() const;   // "in-process, devices 0,1" or "one process per rank (SLURM), rank 2 of 4"
};

// Reads the options and the launcher's environment (`env`: getenv-like; empty = the process's) and
// adjusts `o`: a multi-GPU run gets o->device = "cuda:<this process's first GPU>" and o->parallel; --gpus 1
// or one device is the single-GPU run on that device. `visible_gpus` (< 0: ask CUDA) decides a
// launcher rank's device as dist::launch does. Throws one wan::Error (BadInput) for: --gpus with
// --devices, --device cpu (or cuda:i) with several GPUs, a layout flag without several GPUs, a
// non-integer or zero degree, products that cannot match the GPUs (cfg x ulysses x ring vs the world,
// --cfg-parallel on an odd count), and the options not supported with several GPUs.
ParallelRequest parse_parallel_request(const ParallelArgs& a, GenerateOptions* o, const dist::EnvLookup& env = {},
                                       int visible_gpus = -1);

// The layout of a planned run: the request's degrees completed and checked against the model's heads
// and CFG (every step guided). Throws one wan::Error.
dist::Layout resolve_parallel_layout(const ParallelRequest& r, const GeneratePlan& p);

// The plan summary's line of a multi-GPU run ("gpus     4 (in-process, devices 0,1,2,3): cfg 2 x ...").
std::string describe_parallel(const ParallelRequest& r, const dist::Layout& l, bool random_weights);

// ---- the sharded load (host arithmetic) ----

// Byte ranges [begin, end) of one weight allocation of `total` bytes that each of `world` ranks
// streams: `tensors` are the (offset, bytes) of the tensors in ascending offset order; tensor i goes
// to rank min(world - 1, floor((offset + bytes/2)·world / total)) (monotone, so each rank's tensors are
// contiguous); the cuts lie at tensor starts, range r + 1 begins where range r ends, the last ends at
// `total` (alignment padding belongs to the range it lies in). Ranges may be empty.
std::vector<std::pair<size_t, size_t>> shard_ranges(const std::vector<std::pair<size_t, size_t>>& tensors,
                                                    size_t total, int world);

// ---- running ----

struct ParallelRankStats {
  int rank = 0, device = 0;
  uint64_t load_bytes = 0;     // DiT weight bytes this rank streamed from the files (0: random weights)
  int load_tensors = 0;
  double load_s = 0;           // its share, start to on the device
  double broadcast_s = 0;      // the weight broadcasts (after the barrier that waits for every share)
  double dit_s = 0;            // DiT create + share + barrier + broadcasts (or the random draw)
  int64_t peak_device_bytes = 0;  // cudaMemGetInfo in use, sampled at stage ends and after every step
};

struct ParallelRun {
  bool output_rank = false;    // this process holds rank 0: plan and result are set; it writes the outputs
  GeneratePlan plan;
  ParallelRequest request;
  dist::Layout layout;
  GenerateResult result;       // rank 0's: latents, video, timings (load_bytes: all ranks together)
  std::vector<ParallelRankStats> ranks;  // every rank's, by rank
  std::string describe() const;          // the lines of the summary (layout, per-rank load)
};

// Per rank (rank 0 = the first device of --devices, or launcher rank 0):
//   1. rank 0 encodes the prompts once (GPU text encoder, freed afterwards); with --prompt-embeds files
//      nothing is encoded. The other ranks meanwhile create their DiT and load their share of the weights.
//   2. DiT: random weights are drawn on every rank (the same values everywhere, no files); checkpoint
//      weights are loaded sharded: each expert's single device allocation is cut at tensor boundaries
//      (with --gemm fp8 at those of e4m3 fusion groups, whose row scales follow them:
//      DiTGpu::weight_ranges) into `world` contiguous byte ranges (shard_ranges), rank r streams the
//      tensors of range r from the files (cuda::DeviceLoader, pinned staging, conversion on the GPU),
//      then every range is broadcast in place from its owner (ncclBroadcast per range), so every rank
//      ends with all weights, bit-identical to a single-GPU load.
//   3. After a barrier (every share loaded, the text encoded): rank 0 broadcasts the encoded text (sizes
//      first, then [L_cond + L_uncond, text_dim] f32) and the initial latents, so a seed drawn at random
//      (no --seed) or files read per process cannot make the ranks diverge.
//      With --resume, rank 0's state (latents, text, sampler history) is what is broadcast; every
//      process must read the same state file (each plans with it) and resume after the same step.
//   4. Sampling is replicated: every rank runs the pipeline's own denoising loop (pipeline_internal.h,
//      the one run_generate runs: expert switch, guided step, solver update, progress, pause) on a
//      Denoiser whose guided_step is collective (make_parallel_denoiser: the parallel forward, after
//      which every rank holds the whole DiT output, bit-identical on every rank, then the one-GPU
//      fused guidance + solver kernel), so x and the history stay identical everywhere. The first
//      forward of an (expert, batch) runs eagerly (it sets up the NCCL connections), the second
//      captures the CUDA graph (NCCL calls included), later ones replay it.
//      --stop-after-steps N: every rank stops after step N; rank 0 returns the state (GenerateResult::
//      state, written by its process only) and nothing is decoded. The state file is the one-GPU
//      format; its fingerprint's "numerics" names the layout ("cuda bf16, 2 GPUs, cfg 1 x ulysses 2 x
//      ring 1"), so it resumes with --resume on the same layout (any device list, in-process or one
//      process per rank: those are bit-identical) and gives the uninterrupted run's bits; a state of
//      another layout or of one GPU is refused in one line (other roundings), and vice versa.
//   5. rank 0 frees its DiT and decodes the video with the VAE on its GPU (not when paused); the other
//      ranks free theirs and wait (a ParallelSession's ranks keep theirs for the next job, below). The decode stays on one GPU: splitting the causal decoder's time
//      chunks over ranks is left out (it is a small part of a run). Only rank 0's process writes output
//      files (the CLI, after the launch has succeeded on every rank, through its all-or-nothing
//      writers), so a failure leaves no output behind.
// Failure: any rank's error (bad input, out of memory, a lost peer, Ctrl-C) ends every rank
// with the same one-line wan::Error within seconds (dist::launch); ranks that wait for a busy rank wait
// in RankContext::barrier or an eager collective, never inside a replayed CUDA graph (before every step
// the ranks agree to go on, which also stops all of them at the same step on a cancel). Test hooks
// (dist::maybe_fail, WAN_DIST_FAIL_AT): "text" (rank 0, before encoding), "load" (after the rank's
// share), "step" (before every step), "stepN" (before step N), "decode" (rank 0) besides the
// launcher's "init" and "start".
// Numerics: within bf16 of the single-GPU engine (the parallel forward's token slices and partial
// softmax merges round differently); deterministic: two runs of one layout are bit-identical.
//
// Plans (o.parallel set; every process plans the same options), resolves the layout, calls on_plan in
// the output process (before any device work) and runs the ranks of `r` (as above).
// Throws the launch's one error; Cancelled when hooks.cancel was set. Progress goes to hooks.progress
// from rank 0 only. decode = false stops after sampling.
ParallelRun run_generate_parallel(GenerateOptions o, const ParallelRequest& r, const RunHooks& hooks,
                                  bool decode = true,
                                  const std::function<void(const GeneratePlan&, const dist::Layout&)>& on_plan = {});

// run_generate_parallel's plan: `o` planned for several GPUs (o.parallel, o.decode = decode), the layout
// resolved and named in the plan's numerics, a --resume state checked against it; output_rank set.
// Host work (every process plans the same options); result and ranks stay empty.
ParallelRun plan_parallel(GenerateOptions o, const ParallelRequest& r, bool decode);

struct ParallelSessionStats {
  uint64_t built = 0;     // models jobs built: the DiT (every rank's, counted once), text encoder, VAE weights
  uint64_t reused = 0;    // jobs that ran on the kept DiT
  uint64_t launches = 0;  // launches started (the first job's, and one after every failed job)
};

// Jobs in turn on the GPUs of an in-process request (`wan serve`'s layout instances), with each rank's
// DiT kept between jobs. One background thread holds a dist::launch whose ranks wait for the next job,
// run it as run_generate_parallel's ranks do (the same rank code, so a job gives the same bits as
// run_generate_parallel of its plan and layout) and wait again; the NCCL groups are made once per launch.
// A job reuses the kept DiT when every rank's serves it (equal pipeline_detail::dit_cache_key, a planned
// latent no smaller) and rank 0 has room for its text and image encoders beside it; else every rank
// frees its DiT, checks its memory plan and builds anew. Rank 0 also keeps its text encoder (beside a
// reused DiT, while the decoder's bytes and a margin stay free) and the VAE's host weights, under their
// model_cache.h keys. Before the decode rank 0 frees the kept text encoder, then its DiT, only when the
// decoder would not fit beside them. preload() builds the models a job of its plan uses, without a job.
// Failure: a job's error ends the launch on every rank (dist::launch); run() throws it (Cancelled when
// hooks.cancel was set) and the next run() starts a new launch (the models load again). A job cancelled
// between steps (the ranks agree on it) throws Cancelled and keeps the launch and the DiT; cancelled
// before its steps, it ends the launch as an error does. A hang ends through the launch's watchdog, so run() never waits forever. Idle ranks
// mark progress while they wait, so an idle session does not trip the watchdog.
// Not thread-safe: one caller at a time (run() serialises). The destructor ends the ranks.
class ParallelSession {
 public:
  explicit ParallelSession(ParallelRequest req);  // in-process only (no launcher)
  ~ParallelSession();
  ParallelSession(const ParallelSession&) = delete;
  ParallelSession& operator=(const ParallelSession&) = delete;

  // One job of plan `p` (from plan_parallel) on `layout`: rank 0's result; `ranks` (optional) gets every
  // rank's figures. A layout other than the running launch's ends that launch first.
  GenerateResult run(const GeneratePlan& p, const dist::Layout& layout, const RunHooks& hooks, bool decode,
                     std::vector<ParallelRankStats>* ranks = nullptr);
  // Every rank builds (or keeps) the DiT that jobs of plan `p` use, and nothing else: `wan serve`'s
  // load at start. Throws as run() does.
  void preload(const GeneratePlan& p, const dist::Layout& layout);
  ParallelSessionStats stats() const;  // any thread

 private:
  struct Launch;
  void end_launch();
  GenerateResult post(const GeneratePlan& p, const dist::Layout& layout, const RunHooks& hooks, bool decode,
                      bool load_only, std::vector<ParallelRankStats>* ranks);
  ParallelRequest req_;
  std::mutex run_mu_;                 // one run() at a time
  std::shared_ptr<Launch> launch_;    // the running launch (null: none)
  mutable std::mutex stats_mu_;
  ParallelSessionStats stats_;
};

#ifdef WAN_HAVE_NCCL
// One rank's DiT of plan `p` (the experts its schedule uses) with the parallel groups `par` (alive as
// long as the DiT): random weights drawn on the rank, or checkpoint weights loaded sharded and
// broadcast over ctx.comm (see run_generate_parallel, step 2). Collective over every rank of ctx.
// `stats` gets the rank's load figures. `planned`: the DiT's plan already checked as part of the rank's
// run-level plan (rank_run_memory); null: DiTGpu::create checks its own fit.
std::unique_ptr<cuda::DiTGpu> make_rank_dit(const dist::RankContext& ctx, const GeneratePlan& p,
                                            const cuda::DiTGpu::Options::Parallel& par, bool verbose,
                                            ParallelRankStats* stats,
                                            std::shared_ptr<const cuda::MemoryPlan> planned = nullptr);

// One rank's DiT of plan `p` (from make_rank_dit, laid out as `layout`) as the sampling loop sees it
// (pipeline/denoiser.h). forward() and guided_step() are collective across the ranks of ctx: every rank
// must call them in the same order with the same arguments (the pipeline's loop does, from the same
// plan, text, latents and sampler state); each ends with the whole output on every rank. guided_step
// is the one-GPU fused step (the DiT output stays on the device, one guidance + solver kernel of
// cuda::SamplerGpu on this rank's x), so the numerics are those of the replicated sampler;
// begin_sampling() and sync_sampling() are local (x and the history are equal on every rank).
// before_step (may be empty) runs at the start of every guided_step with the step's index (failure and
// cancellation checks; it may throw). warm_up() does nothing (the first forward of each (expert, batch) sets up the NCCL
// connections eagerly). ctx must outlive the denoiser.
std::unique_ptr<Denoiser> make_parallel_denoiser(const dist::RankContext& ctx, const GeneratePlan& p,
                                                 const dist::Layout& layout, std::unique_ptr<cuda::DiTGpu> dit,
                                                 std::function<void(int)> before_step = {});
#endif

}  // namespace wan
