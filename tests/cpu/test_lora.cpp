// The LoRA reader and CPU merge (src/lora): one random delta written in every key format merges to the
// same weights; scale 0 is the base bit for bit; stacking, alpha / rank scaling, PEFT configs, expert
// routing; every refusal and skip note; the WeightStore decorator; and the diffusers oracle
// (tests/fixtures/lora, tools/make_lora_fixtures.py): the CPU DiT forward with our merge against
// diffusers' load_lora_weights + fuse_lora, max |a - b| / max |b| <= 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "ckpt/names.h"
#include "formats/safetensors.h"
#include "lora/lora.h"
#include "models/config.h"
#include "models/dit/dit_cpu.h"
#include "models/dit/weights.h"
#include "tensor_compare.h"
#include "test_util.h"

namespace {

using namespace wan;
using wan::test::TempDir;
using wan::test::error_of;
using Named = std::vector<std::pair<std::string, Tensor>>;

std::mt19937& rng() {
  static std::mt19937 g{std::random_device{}()};
  return g;
}
// Fresh normal values (never zero), rounded to bf16 so every storage dtype holds them exactly.
Tensor randn(Shape s, float std = 1.0f) {
  std::normal_distribution<float> n(0.0f, std);
  Tensor t = Tensor::empty(DType::F32, s);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = 0.0f;
    // away from 0 so f16 storage (10-bit mantissa, normals from 6e-5) holds every value exactly
    while (std::fabs(v) < 1e-2f * std) v = bf16_to_f32(f32_to_bf16(n(rng())));
    t.f32()[i] = v;
  }
  return t;
}

DiTConfig tiny_cfg() {
  DiTConfig c = dit_preset("tiny");
  c.text_dim = 64;  // keeps text_embedding.0 small
  return c;
}
const WeightTable& table() {
  static const WeightTable t = dit_weight_table(tiny_cfg());
  return t;
}
Shape shape_of(const std::string& name) { return find_weight(table(), name, "tiny DiT").shape; }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// ---- one random delta in every format ----

constexpr int kRank = 4;
constexpr float kAlpha = 2.0f;
const std::vector<std::string> kModules = {"blocks.0.self_attn.q", "blocks.1.cross_attn.o", "blocks.0.ffn.0",
                                           "blocks.1.ffn.2", "head.head", "text_embedding.0", "time_projection.1",
                                           "patch_embedding"};

struct Delta {  // up [out, r], down [r, C, kt, kh, kw] for the conv, else [r, in]
  std::map<std::string, std::pair<Tensor, Tensor>> f;
};
Delta random_delta() {
  Delta d;
  for (const std::string& m : kModules) {
    const Shape w = shape_of(m + ".weight");
    Shape down = w;
    down[0] = kRank;
    d.f[m] = {randn({w[0], kRank}, 0.3f), randn(down, 1.0f / std::sqrt(static_cast<float>(w.numel() / w[0])))};
  }
  return d;
}
Tensor as_dtype(const Tensor& t, DType d) { return t.to(d); }
Tensor flat2(const Tensor& t) { return t.reshape(Shape{t.dim(0), t.numel() / t.dim(0)}); }
Tensor conv_up(const Tensor& up) { return up.reshape(Shape{up.dim(0), up.dim(1), 1, 1, 1}); }
Tensor scalar(float v, DType d = DType::F32) {
  Tensor t = Tensor::f32(Shape{});
  t.f32()[0] = v;
  return t.to(d);
}
std::string diffusers_module(const std::string& m) {
  const std::string d = dit_official_to_diffusers(m + ".weight");
  return d.substr(0, d.size() - 7);
}
std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}

// name(module) -> the module's key stem; up / down suffixes; alpha or not; dtype of the factors.
struct Form {
  std::string label, format;
  std::function<std::string(const std::string&)> stem;
  std::string up_suffix, down_suffix;
  bool alpha;
  DType dtype;
  float strength;  // 0.5 (= alpha / rank) for forms that carry no alpha
  bool conv_up5 = false, down2d = false;
};
std::vector<Form> forms() {
  auto off = [](const std::string& m) { return m; };
  auto kohya_mixed = [](const std::string& m) {  // lora_unet_blocks_12.self_attn.k (WanVideoWrapper 869)
    if (m.rfind("blocks.", 0) != 0) return "lora_unet_" + underscored(m);
    const size_t dot = m.find('.', 7);
    return "lora_unet_" + underscored(m.substr(0, dot)) + m.substr(dot);
  };
  return {
      {"official down/up", "official", [](const std::string& m) { return "diffusion_model." + m; }, ".lora_up.weight",
       ".lora_down.weight", true, DType::BF16, 1.0f},
      {"official A/B", "official", off, ".lora_B.weight", ".lora_A.weight", true, DType::F32, 1.0f, false, true},
      {"kohya", "kohya", [](const std::string& m) { return "lora_unet_" + underscored(m); }, ".lora_up.weight",
       ".lora_down.weight", true, DType::F16, 1.0f},
      {"kohya mixed", "kohya", kohya_mixed, ".lora_up.weight", ".lora_down.weight", true, DType::F32, 1.0f},
      {"wan-fun", "kohya-wan-fun", [](const std::string& m) { return "lora_unet__" + underscored(m); },
       ".lora_up.weight", ".lora_down.weight", true, DType::BF16, 1.0f},
      {"lycoris", "lycoris-lora", [](const std::string& m) { return "lycoris_" + underscored(m); }, ".lora_up.weight",
       ".lora_down.weight", true, DType::BF16, 1.0f},
      {"peft", "peft", [](const std::string& m) { return "base_model.model." + diffusers_module(m); },
       ".lora_B.weight", ".lora_A.weight", false, DType::F32, 0.5f, true},
      {"peft default", "peft", [](const std::string& m) { return "transformer." + diffusers_module(m); },
       ".lora_B.default.weight", ".lora_A.default.weight", false, DType::BF16, 0.5f},
      {"diffsynth", "diffsynth", [](const std::string& m) { return "pipe.dit." + m; }, ".lora_B.default.weight",
       ".lora_A.default.weight", false, DType::BF16, 0.5f},
      {"lora_linear_layer", "peft", [](const std::string& m) { return "transformer." + diffusers_module(m); },
       ".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight", false, DType::F32, 0.5f},
      {"dot lora", "peft", [](const std::string& m) { return diffusers_module(m); }, ".lora.up.weight",
       ".lora.down.weight", false, DType::F16, 0.5f},
      {"_lora", "peft", [](const std::string& m) { return "transformer." + diffusers_module(m); }, "_lora.up.weight",
       "_lora.down.weight", false, DType::BF16, 0.5f},
  };
}

Named write_form(const Form& f, const Delta& d) {
  Named t;
  for (const auto& [m, ud] : d.f) {
    const std::string s = f.stem(m);
    Tensor up = ud.first, down = ud.second;
    if (m == "patch_embedding" && f.conv_up5) up = conv_up(up);
    if (f.down2d) down = flat2(down);
    t.push_back({s + f.up_suffix, as_dtype(up, f.dtype)});
    t.push_back({s + f.down_suffix, as_dtype(down, f.dtype)});
    if (f.alpha) t.push_back({s + ".alpha", scalar(kAlpha)});
  }
  return t;
}

// Base weights for every target, merged by one LoraSet.
std::map<std::string, Tensor> merged(const LoraSet& set, const std::map<std::string, Tensor>& base) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : set.targets) {
    Tensor w = base.at(name).clone();
    apply_lora_cpu(t, w);
    out[name] = w;
  }
  return out;
}
std::map<std::string, Tensor> random_base() {
  std::map<std::string, Tensor> b;
  for (const WeightSpec& w : table()) b[w.name] = randn(w.shape, 0.1f);
  return b;
}

TEST(Lora, EveryFormatMergesTheSame) {
  TempDir dir("lora");
  const Delta d = random_delta();
  const auto base = random_base();
  std::map<std::string, Tensor> ref;
  for (const Form& f : forms()) {
    SCOPED_TRACE(f.label);
    const std::string sub = dir / underscored(f.label);
    std::filesystem::create_directories(sub);
    const std::string path = sub + "/lora.safetensors";
    write_safetensors(path, write_form(f, d));
    const LoraSet set = load_lora_set({{path, f.strength}}, LoraExpert::All, table());
    ASSERT_EQ(set.files.size(), 1u);
    EXPECT_EQ(set.files[0].format, f.format);
    EXPECT_EQ(set.files[0].modules_matched(), kModules.size());
    EXPECT_TRUE(set.files[0].skipped.empty()) << set.files[0].skipped[0].key << ": " << set.files[0].skipped[0].reason;
    for (const auto& [name, t] : set.targets) {
      ASSERT_EQ(t.low_rank.size(), 1u) << name;
      EXPECT_EQ(t.low_rank[0].scale, 0.5f) << name;
      EXPECT_EQ(t.rows * t.cols, t.shape.numel());
    }
    auto m = merged(set, base);
    if (ref.empty()) {
      ref = m;
      // The reference itself against a double-precision product.
      for (const std::string& mod : kModules) {
        const Tensor& w = ref.at(mod + ".weight");
        const Tensor up = d.f.at(mod).first, down = flat2(d.f.at(mod).second);
        const int64_t R = w.dim(0), C = w.numel() / R;
        double err = 0, mx = 0;
        for (int64_t o = 0; o < R; ++o)
          for (int64_t i = 0; i < C; ++i) {
            double s = 0;
            for (int r = 0; r < kRank; ++r) s += double(up.f32()[o * kRank + r]) * down.f32()[r * C + i];
            const double want = base.at(mod + ".weight").f32()[o * C + i] + 0.5 * s;
            err = std::max(err, std::fabs(want - w.f32()[o * C + i]));
            mx = std::max(mx, std::fabs(0.5 * s));
          }
        EXPECT_LT(err, 1e-6) << mod;
        EXPECT_GT(mx, 1e-2) << mod;  // the delta is not negligible
      }
      continue;
    }
    ASSERT_EQ(m.size(), ref.size());
    for (const auto& [name, w] : m) EXPECT_TRUE(same_bits(w, ref.at(name))) << name;
  }
}

// .diff / .diff_b / diff_m full deltas: the f32 product (scaled by alpha / rank) as a .diff agrees with
// the low-rank merge within f32 rounding; bias and modulation deltas add exactly.
TEST(Lora, FullDeltaFormsMatchLowRank) {
  TempDir dir("lora");
  const Delta d = random_delta();
  const auto base = random_base();
  Named low, full;
  for (const auto& [m, ud] : d.f) {
    low.push_back({m + ".lora_up.weight", ud.first});
    low.push_back({m + ".lora_down.weight", ud.second});
    low.push_back({m + ".alpha", scalar(kAlpha)});
    const Tensor up = ud.first, down = flat2(ud.second);
    const Shape ws = shape_of(m + ".weight");
    Tensor diff = Tensor::f32(ws);
    const int64_t R = ws[0], C = ws.numel() / R;
    for (int64_t o = 0; o < R; ++o)
      for (int64_t i = 0; i < C; ++i) {
        double s = 0;
        for (int r = 0; r < kRank; ++r) s += double(up.f32()[o * kRank + r]) * down.f32()[r * C + i];
        diff.f32()[o * C + i] = static_cast<float>(0.5 * s);
      }
    full.push_back({"diffusion_model." + m + ".diff", diff});
  }
  const Tensor db = randn(shape_of("blocks.1.ffn.2.bias"), 0.05f), dm = randn(shape_of("blocks.0.modulation"), 0.05f);
  const Tensor dn = randn(shape_of("blocks.0.norm3.weight"), 0.05f);
  full.push_back({"diffusion_model.blocks.1.ffn.2.diff_b", db});
  full.push_back({"diffusion_model.blocks.0.diff_m", dm});
  full.push_back({"diffusion_model.blocks.0.norm3.diff", dn});
  write_safetensors(dir / "low.safetensors", low);
  write_safetensors(dir / "full.safetensors", full);
  const auto ml = merged(load_lora_set({{dir / "low.safetensors"}}, LoraExpert::All, table()), base);
  const LoraSet fs = load_lora_set({{dir / "full.safetensors", 1.0f}}, LoraExpert::All, table());
  EXPECT_EQ(fs.files[0].format, "official");
  const auto mf = merged(fs, base);
  for (const std::string& m : kModules) {
    const Tensor &a = ml.at(m + ".weight"), &b = mf.at(m + ".weight");
    EXPECT_LT(wan::test::max_abs(a, b), 2e-6) << m;
  }
  for (auto [name, delta] : {std::pair{"blocks.1.ffn.2.bias", db}, {"blocks.0.modulation", dm},
                             {"blocks.0.norm3.weight", dn}}) {
    const Tensor& w = mf.at(name);
    for (int64_t i = 0; i < w.numel(); ++i)
      ASSERT_EQ(w.f32()[i], base.at(name).f32()[i] + delta.f32()[i]) << name << " " << i;
  }
}

TEST(Lora, ZeroStrengthIsTheBaseBitForBit) {
  TempDir dir("lora");
  const Delta d = random_delta();
  write_safetensors(dir / "a.safetensors", write_form(forms()[0], d));
  auto base = random_base();
  base.at("blocks.0.ffn.0.weight").f32()[3] = -0.0f;  // w + 0 would make it +0
  const LoraSet set = load_lora_set({{dir / "a.safetensors", 0.0f}}, LoraExpert::All, table());
  ASSERT_EQ(set.targets.size(), kModules.size());
  for (const auto& [name, t] : set.targets) EXPECT_FALSE(t.active()) << name;
  for (const auto& [name, w] : merged(set, base)) EXPECT_TRUE(same_bits(w, base.at(name))) << name;
  EXPECT_TRUE(std::signbit(merged(set, base).at("blocks.0.ffn.0.weight").f32()[3]));
}

TEST(Lora, StackingAddsTheTerms) {
  TempDir dir("lora");
  const Delta a = random_delta(), b = random_delta();
  write_safetensors(dir / "a.safetensors", write_form(forms()[0], a));
  write_safetensors(dir / "b.safetensors", write_form(forms()[2], b));
  const Tensor diff = randn(shape_of("blocks.0.self_attn.q.weight"), 0.01f);
  write_safetensors(dir / "c.safetensors", Named{{"blocks.0.self_attn.q.diff", diff}});
  const auto base = random_base();
  const LoraSet set = load_lora_set({{dir / "a.safetensors", 0.7f}, {dir / "b.safetensors", 1.3f},
                                     {dir / "c.safetensors", -0.4f}}, LoraExpert::All, table());
  const LoraTarget& q = set.targets.at("blocks.0.self_attn.q.weight");
  ASSERT_EQ(q.low_rank.size(), 2u);
  ASSERT_EQ(q.full.size(), 1u);
  EXPECT_EQ(q.low_rank[0].scale, static_cast<float>(double(0.7f) * 2.0 / 4));
  EXPECT_EQ(q.low_rank[1].scale, static_cast<float>(double(1.3f) * 2.0 / 4));
  EXPECT_EQ(q.full[0].scale, -0.4f);
  // The documented order: delta = ((0 + s1·p1) + s2·p2) + s3·diff, then w + delta.
  Tensor w = base.at("blocks.0.self_attn.q.weight").clone();
  apply_lora_cpu(q, w);
  const int64_t C = q.cols;
  const Tensor ua = a.f.at("blocks.0.self_attn.q").first, da = a.f.at("blocks.0.self_attn.q").second;
  const Tensor ub = b.f.at("blocks.0.self_attn.q").first, dbb = b.f.at("blocks.0.self_attn.q").second;
  for (int64_t o = 0; o < q.rows; ++o)
    for (int64_t i = 0; i < C; ++i) {
      float pa = 0, pb = 0;
      for (int r = 0; r < kRank; ++r) pa = pa + ua.f32()[o * kRank + r] * da.f32()[r * C + i];
      for (int r = 0; r < kRank; ++r) pb = pb + ub.f32()[o * kRank + r] * dbb.f32()[r * C + i];
      float delta = 0.0f;
      delta = delta + q.low_rank[0].scale * pa;
      delta = delta + q.low_rank[1].scale * pb;
      delta = delta + -0.4f * diff.f32()[o * C + i];
      ASSERT_EQ(w.f32()[o * C + i], base.at("blocks.0.self_attn.q.weight").f32()[o * C + i] + delta) << o << "," << i;
    }
  EXPECT_EQ(set.files.size(), 3u);
}

TEST(Lora, AlphaAndPeftScales) {
  TempDir dir("lora");
  const Shape q = shape_of("blocks.0.self_attn.q.weight"), k = shape_of("blocks.0.self_attn.k.weight");
  Named t = {{"diffusion_model.blocks.0.self_attn.q.lora_up.weight", randn({q[0], 8})},
             {"diffusion_model.blocks.0.self_attn.q.lora_down.weight", randn({8, q[1]})},
             {"diffusion_model.blocks.0.self_attn.q.alpha", scalar(3.0f, DType::BF16)},
             {"diffusion_model.blocks.0.self_attn.k.lora_up.weight", randn({k[0], 8})},
             {"diffusion_model.blocks.0.self_attn.k.lora_down.weight", randn({8, k[1]})}};
  write_safetensors(dir / "a.safetensors", t);
  LoraSet s = load_lora_set({{dir / "a.safetensors", 0.6f}}, LoraExpert::All, table());
  EXPECT_EQ(s.targets.at("blocks.0.self_attn.q.weight").low_rank[0].scale, static_cast<float>(double(0.6f) * 3.0 / 8));
  EXPECT_EQ(s.targets.at("blocks.0.self_attn.k.weight").low_rank[0].scale, 0.6f);  // no alpha: strength

  // PEFT: adapter_config.json beside the file, with a pattern; then rsLoRA; metadata wins over the json.
  std::filesystem::create_directories(dir / "peft");
  Named p = {{"base_model.model.blocks.0.attn1.to_q.lora_A.weight", randn({8, q[1]})},
             {"base_model.model.blocks.0.attn1.to_q.lora_B.weight", randn({q[0], 8})},
             {"base_model.model.blocks.0.attn1.to_k.lora_A.weight", randn({8, k[1]})},
             {"base_model.model.blocks.0.attn1.to_k.lora_B.weight", randn({k[0], 8})}};
  write_safetensors(dir / "peft/adapter_model.safetensors", p);
  auto write_cfg = [&](const std::string& text) { std::ofstream(dir / "peft/adapter_config.json") << text; };
  write_cfg(R"({"r": 8, "lora_alpha": 16, "alpha_pattern": {"attn1.to_k": 4}})");
  s = load_lora_set({{dir / "peft/adapter_model.safetensors", 0.5f}}, LoraExpert::All, table());
  EXPECT_EQ(s.targets.at("blocks.0.self_attn.q.weight").low_rank[0].scale, 0.5f * 16 / 8);
  EXPECT_EQ(s.targets.at("blocks.0.self_attn.k.weight").low_rank[0].scale, 0.5f * 4 / 8);
  EXPECT_NE(s.files[0].notes.at(0).find("adapter_config.json"), std::string::npos);
  write_cfg(R"({"r": 8, "lora_alpha": 16, "use_rslora": true})");
  s = load_lora_set({{dir / "peft/adapter_model.safetensors", 1.0f}}, LoraExpert::All, table());
  EXPECT_EQ(s.targets.at("blocks.0.self_attn.q.weight").low_rank[0].scale, static_cast<float>(16 / std::sqrt(8.0)));
  write_cfg(R"({"r": 4, "lora_alpha": 16})");
  EXPECT_NE(error_of([&] { load_lora_set({{dir / "peft/adapter_model.safetensors"}}, LoraExpert::All, table()); })
                .find("gives r = 4 but the tensors have rank 8"),
            std::string::npos);
  write_safetensors(dir / "peft/adapter_model.safetensors", p,
                    {{"lora_adapter_metadata", R"({"transformer.r": 8, "transformer.lora_alpha": 2})"}});
  s = load_lora_set({{dir / "peft/adapter_model.safetensors", 1.0f}}, LoraExpert::All, table());
  EXPECT_EQ(s.targets.at("blocks.0.self_attn.q.weight").low_rank[0].scale, 0.25f);
}

TEST(Lora, ExpertRouting) {
  TempDir dir("lora");
  const Shape q = shape_of("blocks.0.self_attn.q.weight");
  auto one = [&](const std::string& path, const std::string& key) {
    write_safetensors(path, Named{{key + ".lora_up.weight", randn({q[0], 2})}, {key + ".lora_down.weight", randn({2, q[1]})}});
  };
  one(dir / "all.safetensors", "blocks.0.self_attn.q");
  one(dir / "high.safetensors", "blocks.0.self_attn.q");
  one(dir / "low.safetensors", "blocks.0.self_attn.q");
  const std::vector<LoraSpec> specs = {{dir / "all.safetensors", 1.0f, LoraExpert::All},
                                       {dir / "high.safetensors", 2.0f, LoraExpert::High},
                                       {dir / "low.safetensors", 3.0f, LoraExpert::Low}};
  const LoraSet hi = load_lora_set(specs, LoraExpert::High, table()), lo = load_lora_set(specs, LoraExpert::Low, table());
  ASSERT_EQ(hi.files.size(), 2u);
  EXPECT_EQ(hi.files[1].path, dir / "high.safetensors");
  EXPECT_EQ(hi.targets.at("blocks.0.self_attn.q.weight").low_rank[1].scale, 2.0f);
  ASSERT_EQ(lo.files.size(), 2u);
  EXPECT_EQ(lo.targets.at("blocks.0.self_attn.q.weight").low_rank[1].scale, 3.0f);
  EXPECT_NE(error_of([&] { load_lora_set(specs, LoraExpert::All, table()); }).find("single DiT"), std::string::npos);

  // diffusers Wan 2.2: transformer. -> high-noise expert, transformer_2. -> low-noise expert.
  const Shape k = shape_of("blocks.0.self_attn.k.weight");
  write_safetensors(dir / "both.safetensors",
                    Named{{"transformer.blocks.0.attn1.to_q.lora_A.weight", randn({2, q[1]})},
                          {"transformer.blocks.0.attn1.to_q.lora_B.weight", randn({q[0], 2})},
                          {"transformer_2.blocks.0.attn1.to_k.lora_A.weight", randn({2, k[1]})},
                          {"transformer_2.blocks.0.attn1.to_k.lora_B.weight", randn({k[0], 2})}});
  const std::vector<LoraSpec> both = {{dir / "both.safetensors"}};
  const LoraSet h2 = load_lora_set(both, LoraExpert::High, table()), l2 = load_lora_set(both, LoraExpert::Low, table());
  const LoraSet single = load_lora_set(both, LoraExpert::All, table());
  EXPECT_EQ(h2.files[0].matched, std::vector<std::string>{"blocks.0.self_attn.q.weight"});
  EXPECT_EQ(l2.files[0].matched, std::vector<std::string>{"blocks.0.self_attn.k.weight"});
  EXPECT_EQ(single.files[0].matched, std::vector<std::string>{"blocks.0.self_attn.q.weight"});
  EXPECT_EQ(h2.files[0].skipped.size(), 2u);
  EXPECT_NE(h2.files[0].skipped[0].reason.find("low-noise"), std::string::npos);
}

// ---- refusals: one line naming the file and the key ----

std::string load_error(const std::string& path) {
  return error_of([&] { load_lora_set({{path}}, LoraExpert::All, table()); });
}

TEST(Lora, Refusals) {
  TempDir dir("lora");
  const Shape q = shape_of("blocks.0.self_attn.q.weight");
  const std::string m = "diffusion_model.blocks.0.self_attn.q";
  auto check = [&](const std::string& name, const Named& t, const std::string& key, const std::string& what) {
    SCOPED_TRACE(name);
    const std::string path = dir / name;
    write_safetensors(path, t);
    const std::string e = load_error(path);
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find(key), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    try {
      load_lora_set({{path}}, LoraExpert::All, table());
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::BadInput);
    }
  };
  const Tensor up = randn({q[0], 4}), down = randn({4, q[1]});
  check("nothing.safetensors", Named{{"model.encoder.layer.0.lora_up.weight", up}, {"model.encoder.layer.0.lora_down.weight", down}},
        "model.encoder.layer.0", "no key names a tensor of this DiT");
  check("shape.safetensors", Named{{m + ".lora_up.weight", randn({q[0] + 2, 4})}, {m + ".lora_down.weight", down}},
        m + ".lora_up.weight", "does not fit blocks.0.self_attn.q.weight");
  check("shape_in.safetensors", Named{{m + ".lora_up.weight", up}, {m + ".lora_down.weight", randn({4, q[1] - 1})}},
        m + ".lora_down.weight", "does not fit");
  check("loha.safetensors", Named{{m + ".hada_w1_a", up}, {m + ".hada_w1_b", down}}, m + ".hada_w1_a", "LoHa");
  check("lokr.safetensors", Named{{m + ".lokr_w1", up}, {m + ".lokr_w2", down}}, m + ".lokr_w1", "LoKr");
  check("up_only.safetensors", Named{{m + ".lora_up.weight", up}}, m + ".lora_up.weight", "no matching lora_down");
  check("down_only.safetensors", Named{{m + ".lora_down.weight", down}}, m + ".lora_down.weight", "no matching lora_up");
  check("rank.safetensors", Named{{m + ".lora_up.weight", randn({q[0], 3})}, {m + ".lora_down.weight", down}},
        "rank mismatch", m + ".lora_up.weight");
  check("dtype.safetensors", Named{{m + ".lora_up.weight", Tensor(DType::I32, up.shape())}, {m + ".lora_down.weight", down}},
        m + ".lora_up.weight", "is not a float type");
  check("fp8.safetensors", Named{{m + ".lora_up.weight", Tensor(DType::F8E4M3, up.shape())}, {m + ".lora_down.weight", down}},
        m + ".lora_up.weight", "not supported");
  check("diff.safetensors", Named{{m + ".diff", randn({q[0], q[1] + 1})}}, m + ".diff", "does not fit");
  check("dora.safetensors", Named{{m + ".lora_up.weight", up}, {m + ".lora_down.weight", down}, {m + ".dora_scale", randn({q[0], 1})}},
        m + ".dora_scale", "DoRA");
  // Not safetensors: judged by the header, whatever the extension.
  // (std::string literals keep the embedded NULs and their exact lengths: 24 bytes each.)
  for (const std::string& bytes : {std::string("PK\x03\x04 a zip (torch .pt)  ", 24),
                                   std::string("\x10\x00\x00\x00\x00\x00\x00\x00[not json]      ", 24)}) {
    const std::string path = dir / "fake.safetensors";
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    const std::string e = load_error(path);
    EXPECT_NE(e.find(path + ": not a safetensors file"), std::string::npos) << e;
  }
  EXPECT_NE(load_error(dir / "missing.safetensors").find("no such file"), std::string::npos);
}

TEST(Lora, SkippedKeysAreNoted) {
  TempDir dir("lora");
  const Shape q = shape_of("blocks.0.cross_attn.q.weight");
  const std::string m = "diffusion_model.blocks.0.cross_attn";
  write_safetensors(dir / "i2v.safetensors",
                    Named{{m + ".q.lora_up.weight", randn({q[0], 4})}, {m + ".q.lora_down.weight", randn({4, q[1]})},
                          {m + ".k_img.lora_up.weight", randn({q[0], 4})}, {m + ".k_img.lora_down.weight", randn({4, q[1]})},
                          {m + ".v_img.lora_up.weight", randn({q[0], 4})}, {m + ".v_img.lora_down.weight", randn({4, q[1]})},
                          {m + ".norm_k_img.diff", randn({q[0]})},
                          {"diffusion_model.img_emb.proj.1.lora_up.weight", randn({q[0], 4})},
                          {"diffusion_model.blocks.7.ffn.0.lora_up.weight", randn({8, 4})},
                          {"some_optimizer_state", randn({3})}});
  const LoraSet s = load_lora_set({{dir / "i2v.safetensors"}}, LoraExpert::All, table());
  const LoraFileSummary& f = s.files.at(0);
  EXPECT_EQ(f.matched, std::vector<std::string>{"blocks.0.cross_attn.q.weight"});
  ASSERT_EQ(f.skipped.size(), 8u);
  int image = 0;
  for (const LoraSkip& k : f.skipped) {
    if (k.reason.find("Wan 2.1 I2V") != std::string::npos) ++image;
    if (k.key == "diffusion_model.blocks.7.ffn.0.lora_up.weight") {
      EXPECT_EQ(k.reason, "no module 'blocks.7.ffn.0' in this DiT");
    }
    if (k.key == "some_optimizer_state") {
      EXPECT_EQ(k.reason, "not a LoRA tensor name");
    }
  }
  EXPECT_EQ(image, 6);
  ASSERT_FALSE(f.notes.empty());
  EXPECT_NE(f.notes[0].find("6 keys of Wan 2.1 I2V image layers"), std::string::npos) << f.notes[0];
  const auto lines = s.summary_lines(true);
  EXPECT_NE(lines.at(0).find("1 tensors changed, 8 keys skipped"), std::string::npos) << lines[0];
}

TEST(Lora, ParseArg) {
  LoraSpec s = parse_lora_arg("a/b.safetensors:0.5", LoraExpert::High, "lora-high");
  EXPECT_EQ(s.path, "a/b.safetensors");
  EXPECT_EQ(s.strength, 0.5f);
  EXPECT_EQ(s.expert, LoraExpert::High);
  EXPECT_EQ(parse_lora_arg("x.safetensors", LoraExpert::All, "lora").strength, 1.0f);
  EXPECT_EQ(parse_lora_arg("d:1/x.safetensors", LoraExpert::All, "lora").path, "d:1/x.safetensors");
  EXPECT_EQ(parse_lora_arg("d:1/x.safetensors:-1e-1", LoraExpert::All, "lora").strength, -0.1f);
  EXPECT_EQ(parse_lora_arg("x:abc", LoraExpert::All, "lora").path, "x:abc");
  EXPECT_EQ(parse_lora_arg("x:inf", LoraExpert::All, "lora").path, "x:inf");
  EXPECT_EQ(parse_lora_arg("x:", LoraExpert::All, "lora").path, "x:");
  EXPECT_EQ(error_of([] { parse_lora_arg(":0.5", LoraExpert::All, "lora"); }).rfind("--lora", 0), 0u);
  try {
    parse_lora_arg("", LoraExpert::Low, "lora-low");
    FAIL();
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "lora-low");
  }
}

// ---- the WeightStore decorator ----

class MapStore : public WeightStore {
 public:
  std::map<std::string, Tensor> t;
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [k, v] : t) n.push_back(k);
    return n;
  }
  bool contains(const std::string& n) const override { return t.count(n) != 0; }
  Shape shape(const std::string& n) const override { return t.at(n).shape(); }
  DType dtype(const std::string& n) const override { return t.at(n).dtype(); }
  Tensor get(const std::string& n) const override { return t.at(n); }
  Tensor get_f32(const std::string& n) const override { return t.at(n).to_f32(); }
  std::vector<std::string> unexpected() const override { return {"extra"}; }
  std::optional<RawSpan> raw_span(const std::string& n) const override {
    RawSpan s;
    s.path = "file";
    s.shape = shape(n);
    return s;
  }
};

TEST(Lora, WeightStoreServesMergedWeights) {
  TempDir dir("lora");
  write_safetensors(dir / "a.safetensors", write_form(forms()[0], random_delta()));
  auto set = std::make_shared<const LoraSet>(load_lora_set({{dir / "a.safetensors", 0.9f}}, LoraExpert::All, table()));
  auto base = std::make_unique<MapStore>();
  const auto weights = random_base();
  for (const auto& [n, w] : weights) base->t[n] = w.to(DType::BF16);
  auto expect = merged(*set, [&] {
    std::map<std::string, Tensor> b;
    for (const auto& [n, w] : weights) b[n] = w.to(DType::BF16).to_f32();
    return b;
  }());
  auto store = with_lora(std::move(base), set);
  for (const auto& [n, w] : expect) {
    EXPECT_TRUE(same_bits(store->get_f32(n), w)) << n;
    EXPECT_TRUE(same_bits(store->get(n), w)) << n;
    EXPECT_EQ(store->dtype(n), DType::F32);
    EXPECT_FALSE(store->raw_span(n).has_value()) << n;
  }
  const std::string untouched = "blocks.0.self_attn.k.weight";
  EXPECT_TRUE(store->raw_span(untouched).has_value());
  EXPECT_EQ(store->dtype(untouched), DType::BF16);
  EXPECT_TRUE(same_bits(store->get_f32(untouched), weights.at(untouched).to(DType::BF16).to_f32()));
  EXPECT_EQ(store->unexpected(), std::vector<std::string>{"extra"});
  // An f32 base is not changed in place (its tensors may be views of a read-only mapping).
  auto f32 = std::make_unique<MapStore>();
  for (const auto& [n, w] : weights) f32->t[n] = w;
  MapStore* raw = f32.get();
  auto s2 = with_lora(std::move(f32), set);
  (void)s2->get_f32("head.head.weight");
  EXPECT_TRUE(same_bits(raw->t.at("head.head.weight"), weights.at("head.head.weight")));
  // A target the checkpoint lacks.
  auto small = std::make_unique<MapStore>();
  small->t["head.head.weight"] = weights.at("head.head.weight");
  EXPECT_NE(error_of([&] { with_lora(std::move(small), set); }).find("the checkpoint has no tensor"), std::string::npos);
}

// ---- the diffusers oracle ----

const std::string kLoraDir = std::string(WAN_FIXTURES) + "/lora";
const std::string kDitDir = std::string(WAN_FIXTURES) + "/tiny_dit/transformer";

// The tiny DiT fixture (diffusers names) served under official names.
class DiffusersDirStore : public MapStore {
 public:
  explicit DiffusersDirStore(const std::string& dir) {
    const SafetensorsSet s = SafetensorsSet::open(dir);
    for (const std::string& n : s.names()) t[dit_diffusers_to_official(n)] = s.get(n);
  }
};

TEST(Lora, MatchesDiffusersOracle) {
  std::ifstream cfg_file(kDitDir + "/config.json");
  std::stringstream ss;
  ss << cfg_file.rdbuf();
  const DiTConfig cfg = dit_config_from_json(ss.str());
  const WeightTable dit = dit_weight_table(cfg);
  auto oracle = SafetensorsFile::open(kLoraDir + "/oracle.safetensors");
  const Tensor x = oracle->get("x").to_f32(), t = oracle->get("t").to_f32(), ctx = oracle->get("context").to_f32();
  const Tensor base_out = oracle->get("base").to_f32();
  const auto cases = nlohmann::json::parse(oracle->metadata().at("cases"));
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    std::vector<LoraSpec> specs;
    for (const auto& l : c["loras"]) specs.push_back({kLoraDir + "/" + l[0].get<std::string>(), l[1].get<float>()});
    auto set = std::make_shared<const LoraSet>(load_lora_set(specs, LoraExpert::All, dit));
    for (const std::string& line : set->summary_lines(false)) std::printf("  %s\n", line.c_str());
    auto store = with_lora(std::make_unique<DiffusersDirStore>(kDitDir), set);
    const DiTWeights w = load_dit_weights(cfg, [&](const std::string& n) { return store->get_f32(n); });
    const Tensor out = dit_forward(cfg, w, x, t, ctx, {5});
    const Tensor want = oracle->get(name).to_f32();
    const double rel = wan::test::max_rel(out, want);
    std::printf("%-7s max |ours - diffusers| / max |diffusers| = %.2e (LoRA moves the output by %.2e)\n", name.c_str(),
                rel, wan::test::max_rel(want, base_out));
    EXPECT_LE(rel, 1e-4) << name;
    if (name != "base") {
      EXPECT_GT(wan::test::max_rel(want, base_out), 0.05) << name;
    }
  }
}

}  // namespace
