// Named sampling presets (the few-step distilled recipes: Wan2.2-Lightning, LightX2V) and how a
// preset combines with the options a user gives explicitly (resolve_sampling).
//
// Invariants: every number of a preset is the reference's (presets.cpp cites file and line); a
// preset only fills what the user left unset, the user's explicit options always win; resolving
// validates nothing about the schedule itself (make_schedule / Sampler do, with BadInput errors).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sampler/sampler.h"

namespace wan {

struct Preset {
  std::string name;         // "lightning-4step", "lightx2v-4step"
  std::string description;  // one line, for --help / listings
  std::string source;       // the reference repository and config it reproduces
  int steps = 0;
  std::vector<int64_t> timesteps;  // explicit list (LightX2V semantics); empty: the `schedule` grid
  double shift = 0;
  float guide_low = 1.0f, guide_high = 1.0f;  // 1: no unconditional pass
  std::optional<double> boundary;             // unset: the task's own boundary (sampling_defaults)
  SolverKind solver = SolverKind::Euler;
  ScheduleKind schedule = ScheduleKind::Official;  // the grid of `steps` when `timesteps` is empty
  bool bf16_latents = false;                       // SamplerConfig::bf16_latents
  std::vector<std::string> tasks;                  // wan::task_name values it applies to

  bool applies_to(const std::string& task) const;
};

const std::vector<Preset>& presets();
// Throws wan::Error (BadInput) naming the valid presets.
const Preset& find_preset(const std::string& name);
std::string preset_names();  // "lightning-4step, lightx2v-4step"

// The sampling options the user gave explicitly; unset / empty = not given.
struct SamplingOptions {
  std::optional<SolverKind> solver;
  std::optional<ScheduleKind> schedule;
  std::optional<int> steps;
  std::vector<int64_t> timesteps;  // --timesteps (parse_timesteps)
  std::optional<double> shift;
  std::optional<float> guide_low, guide_high;
  std::optional<double> boundary;
};

struct ResolvedSampling {
  SamplerConfig sampler;  // solver, schedule, steps, shift, timesteps, bf16_latents
  double boundary = 0;    // for ExpertSchedule::make(schedule, boundary, guide_low, guide_high)
  float guide_low = 1.0f, guide_high = 1.0f;
};

// Each field: the user's value, else the preset's, else `base` (the run's defaults without a preset:
// sampling_defaults(task) with what the checkpoint overrides, e.g. the diffusers flow_shift and
// boundary_ratio) or SamplerConfig's default (solver UniPC, schedule official). Special rules:
//  - user --timesteps replace the preset's list and grid; steps becomes the list's size;
//  - the preset's list is dropped when the user picks a --schedule; a user --steps other than the
//    list's size is a BadInput error (LightX2V has no N-step formula: give --timesteps instead);
//  - --timesteps with neither --sampler nor a preset selects step-distill (the reference that
//    defines explicit lists);
//  - bf16_latents only comes from the preset, and only while the solver stays step-distill.
// preset may be null. Throws wan::Error (BadInput) when the preset does not apply to `task`.
ResolvedSampling resolve_sampling(const std::string& task, const SamplingDefaults& base, const Preset* preset,
                                  const SamplingOptions& user);

}  // namespace wan
