// Model components of a checkpoint for the pipeline (see models.h).
#include "pipeline/models.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/philox.h"
#include "testing/make_checkpoint.h"
#include "testing/model_params.h"
#include "testing/weight_init.h"
#include "text/clean.h"

namespace wan {

const char* const kDefaultNegativePrompt =
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，"
    "残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，"
    "背景人很多，倒着走";

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The JSON object in `path`, or nullopt when the file does not exist.
std::optional<json> read_json_if_exists(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream f(path);
  WAN_CHECK(f.good(), path.string(), ": cannot read");
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const std::exception& e) {
    WAN_THROW(path.string(), ": invalid JSON: ", e.what());
  }
  WAN_CHECK(j.is_object(), path.string(), ": not a JSON object");
  return j;
}

// The config.json inside a component folder (nullopt for a file component or no config).
std::optional<json> component_config(const CheckpointInfo& info, Role role) {
  const Component* c = info.find(role);
  if (!c) return std::nullopt;
  std::error_code ec;
  if (!fs::is_directory(c->path, ec)) return std::nullopt;
  return read_json_if_exists(fs::path(c->path) / "config.json");
}

template <class T>
T json_get(const json& j, const char* key, const std::string& file) {
  auto it = j.find(key);
  WAN_CHECK(it != j.end() && !it->is_null(), file, ": key \"", key, "\" is missing");
  try {
    return it->get<T>();
  } catch (const std::exception&) {
    WAN_THROW(file, ": key \"", key, "\" has the wrong type (", it->dump(), ")");
  }
}

std::optional<double> json_number(const json& j, const char* key, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  WAN_CHECK(it->is_number(), file, ": key \"", key, "\" is not a number (", it->dump(), ")");
  return it->get<double>();
}

Shape store_shape(const WeightStore& s, const std::string& name, const std::string& what) {
  WAN_CHECK(s.contains(name), what, ": tensor ", name, " not found");
  return s.shape(name);
}

}  // namespace

VaeConfig vae_config_for(const CheckpointInfo& info) {
  WAN_CHECK(info.has(Role::Vae), info.root, ": checkpoint has no VAE");
  VaeConfig c = vae_preset(info.vae_version == 22 ? "wan2.2" : "wan2.1");
  const std::string where = info.find(Role::Vae)->path;
  if (auto j = component_config(info, Role::Vae)) {
    const std::string file = (fs::path(where) / "config.json").string();
    c.base_dim = json_get<int>(*j, "base_dim", file);
    c.dec_dim = c.base_dim;
    if (j->contains("decoder_base_dim") && !(*j)["decoder_base_dim"].is_null())
      c.dec_dim = json_get<int>(*j, "decoder_base_dim", file);
    c.z_dim = json_get<int>(*j, "z_dim", file);
    c.dim_mult = json_get<std::vector<int>>(*j, "dim_mult", file);
    c.num_res_blocks = json_get<int>(*j, "num_res_blocks", file);
    c.temporal_downsample = json_get<std::vector<bool>>(*j, "temperal_downsample", file);
    c.patch = 1;
    if (j->contains("patch_size") && !(*j)["patch_size"].is_null()) c.patch = json_get<int>(*j, "patch_size", file);
    bool residual = j->contains("is_residual") && (*j)["is_residual"].is_boolean() && (*j)["is_residual"].get<bool>();
    WAN_CHECK(residual == (c.version == 22), file, ": is_residual ", residual ? "true" : "false", " does not fit the ",
              c.version == 22 ? "Wan 2.2" : "Wan 2.1", " VAE of a ", task_name(info.task), " model");
    c.latents_mean = json_get<std::vector<float>>(*j, "latents_mean", file);
    c.latents_std = json_get<std::vector<float>>(*j, "latents_std", file);
    WAN_CHECK(static_cast<int>(c.latents_mean.size()) == c.z_dim && static_cast<int>(c.latents_std.size()) == c.z_dim,
              file, ": latents_mean / latents_std need z_dim = ", c.z_dim, " entries");
    for (float s : c.latents_std) WAN_CHECK(s > 0.0f, file, ": latents_std has a non-positive entry");
  } else {
    // Official .pth: structure of the release, widths from the shapes.
    auto store = open_weights(info, Role::Vae);
    const std::string what = cat("VAE (", where, ")");
    c.base_dim = static_cast<int>(store_shape(*store, "encoder.conv1.weight", what)[0]);
    c.z_dim = static_cast<int>(store_shape(*store, "conv2.weight", what)[0]);
    c.dec_dim = static_cast<int>(store_shape(*store, "decoder.conv1.weight", what)[0]) / c.dim_mult.back();
    WAN_CHECK(static_cast<int>(c.latents_mean.size()) == c.z_dim, what, ": z_dim ", c.z_dim,
              " differs from the released VAE's ", c.latents_mean.size(), " (no latent mean/std table for it)");
  }
  WAN_WITH_CONTEXT(where, vae_validate(c));
  return c;
}

T5Config t5_config_for(const CheckpointInfo& info) {
  WAN_CHECK(info.has(Role::TextEncoder), info.root, ": checkpoint has no text encoder");
  const std::string where = info.find(Role::TextEncoder)->path;
  const std::string what = cat("text encoder (", where, ")");
  auto store = open_weights(info, Role::TextEncoder);
  T5Config c = t5_preset("umt5-xxl");
  Shape emb = store_shape(*store, "token_embedding.weight", what);
  WAN_CHECK(emb.ndim == 2, what, ": token_embedding.weight has shape ", emb.str());
  c.vocab = static_cast<int>(emb[0]);
  c.dim = static_cast<int>(emb[1]);
  c.dim_attn = static_cast<int>(store_shape(*store, "blocks.0.attn.q.weight", what)[0]);
  c.dim_ffn = static_cast<int>(store_shape(*store, "blocks.0.ffn.gate.0.weight", what)[0]);
  Shape pos = store_shape(*store, "blocks.0.pos_embedding.embedding.weight", what);
  WAN_CHECK(pos.ndim == 2, what, ": blocks.0.pos_embedding.embedding.weight has shape ", pos.str());
  c.num_buckets = static_cast<int>(pos[0]);
  c.num_heads = static_cast<int>(pos[1]);
  std::set<int> blocks;
  for (const std::string& n : store->names()) {
    if (n.rfind("blocks.", 0) != 0) continue;
    size_t dot = n.find('.', 7);
    if (dot != std::string::npos) blocks.insert(std::stoi(n.substr(7, dot - 7)));
  }
  c.num_layers = static_cast<int>(blocks.size());
  WAN_CHECK(c.num_layers > 0 && *blocks.rbegin() == c.num_layers - 1, what, ": blocks are not numbered 0..",
            c.num_layers - 1);
  if (auto j = component_config(info, Role::TextEncoder)) {
    const std::string file = (fs::path(where) / "config.json").string();
    if (auto d = json_number(*j, "relative_attention_max_distance", file)) c.max_distance = static_cast<int>(*d);
    if (auto e = json_number(*j, "layer_norm_epsilon", file)) c.eps = static_cast<float>(*e);
  }
  return c;
}

std::optional<double> diffusers_flow_shift(const CheckpointInfo& info) {
  if (info.layout != Layout::Diffusers) return std::nullopt;
  fs::path p = fs::path(info.root) / "scheduler" / "scheduler_config.json";
  auto j = read_json_if_exists(p);
  if (!j) return std::nullopt;
  auto s = json_number(*j, "flow_shift", p.string());
  if (s) WAN_CHECK(*s > 0.0, p.string(), ": flow_shift ", *s, " must be positive");
  return s;
}

std::optional<double> diffusers_boundary_ratio(const CheckpointInfo& info) {
  if (info.layout != Layout::Diffusers) return std::nullopt;
  fs::path p = fs::path(info.root) / "model_index.json";
  auto j = read_json_if_exists(p);
  if (!j) return std::nullopt;
  auto b = json_number(*j, "boundary_ratio", p.string());
  if (b) WAN_CHECK(*b > 0.0 && *b <= 1.0, p.string(), ": boundary_ratio ", *b, " is outside (0, 1]");
  return b;
}

int64_t dit_f32_bytes(const DiTConfig& c) { return dit_param_count(c) * 4; }

int64_t t5_f32_bytes(const T5Config& c) {
  const int64_t D = c.dim, A = c.dim_attn, F = c.dim_ffn;
  const int64_t block = 2 * D + 4 * A * D + static_cast<int64_t>(c.num_buckets) * c.num_heads + 3 * F * D;
  return (static_cast<int64_t>(c.vocab) * D + D + block * c.num_layers) * 4;
}

int64_t vae_f32_bytes(const VaeConfig& c) {
  int64_t n = 0;
  for (const auto& [name, shape] : vae_tensor_specs(c)) n += shape.numel();
  return n * 4;
}

DiTWeights load_dit(const CheckpointInfo& info, Role role) {
  std::unique_ptr<WeightStore> store;
  DiTWeights w;
  WAN_WITH_CONTEXT(cat("loading ", role_name(role)), {
    store = open_weights(info, role);
    w = load_dit_weights(info.dit, [&](const std::string& n) { return store->get_f32(n); });
  });
  return w;
}

VaeWeights load_vae(const CheckpointInfo& info, const VaeConfig& cfg) {
  std::unique_ptr<WeightStore> store;
  VaeWeights w;
  WAN_WITH_CONTEXT("loading the VAE", {
    store = open_weights(info, Role::Vae);
    w = load_vae_weights(cfg, [&](const std::string& n) { return store->get_f32(n); });
  });
  return w;
}

std::vector<int32_t> stand_in_token_ids(const std::string& prompt, int vocab) {
  WAN_CHECK(vocab > 3, "the stand-in tokenization needs a vocabulary of more than 3 ids (got ", vocab, ")");
  constexpr int kEos = 1, kFirst = 3, kMaxLength = 512;
  const std::string clean = text::clean_prompt(prompt);
  std::vector<int32_t> ids;
  for (unsigned char b : clean) {
    if (static_cast<int>(ids.size()) == kMaxLength - 1) break;
    ids.push_back(kFirst + static_cast<int32_t>(b) % (vocab - kFirst));
  }
  ids.push_back(kEos);
  return ids;
}

std::vector<int32_t> PromptTokenizer::ids(const std::string& prompt) const {
  if (!tokenizer) return stand_in_token_ids(prompt, vocab);
  text::Encoding enc = tokenizer->encode(prompt);
  WAN_ASSERT(enc.length >= 1, "tokenizer returned no tokens");
  return std::vector<int32_t>(enc.ids.begin(), enc.ids.begin() + enc.length);
}

PromptTokenizer load_prompt_tokenizer(const CheckpointInfo* info, int vocab, bool allow_stand_in) {
  PromptTokenizer t;
  t.vocab = vocab;
  if (info && info->has(Role::Tokenizer)) {
    WAN_WITH_CONTEXT("loading the tokenizer", t.tokenizer = text::Tokenizer::load(info->find(Role::Tokenizer)->path));
    WAN_CHECK(t.tokenizer->vocab_size() <= vocab, info->root, ": the tokenizer has ", t.tokenizer->vocab_size(),
              " ids but the text encoder's embedding only ", vocab, " rows");
    return t;
  }
  WAN_CHECK(allow_stand_in, info ? info->root : std::string("no checkpoint"), ": no tokenizer");
  return t;
}

TextEncoder load_text_encoder(const CheckpointInfo& info) {
  WAN_CHECK(info.has(Role::TextEncoder), info.root, ": checkpoint has no text encoder");
  WAN_CHECK(info.has(Role::Tokenizer), info.root, ": checkpoint has no tokenizer");
  TextEncoder te;
  te.cfg = t5_config_for(info);
  te.tokens = load_prompt_tokenizer(&info, te.cfg.vocab, /*allow_stand_in=*/false);
  std::unique_ptr<WeightStore> store;
  WAN_WITH_CONTEXT("loading the text encoder", {
    store = open_weights(info, Role::TextEncoder);
    te.weights = load_t5_weights(te.cfg, [&](const std::string& n) { return store->get_f32(n); });
  });
  return te;
}

Tensor encode_prompt(const TextEncoder& te, const std::string& prompt) {
  const std::vector<int32_t> ids = te.tokens.ids(prompt);
  return t5_encode(te.cfg, te.weights, ids.data(), static_cast<int64_t>(ids.size()));
}

// ---- random weights ----

uint64_t random_expert_seed(uint64_t seed, Task task, bool high_noise) { return gen::dit_seed(seed, task, high_noise); }

uint64_t random_weight_key(uint64_t seed, const std::string& official_name) {
  // cuda::random_weight_seed (dit_gpu_weights.cpp), reproduced for hosts without CUDA. Its FNV-1a offset
  // basis is 1469598103934665603, not FNV's 14695981039346656037: kept, since the GPU's draws use it.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : official_name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return gen::splitmix64(gen::splitmix64(seed) ^ h);
}
uint64_t random_t5_seed(uint64_t seed) { return gen::component_seed(seed, "t5"); }
uint64_t random_vae_seed(uint64_t seed) { return gen::component_seed(seed, "vae"); }

namespace {

// The GPU DiT's random-weight rule for one tensor (dit_gpu_weights.cpp build_weight_table): the scale
// and offset of the normal draw and whether the GPU stores it in bf16.
struct DitDraw {
  float scale = 0, offset = 0;
  bool bf16 = true;
};

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

DitDraw dit_draw_rule(const DiTConfig& c, const std::string& name) {
  auto linear = [](int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(3.0 * static_cast<double>(fan_in))); };
  const int64_t D = c.dim, P = static_cast<int64_t>(c.patch[0]) * c.patch[1] * c.patch[2];
  const float mod = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  constexpr float kNorm = 0.05f;
  if (name.rfind("patch_embedding.", 0) == 0) return {linear(c.in_dim * P), 0, true};
  if (name.rfind("text_embedding.0.", 0) == 0) return {linear(c.text_dim), 0, true};
  if (name.rfind("text_embedding.2.", 0) == 0) return {linear(D), 0, true};
  if (name.rfind("time_embedding.0.", 0) == 0) return {linear(c.freq_dim), 0, false};
  if (name.rfind("time_embedding.2.", 0) == 0 || name.rfind("time_projection.1.", 0) == 0) return {linear(D), 0, false};
  if (name == "head.modulation") return {mod, 0, false};
  if (name.rfind("head.head.", 0) == 0) return {linear(D), 0, false};
  if (name.rfind("blocks.", 0) == 0) {
    if (ends_with(name, ".modulation")) return {mod, 0, false};
    if (ends_with(name, ".norm3.weight")) return {kNorm, 1.0f, false};
    if (ends_with(name, ".norm3.bias")) return {kNorm, 0, false};
    if (ends_with(name, ".norm_q.weight") || ends_with(name, ".norm_k.weight")) return {kNorm, 1.0f, true};
    if (name.find(".ffn.2.") != std::string::npos) return {linear(c.ffn_dim), 0, true};
    if (name.find("_attn.") != std::string::npos || name.find(".ffn.0.") != std::string::npos)
      return {linear(D), 0, true};
  }
  WAN_THROW("random DiT weights: no rule for tensor ", name);
}

// One tensor as the GPU's draw_random_weights makes it (dit_gpu_weights.cpp), returned in f32: fp32
// tensors normal·scale + offset; bf16 ones bf16(normal·scale) or, with an offset, bf16(normal·scale +
// offset). Separate fp32 multiply and add (-ffp-contract=off), as the GPU's _rn intrinsics.
Tensor draw_like_gpu(uint64_t component, const std::string& name, const Shape& shape, const DitDraw& r) {
  Tensor t = Tensor::empty(DType::F32, shape);
  float* p = t.f32();
  const size_t n = static_cast<size_t>(t.numel());
  philox_normal_fill(random_weight_key(component, name), 0, p, n);
  for (size_t i = 0; i < n; ++i) {
    if (!r.bf16) {
      p[i] = p[i] * r.scale + r.offset;
    } else {
      float v = p[i] * r.scale;
      if (r.offset != 0.0f) v = v + r.offset;
      p[i] = bf16_to_f32(f32_to_bf16(v));
    }
  }
  return t;
}

Tensor draw_dit_tensor(const DiTConfig& c, uint64_t expert_seed, const std::string& name, const Shape& shape) {
  return draw_like_gpu(expert_seed, name, shape, dit_draw_rule(c, name));
}

// The GPU text encoder's rule (t5_gpu.h): Linear N(0, 1/(3·fan_in)), token and relative-position
// embeddings N(0, 1), norm weights 1 + N(0, 0.05²); bf16 except the norms and position tables.
DitDraw t5_draw_rule(const T5Config& c, const std::string& name) {
  auto linear = [](int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(3.0 * static_cast<double>(fan_in))); };
  if (name == "token_embedding.weight") return {1.0f, 0, true};
  if (name == "norm.weight" || ends_with(name, ".norm1.weight") || ends_with(name, ".norm2.weight"))
    return {0.05f, 1.0f, false};
  if (ends_with(name, ".pos_embedding.embedding.weight")) return {1.0f, 0, false};
  if (ends_with(name, ".attn.o.weight")) return {linear(c.dim_attn), 0, true};
  if (ends_with(name, ".ffn.fc2.weight")) return {linear(c.dim_ffn), 0, true};
  if (ends_with(name, ".attn.q.weight") || ends_with(name, ".attn.k.weight") || ends_with(name, ".attn.v.weight") ||
      ends_with(name, ".ffn.gate.0.weight") || ends_with(name, ".ffn.fc1.weight"))
    return {linear(c.dim), 0, true};
  WAN_THROW("random text encoder weights: no rule for tensor ", name);
}

}  // namespace

Tensor random_dit_tensor(const DiTConfig& c, uint64_t expert_seed, const std::string& name) {
  const std::map<std::string, Shape> shapes = dit_expected_shapes(c);
  auto it = shapes.find(name);
  WAN_CHECK(it != shapes.end(), "random DiT weights: no tensor named ", name);
  return draw_dit_tensor(c, expert_seed, name, it->second);
}

DiTWeights random_dit_weights(const DiTConfig& c, uint64_t expert_seed) {
  const std::map<std::string, Shape> shapes = dit_expected_shapes(c);
  DiTWeights w;
  WAN_WITH_CONTEXT("drawing random DiT weights", {
    w = load_dit_weights(c, [&](const std::string& name) {
      auto it = shapes.find(name);
      WAN_CHECK(it != shapes.end(), "no tensor named ", name);
      return draw_dit_tensor(c, expert_seed, name, it->second);
    });
  });
  return w;
}

namespace {
// Getter over gen parameter specs: each tensor drawn (f32) when asked for.
std::function<Tensor(const std::string&)> gen_getter(const std::vector<gen::ParamSpec>& specs, uint64_t seed,
                                                     const char* what) {
  auto index = std::make_shared<std::map<std::string, const gen::ParamSpec*>>();
  for (const gen::ParamSpec& p : specs) (*index)[p.name] = &p;
  return [index, seed, what](const std::string& name) {
    auto it = index->find(name);
    WAN_CHECK(it != index->end(), "random ", what, " weights: no tensor named ", name);
    Tensor t = Tensor::empty(DType::F32, it->second->shape);
    gen::fill_param(*it->second, seed, DType::F32, t.data());
    return t;
  };
}
}  // namespace

T5Weights random_t5_weights(const T5Config& c, uint64_t t5_seed) {
  std::map<std::string, Shape> shapes;
  for (const gen::ParamSpec& s : gen::t5_params(c)) shapes[s.name] = s.shape;
  T5Weights w;
  WAN_WITH_CONTEXT("drawing random text encoder weights", {
    w = load_t5_weights(c, [&](const std::string& name) {
      auto it = shapes.find(name);
      WAN_CHECK(it != shapes.end(), "no tensor named ", name);
      return draw_like_gpu(t5_seed, name, it->second, t5_draw_rule(c, name));
    });
  });
  return w;
}

VaeWeights random_vae_weights(const VaeConfig& c, uint64_t vae_seed) {
  const std::vector<gen::ParamSpec> specs = gen::vae_params(c);
  VaeWeights w;
  WAN_WITH_CONTEXT("drawing random VAE weights", w = load_vae_weights(c, gen_getter(specs, vae_seed, "VAE")));
  return w;
}

TextEncoder random_text_encoder(const T5Config& c, uint64_t t5_seed, PromptTokenizer tokens) {
  TextEncoder te;
  te.cfg = c;
  te.tokens = std::move(tokens);
  te.weights = random_t5_weights(c, t5_seed);
  return te;
}

#ifndef WAN_HAVE_CUDA
std::unique_ptr<GpuTextEncoder> make_gpu_text_encoder(const CheckpointInfo&, const T5Config&, bool, uint64_t,
                                                      PromptTokenizer, int device, cuda::DeviceLoader*, int) {
  WAN_THROW("--device cuda:", device, ": this build of wan has no CUDA support (configure with a CUDA toolkit)");
}
size_t check_gpu_text_encoder(const T5Config&, const std::string& device) {
  WAN_THROW("--device ", device, ": this build of wan has no CUDA support (configure with a CUDA toolkit)");
}
int64_t gpu_memory_in_use(int) { return 0; }
std::future<void> gpu_prewarm(int) { return {}; }
Tensor gpu_vae_decode_tracked(const VaeConfig&, const VaeWeights&, const Tensor&, int device, int64_t*) {
  WAN_THROW("device ", device, ": this build of wan has no CUDA support");
}
#endif

}  // namespace wan
