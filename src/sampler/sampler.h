// Flow-matching sampling of Wan 2.2 (spec §7): sigma/timestep schedules (the task grids, the
// Wan2.2-Lightning grid, explicit LightX2V timestep lists), the solvers (flow UniPC bh2 order 2 with
// the UniC corrector, flow DPM++ 2M midpoint, Euler, LightX2V's step-distill update), classifier-free
// guidance and the two-expert (high-noise / low-noise) schedule.
//
// Invariants (in full below the namespace line): the arithmetic is the reference schedulers' op by op
// in float32 (bit-identical to the PyTorch schedulers on the CPU); schedules are computed as the
// reference does (float64 numpy or float32 torch) and stored as float32 sigmas; one Sampler carries
// its history across the expert switch; a step is plan_step()'s coefficients applied by
// step_element(), on the host or the GPU.
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
//  - Schedules are computed exactly as the reference: the task grids in float64 (numpy linspace,
//    shift, int64 truncation of sigma*1000), the distill grids in float32 torch ops (see
//    make_schedule_from_timesteps); stored as float32 sigmas (steps + 1 entries, the last one 0) with
//    the DiT's float timestep per step (SigmaSchedule::model_t).
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
// ship), used for every solver so the end-to-end test can follow WanPipeline. Lightning: the grid of
// Wan2.2-Lightning's EulerScheduler (wan/utils/fm_solvers_euler.py): t = float32(linspace(T, 0,
// N+1)), sigma = t / T, shifted, all in float32; the DiT sees the float t = sigma * T (1000, 937.5,
// 833.333, 625 for 4 steps at shift 5).
enum class ScheduleKind { Official, Diffusers, Lightning };

SolverKind solver_from_name(const std::string& s);   // throws wan::Error listing the valid names
const char* schedule_name(ScheduleKind k);           // "official", "diffusers", "lightning"
ScheduleKind schedule_from_name(const std::string& s);

struct SamplerConfig {
  SolverKind solver = SolverKind::UniPC;
  int steps = 40;
  double shift = 12.0;  // official: sample_shift; diffusers: the scheduler config's flow_shift
  int num_train_timesteps = 1000;
  ScheduleKind schedule = ScheduleKind::Official;
  // An explicit timestep list (--timesteps, LightX2V's denoising_step_list): when not empty it
  // replaces the grid (make_schedule_from_timesteps; `schedule` is then unused) and `steps` must
  // equal its size.
  std::vector<int64_t> timesteps = {};
  // StepDistill only: keep the latent in bf16 between steps, as LightX2V does under its default
  // DTYPE=BF16 / SENSITIVE_LAYER_DTYPE=None (BaseScheduler.step_pre casts it, step_post writes back).
  bool bf16_latents = false;
};

struct SigmaSchedule {
  std::vector<float> sigmas;       // [steps + 1], strictly decreasing in [0, 1], last entry 0
  // [steps] integer timesteps: the task grids' DiT t (trunc(sigma_f64 * T)); for the distill grids
  // trunc(model_t) (progress lines, ExpertSchedule on integers).
  std::vector<int64_t> timesteps = {};
  // [steps] the timestep the DiT is given, as the reference's float32 tensor: float(timesteps[i])
  // for the task grids, sigma_f32 * T in float32 for the distill grids (937.5, 833.3333). Sampler
  // fills it from `timesteps` when a custom schedule leaves it empty.
  std::vector<float> model_t = {};
};

// Official UniPC/Euler: sigma_i = linspace(float32(0.999), 0, N+1)[i]; official DPM++:
// linspace(1, 0, N+1)[i]; diffusers: linspace(1, 1/T, N+1)[i] (T = num_train_timesteps); each then
// shifted s*x/(1+(s-1)x) in float64; diffusers lowers a shifted sigma_0 within 1e-6 of 1 by 1e-6.
// Lightning: see ScheduleKind. A non-empty c.timesteps: make_schedule_from_timesteps.
// Throws wan::Error on steps < 1, shift <= 0 or num_train_timesteps < 1.
SigmaSchedule make_schedule(const SamplerConfig& c);

// An explicit timestep list as LightX2V's WanStepDistillScheduler.set_denoising_timesteps
// (lightx2v/models/schedulers/wan/step_distill/scheduler.py): the listed values are UNshifted
// indices into its 1000-entry float32 grid g = shift(torch.linspace(1, 0, T + 1)[:-1]), i.e.
// sigma_i = g[T - t_i] (torch's CPU linspace: fmaf(step, k, 1) below k = (T+1)/2, fmaf(-step,
// T - k, 0) from there; shift s*x / (1 + (s-1)*x) in float32); the DiT sees the float32
// model_t_i = sigma_i * T (not the listed value, not an integer); the final sigma is 0 (the last
// step lands on the data prediction). [1000, 750, 500, 250] at shift 5 gives sigmas 1, 0.9375,
// 0.8333333, 0.625, 0 and t = 1000, 937.5, 833.3333, 625: the same grid as Lightning's 4 steps.
// Throws wan::Error (BadInput, one line) unless 1 <= steps, every t_i is in [1, T] (t = 0 has no
// grid entry: sigma 0 is the end point) and the list decreases strictly; or on shift <= 0.
SigmaSchedule make_schedule_from_timesteps(const std::vector<int64_t>& timesteps, double shift,
                                           int num_train_timesteps = 1000);

// "1000,750,500,250" -> {1000, 750, 500, 250} (spaces allowed around entries); throws wan::Error
// naming the bad entry. Range and order are checked by make_schedule_from_timesteps.
std::vector<int64_t> parse_timesteps(const std::string& list);

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& c);
  // A custom schedule (validated: decreasing sigmas in [0, 1] ending at 0, one timestep per step;
  // UniPC needs sigma_0 < 1 because its second-order corrector cannot use lambda = -inf).
  // bf16_latents: StepDistill only (SamplerConfig::bf16_latents).
  Sampler(SolverKind solver, SigmaSchedule schedule, bool bf16_latents = false);

  SolverKind solver() const { return solver_; }
  int steps() const { return static_cast<int>(sched_.timesteps.size()); }
  const std::vector<float>& sigmas() const { return sched_.sigmas; }
  const std::vector<int64_t>& timesteps() const { return sched_.timesteps; }
  int index() const { return index_; }  // the step the next step() call performs
  bool done() const { return index_ >= steps(); }
  int64_t timestep() const;             // timesteps()[index()]; throws when done()
  float model_timestep() const;         // model_t[index()]: the t to give the DiT; throws when done()
  const std::vector<float>& model_timesteps() const { return sched_.model_t; }
  bool bf16_latents() const { return bf16_latents_; }

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
  bool bf16_latents_ = false;
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
  // The same on the DiT's float timesteps (schedule.model_t), compared in double as the references
  // do (t.item() >= boundary * T). Equal to the integer form whenever boundary * T is an integer.
  // For [1000, 750, 500, 250] at shift 5 (t = 1000, 937.5, 833.3, 625) both Lightning's boundaries
  // (0.875 T2V, 0.9 I2V) put steps 0-1 on the high-noise expert, as LightX2V's
  // boundary_step_index 2 (MultiDistillModelStruct: step_index < 2 -> high) does.
  static ExpertSchedule make(const SigmaSchedule& schedule, double boundary, float guide_low, float guide_high,
                             int num_train_timesteps = 1000);
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
