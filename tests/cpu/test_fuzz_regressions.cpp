// Inputs that crashed a reader under the fuzz targets (tests/fuzz), each replayed through that reader,
// which must now answer with a one-line wan::Error. Inputs come from tests/fuzz/regressions/<target>/
// (the smoke run replays the same files) or, where the crash needs a size a committed file should not
// have (nesting 300000 deep), are built here. Each test fails without its fix: a wrong or missing
// error, a crash, or (for the memchr of an empty file) a report of the sanitizer build.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "ckpt/layout.h"
#include "core/error.h"
#include "formats/pth.h"
#include "formats/safetensors.h"
#include "formats/zip.h"
#include "pipeline/models.h"
#include "testing/make_checkpoint.h"
#include "models/config.h"
#include "pipeline/files.h"
#include "pipeline/pipeline.h"
#include "test_util.h"
#include "testing/tokenizer_files.h"
#include "text/tokenizer.h"

namespace wan {
namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;
using test::TempDir;

std::string regression(const std::string& target, const std::string& name) {
  const fs::path p = fs::path(WAN_SOURCE_DIR) / "tests" / "fuzz" / "regressions" / target / name;
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void expect_error_with(const std::function<void()>& f, const std::string& part) {
  const std::string msg = test::error_of(f);
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
}

std::string nested(const std::string& prefix, size_t depth, const std::string& suffix) {
  return prefix + std::string(depth, '[') + std::string(depth, ']') + suffix;
}
constexpr size_t kDeep = 300000;  // overflows the stack of a recursive dump() or copy in any build

// An empty index file maps to a null pointer, which the NUL scan passed to memchr.
TEST(FuzzRegressions, EmptySafetensorsIndex) {
  TempDir tmp("fuzzreg");
  const std::string p = tmp / "model.safetensors.index.json";
  write(p, regression("safetensors_index", "empty_index.json"));
  expect_error_with([&] { SafetensorsSet::open(p); }, "index is not valid JSON");
}

// Config numbers that do not fit an int: the float was cast first (undefined for 1e300), the
// diffusers width multiplied in int, the inferred sizes truncated to int.
TEST(FuzzRegressions, ConfigNumbersOutOfIntRange) {
  expect_error_with([] { dit_config_from_json(regression("config", "float_out_of_int_range.json")); },
                    "config key 'dim' out of range: 1e+300");
  expect_error_with([] { dit_config_from_json(regression("config", "diffusers_dim_overflow.json")); },
                    "num_attention_heads 65536 x attention_head_dim 65536 = 4294967296 is out of range");
  std::map<std::string, Shape> shapes;
  for (const auto& [name, s] : dit_expected_shapes(dit_preset("tiny"))) shapes[name] = s;
  shapes["head.modulation"] = Shape{1, 6, (int64_t{1} << 32) + 256};
  expect_error_with([&] { dit_config_from_shapes(shapes); }, "dim (head.modulation [1, 6, 4294967552]) 4294967552 is out of range");
}

// A config whose sizes pass every old check but overflow the parameter count (and any buffer size).
TEST(FuzzRegressions, ConfigSizesAreBounded) {
  expect_error_with([] { dit_config_from_json(regression("config", "param_count_overflow.json")); },
                    "a size is out of range");
  for (const char* preset : {"t2v-A14B", "i2v-A14B", "ti2v-5B", "tiny"}) EXPECT_NO_THROW(dit_preset(preset).validate());
}

// JSON nested deeper than the stack allows for nlohmann's recursive dump() and copies.
TEST(FuzzRegressions, DeeplyNestedConfig) {
  expect_error_with([] { dit_config_from_json(nested(R"({"_class_name": "WanModel", "dim": )", kDeep, "}")); },
                    "nested deeper than 32 levels");
  TempDir tmp("fuzzreg");
  write(tmp / "config.json", nested(R"({"_class_name": "WanModel", "x": )", kDeep, "}"));
  write(tmp / "diffusion_pytorch_model.safetensors", "");
  expect_error_with([&] { detect_checkpoint(tmp.str()); }, "config.json: JSON nested deeper than 32 levels");
  // The committed input (shallower, enough under AddressSanitizer) gives the same error.
  write(tmp / "config.json", regression("config", "deep_nesting.json"));
  expect_error_with([&] { detect_checkpoint(tmp.str()); }, "nested deeper than 32 levels");
}

// The VAE's and the text encoder's config.json (diffusers layout) go through the same limit.
TEST(FuzzRegressions, DeeplyNestedComponentConfigs) {
  TempDir tmp("fuzzreg_vae");
  gen::MakeCheckpointOptions o;
  o.config = "tiny";
  o.layout = Layout::Diffusers;
  o.out = tmp / "ck";
  (void)gen::make_checkpoint(o);
  const CheckpointInfo info = detect_checkpoint(o.out);
  write(tmp / "ck/vae/config.json", nested(R"({"_class_name": "AutoencoderKLWan", "base_dim": )", kDeep, "}"));
  expect_error_with([&] { (void)vae_config_for(info); }, "vae/config.json: JSON nested deeper than 32 levels");
  write(tmp / "ck/text_encoder/config.json", nested(R"({"d_model": )", kDeep, "}"));
  expect_error_with([&] { (void)t5_config_for(info); }, "config.json: JSON nested deeper than 32 levels");
}

// Tokenizer files: special ids that are not ints (1e300) or leave no room for "largest id + 1", and a
// normalizer list nested too deep to copy.
TEST(FuzzRegressions, TokenizerJson) {
  TempDir tmp("fuzzreg");
  gen::write_tokenizer_dir(tmp.str());
  auto load_with = [&](const std::string& tokenizer_json) {
    write(tmp / "tokenizer.json", tokenizer_json);
    text::Tokenizer::load(tmp.str());
  };
  expect_error_with([&] { load_with(regression("tokenizer", "special_id_overflow.json")); },
                    "token id 2147483647 is not an integer in [0, 2147483647)");
  expect_error_with([&] { load_with(regression("tokenizer", "special_id_float.json")); },
                    "token id 1e+300 is not an integer");
  expect_error_with([&] {
    load_with(nested(R"({"model": {"vocab": []}, "normalizer": {"type": "Sequence", "normalizers": [)", kDeep, "]}}"));
  }, "tokenizer.json: JSON nested deeper than 32 levels");
}

// Pickle opcodes of {"w": tensor} shared by both keys of every level: {"a": d, "b": d}.
std::string shared_dicts_pickle(int levels) {
  auto str = [](const std::string& s) {
    std::string o = "X";
    for (int i = 0; i < 4; ++i) o += static_cast<char>((s.size() >> (8 * i)) & 0xFF);
    return o + s;
  };
  const std::string tensor = "ctorch._utils\n_rebuild_tensor_v2\n((" + str("storage") + "ctorch\nFloatStorage\n" +
                             str("0") + str("cpu") + "K\x01tQK\x00K\x01\x85K\x01\x85\x89"s +
                             "ccollections\nOrderedDict\n)RtR";
  std::string p = "\x80\x02";
  for (int i = 0; i < levels; ++i) p += "}" + str("a");
  p += "}" + str("w") + tensor + "sq\0"s;
  for (int i = 0; i < levels; ++i)
    p += "s" + str("b") + "h" + std::string(1, static_cast<char>(i)) + "sq" + std::string(1, static_cast<char>(i + 1));
  return p + ".";
}

// One sub-dict under many keys multiplied the tensor list: 24 levels of a 1 KB file listed 2^24 tensors.
TEST(FuzzRegressions, PthSharedSubDicts) {
  TempDir tmp("fuzzreg");
  for (int levels : {1, 2}) {
    const std::string p = tmp / ("shared" + std::to_string(levels) + ".pth");
    zip::Writer w(p, {});
    const std::string pkl = shared_dicts_pickle(levels);
    w.add("archive/data.pkl", pkl.data(), pkl.size());
    w.add("archive/data/0", "\0\0\0\0", 4);
    w.finish();
    expect_error_with([&] { PthFile::open(p); }, "data.pkl reaches one dict through two keys");
  }
  write(tmp / "committed.pth", regression("pth", "shared_dicts.pth"));
  expect_error_with([&] { PthFile::open(tmp / "committed.pth"); }, "reaches one dict through two keys");
}

// A state file whose fingerprint nests deeper than the stack allows for dump().
TEST(FuzzRegressions, StateFingerprintIsFlat) {
  TempDir tmp("fuzzreg");
  RunState st;
  st.step = 1;
  st.latents = Tensor::empty(DType::F32, Shape{1, 1, 1, 1});
  st.latents.f32()[0] = 0.5f;
  st.prompt_embeds = Tensor::empty(DType::F32, Shape{1, 2});
  st.negative_embeds = Tensor::empty(DType::F32, Shape{1, 2});
  std::memset(st.prompt_embeds.data(), 0, 8);
  std::memset(st.negative_embeds.data(), 0, 8);
  st.timings.step_seconds = {1.0};
  st.fingerprint = nested(R"({"task": )", kDeep, "}");
  write_run_state(tmp / "deep.safetensors", st);
  expect_error_with([&] { read_run_state(tmp / "deep.safetensors"); }, "expected a JSON object of strings");
  st.fingerprint = R"({"task": "t2v-A14B", "steps": 4})";  // a number: not what plan_fingerprint writes
  write_run_state(tmp / "number.safetensors", st);
  expect_error_with([&] { read_run_state(tmp / "number.safetensors"); }, "expected a JSON object of strings");
  st.fingerprint = R"({"task": "t2v-A14B", "steps": "4"})";
  write_run_state(tmp / "ok.safetensors", st);
  EXPECT_EQ(read_run_state(tmp / "ok.safetensors").fingerprint, st.fingerprint);
  write(tmp / "committed.safetensors", regression("state_files", "deep_fingerprint.safetensors"));
  expect_error_with([&] { read_run_state(tmp / "committed.safetensors"); }, "expected a JSON object of strings");
}

}  // namespace
}  // namespace wan
