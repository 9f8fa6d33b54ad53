// DiT name mapping: diffusers WanTransformer3DModel <-> official WanModel (spec §3.3).
// The mapping is done on whole dotted path components through two small tables (top level and
// per block), never by free substring replacement, so that a name is either a DiT tensor name of
// the other style or "" (e.g. "blocks.1x.norm3.weight", "vae.conv1.weight" and
// "condition_embedder.image_embedder.*" are all rejected).
// Invariant: for every name n accepted by one direction, the other direction maps the result back
// to n. The norm2/norm3 swap is intentional: official norm3 (the affine cross-attention pre-norm)
// is diffusers norm2 and official norm2 (the parameter-free FFN pre-norm) is diffusers norm3.
// The T5 and VAE mappings of names.h live in names_t5_vae.cpp.
#include "ckpt/names.h"

#include <cstddef>
#include <string_view>

namespace wan {
namespace {

struct ModuleMap {
  std::string_view official;
  std::string_view diffusers;
  bool bare;  // a parameter itself (no ".weight"/".bias" suffix)
};

constexpr ModuleMap kTop[] = {
    {"patch_embedding", "patch_embedding", false},
    {"text_embedding.0", "condition_embedder.text_embedder.linear_1", false},
    {"text_embedding.2", "condition_embedder.text_embedder.linear_2", false},
    {"time_embedding.0", "condition_embedder.time_embedder.linear_1", false},
    {"time_embedding.2", "condition_embedder.time_embedder.linear_2", false},
    {"time_projection.1", "condition_embedder.time_proj", false},
    {"head.head", "proj_out", false},
    {"head.modulation", "scale_shift_table", true},
};

constexpr ModuleMap kBlock[] = {
    {"modulation", "scale_shift_table", true},
    {"self_attn.q", "attn1.to_q", false},
    {"self_attn.k", "attn1.to_k", false},
    {"self_attn.v", "attn1.to_v", false},
    {"self_attn.o", "attn1.to_out.0", false},
    {"self_attn.norm_q", "attn1.norm_q", false},
    {"self_attn.norm_k", "attn1.norm_k", false},
    {"cross_attn.q", "attn2.to_q", false},
    {"cross_attn.k", "attn2.to_k", false},
    {"cross_attn.v", "attn2.to_v", false},
    {"cross_attn.o", "attn2.to_out.0", false},
    {"cross_attn.norm_q", "attn2.norm_q", false},
    {"cross_attn.norm_k", "attn2.norm_k", false},
    {"norm3", "norm2", false},
    {"norm2", "norm3", false},
    {"ffn.0", "ffn.net.0.proj", false},
    {"ffn.2", "ffn.net.2", false},
};

// Maps "<module><suffix>" through one table; suffix must be "" (bare) or ".weight"/".bias".
std::string map_in_table(std::string_view name, const ModuleMap* table, size_t n, bool to_official) {
  for (size_t i = 0; i < n; ++i) {
    const ModuleMap& m = table[i];
    std::string_view from = to_official ? m.diffusers : m.official;
    std::string_view to = to_official ? m.official : m.diffusers;
    if (name.substr(0, from.size()) != from) continue;
    std::string_view suffix = name.substr(from.size());
    bool ok = m.bare ? suffix.empty() : (suffix == ".weight" || suffix == ".bias");
    if (ok) return std::string(to) + std::string(suffix);
  }
  return "";
}

// "blocks.<i>.<rest>" with i a canonical decimal (no sign, no leading zeros) -> i, rest.
bool split_block(std::string_view name, std::string_view* index, std::string_view* rest) {
  constexpr std::string_view kPrefix = "blocks.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  name.remove_prefix(kPrefix.size());
  size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') ++digits;
  if (digits == 0 || digits > 6 || digits >= name.size() || name[digits] != '.') return false;
  if (digits > 1 && name[0] == '0') return false;
  *index = name.substr(0, digits);
  *rest = name.substr(digits + 1);
  return true;
}

std::string map_dit(std::string_view name, bool to_official) {
  std::string_view index, rest;
  if (split_block(name, &index, &rest)) {
    std::string r = map_in_table(rest, kBlock, std::size(kBlock), to_official);
    if (r.empty()) return "";
    return "blocks." + std::string(index) + "." + r;
  }
  return map_in_table(name, kTop, std::size(kTop), to_official);
}

}  // namespace

std::string dit_diffusers_to_official(const std::string& name) { return map_dit(name, true); }
std::string dit_official_to_diffusers(const std::string& name) { return map_dit(name, false); }

}  // namespace wan
