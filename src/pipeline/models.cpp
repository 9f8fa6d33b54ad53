// Model components of a checkpoint for the pipeline (see models.h).
#include "pipeline/models.h"

#include <algorithm>
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
#include "core/json_limits.h"
#include "core/log.h"
#include "core/printable.h"
#include "core/philox.h"
#include "models/dit/weights.h"
#include "models/umt5/weights.h"
#include "models/vae/weights.h"
#include "models/weight_spec.h"
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
  const json j = parse_json_limited(ss.str(), path.string());
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

DiTWeights load_dit(const CheckpointInfo& info, Role role, std::shared_ptr<const LoraSet> lora) {
  std::unique_ptr<WeightStore> store;
  DiTWeights w;
  WAN_WITH_CONTEXT(cat("loading ", role_name(role)), {
    store = open_weights(info, role);
    if (lora && !lora->empty()) store = with_lora(std::move(store), std::move(lora));
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

std::vector<int32_t> stand_in_token_ids(const std::string& prompt, int vocab, int max_tokens, int* dropped) {
  WAN_CHECK(vocab > 3, "the stand-in tokenization needs a vocabulary of more than 3 ids (got ", vocab, ")");
  WAN_ASSERT(max_tokens >= 1, "max_tokens ", max_tokens);
  constexpr int kEos = 1, kFirst = 3;
  const std::string clean = text::clean_prompt(prompt);
  std::vector<int32_t> ids;
  const size_t keep = static_cast<size_t>(max_tokens - 1);
  for (unsigned char b : clean) {
    if (ids.size() == keep) break;
    ids.push_back(kFirst + static_cast<int32_t>(b) % (vocab - kFirst));
  }
  if (dropped) *dropped = static_cast<int>(clean.size() - ids.size());
  ids.push_back(kEos);
  return ids;
}

std::vector<int32_t> PromptTokenizer::ids(const std::string& prompt) const {
  std::vector<int32_t> out;
  int dropped = 0;
  if (!tokenizer) {
    out = stand_in_token_ids(prompt, vocab, max_tokens, &dropped);
  } else {
    const text::Encoding enc = tokenizer->encode(prompt);
    WAN_ASSERT(enc.length >= 1, "tokenizer returned no tokens");
    out.assign(enc.ids.begin(), enc.ids.begin() + enc.length);
    dropped = enc.dropped;
    if (static_cast<int>(out.size()) > max_tokens) {  // the DiT takes fewer than the tokenizer's 512
      dropped += static_cast<int>(out.size()) - max_tokens;
      out.resize(static_cast<size_t>(max_tokens));
      out.back() = tokenizer->eos_id();
    }
  }
  if (dropped > 0)
    LOG_WARN("the prompt \"", printable(prompt, 40), "\" has ", static_cast<int>(out.size()) - 1 + dropped,
             " tokens but the model takes ", max_tokens - 1, " (and EOS): its last ", dropped, " tokens are dropped");
  return out;
}

PromptTokenizer load_prompt_tokenizer(const CheckpointInfo* info, int vocab, bool allow_stand_in) {
  PromptTokenizer t;
  t.vocab = vocab;
  if (info) t.max_tokens = std::clamp(info->dit.text_len, 1, 512);
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

uint64_t random_expert_seed(uint64_t seed, Task task, bool high_noise) { return dit_seed(seed, task, high_noise); }
uint64_t random_t5_seed(uint64_t seed) { return component_seed(seed, "t5"); }
uint64_t random_vae_seed(uint64_t seed) { return component_seed(seed, "vae"); }

Tensor random_dit_tensor(const DiTConfig& c, uint64_t expert_seed, const std::string& name) {
  return draw_random_weight(find_weight(dit_weight_table(c), name, "random DiT"), expert_seed);
}

namespace {
// Getter over a weight table: each tensor drawn (f32) when asked for, by the engine's rule (`engine`)
// or make-checkpoint's (fill_init).
std::function<Tensor(const std::string&)> table_getter(WeightTable table, uint64_t seed, bool engine) {
  auto index = std::make_shared<std::map<std::string, WeightSpec>>();
  for (WeightSpec& w : table) (*index)[w.name] = std::move(w);
  return [index, seed, engine](const std::string& name) {
    auto it = index->find(name);
    WAN_CHECK(it != index->end(), "no tensor named ", name);
    if (engine) return draw_random_weight(it->second, seed);
    Tensor t = Tensor::empty(DType::F32, it->second.shape);
    fill_init(it->second, seed, DType::F32, t.data());
    return t;
  };
}
}  // namespace

DiTWeights random_dit_weights(const DiTConfig& c, uint64_t expert_seed, std::shared_ptr<const LoraSet> lora) {
  DiTWeights w;
  auto draw = table_getter(dit_weight_table(c), expert_seed, true);
  auto get = [&](const std::string& name) {
    const LoraTarget* t = lora ? lora->find(name) : nullptr;
    if (!t || !t->active()) return draw(name);
    Tensor x = draw(name).to_f32().clone();  // the drawn value (bf16 rows rounded), merged in f32
    apply_lora_cpu(*t, x);
    return x;
  };
  WAN_WITH_CONTEXT("drawing random DiT weights", w = load_dit_weights(c, get));
  return w;
}

T5Weights random_t5_weights(const T5Config& c, uint64_t t5_seed) {
  T5Weights w;
  WAN_WITH_CONTEXT("drawing random text encoder weights",
                   w = load_t5_weights(c, table_getter(umt5_weight_table(c), t5_seed, true)));
  return w;
}

VaeWeights random_vae_weights(const VaeConfig& c, uint64_t vae_seed) {
  VaeWeights w;
  WAN_WITH_CONTEXT("drawing random VAE weights",
                   w = load_vae_weights(c, table_getter(vae_weight_table(c), vae_seed, false)));
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
size_t gpu_text_encoder_bytes(const T5Config&) {
  WAN_THROW("--device cuda: this build of wan has no CUDA support (configure with a CUDA toolkit)");
}
int64_t gpu_memory_in_use(int) { return 0; }
size_t gpu_free_bytes(int device) {
  WAN_THROW("--device cuda:", device, ": this build of wan has no CUDA support (configure with a CUDA toolkit)");
}
std::future<void> gpu_prewarm(int) { return {}; }
Tensor gpu_vae_decode_tracked(const VaeConfig&, const VaeWeights&, const Tensor&, int device, int64_t*) {
  WAN_THROW("device ", device, ": this build of wan has no CUDA support");
}
std::unique_ptr<GpuVaeDecoder> plan_gpu_vae_decoder(const VaeConfig&, const VaeWeights&, int64_t, int64_t, int device,
                                                    const VaeTiling&) {
  WAN_THROW("device ", device, ": this build of wan has no CUDA support");
}
#endif

}  // namespace wan
