// Name mappings of the UMT5 text encoder (official T5Encoder <-> HF UMT5EncoderModel, spec §4.4/§4.5)
// and of the two Wan VAEs (official WanVAE_ <-> diffusers AutoencoderKLWan, spec §5.3/§6.2).
// Both directions parse a name into a small canonical record, check it against the released
// structure, and print it in the other style; a name that does not parse, or names a module the
// released structure does not have, maps to "".
// Structure assumed (every release and every preset): 4 stages, 2 residual blocks per encoder stage
// and 3 per decoder stage, a resampler after every stage but the last, temporal resampling in
// encoder stages 1 and 2 and decoder stages 0 and 1.
// Invariant: for every accepted name, mapping to the other style and back returns it, except the
// HF alias "encoder.embed_tokens.weight" (tied to "shared.weight"), which maps to the embedding.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/names.h"

namespace wan {
namespace {

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    if (dot == std::string_view::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
}

// Canonical decimal (no sign, no leading zero, at most 6 digits) -> value, else -1.
int parse_index(std::string_view s) {
  if (s.empty() || s.size() > 6 || (s.size() > 1 && s[0] == '0')) return -1;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string join_from(const std::vector<std::string_view>& p, size_t from) {
  std::string r;
  for (size_t i = from; i < p.size(); ++i) {
    if (i > from) r += '.';
    r += p[i];
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// T5

struct T5Leaf {
  std::string_view official;  // after "blocks.<i>."
  std::string_view hf;        // after "encoder.block.<i>."
};
constexpr T5Leaf kT5Block[] = {
    {"norm1.weight", "layer.0.layer_norm.weight"},
    {"attn.q.weight", "layer.0.SelfAttention.q.weight"},
    {"attn.k.weight", "layer.0.SelfAttention.k.weight"},
    {"attn.v.weight", "layer.0.SelfAttention.v.weight"},
    {"attn.o.weight", "layer.0.SelfAttention.o.weight"},
    {"pos_embedding.embedding.weight", "layer.0.SelfAttention.relative_attention_bias.weight"},
    {"norm2.weight", "layer.1.layer_norm.weight"},
    {"ffn.gate.0.weight", "layer.1.DenseReluDense.wi_0.weight"},
    {"ffn.fc1.weight", "layer.1.DenseReluDense.wi_1.weight"},
    {"ffn.fc2.weight", "layer.1.DenseReluDense.wo.weight"},
};

// "<prefix><i>.<rest>" -> (i, rest) or false.
bool split_indexed(std::string_view name, std::string_view prefix, int* index, std::string_view* rest) {
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  size_t dot = name.find('.');
  if (dot == std::string_view::npos) return false;
  *index = parse_index(name.substr(0, dot));
  *rest = name.substr(dot + 1);
  return *index >= 0;
}

// ---------------------------------------------------------------------------------------------
// VAE canonical record

enum class Side { Top, Encoder, Decoder };
enum class Part {
  QuantConv,      // top-level conv1 (encoder output -> mean|logvar)
  PostQuantConv,  // top-level conv2 (latent -> decoder input)
  ConvIn,         // encoder/decoder conv1
  NormOut,        // head.0
  ConvOut,        // head.2
  MidRes,         // middle.0 (index 0) / middle.2 (index 1)
  MidAttn,        // middle.1
  StageRes,       // residual block j of stage s
  StageResample,  // the resampler closing stage s
};

struct VaeRef {
  Side side = Side::Top;
  Part part = Part::QuantConv;
  int stage = 0, index = 0;
  std::string leaf;  // canonical leaf, diffusers spelling ("norm1.gamma", "conv1.weight", "to_qkv.bias", ...)
};

constexpr int kStages = 4;
int res_per_stage(Side s) { return s == Side::Encoder ? 2 : 3; }
bool has_time_conv(Side s, int stage) {
  return s == Side::Encoder ? (stage == 1 || stage == 2) : (stage == 0 || stage == 1);
}

bool is_conv_leaf(std::string_view l) { return l == "weight" || l == "bias"; }

// Official residual-block leaf -> canonical (diffusers) leaf.
std::string res_leaf_to_canon(const std::vector<std::string_view>& p, size_t i) {
  if (p.size() == i + 3 && p[i] == "residual") {
    std::string_view k = p[i + 1], l = p[i + 2];
    if (k == "0" && l == "gamma") return "norm1.gamma";
    if (k == "3" && l == "gamma") return "norm2.gamma";
    if (k == "2" && is_conv_leaf(l)) return "conv1." + std::string(l);
    if (k == "6" && is_conv_leaf(l)) return "conv2." + std::string(l);
    return "";
  }
  if (p.size() == i + 2 && p[i] == "shortcut" && is_conv_leaf(p[i + 1]))
    return "conv_shortcut." + std::string(p[i + 1]);
  return "";
}
std::string res_leaf_to_official(std::string_view canon) {
  if (canon == "norm1.gamma") return "residual.0.gamma";
  if (canon == "norm2.gamma") return "residual.3.gamma";
  if (canon.substr(0, 6) == "conv1.") return "residual.2." + std::string(canon.substr(6));
  if (canon.substr(0, 6) == "conv2.") return "residual.6." + std::string(canon.substr(6));
  if (canon.substr(0, 14) == "conv_shortcut.") return "shortcut." + std::string(canon.substr(14));
  return "";
}
// Diffusers residual leaf (already canonical) check.
std::string res_leaf_diffusers(const std::vector<std::string_view>& p, size_t i) {
  if (p.size() != i + 2) return "";
  std::string_view m = p[i], l = p[i + 1];
  if ((m == "norm1" || m == "norm2") && l == "gamma") return std::string(m) + ".gamma";
  if ((m == "conv1" || m == "conv2" || m == "conv_shortcut") && is_conv_leaf(l))
    return std::string(m) + "." + std::string(l);
  return "";
}
// Attention and resampler leaves are spelled the same in both styles.
std::string attn_leaf(const std::vector<std::string_view>& p, size_t i) {
  if (p.size() != i + 2) return "";
  if (p[i] == "norm" && p[i + 1] == "gamma") return "norm.gamma";
  if ((p[i] == "to_qkv" || p[i] == "proj") && is_conv_leaf(p[i + 1])) return join_from(p, i);
  return "";
}
std::string resample_leaf(const std::vector<std::string_view>& p, size_t i) {
  if (p.size() == i + 3 && p[i] == "resample" && p[i + 1] == "1" && is_conv_leaf(p[i + 2])) return join_from(p, i);
  if (p.size() == i + 2 && p[i] == "time_conv" && is_conv_leaf(p[i + 1])) return join_from(p, i);
  return "";
}

// Checks a record against the released structure.
bool valid(const VaeRef& r) {
  if (r.leaf.empty()) return false;
  switch (r.part) {
    case Part::StageRes:
      return r.stage >= 0 && r.stage < kStages && r.index >= 0 && r.index < res_per_stage(r.side);
    case Part::StageResample:
      if (r.stage < 0 || r.stage >= kStages - 1) return false;
      if (r.leaf.rfind("time_conv.", 0) == 0) return has_time_conv(r.side, r.stage);
      return true;
    case Part::MidRes:
      return r.index == 0 || r.index == 1;
    default:
      return true;
  }
}

// Official name -> record (structure not yet checked; see valid()).
bool parse_official(const std::string& name, int version, VaeRef* r) {
  auto p = split_dots(name);
  if (p.size() == 2 && (p[0] == "conv1" || p[0] == "conv2") && is_conv_leaf(p[1])) {
    r->side = Side::Top;
    r->part = p[0] == "conv1" ? Part::QuantConv : Part::PostQuantConv;
    r->leaf = std::string(p[1]);
    return true;
  }
  if (p.size() < 3) return false;
  if (p[0] == "encoder")
    r->side = Side::Encoder;
  else if (p[0] == "decoder")
    r->side = Side::Decoder;
  else
    return false;
  const bool enc = r->side == Side::Encoder;
  if (p[1] == "conv1" && p.size() == 3 && is_conv_leaf(p[2])) {
    r->part = Part::ConvIn;
    r->leaf = std::string(p[2]);
    return true;
  }
  if (p[1] == "head" && p.size() == 4) {
    if (p[2] == "0" && p[3] == "gamma") {
      r->part = Part::NormOut;
      r->leaf = "gamma";
      return true;
    }
    if (p[2] == "2" && is_conv_leaf(p[3])) {
      r->part = Part::ConvOut;
      r->leaf = std::string(p[3]);
      return true;
    }
    return false;
  }
  if (p[1] == "middle") {
    if (p[2] == "0" || p[2] == "2") {
      r->part = Part::MidRes;
      r->index = p[2] == "0" ? 0 : 1;
      r->leaf = res_leaf_to_canon(p, 3);
      return true;
    }
    if (p[2] == "1") {
      r->part = Part::MidAttn;
      r->leaf = attn_leaf(p, 3);
      return true;
    }
    return false;
  }
  const std::string_view stages = enc ? "downsamples" : "upsamples";
  if (p[1] != stages) return false;
  int n = parse_index(p[2]);
  if (n < 0) return false;
  size_t leaf_at;
  if (version == 21) {
    // Flat Sequential: each stage holds its residual blocks, then its resampler.
    const int per = res_per_stage(r->side) + 1;
    r->stage = n / per;
    r->index = n % per;
    leaf_at = 3;
  } else {
    if (p.size() < 5 || p[3] != stages) return false;
    r->stage = n;
    r->index = parse_index(p[4]);
    if (r->index < 0) return false;
    leaf_at = 5;
  }
  if (r->index == res_per_stage(r->side)) {
    r->part = Part::StageResample;
    r->leaf = resample_leaf(p, leaf_at);
  } else {
    r->part = Part::StageRes;
    r->leaf = res_leaf_to_canon(p, leaf_at);
  }
  return true;
}

std::string print_official(const VaeRef& r, int version) {
  if (r.side == Side::Top) return (r.part == Part::QuantConv ? "conv1." : "conv2.") + r.leaf;
  const bool enc = r.side == Side::Encoder;
  const std::string pre = enc ? "encoder." : "decoder.";
  switch (r.part) {
    case Part::ConvIn:
      return pre + "conv1." + r.leaf;
    case Part::NormOut:
      return pre + "head.0." + r.leaf;
    case Part::ConvOut:
      return pre + "head.2." + r.leaf;
    case Part::MidRes:
      return pre + "middle." + (r.index == 0 ? "0." : "2.") + res_leaf_to_official(r.leaf);
    case Part::MidAttn:
      return pre + "middle.1." + r.leaf;
    case Part::StageRes:
    case Part::StageResample: {
      const std::string stages = enc ? "downsamples." : "upsamples.";
      const std::string leaf = r.part == Part::StageRes ? res_leaf_to_official(r.leaf) : r.leaf;
      if (version == 21) {
        const int per = res_per_stage(r.side) + 1;
        return pre + stages + std::to_string(r.stage * per + r.index) + "." + leaf;
      }
      return pre + stages + std::to_string(r.stage) + "." + stages + std::to_string(r.index) + "." + leaf;
    }
    default:
      return "";
  }
}

// Diffusers name -> record (structure not yet checked; see valid()).
bool parse_diffusers(const std::string& name, int version, VaeRef* r) {
  auto p = split_dots(name);
  if (p.size() == 2 && (p[0] == "quant_conv" || p[0] == "post_quant_conv") && is_conv_leaf(p[1])) {
    r->side = Side::Top;
    r->part = p[0] == "quant_conv" ? Part::QuantConv : Part::PostQuantConv;
    r->leaf = std::string(p[1]);
    return true;
  }
  if (p.size() < 3) return false;
  if (p[0] == "encoder")
    r->side = Side::Encoder;
  else if (p[0] == "decoder")
    r->side = Side::Decoder;
  else
    return false;
  const bool enc = r->side == Side::Encoder;
  if ((p[1] == "conv_in" || p[1] == "conv_out") && p.size() == 3 && is_conv_leaf(p[2])) {
    r->part = p[1] == "conv_in" ? Part::ConvIn : Part::ConvOut;
    r->leaf = std::string(p[2]);
    return true;
  }
  if (p[1] == "norm_out" && p.size() == 3 && p[2] == "gamma") {
    r->part = Part::NormOut;
    r->leaf = "gamma";
    return true;
  }
  if (p[1] == "mid_block" && p.size() >= 5) {
    int k = parse_index(p[3]);
    if (p[2] == "resnets" && k >= 0) {
      r->part = Part::MidRes;
      r->index = k;
      r->leaf = res_leaf_diffusers(p, 4);
      return true;
    }
    if (p[2] == "attentions" && k == 0) {
      r->part = Part::MidAttn;
      r->leaf = attn_leaf(p, 4);
      return true;
    }
    return false;
  }
  const std::string_view blocks = enc ? "down_blocks" : "up_blocks";
  if (p[1] != blocks || p.size() < 4) return false;
  int n = parse_index(p[2]);
  if (n < 0) return false;
  if (version == 21 && enc) {
    // Flat list, same indices as the official Sequential.
    const int per = res_per_stage(r->side) + 1;
    r->stage = n / per;
    r->index = n % per;
    if (r->index == per - 1) {
      r->part = Part::StageResample;
      r->leaf = resample_leaf(p, 3);
    } else {
      r->part = Part::StageRes;
      r->leaf = res_leaf_diffusers(p, 3);
    }
    return true;
  }
  r->stage = n;
  if (p[3] == "resnets" && p.size() >= 5) {
    r->part = Part::StageRes;
    r->index = parse_index(p[4]);
    r->leaf = r->index >= 0 ? res_leaf_diffusers(p, 5) : "";
    return true;
  }
  // Resampler container: 2.1 decoder "upsamplers.0", 2.2 "downsampler" / "upsampler".
  r->part = Part::StageResample;
  r->index = res_per_stage(r->side);
  if (version == 21 && p[3] == "upsamplers" && p.size() >= 5 && p[4] == "0") {
    r->leaf = resample_leaf(p, 5);
    return true;
  }
  if (version == 22 && p[3] == (enc ? "downsampler" : "upsampler")) {
    r->leaf = resample_leaf(p, 4);
    return true;
  }
  return false;
}

std::string print_diffusers(const VaeRef& r, int version) {
  if (r.side == Side::Top) return (r.part == Part::QuantConv ? "quant_conv." : "post_quant_conv.") + r.leaf;
  const bool enc = r.side == Side::Encoder;
  const std::string pre = enc ? "encoder." : "decoder.";
  const std::string blocks = enc ? "down_blocks." : "up_blocks.";
  switch (r.part) {
    case Part::ConvIn:
      return pre + "conv_in." + r.leaf;
    case Part::NormOut:
      return pre + "norm_out." + r.leaf;
    case Part::ConvOut:
      return pre + "conv_out." + r.leaf;
    case Part::MidRes:
      return pre + "mid_block.resnets." + std::to_string(r.index) + "." + r.leaf;
    case Part::MidAttn:
      return pre + "mid_block.attentions.0." + r.leaf;
    case Part::StageRes:
      if (version == 21 && enc) return pre + blocks + std::to_string(r.stage * 3 + r.index) + "." + r.leaf;
      return pre + blocks + std::to_string(r.stage) + ".resnets." + std::to_string(r.index) + "." + r.leaf;
    case Part::StageResample:
      if (version == 21) {
        if (enc) return pre + blocks + std::to_string(r.stage * 3 + 2) + "." + r.leaf;
        return pre + blocks + std::to_string(r.stage) + ".upsamplers.0." + r.leaf;
      }
      return pre + blocks + std::to_string(r.stage) + (enc ? ".downsampler." : ".upsampler.") + r.leaf;
    default:
      return "";
  }
}

}  // namespace

std::string t5_official_to_hf(const std::string& name) {
  if (name == "token_embedding.weight") return "shared.weight";
  if (name == "norm.weight") return "encoder.final_layer_norm.weight";
  int i;
  std::string_view rest;
  if (!split_indexed(name, "blocks.", &i, &rest)) return "";
  for (const T5Leaf& l : kT5Block)
    if (rest == l.official) return "encoder.block." + std::to_string(i) + "." + std::string(l.hf);
  return "";
}

std::string t5_hf_to_official(const std::string& name) {
  if (name == "shared.weight" || name == "encoder.embed_tokens.weight") return "token_embedding.weight";
  if (name == "encoder.final_layer_norm.weight") return "norm.weight";
  int i;
  std::string_view rest;
  if (!split_indexed(name, "encoder.block.", &i, &rest)) return "";
  for (const T5Leaf& l : kT5Block)
    if (rest == l.hf) return "blocks." + std::to_string(i) + "." + std::string(l.official);
  return "";
}

std::string vae_official_to_diffusers(const std::string& name, int version) {
  if (version != 21 && version != 22) return "";
  VaeRef r;
  if (!parse_official(name, version, &r) || !valid(r)) return "";
  return print_diffusers(r, version);
}

std::string vae_diffusers_to_official(const std::string& name, int version) {
  if (version != 21 && version != 22) return "";
  VaeRef r;
  if (!parse_diffusers(name, version, &r) || !valid(r)) return "";
  return print_official(r, version);
}

}  // namespace wan
