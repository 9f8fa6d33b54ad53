// Sigma/timestep schedules (spec §7.2, §7.4, §7.6), guidance, the expert schedule and the per-task
// sampling defaults (spec §1.2).
// Invariant: every schedule value is produced by the same float64 operations, in the same order, as
// the reference's numpy code (linspace as i*step + start, shift as (s*x) / (1 + (s-1)*x)), so the
// integer timesteps, which sit close to integer boundaries, come out identical.
#include <cmath>

#include "core/error.h"
#include "sampler/sampler.h"

namespace wan {

SolverKind solver_from_name(const std::string& s) {
  if (s == "unipc") return SolverKind::UniPC;
  if (s == "dpm++") return SolverKind::DpmPP;
  if (s == "euler") return SolverKind::Euler;
  WAN_THROW("unknown sampler '", s, "' (valid: unipc, dpm++, euler)");
}

const char* schedule_name(ScheduleKind k) { return k == ScheduleKind::Official ? "official" : "diffusers"; }

ScheduleKind schedule_from_name(const std::string& s) {
  if (s == "official") return ScheduleKind::Official;
  if (s == "diffusers") return ScheduleKind::Diffusers;
  WAN_THROW("unknown sigma schedule '", s, "' (valid: official, diffusers)");
}

namespace {

// numpy.linspace(start, stop, num)[:num-1] (endpoint dropped): i*step + start, step = (stop-start)/div.
std::vector<double> linspace_head(double start, double stop, int num) {
  const double step = (stop - start) / static_cast<double>(num - 1);
  std::vector<double> y(static_cast<size_t>(num - 1));
  for (int i = 0; i < num - 1; ++i) y[static_cast<size_t>(i)] = static_cast<double>(i) * step + start;
  return y;
}

}  // namespace

SigmaSchedule make_schedule(const SamplerConfig& c) {
  WAN_CHECK(c.steps >= 1, "sampler: steps must be >= 1 (got ", c.steps, ")");
  WAN_CHECK(std::isfinite(c.shift) && c.shift > 0, "sampler: shift must be > 0 (got ", c.shift, ")");
  WAN_CHECK(c.num_train_timesteps >= 1, "sampler: num_train_timesteps must be >= 1 (got ",
            c.num_train_timesteps, ")");
  const int n = c.steps;
  const double T = c.num_train_timesteps;
  std::vector<double> s;
  if (c.schedule == ScheduleKind::Diffusers) {
    s = linspace_head(1.0, 1.0 / T, n + 1);
  } else if (c.solver == SolverKind::DpmPP) {
    s = linspace_head(1.0, 0.0, n + 1);  // get_sampling_sigmas
  } else {
    // The official scheduler's training grid 1 - reverse(linspace(1, 1/T, T)) is stored as float32;
    // its first entry (float32(1 - 1/T)) and last entry (0) bound the inference grid.
    const double sigma_max = static_cast<float>(1.0 - 1.0 / T);
    s = linspace_head(sigma_max, 0.0, n + 1);
  }
  for (double& x : s) x = c.shift * x / (1 + (c.shift - 1) * x);
  // diffusers keeps sigma_0 off 1 so that its UniPC never takes log(0) in a history term.
  if (c.schedule == ScheduleKind::Diffusers && std::fabs(s[0] - 1) < 1e-6) s[0] -= 1e-6;

  SigmaSchedule out;
  out.sigmas.reserve(static_cast<size_t>(n) + 1);
  out.timesteps.reserve(static_cast<size_t>(n));
  for (double x : s) {
    out.sigmas.push_back(static_cast<float>(x));
    out.timesteps.push_back(static_cast<int64_t>(x * T));  // truncation, as torch's .to(int64)
  }
  out.sigmas.push_back(0.0f);
  return out;
}

void cfg_combine(const float* v_cond, const float* v_uncond, float guide, float* out, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    const float d = v_cond[j] - v_uncond[j];
    out[j] = v_uncond[j] + guide * d;
  }
}

ExpertSchedule ExpertSchedule::make(const std::vector<int64_t>& timesteps, double boundary,
                                    float guide_low, float guide_high, int num_train_timesteps) {
  WAN_CHECK(std::isfinite(boundary) && boundary <= 1.0, "expert schedule: boundary must be <= 1 (got ",
            boundary, ")");
  const bool single = boundary <= 0;
  const double t_boundary = boundary * num_train_timesteps;  // compared as the reference: t >= b*T
  ExpertSchedule es;
  es.steps.reserve(timesteps.size());
  for (int64_t t : timesteps) {
    const bool high = single || static_cast<double>(t) >= t_boundary;
    es.steps.push_back(high ? ExpertStep{Expert::High, guide_high} : ExpertStep{Expert::Low, guide_low});
  }
  return es;
}

int ExpertSchedule::num_high() const {
  int k = 0;
  for (const ExpertStep& s : steps) k += s.expert == Expert::High;
  return k;
}

SamplingDefaults sampling_defaults(const std::string& task) {
  if (task == "t2v-A14B") return {40, 12.0, 0.875, 3.0f, 4.0f};
  if (task == "i2v-A14B") return {40, 5.0, 0.900, 3.5f, 3.5f};
  if (task == "ti2v-5B") return {50, 5.0, 0.0, 5.0f, 5.0f};
  WAN_THROW("unknown task '", task, "' (valid: t2v-A14B, i2v-A14B, ti2v-5B)");
}

}  // namespace wan
