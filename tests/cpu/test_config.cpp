// Tests of src/config: presets (with the parameter counts of spec §2.1), JSON round trips in both
// key styles, reading real-looking config files, inference from tensor shapes for any layer count,
// and the validation errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/config.h"

namespace wan {
namespace {

// Official tensor shapes of a config, written out independently of src/ckpt (spec §3.2).
std::map<std::string, Shape> official_shapes(const DiTConfig& c) {
  const int64_t D = c.dim, F = c.ffn_dim;
  std::map<std::string, Shape> s;
  s["patch_embedding.weight"] = Shape{D, c.in_dim, 1, 2, 2};
  s["patch_embedding.bias"] = Shape{D};
  s["text_embedding.0.weight"] = Shape{D, c.text_dim};
  s["text_embedding.0.bias"] = Shape{D};
  s["text_embedding.2.weight"] = Shape{D, D};
  s["text_embedding.2.bias"] = Shape{D};
  s["time_embedding.0.weight"] = Shape{D, c.freq_dim};
  s["time_embedding.0.bias"] = Shape{D};
  s["time_embedding.2.weight"] = Shape{D, D};
  s["time_embedding.2.bias"] = Shape{D};
  s["time_projection.1.weight"] = Shape{6 * D, D};
  s["time_projection.1.bias"] = Shape{6 * D};
  s["head.modulation"] = Shape{1, 2, D};
  s["head.head.weight"] = Shape{c.out_dim * 4, D};
  s["head.head.bias"] = Shape{c.out_dim * 4};
  for (int i = 0; i < c.num_layers; ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    s[b + "modulation"] = Shape{1, 6, D};
    for (const char* a : {"self_attn.", "cross_attn."}) {
      for (const char* p : {"q", "k", "v", "o"}) {
        s[b + a + p + ".weight"] = Shape{D, D};
        s[b + a + p + ".bias"] = Shape{D};
      }
      s[b + a + "norm_q.weight"] = Shape{D};
      s[b + a + "norm_k.weight"] = Shape{D};
    }
    s[b + "norm3.weight"] = Shape{D};
    s[b + "norm3.bias"] = Shape{D};
    s[b + "ffn.0.weight"] = Shape{F, D};
    s[b + "ffn.0.bias"] = Shape{F};
    s[b + "ffn.2.weight"] = Shape{D, F};
    s[b + "ffn.2.bias"] = Shape{D};
  }
  return s;
}

int64_t count(const std::map<std::string, Shape>& s) {
  int64_t n = 0;
  for (const auto& [k, v] : s) n += v.numel();
  return n;
}

TEST(Config, TaskNames) {
  for (Task t : {Task::T2V_A14B, Task::I2V_A14B, Task::TI2V_5B}) EXPECT_EQ(task_from_name(task_name(t)), t);
  EXPECT_STREQ(task_name(Task::TI2V_5B), "ti2v-5B");
  EXPECT_EQ(task_from_name("T2V-a14b"), Task::T2V_A14B);
  try {
    task_from_name("t2v-1.3B");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: t2v-A14B, i2v-A14B, ti2v-5B"), std::string::npos) << e.what();
  }
}

TEST(Config, PresetsAndParamCounts) {
  DiTConfig t2v = dit_preset("t2v-A14B"), i2v = dit_preset("i2v-A14B"), ti2v = dit_preset("ti2v-5B");
  EXPECT_EQ(dit_param_count(t2v), 14288491584LL);
  EXPECT_EQ(dit_param_count(i2v), 14288901184LL);
  EXPECT_EQ(dit_param_count(ti2v), 4999787712LL);
  EXPECT_EQ(t2v.dim, 5120);
  EXPECT_EQ(t2v.head_dim(), 128);
  EXPECT_EQ(i2v.in_dim, 36);
  EXPECT_EQ(i2v.out_dim, 16);
  EXPECT_EQ(i2v.model_type, "i2v");
  EXPECT_EQ(ti2v.dim, 3072);
  EXPECT_EQ(ti2v.num_heads, 24);
  EXPECT_EQ(ti2v.num_layers, 30);
  EXPECT_EQ(ti2v.ffn_dim, 14336);
  EXPECT_EQ(ti2v.in_dim, 48);
  EXPECT_EQ(ti2v.out_dim, 48);
  EXPECT_EQ(ti2v.model_type, "ti2v");
  DiTConfig tiny = dit_preset("tiny");
  EXPECT_EQ(tiny.dim, 256);
  EXPECT_EQ(tiny.num_heads, 2);
  EXPECT_EQ(tiny.ffn_dim, 512);
  EXPECT_EQ(tiny.num_layers, 2);
  EXPECT_EQ(tiny.text_dim, 4096);
  EXPECT_EQ(tiny.freq_dim, 256);
  EXPECT_EQ(dit_preset("tiny-ti2v").in_dim, 48);
  EXPECT_EQ(dit_preset("tiny-i2v").in_dim, 36);
  // The formula agrees with the shape table for every preset, including per-block 351 394 304 (14B).
  for (const char* p : {"t2v-A14B", "i2v-A14B", "ti2v-5B", "tiny", "tiny-i2v", "tiny-ti2v"}) {
    DiTConfig c = dit_preset(p);
    c.validate();
    EXPECT_EQ(dit_param_count(c), count(official_shapes(c))) << p;
  }
  DiTConfig one = t2v;
  one.num_layers = 1;
  DiTConfig zero_blocks_diff = t2v;
  zero_blocks_diff.num_layers = 2;
  EXPECT_EQ(dit_param_count(zero_blocks_diff) - dit_param_count(one), 351394304LL);
  EXPECT_THROW(dit_preset("t2v-14B"), Error);
}

TEST(Config, T5AndVaePresets) {
  T5Config t5 = t5_preset("umt5-xxl");
  EXPECT_EQ(t5.vocab, 256384);
  EXPECT_EQ(t5.dim, 4096);
  EXPECT_EQ(t5.dim_ffn, 10240);
  EXPECT_EQ(t5.num_heads, 64);
  EXPECT_EQ(t5.head_dim(), 64);
  EXPECT_EQ(t5.num_layers, 24);
  EXPECT_EQ(t5.num_buckets, 32);
  EXPECT_EQ(t5.max_distance, 128);
  // Parameter count of spec §4.1: embedding + 24 blocks (2 norms, 4 attn, 3 ffn, bias table) + norm.
  int64_t n = int64_t(t5.vocab) * t5.dim + t5.dim +
              t5.num_layers * (2LL * t5.dim + 4LL * t5.dim * t5.dim_attn + 3LL * t5.dim * t5.dim_ffn +
                               int64_t(t5.num_buckets) * t5.num_heads);
  EXPECT_EQ(n, 5680910336LL);
  T5Config tiny = t5_preset("tiny");
  EXPECT_EQ(tiny.vocab, 256384);
  EXPECT_EQ(tiny.dim_attn % tiny.num_heads, 0);
  EXPECT_LT(tiny.dim, 4096);
  EXPECT_THROW(t5_preset("t5-base"), Error);

  VaeConfig v21 = vae_preset("wan2.1"), v22 = vae_preset("wan2.2");
  EXPECT_EQ(v21.version, 21);
  EXPECT_EQ(v21.z_dim, 16);
  EXPECT_EQ(v21.base_dim, 96);
  EXPECT_EQ(v21.dec_dim, 96);
  EXPECT_EQ(v21.patch, 1);
  ASSERT_EQ(v21.latents_mean.size(), 16u);
  ASSERT_EQ(v21.latents_std.size(), 16u);
  EXPECT_FLOAT_EQ(v21.latents_mean[0], -0.7571f);
  EXPECT_FLOAT_EQ(v21.latents_mean[15], -0.2921f);
  EXPECT_FLOAT_EQ(v21.latents_std[8], 3.2687f);
  EXPECT_EQ(v22.version, 22);
  EXPECT_EQ(v22.z_dim, 48);
  EXPECT_EQ(v22.base_dim, 160);
  EXPECT_EQ(v22.dec_dim, 256);
  EXPECT_EQ(v22.patch, 2);
  ASSERT_EQ(v22.latents_mean.size(), 48u);
  ASSERT_EQ(v22.latents_std.size(), 48u);
  EXPECT_FLOAT_EQ(v22.latents_mean[0], -0.2289f);
  EXPECT_FLOAT_EQ(v22.latents_mean[47], -0.0667f);
  EXPECT_FLOAT_EQ(v22.latents_std[39], 1.6887f);
  EXPECT_FLOAT_EQ(v22.latents_std[47], 0.7744f);
  for (const char* p : {"wan2.1", "wan2.2", "tiny2.1", "tiny2.2"}) {
    VaeConfig v = vae_preset(p);
    EXPECT_EQ(v.latents_mean.size(), size_t(v.z_dim)) << p;
    EXPECT_EQ(v.dim_mult, (std::vector<int>{1, 2, 4, 4})) << p;
    EXPECT_EQ(v.temporal_downsample, (std::vector<bool>{false, true, true})) << p;
    for (float s : v.latents_std) EXPECT_GT(s, 0.0f) << p;
  }
  EXPECT_EQ(vae_preset("tiny2.2").z_dim, 48);
  EXPECT_LT(vae_preset("tiny2.2").dec_dim, 256);
  EXPECT_THROW(vae_preset("wan2.3"), Error);
}

TEST(Config, JsonRoundTripsBothStyles) {
  for (const char* p : {"t2v-A14B", "i2v-A14B", "ti2v-5B", "tiny", "tiny-i2v", "tiny-ti2v"}) {
    DiTConfig c = dit_preset(p);
    std::string off = dit_config_to_official_json(c);
    std::string dif = dit_config_to_diffusers_json(c);
    EXPECT_EQ(dit_config_from_json(off), c) << p << "\n" << off;
    EXPECT_EQ(dit_config_from_json(dif), c) << p << "\n" << dif;
    auto jo = nlohmann::json::parse(off);
    EXPECT_EQ(jo["_class_name"], "WanModel");
    EXPECT_TRUE(jo.contains("_diffusers_version"));
    for (const char* k : {"dim", "eps", "ffn_dim", "freq_dim", "in_dim", "model_type", "num_heads", "num_layers",
                          "out_dim", "text_len"})
      EXPECT_TRUE(jo.contains(k)) << k;
    EXPECT_EQ(jo["eps"].get<double>(), 1e-6);  // written as 1e-06, not the float's binary expansion
    EXPECT_NE(off.find("1e-06"), std::string::npos) << off;
    auto jd = nlohmann::json::parse(dif);
    EXPECT_EQ(jd["_class_name"], "WanTransformer3DModel");
    EXPECT_EQ(jd["num_attention_heads"].get<int>() * jd["attention_head_dim"].get<int>(), c.dim);
    EXPECT_EQ(jd["text_dim"], 4096);
    EXPECT_EQ(jd["qk_norm"], "rms_norm_across_heads");
    EXPECT_TRUE(jd["image_dim"].is_null());
    EXPECT_EQ(jd["patch_size"], nlohmann::json::array({1, 2, 2}));
  }
  // A config with a custom layer count and text_dim round-trips through both styles.
  DiTConfig c = dit_preset("tiny");
  c.num_layers = 5;
  c.text_dim = 64;
  c.text_len = 77;
  EXPECT_EQ(dit_config_from_json(dit_config_to_official_json(c)), c);
  DiTConfig d = dit_config_from_json(dit_config_to_diffusers_json(c));
  EXPECT_EQ(d.text_dim, 64);
  EXPECT_EQ(d.num_layers, 5);
  EXPECT_EQ(d.text_len, 512);  // diffusers configs carry no text_len
}

TEST(Config, ReadsReleaseStyleFiles) {
  // As written by WanModel.save_config (official Wan2.2 high_noise_model/config.json style).
  DiTConfig a = dit_config_from_json(R"({
    "_class_name": "WanModel", "_diffusers_version": "0.33.0", "dim": 5120, "eps": 1e-06,
    "ffn_dim": 13824, "freq_dim": 256, "in_dim": 36, "model_type": "i2v", "num_heads": 40,
    "num_layers": 40, "out_dim": 16, "text_len": 512})");
  EXPECT_EQ(a, dit_preset("i2v-A14B"));
  // diffusers transformer/config.json of the TI2V-5B pipeline.
  DiTConfig b = dit_config_from_json(R"({
    "_class_name": "WanTransformer3DModel", "_diffusers_version": "0.35.0.dev0",
    "added_kv_proj_dim": null, "attention_head_dim": 128, "cross_attn_norm": true, "eps": 1e-06,
    "ffn_dim": 14336, "freq_dim": 256, "image_dim": null, "in_channels": 48, "num_attention_heads": 24,
    "num_layers": 30, "out_channels": 48, "patch_size": [1, 2, 2], "pos_embed_seq_len": null,
    "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 4096})");
  EXPECT_EQ(b, dit_preset("ti2v-5B"));
  // Without model_type, the official reader derives it from in_dim.
  DiTConfig c = dit_config_from_json(R"({"dim": 3072, "ffn_dim": 14336, "num_heads": 24, "num_layers": 30,
    "in_dim": 48, "out_dim": 48})");
  EXPECT_EQ(c, dit_preset("ti2v-5B"));
}

void expect_error(const std::string& json_text, const std::string& fragment) {
  try {
    dit_config_from_json(json_text);
    ADD_FAILURE() << "no error for " << json_text;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
  }
}

TEST(Config, ValidationErrors) {
  std::string base = R"("_class_name": "WanModel", "ffn_dim": 512, "num_layers": 2, "out_dim": 16, "in_dim": 16)";
  expect_error("{" + base + R"(, "dim": 256, "num_heads": 3})", "not divisible by num_heads 3");
  expect_error("{" + base + R"(, "dim": 256, "num_heads": 4})", "head_dim");
  expect_error("{" + base + R"(, "num_heads": 2})", "'dim' is missing");
  expect_error("{" + base + R"(, "dim": "256", "num_heads": 2})", "'dim' must be an integer");
  expect_error("{" + base + R"(, "dim": 256, "num_heads": 2, "model_type": "s2v"})", "model_type 's2v'");
  expect_error("{" + base + R"(, "dim": 256, "num_heads": 2, "model_type": "i2v"})", "needs in_dim 36");
  expect_error("{" + base + R"(, "dim": 256, "num_heads": 2, "patch_size": [1, 4, 4]})", "patch_size");
  expect_error("{" + base + R"(, "dim": 256, "num_heads": 2, "eps": -1})", "eps");
  expect_error(R"({"_class_name": "WanModel", "dim": 256)", "invalid JSON");
  expect_error("[1, 2]", "not a JSON object");
  expect_error(R"({"_class_name": "UNet2DConditionModel", "sample_size": 64})", "not a Wan DiT config");
  expect_error(R"({"_class_name": "WanTransformer3DModel", "num_attention_heads": 40, "attention_head_dim": 128,
    "in_channels": 36, "out_channels": 16, "ffn_dim": 13824, "num_layers": 40, "image_dim": 1280})",
               "image cross-attention");
  expect_error(R"({"_class_name": "WanTransformer3DModel", "num_attention_heads": 12, "attention_head_dim": 128,
    "in_channels": 20, "out_channels": 16, "ffn_dim": 8960, "num_layers": 30})", "in_channels");
  DiTConfig bad = dit_preset("tiny");
  bad.num_layers = 0;
  EXPECT_THROW(bad.validate(), Error);
  EXPECT_THROW(dit_config_to_official_json(bad), Error);
}

TEST(Config, InferenceFromShapes) {
  for (const char* p : {"t2v-A14B", "i2v-A14B", "ti2v-5B", "tiny", "tiny-i2v", "tiny-ti2v"}) {
    for (int layers : {1, 3, 7}) {
      DiTConfig c = dit_preset(p);
      c.num_layers = layers;
      auto s = official_shapes(c);
      EXPECT_EQ(dit_config_from_shapes(s), c) << p << " layers " << layers;
    }
  }
  DiTConfig c = dit_preset("t2v-A14B");
  EXPECT_EQ(dit_config_from_shapes(official_shapes(c)), c);
  // text_dim is read from text_embedding.0.weight.
  DiTConfig t = dit_preset("tiny");
  t.text_dim = 96;
  EXPECT_EQ(dit_config_from_shapes(official_shapes(t)).text_dim, 96);
  // Errors: missing tensor, non-contiguous blocks, unsupported in_dim.
  auto s = official_shapes(dit_preset("tiny"));
  auto missing = s;
  missing.erase("head.modulation");
  EXPECT_THROW(dit_config_from_shapes(missing), Error);
  auto gap = s;
  gap["blocks.5.modulation"] = Shape{1, 6, 256};
  try {
    dit_config_from_shapes(gap);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not contiguous"), std::string::npos) << e.what();
  }
  auto odd = s;
  odd["patch_embedding.weight"] = Shape{256, 20, 1, 2, 2};
  EXPECT_THROW(dit_config_from_shapes(odd), Error);
}

}  // namespace
}  // namespace wan
