// make_lora (make_lora.h): key spelling per format, Philox factors, streamed through write_safetensors.
#include "testing/make_lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/names.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/philox.h"
#include "testing/text_files.h"
#include "formats/safetensors.h"
#include "models/dit/weights.h"

namespace wan::gen {
namespace {

std::string replace_all(std::string s, char from, char to) {
  for (char& ch : s)
    if (ch == from) ch = to;
  return s;
}

// The key stem of a module in a format ("" + suffixes appended by the caller).
std::string stem(LoraFormat f, const std::string& module) {
  switch (f) {
    case LoraFormat::Official: return "diffusion_model." + module;
    case LoraFormat::Kohya: return "lora_unet_" + replace_all(module, '.', '_');
    case LoraFormat::Peft: {
      const std::string d = dit_official_to_diffusers(module + ".weight");
      WAN_ASSERT(d.size() > 7, "no diffusers name for ", module);
      return "transformer." + d.substr(0, d.size() - 7);
    }
  }
  return module;
}

uint64_t factor_key(uint64_t seed, const std::string& module, const char* which) {
  return splitmix64(seed ^ fnv1a64(module + "/" + which));
}

}  // namespace

LoraFormat lora_format_from_name(const std::string& s) {
  if (s == "official") return LoraFormat::Official;
  if (s == "kohya") return LoraFormat::Kohya;
  if (s == "peft") return LoraFormat::Peft;
  WAN_THROW("unknown LoRA format '", s, "' (valid: official, kohya, peft)");
}

std::vector<std::string> lora_modules(const DiTConfig& c, bool all_targets) {
  std::vector<std::string> m;
  if (all_targets)
    for (const char* n : {"text_embedding.0", "text_embedding.2", "time_embedding.0", "time_embedding.2",
                          "time_projection.1"})
      m.push_back(n);
  for (int b = 0; b < c.num_layers; ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    for (const char* a : {"self_attn", "cross_attn"})
      for (const char* x : {"q", "k", "v", "o"}) m.push_back(p + a + "." + x);
    m.push_back(p + "ffn.0");
    m.push_back(p + "ffn.2");
  }
  if (all_targets) m.push_back("head.head");
  return m;
}

MakeLoraResult make_lora(const MakeLoraOptions& o) {
  WAN_CHECK(o.rank >= 1, "LoRA rank ", o.rank, " (at least 1)");
  WAN_CHECK(o.dtype == DType::F32 || o.dtype == DType::BF16 || o.dtype == DType::F16,
                 "LoRA factors are f32, bf16 or f16");
  const std::map<std::string, Shape> shapes = dit_expected_shapes(o.dit);
  struct Factor {
    std::string module;
    bool up;
    int64_t fan_in;
  };
  std::vector<TensorSpec> specs;
  std::map<std::string, Factor> what;
  std::vector<std::string> alpha_keys;
  const std::vector<std::string> modules = lora_modules(o.dit, o.all_targets);
  const bool peft = o.format == LoraFormat::Peft;
  for (const std::string& m : modules) {
    const Shape& w = shapes.at(m + ".weight");
    const int64_t out = w[0], in = w.numel() / w[0];
    WAN_CHECK(o.rank <= std::min(out, in), "LoRA rank ", o.rank, " exceeds ", m, "'s ",
                   out, "x", in);
    const std::string s = stem(o.format, m);
    const std::string down = s + (peft ? ".lora_A.weight" : ".lora_down.weight");
    const std::string up = s + (peft ? ".lora_B.weight" : ".lora_up.weight");
    specs.push_back({down, o.dtype, Shape{o.rank, in}});
    specs.push_back({up, o.dtype, Shape{out, o.rank}});
    what[down] = {m, false, in};
    what[up] = {m, true, in};
    if (o.alpha > 0 && !peft) alpha_keys.push_back(s + ".alpha");
  }
  for (const std::string& k : alpha_keys) specs.push_back({k, DType::F32, Shape{}});
  const TensorFill fill = [&](const TensorSpec& spec, void* dst) {
    const size_t n = static_cast<size_t>(spec.shape.numel());
    std::vector<float> v(n);
    auto it = what.find(spec.name);
    if (it == what.end()) {  // .alpha
      v[0] = o.alpha;
    } else {
      const Factor& f = it->second;
      philox_normal_fill(factor_key(o.seed, f.module, f.up ? "up" : "down"), 0, v.data(), n);
      const float s = f.up ? o.up_std : 1.0f / std::sqrt(static_cast<float>(f.fan_in));
      for (float& x : v) x = x * s;
    }
    if (spec.dtype == DType::F32) std::memcpy(dst, v.data(), n * 4);
    else convert_from_f32(spec.dtype, v.data(), dst, n);
  };
  std::map<std::string, std::string> meta{{"format", "pt"}, {"wan.make_lora", "rank " + std::to_string(o.rank)}};
  write_safetensors(o.out, specs, fill, meta);
  MakeLoraResult r;
  r.modules = static_cast<int>(modules.size());
  r.files.push_back(o.out);
  r.bytes = std::filesystem::file_size(o.out);
  if (peft) {
    nlohmann::json cfg;
    cfg["peft_type"] = "LORA";
    cfg["r"] = o.rank;
    cfg["lora_alpha"] = o.alpha > 0 ? o.alpha : static_cast<float>(o.rank);
    std::vector<std::string> targets;
    for (const std::string& m : modules) targets.push_back(stem(LoraFormat::Peft, m).substr(12));
    cfg["target_modules"] = targets;
    const std::string path = (std::filesystem::path(o.out).parent_path() / "adapter_config.json").string();
    write_text_file(path, cfg.dump(2) + "\n");
    r.files.push_back(path);
  }
  return r;
}

}  // namespace wan::gen
