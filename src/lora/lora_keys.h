// Internal to src/lora: one LoRA key -> (the module as the file names it, which part of a term it is,
// its prefix routing, its naming style), and a DiT module index that resolves a module name of any
// style to the official module. Keys are classified from their spelling alone; nothing here reads data.
// Invariant: ModuleIndex::resolve returns either an official module of the table it was built from
// ("blocks.0.self_attn.q", "blocks.0" for a diff_m key) or "" (no such module in this DiT).
#pragma once
#include <map>
#include <string>
#include <string_view>

#include "models/weight_spec.h"

namespace wan::lora_detail {

enum class Part {
  Up,       // lora_up / lora_B / *_lora.up / .lora.up / .lora_linear_layer.up: [out, r]
  Down,     // lora_down / lora_A / ...: [r, in]
  Alpha,    // .alpha scalar
  UpBias,   // PEFT lora_B.bias: a bias delta scaled like its pair
  Diff,     // .diff: full weight delta
  DiffB,    // .diff_b: full bias delta
  DiffM,    // <block>.diff_m: modulation delta
  LoHa,     // hada_*: refused
  LoKr,     // lokr_*: refused
  Mid,      // LoCon / Tucker lora_mid: refused
  Dora,     // dora_scale / lora_magnitude_vector: refused
  Unknown,  // not a LoRA tensor name we know
};
const char* part_name(Part p);

// How the module part of a key is spelled.
enum class Style {
  Official,   // blocks.0.self_attn.q (optionally "diffusion_model." / "model.diffusion_model.")
  Diffusers,  // blocks.0.attn1.to_q (PEFT; "transformer." / "base_model.model." prefixes)
  DiffSynth,  // official names under "pipe.dit." or with PEFT's ".default." adapter name
  Kohya,      // lora_unet_blocks_0_self_attn_q (also the mixed lora_unet_blocks_0.self_attn.q)
  KohyaFun,   // lora_unet__blocks_0_... (Wan-Fun)
  Lycoris,    // lycoris_blocks_0_self_attn_q (ai-toolkit, SimpleTuner)
};
const char* style_name(Style s);  // the format names of LoraFileSummary::format

struct ParsedKey {
  std::string module;  // the module as the file spells it, prefixes and part suffix removed
  Part part = Part::Unknown;
  Style style = Style::Official;
  bool transformer = false;    // had a "transformer." prefix (diffusers: the high-noise expert in Wan 2.2)
  bool transformer_2 = false;  // had a "transformer_2." prefix (the low-noise expert)
};
ParsedKey parse_key(std::string_view key);

// Wan 2.1 I2V image layers (k_img, v_img, norm_k_img, img_emb and their diffusers names): no target in 2.2.
bool is_wan21_image_module(std::string_view module);

class ModuleIndex {
 public:
  explicit ModuleIndex(const WeightTable& table);
  // The official module a parsed key names, or "" when this DiT has none.
  std::string resolve(const ParsedKey& k) const;
  const WeightSpec* row(const std::string& official_name) const;  // nullptr if absent

 private:
  std::map<std::string, const WeightSpec*> rows_;
  std::map<std::string, std::string> modules_;     // official module -> itself (dotted lookup)
  std::map<std::string, std::string> underscore_;  // "blocks_0_self_attn_q" and "blocks_0_attn1_to_q" -> official
};

}  // namespace wan::lora_detail
