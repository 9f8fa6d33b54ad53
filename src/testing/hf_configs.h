// JSON configs of the diffusers layout (spec §3.3) that config.h does not write: the pipeline's
// model_index.json, the UniPC scheduler, the UMT5 text encoder (transformers) and AutoencoderKLWan.
// Keys are sorted, as diffusers' save_config and transformers' to_json_file write them.
#pragma once
#include <string>

#include "models/config.h"

namespace wan::gen {

std::string model_index_json(Task task);
std::string scheduler_config_json(Task task);
std::string t5_config_hf_json(const T5Config& c);
std::string vae_config_diffusers_json(const VaeConfig& c);

// Pipeline attributes per task (spec §3.3).
double boundary_ratio(Task task);  // 0 for TI2V-5B (single expert)
double flow_shift(Task task);

}  // namespace wan::gen
