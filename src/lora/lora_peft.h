// Internal to src/lora: the alpha and rank a PEFT LoRA keeps outside its tensors. Sources, first found
// wins: the safetensors metadata "lora_adapter_metadata" (what diffusers' save_lora_weights writes: a
// JSON LoraConfig, its keys optionally prefixed "transformer."), then an adapter_config.json beside the
// file (what PEFT's save_pretrained writes). Fields read: lora_alpha, r, alpha_pattern, rank_pattern,
// use_rslora. Pattern keys match a module as PEFT does: the whole name or a dotted suffix of it,
// as a regular expression (a key that is not a valid one matches literally).
#pragma once
#include <map>
#include <string>

#include "formats/safetensors.h"

namespace wan::lora_detail {

struct PeftModuleScale {
  double alpha = 0;  // lora_alpha or its alpha_pattern entry
  int64_t r = 0;     // r or its rank_pattern entry (0: not given)
};

struct PeftConfig {
  bool present = false;
  std::string source;  // "adapter_config.json" or "safetensors metadata lora_adapter_metadata"
  double lora_alpha = 0;
  int64_t r = 0;
  bool rslora = false;  // scale alpha / sqrt(r)
  std::map<std::string, double> alpha_pattern;
  std::map<std::string, int64_t> rank_pattern;
  PeftModuleScale module(const std::string& module_name) const;
  std::string describe() const;  // " (lora_alpha 2, r 4)"
};

// Throws wan::Error naming the file for malformed JSON or fields of the wrong type.
PeftConfig load_peft_config(const SafetensorsFile& file, const std::string& path);

}  // namespace wan::lora_detail
