// The preset table (sources cited per number) and resolve_sampling (see presets.h).
// Invariant: a preset's numbers are exactly its reference's; resolve_sampling is pure.
#include "sampler/presets.h"

#include "core/error.h"

namespace wan {

namespace {

std::vector<Preset> make_presets() {
  std::vector<Preset> v;
  // Wan2.2-Lightning (github.com/ModelTC/Wan2.2-Lightning, commit 92efeb4):
  //  - wan/configs/wan_t2v_A14B.py:34-37 and wan_i2v_A14B.py:34-37: sample_shift 5.0,
  //    sample_steps 4, sample_guide_scale (1.0, 1.0); boundary 0.875 (T2V, line 36) / 0.900 (I2V,
  //    line 36) = this engine's task boundaries, hence `boundary` unset.
  //  - generate.py:212-216: --sample_solver defaults to 'euler' (lines 84-85 warn with a LoRA
  //    otherwise: "it's used in distillation").
  //  - wan/utils/fm_solvers_euler.py:16-21, 40-56: EulerScheduler's grid (ScheduleKind::Lightning);
  //    :84-86: x + (sigma_next - sigma) * v, i.e. SolverKind::Euler.
  //  - wan/text2video.py:340-347 (image2video.py:375-382): timesteps[:-1] are the float t fed to
  //    the DiT; :365-375 + wan/utils/utils.py:15-16: guide 1.0 skips the unconditional pass.
  Preset l;
  l.name = "lightning-4step";
  l.description = "Wan2.2-Lightning 4-step LoRA: Euler, shift 5, t 1000/937.5/833.3/625, no CFG";
  l.source = "ModelTC/Wan2.2-Lightning wan/configs/wan_{t2v,i2v}_A14B.py, generate.py (--sample_solver euler)";
  l.steps = 4;
  l.shift = 5.0;
  l.guide_low = l.guide_high = 1.0f;
  l.solver = SolverKind::Euler;
  l.schedule = ScheduleKind::Lightning;
  l.tasks = {"t2v-A14B", "i2v-A14B"};
  v.push_back(l);

  // LightX2V (github.com/ModelTC/LightX2V, commit f8aee98b), model_cls wan2.2_moe_distill:
  //  - configs/distill/wan22/wan_moe_t2v_distill_lora.json:14-26 (and wan_moe_i2v_distill_*.json):
  //    sample_shift 5.0, enable_cfg false (its sample_guide_scale is then unused), boundary_step_index
  //    2, denoising_step_list [1000, 750, 500, 250].
  //  - lightx2v/models/schedulers/wan/step_distill/scheduler.py:25-33 (the grid, see
  //    make_schedule_from_timesteps), :80-89 (Wan22StepDistillScheduler.step_post: SolverKind::
  //    StepDistill).
  //  - lightx2v/models/runners/wan/wan_distill_runner.py:61: step_index < boundary_step_index ->
  //    high-noise expert. Boundary 0.875 splits this list identically (t 937.5 >= 875 > 833.3); with
  //    another --shift the two rules can differ (LightX2V switches by index).
  //  - lightx2v/models/schedulers/scheduler.py:24-27 with scripts/base/base.sh:31,37 (DTYPE=BF16,
  //    SENSITIVE_LAYER_DTYPE=None): the latent is cast to bf16 before every step and stays bf16.
  Preset x;
  x.name = "lightx2v-4step";
  x.description = "LightX2V wan2.2 distill: step-distill solver, t list 1000,750,500,250, shift 5, no CFG";
  x.source = "ModelTC/LightX2V configs/distill/wan22/wan_moe_{t2v,i2v}_distill*.json, step_distill/scheduler.py";
  x.steps = 4;
  x.timesteps = {1000, 750, 500, 250};
  x.shift = 5.0;
  x.guide_low = x.guide_high = 1.0f;
  x.boundary = 0.875;
  x.solver = SolverKind::StepDistill;
  x.schedule = ScheduleKind::Lightning;  // only for a user --steps 4 without the list: the same grid
  x.bf16_latents = true;
  x.tasks = {"t2v-A14B", "i2v-A14B"};
  v.push_back(x);
  return v;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

bool Preset::applies_to(const std::string& task) const {
  for (const std::string& t : tasks)
    if (t == task) return true;
  return false;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = make_presets();
  return table;
}

std::string preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.push_back(p.name);
  return join(names);
}

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return p;
  WAN_THROW("unknown preset '", name, "' (valid: ", preset_names(), ")");
}

ResolvedSampling resolve_sampling(const std::string& task, const SamplingDefaults& base, const Preset* preset,
                                  const SamplingOptions& user) {
  if (preset)
    WAN_CHECK(preset->applies_to(task), "preset ", preset->name, " is for ", join(preset->tasks), ", not ", task);
  ResolvedSampling r;
  SamplerConfig& c = r.sampler;
  const SolverKind default_solver =
      preset ? preset->solver : (!user.timesteps.empty() ? SolverKind::StepDistill : c.solver);
  c.solver = user.solver.value_or(default_solver);
  c.schedule = user.schedule.value_or(preset ? preset->schedule : c.schedule);
  if (!user.timesteps.empty()) {
    c.timesteps = user.timesteps;
  } else if (preset && !preset->timesteps.empty() && !user.schedule) {
    const int n = static_cast<int>(preset->timesteps.size());
    WAN_CHECK(!user.steps || *user.steps == n, "preset ", preset->name, " fixes ", n,
              " timesteps; --steps ", *user.steps, " needs --timesteps (or --schedule) as well");
    c.timesteps = preset->timesteps;
  }
  c.steps = !c.timesteps.empty() ? static_cast<int>(c.timesteps.size())
                                 : user.steps.value_or(preset ? preset->steps : base.steps);
  c.shift = user.shift.value_or(preset ? preset->shift : base.shift);
  c.bf16_latents = preset && preset->bf16_latents && c.solver == SolverKind::StepDistill;
  r.guide_low = user.guide_low.value_or(preset ? preset->guide_low : base.guide_low);
  r.guide_high = user.guide_high.value_or(preset ? preset->guide_high : base.guide_high);
  r.boundary = user.boundary.value_or(preset && preset->boundary ? *preset->boundary : base.boundary);
  return r;
}

}  // namespace wan
