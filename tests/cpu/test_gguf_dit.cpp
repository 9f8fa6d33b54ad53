// GGUF DiT files in the engine (ckpt/gguf_store.h through detect_checkpoint / detect_components and
// open_weights): the tiny T2V-A14B experts written as GGUF with every block type the GPU dequantises
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32; random blocks with small scales for
// the types our writer cannot quantise to) next to a safetensors twin holding their CPU dequantisation
// (gguf-py's, bit for bit: test_gguf.cpp) must give
// (a) identical tensors through open_weights, and raw spans that carry the ggml type;
// (b) `wan generate` from --dit-high / --dit-low GGUF files: the same latents as from the twins, bit for
//     bit (CPU float32), with the ComfyUI text encoder, VAE and tokenizer; `wan inspect` names the file's
//     task and its tensors' block types;
// (c) a truncated GGUF: one line, exit 2, before any model loads.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "core/dtype.h"
#include "formats/gguf_quant.h"
#include "formats/safetensors.h"
#include "run_util.h"
#include "tensor_compare.h"
#include "gguf_test_util.h"
#include "testing/gguf_writer.h"
#include "testing/make_checkpoint.h"

namespace fs = std::filesystem;
using namespace wan;
using wan::test::TempDir;

namespace {

using test::write_pair;

struct Files {
  TempDir t{"gguf_dit"};
  std::string comfy = t / "comfy";
  std::string high_gguf = t / "wan2.2_t2v_high_noise_14B_Q4_K_M.gguf", low_gguf = t / "wan2.2_t2v_low_noise_14B_Q4_K_M.gguf";
  std::string high_st = t / "wan2.2_t2v_high_noise_14B_deq.safetensors", low_st = t / "wan2.2_t2v_low_noise_14B_deq.safetensors";
  std::vector<std::string> types;
  Files() {
    gen::MakeCheckpointOptions o;
    o.config = "tiny";
    o.layout = Layout::ComfyUI;
    o.dtype = DType::F32;
    o.seed = 9;
    o.out = comfy;
    gen::make_checkpoint(o);
    const gen::ComfyUIFiles cf = gen::comfyui_files("tiny", DType::F32);
    ComponentFiles c;
    c.dit_high = comfy + "/" + cf.dit_high;
    c.dit_low = comfy + "/" + cf.dit_low;
    const CheckpointInfo info = detect_components(c);
    write_pair(*open_weights(info, Role::DiTHigh), high_gguf, high_st, 1, &types);
    write_pair(*open_weights(info, Role::DiTLow), low_gguf, low_st, 2, &types);
  }
  std::vector<std::string> others() const {
    const gen::ComfyUIFiles cf = gen::comfyui_files("tiny", DType::F32);
    return {"--text-encoder", comfy + "/" + cf.text_encoder, "--vae", comfy + "/" + cf.vae, "--tokenizer",
            comfy + "/" + cf.tokenizer};
  }
};

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(GgufDit, StoreServesTheDequantisedTensorsAndTypedSpans) {
  Files f;
  for (const char* t : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
    EXPECT_NE(std::find(f.types.begin(), f.types.end(), t), f.types.end()) << t << " not exercised";
  ComponentFiles g, s;
  g.dit_high = f.high_gguf;
  g.dit_low = f.low_gguf;
  s.dit_high = f.high_st;
  s.dit_low = f.low_st;
  const CheckpointInfo gi = detect_components(g), si = detect_components(s);
  EXPECT_TRUE(gi.gguf);
  EXPECT_EQ(gi.task, Task::T2V_A14B);
  EXPECT_TRUE(gi.dit == si.dit);
  for (Role r : {Role::DiTHigh, Role::DiTLow}) {
    auto a = open_weights(gi, r), b = open_weights(si, r);
    ASSERT_EQ(a->names(), b->names());
    int quantised = 0;
    for (const std::string& n : a->names()) {
      const Tensor x = a->get_f32(n), y = b->get_f32(n);
      ASSERT_EQ(x.nbytes(), y.nbytes()) << n;
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.nbytes())) << n;
      const auto span = a->raw_span(n);
      ASSERT_TRUE(span.has_value()) << n;
      quantised += span->ggml_type != 0;
      if (span->ggml_type != 0) EXPECT_EQ(span->dtype, DType::U8);
    }
    EXPECT_GT(quantised, 10);
  }
}

TEST(GgufDit, GenerateFromGgufExpertsEqualsTheDequantisedTwins) {
  Files f;
  TempDir t("gguf_gen");
  auto run = [&](const std::string& high, const std::string& low, const std::string& name) {
    return test::run_captured(WAN_BINARY, plus({"generate", "--dit-high", high, "--dit-low", low, "--prompt",
                                                "a lighthouse at night", "--size", "64x64", "--frames", "5",
                                                "--steps", "3", "--seed", "4", "--save-latents",
                                                t / (name + ".safetensors"), "--output", t / (name + ".y4m")},
                                               f.others()));
  };
  const auto a = run(f.high_gguf, f.low_gguf, "gguf");
  ASSERT_EQ(a.code, 0) << a.err;
  const auto b = run(f.high_st, f.low_st, "twin");
  ASSERT_EQ(b.code, 0) << b.err;
  const Tensor x = test::load_tensor(t / "gguf.safetensors", "latents"), y = test::load_tensor(t / "twin.safetensors", "latents");
  ASSERT_EQ(x.nbytes(), y.nbytes());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.nbytes()));
  const auto i = test::run_captured(WAN_BINARY, {"inspect", f.high_gguf});
  EXPECT_EQ(i.code, 0) << i.err;
  EXPECT_NE((i.out + i.err).find("t2v-A14B"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("format: gguf"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("Q4_K"), std::string::npos) << i.out;  // the block types as stored, not f32
  EXPECT_NE(i.out.find("Q8_0"), std::string::npos) << i.out;

  // A GGUF cut short: refused while planning (the header's tensor ranges pass the end of the file).
  const std::string cut = t / "wan2.2_t2v_high_noise_14B_cut.gguf";
  fs::copy_file(f.high_gguf, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  const auto c = run(cut, f.low_gguf, "cut");
  EXPECT_EQ(c.code, 2) << c.err;
  int lines = 0;
  for (char ch : c.err) lines += ch == '\n';
  EXPECT_EQ(lines, 1) << c.err;
  EXPECT_EQ(c.out.find("load DiT"), std::string::npos);
  EXPECT_FALSE(fs::exists(t / "cut.y4m"));
}
