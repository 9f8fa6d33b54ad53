// Planning the LoRAs of a run (pipeline_internal.h plan_lora / describe_lora): which files apply to
// which DiT, read and checked against its weight table before anything heavy.
#include <sstream>

#include "core/error.h"
#include "models/dit/weights.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_internal.h"

namespace wan::pipeline_detail {

void plan_lora(const std::vector<LoraSpec>& loras, GeneratePlan& p) {
  p.loras = loras;
  p.lora_high.reset();
  p.lora_low.reset();
  if (loras.empty()) return;
  const WeightTable table = dit_weight_table(p.ckpt.dit);
  if (p.task == Task::TI2V_5B) {  // one model: --lora-high / --lora-low have no expert to go to
    for (const LoraSpec& s : loras)
      WAN_CHECK_OPTION(s.expert == LoraExpert::High ? "lora-high" : "lora-low", s.expert == LoraExpert::All,
                       "{} ", s.path, ": ", task_name(p.task), " has one model, not two experts (use --lora)");
    p.lora_high = std::make_shared<const LoraSet>(load_lora_set(loras, LoraExpert::All, table));
    return;
  }
  // A14B: each expert the schedule runs gets the files meant for it (a file for an expert the
  // schedule skips is still read and checked against the other expert's table by the same rules).
  const bool high = uses_expert(p.experts, Expert::High), low = uses_expert(p.experts, Expert::Low);
  auto set_for = [&](LoraExpert which) {
    auto s = std::make_shared<LoraSet>(load_lora_set(loras, which, table));
    return s->empty() ? nullptr : std::shared_ptr<const LoraSet>(std::move(s));
  };
  std::shared_ptr<const LoraSet> h = set_for(LoraExpert::High), l = set_for(LoraExpert::Low);
  if (high) p.lora_high = std::move(h);
  if (low) p.lora_low = std::move(l);
}

std::string describe_lora(const GeneratePlan& p) {
  if (p.loras.empty()) return {};
  std::ostringstream os;
  auto one = [&](const char* who, const std::shared_ptr<const LoraSet>& s) {
    if (!s) return;
    size_t tensors = 0;
    for (const auto& [name, t] : s->targets) tensors += t.active() ? 1 : 0;
    os << "lora     " << who << ": " << tensors << " tensors changed, merged in fp32 before the one rounding\n";
    for (const std::string& line : s->summary_lines(p.verbose)) os << "           " << line << "\n";
  };
  if (p.task == Task::TI2V_5B) {
    one("model", p.lora_high);
  } else {
    one("high-noise expert", p.lora_high);
    one("low-noise expert", p.lora_low);
    if (!p.lora_high && !p.lora_low) os << "lora     none applies to the experts this schedule runs\n";
  }
  return os.str();
}

}  // namespace wan::pipeline_detail
