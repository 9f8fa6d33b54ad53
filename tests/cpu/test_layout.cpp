// Tests of checkpoint layout detection and weight stores (src/ckpt/layout.cpp): each layout of
// spec §3 is built in a temp folder with tiny random tensors (values depend only on (seed, official
// name, index), so one expert has the same values in every layout), then detection, task, config,
// store names and values, fp8_scaled dequantisation, missing / unexpected reporting, the error
// cases and the `wan inspect` command are checked.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "ckpt/names.h"
#include "formats/pth.h"
#include "formats/safetensors.h"
#include "test_util.h"

namespace wan {
namespace {

namespace fs = std::filesystem;

// ---- fixtures -------------------------------------------------------------------------------

using wan::test::TempDir;

void write_text(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Non-zero, bf16-representable (so f32 and bf16 files hold the same values), in [-1, 1].
float value(uint64_t seed, const std::string& official_name, int64_t i) {
  uint64_t h = 1469598103934665603ull ^ mix(seed);
  for (unsigned char c : official_name) h = (h ^ c) * 1099511628211ull;
  uint64_t r = mix(h + static_cast<uint64_t>(i));
  float v = static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
  if (v == 0.0f) v = 0.25f;
  return bf16_to_f32(f32_to_bf16(v));
}

DiTConfig test_cfg(const std::string& model_type) {
  DiTConfig c = dit_preset(model_type == "t2v" ? "tiny" : "tiny-" + model_type);
  c.dim = 128;  // head_dim stays 128
  c.num_heads = 1;
  c.ffn_dim = 256;
  c.text_dim = 32;  // small files; text_dim is read from the config / shapes
  c.validate();
  return c;
}

enum class Style { Official, Diffusers, Comfy, ComfyPrefixed };

// fp8_scaled: the per-tensor scale of a quantised weight (not a power of two, so the product rounds).
float fp8_scale(const std::string& official_name) { return 0.0037f * (1.0f + static_cast<float>(official_name.size() % 5)); }
bool quantised(const std::string& official_name, const Shape& s) {
  return official_name.rfind("blocks.", 0) == 0 && s.ndim == 2;
}

struct DitWriteOptions {
  Style style = Style::Official;
  DType dtype = DType::F32;
  bool fp8 = false;                      // ComfyUI fp8_scaled
  std::set<std::string> drop;            // official names left out
  std::vector<std::string> extra;        // source names added ([4] tensors)
  size_t shard_bytes = 0;                // folder styles: > 0 -> sharded with an index
};

std::string source_name(Style st, const std::string& o) {
  switch (st) {
    case Style::Official:
    case Style::Comfy: return o;
    case Style::ComfyPrefixed: return "model.diffusion_model." + o;
    case Style::Diffusers: return dit_official_to_diffusers(o);
  }
  return o;
}

// Writes one DiT expert: into `target` (a folder for Official/Diffusers, a file for Comfy styles).
void write_dit(const fs::path& target, const DiTConfig& cfg, uint64_t seed, const DitWriteOptions& o) {
  std::vector<TensorSpec> specs;
  std::map<std::string, std::function<void(void*)>> fills;
  const std::string pre = o.style == Style::ComfyPrefixed ? "model.diffusion_model." : "";
  for (const auto& [name, shape] : dit_expected_shapes(cfg)) {
    if (o.drop.count(name)) continue;
    std::string src = source_name(o.style, name);
    if (o.fp8 && quantised(name, shape)) {
      specs.push_back({src, DType::F8E4M3, shape});
      float sc = fp8_scale(name);
      fills[src] = [=](void* dst) {
        auto* q = static_cast<uint8_t*>(dst);
        for (int64_t i = 0; i < shape.numel(); ++i) q[i] = f32_to_f8e4m3(value(seed, name, i) / sc);
      };
      std::string layer = src.substr(0, src.size() - 7);  // strip ".weight"
      specs.push_back({layer + ".scale_weight", DType::F32, Shape{}});
      fills[layer + ".scale_weight"] = [=](void* dst) { *static_cast<float*>(dst) = sc; };
      continue;
    }
    specs.push_back({src, o.dtype, shape});
    DType dt = o.dtype;
    fills[src] = [=](void* dst) {
      std::vector<float> v(static_cast<size_t>(shape.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = value(seed, name, static_cast<int64_t>(i));
      convert_from_f32(dt, v.data(), dst, v.size());
    };
  }
  if (o.fp8) {
    specs.push_back({pre + "scaled_fp8", DType::F8E4M3, Shape{0}});
    fills[pre + "scaled_fp8"] = [](void*) {};
    std::string in = pre + "blocks.0.self_attn.q.scale_input";
    specs.push_back({in, DType::F32, Shape{}});
    fills[in] = [](void* dst) { *static_cast<float*>(dst) = 1.0f; };
  }
  for (const std::string& e : o.extra) {
    specs.push_back({e, DType::F32, Shape{4}});
    fills[e] = [](void* dst) {
      for (int i = 0; i < 4; ++i) static_cast<float*>(dst)[i] = 0.5f + i;
    };
  }
  TensorFill fill = [&](const TensorSpec& s, void* dst) { fills.at(s.name)(dst); };
  if (o.style == Style::Comfy || o.style == Style::ComfyPrefixed) {
    write_safetensors(target.string(), specs, fill);
    return;
  }
  fs::create_directories(target);
  if (o.shard_bytes) write_safetensors_sharded(target.string(), "diffusion_pytorch_model", specs, fill, o.shard_bytes);
  else write_safetensors((target / "diffusion_pytorch_model.safetensors").string(), specs, fill);
  write_text(target / "config.json", o.style == Style::Diffusers ? dit_config_to_diffusers_json(cfg)
                                                                 : dit_config_to_official_json(cfg));
}

// Small T5 / VAE component tensors: official name -> shape, and their source names per style.
const std::vector<std::pair<std::string, Shape>> kT5 = {
    {"token_embedding.weight", Shape{64, 8}},
    {"blocks.0.norm1.weight", Shape{8}},
    {"blocks.0.attn.q.weight", Shape{8, 8}},
    {"blocks.0.pos_embedding.embedding.weight", Shape{32, 2}},
    {"blocks.0.ffn.gate.0.weight", Shape{16, 8}},
    {"norm.weight", Shape{8}},
};
const std::vector<std::pair<std::string, Shape>> kVae = {
    {"conv1.weight", Shape{4, 4, 1, 1, 1}},
    {"conv2.bias", Shape{2}},
    {"encoder.conv1.weight", Shape{4, 3, 3, 3, 3}},
    {"decoder.head.2.bias", Shape{3}},
};
constexpr uint64_t kT5Seed = 70, kVaeSeed = 80;

void write_component(const fs::path& path, const std::vector<std::pair<std::string, Shape>>& tensors, uint64_t seed,
                     bool pth, const std::function<std::string(const std::string&)>& to_src,
                     const std::vector<std::string>& extra) {
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> official;
  for (const auto& [n, s] : tensors) {
    std::string src = to_src(n);
    ASSERT_FALSE(src.empty()) << n;
    specs.push_back({src, DType::BF16, s});
    official[src] = n;
  }
  for (const auto& e : extra) {
    specs.push_back({e, DType::BF16, Shape{2}});
    official[e] = e;
  }
  TensorFill fill = [&](const TensorSpec& s, void* dst) {
    std::vector<float> v(static_cast<size_t>(s.shape.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = value(seed, official.at(s.name), static_cast<int64_t>(i));
    convert_from_f32(DType::BF16, v.data(), dst, v.size());
  };
  fs::create_directories(path.parent_path());
  if (pth) write_pth(path.string(), specs, fill);
  else write_safetensors(path.string(), specs, fill);
}

std::string same(const std::string& n) { return n; }

// Official A14B folder (spec §3.1).
void build_official_a14b(const fs::path& d, const DiTConfig& cfg, bool with_config = true) {
  DitWriteOptions o;
  o.shard_bytes = 1000000;  // several shards + index, like the release
  write_dit(d / "high_noise_model", cfg, 1, o);
  write_dit(d / "low_noise_model", cfg, 2, o);
  if (!with_config) {
    fs::remove(d / "high_noise_model" / "config.json");
    fs::remove(d / "low_noise_model" / "config.json");
  }
  write_component(d / "models_t5_umt5-xxl-enc-bf16.pth", kT5, kT5Seed, true, same, {"bogus.weight"});
  write_component(d / "Wan2.1_VAE.pth", kVae, kVaeSeed, true, same, {});
  write_text(d / "google" / "umt5-xxl" / "tokenizer_config.json", "{}");
}

void build_diffusers(const fs::path& d, const DiTConfig& cfg, const std::string& model_index,
                     const DitWriteOptions& low_opts = {}) {
  write_text(d / "model_index.json", model_index);
  DitWriteOptions o;
  o.style = Style::Diffusers;
  o.shard_bytes = 1500000;
  write_dit(d / "transformer", cfg, 1, o);
  if (cfg.model_type != "ti2v") {
    DitWriteOptions l = low_opts;
    l.style = Style::Diffusers;
    write_dit(d / "transformer_2", cfg, 2, l);
  }
  write_component(d / "text_encoder" / "model.safetensors", kT5, kT5Seed, false, t5_official_to_hf,
                  {"encoder.embed_tokens.weight_bogus"});
  int v = cfg.model_type == "ti2v" ? 22 : 21;
  write_component(d / "vae" / "diffusion_pytorch_model.safetensors", kVae, kVaeSeed, false,
                  [v](const std::string& n) { return vae_official_to_diffusers(n, v); }, {});
  write_text(d / "tokenizer" / "tokenizer_config.json", "{}");
}

const char* kT2VIndex = R"({"_class_name": "WanPipeline", "_diffusers_version": "0.35.0", "boundary_ratio": 0.875,
  "expand_timesteps": false, "scheduler": ["diffusers", "UniPCMultistepScheduler"],
  "text_encoder": ["transformers", "UMT5EncoderModel"], "tokenizer": ["transformers", "T5TokenizerFast"],
  "transformer": ["diffusers", "WanTransformer3DModel"], "transformer_2": ["diffusers", "WanTransformer3DModel"],
  "vae": ["diffusers", "AutoencoderKLWan"]})";
const char* kI2VIndex = R"({"_class_name": "WanImageToVideoPipeline", "boundary_ratio": 0.9,
  "image_encoder": [null, null], "image_processor": [null, null]})";
const char* kTI2VIndex = R"({"_class_name": "WanPipeline", "boundary_ratio": null, "expand_timesteps": true,
  "transformer_2": [null, null]})";

// ---- checks ---------------------------------------------------------------------------------

// Every expected tensor is served with the expected shape and the values of (seed, name).
void expect_dit_store(const WeightStore& s, const DiTConfig& cfg, uint64_t seed, bool fp8 = false,
                      const std::set<std::string>& dropped = {}) {
  auto want = dit_expected_shapes(cfg);
  std::vector<std::string> want_names;
  for (const auto& [n, sh] : want)
    if (!dropped.count(n)) want_names.push_back(n);
  EXPECT_EQ(s.names(), want_names);
  for (const std::string& n : want_names) {
    ASSERT_TRUE(s.contains(n)) << n;
    const Shape& sh = want.at(n);
    EXPECT_EQ(s.shape(n), sh) << n;
    Tensor t = s.get_f32(n);
    ASSERT_EQ(t.dtype(), DType::F32);
    ASSERT_EQ(t.shape(), sh) << n;
    bool q = fp8 && quantised(n, sh);
    if (q) {
      EXPECT_EQ(s.dtype(n), DType::F8E4M3) << n;
    }
    const float* p = t.f32();
    int bad = 0;
    for (int64_t i = 0; i < sh.numel() && bad < 3; ++i) {
      float v = value(seed, n, i);
      float e = q ? f8e4m3_to_f32(f32_to_f8e4m3(v / fp8_scale(n))) * fp8_scale(n) : v;
      if (f32_bits(p[i]) != f32_bits(e)) {
        ++bad;
        ADD_FAILURE() << n << "[" << i << "] = " << p[i] << ", expected " << e;
      }
    }
    // get() serves the stored bytes.
    Tensor raw = s.get(n);
    EXPECT_EQ(raw.dtype(), s.dtype(n)) << n;
    EXPECT_EQ(raw.shape(), sh) << n;
  }
  for (const std::string& n : dropped) EXPECT_FALSE(s.contains(n)) << n;
}

void expect_component_store(const WeightStore& s, const std::vector<std::pair<std::string, Shape>>& tensors,
                            uint64_t seed) {
  for (const auto& [n, sh] : tensors) {
    ASSERT_TRUE(s.contains(n)) << n;
    EXPECT_EQ(s.shape(n), sh) << n;
    EXPECT_EQ(s.dtype(n), DType::BF16) << n;
    Tensor t = s.get_f32(n);
    for (int64_t i = 0; i < sh.numel(); ++i) ASSERT_EQ(t.f32()[i], value(seed, n, i)) << n << "[" << i << "]";
  }
  EXPECT_EQ(s.names().size(), tensors.size());
}

std::vector<Role> roles(const CheckpointInfo& info) {
  std::vector<Role> r;
  for (const auto& c : info.components) r.push_back(c.role);
  return r;
}

void expect_error(const std::string& path, const std::string& fragment) {
  try {
    detect_checkpoint(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(fragment), std::string::npos) << "message: " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "multi-line: " << m;
  }
}

// ---- tests ----------------------------------------------------------------------------------

TEST(Layout, ExpectedShapesMatchParamCount) {
  for (const char* p : {"t2v-A14B", "i2v-A14B", "ti2v-5B", "tiny"}) {
    DiTConfig c = dit_preset(p);
    auto s = dit_expected_shapes(c);
    EXPECT_EQ(s.size(), 15u + 27u * c.num_layers) << p;
    int64_t n = 0;
    for (const auto& [k, v] : s) {
      n += v.numel();
      EXPECT_FALSE(dit_official_to_diffusers(k).empty()) << k;
    }
    EXPECT_EQ(n, dit_param_count(c)) << p;
    EXPECT_EQ(dit_config_from_shapes(s), c) << p;
  }
  auto s5 = dit_expected_shapes(dit_preset("ti2v-5B"));
  EXPECT_EQ(s5.at("patch_embedding.weight"), (Shape{3072, 48, 1, 2, 2}));
  EXPECT_EQ(s5.at("time_projection.1.weight"), (Shape{18432, 3072}));
  EXPECT_EQ(s5.at("head.head.weight"), (Shape{192, 3072}));
  EXPECT_EQ(s5.at("head.head.bias"), (Shape{192}));
}

TEST(Layout, OfficialA14B) {
  for (const char* mt : {"t2v", "i2v"}) {
    TempDir t;
    DiTConfig cfg = test_cfg(mt);
    build_official_a14b(t.p, cfg);
    CheckpointInfo info = detect_checkpoint(t.str());
    EXPECT_EQ(info.layout, Layout::Official);
    EXPECT_EQ(info.task, std::string(mt) == "t2v" ? Task::T2V_A14B : Task::I2V_A14B);
    EXPECT_TRUE(info.task_certain);
    EXPECT_TRUE(info.dit_config_from_file);
    EXPECT_EQ(info.dit, cfg);
    EXPECT_EQ(info.vae_version, 21);
    EXPECT_EQ(roles(info), (std::vector<Role>{Role::DiTHigh, Role::DiTLow, Role::TextEncoder, Role::Vae,
                                              Role::Tokenizer}));
    EXPECT_EQ(info.find(Role::DiTHigh)->path, (t.p / "high_noise_model").string());
    EXPECT_EQ(info.find(Role::Vae)->path, (t.p / "Wan2.1_VAE.pth").string());
    EXPECT_EQ(info.find(Role::Tokenizer)->path, (t.p / "google/umt5-xxl").string());
    EXPECT_EQ(info.find(Role::DiT), nullptr);
    auto high = open_weights(info, Role::DiTHigh);
    auto low = open_weights(info, Role::DiTLow);
    expect_dit_store(*high, cfg, 1);
    expect_dit_store(*low, cfg, 2);
    EXPECT_TRUE(high->unexpected().empty());
    auto t5 = open_weights(info, Role::TextEncoder);
    expect_component_store(*t5, kT5, kT5Seed);
    EXPECT_EQ(t5->unexpected(), std::vector<std::string>{"bogus.weight"});
    auto vae = open_weights(info, Role::Vae);
    expect_component_store(*vae, kVae, kVaeSeed);
    EXPECT_TRUE(vae->unexpected().empty());
    EXPECT_THROW(open_weights(info, Role::Tokenizer), Error);
    EXPECT_THROW(open_weights(info, Role::DiT), Error);
    EXPECT_THROW(high->get("blocks.9.modulation"), Error);

    // The path of one expert folder works on its own.
    CheckpointInfo one = detect_checkpoint((t.p / "low_noise_model").string() + "/");
    EXPECT_EQ(one.layout, Layout::Official);
    EXPECT_EQ(roles(one), std::vector<Role>{Role::DiTLow});
    EXPECT_EQ(one.dit, cfg);
    expect_dit_store(*open_weights(one, Role::DiTLow), cfg, 2);
    // So does the index file.
    CheckpointInfo idx =
        detect_checkpoint((t.p / "high_noise_model" / "diffusion_pytorch_model.safetensors.index.json").string());
    EXPECT_EQ(roles(idx), std::vector<Role>{Role::DiTHigh});
  }
}

TEST(Layout, OfficialWithoutConfigInfersFromShapes) {
  TempDir t;
  DiTConfig cfg = test_cfg("i2v");
  cfg.num_layers = 3;
  build_official_a14b(t.p, cfg, false);
  CheckpointInfo info = detect_checkpoint(t.str());
  EXPECT_FALSE(info.dit_config_from_file);
  EXPECT_EQ(info.dit, cfg);
  EXPECT_EQ(info.task, Task::I2V_A14B);
}

TEST(Layout, OfficialExpertsMustAgree) {
  TempDir t;
  DiTConfig cfg = test_cfg("t2v");
  build_official_a14b(t.p, cfg);
  DiTConfig other = cfg;
  other.num_layers = 3;
  write_text(t.p / "low_noise_model" / "config.json", dit_config_to_official_json(other));
  expect_error(t.str(), "configs differ (num_layers 2 vs 3)");
  fs::remove_all(t.p / "low_noise_model");
  expect_error(t.str(), "has high_noise_model/ but no low_noise_model/");
}

TEST(Layout, Official5B) {
  TempDir t;
  DiTConfig cfg = test_cfg("ti2v");
  write_dit(t.p, cfg, 5, {});
  write_component(t.p / "models_t5_umt5-xxl-enc-bf16.pth", kT5, kT5Seed, true, same, {});
  write_component(t.p / "Wan2.2_VAE.pth", kVae, kVaeSeed, true, same, {});
  write_text(t.p / "google" / "umt5-xxl" / "spiece.model", "x");
  CheckpointInfo info = detect_checkpoint(t.str());
  EXPECT_EQ(info.layout, Layout::Official);
  EXPECT_EQ(info.task, Task::TI2V_5B);
  EXPECT_TRUE(info.task_certain);
  EXPECT_EQ(info.dit, cfg);
  EXPECT_EQ(info.vae_version, 22);
  EXPECT_EQ(roles(info), (std::vector<Role>{Role::DiT, Role::TextEncoder, Role::Vae, Role::Tokenizer}));
  EXPECT_EQ(info.find(Role::Vae)->path, (t.p / "Wan2.2_VAE.pth").string());
  expect_dit_store(*open_weights(info, Role::DiT), cfg, 5);
  expect_component_store(*open_weights(info, Role::Vae), kVae, kVaeSeed);
}

TEST(Layout, Diffusers) {
  TempDir t;
  DiTConfig cfg = test_cfg("t2v");
  DitWriteOptions low;
  low.drop = {"blocks.1.ffn.2.bias"};
  low.extra = {"blocks.0.attn2.add_k_proj.weight", "rope.freqs"};
  build_diffusers(t.p, cfg, kT2VIndex, low);
  CheckpointInfo info = detect_checkpoint(t.str());
  EXPECT_EQ(info.layout, Layout::Diffusers);
  EXPECT_EQ(info.task, Task::T2V_A14B);
  EXPECT_TRUE(info.task_certain);
  EXPECT_EQ(info.dit, cfg);
  EXPECT_EQ(roles(info), (std::vector<Role>{Role::DiTHigh, Role::DiTLow, Role::TextEncoder, Role::Vae,
                                            Role::Tokenizer}));
  // Same values as the official layout's experts (seeds 1 and 2), under official names.
  auto high = open_weights(info, Role::DiTHigh);
  expect_dit_store(*high, cfg, 1);
  EXPECT_TRUE(high->unexpected().empty());
  auto lowst = open_weights(info, Role::DiTLow);
  expect_dit_store(*lowst, cfg, 2, false, low.drop);
  EXPECT_EQ(lowst->unexpected(), (std::vector<std::string>{"blocks.0.attn2.add_k_proj.weight", "rope.freqs"}));
  // HF text encoder names (the tied embed_tokens alias is absent here; an unknown name is reported).
  auto t5 = open_weights(info, Role::TextEncoder);
  expect_component_store(*t5, kT5, kT5Seed);
  EXPECT_EQ(t5->unexpected(), std::vector<std::string>{"encoder.embed_tokens.weight_bogus"});
  expect_component_store(*open_weights(info, Role::Vae), kVae, kVaeSeed);

  // A transformer folder on its own.
  CheckpointInfo tr = detect_checkpoint((t.p / "transformer_2").string());
  EXPECT_EQ(tr.layout, Layout::Diffusers);
  EXPECT_EQ(roles(tr), std::vector<Role>{Role::DiTLow});
  EXPECT_EQ(tr.dit, cfg);
  expect_dit_store(*open_weights(tr, Role::DiTLow), cfg, 2, false, low.drop);
}

TEST(Layout, DiffusersI2VAndTI2V) {
  {
    TempDir t;
    DiTConfig cfg = test_cfg("i2v");
    build_diffusers(t.p, cfg, kI2VIndex);
    CheckpointInfo info = detect_checkpoint(t.str());
    EXPECT_EQ(info.task, Task::I2V_A14B);
    EXPECT_EQ(info.dit, cfg);
    EXPECT_EQ(info.vae_version, 21);
    // WanImageToVideoPipeline with a t2v transformer is inconsistent.
    write_text(t.p / "transformer" / "config.json", dit_config_to_diffusers_json(test_cfg("t2v")));
    write_text(t.p / "transformer_2" / "config.json", dit_config_to_diffusers_json(test_cfg("t2v")));
    expect_error(t.str(), "in_channels 16");
  }
  {
    TempDir t;
    DiTConfig cfg = test_cfg("ti2v");
    build_diffusers(t.p, cfg, kTI2VIndex);
    CheckpointInfo info = detect_checkpoint(t.str());
    EXPECT_EQ(info.task, Task::TI2V_5B);
    EXPECT_EQ(info.vae_version, 22);
    EXPECT_EQ(roles(info), (std::vector<Role>{Role::DiT, Role::TextEncoder, Role::Vae, Role::Tokenizer}));
    expect_dit_store(*open_weights(info, Role::DiT), cfg, 1);
    expect_component_store(*open_weights(info, Role::Vae), kVae, kVaeSeed);
  }
}

TEST(Layout, ComfyUIBf16WithAndWithoutPrefix) {
  TempDir t;
  DiTConfig cfg = test_cfg("t2v");
  DitWriteOptions o;
  o.style = Style::ComfyPrefixed;
  o.dtype = DType::BF16;
  fs::path f1 = t.p / "wan2.2_t2v_high_noise_14B_fp16.safetensors";
  write_dit(f1, cfg, 1, o);
  CheckpointInfo a = detect_checkpoint(f1.string());
  EXPECT_EQ(a.layout, Layout::ComfyUI);
  EXPECT_EQ(a.task, Task::T2V_A14B);
  EXPECT_TRUE(a.task_certain);
  EXPECT_EQ(a.dit_prefix, "model.diffusion_model.");
  EXPECT_FALSE(a.fp8_scaled);
  EXPECT_FALSE(a.dit_config_from_file);
  EXPECT_EQ(a.dit, cfg);
  EXPECT_EQ(roles(a), std::vector<Role>{Role::DiTHigh});
  auto s = open_weights(a, Role::DiTHigh);
  expect_dit_store(*s, cfg, 1);  // same values as the official and diffusers high-noise expert
  EXPECT_EQ(s->dtype("head.modulation"), DType::BF16);
  EXPECT_TRUE(s->unexpected().empty());

  o.style = Style::Comfy;
  o.extra = {"vae.decoder.conv1.weight"};
  fs::path f2 = t.p / "my_model.safetensors";
  DiTConfig cfg5 = test_cfg("ti2v");
  write_dit(f2, cfg5, 9, o);
  CheckpointInfo b = detect_checkpoint(f2.string());
  EXPECT_EQ(b.dit_prefix, "");
  EXPECT_EQ(b.task, Task::TI2V_5B);
  EXPECT_FALSE(b.task_certain);  // the name does not say ti2v
  EXPECT_FALSE(b.notes.empty());
  EXPECT_EQ(b.vae_version, 22);
  EXPECT_EQ(roles(b), std::vector<Role>{Role::DiT});
  auto sb = open_weights(b, Role::DiT);
  expect_dit_store(*sb, cfg5, 9);
  EXPECT_EQ(sb->unexpected(), std::vector<std::string>{"vae.decoder.conv1.weight"});

  // A name that contradicts the shapes: the shapes win, the task is marked uncertain.
  fs::path f3 = t.p / "wan2.2_i2v_low_noise_14B_fp16.safetensors";
  o.extra.clear();
  write_dit(f3, cfg, 1, o);
  CheckpointInfo c = detect_checkpoint(f3.string());
  EXPECT_EQ(c.task, Task::T2V_A14B);
  EXPECT_FALSE(c.task_certain);
  EXPECT_EQ(roles(c), std::vector<Role>{Role::DiTLow});
}

TEST(Layout, ComfyUIFp8Scaled) {
  TempDir t;
  DiTConfig cfg = test_cfg("i2v");
  DitWriteOptions o;
  o.style = Style::ComfyPrefixed;
  o.dtype = DType::BF16;
  o.fp8 = true;
  o.extra = {"model.diffusion_model.blocks.0.unknown.weight"};
  fs::path f = t.p / "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors";
  write_dit(f, cfg, 3, o);
  CheckpointInfo info = detect_checkpoint(f.string());
  EXPECT_EQ(info.layout, Layout::ComfyUI);
  EXPECT_TRUE(info.fp8_scaled);
  EXPECT_EQ(info.task, Task::I2V_A14B);
  EXPECT_TRUE(info.task_certain);
  EXPECT_EQ(info.dit, cfg);
  EXPECT_EQ(roles(info), std::vector<Role>{Role::DiTLow});
  auto s = open_weights(info, Role::DiTLow);
  // get_f32 of a quantised weight = fp8 -> f32, times scale_weight, bit for bit.
  expect_dit_store(*s, cfg, 3, true);
  EXPECT_EQ(s->dtype("blocks.1.ffn.0.weight"), DType::F8E4M3);
  EXPECT_EQ(s->dtype("blocks.1.ffn.0.bias"), DType::BF16);
  Tensor raw = s->get("blocks.0.cross_attn.k.weight");
  Tensor deq = s->get_f32("blocks.0.cross_attn.k.weight");
  const float sc = fp8_scale("blocks.0.cross_attn.k.weight");
  int nonzero = 0;
  for (int64_t i = 0; i < raw.numel(); ++i) {
    float e = f8e4m3_to_f32(static_cast<const uint8_t*>(raw.data())[i]) * sc;
    ASSERT_EQ(f32_bits(deq.f32()[i]), f32_bits(e)) << i;
    nonzero += e != 0.0f;
  }
  EXPECT_GT(nonzero, raw.numel() / 2);
  // Companions are consumed silently; only the unknown tensor is reported.
  EXPECT_EQ(s->unexpected(), std::vector<std::string>{"model.diffusion_model.blocks.0.unknown.weight"});
  for (const auto& n : s->names()) EXPECT_EQ(n.find("scale"), std::string::npos) << n;
}

TEST(Layout, Errors) {
  TempDir t;
  expect_error((t.p / "nope").string(), "no such file or folder");
  fs::create_directories(t.p / "empty");
  expect_error((t.p / "empty").string(), "folder is empty");
  write_text(t.p / "garbage" / "model_index.json", "{not json");
  expect_error((t.p / "garbage").string(), "invalid JSON");
  write_text(t.p / "garbage2" / "config.json", "[1, 2");
  expect_error((t.p / "garbage2").string(), "invalid JSON");
  write_text(t.p / "other" / "readme.txt", "hello");
  expect_error((t.p / "other").string(), "no checkpoint layout matched");
  write_text(t.p / "unet" / "config.json", R"({"_class_name": "UNet2DConditionModel"})");
  expect_error((t.p / "unet").string(), "is not a Wan DiT");
  write_text(t.p / "wan21" / "model_index.json", R"({"_class_name": "WanVACEPipeline"})");
  expect_error((t.p / "wan21").string(), "WanVACEPipeline' is not supported");
  // A safetensors file without DiT tensors.
  Tensor x = Tensor::f32(Shape{3});
  x.f32()[0] = 1;
  write_safetensors((t.p / "vae.safetensors").string(), {{"decoder.conv1.weight", x}});
  expect_error((t.p / "vae.safetensors").string(), "no Wan DiT tensors");
  // A DiT file whose shapes give no valid config (in_dim 20).
  Tensor pe = Tensor::f32(Shape{128, 20, 1, 2, 2});
  Tensor mod = Tensor::f32(Shape{1, 2, 128});
  write_safetensors((t.p / "odd.safetensors").string(), {{"patch_embedding.weight", pe}, {"head.modulation", mod}});
  expect_error((t.p / "odd.safetensors").string(), "odd.safetensors");
  write_text(t.p / "x.txt", "x");
  expect_error((t.p / "x.txt").string(), "not a checkpoint");
  // A truncated safetensors file is reported by the reader, with the file name.
  write_text(t.p / "trunc.safetensors", std::string("\x10\0\0\0\0\0\0\0{", 9));
  expect_error((t.p / "trunc.safetensors").string(), "trunc.safetensors");
}

// ---- the `wan inspect` command ----------------------------------------------------------------

struct RunResult {
  int code;
  std::string out, err;
};

RunResult run_wan(const std::string& args, const fs::path& tmp) {
  fs::path o = tmp / "stdout.txt", e = tmp / "stderr.txt";
  std::string cmd = cat("'", WAN_BINARY, "' ", args, " >'", o.string(), "' 2>'", e.string(), "'");
  int st = std::system(cmd.c_str());
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(o), slurp(e)};
}

TEST(Layout, InspectCommand) {
  ASSERT_TRUE(fs::exists(WAN_BINARY)) << "the wan binary was not built: " << WAN_BINARY;
  TempDir t;
  TempDir out;
  DiTConfig cfg = test_cfg("t2v");
  build_official_a14b(t.p, cfg);
  // This fixture's text encoder and VAE hold a few tensors each (enough for the layout), so they are
  // reported incomplete and inspect exits 2 after the report; the DiT experts are complete.
  // (tests/cpu/test_inputs_cli.cpp: a complete make-checkpoint model gives "status: ok" and 0.)
  RunResult r = run_wan(cat("inspect '", t.str(), "'"), out.p);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.out.find("layout:  official"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("task:    t2v-A14B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dit_high_noise"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("status: INCOMPLETE"), std::string::npos) << r.out;

  r = run_wan(cat("inspect --json - '", t.str(), "'"), out.p);
  ASSERT_EQ(r.code, 2) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layout"], "official");
  EXPECT_EQ(j["task"], "t2v-A14B");
  EXPECT_EQ(j["complete"], false);
  for (int k : {0, 1}) {
    EXPECT_EQ(j["components"][k]["missing"], nlohmann::json::array()) << k;
    EXPECT_EQ(j["components"][k]["unexpected"], nlohmann::json::array()) << k;
  }
  EXPECT_EQ(j["dit_config"]["dim"], 128);
  EXPECT_EQ(j["dit_param_count"], dit_param_count(cfg));
  ASSERT_EQ(j["components"].size(), 5u);
  EXPECT_EQ(j["components"][0]["role"], "dit_high_noise");
  EXPECT_EQ(j["components"][0]["tensors"], dit_expected_shapes(cfg).size());
  EXPECT_EQ(j["components"][0]["parameters"], dit_param_count(cfg));
  EXPECT_EQ(j["components"][0]["dtypes"]["f32"], dit_expected_shapes(cfg).size());
  EXPECT_EQ(j["components"][2]["ignored"], nlohmann::json::array({"bogus.weight"}));
  // --json FILE writes the same document to FILE (and prints nothing); a PATH-less call names the usage.
  const std::string first = r.out;
  r = run_wan(cat("inspect --json '", (out.p / "report.json").string(), "' '", t.str(), "'"), out.p);
  ASSERT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  std::ifstream report(out.p / "report.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(report), {}), first);
  r = run_wan(cat("inspect --json '", t.str(), "'"), out.p);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--json FILE"), std::string::npos) << r.err;

  // Missing and unexpected DiT tensors are listed, and the exit code is 2 (after the report).
  TempDir d;
  DitWriteOptions low;
  low.drop = {"blocks.1.ffn.2.bias"};
  low.extra = {"blocks.0.attn2.add_k_proj.weight"};
  build_diffusers(d.p, cfg, kT2VIndex, low);
  r = run_wan(cat("inspect --json - '", d.str(), "'"), out.p);
  ASSERT_EQ(r.code, 2) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["complete"], false);
  EXPECT_EQ(j["components"][1]["missing"], nlohmann::json::array({"blocks.1.ffn.2.bias"}));
  EXPECT_EQ(j["components"][1]["ignored"], nlohmann::json::array({"blocks.0.attn2.add_k_proj.weight"}));
  r = run_wan(cat("inspect '", d.str(), "'"), out.p);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("blocks.1.ffn.2.bias"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("status: INCOMPLETE"), std::string::npos) << r.out;

  // A bad path: exit code 2 and exactly one line "error: ..." on stderr.
  r = run_wan(cat("inspect '", (t.p / "missing").string(), "'"), out.p);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("no such file or folder"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  // An unreadable component (corrupt VAE .pth) is also exit code 2.
  write_text(t.p / "Wan2.1_VAE.pth", "not a zip");
  r = run_wan(cat("inspect '", t.str(), "'"), out.p);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace wan
