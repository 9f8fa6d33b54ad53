// The parameter lists (official names, shapes, initialisation) of the three Wan components, built
// from their configs in the modules' registration order (the order torch's state_dict uses).
// DiT: WanModel (spec §3.2); T5: the official T5Encoder (spec §4.4); VAE: WanVAE_ of vae2_1.py /
// vae2_2.py (spec §5.3, §6.2).
#pragma once
#include <vector>

#include "models/config.h"
#include "testing/weight_init.h"

namespace wan::gen {

std::vector<ParamSpec> dit_params(const DiTConfig& c);
std::vector<ParamSpec> t5_params(const T5Config& c);
// Supports the released structure only: 4 stages (dim_mult of length 4), 2 residual blocks,
// temporal_downsample of length 3 (throws wan::Error otherwise, since the name mappings assume it).
std::vector<ParamSpec> vae_params(const VaeConfig& c);

}  // namespace wan::gen
