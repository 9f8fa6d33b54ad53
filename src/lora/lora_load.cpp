// Reading LoRA files into a LoraSet (lora.h): open and check each file, classify its keys
// (lora_keys.h), group them per official module, validate pairs, ranks, dtypes and shapes against the
// DiT's weight table, and append one term per module to its target.
// Invariant: everything is decided from the safetensors header (plus the `.alpha` scalars); factor
// tensors are borrowed views of the file's mapping, never copied (f64 factors, which the GPU merge does
// not read, are the one exception: widened to f32 once). Every refusal is one line naming file and key.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "lora/lora.h"
#include "lora/lora_keys.h"
#include "lora/lora_peft.h"

namespace wan {
namespace {

using namespace lora_detail;
namespace fs = std::filesystem;

struct Entry {
  const TensorInfo* info = nullptr;
  std::string key;
};
// The keys of one official module in one file.
struct ModuleKeys {
  std::string own;  // the module as the file spells it (PEFT patterns match it)
  std::map<Part, Entry> parts;
};

struct FileCtx {
  const LoraSpec& spec;
  std::shared_ptr<SafetensorsFile> file;
  PeftConfig peft;
  std::string who;  // "lora <path>" for messages
};

// Checks the first bytes before handing the file to the strict reader, so a renamed .pt or a text file
// gets a plain "not a safetensors file" rather than a header-parsing message.
std::shared_ptr<SafetensorsFile> open_lora_file(const std::string& path) {
  std::error_code ec;
  WAN_CHECK(fs::is_regular_file(path, ec), "lora ", path, ": no such file");
  std::ifstream in(path, std::ios::binary);
  unsigned char head[9] = {};
  in.read(reinterpret_cast<char*>(head), 9);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
  const uint64_t size = fs::file_size(path, ec);
  WAN_CHECK(in.gcount() == 9 && n >= 2 && n <= size - 8 && head[8] == '{', "lora ", path,
            ": not a safetensors file (LoRA files must be .safetensors: an 8-byte header length, then JSON)");
  try {
    return SafetensorsFile::open(path);
  } catch (const Error& e) {
    throw e.with_context("lora " + path);
  }
}

Tensor factor(const FileCtx& c, const Entry& e) {
  const DType t = e.info->dtype;
  if (t == DType::F32 || t == DType::BF16 || t == DType::F16) return c.file->get(e.key);
  if (t == DType::F64) return c.file->get(e.key).to_f32();
  WAN_CHECK(!dtype_is_float(t), c.who, ": ", e.key, ": ", dtype_name(t), " LoRA tensors are not supported (f32, bf16, f16)");
  WAN_THROW(c.who, ": ", e.key, ": dtype ", dtype_name(t), " is not a float type");
}

double alpha_value(const FileCtx& c, const Entry& e) {
  WAN_CHECK(e.info->shape.numel() == 1, c.who, ": ", e.key, ": alpha must be one number, not ", e.info->shape.str());
  const Tensor t = c.file->get(e.key);
  switch (t.dtype()) {
    case DType::I64: return static_cast<double>(*static_cast<const int64_t*>(t.data()));
    case DType::I32: return static_cast<double>(*static_cast<const int32_t*>(t.data()));
    default: break;
  }
  WAN_CHECK(dtype_is_float(t.dtype()), c.who, ": ", e.key, ": dtype ", dtype_name(t.dtype()), " is not a number type");
  return static_cast<double>(t.to_f32().f32()[0]);
}

[[noreturn]] void refuse_kind(const std::string& who, const std::string& key, Part p) {
  switch (p) {
    case Part::LoHa: WAN_THROW(who, ": ", key, ": LyCORIS LoHa (hada_*) is not supported (only LoRA and full deltas)");
    case Part::LoKr: WAN_THROW(who, ": ", key, ": LyCORIS LoKr (lokr_*) is not supported (only LoRA and full deltas)");
    case Part::Mid: WAN_THROW(who, ": ", key, ": LoCon/Tucker lora_mid is not supported (only plain LoRA)");
    default: WAN_THROW(who, ": ", key, ": DoRA is not supported (only plain LoRA)");
  }
}

// Empty when a key with these prefixes applies to the DiT `which`, else the reason it does not.
std::string route_reason(const ParsedKey& k, bool file_has_t2, LoraExpert which) {
  if (k.transformer_2 && which == LoraExpert::All) return "transformer_2. key (a Wan 2.2 low-noise expert); this model has one DiT";
  if (k.transformer_2 && which == LoraExpert::High) return "transformer_2. key: for the low-noise expert";
  if (k.transformer && file_has_t2 && which == LoraExpert::Low)
    return "transformer. key in a file with transformer_2. keys: for the high-noise expert";
  return "";
}

// Sorts every key of the file into per-module groups; records skips. Returns whether any key named a
// module of this DiT (routing aside).
bool collect(const FileCtx& c, const ModuleIndex& index, LoraExpert which, std::map<std::string, ModuleKeys>& out,
             LoraFileSummary& sum) {
  std::vector<std::pair<ParsedKey, const TensorInfo*>> keys;
  bool has_t2 = false;
  for (const TensorInfo& ti : c.file->tensors()) {
    keys.emplace_back(parse_key(ti.name), &ti);
    has_t2 = has_t2 || keys.back().first.transformer_2;
    const Part p = keys.back().first.part;
    if (p == Part::LoHa || p == Part::LoKr || p == Part::Mid || p == Part::Dora) refuse_kind(c.who, ti.name, p);
  }
  std::set<std::string> styles;
  std::string fallback_style;
  bool any = false;
  int image_keys = 0, routed = 0;
  for (const auto& [k, ti] : keys) {
    if (k.part == Part::Unknown) {
      sum.skipped.push_back({ti->name, "not a LoRA tensor name"});
      continue;
    }
    const std::string mod = index.resolve(k);
    // patch_embedding is spelled alike in both namings: it does not make a diffusers file "mixed".
    if (k.module != "patch_embedding" || (k.style != Style::Official && k.style != Style::Diffusers))
      styles.insert(style_name(k.style));
    else
      fallback_style = style_name(k.style);
    if (mod.empty()) {
      const bool image = is_wan21_image_module(k.module);
      image_keys += image;
      sum.skipped.push_back({ti->name, image ? "Wan 2.1 I2V image layer: no target in Wan 2.2"
                                             : "no module '" + k.module + "' in this DiT"});
      continue;
    }
    any = true;
    const std::string why = route_reason(k, has_t2, which);
    if (!why.empty()) {
      ++routed;
      sum.skipped.push_back({ti->name, why});
      continue;
    }
    ModuleKeys& m = out[mod];
    m.own = k.module;
    auto [it, fresh] = m.parts.emplace(k.part, Entry{ti, ti->name});
    WAN_CHECK(fresh, c.who, ": ", ti->name, " and ", it->second.key, " are the same ", part_name(k.part), " of ", mod);
  }
  if (styles.empty() && !fallback_style.empty()) styles.insert(fallback_style);
  for (const std::string& s : styles) sum.format += (sum.format.empty() ? "" : "+") + s;
  if (image_keys)
    sum.notes.push_back(cat(image_keys, " keys of Wan 2.1 I2V image layers (k_img, v_img, norm_k_img, img_emb) ",
                            "skipped: no target in Wan 2.2"));
  if (routed) sum.notes.push_back(cat(routed, " keys routed to the other expert (transformer. / transformer_2.)"));
  return any;
}

// 2-D view of a factor: up [out, r, 1, ...] -> [out, r]; down [r, C, k...] -> [r, C·k...].
Tensor gemm_view(const Tensor& t, int64_t lead) { return t.reshape(Shape{lead, t.numel() / std::max<int64_t>(lead, 1)}); }

void check_shape(const FileCtx& c, const Entry& e, const Shape& want, const std::string& target) {
  WAN_CHECK(e.info->shape == want, c.who, ": ", e.key, ": shape ", e.info->shape.str(), " does not fit ", target, " ",
            want.str());
}

float lora_scale(const FileCtx& c, const ModuleKeys& m, const std::string& mod, int64_t rank) {
  const double strength = c.spec.strength;
  auto a = m.parts.find(Part::Alpha);
  if (a != m.parts.end()) return static_cast<float>(strength * alpha_value(c, a->second) / static_cast<double>(rank));
  if (c.peft.present) {
    const PeftModuleScale s = c.peft.module(m.own);
    WAN_CHECK(s.r == 0 || s.r == rank, c.who, ": ", mod, ": ", c.peft.source, " gives r = ", s.r,
              " but the tensors have rank ", rank);
    const double denom = c.peft.rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank);
    return static_cast<float>(strength * s.alpha / denom);
  }
  return static_cast<float>(strength);  // no alpha: ComfyUI / LightX2V / diffusers all use 1
}

// The low-rank pair of one module (with its PEFT bias) onto `w`.
void add_low_rank(const FileCtx& c, const ModuleKeys& m, const std::string& mod, const ModuleIndex& index,
                  LoraSet& set, LoraFileSummary& sum) {
  auto up_it = m.parts.find(Part::Up), down_it = m.parts.find(Part::Down);
  const bool has_up = up_it != m.parts.end(), has_down = down_it != m.parts.end();
  if (!has_up && !has_down) {
    auto bias = m.parts.find(Part::UpBias), alpha = m.parts.find(Part::Alpha);
    WAN_CHECK(bias == m.parts.end(), c.who, ": ", bias->second.key, " has no lora_A / lora_B pair");
    if (alpha != m.parts.end()) sum.skipped.push_back({alpha->second.key, "alpha without lora_up / lora_down"});
    return;
  }
  WAN_CHECK(has_up, c.who, ": ", down_it->second.key, " has no matching lora_up / lora_B");
  WAN_CHECK(has_down, c.who, ": ", up_it->second.key, " has no matching lora_down / lora_A");
  const Entry &up = up_it->second, &down = down_it->second;
  const std::string wname = mod + ".weight";
  const WeightSpec* w = index.row(wname);
  WAN_CHECK(w && w->shape.ndim >= 2, c.who, ": ", up.key, ": ", mod, " has no matrix weight a LoRA can change");
  const Shape& ws = w->shape;
  const Shape &us = up.info->shape, &ds = down.info->shape;
  WAN_CHECK(us.ndim >= 2 && ds.ndim >= 2, c.who, ": ", us.ndim < 2 ? up.key : down.key, ": a LoRA factor must have 2 or more dims, not ",
            (us.ndim < 2 ? us : ds).str());
  const int64_t rank = ds[0];
  WAN_CHECK(us[1] == rank, c.who, ": rank mismatch: ", up.key, " ", us.str(), " has rank ", us[1], ", ", down.key, " ",
            ds.str(), " has rank ", rank);
  const int64_t rows = ws[0], cols = ws.numel() / ws[0];
  bool up_ok = us[0] == rows && us.numel() == rows * rank, down_ok = rank > 0 && ds.numel() == rank * cols;
  if (ds.ndim > 2) {
    down_ok = down_ok && ds.ndim == ws.ndim;
    for (int i = 1; down_ok && i < ds.ndim; ++i) down_ok = ds[i] == ws[i];
  }
  WAN_CHECK(up_ok, c.who, ": ", up.key, ": shape ", us.str(), " does not fit ", wname, " ", ws.str(), " (want [", rows,
            ", ", rank, "])");
  WAN_CHECK(down_ok, c.who, ": ", down.key, ": shape ", ds.str(), " does not fit ", wname, " ", ws.str(), " (want [", rank,
            ", ", cols, "])");
  const float scale = lora_scale(c, m, mod, rank);
  LoraTarget& t = set.targets[wname];
  t.low_rank.push_back({gemm_view(factor(c, up), rows), gemm_view(factor(c, down), rank), scale, c.who + ": " + up.key});
  sum.matched.push_back(wname);
  auto bias = m.parts.find(Part::UpBias);
  if (bias != m.parts.end()) {  // PEFT lora_bias: scaled by the pair's scaling
    const std::string bname = mod + ".bias";
    const WeightSpec* b = index.row(bname);
    WAN_CHECK(b, c.who, ": ", bias->second.key, ": ", mod, " has no bias");
    check_shape(c, bias->second, b->shape, bname);
    set.targets[bname].full.push_back({gemm_view(factor(c, bias->second), 1), scale, c.who + ": " + bias->second.key});
    sum.matched.push_back(bname);
  }
}

// .diff / .diff_b / diff_m of one module: full deltas times strength.
void add_full(const FileCtx& c, const ModuleKeys& m, const std::string& mod, const ModuleIndex& index, LoraSet& set,
              LoraFileSummary& sum) {
  for (Part p : {Part::Diff, Part::DiffB, Part::DiffM}) {
    auto it = m.parts.find(p);
    if (it == m.parts.end()) continue;
    std::string name = mod + (p == Part::Diff ? ".weight" : p == Part::DiffB ? ".bias" : ".modulation");
    if (p == Part::Diff && !index.row(name) && index.row(mod)) name = mod;  // a bare parameter
    const WeightSpec* w = index.row(name);
    WAN_CHECK(w, c.who, ": ", it->second.key, ": this DiT has no tensor ", name);
    check_shape(c, it->second, w->shape, name);
    const int64_t rows = w->shape.ndim >= 2 ? w->shape[0] : 1;
    set.targets[name].full.push_back({gemm_view(factor(c, it->second), rows), static_cast<float>(c.spec.strength),
                                      c.who + ": " + it->second.key});
    sum.matched.push_back(name);
  }
}

void load_file(const LoraSpec& spec, LoraExpert which, const ModuleIndex& index, LoraSet& set) {
  WAN_CHECK(std::isfinite(spec.strength), "lora ", spec.path, ": strength ", spec.strength, " is not a finite number");
  FileCtx c{spec, open_lora_file(spec.path), {}, "lora " + spec.path};
  c.peft = load_peft_config(*c.file, spec.path);
  LoraFileSummary sum;
  sum.path = spec.path;
  sum.strength = spec.strength;
  sum.expert = spec.expert;
  std::map<std::string, ModuleKeys> modules;
  const bool any = collect(c, index, which, modules, sum);
  WAN_CHECK(!c.file->tensors().empty(), c.who, ": the file holds no tensors");
  WAN_CHECK(any, c.who, ": no key names a tensor of this DiT (first key: ", c.file->tensors().front().name,
            "; format ", sum.format.empty() ? "unknown" : sum.format, ")");
  bool any_alpha = false, any_pair = false;
  for (const auto& [mod, m] : modules) {
    add_low_rank(c, m, mod, index, set, sum);
    add_full(c, m, mod, index, set, sum);
    any_alpha = any_alpha || m.parts.count(Part::Alpha);
    any_pair = any_pair || m.parts.count(Part::Up);
  }
  if (c.peft.present) sum.notes.push_back("alpha from " + c.peft.source + c.peft.describe());
  else if (any_pair && !any_alpha) sum.notes.push_back("no alpha in the file: scale = strength (alpha = rank)");
  std::sort(sum.matched.begin(), sum.matched.end());
  sum.matched.erase(std::unique(sum.matched.begin(), sum.matched.end()), sum.matched.end());
  for (const std::string& n : sum.matched) {
    LoraTarget& t = set.targets[n];
    if (t.name.empty()) {
      const WeightSpec* w = index.row(n);
      t.name = n;
      t.shape = w->shape;
      t.rows = w->shape.ndim >= 2 ? w->shape[0] : 1;
      t.cols = w->shape.numel() / t.rows;
    }
  }
  set.files.push_back(std::move(sum));
}

}  // namespace

const char* lora_expert_name(LoraExpert e) {
  switch (e) {
    case LoraExpert::High: return "high";
    case LoraExpert::Low: return "low";
    case LoraExpert::All: break;
  }
  return "all";
}

LoraSpec parse_lora_arg(const std::string& text, LoraExpert expert, const std::string& option_name) {
  LoraSpec s;
  s.path = text;
  s.expert = expert;
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos && colon + 1 < text.size()) {
    const char* b = text.data() + colon + 1;
    const char* e = text.data() + text.size();
    float v = 0.0f;
    auto [ptr, ec] = std::from_chars(b, e, v);
    if (ec == std::errc() && ptr == e && std::isfinite(v)) {
      s.path = text.substr(0, colon);
      s.strength = v;
    }
  }
  WAN_CHECK_OPTION(option_name, !s.path.empty(), "{} needs a LoRA file: PATH[:SCALE], got '", text, "'");
  return s;
}

LoraSet load_lora_set(const std::vector<LoraSpec>& specs, LoraExpert which, const WeightTable& dit_table) {
  const ModuleIndex index(dit_table);
  LoraSet set;
  for (const LoraSpec& spec : specs) {
    WAN_CHECK(spec.expert == LoraExpert::All || which != LoraExpert::All, "lora ", spec.path, ": given for the ",
              lora_expert_name(spec.expert), "-noise expert, but this model has a single DiT");
    if (spec.expert != LoraExpert::All && spec.expert != which) continue;
    load_file(spec, which, index, set);
  }
  return set;
}

}  // namespace wan
