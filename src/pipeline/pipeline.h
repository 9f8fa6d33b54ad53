// The Wan 2.2 generation pipeline, CPU or GPU (spec §1, §7.5, §7.6, §9): plan (resolve defaults and
// validate every input without heavy work), then run (encode the prompts, sample with the two
// experts, decode with the VAE). Front ends (the `wan` CLI, later a server) are thin layers over
// this API; progress and cancellation go through RunHooks.
//
// Invariants: plan_generate() throws wan::Error (BadInput) for every invalid input before anything
// heavy happens (memory fit included); run_generate() writes no files itself (RunHooks::latents_done lets
// the front end write the latents before the decode); cancellation is checked between
// steps, stages and VAE chunks and surfaces as wan::Cancelled; everything that draws random numbers
// uses the seed (the noise) or the weights seed (random weights).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "models/config.h"
#include "core/tensor.h"
#include "lora/lora.h"
#include "pipeline/files.h"
#include "sampler/sampler.h"
#include "models/vae/vae_cpu.h"

namespace wan {

// T2V-A14B run (spec §7.5.1, CFG as one batch-2 forward):
//   1. prompt / negative prompt -> UMT5 embeddings (or given embeddings); an empty negative prompt
//      means the official default one (kDefaultNegativePrompt).
//   2. x = init latents, or philox_normal(seed, i) for element i of [16, T_lat, H/8, W/8]
//      (C-order index, the whole tensor is one stream keyed by the seed).
//   3. per step i: expert and guide scale from ExpertSchedule (t_i >= boundary*1000: high-noise
//      expert with guide_high, else low-noise with guide_low); the DiT runs once on the batch
//      (x, x) with timesteps (t_i, t_i) and contexts (prompt, negative); v = cfg_combine; the sampler
//      steps x (its multistep history spans the expert switch). A guide scale of exactly 1 runs the
//      conditional half alone (the guided velocity is then the conditional one).
//   4. VAE decode (clamped to [-1, 1]) -> video [3, F, H, W].
// Weights: the checkpoint's, or with `random_weights` every weight drawn from the engine RNG at the real
// sizes (models.h: the experts on the GPU or with the GPU's rule on the host, the text encoder on the
// GPU or the host, the VAE on the host); sizes from a make-checkpoint config name ("t2v-A14B", "tiny")
// or, with a model, from the checkpoint (whose tokenizer is then used; without one, stand-in tokens).
// Devices: "cpu" runs everything in float32; "cuda[:i]" encodes the text on the GPU (the encoder is
// freed before the DiT is created unless keep_text_encoder), runs the DiT and decodes on the GPU.
// With checkpoint weights on the GPU, when the text encoder and the experts' weights fit together
// (plan.fast_start), they stream in concurrently through one loader and the encoding and the DiT's
// warm-up overlap the load (pipeline/startup.h; the warm-up follows the encoding, the encoder freed
// first unless keep_text_encoder). Weights always stream from the files (runtime/load_gpu.h).
// Pausing and resuming: with stop_after_steps = N the run stops after step N and returns its RunState
// (latents, sampler history, the encoded text, the plan's fingerprint, the timings so far) instead of
// decoding; a plan with `resume` continues from such a state (its fingerprint must equal the plan's)
// and gives bit-identical latents to an uninterrupted run (the text is not encoded again). The same on
// several GPUs (pipeline/generate_parallel.h), where the fingerprint also names the layout.

// Thrown when RunHooks::cancel becomes true; not a wan::Error (it is not a failure).
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "cancelled"; }
};

// ---- what the user asked for (unset = the task's default) ----
// --vae-tile: auto (untiled unless the run's device memory plan needs tiles, then the largest candidate
// tile that fits), off (never tiled), or a fixed pixel tile (width x height, multiples of 64).
struct VaeTileRequest {
  enum Mode : uint8_t { Auto, Off, Fixed };
  Mode mode = Auto;
  int64_t width = 0, height = 0;  // Fixed: pixels
  bool operator==(const VaeTileRequest&) const = default;
};

struct GenerateOptions {
  std::string model;                       // checkpoint folder or file
  // ComfyUI component files instead of `model` (ckpt/layout.h detect_components): --dit / --dit-high /
  // --dit-low, --text-encoder, --vae, --tokenizer.
  ComponentFiles components;
  std::optional<Task> task;                // default: the checkpoint's task
  std::optional<std::string> prompt;
  std::optional<std::string> negative_prompt;  // empty or unset: the official default
  std::string prompt_embeds_file;          // "prompt_embeds" file instead of --prompt
  std::string negative_embeds_file;        // same format, instead of --negative-prompt
  std::string init_latents_file;           // "latents" file instead of the seeded noise
  // The image to animate (I2V-A14B: required; TI2V-5B: optional, text-only without it) and I2V's last
  // frame (optional). Read and sized while planning (conditioning.h).
  std::string image_file, last_image_file;
  // LoRAs (--lora / --lora-high / --lora-low), in the order given: they stack. Read and checked while
  // planning (headers only), merged into the weights as they load (lora/lora.h, lora/lora_gpu.h).
  std::vector<LoraSpec> loras;
  std::optional<int> width, height, frames;
  std::optional<int> steps;
  std::optional<double> shift;             // default: sample_shift (official) / flow_shift (diffusers)
  std::optional<float> guide_low, guide_high;
  std::optional<SolverKind> solver;        // default: the preset's, else UniPC
  std::optional<ScheduleKind> schedule;    // default: the preset's, else official
  std::vector<int64_t> timesteps;          // --timesteps: an explicit list (sampler.h make_schedule_from_timesteps)
  std::string preset;                      // --preset: a named recipe (sampler/presets.h); explicit options win
  std::optional<uint64_t> seed;            // unset: a random seed (reported in the plan)
  std::string device = "cpu";              // "cpu" | "cuda" | "cuda:<i>" (text encoder, DiT and VAE decode)
  bool verbose = false;                    // print the GPU memory plan
  std::string attention = "auto";          // GPU attention kernel: auto (own on sm_90, else cuDNN) | own | cudnn
  std::string gemm = "bf16";               // the GPU DiT's block GEMMs: bf16 (exact) | fp8 (cuda::DiTGemm, one GPU)
  bool decode = true;                      // false: latents only (the VAE is not checked for the device)
  // Weights. random_weights: every weight drawn from the engine RNG (no checkpoint files needed);
  // without `model` the sizes are those of make-checkpoint config `config` (default: the task's name,
  // e.g. "t2v-A14B"; "tiny" for tests) with `layers` > 0 overriding the DiT depth.
  bool random_weights = false;
  uint64_t weights_seed = 0;
  std::string config;
  int layers = 0;
  bool keep_text_encoder = false;          // cuda: keep the GPU text encoder resident next to the DiT
  // cuda, one GPU (issue 27): the device bytes the run may use (0: the free memory) and the pinned host
  // bytes its weights may take when swapped or streamed (0: the machine's memory).
  int64_t memory_budget = 0, host_memory_budget = 0;
  // --vae-tile: the decode in spatial tiles (models/vae/vae_tiling.h) to bound the decoder's device memory.
  VaeTileRequest vae_tile;
  // cuda: plan against the device's capacity (less a margin for the context), not its free memory now: a
  // server whose model cache (model_cache.h) holds memory it frees for the run when needed.
  bool plan_as_owner = false;
  std::string resume_file;                 // continue the run saved in this state file
  int stop_after_steps = 0;                // > 0: stop after this step and return the state (no decode)
  // One plan for every rank of a multi-GPU run (pipeline/generate_parallel.h): the device fits of the
  // text encoder and of the DiT depend on the rank and the layout and are checked there, not here.
  bool parallel = false;
  // The files the front end will write ("--output" names the video): plan_generate refuses any that is
  // one of the run's inputs or another output (files.h check_generate_outputs).
  std::vector<NamedFile> outputs;
};

struct RunState;
class RunMemoryPlan;  // runtime/memory_plan.h
namespace cuda {
struct MemoryPlan;    // models/dit/dit_gpu.h (CUDA builds)
}

// ---- resolved and validated ----
struct GeneratePlan {
  CheckpointInfo ckpt;
  Task task = Task::T2V_A14B;
  int width = 0, height = 0, frames = 0;
  Shape latent_shape;                      // [z, T_lat, H_lat, W_lat]
  int64_t seq_len = 0;                     // DiT tokens per sample
  SamplerConfig sampler;
  std::string preset;                      // the preset the sampling came from ("" = none)
  SigmaSchedule schedule;
  double boundary = 0;                     // 0: single model
  float guide_low = 0, guide_high = 0;
  ExpertSchedule experts;
  uint64_t seed = 0;
  bool seed_random = false;                // seed was drawn because none was given
  int fps = 16;
  // Text: either embeddings from files (defined tensors) or prompts to encode.
  std::string prompt, negative_prompt;     // negative resolved to the default when empty
  Tensor prompt_embeds, negative_embeds;   // [L, text_dim] when given as files
  bool needs_text_encoder = false;
  T5Config t5;                             // when needs_text_encoder
  Tensor init_latents;                     // latent_shape, when given
  // The conditioning images [3, H, W] f32 in [-1, 1], already sized as the task does (conditioning.h);
  // undefined without --image / --last-image. The VAE encodes them before the DiT loads.
  std::string image_file, last_image_file;
  Tensor image, last_image;
  std::string image_sizing;                // how the image became the video size, for describe()
  // LoRA terms per DiT, checked against its weight table (null: none). A14B: one set per expert the
  // schedule uses; TI2V-5B: lora_high holds the single model's.
  std::vector<LoraSpec> loras;
  std::shared_ptr<const LoraSet> lora_high, lora_low;
  VaeConfig vae;
  int64_t weights_peak_bytes = 0;          // largest set of f32 weights held at once
  std::string device = "cpu";              // where the DiT runs: "cpu" | "cuda[:i]"
  std::string attention = "auto";          // GPU attention kernel (GenerateOptions::attention)
  std::string gemm = "bf16";               // GenerateOptions::gemm
  bool verbose = false;                    // print the run's GPU memory plan (describe())
  // Weights (GenerateOptions::random_weights). Without a model, ckpt is a stand-in with no components
  // (root names the configuration) that carries the task, the DiT config and the VAE version.
  bool random_weights = false;
  uint64_t weights_seed = 0;
  std::string weights;                     // "checkpoint" or "random (seed S, ...)", for humans
  bool stand_in_tokens = false;            // no tokenizer file: models.h stand_in_token_ids
  bool text_on_gpu = false;                // the prompts are encoded by the GPU text encoder
  bool keep_text_encoder = false;          // ... which stays resident next to the DiT
  int64_t t5_device_bytes = 0;             // its device bytes (weights + activation headroom)
  int64_t vae_device_bytes = 0;            // the GPU decoder's (weights + arena + reserve; conv workspace at its
                                           // limit unless that did not fit: plan_gpu_run); 0: no decode
  int64_t vae_encoder_device_bytes = 0;    // the GPU image encoder's (I2V / TI2V); 0: no image
  int64_t host_weights_bytes = 0;          // cuda: host memory for weights at once (VAE + one tensor)
  int64_t memory_budget = 0, host_memory_budget = 0;  // GenerateOptions'
  VaeTileRequest vae_tile;                 // GenerateOptions'
  // The decode's spatial tiles (off: untiled): the fixed request's, or (auto, one GPU) the largest of
  // vae_tiling_candidates whose decoder fits the run's memory plan (choose_residency). vae_device_bytes is
  // the decoder planned for its tile.
  VaeTiling vae_tiling;
  bool plan_as_owner = false;                          // GenerateOptions'
  int residency = 0;                       // cuda: the chosen weight residency (plan_gpu_dit_memory's choice)
  std::string residency_name;              // its name ("resident", "expert swap", "block streaming (3 slots)")
  // cuda, checkpoint weights: the text encoder and both experts stream to the device concurrently
  // through one loader (pipeline/startup.h) when they fit next to each other; else one after the other.
  bool fast_start = false;
  // cuda, one GPU: the run-level device memory plan (what each stage holds; printed with verbose) that
  // plan_generate checked, and the DiT's arena plan in it, which the DiT's creation then only allocates.
  std::shared_ptr<const RunMemoryPlan> memory;
  std::string memory_plan_note;            // how long planning it took (printed with verbose)
  std::shared_ptr<const cuda::MemoryPlan> dit_memory;
  // Pausing and resuming.
  int stop_after_steps = 0;
  std::string resume_file;
  std::shared_ptr<const RunState> resume;  // read and checked against `fingerprint` by plan_generate
                                           // (several GPUs: by run_generate_parallel)
  bool seed_from_state = false;            // no --seed: the resumed state's
  // A multi-GPU run: "<N> GPUs, <layout>", set by run_generate_parallel once the layout is resolved
  // (pipeline/generate_parallel.h); part of the fingerprint's "numerics", so a state resumes only on
  // the layout that saved it (layouts round differently). Empty: one device.
  std::string parallel;
  std::string fingerprint;                 // plan_fingerprint(*this)
  std::string describe() const;            // multi-line human summary (task, sizes, schedule, memory)
};

GeneratePlan plan_generate(const GenerateOptions& o);

// What must be equal for a saved state to continue in another process: a JSON object of strings
// ("task", "weights", "numerics", "video", "latents", "noise", "steps", "sampler", "schedule", "shift",
// "guide", "boundary", "prompt", "negative"; prompts and embeddings by a 64-bit FNV-1a hash). Numerics:
// "cpu float32", or "cuda bf16" followed by ", fp8 block GEMMs" (--gemm fp8), ", fp8 self-attention"
// (--attention own-fp8) and ", <GeneratePlan::parallel>" (several GPUs) where they apply.
std::string plan_fingerprint(const GeneratePlan& p);
// The keys whose values differ, as "key: saved vs now" parts joined by "; " (empty when equal).
std::string fingerprint_differences(const std::string& saved, const std::string& now);

// ---- running ----
enum class Stage { LoadTextEncoder, EncodeText, LoadDiT, Denoise, LoadVae, Decode, WarmUp, EncodeImage };
const char* stage_name(Stage s);  // "load text encoder", "encode text", ..., "warm-up", "encode image"

struct ProgressEvent {
  enum Kind { Begin, Advance, End } kind = Begin;
  Stage stage = Stage::Denoise;
  int done = 0, total = 0;   // Advance: units done so far (steps, VAE chunks)
  double seconds = 0;        // seconds since the stage began
  std::string detail;        // Advance of Denoise: "t=999 high" (timestep and expert)
};
using ProgressFn = std::function<void(const ProgressEvent&)>;

struct RunHooks {
  ProgressFn progress;                        // may be empty
  const std::atomic<bool>* cancel = nullptr;  // polled between units of work
  // Called once with the final latents [z, T, H, W] before the decode starts (not for a paused run; on
  // several GPUs in rank 0's process): a front end writes them there, so a failed or interrupted decode
  // keeps them. May be empty; what it throws ends the run.
  std::function<void(const Tensor& latents)> latents_done;
  // Optional: the video as uint8 RGB frames (quantised as formats/video.h does) while the decode runs,
  // so a writer can overlap it. video_begin(F, H, W) is called once when the decode starts and returns
  // the caller's buffer for all frames ([F, H, W, 3], alive until the run returns); video_ready(n) says
  // frames [0, n) are in it (a GPU decode delivers them chunk by chunk, a CPU decode at its end). With
  // both set, GenerateResult::video stays undefined. What they throw ends the run.
  std::function<uint8_t*(int frames, int height, int width)> video_begin;
  std::function<void(int ready)> video_ready;
  bool streams_video() const { return video_begin && video_ready; }
};

// Seconds per stage. With the GPU fast start (GeneratePlan::fast_start) the loads overlap each other,
// the text encoding and the warm-up: load_wall is then the load's wall time (start of the load to
// every weight on the device), load_text_encoder / load_dit the times from that start until the text
// encoder's / the experts' weights were resident, and load_vae the VAE read on a host thread meanwhile.
struct Timings {
  double load_text_encoder = 0, text_encode = 0, load_dit = 0, denoise = 0, load_vae = 0, vae_decode = 0;
  double warm_up = 0;    // GPU: plans and CUDA graph capture before the first step
  double image_encode = 0;  // I2V / TI2V: the VAE encoding of the image (its weights' read is in load_vae)
  double load_wall = 0;  // > 0: the overlapped load's wall time (see above)
  double startup = 0;    // process start to the first denoising step (0: no step run)
  std::vector<double> step_seconds;
  double load() const { return load_wall > 0 ? load_wall : load_text_encoder + load_dit + load_vae; }
  double mean_step() const;
};
// Field sums, step times concatenated (a then b): the timings of a run done in several processes.
Timings merge_timings(const Timings& a, const Timings& b);

// A paused run (--stop-after-steps / --save-state, --resume; file format in files.h).
struct RunState {
  int step = 0;                   // steps done (the sampler's index)
  Tensor latents;                 // [z, T, H, W] f32 after `step` steps
  SamplerState sampler;           // multistep history after `step` steps
  Tensor prompt_embeds, negative_embeds;  // [L, text_dim] f32: the run's text (not encoded again)
  std::string fingerprint;        // plan_fingerprint() of the run that saved it
  Timings timings;                // of the processes so far (load, encode, the steps done)
  int64_t peak_device_bytes = 0;  // their peaks
  int64_t peak_rss_bytes = 0;
};

struct GenerateResult {
  Tensor latents;  // [z, T_lat, H_lat, W_lat] final (normalised) latents; after stop: the paused ones
  Tensor video;    // [3, F, H, W] in [-1, 1]; undefined when decode was not requested, the run paused,
                   // or RunHooks streamed the frames
  Timings timings;                // this process
  std::optional<RunState> state;  // set when the run stopped after plan.stop_after_steps
  int first_step = 0;             // steps already done when this process started (resume)
  Timings earlier;                // of the processes before a resumed run (zero otherwise)
  int64_t earlier_peak_device_bytes = 0, earlier_peak_rss_bytes = 0;
  // Device memory in use (cudaMemGetInfo total - free) on the run's GPU: before the run, and the
  // largest value sampled at stage ends, after every step and while the VAE decoder is alive. 0 on CPU.
  int64_t device_bytes_at_start = 0, peak_device_bytes = 0;
  // GPU fast start: bytes streamed from the checkpoint files and their rate over the load's wall time.
  uint64_t load_bytes = 0;
  double load_gb_per_s = 0;
  double load_setup_s = 0;  // of the load's wall time: until the loader started (objects, allocations)
};

// decode = false stops after sampling (latents only). `cache` (model_cache.h, wan serve): models are taken
// from it when they match the plan and left there for the next run.
struct ModelCache;
GenerateResult run_generate(const GeneratePlan& plan, const RunHooks& hooks, bool decode = true,
                            ModelCache* cache = nullptr);

// Latents -> video [3, F, H, W] in [-1, 1] with the checkpoint's VAE (load + decode, reported as
// the LoadVae and Decode stages; seconds added to timings when given). latents must have z_dim
// channels. device "cuda[:i]" decodes on the GPU in bf16 (Wan 2.1 VAE only).
// peak_device_bytes (optional): max with the device memory in use while the GPU decoder is alive.
Tensor decode_latents(const CheckpointInfo& ckpt, const VaeConfig& vae, const Tensor& latents, const RunHooks& hooks,
                      Timings* timings = nullptr, const std::string& device = "cpu",
                      int64_t* peak_device_bytes = nullptr);

// Frames per second of a task's videos (16 for the A14B tasks, 24 for TI2V-5B; spec §1.2).
int task_fps(Task t);

// Initial latents of a seed: dst[i] = philox_normal(seed, i).
Tensor seeded_latents(const Shape& shape, uint64_t seed);

// Peak resident memory of this process so far (getrusage maxrss), bytes.
int64_t peak_rss_bytes();
// Seconds since this process started (Linux: /proc/self/stat start time vs CLOCK_BOOTTIME, 10 ms
// resolution); 0 when unknown.
double process_age_seconds();

}  // namespace wan
