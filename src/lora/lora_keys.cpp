// LoRA key classification and module resolution (lora_keys.h).
// Prefixes are stripped in any order ("base_model.model.transformer." etc.), PEFT's ".default." adapter
// name is dropped, then the longest known part suffix decides the part. The module that remains is
// resolved against the DiT's own table: dotted official names directly, diffusers names through
// ckpt/names.h (so the norm2/norm3 swap has one definition), kohya / LyCORIS underscore names through a
// map built from the table's official and diffusers spellings (official wins the one clash, norm3).
#include "lora/lora_keys.h"

#include <algorithm>
#include <array>
#include <utility>

#include "ckpt/names.h"

namespace wan::lora_detail {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}

// Suffix -> part, longest spellings first where one is a suffix of another.
constexpr std::pair<std::string_view, Part> kSuffixes[] = {
    {".lora_linear_layer.up.weight", Part::Up}, {".lora_linear_layer.down.weight", Part::Down},
    {".lora_up.weight", Part::Up},              {".lora_down.weight", Part::Down},
    {".lora_B.weight", Part::Up},               {".lora_A.weight", Part::Down},
    {".lora_B.bias", Part::UpBias},             {"_lora.up.weight", Part::Up},
    {"_lora.down.weight", Part::Down},          {".lora.up.weight", Part::Up},
    {".lora.down.weight", Part::Down},          {".lora_mid.weight", Part::Mid},
    {".dora_scale", Part::Dora},                {".lora_magnitude_vector", Part::Dora},
    {".alpha", Part::Alpha},                    {".diff_b", Part::DiffB},
    {".diff_m", Part::DiffM},                   {".diff", Part::Diff},
};

// Module names only the diffusers naming uses.
bool diffusers_spelling(std::string_view m) {
  constexpr std::string_view kMarks[] = {"attn1", "attn2", "ffn.net.", "condition_embedder", "proj_out",
                                         "scale_shift_table", "to_q", "to_k", "to_v", "to_out"};
  return std::any_of(std::begin(kMarks), std::end(kMarks), [&](std::string_view k) { return m.find(k) != m.npos; });
}

}  // namespace

const char* part_name(Part p) {
  switch (p) {
    case Part::Up: return "lora_up";
    case Part::Down: return "lora_down";
    case Part::Alpha: return "alpha";
    case Part::UpBias: return "lora_B.bias";
    case Part::Diff: return "diff";
    case Part::DiffB: return "diff_b";
    case Part::DiffM: return "diff_m";
    case Part::LoHa: return "LoHa";
    case Part::LoKr: return "LoKr";
    case Part::Mid: return "lora_mid";
    case Part::Dora: return "DoRA";
    case Part::Unknown: break;
  }
  return "unknown";
}

const char* style_name(Style s) {
  switch (s) {
    case Style::Official: return "official";
    case Style::Diffusers: return "peft";
    case Style::DiffSynth: return "diffsynth";
    case Style::Kohya: return "kohya";
    case Style::KohyaFun: return "kohya-wan-fun";
    case Style::Lycoris: return "lycoris-lora";
  }
  return "?";
}

ParsedKey parse_key(std::string_view key) {
  ParsedKey k;
  std::string s(key);
  bool diffsynth = false, kohya = false, peft_prefix = false;
  // Prefixes, in any order and combination.
  for (bool again = true; again;) {
    again = false;
    for (std::string_view p : {"model.diffusion_model.", "diffusion_model."})
      if (starts_with(s, p)) s.erase(0, p.size()), again = true;
    if (starts_with(s, "base_model.model.")) s.erase(0, 17), again = peft_prefix = true;
    if (starts_with(s, "pipe.dit.")) s.erase(0, 9), again = diffsynth = true;
    if (starts_with(s, "transformer_2.")) s.erase(0, 14), again = k.transformer_2 = true;
    if (starts_with(s, "transformer.")) s.erase(0, 12), again = k.transformer = true;
  }
  if (starts_with(s, "lora_unet__")) {
    s.erase(0, 11), k.style = Style::KohyaFun, kohya = true;
  } else if (starts_with(s, "lora_unet_")) {
    s.erase(0, 10), k.style = Style::Kohya, kohya = true;
  } else if (starts_with(s, "lycoris_")) {
    s.erase(0, 8), k.style = Style::Lycoris, kohya = true;
  }
  // PEFT's adapter name "default" between lora_A/B and weight.
  for (std::string_view tag : {".lora_A.default.", ".lora_B.default."}) {
    const size_t at = s.find(tag);
    if (at != std::string::npos) s.erase(at + 7, 8), diffsynth = diffsynth || !diffusers_spelling(s);
  }
  for (const auto& [suffix, part] : kSuffixes) {
    if (ends_with(s, suffix)) {
      k.part = part;
      k.module = s.substr(0, s.size() - suffix.size());
      break;
    }
  }
  if (k.part == Part::Unknown) {
    // LyCORIS LoHa / LoKr: "<module>.hada_w1_a", "<module>.lokr_w1", ...
    const size_t dot = s.rfind('.');
    const std::string_view last = dot == std::string::npos ? std::string_view(s) : std::string_view(s).substr(dot + 1);
    if (starts_with(last, "hada_")) k.part = Part::LoHa;
    if (starts_with(last, "lokr_")) k.part = Part::LoKr;
    k.module = dot == std::string::npos ? std::string() : s.substr(0, dot);
  }
  // Official names under a PEFT wrapper or "pipe.dit." are DiffSynth's; a "transformer." prefix means
  // diffusers names (patch_embedding is spelled alike in both).
  if (!kohya) {
    const bool diffusers = diffusers_spelling(k.module);
    if (diffusers || k.transformer || k.transformer_2) k.style = Style::Diffusers;
    else if (diffsynth) k.style = Style::DiffSynth;
    else if (peft_prefix) k.style = Style::Diffusers;
  }
  return k;
}

bool is_wan21_image_module(std::string_view m) {
  constexpr std::string_view kMarks[] = {"k_img", "v_img", "img_emb", "add_k_proj", "add_v_proj", "norm_added_k",
                                         "image_embedder"};
  return std::any_of(std::begin(kMarks), std::end(kMarks), [&](std::string_view k) { return m.find(k) != m.npos; });
}

ModuleIndex::ModuleIndex(const WeightTable& table) {
  for (const WeightSpec& w : table) rows_[w.name] = &w;
  for (const WeightSpec& w : table) {
    std::string mod = w.name;
    for (std::string_view suffix : {".weight", ".bias"})
      if (ends_with(mod, suffix)) mod.resize(mod.size() - suffix.size());
    modules_[mod] = mod;
    if (w.cls == WeightClass::Modulation) {  // "blocks.3.modulation" is also reached as "blocks.3" + diff_m
      const std::string owner = mod.substr(0, mod.size() - std::string_view(".modulation").size());
      modules_.emplace(owner, owner);
    }
    underscore_[underscored(mod)] = mod;
  }
  // Diffusers spellings, underscored, without overriding an official one.
  for (const WeightSpec& w : table) {
    const std::string d = dit_official_to_diffusers(w.name);
    if (d.empty()) continue;
    std::string mod_d = d, mod_o = w.name;
    for (std::string_view suffix : {".weight", ".bias"}) {
      if (ends_with(mod_d, suffix)) mod_d.resize(mod_d.size() - suffix.size());
      if (ends_with(mod_o, suffix)) mod_o.resize(mod_o.size() - suffix.size());
    }
    underscore_.emplace(underscored(mod_d), mod_o);
  }
}

const WeightSpec* ModuleIndex::row(const std::string& name) const {
  auto it = rows_.find(name);
  return it == rows_.end() ? nullptr : it->second;
}

std::string ModuleIndex::resolve(const ParsedKey& k) const {
  if (k.module.empty()) return "";
  switch (k.style) {
    case Style::Kohya:
    case Style::KohyaFun:
    case Style::Lycoris: {
      auto it = underscore_.find(underscored(k.module));
      return it == underscore_.end() ? "" : it->second;
    }
    case Style::Diffusers: {
      bool diffusers_name = false;
      for (const char* suffix : {".weight", ""}) {  // a module with a weight, or a bare parameter
        std::string o = dit_diffusers_to_official(k.module + suffix);
        if (o.empty()) continue;
        diffusers_name = true;
        if (*suffix) o.resize(o.size() - 7);
        if (modules_.count(o)) return o;
      }
      // Not a diffusers name at all (official names under "base_model.model."): the official lookup.
      // A diffusers name without a target here ("blocks.0.norm3", the parameter-free official norm2)
      // must not fall through to the official module of the same spelling.
      if (diffusers_name) return "";
      auto it = modules_.find(k.module);
      return it == modules_.end() ? "" : it->second;
    }
    case Style::Official:
    case Style::DiffSynth: {
      auto it = modules_.find(k.module);
      return it == modules_.end() ? "" : it->second;
    }
  }
  return "";
}

}  // namespace wan::lora_detail
