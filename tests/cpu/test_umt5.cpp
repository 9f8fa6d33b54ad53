// UMT5 encoder CPU reference against transformers' UMT5EncoderModel (float32):
// - committed tiny model (tests/fixtures/text/umt5, HF names, loaded through t5_hf_loader which maps
//   names with t5_official_to_hf) and its outputs for four prompts with padding;
// - a fresh tiny model with a new seed each run, written and evaluated by the oracle at run time;
// - relative position buckets against torch's for |rel| <= 1100 and against spec §4.2's table;
// - the end-to-end path tokenizer -> encoder on the test tokenizer's vocabulary;
// - errors: missing tensor, wrong shape, token id out of range.
// Tolerance: max |ours - ref| <= 1e-4 * max |ref| per prompt (fp32 vs fp32, different summation order).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "formats/safetensors.h"
#include "text/tokenizer.h"
#include "models/umt5/umt5_cpu.h"

namespace fs = std::filesystem;
using namespace wan;

namespace {

const std::string kFx = std::string(WAN_FIXTURES) + "/text";

T5Config tiny_config(int vocab) {
  T5Config c;
  c.vocab = vocab;
  c.dim = 64;
  c.dim_attn = 64;
  c.dim_ffn = 128;
  c.num_heads = 4;
  c.num_layers = 2;
  return c;
}

// max |a - b| / max |b| over n values.
double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

// Compares forward (all rows, masked) and encode (real rows) with the oracle's cases.
void check_cases(const std::string& model_dir, const std::string& cases_path, int vocab) {
  const SafetensorsSet set = SafetensorsSet::open(model_dir + "/model.safetensors");
  const T5Config cfg = tiny_config(vocab);
  const T5Weights w = load_t5_weights(cfg, t5_hf_loader(set));
  const SafetensorsSet cases = SafetensorsSet::open(cases_path);
  const Tensor ids = cases.get("input_ids"), mask = cases.get("attention_mask");
  const Tensor ref = cases.get("last_hidden_state").to_f32();
  const int64_t B = ids.dim(0), L = ids.dim(1), D = cfg.dim;
  ASSERT_EQ(ref.shape(), Shape({B, L, D}));
  const int32_t* id = static_cast<const int32_t*>(ids.data());
  const int32_t* m = static_cast<const int32_t*>(mask.data());
  int padded = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t len = 0;
    while (len < L && m[b * L + len]) ++len;
    padded += len < L;
    const float* r = ref.f32() + b * L * D;
    const Tensor full = t5_forward(cfg, w, id + b * L, m + b * L, L);
    ASSERT_EQ(full.shape(), Shape({L, D}));
    EXPECT_LE(rel_err(full.f32(), r, L * D), 1e-4) << "prompt " << b << " (all " << L << " rows, masked)";
    const Tensor enc = t5_encode(cfg, w, id + b * L, len);
    ASSERT_EQ(enc.shape(), Shape({len, D}));
    EXPECT_LE(rel_err(enc.f32(), r, len * D), 1e-4) << "prompt " << b << " (first " << len << " rows)";
    // The padded rows do not influence the real ones: encode == forward on those rows, bit for bit
    // up to the masked softmax terms (which are exact zeros).
    EXPECT_LE(rel_err(enc.f32(), full.f32(), len * D), 1e-6) << "prompt " << b;
  }
  EXPECT_GE(padded, 2);
}

}  // namespace

TEST(Umt5, RelativeBucketsMatchTorchAndSpec) {
  const SafetensorsSet cases = SafetensorsSet::open(kFx + "/umt5_cases.safetensors");
  const Tensor rel = cases.get("rel_positions"), buckets = cases.get("buckets");
  ASSERT_EQ(rel.numel(), buckets.numel());
  for (int64_t i = 0; i < rel.numel(); ++i) {
    const int32_t r = static_cast<const int32_t*>(rel.data())[i];
    EXPECT_EQ(t5_relative_bucket(r, 32, 128), static_cast<const int32_t*>(buckets.data())[i]) << "rel " << r;
  }
  // Spec §4.2: |rel| 0-7 -> 0-7, 8-11 -> 8, 12-15 -> 9, 16-22 -> 10, 23-31 -> 11, 32-45 -> 12,
  // 46-63 -> 13, 64-90 -> 14, >= 91 -> 15; +16 when the key is after the query.
  const int edges[][2] = {{8, 8}, {11, 8}, {12, 9}, {15, 9}, {16, 10}, {22, 10}, {23, 11}, {31, 11}, {32, 12},
                          {45, 12}, {46, 13}, {63, 13}, {64, 14}, {90, 14}, {91, 15}, {511, 15}, {100000, 15}};
  for (const auto& e : edges) {
    EXPECT_EQ(t5_relative_bucket(-e[0], 32, 128), e[1]) << "rel -" << e[0];
    EXPECT_EQ(t5_relative_bucket(e[0], 32, 128), 16 + e[1]) << "rel +" << e[0];
  }
  for (int n = 0; n < 8; ++n) {
    EXPECT_EQ(t5_relative_bucket(-n, 32, 128), n);
    EXPECT_EQ(t5_relative_bucket(n, 32, 128), n == 0 ? 0 : 16 + n);
  }
}

TEST(Umt5, CommittedTinyModelMatchesTransformers) { check_cases(kFx + "/umt5", kFx + "/umt5_cases.safetensors", 1600); }

TEST(Umt5, FreshTinyModelMatchesTransformers) {
  ASSERT_TRUE(fs::exists(WAN_PYTHON)) << "python oracle missing: " << WAN_PYTHON;
  const uint64_t seed = (static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count()) ^
                         std::random_device{}()) % 1000000007ULL;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const fs::path dir = fs::temp_directory_path() / ("wan_test_umt5_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const int vocab = 900 + static_cast<int>(seed % 700);
  const std::string cmd = std::string("'") + WAN_PYTHON + "' '" + WAN_SOURCE_DIR + "/tools/make_text_fixtures.py' --umt5 '" +
                          dir.string() + "' --seed " + std::to_string(seed) + " --vocab " + std::to_string(vocab) +
                          " > '" + dir.string() + ".log' 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  check_cases(dir.string(), (dir / "cases.safetensors").string(), vocab);
  fs::remove_all(dir);
  fs::remove(dir.string() + ".log");
}

TEST(Umt5, TokenizerToEncoder) {
  const text::Tokenizer tok = text::Tokenizer::load(kFx + "/tokenizer");
  ASSERT_EQ(tok.vocab_size(), 1600);
  const SafetensorsSet set = SafetensorsSet::open(kFx + "/umt5/model.safetensors");
  const T5Config cfg = tiny_config(tok.vocab_size());
  const T5Weights w = load_t5_weights(cfg, t5_hf_loader(set));
  const text::Encoding e = tok.encode("A cat 😀 runs in the forest, 电影感 <extra_id_0> slow motion");
  const Tensor out = t5_encode(cfg, w, e.ids.data(), e.length);
  ASSERT_EQ(out.shape(), Shape({e.length, cfg.dim}));
  const Tensor full = t5_forward(cfg, w, e.ids.data(), e.mask.data(), tok.max_length());
  EXPECT_LE(rel_err(out.f32(), full.f32(), e.length * cfg.dim), 1e-6);
  double norm = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) norm += std::fabs(out.f32()[i]);
  EXPECT_GT(norm, 0.0);
}

TEST(Umt5, ErrorsNameTheTensor) {
  const SafetensorsSet set = SafetensorsSet::open(kFx + "/umt5/model.safetensors");
  const T5TensorLoader hf = t5_hf_loader(set);
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error (expected one mentioning " << needle << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Missing tensor: a loader that lacks one block weight.
  expect_error([&] {
    load_t5_weights(tiny_config(1600), [&](const std::string& n) -> Tensor {
      if (n == "blocks.1.ffn.fc1.weight") WAN_THROW("missing tensor ", n);
      return hf(n);
    });
  }, "blocks.1.ffn.fc1.weight");
  // Wrong shape: the config says 3 layers and a wider FFN.
  T5Config wide = tiny_config(1600);
  wide.dim_ffn = 256;
  expect_error([&] { load_t5_weights(wide, hf); }, "blocks.0.ffn.gate.0.weight");
  T5Config deep = tiny_config(1600);
  deep.num_layers = 3;
  expect_error([&] { load_t5_weights(deep, hf); }, "encoder.block.2");
  // Token id outside the vocabulary.
  const T5Weights w = load_t5_weights(tiny_config(1600), hf);
  const int32_t ids[3] = {5, 1600, 1};
  expect_error([&] { t5_encode(tiny_config(1600), w, ids, 3); }, "1600");
  const int32_t mask[3] = {0, 0, 0};
  expect_error([&] { t5_forward(tiny_config(1600), w, ids, mask, 3); }, "mask");
}
