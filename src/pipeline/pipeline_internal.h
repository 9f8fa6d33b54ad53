// Internal to the pipeline (pipeline.cpp, generate_parallel.cpp, denoiser_gpu.cpp): what the single- and the
// multi-GPU runs share.
//   - StageTimer: the Begin / Advance / End progress events of one stage and its duration. The constructor
//     honours the run's cancel flag (throws Cancelled), so a cancelled run stops at the next stage boundary;
//     hooks without progress or cancel make it a plain timer.
//   - context_batch, uses_expert, expert_roles, denoiser_spec: the DiT's text batch, the experts a schedule
//     needs and the denoiser of a plan.
//   - denoise, begin_result, complete_state, check_resume: the denoising loop and the pause / resume
//     bookkeeping around it. Every run executes this one loop: the CPU and one-GPU pipeline
//     (run_generate) and every rank of a multi-GPU run (generate_parallel.cpp), where the Denoiser's
//     guided_step is collective across the ranks (make_parallel_denoiser).
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "core/tensor.h"
#include "pipeline/denoiser.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "sampler/sampler.h"

namespace wan::pipeline_detail {

class StageTimer {
 public:
  using Clock = std::chrono::steady_clock;
  StageTimer(const RunHooks& h, Stage s, int total = 0) : h_(h), s_(s), total_(total), t0_(Clock::now()) {
    if (h_.cancel && h_.cancel->load(std::memory_order_relaxed)) throw Cancelled();
    emit(ProgressEvent::Begin, 0, "");
  }
  void advance(int done, const std::string& detail = "") { emit(ProgressEvent::Advance, done, detail); }
  double end() {
    const double s = elapsed();
    emit(ProgressEvent::End, total_, "");
    return s;
  }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  void emit(ProgressEvent::Kind k, int done, const std::string& detail) {
    if (!h_.progress) return;
    ProgressEvent e;
    e.kind = k;
    e.stage = s_;
    e.done = done;
    e.total = total_;
    e.seconds = elapsed();
    e.detail = detail;
    h_.progress(e);
  }
  const RunHooks& h_;
  Stage s_;
  int total_;
  Clock::time_point t0_;
};

// Context batch [B, Lmax, D] of f32 text embeddings [L_b, D] (rows past each prompt's length are zero) and
// the lengths L_b; the widths must agree.
Tensor context_batch(const std::vector<const Tensor*>& embeds, std::vector<int64_t>* lens);

// Whether any step of the schedule runs expert e.
bool uses_expert(const ExpertSchedule& es, Expert e);

// The checkpoint roles of the experts used, high-noise first (a checkpoint with one DiT serves as the
// high-noise expert).
inline std::vector<Role> expert_roles(const CheckpointInfo& ckpt, bool use_high, bool use_low) {
  const bool single = ckpt.has(Role::DiT) && !ckpt.has(Role::DiTHigh);
  std::vector<Role> roles;
  if (use_high) roles.push_back(single ? Role::DiT : Role::DiTHigh);
  if (use_low) roles.push_back(Role::DiTLow);
  return roles;
}

// The denoiser of plan p's run: device, experts, latent shape, weights' seeds and the DiT's checked
// memory plan (p.dit_memory).
DenoiserSpec denoiser_spec(const GeneratePlan& p);
// The distinct (expert, batch) forwards of steps [first_step, end): what the GPU warm-up captures.
std::vector<std::pair<Expert, int>> forward_uses(const GeneratePlan& p, int first_step);
// The plan's text encoder, built (loaded, or drawn): on GPU `gpu` into te_gpu, on the CPU (gpu < 0) into te.
void build_text_encoder(const GeneratePlan& p, int gpu, std::unique_ptr<GpuTextEncoder>& te_gpu,
                        std::shared_ptr<TextEncoder>& te);

// The denoising stage of a run. From x [z, T, H, W] (the initial or the resumed latents) and the sampler
// state `from` (nullptr: step 0; else a state of p's sampler, e.g. p.resume->sampler), runs the plan's
// remaining steps on `dit` (expert and guide scale from p.experts, the batch-2 CFG context of cond and
// uncond, or the conditional half alone for a guide scale of 1) as one Denoise stage: cancellation
// (hooks.cancel) before every step, progress after it. Stops after step p.stop_after_steps when the
// run reaches it. after_step() (may be empty) runs after every step (device memory probes).
// Sets r->timings' startup (at the first step), step_seconds and denoise, r->latents (after the last
// step run) and, when stopped, r->state's step, latents and sampler history (complete_state adds the
// rest). dit stays usable afterwards (the caller frees it).
void denoise(const GeneratePlan& p, Denoiser& dit, const Tensor& cond, const Tensor& uncond, const Tensor& x,
             const SamplerState* from, const RunHooks& hooks, const std::function<void()>& after_step,
             GenerateResult* r);

// A resumed plan: r's first_step and the figures of the processes before (p.resume's); else nothing.
void begin_result(const GeneratePlan& p, GenerateResult* r);

// A paused run (r->state set by denoise): the state gets the run's text (cond, uncond), p's fingerprint
// and the timings and peaks of every process so far (r->earlier* merged with r->timings,
// r->peak_device_bytes and this process's peak RSS).
void complete_state(const GeneratePlan& p, const Tensor& cond, const Tensor& uncond, GenerateResult* r);

// A multi-GPU plan once its layout is resolved: p.parallel = parallel ("<N> GPUs, <layout>") and the
// fingerprint's "numerics" updated to it. Only that key changes: the rest stays as plan_generate made it
// (before a resumed state's text replaced the prompts, so that it still names the prompts, not the
// embeddings, exactly as the one-GPU plan's).
void set_parallel_numerics(GeneratePlan& p, const std::string& parallel);
// The fingerprint's "numerics": "cpu float32", "cuda bf16" or "cuda bf16, <p.parallel>" (fingerprint.cpp).
std::string fingerprint_numerics(const GeneratePlan& p);

// Throws one wan::Error (BadInput) when p resumes a state saved by a run with another fingerprint:
// "--resume F: the state was saved by a different run: <differences>". plan_generate calls it, except
// for a multi-GPU plan (GenerateOptions::parallel), whose fingerprint names its layout only once the
// layout is resolved (run_generate_parallel calls it then).
void check_resume(const GeneratePlan& p);

// Throws Cancelled when the run's cancel flag is set (between stages, steps and latent frames).
inline void check_cancel(const RunHooks& h) {
  if (h.cancel && h.cancel->load(std::memory_order_relaxed)) throw Cancelled();
}

// Load (or draw) the VAE weights, then decode (the LoadVae and Decode stages; decode.cpp).
// The run's VAE weights: read from the checkpoint, or drawn (--weights random).
VaeWeights run_vae_weights(const GeneratePlan& p);

// The VAE decode's inputs. run_generate gets them ready on a host thread while the DiT denoises: the
// weights read (or drawn), and on a GPU the decoder planned for the latents' size.
struct VaeAhead {
  VaeWeights weights;
  double read_s = -1;                      // >= 0: the weights were read on that thread, in this time
  std::unique_ptr<GpuVaeDecoder> decoder;  // GPU, planned ahead (else decode_with plans it)
};
// `tiling` (vae_tiling.h): the decode in spatial tiles; the GPU decoder then streams no chunks (the blend
// is on the host): the video goes to the hooks whole at the end.
Tensor decode_with(const std::function<VaeAhead()>& get, const VaeConfig& vae, const Tensor& latents,
                   const RunHooks& hooks, Timings* timings, const std::string& device, int64_t* peak_device_bytes,
                   const VaeTiling& tiling = {});
// --vae-tile into the plan (plan_generate, before the device plan): p.vae_tile, and p.vae_tiling for a
// fixed tile (checked against the VAE's spatial factor; one GPU only). Auto is resolved by choose_residency.
void plan_vae_tiling(const GenerateOptions& o, GeneratePlan& p);
// "untiled" or "N tiles of WxH pixels, overlap at least ..." for describe().
std::string vae_tiling_str(const VaeTiling& t, const VaeConfig& vae, const Shape& latents);

// The image stage of I2V / TI2V: the VAE weights into *weights unless they are there already (the
// LoadVae stage), then the image video encoded on the plan's device into the DiT's condition (the
// EncodeImage stage; conditioning.h build_condition).
LatentCondition encode_condition(const GeneratePlan& p, const RunHooks& hooks, VaeWeights* weights, Timings* timings);

// LoRAs (lora_plan.cpp): reads and checks every --lora file against the DiT's weight table for the
// experts the schedule uses (headers only), before any model loads; fills p.loras, p.lora_high/low.
void plan_lora(const std::vector<LoraSpec>& loras, GeneratePlan& p);
// The LoRA lines of describe(): per expert, each file's format, strength and matched tensors (verbose:
// every name and skipped key).
std::string describe_lora(const GeneratePlan& p);

}  // namespace wan::pipeline_detail
