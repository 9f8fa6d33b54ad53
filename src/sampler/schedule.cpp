// Sigma/timestep schedules (spec §7.2, §7.4, §7.6; the distill grids of Wan2.2-Lightning and
// LightX2V), guidance, the expert schedule and the per-task sampling defaults (spec §1.2).
// Invariant: every schedule value is produced by the same operations, in the same order and
// precision, as the reference: float64 for its numpy code (linspace as i*step + start, shift as
// (s*x) / (1 + (s-1)*x)), so the integer timesteps, which sit close to integer boundaries, come out
// identical; float32 (one rounding per torch op, fmaf where torch's CPU linspace fuses) for the
// distill grids, which the references build with torch float32 tensors.
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "sampler/sampler.h"

namespace wan {

SolverKind solver_from_name(const std::string& s) {
  if (s == "unipc") return SolverKind::UniPC;
  if (s == "dpm++") return SolverKind::DpmPP;
  if (s == "euler") return SolverKind::Euler;
  if (s == "step-distill") return SolverKind::StepDistill;
  WAN_THROW("unknown sampler '", s, "' (valid: unipc, dpm++, euler, step-distill)");
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::Official: return "official";
    case ScheduleKind::Diffusers: return "diffusers";
    case ScheduleKind::Lightning: return "lightning";
  }
  return "?";
}

ScheduleKind schedule_from_name(const std::string& s) {
  if (s == "official") return ScheduleKind::Official;
  if (s == "diffusers") return ScheduleKind::Diffusers;
  if (s == "lightning") return ScheduleKind::Lightning;
  WAN_THROW("unknown sigma schedule '", s, "' (valid: official, diffusers, lightning)");
}

namespace {

// numpy.linspace(start, stop, num)[:num-1] (endpoint dropped): i*step + start, step = (stop-start)/div.
std::vector<double> linspace_head(double start, double stop, int num) {
  const double step = (stop - start) / static_cast<double>(num - 1);
  std::vector<double> y(static_cast<size_t>(num - 1));
  for (int i = 0; i < num - 1; ++i) y[static_cast<size_t>(i)] = static_cast<double>(i) * step + start;
  return y;
}

// The references' float32 shift on torch tensors: shift * x / (1 + (shift - 1) * x), the Python
// scalars (shift, shift - 1 in double) converted to float32 by the tensor ops.
float shift_f32(float x, double shift) {
  const float num = static_cast<float>(shift) * x;
  const float den = 1.0f + static_cast<float>(shift - 1.0) * x;
  return num / den;
}

// The distill grids' tail: sigmas (float32, final 0 appended), the DiT's float t = sigma * T and
// its truncation.
SigmaSchedule distill_schedule(const std::vector<float>& sigmas, int T) {
  SigmaSchedule out;
  out.sigmas = sigmas;
  for (float s : sigmas) {
    const float t = s * static_cast<float>(T);
    out.model_t.push_back(t);
    out.timesteps.push_back(static_cast<int64_t>(t));
  }
  out.sigmas.push_back(0.0f);
  return out;
}

// Wan2.2-Lightning's EulerScheduler grid (ScheduleKind::Lightning): numpy linspace(T, 0, N+1) in
// float64 cast to float32, divided by T and shifted in float32; the appended end point is 0.
SigmaSchedule lightning_schedule(int n, double shift, int T) {
  const std::vector<double> t = linspace_head(static_cast<double>(T), 0.0, n + 1);
  std::vector<float> s;
  for (double x : t) s.push_back(shift_f32(static_cast<float>(x) / static_cast<float>(T), shift));
  return distill_schedule(s, T);
}

void check_shift(double shift, int T) {
  WAN_CHECK(std::isfinite(shift) && shift > 0, "sampler: shift must be > 0 (got ", shift, ")");
  WAN_CHECK(T >= 1, "sampler: num_train_timesteps must be >= 1 (got ", T, ")");
}

}  // namespace

SigmaSchedule make_schedule_from_timesteps(const std::vector<int64_t>& ts, double shift, int T) {
  check_shift(shift, T);
  WAN_CHECK(!ts.empty(), "timesteps: the list is empty (need at least 1 step)");
  for (size_t i = 0; i < ts.size(); ++i) {
    WAN_CHECK(ts[i] >= 1 && ts[i] <= T, "timesteps: entry ", i + 1, " (", ts[i], ") is outside [1, ", T,
              "] (0 is the end point, not a step)");
    WAN_CHECK(i == 0 || ts[i] < ts[i - 1], "timesteps: must decrease strictly (", ts[i], " after ", ts[i - 1],
              " at entry ", i + 1, ")");
  }
  // torch.linspace(1, 0, T + 1) on the CPU, float32: step = (0 - 1) / T, then start + step * k below
  // the halfway point and end - step * (T - k) from it, each a fused multiply-add in torch's build.
  const float step = (0.0f - 1.0f) / static_cast<float>(T);
  const int64_t halfway = (static_cast<int64_t>(T) + 1) / 2;
  std::vector<float> s;
  for (int64_t t : ts) {
    const int64_t k = T - t;  // LightX2V: denoising_step_index = T - t
    const float g = k < halfway ? std::fmaf(step, static_cast<float>(k), 1.0f)
                                : std::fmaf(-step, static_cast<float>(T - k), 0.0f);
    s.push_back(shift_f32(g, shift));
  }
  return distill_schedule(s, T);
}

std::vector<int64_t> parse_timesteps(const std::string& list) {
  std::vector<int64_t> out;
  size_t pos = 0;
  for (int entry = 1;; ++entry) {
    const size_t comma = list.find(',', pos);
    const size_t end = comma == std::string::npos ? list.size() : comma;
    size_t a = pos, b = end;
    while (a < b && list[a] == ' ') ++a;
    while (b > a && list[b - 1] == ' ') --b;
    int64_t v = 0;
    const auto r = std::from_chars(list.data() + a, list.data() + b, v);
    WAN_CHECK(a < b && r.ec == std::errc() && r.ptr == list.data() + b, "timesteps '", list, "': entry ", entry,
              " ('", list.substr(a, b - a), "') is not an integer");
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

SigmaSchedule make_schedule(const SamplerConfig& c) {
  if (!c.timesteps.empty()) {
    WAN_CHECK(c.steps == static_cast<int>(c.timesteps.size()), "sampler: steps (", c.steps, ") differs from the ",
              c.timesteps.size(), " timesteps given");
    return make_schedule_from_timesteps(c.timesteps, c.shift, c.num_train_timesteps);
  }
  WAN_CHECK(c.steps >= 1, "sampler: steps must be >= 1 (got ", c.steps, ")");
  check_shift(c.shift, c.num_train_timesteps);
  if (c.schedule == ScheduleKind::Lightning) return lightning_schedule(c.steps, c.shift, c.num_train_timesteps);
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
    out.model_t.push_back(static_cast<float>(out.timesteps.back()));
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

ExpertSchedule ExpertSchedule::make(const SigmaSchedule& sc, double boundary, float guide_low, float guide_high,
                                    int num_train_timesteps) {
  if (sc.model_t.empty()) return make(sc.timesteps, boundary, guide_low, guide_high, num_train_timesteps);
  WAN_CHECK(std::isfinite(boundary) && boundary <= 1.0, "expert schedule: boundary must be <= 1 (got ",
            boundary, ")");
  const bool single = boundary <= 0;
  const double t_boundary = boundary * num_train_timesteps;
  ExpertSchedule es;
  for (float t : sc.model_t) {
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
