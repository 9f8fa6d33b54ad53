// Checkpoint layout detection and per-component weight stores (spec §3.1, §3.3, §3.4, §4.4-4.5, §5-6).
// detect_checkpoint() looks only at folder structure, JSON configs and safetensors headers (no
// tensor data is read); open_weights() maps every source tensor name to the internal (official)
// name once, up front, so a store either serves a tensor under its official name or lists the
// source name in unexpected().
// ComfyUI component files: detection in ckpt/components.cpp, their stores here (open_comfy_file).
// Invariants: every failure is a wan::Error with one line naming the path (and the tensor); a store
// never serves two source tensors under one internal name; fp8_scaled companions (scale_weight,
// scale_input, the scaled_fp8 marker) are consumed, never reported as unexpected.
#include "ckpt/layout.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ckpt/gguf_store.h"
#include "ckpt/names.h"
#include "core/json_limits.h"
#include "formats/pth.h"
#include "formats/safetensors.h"

namespace wan {

namespace fs = std::filesystem;
using nlohmann::json;

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Official: return "official";
    case Layout::Diffusers: return "diffusers";
    case Layout::ComfyUI: return "comfyui";
  }
  return "?";
}

const char* role_name(Role r) {
  switch (r) {
    case Role::DiT: return "dit";
    case Role::DiTHigh: return "dit_high_noise";
    case Role::DiTLow: return "dit_low_noise";
    case Role::TextEncoder: return "text_encoder";
    case Role::Vae: return "vae";
    case Role::Tokenizer: return "tokenizer";
  }
  return "?";
}

bool role_is_dit(Role r) { return r == Role::DiT || r == Role::DiTHigh || r == Role::DiTLow; }

const Component* CheckpointInfo::find(Role r) const {
  for (const Component& c : components)
    if (c.role == r) return &c;
  return nullptr;
}

namespace {

// File names of the official release (spec §3.1).
constexpr const char* kT5Pth = "models_t5_umt5-xxl-enc-bf16.pth";
constexpr const char* kVae21Pth = "Wan2.1_VAE.pth";
constexpr const char* kVae22Pth = "Wan2.2_VAE.pth";
constexpr const char* kTokenizerDir = "google/umt5-xxl";
constexpr const char* kComfyPrefix = "model.diffusion_model.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

json read_json_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  WAN_CHECK(f, p.string(), ": cannot read");
  std::stringstream ss;
  ss << f.rdbuf();
  json j = parse_json_limited(ss.str(), p.string());
  WAN_CHECK(j.is_object(), p.string(), ": not a JSON object");
  return j;
}

std::string json_class(const json& j) {
  auto it = j.find("_class_name");
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : "";
}

// Root-level DiT weights of an official folder: the index json, else the single unsharded file.
std::optional<fs::path> official_dit_file(const fs::path& dir) {
  for (const char* n : {"diffusion_pytorch_model.safetensors.index.json", "diffusion_pytorch_model.safetensors"})
    if (is_file(dir / n)) return dir / n;
  return std::nullopt;
}

// A folder that holds DiT safetensors (index or any *.safetensors).
bool has_safetensors(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string n = it->path().filename().string();
    if (ends_with(n, ".safetensors") || ends_with(n, ".safetensors.index.json")) return true;
  }
  return false;
}

Task task_for_model_type(const DiTConfig& c) {
  if (c.model_type == "i2v") return Task::I2V_A14B;
  if (c.model_type == "ti2v") return Task::TI2V_5B;
  return Task::T2V_A14B;
}

}  // namespace

std::string dit_config_diff(const DiTConfig& a, const DiTConfig& b) {
  std::string s;
  auto f = [&](const char* k, auto x, auto y) {
    if (x != y) s += cat(s.empty() ? "" : ", ", k, " ", x, " vs ", y);
  };
  f("dim", a.dim, b.dim);
  f("ffn_dim", a.ffn_dim, b.ffn_dim);
  f("num_heads", a.num_heads, b.num_heads);
  f("num_layers", a.num_layers, b.num_layers);
  f("in_dim", a.in_dim, b.in_dim);
  f("out_dim", a.out_dim, b.out_dim);
  f("freq_dim", a.freq_dim, b.freq_dim);
  f("text_dim", a.text_dim, b.text_dim);
  f("text_len", a.text_len, b.text_len);
  f("eps", a.eps, b.eps);
  f("model_type", a.model_type, b.model_type);
  return s;
}

namespace {

// ---------------------------------------------------------------------------------------------
// DiT config of one DiT location (folder or file), from config.json or from the tensor shapes.

// Official tensor shapes of a safetensors DiT, through the layout's name mapping.
std::map<std::string, Shape> dit_shapes(const SafetensorsSet& set, Layout layout, const std::string& prefix) {
  std::map<std::string, Shape> shapes;
  for (const std::string& n : set.names()) {
    std::string internal;
    if (layout == Layout::Diffusers) {
      internal = dit_diffusers_to_official(n);
    } else if (starts_with(n, prefix)) {
      internal = n.substr(prefix.size());
      if (dit_official_to_diffusers(internal).empty()) internal.clear();
    }
    if (!internal.empty()) shapes[internal] = set.info(n).shape;
  }
  return shapes;
}

DiTConfig dit_config_at(const fs::path& dir, Layout layout, bool* from_file) {
  fs::path cfg = dir / "config.json";
  if (is_file(cfg)) {
    *from_file = true;
    json j = read_json_file(cfg);
    try {
      return dit_config_from_json(j.dump());
    } catch (const Error& e) {
      throw e.with_context(cfg.string());
    }
  }
  *from_file = false;
  std::optional<fs::path> f = layout == Layout::Official ? official_dit_file(dir) : std::nullopt;
  SafetensorsSet set = SafetensorsSet::open(f ? f->string() : dir.string());
  try {
    return dit_config_from_shapes(dit_shapes(set, layout, ""));
  } catch (const Error& e) {
    throw e.with_context(dir.string() + " (no config.json)");
  }
}

// Adds the official text encoder, VAE and tokenizer found in dir.
void add_official_extras(CheckpointInfo& info, const fs::path& dir) {
  if (is_file(dir / kT5Pth)) info.components.push_back({Role::TextEncoder, (dir / kT5Pth).string()});
  bool v21 = is_file(dir / kVae21Pth), v22 = is_file(dir / kVae22Pth);
  if (v21 || v22) {
    // The VAE the task uses wins when a folder holds both (spec §1.2).
    bool use22 = v22 && (!v21 || info.task == Task::TI2V_5B);
    info.components.push_back({Role::Vae, (dir / (use22 ? kVae22Pth : kVae21Pth)).string()});
    info.vae_version = use22 ? 22 : 21;
  }
  if (is_dir(dir / kTokenizerDir)) info.components.push_back({Role::Tokenizer, (dir / kTokenizerDir).string()});
}

// Role of a lone expert from a folder or file name ("high_noise_model", "..._low_noise_...").
Role expert_role_from_name(const std::string& name, Task task) {
  if (task == Task::TI2V_5B) return Role::DiT;
  std::string n = lower(name);
  if (n.find("high") != std::string::npos) return Role::DiTHigh;
  if (n.find("low") != std::string::npos) return Role::DiTLow;
  return Role::DiT;
}

// ---------------------------------------------------------------------------------------------
// Layouts

CheckpointInfo detect_official_a14b(const fs::path& dir) {
  CheckpointInfo info;
  info.root = dir.string();
  info.layout = Layout::Official;
  bool f1 = true, f2 = true;
  DiTConfig high = dit_config_at(dir / "high_noise_model", Layout::Official, &f1);
  DiTConfig low = dit_config_at(dir / "low_noise_model", Layout::Official, &f2);
  WAN_CHECK(high == low, dir.string(), ": high_noise_model and low_noise_model configs differ (",
            dit_config_diff(high, low), ")");
  WAN_CHECK(high.model_type != "ti2v", dir.string(),
            ": two experts with in_dim 48 (ti2v); only the A14B models (t2v, i2v) have two experts");
  info.dit = high;
  info.dit_config_from_file = f1 && f2;
  info.task = task_for_model_type(high);
  info.components.push_back({Role::DiTHigh, (dir / "high_noise_model").string()});
  info.components.push_back({Role::DiTLow, (dir / "low_noise_model").string()});
  add_official_extras(info, dir);
  return info;
}

// A folder whose root holds one official DiT (TI2V-5B, or an A14B expert subfolder).
CheckpointInfo detect_official_single(const fs::path& dir) {
  CheckpointInfo info;
  info.root = dir.string();
  info.layout = Layout::Official;
  info.dit = dit_config_at(dir, Layout::Official, &info.dit_config_from_file);
  info.task = task_for_model_type(info.dit);
  std::optional<fs::path> f = official_dit_file(dir);
  // Only the release's folder names identify an expert (a parent folder called "slow_disk" does not).
  std::string dname = dir.filename().string();
  Role role = Role::DiT;
  if (info.task != Task::TI2V_5B && dname == "high_noise_model") role = Role::DiTHigh;
  if (info.task != Task::TI2V_5B && dname == "low_noise_model") role = Role::DiTLow;
  info.components.push_back({role, f ? f->string() : dir.string()});
  if (info.task != Task::TI2V_5B) {
    info.notes.push_back(cat("a single ", task_name(info.task), " expert (", role_name(role),
                             "); the full model has high_noise_model/ and low_noise_model/"));
    if (role == Role::DiT) info.task_certain = false;
  }
  add_official_extras(info, dir);
  return info;
}

// A diffusers transformer folder given directly (transformer/ or transformer_2/).
CheckpointInfo detect_diffusers_transformer(const fs::path& dir) {
  CheckpointInfo info;
  info.root = dir.string();
  info.layout = Layout::Diffusers;
  info.dit = dit_config_at(dir, Layout::Diffusers, &info.dit_config_from_file);
  info.task = task_for_model_type(info.dit);
  Role role = Role::DiT;
  if (info.task != Task::TI2V_5B) {
    std::string n = dir.filename().string();
    role = n == "transformer" ? Role::DiTHigh : n == "transformer_2" ? Role::DiTLow : Role::DiT;
    info.notes.push_back(cat("a single ", task_name(info.task), " expert (", role_name(role), ")"));
    if (role == Role::DiT) info.task_certain = false;
  }
  info.components.push_back({role, dir.string()});
  return info;
}

CheckpointInfo detect_diffusers(const fs::path& dir) {
  CheckpointInfo info;
  info.root = dir.string();
  info.layout = Layout::Diffusers;
  fs::path mi = dir / "model_index.json";
  json j = read_json_file(mi);
  std::string cls = json_class(j);
  WAN_CHECK(cls == "WanPipeline" || cls == "WanImageToVideoPipeline", mi.string(), ": pipeline class '", cls,
            "' is not supported (expected WanPipeline or WanImageToVideoPipeline)");
  WAN_CHECK(is_dir(dir / "transformer"), dir.string(), ": diffusers folder has no transformer/");
  bool two = is_dir(dir / "transformer_2");
  bool from1 = true, from2 = true;
  info.dit = dit_config_at(dir / "transformer", Layout::Diffusers, &from1);
  if (two) {
    DiTConfig low = dit_config_at(dir / "transformer_2", Layout::Diffusers, &from2);
    WAN_CHECK(info.dit == low, dir.string(), ": transformer and transformer_2 configs differ (",
              dit_config_diff(info.dit, low), ")");
  }
  info.dit_config_from_file = from1 && from2;
  auto flag = [&](const char* k) {
    auto it = j.find(k);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  bool has_boundary = j.contains("boundary_ratio") && j["boundary_ratio"].is_number();
  if (cls == "WanImageToVideoPipeline") {
    info.task = Task::I2V_A14B;
  } else if (flag("expand_timesteps") || info.dit.in_dim == 48) {
    info.task = Task::TI2V_5B;
  } else if (two || has_boundary) {
    info.task = Task::T2V_A14B;
  } else {
    WAN_THROW(dir.string(), ": WanPipeline with a single transformer, no boundary_ratio and no expand_timesteps ",
              "(a Wan 2.1 model?); Wan 2.2 T2V-A14B needs transformer/ and transformer_2/");
  }
  const char* want = info.task == Task::I2V_A14B ? "i2v" : info.task == Task::TI2V_5B ? "ti2v" : "t2v";
  WAN_CHECK(info.dit.model_type == want, dir.string(), ": ", cls, " implies ", task_name(info.task),
            " but transformer/ has in_channels ", info.dit.in_dim);
  if (info.task == Task::TI2V_5B) {
    WAN_CHECK(!two, dir.string(), ": TI2V-5B has one transformer but transformer_2/ exists");
    info.components.push_back({Role::DiT, (dir / "transformer").string()});
  } else {
    WAN_CHECK(two, dir.string(), ": ", task_name(info.task), " needs transformer_2/ (the low-noise expert)");
    info.components.push_back({Role::DiTHigh, (dir / "transformer").string()});
    info.components.push_back({Role::DiTLow, (dir / "transformer_2").string()});
  }
  if (is_dir(dir / "text_encoder")) info.components.push_back({Role::TextEncoder, (dir / "text_encoder").string()});
  if (is_dir(dir / "vae")) info.components.push_back({Role::Vae, (dir / "vae").string()});
  if (is_dir(dir / "tokenizer")) info.components.push_back({Role::Tokenizer, (dir / "tokenizer").string()});
  info.vae_version = info.task == Task::TI2V_5B ? 22 : 21;
  return info;
}

// fp8_scaled companions of a ComfyUI file: consumed by the store, never DiT tensors themselves.
bool is_scale_companion(const std::string& n) {
  return n == "scaled_fp8" || ends_with(n, ".scale_weight") || ends_with(n, ".scale_input");
}

void name_lone_dit(const fs::path& file, CheckpointInfo& info);

CheckpointInfo detect_comfyui(const fs::path& file) {
  CheckpointInfo info;
  info.root = file.string();
  info.layout = Layout::ComfyUI;
  info.dit_config_from_file = false;
  SafetensorsSet set = SafetensorsSet::open(file.string());
  std::vector<std::string> names = set.names();
  auto has = [&](const std::string& n) { return set.contains(n); };
  if (has(std::string(kComfyPrefix) + "head.modulation") || has(std::string(kComfyPrefix) + "patch_embedding.weight"))
    info.dit_prefix = kComfyPrefix;
  else if (!has("head.modulation") && !has("patch_embedding.weight"))
    WAN_THROW(file.string(), ": no Wan DiT tensors (expected patch_embedding.weight and head.modulation, optionally "
              "under '", kComfyPrefix, "'; ", names.size(), " tensors", names.empty() ? "" : ", first '",
              names.empty() ? "" : names[0], names.empty() ? "" : "'", ")");
  for (const std::string& n : names) {
    if (n.size() < info.dit_prefix.size() || !starts_with(n, info.dit_prefix)) continue;
    std::string s = n.substr(info.dit_prefix.size());
    if (s == "scaled_fp8" || ends_with(s, ".scale_weight")) info.fp8_scaled = true;
  }
  try {
    info.dit = dit_config_from_shapes(dit_shapes(set, Layout::ComfyUI, info.dit_prefix));
  } catch (const Error& e) {
    throw e.with_context(file.string());
  }
  name_lone_dit(file, info);
  return info;
}

// A GGUF DiT file (city96's Wan GGUFs, ComfyUI-GGUF, sd.cpp): the config from its tensors' shapes.
CheckpointInfo detect_gguf(const fs::path& file) {
  CheckpointInfo info;
  info.root = file.string();
  info.layout = Layout::ComfyUI;
  info.gguf = true;
  info.dit_config_from_file = false;
  try {
    info.dit = dit_config_from_shapes(gguf_shapes(file.string()));
  } catch (const Error& e) {
    throw e.with_context(file.string());
  }
  name_lone_dit(file, info);
  return info;
}

// A lone DiT file's task (from in_dim), checked against its file name, which also names the expert.
void name_lone_dit(const fs::path& file, CheckpointInfo& info) {
  info.task = task_for_model_type(info.dit);
  // The shapes fix the task; the file name ("wan2.2_t2v_high_noise_14B_fp8_scaled") confirms it and
  // names the expert. Without both, the task is reported as a guess.
  std::string fname = lower(file.filename().string());
  std::optional<Task> named;
  if (fname.find("ti2v") != std::string::npos) named = Task::TI2V_5B;
  else if (fname.find("i2v") != std::string::npos) named = Task::I2V_A14B;
  else if (fname.find("t2v") != std::string::npos) named = Task::T2V_A14B;
  Role role = expert_role_from_name(fname, info.task);
  if (!named) {
    info.task_certain = false;
    info.notes.push_back(cat("task inferred from in_dim ", info.dit.in_dim, " (the file name does not name it)"));
  } else if (*named != info.task) {
    info.task_certain = false;
    info.notes.push_back(cat("the file name says ", task_name(*named), " but in_dim ", info.dit.in_dim, " means ",
                             task_name(info.task), "; using the shapes"));
  }
  if (info.task != Task::TI2V_5B && role == Role::DiT) {
    info.task_certain = false;
    info.notes.push_back("the file name does not say whether this is the high- or the low-noise expert");
  }
  if (info.task == Task::TI2V_5B) info.vae_version = 22;
  info.components.push_back({role, file.string()});
}

}  // namespace

CheckpointInfo detect_checkpoint(const std::string& path_in) {
  WAN_CHECK(!path_in.empty(), "empty checkpoint path");
  // "dir/high_noise_model/" must name the same folder as "dir/high_noise_model" (folder names matter).
  fs::path path = fs::path(path_in).lexically_normal();
  if (path.filename().empty() && path.has_parent_path() && path != path.root_path()) path = path.parent_path();
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  WAN_CHECK(!ec && fs::exists(st), path_in, ": no such file or folder");
  if (fs::is_regular_file(st)) {
    std::string n = lower(path.filename().string());
    if (ends_with(n, ".safetensors")) return detect_comfyui(path);
    if (ends_with(n, ".gguf") || is_gguf_file(path.string())) return detect_gguf(path);
    if (ends_with(n, ".safetensors.index.json") || n == "config.json" || n == "model_index.json")
      return detect_checkpoint(path.parent_path().empty() ? "." : path.parent_path().string());
    WAN_THROW(path_in, ": not a checkpoint (expected a folder, or a .safetensors DiT file)");
  }
  WAN_CHECK(fs::is_directory(st), path_in, ": neither a file nor a folder");
  fs::directory_iterator it(path, ec);
  WAN_CHECK(!ec, path_in, ": cannot list folder: ", ec.message());
  WAN_CHECK(it != fs::directory_iterator(), path_in, ": folder is empty");

  if (is_file(path / "model_index.json")) return detect_diffusers(path);
  bool high = is_dir(path / "high_noise_model"), low = is_dir(path / "low_noise_model");
  if (high && low) return detect_official_a14b(path);
  WAN_CHECK(high == low, path_in, ": has ", high ? "high_noise_model/" : "low_noise_model/", " but no ",
            high ? "low_noise_model/" : "high_noise_model/");
  if (is_file(path / "config.json")) {
    json j = read_json_file(path / "config.json");
    std::string cls = json_class(j);
    if (cls == "WanTransformer3DModel") return detect_diffusers_transformer(path);
    if (cls == "WanModel" || (cls.empty() && j.contains("dim"))) {
      WAN_CHECK(has_safetensors(path), path_in, ": config.json (WanModel) but no diffusion_pytorch_model*.safetensors");
      return detect_official_single(path);
    }
    WAN_THROW(path_in, "/config.json: _class_name '", cls, "' is not a Wan DiT (WanModel or WanTransformer3DModel)");
  }
  if (official_dit_file(path)) return detect_official_single(path);
  WAN_THROW(path_in, ": no checkpoint layout matched (expected model_index.json (diffusers), high_noise_model/ + "
            "low_noise_model/ (official A14B), config.json + diffusion_pytorch_model*.safetensors (official DiT), "
            "or a single .safetensors file (ComfyUI))");
}

// ---------------------------------------------------------------------------------------------
// Weight stores

namespace {

// A store over one safetensors set or one .pth file with a precomputed internal -> source map.
class MappedStore final : public WeightStore {
 public:
  struct Entry {
    std::string src;
    std::string scale;  // fp8_scaled: source name of the per-tensor scale_weight, else ""
  };

  MappedStore(std::optional<SafetensorsSet> st, std::shared_ptr<PthFile> pth, std::string label)
      : st_(std::move(st)), pth_(std::move(pth)), label_(std::move(label)) {}

  std::vector<std::string> source_names() const {
    std::vector<std::string> v;
    if (st_) return st_->names();
    for (const PthTensorInfo& t : pth_->tensors()) v.push_back(t.name);
    std::sort(v.begin(), v.end());
    return v;
  }
  // Tied or duplicated sources (e.g. HF "encoder.embed_tokens.weight" and "shared.weight") keep the
  // first; a duplicate with a different shape is reported as unexpected rather than served.
  void add(const std::string& internal, const std::string& src, const std::string& scale = "") {
    auto [it, inserted] = entries_.emplace(internal, Entry{src, scale});
    if (!inserted && !(src_shape(it->second.src) == src_shape(src))) unexpected_.push_back(src);
  }
  void add_unexpected(const std::string& src) { unexpected_.push_back(src); }
  void finish() { std::sort(unexpected_.begin(), unexpected_.end()); }

  std::vector<std::string> names() const override {
    std::vector<std::string> v;
    v.reserve(entries_.size());
    for (const auto& [k, e] : entries_) v.push_back(k);
    return v;
  }
  bool contains(const std::string& name) const override { return entries_.count(name) != 0; }
  Shape shape(const std::string& name) const override { return src_shape(entry(name).src); }
  DType dtype(const std::string& name) const override {
    const std::string& s = entry(name).src;
    return st_ ? st_->info(s).dtype : pth_->find(s)->dtype;
  }
  Tensor get(const std::string& name) const override { return src_get(entry(name).src); }
  Tensor get_f32(const std::string& name) const override {
    const Entry& e = entry(name);
    Tensor t = src_get(e.src);
    if (e.scale.empty()) return t.to_f32();
    Tensor s = src_get(e.scale).to_f32();
    WAN_CHECK(s.numel() == 1, label_, ": tensor '", e.scale, "' has shape ", s.shape().str(),
              "; only a per-tensor scale (one element) is supported");
    // A private copy even for f32 storage: the source may be a read-only mapping.
    Tensor f = t.dtype() == DType::F32 ? t.clone() : t.to_f32();
    const float scale = s.f32()[0];
    float* p = f.f32();
    for (int64_t i = 0, n = f.numel(); i < n; ++i) p[i] = p[i] * scale;
    return f;
  }
  std::vector<std::string> unexpected() const override { return unexpected_; }
  std::optional<RawSpan> raw_span(const std::string& name) const override {
    const Entry& e = entry(name);
    RawSpan r;
    if (st_) {
      const TensorInfo& ti = st_->info(e.src);
      for (const auto& f : st_->files()) {
        if (f->find(e.src) != &ti) continue;
        r.path = f->path();
        r.offset = f->data_start() + ti.begin;
        break;
      }
      WAN_ASSERT(!r.path.empty(), "tensor '", e.src, "' in no shard of ", label_);
      r.length = ti.nbytes();
      r.dtype = ti.dtype;
      r.shape = ti.shape;
    } else {
      // Same contiguity test as PthFile::get(); a strided tensor has no single byte range.
      const PthTensorInfo* ti = pth_->find(e.src);
      const auto* rec = pth_->record(ti->storage_key);
      WAN_ASSERT(rec != nullptr, "tensor '", e.src, "' has no record in ", label_);
      int64_t expect = 1;
      for (int i = ti->shape.ndim - 1; i >= 0; --i) {
        if (ti->shape[i] != 1 && ti->stride[i] != expect) return std::nullopt;
        expect *= ti->shape[i];
      }
      const size_t es = dtype_size(ti->dtype);
      r.path = pth_->path();
      r.offset = rec->first + static_cast<uint64_t>(ti->storage_offset) * es;
      r.length = static_cast<uint64_t>(ti->shape.numel()) * es;
      r.dtype = ti->dtype;
      r.shape = ti->shape;
    }
    if (!e.scale.empty()) {
      Tensor s = src_get(e.scale).to_f32();
      WAN_CHECK(s.numel() == 1, label_, ": tensor '", e.scale, "' has shape ", s.shape().str(),
                "; only a per-tensor scale (one element) is supported");
      r.scaled = true;
      r.scale = s.f32()[0];
    }
    return r;
  }

 private:
  const Entry& entry(const std::string& name) const {
    auto it = entries_.find(name);
    WAN_CHECK(it != entries_.end(), label_, ": tensor '", name, "' not found");
    return it->second;
  }
  Shape src_shape(const std::string& s) const { return st_ ? st_->info(s).shape : pth_->find(s)->shape; }
  Tensor src_get(const std::string& s) const {
    try {
      return st_ ? st_->get(s) : pth_->get(s);
    } catch (const Error& e) {
      throw e.with_context(cat(label_, ": tensor '", s, "'"));
    }
  }

  std::optional<SafetensorsSet> st_;
  std::shared_ptr<PthFile> pth_;
  std::string label_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> unexpected_;
};

std::unique_ptr<WeightStore> open_dit(const CheckpointInfo& info, const Component& c) {
  if (is_gguf_file(c.path)) return open_gguf_dit(c.path);
  std::string label = cat(role_name(c.role), " (", c.path, ")");
  SafetensorsSet set = SafetensorsSet::open(c.path);
  // ComfyUI component files: each expert file has its own prefix (one may come from a full checkpoint).
  std::string prefix = info.layout == Layout::ComfyUI ? info.dit_prefix : std::string();
  if (info.layout == Layout::ComfyUI && !set.contains(prefix + "head.modulation"))
    prefix = set.contains(std::string(kComfyPrefix) + "head.modulation") ? kComfyPrefix : "";
  auto store = std::make_unique<MappedStore>(std::move(set), nullptr, label);
  std::vector<std::string> src = store->source_names();
  std::set<std::string> all(src.begin(), src.end());
  for (const std::string& n : src) {
    if (info.layout == Layout::Diffusers) {
      std::string o = dit_diffusers_to_official(n);
      if (o.empty()) store->add_unexpected(n);
      else store->add(o, n);
      continue;
    }
    if (!starts_with(n, prefix)) {
      store->add_unexpected(n);
      continue;
    }
    std::string o = n.substr(prefix.size());
    if (info.fp8_scaled && is_scale_companion(o)) continue;
    if (dit_official_to_diffusers(o).empty()) {
      store->add_unexpected(n);
      continue;
    }
    std::string scale;
    if (info.fp8_scaled && ends_with(o, ".weight")) {
      std::string sw = prefix + o.substr(0, o.size() - 7) + ".scale_weight";
      if (all.count(sw)) scale = sw;
    }
    store->add(o, n, scale);
  }
  store->finish();
  return store;
}

// A ComfyUI text-encoder or VAE file (CheckpointInfo::FileNaming): prefix stripped, official or HF /
// diffusers names, fp8_scaled weights paired with their "<layer>.scale_weight". The companions, the
// scaled_fp8 marker and ComfyUI's embedded tokenizer ("spiece_model") are consumed, never unexpected.
std::unique_ptr<WeightStore> open_comfy_file(const Component& c, const CheckpointInfo::FileNaming& f, bool t5,
                                             int vae_version) {
  std::string label = cat(role_name(c.role), " (", c.path, ")");
  auto store = std::make_unique<MappedStore>(SafetensorsSet::open(c.path), nullptr, label);
  std::vector<std::string> src = store->source_names();
  std::set<std::string> all(src.begin(), src.end());
  for (const std::string& n : src) {
    if (!starts_with(n, f.prefix)) {
      store->add_unexpected(n);
      continue;
    }
    const std::string s = n.substr(f.prefix.size());
    if (is_scale_companion(s) || (t5 && s == "spiece_model")) continue;
    std::string o;
    if (f.official) o = (t5 ? t5_official_to_hf(s) : vae_official_to_diffusers(s, vae_version)).empty() ? "" : s;
    else o = t5 ? t5_hf_to_official(s) : vae_diffusers_to_official(s, vae_version);
    if (o.empty()) {
      store->add_unexpected(n);
      continue;
    }
    std::string scale;
    if (f.fp8_scaled && ends_with(s, ".weight")) {
      std::string sw = f.prefix + s.substr(0, s.size() - 7) + ".scale_weight";
      if (all.count(sw)) scale = sw;
    }
    store->add(o, n, scale);
  }
  store->finish();
  return store;
}

std::unique_ptr<WeightStore> open_mapped(const Component& c, bool t5, int vae_version) {
  std::string label = cat(role_name(c.role), " (", c.path, ")");
  bool pth = ends_with(lower(c.path), ".pth") || ends_with(lower(c.path), ".pt");
  std::unique_ptr<MappedStore> store;
  if (pth) store = std::make_unique<MappedStore>(std::nullopt, PthFile::open(c.path), label);
  else store = std::make_unique<MappedStore>(SafetensorsSet::open(c.path), nullptr, label);
  for (const std::string& n : store->source_names()) {
    // .pth files carry official names; safetensors folders carry HF / diffusers names.
    std::string o;
    if (pth) o = (t5 ? t5_official_to_hf(n) : vae_official_to_diffusers(n, vae_version)).empty() ? "" : n;
    else o = t5 ? t5_hf_to_official(n) : vae_diffusers_to_official(n, vae_version);
    if (o.empty()) store->add_unexpected(n);
    else store->add(o, n);
  }
  store->finish();
  return store;
}

}  // namespace

std::unique_ptr<WeightStore> open_weights(const CheckpointInfo& info, Role role) {
  const Component* c = info.find(role);
  WAN_CHECK(c != nullptr, info.root, ": checkpoint has no ", role_name(role), " component");
  switch (role) {
    case Role::DiT:
    case Role::DiTHigh:
    case Role::DiTLow: return open_dit(info, *c);
    case Role::TextEncoder:
      if (info.layout == Layout::ComfyUI) return open_comfy_file(*c, info.t5_naming, true, 0);
      return open_mapped(*c, true, 0);
    case Role::Vae:
      if (info.layout == Layout::ComfyUI) return open_comfy_file(*c, info.vae_naming, false, info.vae_version);
      return open_mapped(*c, false, info.vae_version);
    case Role::Tokenizer: break;
  }
  WAN_THROW(c->path, ": the tokenizer has no tensors");
}

}  // namespace wan
