// Random LoRA files for a DiT config, in the key formats users bring (official/ComfyUI, kohya/musubi,
// diffusers/PEFT), for tests and for measuring the merge at the real sizes without a real LoRA.
// Invariants: deterministic (the same options give byte-identical files: every factor is a Philox
// normal keyed by (seed, official module name, "up"|"down")), so the same seed written in two formats
// holds the same delta; one tensor in memory at a time; the file is written atomically
// (write_safetensors), the PEFT adapter_config.json next to it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "models/config.h"

namespace wan::gen {

enum class LoraFormat { Official, Kohya, Peft };
LoraFormat lora_format_from_name(const std::string& s);  // "official" | "kohya" | "peft"

struct MakeLoraOptions {
  DiTConfig dit;
  int rank = 64;
  float alpha = 0;                  // 0: no .alpha tensors (scale 1); PEFT: lora_alpha = rank then
  LoraFormat format = LoraFormat::Official;
  bool all_targets = false;         // false: the 400 attention + FFN projections of an A14B expert
                                    // (10 per block); true: also the text / time embeddings, the time
                                    // projection and the head
  DType dtype = DType::BF16;        // F32, BF16 or F16 factors
  uint64_t seed = 0;
  float up_std = 0.02f;             // up ~ up_std·n; down ~ n / sqrt(in)
  std::string out;                  // the .safetensors file
};

struct MakeLoraResult {
  int modules = 0;
  uint64_t bytes = 0;
  std::vector<std::string> files;  // the LoRA and, for PEFT, adapter_config.json
};

// The official module names (without ".weight") a LoRA of these options targets, in file order.
std::vector<std::string> lora_modules(const DiTConfig& c, bool all_targets);
MakeLoraResult make_lora(const MakeLoraOptions& o);

}  // namespace wan::gen
