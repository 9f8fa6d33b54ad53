// Flow-matching sampling of Wan 2.2 (spec §7): sigma/timestep schedules, the solvers (flow UniPC
// bh2 order 2 with the UniC corrector, flow DPM++ 2M midpoint, Euler), classifier-free guidance and
// the two-expert (high-noise / low-noise) schedule.
//
// Invariants (in full below the namespace line): the arithmetic is the reference schedulers' op by op
// in float32 (bit-identical to the PyTorch schedulers on the CPU); schedules are computed in float64 as
// the reference and stored as float32 sigmas; one Sampler carries its history across the expert
// switch; a step is plan_step()'s coefficients applied by step_element(), on the host or the GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sampler/sampler_step.h"  // SolverKind, StepCoeffs, SamplerState, step_element

namespace wan {

// Invariants:
//  - The arithmetic mirrors the reference schedulers op by op: scalar coefficients are float32
//    (the reference keeps them in 0-dim float32 tensors), the latent path is float32, nothing is
//    fused or reassociated (the build uses -ffp-contract=off). On the same inputs the results equal
//    the PyTorch schedulers run on the CPU bit for bit; tests/cpu/test_sampler.cpp checks this against
//    fixtures from diffusers (tools/make_sampler_fixtures.py).
//  - Schedules are computed in float64 exactly as the reference (numpy linspace, shift, int64
//    truncation of sigma*1000) and stored as float32 sigmas (steps + 1 entries, the last one 0).
//  - One Sampler object serves a whole run: its multistep history (the last two data predictions
//    and the sample that entered the last predictor) is carried across the expert switch.
//  - The sample passed to step() is the one the model saw; the caller may edit the latent between
//    steps (TI2V frame-0 replacement) and the sampler uses whatever it is given, as the reference.
//  - A step is its scalar coefficients (plan_step(): a function of the schedule and index() alone)
//    applied per element by step_element() (sampler/sampler_step.h). step() does exactly that on the
//    host; the GPU sampler (sampler/sampler_gpu.h) applies the same coefficients on the device, with the
//    history in device memory, after take_step() has advanced the index here.

// Official: the Wan repository's schedulers (UniPC and Euler on the FlowUniPCMultistepScheduler
// grid from float32(0.999), DPM++ on get_sampling_sigmas' grid from 1). Diffusers: the grid of
// diffusers' UniPCMultistepScheduler with use_flow_sigmas (what the converted Wan 2.2 repositories
// ship), used for every solver so the end-to-end test can follow WanPipeline.
enum class ScheduleKind { Official, Diffusers };

SolverKind solver_from_name(const std::string& s);   // throws wan::Error listing the valid names
const char* schedule_name(ScheduleKind k);           // "official", "diffusers"
ScheduleKind schedule_from_name(const std::string& s);

struct SamplerConfig {
  SolverKind solver = SolverKind::UniPC;
  int steps = 40;
  double shift = 12.0;  // official: sample_shift; diffusers: the scheduler config's flow_shift
  int num_train_timesteps = 1000;
  ScheduleKind schedule = ScheduleKind::Official;
};

struct SigmaSchedule {
  std::vector<float> sigmas;       // [steps + 1], strictly decreasing in [0, 1], last entry 0
  std::vector<int64_t> timesteps;  // [steps], trunc(sigma_f64 * num_train_timesteps): the DiT's t
};

// Official UniPC/Euler: sigma_i = linspace(float32(0.999), 0, N+1)[i]; official DPM++:
// linspace(1, 0, N+1)[i]; diffusers: linspace(1, 1/T, N+1)[i] (T = num_train_timesteps); each then
// shifted s*x/(1+(s-1)x) in float64; diffusers lowers a shifted sigma_0 within 1e-6 of 1 by 1e-6.
// Throws wan::Error on steps < 1, shift <= 0 or num_train_timesteps < 1.
SigmaSchedule make_schedule(const SamplerConfig& c);

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& c);
  // A custom schedule (validated: decreasing sigmas in [0, 1] ending at 0, one timestep per step;
  // UniPC needs sigma_0 < 1 because its second-order corrector cannot use lambda = -inf).
  Sampler(SolverKind solver, SigmaSchedule schedule);

  SolverKind solver() const { return solver_; }
  int steps() const { return static_cast<int>(sched_.timesteps.size()); }
  const std::vector<float>& sigmas() const { return sched_.sigmas; }
  const std::vector<int64_t>& timesteps() const { return sched_.timesteps; }
  int index() const { return index_; }  // the step the next step() call performs
  bool done() const { return index_ >= steps(); }
  int64_t timestep() const;             // timesteps()[index()]; throws when done()

  // One solver step: v is the (guided) model output at (x, timestep()), x [n] is replaced by the
  // sample at the next sigma. n must be the same on every call. Throws wan::Error when done().
  // Equals plan_step() applied by step_element() to every element, then the history rotation.
  void step(const float* v, float* x, size_t n);
  void reset();  // back to step 0 with no history

  // The scalar coefficients of the step index() performs (pure; throws wan::Error when done()).
  StepCoeffs plan_step() const;
  // plan_step(), then index() advances without touching any host buffer: for callers that keep x
  // and the history elsewhere (the GPU sampler). The host history is dropped: state() refuses until
  // set_state() brings the external state back.
  StepCoeffs take_step();

  // The resumable state (index + host history). Throws wan::Error after take_step() (the history is
  // not here).
  SamplerState state() const;
  // Restores a state (validated: index in [0, steps()], the vectors that index and solver need, all
  // of n elements, nothing else). The next step() must then pass the same n.
  void set_state(SamplerState st);

 private:
  SolverKind solver_;
  SigmaSchedule sched_;
  int index_ = 0;
  size_t n_ = 0;
  bool history_external_ = false;   // take_step() was used: the history lives with the caller
  std::vector<float> m_prev_;       // data prediction of the step before last (M[-2])
  std::vector<float> m_last_;       // data prediction of the last step (M[-1])
  std::vector<float> last_sample_;  // UniPC: the (corrected) sample that entered the last predictor
};

// Classifier-free guidance in float32, as the reference: out = v_u + g * (v_c - v_u).
// out may alias v_cond or v_uncond.
void cfg_combine(const float* v_cond, const float* v_uncond, float guide, float* out, size_t n);

// Which expert and guidance scale each step uses (spec §7.5): t >= boundary * num_train_timesteps
// selects the high-noise expert (DiT `transformer` in diffusers) with guide_high, otherwise the
// low-noise expert (`transformer_2`) with guide_low. A single-model task (TI2V-5B) has no boundary:
// every step is "High" (the only model) with guide_high.
enum class Expert { High, Low };
struct ExpertStep {
  Expert expert;
  float guide;
};
struct ExpertSchedule {
  std::vector<ExpertStep> steps;
  // boundary <= 0: single model. Throws wan::Error on boundary > 1.
  static ExpertSchedule make(const std::vector<int64_t>& timesteps, double boundary, float guide_low,
                             float guide_high, int num_train_timesteps = 1000);
  int num_high() const;
};

// Per-task sampling defaults of the official generate.py / configs (spec §1.2).
struct SamplingDefaults {
  int steps;
  double shift;     // sample_shift
  double boundary;  // 0 for the single-model TI2V-5B
  float guide_low;  // sample_guide_scale[0] (low-noise expert)
  float guide_high; // sample_guide_scale[1] (high-noise expert)
};
// task: "t2v-A14B", "i2v-A14B", "ti2v-5B" (the names of wan::task_name); throws on anything else.
SamplingDefaults sampling_defaults(const std::string& task);

}  // namespace wan
