// Tests of detect_components (ckpt/components.cpp) and make-checkpoint's comfyui layout: the same tiny
// model written as an official folder and as ComfyUI component files (same seed) detects to the same
// task and configs and serves the same f32 tensors for every role (fp16 files within fp16 rounding,
// fp8_scaled weights exactly fp8 * scale_weight and within fp8 rounding), the files carry ComfyUI's
// names and dtypes, and every bad input is one wan::Error naming the option, the file and the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "testing/make_checkpoint.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace wan;
using wan::test::TempDir;

namespace {

constexpr uint64_t kSeed = 7;

// make-checkpoint into dir/name; returns the folder.
fs::path make(const fs::path& dir, const std::string& name, const std::string& config, Layout layout, DType dtype) {
  gen::MakeCheckpointOptions o;
  o.config = config;
  o.layout = layout;
  o.dtype = dtype;
  o.seed = kSeed;
  o.out = (dir / name).string();
  gen::make_checkpoint(o);
  return dir / name;
}

// The ComponentFiles of a comfyui make-checkpoint folder.
ComponentFiles files_of(const fs::path& root, const std::string& config, DType dtype) {
  const gen::ComfyUIFiles f = gen::comfyui_files(config, dtype);
  auto at = [&](const std::string& rel) { return rel.empty() ? std::string() : (root / rel).string(); };
  return {at(f.dit), at(f.dit_high), at(f.dit_low), at(f.text_encoder), at(f.vae), at(f.tokenizer)};
}

// Every tensor of the official store is served by the ComfyUI store, within the rounding of its dtype.
void expect_same_tensors(const WeightStore& official, const WeightStore& comfy, const std::string& what) {
  EXPECT_EQ(official.names(), comfy.names()) << what;
  EXPECT_TRUE(comfy.unexpected().empty()) << what << ": " << comfy.unexpected().front();
  for (const std::string& n : official.names()) {
    if (!comfy.contains(n)) continue;
    ASSERT_EQ(official.shape(n), comfy.shape(n)) << what << " " << n;
    const std::optional<RawSpan> span = comfy.raw_span(n);
    ASSERT_TRUE(span.has_value()) << what << " " << n;  // the streaming loader reads every tensor itself
    EXPECT_EQ(span->dtype, comfy.dtype(n)) << n;
    const Tensor a = official.get_f32(n), b = comfy.get_f32(n);
    const float* pa = a.f32();
    const float* pb = b.f32();
    // Both are roundings of one f32 draw: bf16 (official T5) and fp16 (2^-11) relative, fp16 subnormals
    // absolute; fp8 e4m3 (3 mantissa bits) relative plus its subnormal step times the scale.
    const bool fp8 = comfy.dtype(n) == DType::F8E4M3;
    const float rel = fp8 ? 0.0625f : official.dtype(n) == DType::BF16 ? 0.0045f : 0.0005f;
    const float abs = fp8 ? span->scale * 0.002f : 1e-7f;
    int bad = 0;
    for (int64_t i = 0; i < a.numel() && bad < 3; ++i)
      if (!(std::fabs(pa[i] - pb[i]) <= rel * std::fabs(pa[i]) + abs)) {
        ADD_FAILURE() << what << " " << n << "[" << i << "]: " << pa[i] << " vs " << pb[i];
        ++bad;
      }
    if (fp8) {  // get_f32 = the stored fp8 bytes * scale_weight, bit for bit (as the GPU converts)
      ASSERT_TRUE(span->scaled) << n;
      const Tensor raw = comfy.get(n);
      const auto* q = static_cast<const uint8_t*>(raw.data());
      for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(pb[i], f8e4m3_to_f32(q[i]) * span->scale) << n << "[" << i << "]";
    }
  }
}

void expect_same_checkpoint(const CheckpointInfo& o, const CheckpointInfo& c) {
  EXPECT_EQ(c.layout, Layout::ComfyUI);
  EXPECT_EQ(o.task, c.task);
  EXPECT_TRUE(o.dit == c.dit) << dit_config_diff(o.dit, c.dit);
  EXPECT_EQ(o.vae_version, c.vae_version);
  for (Role r : {Role::DiT, Role::DiTHigh, Role::DiTLow, Role::TextEncoder, Role::Vae}) {
    ASSERT_EQ(o.has(r), c.has(r)) << role_name(r);
    if (!o.has(r)) continue;
    expect_same_tensors(*open_weights(o, r), *open_weights(c, r), role_name(r));
  }
  ASSERT_TRUE(c.has(Role::Tokenizer));
  EXPECT_TRUE(fs::is_regular_file(fs::path(c.find(Role::Tokenizer)->path) / "spiece.model"));
}

// Runs f, expects one wan::Error whose message holds every part.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << parts.front();
  } catch (const Error& e) {
    const std::string m = e.what();
    if (std::getenv("WAN_SHOW_ERRORS")) std::printf("%s\n", m.c_str());
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// A small safetensors file of f32 tensors (name, shape).
void write_tensors(const fs::path& p, const std::vector<std::pair<std::string, Shape>>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [n, s] : tensors) specs.push_back({n, DType::F32, s});
  write_safetensors(p.string(), specs, [](const TensorSpec& s, void* dst) { std::memset(dst, 0, s.nbytes()); });
}

// Shared fixtures: tiny T2V (official + comfyui fp16), tiny I2V comfyui, tiny TI2V comfyui.
struct Fixture {
  TempDir dir{"components"};
  fs::path off, t2v, i2v, ti2v;
  ComponentFiles c, i, t;
  Fixture() {
    off = make(dir.p, "official", "tiny", Layout::Official, DType::F32);
    t2v = make(dir.p, "comfy_t2v", "tiny", Layout::ComfyUI, DType::F16);
    i2v = make(dir.p, "comfy_i2v", "tiny-i2v", Layout::ComfyUI, DType::F16);
    ti2v = make(dir.p, "comfy_ti2v", "tiny-ti2v", Layout::ComfyUI, DType::F16);
    c = files_of(t2v, "tiny", DType::F16);
    i = files_of(i2v, "tiny-i2v", DType::F16);
    t = files_of(ti2v, "tiny-ti2v", DType::F16);
  }
};
Fixture& fx() {
  static Fixture f;
  return f;
}

TEST(Components, TinyT2VMatchesOfficialFolder) {
  const Fixture& f = fx();
  const CheckpointInfo o = detect_checkpoint(f.off.string());
  const CheckpointInfo c = detect_components(f.c, Task::T2V_A14B);
  EXPECT_EQ(c.root, f.c.dit_high);
  EXPECT_TRUE(c.task_certain);
  EXPECT_FALSE(c.fp8_scaled);
  EXPECT_EQ(c.find(Role::DiTHigh)->path, f.c.dit_high);
  EXPECT_EQ(c.find(Role::DiTLow)->path, f.c.dit_low);
  EXPECT_EQ(c.t5_naming.prefix, "");
  EXPECT_FALSE(c.t5_naming.official);
  EXPECT_TRUE(c.vae_naming.official);
  expect_same_checkpoint(o, c);
}

TEST(Components, Fp8ScaledMatchesOfficialFolder) {
  TempDir d("components_fp8");
  const fs::path off = make(d.p, "official", "tiny-i2v", Layout::Official, DType::F32);
  const fs::path cf = make(d.p, "comfy", "tiny-i2v", Layout::ComfyUI, DType::F8E4M3);
  const ComponentFiles files = files_of(cf, "tiny-i2v", DType::F8E4M3);
  EXPECT_NE(files.dit_high.find("wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors"), std::string::npos);
  EXPECT_NE(files.text_encoder.find("umt5_xxl_fp8_e4m3fn_scaled.safetensors"), std::string::npos);
  const CheckpointInfo c = detect_components(files);
  EXPECT_EQ(c.task, Task::I2V_A14B);
  EXPECT_TRUE(c.fp8_scaled);
  EXPECT_TRUE(c.t5_naming.fp8_scaled);
  EXPECT_FALSE(c.vae_naming.fp8_scaled);
  auto te = open_weights(c, Role::TextEncoder);
  EXPECT_EQ(te->dtype("blocks.0.attn.q.weight"), DType::F8E4M3);
  EXPECT_EQ(te->dtype("token_embedding.weight"), DType::F16);  // embeddings and norms keep fp16
  EXPECT_EQ(te->dtype("blocks.0.norm1.weight"), DType::F16);
  auto dit = open_weights(c, Role::DiTLow);
  EXPECT_EQ(dit->dtype("blocks.1.ffn.2.weight"), DType::F8E4M3);
  EXPECT_EQ(dit->dtype("patch_embedding.weight"), DType::F16);
  expect_same_checkpoint(detect_checkpoint(off.string()), c);
}

TEST(Components, Ti2vSingleDiTAndWan22Vae) {
  TempDir d("components_ti2v");
  const fs::path off = make(d.p, "official", "tiny-ti2v", Layout::Official, DType::BF16);
  const fs::path cf = make(d.p, "comfy", "tiny-ti2v", Layout::ComfyUI, DType::BF16);
  const ComponentFiles files = files_of(cf, "tiny-ti2v", DType::BF16);
  EXPECT_NE(files.dit.find("diffusion_models/wan2.2_ti2v_5B_bf16.safetensors"), std::string::npos);
  EXPECT_NE(files.vae.find("vae/wan2.2_vae.safetensors"), std::string::npos);
  const CheckpointInfo c = detect_components(files, Task::TI2V_5B);
  EXPECT_EQ(c.task, Task::TI2V_5B);
  EXPECT_EQ(c.vae_version, 22);
  EXPECT_TRUE(c.has(Role::DiT));
  EXPECT_FALSE(c.has(Role::DiTHigh));
  expect_same_checkpoint(detect_checkpoint(off.string()), c);  // bf16 DiT: equal bit for bit
  auto a = open_weights(detect_checkpoint(off.string()), Role::DiT)->get_f32("blocks.0.ffn.0.weight");
  auto b = open_weights(c, Role::DiT)->get_f32("blocks.0.ffn.0.weight");
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
}

// ComfyUI's tensor names and dtypes in the files (comfy/text_encoders/t5.py, comfy/ldm/wan/vae.py, ops.py).
TEST(Components, FilesCarryComfyUINamesAndDtypes) {
  TempDir d("components_names");
  const fs::path cf = make(d.p, "comfy", "tiny", Layout::ComfyUI, DType::F8E4M3);
  const ComponentFiles f = files_of(cf, "tiny", DType::F8E4M3);
  const SafetensorsSet te = SafetensorsSet::open(f.text_encoder);
  EXPECT_EQ(te.info("shared.weight").dtype, DType::F16);
  EXPECT_FALSE(te.contains("encoder.embed_tokens.weight"));
  EXPECT_EQ(te.info("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight").dtype, DType::F16);
  EXPECT_EQ(te.info("encoder.block.0.layer.1.DenseReluDense.wi_1.weight").dtype, DType::F8E4M3);
  EXPECT_EQ(te.info("encoder.block.0.layer.1.DenseReluDense.wi_1.scale_weight").dtype, DType::F32);
  EXPECT_EQ(te.info("encoder.block.0.layer.1.DenseReluDense.wi_1.scale_weight").shape.ndim, 0);
  EXPECT_EQ(te.info("scaled_fp8").dtype, DType::F8E4M3);
  EXPECT_EQ(te.info("encoder.final_layer_norm.weight").dtype, DType::F16);
  const SafetensorsSet vae = SafetensorsSet::open(f.vae);
  EXPECT_EQ(vae.info("decoder.middle.0.residual.0.gamma").dtype, DType::F16);
  EXPECT_TRUE(vae.contains("encoder.conv1.weight"));
  EXPECT_FALSE(vae.contains("decoder.upsamples.0.upsamples.0.residual.2.weight"));  // ComfyUI's 2.2 marker
  const SafetensorsSet dit = SafetensorsSet::open(f.dit_high);
  EXPECT_TRUE(dit.contains("head.modulation"));
  EXPECT_TRUE(dit.contains("blocks.0.self_attn.q.scale_weight"));
  EXPECT_TRUE(dit.contains("scaled_fp8"));
  const SafetensorsSet v22 = SafetensorsSet::open(fx().t.vae);
  EXPECT_TRUE(v22.contains("decoder.upsamples.0.upsamples.0.residual.2.weight"));
}

TEST(Components, OneExpertAloneAndTokenizerFile) {
  const Fixture& f = fx();
  ComponentFiles one;
  one.dit = f.c.dit_low;
  one.tokenizer = (fs::path(f.c.tokenizer) / "spiece.model").string();
  one.text_encoder = f.c.text_encoder;
  const CheckpointInfo c = detect_components(one);
  EXPECT_TRUE(c.has(Role::DiT));
  EXPECT_FALSE(c.has(Role::DiTLow));
  EXPECT_EQ(c.find(Role::Tokenizer)->path, one.tokenizer);
  ASSERT_FALSE(c.notes.empty());
  one.tokenizer = (fs::path(f.c.tokenizer) / "tokenizer.json").string();  // the folder of tokenizer.json
  EXPECT_EQ(detect_components(one).find(Role::Tokenizer)->path, f.c.tokenizer);
}

TEST(Components, Refusals) {
  const Fixture& f = fx();
  const fs::path tmp = f.dir.p / "bad";
  fs::create_directories(tmp);
  auto with = [&](const std::function<void(ComponentFiles&)>& edit) {
    ComponentFiles x = f.c;
    edit(x);
    return [x] { detect_components(x); };
  };
  const std::string nofile = (tmp / "nothing.safetensors").string();
  expect_error(with([&](auto& x) { x.dit_high = nofile; }), {"--dit-high " + nofile + ": no such file"});
  expect_error(with([&](auto& x) { x.vae = nofile; }), {"--vae " + nofile + ": no such file"});
  // A file in the wrong role names both.
  expect_error(with([&](auto& x) { x.text_encoder = f.c.vae; }),
               {"--text-encoder " + f.c.vae, "a Wan 2.1 VAE, not a UMT5 text encoder", "--vae"});
  expect_error(with([&](auto& x) { x.vae = f.c.text_encoder; }),
               {"--vae " + f.c.text_encoder, "a UMT5 text encoder, not a Wan VAE", "--text-encoder"});
  expect_error(with([&](auto& x) { x.dit_low = f.c.vae; }), {"--dit-low " + f.c.vae, "not a Wan DiT"});
  expect_error(with([&](auto& x) { x.vae = f.c.dit_high; }), {"--vae", "a Wan DiT, not a Wan VAE"});
  // Experts.
  expect_error(with([&](auto& x) { x.dit_low = f.i.dit_low; }), {"--dit-high", "differs from --dit-low", "in_dim 16 vs 36"});
  expect_error(with([&](auto& x) { x.dit_low.clear(); }), {"--dit-high " + f.c.dit_high, "no --dit-low"});
  expect_error(with([&](auto& x) { x.dit_high.clear(); }), {"--dit-low " + f.c.dit_low, "no --dit-high"});
  expect_error(with([&](auto& x) { x.dit = f.c.dit_high; }), {"--dit", "not both"});
  expect_error(with([&](auto& x) { x.dit_high.clear(), x.dit_low.clear(); }), {"no DiT file"});
  expect_error(with([&](auto& x) { std::swap(x.dit_high, x.dit_low); }), {"--dit-high", "swapped"});
  expect_error(with([&](auto& x) { x.dit_low = x.dit_high; }), {"the same file"});
  const fs::path copy = tmp / "copy.safetensors";
  fs::copy_file(f.t.dit, copy, fs::copy_options::overwrite_existing);
  expect_error(with([&](auto& x) { x.dit_high = f.t.dit, x.dit_low = copy.string(); }), {"TI2V-5B", "--dit"});
  // The VAE against the task.
  expect_error(with([&](auto& x) { x.vae = f.t.vae; }), {"--vae " + f.t.vae, "a Wan 2.2 VAE, but t2v-A14B", "2.1"});
  expect_error([&] { ComponentFiles x = f.t; x.vae = f.c.vae; detect_components(x); },
               {"--vae " + f.c.vae, "a Wan 2.1 VAE, but ti2v-5B", "wan2.2_vae"});
  expect_error([&] { detect_components(f.c, Task::I2V_A14B); }, {"--task i2v-A14B", "t2v-A14B", "in_dim 16"});
  // Not safetensors.
  write_file(tmp / "notes.txt", "hello");
  write_file(tmp / "broken.safetensors", "definitely not a header");
  expect_error(with([&](auto& x) { x.vae = (tmp / "notes.txt").string(); }), {"--vae", "notes.txt", "not a .safetensors file"});
  expect_error(with([&](auto& x) { x.text_encoder = (tmp / "broken.safetensors").string(); }),
               {"--text-encoder", "broken.safetensors", "not a valid safetensors file"});
  expect_error(with([&](auto& x) { x.vae = tmp.string(); }), {"--vae", "is a folder"});
  // Tokenizer.
  expect_error(with([&](auto& x) { x.tokenizer.clear(); }), {"--text-encoder " + f.c.text_encoder, "no --tokenizer"});
  expect_error(with([&](auto& x) { x.tokenizer = tmp.string(); }), {"--tokenizer " + tmp.string(), "no spiece.model"});
  expect_error(with([&](auto& x) { x.tokenizer = (tmp / "none").string(); }), {"--tokenizer", "no such file or folder"});
  expect_error(with([&](auto& x) { x.tokenizer = (tmp / "notes.txt").string(); }), {"--tokenizer", "not spiece.model"});
  // Text encoders that are not Wan's.
  const fs::path narrow = tmp / "narrow.safetensors", t5 = tmp / "t5xxl.safetensors", other = tmp / "other.safetensors";
  write_tensors(narrow, {{"shared.weight", Shape{64, 8}}, {"encoder.final_layer_norm.weight", Shape{8}}});
  write_tensors(t5, {{"shared.weight", Shape{64, 64}}, {"encoder.final_layer_norm.weight", Shape{64}},
                     {"encoder.block.1.layer.0.SelfAttention.k.weight", Shape{64, 64}}});
  write_tensors(other, {{"foo.weight", Shape{2}}});
  expect_error(with([&](auto& x) { x.text_encoder = narrow.string(); }), {"--text-encoder", "width 8", "text_dim 64"});
  expect_error(with([&](auto& x) { x.text_encoder = t5.string(); }), {"--text-encoder", "not UMT5"});
  expect_error(with([&](auto& x) { x.vae = other.string(); }), {"--vae", "no Wan DiT, UMT5 or Wan VAE tensors", "foo.weight"});
}

}  // namespace
