// THE weight table of the DiT (WanModel, spec §3.2): every tensor of one expert with its official name,
// shape from the config, class, random-init rule, GPU storage dtype and GEMM fusion group, in the
// modules' registration order (torch's state_dict order, which make-checkpoint writes).
// GPU storage: bf16 for the GEMM operands of the blocks, the embeddings' GEMMs and the q/k RMSNorm
// weights; fp32 where the reference computes in fp32 (modulation tables, norm3, the time MLP and
// projection, the head). Fusion: self-attention q|k|v weights and biases, cross-attention k|v.
#pragma once
#include <map>
#include <string>

#include "models/config.h"
#include "models/weight_spec.h"

namespace wan {

// c must be valid (DiTConfig::validate).
WeightTable dit_weight_table(const DiTConfig& c);
// name -> shape of dit_weight_table(c): what a checkpoint of this config must hold.
std::map<std::string, Shape> dit_expected_shapes(const DiTConfig& c);

}  // namespace wan
