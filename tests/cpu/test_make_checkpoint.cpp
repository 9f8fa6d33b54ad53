// Tests of `wan make-checkpoint` (src/gen): the parameter lists against the spec's parameter counts
// and shapes, the T5/VAE name mappings (round trips, spec examples, rejected names), the weight
// initialiser (order independence, bounds, moments), the tokenizer model bytes, the files of both
// layouts, determinism (byte-identical reruns; seeds and experts differ), error handling (bad
// arguments, non-empty output, unwritable folder, a write failure midway leaves nothing behind), and
// tools/verify_checkpoint.py through WAN_PYTHON: diffusers/transformers load every component strictly,
// the official names are exact, both layouts hold the same tensors, forwards are finite and
// non-degenerate (block stds within [1e-3, 1e3] on a 12-layer model), and the real-size configs'
// tensor names and shapes equal those of the reference models built on the meta device.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/names.h"
#include "models/config.h"
#include "models/dit/weights.h"
#include "models/umt5/weights.h"
#include "models/vae/weights.h"
#include "models/weight_spec.h"
#include "core/error.h"
#include "testing/hf_configs.h"
#include "testing/make_checkpoint.h"
#include "testing/tokenizer_files.h"
#include "formats/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace wan;
using namespace wan::gen;

namespace {

using wan::test::TempDir;

struct RunResult {
  int code = -1;
  std::string out;
};

RunResult run(const std::string& cmd) {
  RunResult r;
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int st = ::pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return r;
}

std::string wan_cmd(const std::string& args) { return std::string("'") + WAN_BINARY + "' make-checkpoint " + args; }

std::vector<std::string> files_under(const std::string& root) {
  std::vector<std::string> v;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) v.push_back(fs::relative(e.path(), root).string());
  std::sort(v.begin(), v.end());
  return v;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> siblings_with(const std::string& dir, const std::string& needle) {
  std::vector<std::string> v;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(needle) != std::string::npos) v.push_back(e.path().string());
  return v;
}

int64_t count_params(const std::vector<WeightSpec>& ps) {
  int64_t n = 0;
  for (const auto& p : ps) n += p.shape.numel();
  return n;
}

std::map<std::string, Shape> by_name(const std::vector<WeightSpec>& ps) {
  std::map<std::string, Shape> m;
  for (const auto& p : ps) m[p.name] = p.shape;
  return m;
}

MakeCheckpointOptions opts(const std::string& config, Layout layout, const std::string& out, uint64_t seed = 0) {
  MakeCheckpointOptions o;
  o.config = config;
  o.layout = layout;
  o.out = out;
  o.seed = seed;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Parameter lists

TEST(MakeCheckpointParams, DiTCountsMatchTheSpec) {
  // Spec §2.1: parameter counts computed from the release shapes.
  EXPECT_EQ(count_params(dit_weight_table(dit_preset("t2v-A14B"))), 14288491584LL);
  EXPECT_EQ(count_params(dit_weight_table(dit_preset("i2v-A14B"))), 14288901184LL);
  EXPECT_EQ(count_params(dit_weight_table(dit_preset("ti2v-5B"))), 4999787712LL);
  auto m = by_name(dit_weight_table(dit_preset("ti2v-5B")));
  EXPECT_EQ(m.at("patch_embedding.weight"), (Shape{3072, 48, 1, 2, 2}));
  EXPECT_EQ(m.at("time_projection.1.weight"), (Shape{18432, 3072}));
  EXPECT_EQ(m.at("head.head.weight"), (Shape{192, 3072}));
  EXPECT_EQ(m.at("head.modulation"), (Shape{1, 2, 3072}));
  EXPECT_EQ(m.at("blocks.29.modulation"), (Shape{1, 6, 3072}));
  EXPECT_EQ(m.count("blocks.30.modulation"), 0u);
  EXPECT_EQ(m.size(), 15u + 30u * 27u);  // 27 tensors per block (spec §3.2)
}

TEST(MakeCheckpointParams, DiTNamesAgreeWithTheLayoutModule) {
  for (const char* p : {"t2v-A14B", "i2v-A14B", "ti2v-5B", "tiny"}) {
    DiTConfig c = dit_preset(p);
    c.num_layers = 3;
    EXPECT_EQ(by_name(dit_weight_table(c)), dit_expected_shapes(c)) << p;
  }
}

TEST(MakeCheckpointParams, T5CountAndNamesMatchTheSpec) {
  auto ps = umt5_weight_table(t5_preset("umt5-xxl"));
  EXPECT_EQ(count_params(ps), 5680910336LL);  // spec §4.1
  auto m = by_name(ps);
  EXPECT_EQ(m.size(), 2u + 24u * 10u);
  EXPECT_EQ(m.at("token_embedding.weight"), (Shape{256384, 4096}));
  EXPECT_EQ(m.at("blocks.23.ffn.gate.0.weight"), (Shape{10240, 4096}));
  EXPECT_EQ(m.at("blocks.0.ffn.fc2.weight"), (Shape{4096, 10240}));
  EXPECT_EQ(m.at("blocks.5.pos_embedding.embedding.weight"), (Shape{32, 64}));
  EXPECT_EQ(m.at("norm.weight"), (Shape{4096}));
}

TEST(MakeCheckpointParams, VaeShapesMatchTheSpec) {
  auto m21 = by_name(vae_weight_table(vae_preset("wan2.1")));
  EXPECT_EQ(m21.size(), 194u);
  EXPECT_EQ(m21.at("encoder.downsamples.3.residual.2.weight"), (Shape{192, 96, 3, 3, 3}));
  EXPECT_EQ(m21.at("encoder.downsamples.3.shortcut.weight"), (Shape{192, 96, 1, 1, 1}));
  EXPECT_EQ(m21.at("encoder.downsamples.5.time_conv.weight"), (Shape{192, 192, 3, 1, 1}));
  EXPECT_EQ(m21.at("encoder.middle.1.to_qkv.weight"), (Shape{1152, 384, 1, 1}));
  EXPECT_EQ(m21.at("encoder.middle.1.norm.gamma"), (Shape{384, 1, 1}));
  EXPECT_EQ(m21.at("encoder.head.0.gamma"), (Shape{384, 1, 1, 1}));
  EXPECT_EQ(m21.at("decoder.upsamples.3.time_conv.weight"), (Shape{768, 384, 3, 1, 1}));
  EXPECT_EQ(m21.at("decoder.upsamples.3.resample.1.weight"), (Shape{192, 384, 3, 3}));
  EXPECT_EQ(m21.at("decoder.upsamples.4.shortcut.weight"), (Shape{384, 192, 1, 1, 1}));
  EXPECT_EQ(m21.at("decoder.head.2.weight"), (Shape{3, 96, 3, 3, 3}));
  EXPECT_EQ(m21.at("conv1.weight"), (Shape{32, 32, 1, 1, 1}));
  EXPECT_EQ(m21.at("conv2.weight"), (Shape{16, 16, 1, 1, 1}));
  EXPECT_EQ(m21.count("encoder.downsamples.2.time_conv.weight"), 0u);  // downsample2d
  EXPECT_EQ(m21.count("decoder.upsamples.11.time_conv.weight"), 0u);   // upsample2d

  auto m22 = by_name(vae_weight_table(vae_preset("wan2.2")));
  EXPECT_EQ(m22.size(), 196u);
  EXPECT_EQ(m22.at("encoder.conv1.weight"), (Shape{160, 12, 3, 3, 3}));
  EXPECT_EQ(m22.at("encoder.downsamples.1.downsamples.0.shortcut.weight"), (Shape{320, 160, 1, 1, 1}));
  EXPECT_EQ(m22.at("encoder.downsamples.2.downsamples.2.time_conv.weight"), (Shape{640, 640, 3, 1, 1}));
  EXPECT_EQ(m22.at("encoder.head.2.weight"), (Shape{96, 640, 3, 3, 3}));
  EXPECT_EQ(m22.at("decoder.conv1.weight"), (Shape{1024, 48, 3, 3, 3}));
  EXPECT_EQ(m22.at("decoder.upsamples.0.upsamples.3.time_conv.weight"), (Shape{2048, 1024, 3, 1, 1}));
  EXPECT_EQ(m22.at("decoder.upsamples.2.upsamples.3.resample.1.weight"), (Shape{512, 512, 3, 3}));
  EXPECT_EQ(m22.at("decoder.upsamples.3.upsamples.0.shortcut.weight"), (Shape{256, 512, 1, 1, 1}));
  EXPECT_EQ(m22.at("decoder.head.2.weight"), (Shape{12, 256, 3, 3, 3}));
  EXPECT_EQ(m22.at("conv1.weight"), (Shape{96, 96, 1, 1, 1}));
  EXPECT_EQ(m22.count("decoder.upsamples.2.upsamples.3.time_conv.weight"), 0u);
  EXPECT_EQ(m22.count("encoder.downsamples.3.downsamples.2.resample.1.weight"), 0u);
}

// ---------------------------------------------------------------------------------------------
// Name mappings

TEST(MakeCheckpointNames, T5RoundTripsAndSpecTable) {
  std::set<std::string> hf;
  for (const auto& p : umt5_weight_table(t5_preset("umt5-xxl"))) {
    std::string h = t5_official_to_hf(p.name);
    ASSERT_FALSE(h.empty()) << p.name;
    EXPECT_EQ(t5_hf_to_official(h), p.name);
    hf.insert(h);
  }
  EXPECT_EQ(hf.size(), 2u + 24u * 10u);
  EXPECT_EQ(t5_official_to_hf("token_embedding.weight"), "shared.weight");
  EXPECT_EQ(t5_hf_to_official("encoder.embed_tokens.weight"), "token_embedding.weight");
  EXPECT_EQ(t5_official_to_hf("blocks.3.pos_embedding.embedding.weight"),
            "encoder.block.3.layer.0.SelfAttention.relative_attention_bias.weight");
  EXPECT_EQ(t5_official_to_hf("blocks.11.ffn.gate.0.weight"), "encoder.block.11.layer.1.DenseReluDense.wi_0.weight");
  EXPECT_EQ(t5_official_to_hf("blocks.11.ffn.fc1.weight"), "encoder.block.11.layer.1.DenseReluDense.wi_1.weight");
  EXPECT_EQ(t5_hf_to_official("encoder.final_layer_norm.weight"), "norm.weight");
  for (const char* bad : {"blocks.01.norm1.weight", "blocks.x.norm1.weight", "blocks.1.norm3.weight", "norm.bias",
                          "encoder.block.1.layer.2.layer_norm.weight", "decoder.block.0.layer.0.layer_norm.weight"}) {
    EXPECT_EQ(t5_official_to_hf(bad), "") << bad;
    EXPECT_EQ(t5_hf_to_official(bad), "") << bad;
  }
}

TEST(MakeCheckpointNames, VaeRoundTripsForEveryPreset) {
  for (const char* preset : {"wan2.1", "wan2.2", "tiny2.1", "tiny2.2"}) {
    VaeConfig c = vae_preset(preset);
    std::set<std::string> seen;
    for (const auto& p : vae_weight_table(c)) {
      std::string d = vae_official_to_diffusers(p.name, c.version);
      ASSERT_FALSE(d.empty()) << preset << " " << p.name;
      EXPECT_EQ(vae_diffusers_to_official(d, c.version), p.name) << preset << " " << d;
      EXPECT_TRUE(seen.insert(d).second) << d;
    }
  }
}

TEST(MakeCheckpointNames, VaeSpecExamplesAndRejections) {
  const std::pair<const char*, const char*> v21[] = {
      {"encoder.conv1.weight", "encoder.conv_in.weight"},
      {"encoder.downsamples.3.shortcut.bias", "encoder.down_blocks.3.conv_shortcut.bias"},
      {"encoder.downsamples.0.residual.0.gamma", "encoder.down_blocks.0.norm1.gamma"},
      {"encoder.downsamples.10.residual.6.weight", "encoder.down_blocks.10.conv2.weight"},
      {"encoder.downsamples.5.time_conv.weight", "encoder.down_blocks.5.time_conv.weight"},
      {"encoder.downsamples.2.resample.1.bias", "encoder.down_blocks.2.resample.1.bias"},
      {"encoder.middle.0.residual.3.gamma", "encoder.mid_block.resnets.0.norm2.gamma"},
      {"encoder.middle.2.residual.2.weight", "encoder.mid_block.resnets.1.conv1.weight"},
      {"encoder.middle.1.to_qkv.weight", "encoder.mid_block.attentions.0.to_qkv.weight"},
      {"encoder.head.0.gamma", "encoder.norm_out.gamma"},
      {"encoder.head.2.weight", "encoder.conv_out.weight"},
      {"conv1.weight", "quant_conv.weight"},
      {"conv2.bias", "post_quant_conv.bias"},
      {"decoder.upsamples.4.shortcut.weight", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight"},
      {"decoder.upsamples.3.resample.1.weight", "decoder.up_blocks.0.upsamplers.0.resample.1.weight"},
      {"decoder.upsamples.7.time_conv.bias", "decoder.up_blocks.1.upsamplers.0.time_conv.bias"},
      {"decoder.upsamples.11.resample.1.weight", "decoder.up_blocks.2.upsamplers.0.resample.1.weight"},
      {"decoder.upsamples.14.residual.6.bias", "decoder.up_blocks.3.resnets.2.conv2.bias"},
      {"decoder.head.2.bias", "decoder.conv_out.bias"},
  };
  for (auto [o, d] : v21) {
    EXPECT_EQ(vae_official_to_diffusers(o, 21), d) << o;
    EXPECT_EQ(vae_diffusers_to_official(d, 21), o) << d;
  }
  const std::pair<const char*, const char*> v22[] = {
      {"encoder.downsamples.1.downsamples.0.residual.2.weight", "encoder.down_blocks.1.resnets.0.conv1.weight"},
      {"encoder.downsamples.0.downsamples.2.resample.1.weight", "encoder.down_blocks.0.downsampler.resample.1.weight"},
      {"encoder.downsamples.2.downsamples.2.time_conv.bias", "encoder.down_blocks.2.downsampler.time_conv.bias"},
      {"decoder.upsamples.1.upsamples.3.time_conv.weight", "decoder.up_blocks.1.upsampler.time_conv.weight"},
      {"decoder.upsamples.3.upsamples.2.residual.0.gamma", "decoder.up_blocks.3.resnets.2.norm1.gamma"},
      {"decoder.middle.1.proj.bias", "decoder.mid_block.attentions.0.proj.bias"},
  };
  for (auto [o, d] : v22) {
    EXPECT_EQ(vae_official_to_diffusers(o, 22), d) << o;
    EXPECT_EQ(vae_diffusers_to_official(d, 22), o) << d;
  }
  // Modules the released structure does not have, malformed indices, the other version's style.
  for (const char* bad : {"encoder.downsamples.2.residual.0.gamma", "encoder.downsamples.2.time_conv.weight",
                          "encoder.downsamples.11.resample.1.weight", "decoder.upsamples.15.resample.1.weight",
                          "decoder.upsamples.11.time_conv.weight", "decoder.upsamples.03.residual.0.gamma",
                          "encoder.middle.3.residual.0.gamma", "encoder.head.1.gamma", "encoder.conv1.gamma",
                          "conv3.weight", "encoder.downsamples.0.downsamples.0.residual.0.gamma", "",
                          "encoder.downsamples.0.residual.0.weight", "encoder.downsamples.0.residual.0.gamma.x"}) {
    EXPECT_EQ(vae_official_to_diffusers(bad, 21), "") << bad;
  }
  for (const char* bad :
       {"encoder.downsamples.3.downsamples.2.resample.1.weight", "decoder.upsamples.2.upsamples.3.time_conv.weight",
        "encoder.downsamples.0.downsamples.0.time_conv.weight", "decoder.upsamples.0.upsamples.4.residual.0.gamma",
        "encoder.downsamples.3.residual.0.gamma"}) {
    EXPECT_EQ(vae_official_to_diffusers(bad, 22), "") << bad;
  }
  for (const char* bad :
       {"decoder.up_blocks.3.upsamplers.0.resample.1.weight", "encoder.down_blocks.11.resample.1.weight",
        "decoder.up_blocks.0.upsampler.resample.1.weight", "encoder.mid_block.attentions.1.proj.bias",
        "encoder.mid_block.resnets.2.norm1.gamma", "decoder.up_blocks.0.resnets.3.norm1.gamma"}) {
    EXPECT_EQ(vae_diffusers_to_official(bad, 21), "") << bad;
  }
  EXPECT_EQ(vae_diffusers_to_official("decoder.up_blocks.0.upsamplers.0.resample.1.weight", 22), "");
  EXPECT_EQ(vae_official_to_diffusers("conv1.weight", 20), "");
}

// ---------------------------------------------------------------------------------------------
// Initialisation

TEST(MakeCheckpointInit, ValuesDependOnlyOnSeedNameAndIndex) {
  WeightSpec p{"blocks.0.ffn.0.weight", Shape{300, 1000}, WeightClass::GemmWeight, init_fan_in(1000), DType::BF16, {}};
  std::vector<float> a(p.shape.numel()), b(p.shape.numel());
  fill_init(p, 11, DType::F32, a.data());
  fill_init(p, 11, DType::F32, b.data());
  EXPECT_EQ(a, b);
  const uint64_t key = tensor_key(11, p.name);
  for (int64_t i : {0LL, 1LL, 12345LL, 299999LL}) EXPECT_EQ(a[i], init_value(p.init, key, i));  // order independent
  const float bound = 1.0f / std::sqrt(1000.0f);
  double sum = 0, sq = 0;
  for (float v : a) {
    ASSERT_LE(std::fabs(v), bound);
    sum += v;
    sq += double(v) * v;
  }
  EXPECT_NEAR(sum / a.size(), 0.0, 0.01 * bound);
  EXPECT_NEAR(sq / a.size(), bound * bound / 3.0, 0.01 * bound * bound);
  // Another seed, another name, another component: unrelated values.
  fill_init(p, 12, DType::F32, b.data());
  EXPECT_NE(a, b);
  WeightSpec q = p;
  q.name = "blocks.1.ffn.0.weight";
  fill_init(q, 11, DType::F32, b.data());
  EXPECT_NE(a, b);
  EXPECT_NE(component_seed(0, "high_noise_model"), component_seed(0, "low_noise_model"));
  EXPECT_NE(dit_seed(0, Task::T2V_A14B, true), dit_seed(0, Task::T2V_A14B, false));
  // bf16 output is the rounded f32 value.
  std::vector<uint16_t> h(p.shape.numel());
  fill_init(p, 11, DType::BF16, h.data());
  for (int64_t i : {0LL, 77LL, 299999LL}) EXPECT_EQ(h[i], f32_to_bf16(a[i]));
}

TEST(MakeCheckpointInit, BellDrawHasUnitMoments) {
  const int n = 200000;
  double s1 = 0, s2 = 0, s4 = 0, mx = 0;
  for (int i = 0; i < n; ++i) {
    double x = bell_draw(99, i);
    s1 += x;
    s2 += x * x;
    s4 += x * x * x * x;
    mx = std::max(mx, std::fabs(x));
  }
  EXPECT_NEAR(s1 / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_NEAR(s4 / n, 2.7, 0.06);  // Irwin-Hall n=4 kurtosis (a normal has 3)
  EXPECT_LT(mx, 3.47);
  WeightSpec g{"norm.weight", Shape{4096}, WeightClass::Norm, init_norm_scale(), DType::F32, {}};
  std::vector<float> v(4096);
  fill_init(g, 5, DType::F32, v.data());
  for (float x : v) ASSERT_TRUE(x > 0.8f && x < 1.2f) << x;
}

// ---------------------------------------------------------------------------------------------
// Tokenizer and configs

TEST(MakeCheckpointTokenizer, PiecesAndModelBytes) {
  auto p = tokenizer_pieces();
  ASSERT_GT(p.size(), 400u);
  EXPECT_EQ(p[0].piece, "<pad>");
  EXPECT_EQ(p[1].piece, "</s>");
  EXPECT_EQ(p[2].piece, "<unk>");
  EXPECT_EQ(p[2].type, PieceType::Unknown);
  EXPECT_EQ(p[3].piece, "<0x00>");
  EXPECT_EQ(p[3 + 0xE7].piece, "<0xE7>");
  EXPECT_EQ(p[3 + 0xE7].type, PieceType::Byte);
  EXPECT_LE(tokenizer_id_count(), t5_preset("tiny").vocab);
  std::string m = spm_model_proto(p);
  EXPECT_EQ(m, spm_model_proto(tokenizer_pieces()));
  // First field: pieces[0] = {piece "<pad>", score 0, type CONTROL}.
  const std::string head = std::string("\x0a\x0e\x0a\x05<pad>\x15\x00\x00\x00\x00\x18\x03", 16);
  EXPECT_EQ(m.substr(0, head.size()), head);
  json tj = json::parse(tokenizer_json(p, kUmt5ExtraIds));
  EXPECT_EQ(tj["model"]["vocab"].size(), p.size() + kUmt5ExtraIds);
  EXPECT_EQ(tj["model"]["vocab"].back()[0], "<extra_id_0>");
  EXPECT_EQ(tj["model"]["byte_fallback"], true);
  EXPECT_EQ(json::parse(tokenizer_config_json(kUmt5ExtraIds))["additional_special_tokens"].size(), 300u);
}

TEST(MakeCheckpointConfigs, PipelineAttributesPerTask) {
  json t2v = json::parse(model_index_json(Task::T2V_A14B));
  EXPECT_EQ(t2v["_class_name"], "WanPipeline");
  EXPECT_EQ(t2v["boundary_ratio"], 0.875);
  EXPECT_EQ(t2v["transformer_2"][1], "WanTransformer3DModel");
  json i2v = json::parse(model_index_json(Task::I2V_A14B));
  EXPECT_EQ(i2v["_class_name"], "WanImageToVideoPipeline");
  EXPECT_EQ(i2v["boundary_ratio"], 0.9);
  EXPECT_TRUE(i2v["image_encoder"][0].is_null());
  json ti2v = json::parse(model_index_json(Task::TI2V_5B));
  EXPECT_TRUE(ti2v["boundary_ratio"].is_null());
  EXPECT_EQ(ti2v["expand_timesteps"], true);
  EXPECT_TRUE(ti2v["transformer_2"][0].is_null());
  EXPECT_EQ(json::parse(scheduler_config_json(Task::TI2V_5B))["flow_shift"], 5.0);
  EXPECT_EQ(json::parse(scheduler_config_json(Task::T2V_A14B))["flow_shift"], 3.0);
  json v22 = json::parse(vae_config_diffusers_json(vae_preset("wan2.2")));
  EXPECT_EQ(v22["scale_factor_spatial"], 16);
  EXPECT_EQ(v22["in_channels"], 12);
  EXPECT_EQ(v22["latents_std"][0], 0.4765);
  json v21 = json::parse(vae_config_diffusers_json(vae_preset("wan2.1")));
  EXPECT_EQ(v21["scale_factor_spatial"], 8);
  EXPECT_EQ(v21["scale_factor_temporal"], 4);
  EXPECT_TRUE(v21["patch_size"].is_null());
}

TEST(MakeCheckpointPlan, NamesAndOverrides) {
  ModelPreset p = model_preset("tiny");
  EXPECT_EQ(p.task, Task::T2V_A14B);
  EXPECT_EQ(p.dit.text_dim, p.t5.dim);  // chainable tiny components
  EXPECT_EQ(p.vae.version, 21);
  EXPECT_EQ(model_preset("tiny-ti2v").vae.version, 22);
  EXPECT_EQ(model_preset("tiny-i2v").dit.in_dim, 36);
  ModelPreset r = model_preset("T2V-A14B", 4);
  EXPECT_EQ(r.dit.num_layers, 4);
  EXPECT_EQ(r.dit.dim, 5120);
  EXPECT_EQ(r.t5.num_layers, 24);  // --layers is the DiT's only
  EXPECT_EQ(model_preset("ti2v-5B").vae.z_dim, 48);
  EXPECT_THROW(model_preset("t2v-14B"), Error);
  EXPECT_THROW(model_preset("tiny", -1), Error);
  EXPECT_THROW(model_preset("tiny", 1001), Error);
}

// ---------------------------------------------------------------------------------------------
// Files, determinism, errors

TEST(MakeCheckpointFiles, BothLayoutsHaveTheReleaseFileNames) {
  TempDir t;
  auto r = make_checkpoint(opts("tiny", Layout::Official, t / "off"));
  const std::vector<std::string> off = {"Wan2.1_VAE.pth",
                                        "google/umt5-xxl/special_tokens_map.json",
                                        "google/umt5-xxl/spiece.model",
                                        "google/umt5-xxl/tokenizer.json",
                                        "google/umt5-xxl/tokenizer_config.json",
                                        "high_noise_model/config.json",
                                        "high_noise_model/diffusion_pytorch_model.safetensors",
                                        "low_noise_model/config.json",
                                        "low_noise_model/diffusion_pytorch_model.safetensors",
                                        "models_t5_umt5-xxl-enc-bf16.pth"};
  EXPECT_EQ(files_under(t / "off"), off);
  EXPECT_EQ(r.files, off);
  auto d = make_checkpoint(opts("tiny-ti2v", Layout::Diffusers, t / "dif"));
  const std::vector<std::string> dif = {"model_index.json",
                                        "scheduler/scheduler_config.json",
                                        "text_encoder/config.json",
                                        "text_encoder/model.safetensors",
                                        "tokenizer/special_tokens_map.json",
                                        "tokenizer/spiece.model",
                                        "tokenizer/tokenizer.json",
                                        "tokenizer/tokenizer_config.json",
                                        "transformer/config.json",
                                        "transformer/diffusion_pytorch_model.safetensors",
                                        "vae/config.json",
                                        "vae/diffusion_pytorch_model.safetensors"};
  EXPECT_EQ(files_under(t / "dif"), dif);
  // The official TI2V DiT sits at the root; the configs read back as the plan.
  make_checkpoint(opts("tiny-ti2v", Layout::Official, t / "ti"));
  EXPECT_TRUE(fs::exists(t / "ti/config.json"));
  EXPECT_TRUE(fs::exists(t / "ti/Wan2.2_VAE.pth"));
  EXPECT_EQ(dit_config_from_json(slurp(t / "ti/config.json")), model_preset("tiny-ti2v").dit);
  EXPECT_EQ(dit_config_from_json(slurp(t / "dif/transformer/config.json")), model_preset("tiny-ti2v").dit);
  // A small shard limit gives the sharded form with an index.
  MakeCheckpointOptions o = opts("tiny", Layout::Diffusers, t / "sharded");
  o.max_shard_bytes = 2000000;
  make_checkpoint(o);
  EXPECT_TRUE(fs::exists(t / "sharded/transformer/diffusion_pytorch_model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(t / "sharded/transformer/diffusion_pytorch_model.safetensors"));
  auto set = SafetensorsSet::open(t / "sharded/transformer");
  EXPECT_GT(set.files().size(), 1u);
  EXPECT_EQ(set.names().size(), dit_weight_table(model_preset("tiny").dit).size());
  EXPECT_TRUE(siblings_with(t.str(), "partial").empty());
}

TEST(MakeCheckpointFiles, ComfyUILayoutHasComfyOrgFileNames) {
  TempDir t;
  MakeCheckpointOptions o = opts("tiny", Layout::ComfyUI, t / "c", 5);
  o.dtype = DType::F16;
  const MakeCheckpointResult r = make_checkpoint(o);
  const std::vector<std::string> want = {"diffusion_models/wan2.2_t2v_high_noise_14B_fp16.safetensors",
                                         "diffusion_models/wan2.2_t2v_low_noise_14B_fp16.safetensors",
                                         "text_encoders/umt5_xxl_fp16.safetensors",
                                         "tokenizer/special_tokens_map.json",
                                         "tokenizer/spiece.model",
                                         "tokenizer/tokenizer.json",
                                         "tokenizer/tokenizer_config.json",
                                         "vae/wan_2.1_vae.safetensors"};
  EXPECT_EQ(r.files, want);
  const ComfyUIFiles f = comfyui_files("tiny", DType::F16);
  EXPECT_EQ(f.dit_high, want[0]);
  EXPECT_EQ(f.text_encoder, want[2]);
  // Byte-identical reruns; the values are the official draw's, rounded to fp16.
  make_checkpoint(opts("tiny", Layout::ComfyUI, t / "d", 5));  // the default dtype of the options is f32
  o.out = t / "e";
  make_checkpoint(o);
  for (const std::string& n : want) EXPECT_TRUE(slurp(t / ("c/" + n)) == slurp(t / ("e/" + n))) << n;
  EXPECT_TRUE(fs::exists(t / "d/diffusion_models/wan2.2_t2v_low_noise_14B_fp32.safetensors"));
  make_checkpoint(opts("tiny", Layout::Official, t / "off", 5));
  auto hf = SafetensorsFile::open(t / "c/diffusion_models/wan2.2_t2v_high_noise_14B_fp16.safetensors");
  auto ho = SafetensorsFile::open(t / "off/high_noise_model/diffusion_pytorch_model.safetensors");
  Tensor a = hf->get("blocks.1.self_attn.o.weight"), b = ho->get("blocks.1.self_attn.o.weight");
  ASSERT_EQ(a.dtype(), DType::F16);
  for (int64_t i = 0; i < a.numel(); i += 97)
    ASSERT_EQ(static_cast<const uint16_t*>(a.data())[i], f32_to_f16(static_cast<const float*>(b.data())[i])) << i;
  // fp8_scaled and the TI2V names; --dit-only writes the one DiT.
  MakeCheckpointOptions q = opts("tiny-ti2v", Layout::ComfyUI, t / "q");
  q.dtype = DType::F8E4M3;
  q.dit_only = true;
  EXPECT_EQ(make_checkpoint(q).files, std::vector<std::string>{"diffusion_models/wan2.2_ti2v_5B_fp8_scaled.safetensors"});
  q.dtype = DType::F64;
  q.out = t / "bad";
  EXPECT_THROW(make_checkpoint(q), Error);
}

TEST(MakeCheckpointFiles, DeterministicAndSeeded) {
  TempDir t;
  make_checkpoint(opts("tiny", Layout::Diffusers, t / "a", 5));
  make_checkpoint(opts("tiny", Layout::Diffusers, t / "b", 5));
  make_checkpoint(opts("tiny", Layout::Diffusers, t / "c", 6));
  auto fa = files_under(t / "a");
  ASSERT_EQ(fa, files_under(t / "b"));
  for (const auto& f : fa) EXPECT_TRUE(slurp(t / "a/" + f) == slurp(t / "b/" + f)) << f << " differs between runs";
  for (const char* f : {"transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors",
                        "vae/diffusion_pytorch_model.safetensors"})
    EXPECT_FALSE(slurp(t / "a/" + f) == slurp(t / "c/" + f)) << f << " same for two seeds";
  EXPECT_TRUE(slurp(t / "a/tokenizer/spiece.model") == slurp(t / "c/tokenizer/spiece.model"));
  // The two experts: same names and shapes, different values.
  auto hi = SafetensorsFile::open(t / "a/transformer/diffusion_pytorch_model.safetensors");
  auto lo = SafetensorsFile::open(t / "a/transformer_2/diffusion_pytorch_model.safetensors");
  ASSERT_EQ(hi->tensors().size(), lo->tensors().size());
  Tensor qh = hi->get("blocks.0.attn1.to_q.weight"), ql = lo->get("blocks.0.attn1.to_q.weight");
  ASSERT_EQ(qh.shape(), ql.shape());
  EXPECT_NE(std::memcmp(qh.data(), ql.data(), qh.nbytes()), 0);
  // bf16 DiT: the rounded values of the fp32 checkpoint.
  MakeCheckpointOptions o = opts("tiny", Layout::Diffusers, t / "h", 5);
  o.dtype = DType::BF16;
  make_checkpoint(o);
  auto hb = SafetensorsFile::open(t / "h/transformer/diffusion_pytorch_model.safetensors");
  Tensor qb = hb->get("blocks.0.attn1.to_q.weight");
  ASSERT_EQ(qb.dtype(), DType::BF16);
  Tensor qf = hi->get("blocks.0.attn1.to_q.weight");
  EXPECT_EQ(static_cast<const uint16_t*>(qb.data())[123], f32_to_bf16(static_cast<const float*>(qf.data())[123]));
}

TEST(MakeCheckpointCli, WritesAndRefusesBadInput) {
  TempDir t;
  RunResult ok = run(wan_cmd("--config tiny --layout official --seed 3 --out '" + (t / "x/y") + "'"));
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("wrote"), std::string::npos) << ok.out;
  EXPECT_TRUE(fs::exists(t / "x/y/high_noise_model/config.json"));

  struct Case {
    std::string args, needle;
  };
  const Case cases[] = {
      {"--config huge --layout official --out '" + (t / "e1") + "'", "unknown --config 'huge'"},
      {"--config tiny --layout comfy --out '" + (t / "e2") + "'", "unknown --layout 'comfy'"},
      {"--config tiny --layout official --dtype fp16 --out '" + (t / "e8") + "'", "--dtype must be fp32 or bf16"},
      {"--config tiny --layout official --dtype fp8 --out '" + (t / "e3") + "'", "unknown --dtype 'fp8'"},
      {"--config tiny --layout official --layers 0 --out '" + (t / "e4") + "'", "--layers"},
      {"--config tiny --layout official --seed -4 --out '" + (t / "e5") + "'", "--seed"},
      {"--config tiny --layout official", "missing required option --out"},
      {"--config tiny --layout official --bogus 1 --out '" + (t / "e6") + "'", "unknown option --bogus"},
      {"--config tiny --layout official stray --out '" + (t / "e7") + "'", "unexpected argument 'stray'"},
      {"--config tiny --layout official --out '" + (t / "x/y") + "'", "not empty (use --force"},
      {"--config tiny --layout official --out '" + (t / "x/y/config_is_file") + "'", "is not a folder"},
  };
  // A regular file where a folder is needed.
  { std::ofstream(t / "x/y/config_is_file") << "x"; }
  for (const Case& c : cases) {
    RunResult r = run(wan_cmd(c.args));
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line expected: " << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
  }
  // Unwritable place: below a regular file.
  RunResult u = run(wan_cmd("--config tiny --layout official --out '" + (t / "x/y/config_is_file/sub") + "'"));
  EXPECT_EQ(u.code, 2) << u.out;
  EXPECT_NE(u.out.find("cannot create folder"), std::string::npos) << u.out;

  // --force replaces; an empty folder is fine without it.
  std::string before = slurp(t / "x/y/high_noise_model/diffusion_pytorch_model.safetensors");
  RunResult f = run(wan_cmd("--config tiny --layout official --seed 4 --force --out '" + (t / "x/y") + "'"));
  ASSERT_EQ(f.code, 0) << f.out;
  EXPECT_FALSE(fs::exists(t / "x/y/config_is_file"));
  EXPECT_FALSE(slurp(t / "x/y/high_noise_model/diffusion_pytorch_model.safetensors") == before);
  RunResult c = run(wan_cmd("--config tiny-i2v --layout comfyui --dtype fp8_scaled --output '" + (t / "comfy") + "'"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(fs::exists(t / "comfy/diffusion_models/wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors"));
  EXPECT_TRUE(fs::exists(t / "comfy/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"));
  EXPECT_TRUE(fs::exists(t / "comfy/tokenizer/spiece.model"));
  RunResult c16 = run(wan_cmd("--config tiny-ti2v --layout comfyui --dit-only --output '" + (t / "comfy16") + "'"));
  ASSERT_EQ(c16.code, 0) << c16.out;
  EXPECT_TRUE(fs::exists(t / "comfy16/diffusion_models/wan2.2_ti2v_5B_fp16.safetensors"));  // comfyui defaults to fp16
  fs::create_directories(t / "empty");
  RunResult e = run(wan_cmd("--config tiny-ti2v --layout diffusers --out '" + (t / "empty") + "'"));
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(fs::exists(t / "empty/model_index.json"));
  EXPECT_TRUE(siblings_with(t / "x", "partial").empty());
  EXPECT_TRUE(siblings_with(t / "x", ".old-").empty());
  EXPECT_TRUE(siblings_with(t.str(), "partial").empty());
}

TEST(MakeCheckpointCli, FailureMidwayLeavesNothingBehind) {
  TempDir t;
  fs::create_directories(t / "keep");
  { std::ofstream(t / "keep/marker") << "old checkpoint"; }
  // Files larger than 2 MB cannot be written (RLIMIT_FSIZE; SIGXFSZ ignored so write() fails with
  // EFBIG): the first DiT file fails after the configs are written.
  const std::string limit = "trap '' XFSZ; ulimit -f 2048; ";
  RunResult a = run(limit + wan_cmd("--config tiny --layout official --out '" + (t / "new") + "'"));
  EXPECT_NE(a.code, 0) << a.out;
  EXPECT_EQ(a.out.rfind("error: ", 0), 0u) << a.out;
  EXPECT_FALSE(fs::exists(t / "new"));
  RunResult b = run(limit + wan_cmd("--config tiny --layout diffusers --force --out '" + (t / "keep") + "'"));
  EXPECT_NE(b.code, 0) << b.out;
  EXPECT_EQ(slurp(t / "keep/marker"), "old checkpoint");
  EXPECT_EQ(files_under(t / "keep"), std::vector<std::string>{"marker"});
  EXPECT_TRUE(siblings_with(t.str(), "partial").empty()) << "partial folder left behind";
  EXPECT_TRUE(siblings_with(t.str(), ".old-").empty());
}

// ---------------------------------------------------------------------------------------------
// Reference check through Python

// {entry: {"kind", "config" (the file we write), "tensors": {reference name: shape}}} for the
// real-size configs, mapped to the diffusers / transformers names.
json real_shapes() {
  json j;
  auto tensors = [](const std::vector<WeightSpec>& ps, const std::function<std::string(const std::string&)>& map) {
    json t = json::object();
    for (const auto& p : ps) t[map(p.name)] = p.shape.vec();
    return t;
  };
  for (const char* task : {"t2v-A14B", "i2v-A14B", "ti2v-5B"}) {
    DiTConfig c = dit_preset(task);
    c.num_layers = 2;  // every block has the same tensors; the meta model is built with the same depth
    j[std::string("dit_") + task] = {{"kind", "dit"},
                                     {"config", json::parse(dit_config_to_diffusers_json(c))},
                                     {"tensors", tensors(dit_weight_table(c), dit_official_to_diffusers)}};
  }
  T5Config t5 = t5_preset("umt5-xxl");
  j["t5_umt5-xxl"] = {{"kind", "t5"},
                      {"config", json::parse(t5_config_hf_json(t5))},
                      {"tensors", tensors(umt5_weight_table(t5), t5_official_to_hf)}};
  for (const char* v : {"wan2.1", "wan2.2"}) {
    VaeConfig c = vae_preset(v);
    j[std::string("vae_") + v] = {{"kind", "vae"},
                                  {"config", json::parse(vae_config_diffusers_json(c))},
                                  {"tensors", tensors(vae_weight_table(c), [&](const std::string& n) {
                                     return vae_official_to_diffusers(n, c.version);
                                   })}};
  }
  return j;
}

TEST(MakeCheckpointPython, ReferenceStacksLoadEveryComponent) {
  // One Python run (its start-up dominates): every task in a layout, the two layouts of two tasks
  // compared tensor by tensor, a 12-layer DiT for the activation-range check, and the real shapes.
  TempDir t;
  make_checkpoint(opts("tiny", Layout::Official, t / "t2v_off", 1));
  make_checkpoint(opts("tiny", Layout::Diffusers, t / "t2v_dif", 1));
  MakeCheckpointOptions deep = opts("tiny-i2v", Layout::Diffusers, t / "i2v_dif", 2);
  deep.layers = 12;
  make_checkpoint(deep);
  MakeCheckpointOptions ti = opts("tiny-ti2v", Layout::Official, t / "ti2v_off", 3);
  ti.dtype = DType::BF16;
  make_checkpoint(ti);
  ti.layout = Layout::Diffusers;
  ti.out = t / "ti2v_dif";
  make_checkpoint(ti);
  { std::ofstream(t / "real_shapes.json") << real_shapes().dump(); }
  const std::string py = std::string(WAN_PYTHON) + " '" + WAN_SOURCE_DIR + "/tools/verify_checkpoint.py'";
  RunResult r = run(py + " --depth-check '" + (t / "t2v_off") + "' '" + (t / "t2v_dif") + "' '" + (t / "i2v_dif") +
                    "' '" + (t / "ti2v_off") + "' '" + (t / "ti2v_dif") + "' --compare '" + (t / "t2v_off") + "' '" +
                    (t / "t2v_dif") + "' --compare '" + (t / "ti2v_off") + "' '" + (t / "ti2v_dif") +
                    "' --real-shapes '" + (t / "real_shapes.json") + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("all checks passed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  // The checks really ran: strict loads, the pipeline, both comparisons, all 12 blocks, the real shapes.
  for (const char* s :
       {"transformer_2: strict load", "WanImageToVideoPipeline.from_pretrained", "WanPipeline.from_pretrained",
        "hold identical tensors", "12 blocks", "real-size dit_t2v-A14B", "real-size t5_umt5-xxl",
        "real-size vae_wan2.2", "Wan2.2_VAE.pth: 196 tensors with the official names"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in:\n" << r.out;
}

}  // namespace
