// Model configurations: presets of the released models (spec §1.2, §2.1, §4.1, §5.1, §6.1), the
// official and diffusers config.json styles of the DiT (spec §2.1, §3.3) and inference of the DiT
// config from tensor shapes (spec §3.4).
// Invariants: every DiTConfig returned by a reader has passed validate(); readers throw wan::Error
// with one line naming the offending key (callers prepend the file name); writers emit exactly the
// keys the reference code writes, sorted, so a written config reads back to an equal DiTConfig.
#include "models/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "core/json_limits.h"

namespace wan {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Tasks

const char* task_name(Task t) {
  switch (t) {
    case Task::T2V_A14B: return "t2v-A14B";
    case Task::I2V_A14B: return "i2v-A14B";
    case Task::TI2V_5B: return "ti2v-5B";
  }
  return "?";
}

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

Task task_from_name(const std::string& s) {
  for (Task t : {Task::T2V_A14B, Task::I2V_A14B, Task::TI2V_5B})
    if (lower(s) == lower(task_name(t))) return t;
  WAN_THROW("unknown task '", s, "' (valid: t2v-A14B, i2v-A14B, ti2v-5B)");
}

// ---------------------------------------------------------------------------------------------
// DiT config

namespace {
// The three conditioning modes fix the channel counts (spec §1.4): only these are runnable.
struct ModelTypeDims {
  const char* type;
  int in_dim, out_dim;
};
constexpr ModelTypeDims kModelTypes[] = {{"t2v", 16, 16}, {"i2v", 36, 16}, {"ti2v", 48, 48}};

const ModelTypeDims* model_type_for_in_dim(int in_dim) {
  for (const auto& m : kModelTypes)
    if (m.in_dim == in_dim) return &m;
  return nullptr;
}
}  // namespace

void DiTConfig::validate() const {
  WAN_CHECK(dim > 0 && num_heads > 0 && num_layers > 0 && ffn_dim > 0 && freq_dim > 0 && text_dim > 0 &&
                text_len > 0 && in_dim > 0 && out_dim > 0,
            "DiT config: dim, ffn_dim, num_heads, num_layers, freq_dim, text_dim, text_len, in_dim and out_dim "
            "must be positive (dim ", dim, ", ffn_dim ", ffn_dim, ", num_heads ", num_heads, ", num_layers ",
            num_layers, ", freq_dim ", freq_dim, ", text_dim ", text_dim, ", text_len ", text_len, ", in_dim ",
            in_dim, ", out_dim ", out_dim, ")");
  // Far above every released model (dim 5120, ffn_dim 14336, 40 layers, text 512 x 4096), and low enough
  // that every size derived from a config (parameter counts, buffer bytes) fits 64-bit arithmetic.
  WAN_CHECK(dim <= 65536 && ffn_dim <= 262144 && num_layers <= 1024 && freq_dim <= 65536 && text_dim <= 65536 &&
                text_len <= 65536,
            "DiT config: a size is out of range (dim ", dim, ", ffn_dim ", ffn_dim, ", num_layers ", num_layers,
            ", freq_dim ", freq_dim, ", text_dim ", text_dim, ", text_len ", text_len,
            "; limits: dim, freq_dim, text_dim, text_len 65536, ffn_dim 262144, num_layers 1024)");
  WAN_CHECK(dim % num_heads == 0, "DiT config: dim ", dim, " is not divisible by num_heads ", num_heads);
  // The 3D RoPE splits head_dim into (d - 4(d/6), 2(d/6), 2(d/6)) channels; the released models and
  // the attention kernels use 128.
  WAN_CHECK(head_dim() == 128, "DiT config: head_dim = dim / num_heads = ", dim, " / ", num_heads, " = ", head_dim(),
            ", only 128 is supported");
  WAN_CHECK(freq_dim % 2 == 0, "DiT config: freq_dim ", freq_dim, " must be even");
  WAN_CHECK(eps > 0.0f && eps < 1.0f, "DiT config: eps ", eps, " out of range (0, 1)");
  WAN_CHECK(patch[0] == 1 && patch[1] == 2 && patch[2] == 2, "DiT config: patch_size [", patch[0], ", ", patch[1],
            ", ", patch[2], "] is not supported (only [1, 2, 2])");
  const ModelTypeDims* m = nullptr;
  for (const auto& t : kModelTypes)
    if (model_type == t.type) m = &t;
  WAN_CHECK(m != nullptr, "DiT config: model_type '", model_type, "' is not one of t2v, i2v, ti2v");
  WAN_CHECK(in_dim == m->in_dim && out_dim == m->out_dim, "DiT config: model_type '", model_type,
            "' needs in_dim ", m->in_dim, " and out_dim ", m->out_dim, ", got in_dim ", in_dim, " and out_dim ",
            out_dim);
}

bool DiTConfig::operator==(const DiTConfig& o) const {
  return dim == o.dim && ffn_dim == o.ffn_dim && num_heads == o.num_heads && num_layers == o.num_layers &&
         in_dim == o.in_dim && out_dim == o.out_dim && freq_dim == o.freq_dim && text_dim == o.text_dim &&
         text_len == o.text_len && eps == o.eps && patch[0] == o.patch[0] && patch[1] == o.patch[1] &&
         patch[2] == o.patch[2] && model_type == o.model_type;
}

DiTConfig dit_preset(const std::string& name) {
  DiTConfig c;  // defaults = the 14B T2V expert
  std::string n = lower(name);
  if (n == "t2v-a14b") return c;
  if (n == "i2v-a14b") {
    c.in_dim = 36;
    c.model_type = "i2v";
    return c;
  }
  if (n == "ti2v-5b") {
    c.dim = 3072;
    c.ffn_dim = 14336;
    c.num_heads = 24;
    c.num_layers = 30;
    c.in_dim = c.out_dim = 48;
    c.model_type = "ti2v";
    return c;
  }
  // Tiny test models: the real head_dim (128), freq_dim and text_dim (4096, so a real UMT5 output
  // fits), everything else small.
  if (n == "tiny" || n == "tiny-t2v" || n == "tiny-i2v" || n == "tiny-ti2v") {
    c.dim = 256;
    c.ffn_dim = 512;
    c.num_heads = 2;
    c.num_layers = 2;
    if (n == "tiny-i2v") {
      c.in_dim = 36;
      c.model_type = "i2v";
    } else if (n == "tiny-ti2v") {
      c.in_dim = c.out_dim = 48;
      c.model_type = "ti2v";
    }
    return c;
  }
  WAN_THROW("unknown DiT preset '", name, "' (valid: t2v-A14B, i2v-A14B, ti2v-5B, tiny, tiny-i2v, tiny-ti2v)");
}

namespace {

// Reads an integer key; absent -> fallback (or an error when required).
int get_int(const json& j, const char* key, bool required, int fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    WAN_CHECK(!required, "config key '", key, "' is missing");
    return fallback;
  }
  // Range first, cast second: converting a double outside int's range (1e300) is undefined.
  const double d = it->is_number_float() ? it->get<double>() : 0.0;
  WAN_CHECK(it->is_number_integer() || (it->is_number_float() && d == std::trunc(d)), "config key '", key,
            "' must be an integer, got ", it->dump());
  bool in_range;
  if (it->is_number_unsigned()) {
    in_range = it->get<uint64_t>() < (1ULL << 31);
  } else if (it->is_number_integer()) {
    in_range = it->get<int64_t>() >= -(1LL << 31) && it->get<int64_t>() < (1LL << 31);
  } else {
    in_range = d >= -2147483648.0 && d < 2147483648.0;
  }
  WAN_CHECK(in_range, "config key '", key, "' out of range: ", it->dump());
  return it->is_number_integer() ? static_cast<int>(it->get<int64_t>()) : static_cast<int>(d);
}

float get_float(const json& j, const char* key, float fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  WAN_CHECK(it->is_number(), "config key '", key, "' must be a number, got ", it->dump());
  return static_cast<float>(it->get<double>());
}

void read_patch(const json& j, int patch[3]) {
  auto it = j.find("patch_size");
  if (it == j.end() || it->is_null()) return;
  WAN_CHECK(it->is_array() && it->size() == 3, "config key 'patch_size' must be a list of 3 integers, got ",
            it->dump());
  for (int i = 0; i < 3; ++i) {
    const json& v = (*it)[i];
    WAN_CHECK(v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() < (1ULL << 31)
                                                                 : v.get<int64_t>() >= -(1LL << 31) && v.get<int64_t>() < (1LL << 31)),
              "config key 'patch_size' must be a list of 3 integers, got ", it->dump());
    patch[i] = v.get<int>();
  }
}

// The float written as the shortest decimal that reads back to it ("1e-06", not 9.99999997e-07).
double float_for_json(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

DiTConfig read_official(const json& j) {
  DiTConfig c;
  c.dim = get_int(j, "dim", true, 0);
  c.ffn_dim = get_int(j, "ffn_dim", true, 0);
  c.num_heads = get_int(j, "num_heads", true, 0);
  c.num_layers = get_int(j, "num_layers", true, 0);
  c.in_dim = get_int(j, "in_dim", true, 0);
  c.out_dim = get_int(j, "out_dim", true, 0);
  c.freq_dim = get_int(j, "freq_dim", false, c.freq_dim);
  c.text_dim = get_int(j, "text_dim", false, c.text_dim);
  c.text_len = get_int(j, "text_len", false, c.text_len);
  c.eps = get_float(j, "eps", c.eps);
  read_patch(j, c.patch);
  auto mt = j.find("model_type");
  if (mt != j.end() && !mt->is_null()) {
    WAN_CHECK(mt->is_string(), "config key 'model_type' must be a string, got ", mt->dump());
    c.model_type = mt->get<std::string>();
  } else {
    const ModelTypeDims* m = model_type_for_in_dim(c.in_dim);
    WAN_CHECK(m != nullptr, "config has no 'model_type' and in_dim ", c.in_dim, " is not 16, 36 or 48");
    c.model_type = m->type;
  }
  return c;
}

DiTConfig read_diffusers(const json& j) {
  DiTConfig c;
  int heads = get_int(j, "num_attention_heads", true, 0);
  int head_dim = get_int(j, "attention_head_dim", true, 0);
  c.num_heads = heads;
  const int64_t dim = static_cast<int64_t>(heads) * head_dim;  // two ints: the product may not fit one
  WAN_CHECK(dim >= -(1LL << 31) && dim < (1LL << 31), "config: num_attention_heads ", heads, " x attention_head_dim ",
            head_dim, " = ", dim, " is out of range");
  c.dim = static_cast<int>(dim);
  c.ffn_dim = get_int(j, "ffn_dim", true, 0);
  c.num_layers = get_int(j, "num_layers", true, 0);
  c.in_dim = get_int(j, "in_channels", true, 0);
  c.out_dim = get_int(j, "out_channels", false, c.in_dim);
  c.freq_dim = get_int(j, "freq_dim", false, c.freq_dim);
  c.text_dim = get_int(j, "text_dim", false, c.text_dim);
  c.eps = get_float(j, "eps", c.eps);
  read_patch(j, c.patch);
  // Wan 2.1 I2V / FLF2V add a CLIP image branch; Wan 2.2 has none and this engine does not run it.
  for (const char* k : {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"}) {
    auto it = j.find(k);
    WAN_CHECK(it == j.end() || it->is_null(), "config key '", k, "' = ", it->dump(),
              ": image cross-attention (Wan 2.1 I2V/FLF2V) is not supported, Wan 2.2 models have null");
  }
  auto qk = j.find("qk_norm");
  WAN_CHECK(qk == j.end() || (qk->is_string() && qk->get<std::string>() == "rms_norm_across_heads"),
            "config key 'qk_norm' = ", qk->dump(), ": only \"rms_norm_across_heads\" is supported");
  auto can = j.find("cross_attn_norm");
  WAN_CHECK(can == j.end() || (can->is_boolean() && can->get<bool>()), "config key 'cross_attn_norm' = ",
            can->dump(), ": only true is supported");
  const ModelTypeDims* m = model_type_for_in_dim(c.in_dim);
  WAN_CHECK(m != nullptr, "config key 'in_channels' = ", c.in_dim, " is not 16 (t2v), 36 (i2v) or 48 (ti2v)");
  c.model_type = m->type;
  return c;
}

}  // namespace

DiTConfig dit_config_from_json(const std::string& json_text) {
  const json j = parse_json_limited(json_text, "config");
  WAN_CHECK(j.is_object(), "config is not a JSON object");
  std::string cls;
  if (auto it = j.find("_class_name"); it != j.end() && it->is_string()) cls = it->get<std::string>();
  DiTConfig c;
  if (cls == "WanTransformer3DModel" || (cls.empty() && j.contains("num_attention_heads"))) {
    c = read_diffusers(j);
  } else if (cls == "WanModel" || (cls.empty() && j.contains("dim"))) {
    c = read_official(j);
  } else {
    WAN_THROW("not a Wan DiT config (_class_name '", cls,
              "', expected WanModel or WanTransformer3DModel, or keys dim / num_attention_heads)");
  }
  c.validate();
  return c;
}

std::string dit_config_to_official_json(const DiTConfig& c) {
  c.validate();
  json j;  // std::map-backed: keys come out sorted, as diffusers' save_config writes them
  j["_class_name"] = "WanModel";
  j["_diffusers_version"] = "0.33.0";
  j["dim"] = c.dim;
  j["eps"] = float_for_json(c.eps);
  j["ffn_dim"] = c.ffn_dim;
  j["freq_dim"] = c.freq_dim;
  j["in_dim"] = c.in_dim;
  j["model_type"] = c.model_type;
  j["num_heads"] = c.num_heads;
  j["num_layers"] = c.num_layers;
  j["out_dim"] = c.out_dim;
  j["text_len"] = c.text_len;
  // WanModel ignores text_dim in its config; written only when it differs from the constructor default
  // so the file still reads back exactly.
  if (c.text_dim != 4096) j["text_dim"] = c.text_dim;
  return j.dump(2) + "\n";
}

std::string dit_config_to_diffusers_json(const DiTConfig& c) {
  c.validate();
  json j;
  j["_class_name"] = "WanTransformer3DModel";
  j["_diffusers_version"] = "0.35.0";
  j["added_kv_proj_dim"] = nullptr;
  j["attention_head_dim"] = c.head_dim();
  j["cross_attn_norm"] = true;
  j["eps"] = float_for_json(c.eps);
  j["ffn_dim"] = c.ffn_dim;
  j["freq_dim"] = c.freq_dim;
  j["image_dim"] = nullptr;
  j["in_channels"] = c.in_dim;
  j["num_attention_heads"] = c.num_heads;
  j["num_layers"] = c.num_layers;
  j["out_channels"] = c.out_dim;
  j["patch_size"] = {c.patch[0], c.patch[1], c.patch[2]};
  j["pos_embed_seq_len"] = nullptr;
  j["qk_norm"] = "rms_norm_across_heads";
  j["rope_max_seq_len"] = 1024;
  j["text_dim"] = c.text_dim;
  return j.dump(2) + "\n";
}

DiTConfig dit_config_from_shapes(const std::map<std::string, Shape>& shapes) {
  auto need = [&](const std::string& name, int ndim) -> const Shape& {
    auto it = shapes.find(name);
    WAN_CHECK(it != shapes.end(), "cannot infer the DiT config: tensor '", name, "' is missing");
    WAN_CHECK(it->second.ndim == ndim, "cannot infer the DiT config: tensor '", name, "' has shape ",
              it->second.str(), ", expected ", ndim, " dimensions");
    return it->second;
  };
  // A dimension becomes an int only when it fits one: a truncated 2^32 + 256 would pass for 256.
  auto as_int = [](int64_t v, const std::string& what) {
    WAN_CHECK(v >= 0 && v < (int64_t{1} << 31), "cannot infer the DiT config: ", what, " ", v, " is out of range");
    return static_cast<int>(v);
  };
  DiTConfig c;
  const Shape& mod = need("head.modulation", 3);
  c.dim = as_int(mod[2], "dim (head.modulation " + mod.str() + ")");
  WAN_CHECK(c.dim % 128 == 0, "cannot infer the DiT config: dim ", c.dim, " (head.modulation ", mod.str(),
            ") is not a multiple of head_dim 128");
  c.num_heads = c.dim / 128;
  c.ffn_dim = as_int(need("blocks.0.ffn.0.weight", 2)[0], "ffn_dim (blocks.0.ffn.0.weight)");
  const Shape& pe = need("patch_embedding.weight", 5);
  c.in_dim = as_int(pe[1], "in_dim (patch_embedding.weight " + pe.str() + ")");
  for (int i = 0; i < 3; ++i) c.patch[i] = as_int(pe[2 + i], "patch size (patch_embedding.weight " + pe.str() + ")");
  int64_t pvol = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  const Shape& hh = need("head.head.weight", 2);
  WAN_CHECK(pvol > 0 && hh[0] % pvol == 0, "cannot infer the DiT config: head.head.weight ", hh.str(),
            " is not a multiple of the patch volume ", pvol);
  c.out_dim = as_int(hh[0] / pvol, "out_dim (head.head.weight " + hh.str() + ")");
  c.freq_dim = as_int(need("time_embedding.0.weight", 2)[1], "freq_dim (time_embedding.0.weight)");
  c.text_dim = as_int(need("text_embedding.0.weight", 2)[1], "text_dim (text_embedding.0.weight)");
  // Layers: the distinct N of "blocks.N.", which must be exactly 0..L-1.
  std::set<int> blocks;
  for (const auto& [name, shape] : shapes) {
    if (name.rfind("blocks.", 0) != 0) continue;
    size_t dot = name.find('.', 7);
    std::string idx = name.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
    if (idx.empty() || idx.size() > 6 || !std::all_of(idx.begin(), idx.end(), ::isdigit)) continue;
    blocks.insert(std::stoi(idx));
  }
  WAN_CHECK(!blocks.empty(), "cannot infer the DiT config: no blocks.N tensors");
  c.num_layers = static_cast<int>(blocks.size());
  WAN_CHECK(*blocks.rbegin() == c.num_layers - 1, "cannot infer the DiT config: block indices are not contiguous (",
            c.num_layers, " blocks, highest index ", *blocks.rbegin(), ")");
  const ModelTypeDims* m = model_type_for_in_dim(c.in_dim);
  WAN_CHECK(m != nullptr, "cannot infer the DiT config: patch_embedding in_dim ", c.in_dim,
            " is not 16 (t2v), 36 (i2v) or 48 (ti2v)");
  c.model_type = m->type;
  c.validate();
  return c;
}

int64_t dit_param_count(const DiTConfig& c) {
  const int64_t D = c.dim, F = c.ffn_dim, P = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  int64_t top = D * c.in_dim * P + D              // patch_embedding
                + D * c.text_dim + D + D * D + D  // text_embedding.0, .2
                + D * c.freq_dim + D + D * D + D  // time_embedding.0, .2
                + 6 * D * D + 6 * D               // time_projection.1
                + 2 * D                           // head.modulation
                + c.out_dim * P * D + c.out_dim * P;  // head.head
  int64_t block = 6 * D                // modulation
                  + 2 * 4 * (D * D + D)  // self_attn / cross_attn q, k, v, o
                  + 2 * 2 * D            // norm_q, norm_k of both attentions
                  + 2 * D                // norm3 (affine)
                  + F * D + F + D * F + D;  // ffn.0, ffn.2
  return top + c.num_layers * block;
}

// ---------------------------------------------------------------------------------------------
// T5 and VAE presets

T5Config t5_preset(const std::string& name) {
  T5Config c;  // defaults = umt5-xxl (spec §4.1)
  std::string n = lower(name);
  if (n == "umt5-xxl" || n == "umt5_xxl") return c;
  // Tiny: keeps the vocabulary (real tokenizer ids stay valid), the bucket scheme and the eps.
  if (n == "tiny") {
    c.dim = 64;
    c.dim_attn = 64;
    c.dim_ffn = 160;
    c.num_heads = 4;
    c.num_layers = 2;
    return c;
  }
  WAN_THROW("unknown T5 preset '", name, "' (valid: umt5-xxl, tiny)");
}

namespace {
const std::vector<float> kWan21Mean = {-0.7571f, -0.7089f, -0.9113f, 0.1075f,  -0.1745f, 0.9653f,
                                       -0.1517f, 1.5508f,  0.4134f,  -0.0715f, 0.5517f,  -0.3632f,
                                       -0.1922f, -0.9497f, 0.2503f,  -0.2921f};
const std::vector<float> kWan21Std = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                      3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};
const std::vector<float> kWan22Mean = {
    -0.2289f, -0.0052f, -0.1323f, -0.2339f, -0.2799f, 0.0174f,  0.1838f,  0.1557f,  -0.1382f, 0.0542f,
    0.2813f,  0.0891f,  0.1570f,  -0.0098f, 0.0375f,  -0.1825f, -0.2246f, -0.1207f, -0.0698f, 0.5109f,
    0.2665f,  -0.2108f, -0.2158f, 0.2502f,  -0.2055f, -0.0322f, 0.1109f,  0.1567f,  -0.0729f, 0.0899f,
    -0.2799f, -0.1230f, -0.0313f, -0.1649f, 0.0117f,  0.0723f,  -0.2839f, -0.2083f, -0.0520f, 0.3748f,
    0.0152f,  0.1957f,  0.1433f,  -0.2944f, 0.3573f,  -0.0548f, -0.1681f, -0.0667f};
const std::vector<float> kWan22Std = {
    0.4765f, 1.0364f, 0.4514f, 1.1677f, 0.5313f, 0.4990f, 0.4818f, 0.5013f, 0.8158f, 1.0344f,
    0.5894f, 1.0901f, 0.6885f, 0.6165f, 0.8454f, 0.4978f, 0.5759f, 0.3523f, 0.7135f, 0.6804f,
    0.5833f, 1.4146f, 0.8986f, 0.5659f, 0.7069f, 0.5338f, 0.4889f, 0.4917f, 0.4069f, 0.4999f,
    0.6866f, 0.4093f, 0.5709f, 0.6065f, 0.6415f, 0.4944f, 0.5726f, 1.2042f, 0.5458f, 1.6887f,
    0.3971f, 1.0600f, 0.3943f, 0.5537f, 0.5444f, 0.4089f, 0.7468f, 0.7744f};
}  // namespace

VaeConfig vae_preset(const std::string& name) {
  VaeConfig c;  // defaults = Wan 2.1 (spec §5.1)
  std::string n = lower(name);
  bool v22 = (n == "wan2.2" || n == "tiny2.2");
  if (n != "wan2.1" && n != "tiny2.1" && !v22)
    WAN_THROW("unknown VAE preset '", name, "' (valid: wan2.1, wan2.2, tiny2.1, tiny2.2)");
  if (v22) {
    c.version = 22;
    c.z_dim = 48;
    c.base_dim = 160;
    c.dec_dim = 256;
    c.patch = 2;
    c.latents_mean = kWan22Mean;
    c.latents_std = kWan22Std;
  } else {
    c.latents_mean = kWan21Mean;
    c.latents_std = kWan21Std;
  }
  // Tiny: the real structure (stages, residual counts, z_dim and normalisation tables), narrow widths.
  if (n == "tiny2.1") c.base_dim = c.dec_dim = 16;
  if (n == "tiny2.2") {
    c.base_dim = 16;
    c.dec_dim = 32;
  }
  return c;
}

int t5_relative_bucket(int64_t rel, int num_buckets, int max_distance) {
  const int half = num_buckets / 2;  // bidirectional: one half per direction
  const int max_exact = half / 2;
  const int base = rel > 0 ? half : 0;
  const int64_t n = rel < 0 ? -rel : rel;
  if (n < max_exact) return base + static_cast<int>(n);
  // float32 as torch: log(n / max_exact) / log(max_distance / max_exact) * (half - max_exact),
  // the Python-float divisor rounded to float32 first, truncation toward zero.
  const float ratio = static_cast<float>(n) / static_cast<float>(max_exact);
  const float denom = static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact));
  const float scaled = std::log(ratio) / denom * static_cast<float>(half - max_exact);
  const int64_t large = max_exact + static_cast<int64_t>(scaled);
  return base + static_cast<int>(std::min<int64_t>(large, half - 1));
}

// ---------------------------------------------------------------------------------------------
// Model presets

std::vector<std::string> model_preset_names() {
  return {"tiny", "tiny-t2v", "tiny-i2v", "tiny-ti2v", "t2v-A14B", "i2v-A14B", "ti2v-5B"};
}

ModelPreset model_preset(const std::string& config, int layers) {
  ModelPreset p;
  p.name = lower(config);
  const std::string& n = p.name;
  if (n == "tiny" || n == "tiny-t2v") {
    p.task = Task::T2V_A14B;
  } else if (n == "tiny-i2v") {
    p.task = Task::I2V_A14B;
  } else if (n == "tiny-ti2v") {
    p.task = Task::TI2V_5B;
  } else if (n == "t2v-a14b" || n == "i2v-a14b" || n == "ti2v-5b") {
    p.task = task_from_name(n);
  } else {
    std::string valid;
    for (const std::string& s : model_preset_names()) valid += (valid.empty() ? "" : ", ") + s;
    WAN_THROW("unknown --config '", config, "' (valid: ", valid, ")");
  }
  p.tiny = n.rfind("tiny", 0) == 0;
  const bool v22 = p.task == Task::TI2V_5B;
  if (p.tiny) {
    p.dit = dit_preset(n == "tiny-t2v" ? "tiny" : n);
    p.t5 = t5_preset("tiny");
    p.vae = vae_preset(v22 ? "tiny2.2" : "tiny2.1");
    // The DiT consumes the T5 output: keep the tiny components chainable.
    p.dit.text_dim = p.t5.dim;
  } else {
    p.dit = dit_preset(task_name(p.task));
    p.t5 = t5_preset("umt5-xxl");
    p.vae = vae_preset(v22 ? "wan2.2" : "wan2.1");
  }
  if (layers != 0) {
    WAN_CHECK(layers > 0 && layers <= 1000, "--layers ", layers, ": expected 1..1000");
    p.dit.num_layers = layers;
  }
  p.dit.validate();
  return p;
}

}  // namespace wan
