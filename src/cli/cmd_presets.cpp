// `wan presets [--json]`: the named sampling recipes of `wan generate --preset` (sampler/presets.h),
// with every setting they fill and the reference each reproduces.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "api/options.h"
#include "cli/commands.h"
#include "sampler/presets.h"

namespace wan::cli {

const api::CommandSpec& presets_spec() {
  static const api::CommandSpec s = [] {
    api::CommandSpec c;
    c.name = "presets";
    c.summary = "list the sampling presets of generate --preset";
    c.usage = {"presets [--json]"};
    c.about =
        "Each preset fills the sampling settings a user leaves unset (steps, timesteps, shift, guide scales, "
        "boundary, solver, schedule); options given explicitly win. Use the distilled presets with their "
        "LoRAs (--lora-high / --lora-low).";
    c.options = {api::flag_option("json", "one JSON array instead of text")};
    return c;
  }();
  return s;
}

namespace {
std::string list_str(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}
std::string tasks_str(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

int cmd_presets(int argc, char** argv) {
  const api::Values a = api::parse_argv(presets_spec(), argc, argv);
  if (api::print_help_if_asked(a, presets_spec())) return 0;
  if (a.flag("json")) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Preset& p : presets()) {
      nlohmann::ordered_json j;
      j["name"] = p.name;
      j["description"] = p.description;
      j["tasks"] = p.tasks;
      j["steps"] = p.steps;
      j["timesteps"] = p.timesteps;
      j["shift"] = p.shift;
      j["guide_low"] = p.guide_low;
      j["guide_high"] = p.guide_high;
      if (p.boundary) j["boundary"] = *p.boundary;
      else j["boundary"] = nullptr;  // the task's own
      j["solver"] = solver_name(p.solver);
      j["schedule"] = schedule_name(p.schedule);
      j["bf16_latents"] = p.bf16_latents;
      j["source"] = p.source;
      out.push_back(j);
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  for (const Preset& p : presets()) {
    std::printf("%s\n  %s\n", p.name.c_str(), p.description.c_str());
    std::printf("  tasks %s; %d steps", tasks_str(p.tasks).c_str(), p.steps);
    if (!p.timesteps.empty()) std::printf(", timesteps %s", list_str(p.timesteps).c_str());
    else std::printf(", %s schedule", schedule_name(p.schedule));
    std::printf(", shift %g, guide %g (low) / %g (high)", p.shift, static_cast<double>(p.guide_low),
                static_cast<double>(p.guide_high));
    if (p.boundary) std::printf(", boundary %g", *p.boundary);
    else std::printf(", the task's boundary");
    std::printf(", solver %s%s\n  source: %s\n", solver_name(p.solver), p.bf16_latents ? ", bf16 latents" : "",
                p.source.c_str());
  }
  return 0;
}

}  // namespace wan::cli
