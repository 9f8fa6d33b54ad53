// `wan generate` from ComfyUI component files (--dit-high / --dit-low / --dit, --text-encoder, --vae,
// --tokenizer) instead of a model folder, as a user runs it: the same latents as the folder run of the
// same random weights (bit for bit with the same prompt embeddings and bf16 DiTs; within the fp16
// rounding of ComfyUI's text encoder otherwise), the TI2V-5B single --dit, and the refusals (exit 2, one
// line, before any model loads).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "run_util.h"
#include "tensor_compare.h"

namespace fs = std::filesystem;
using wan::test::load_tensor;
using wan::test::max_rel;
using wan::test::TempDir;

namespace {

wan::test::RunResult run_wan(const std::vector<std::string>& args) {
  return wan::test::run_captured(WAN_BINARY, args);
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Pair {
  TempDir t{"components_cli"};
  std::string folder = t / "official", comfy = t / "comfy";
  std::vector<std::string> files;  // the component options
};

// The tiny config written as an official folder and as ComfyUI files (bf16 DiTs in both).
void make_pair(Pair& p, const char* config, bool two_experts) {
  ASSERT_EQ(run_wan({"make-checkpoint", "--config", config, "--layout", "official", "--dtype", "bf16", "--output",
                     p.folder})
                .code,
            0);
  const auto r = run_wan({"make-checkpoint", "--config", config, "--layout", "comfyui", "--dtype", "bf16", "--output",
                          p.comfy});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string d = p.comfy + "/diffusion_models/";
  if (two_experts)
    p.files = {"--dit-high", d + "wan2.2_t2v_high_noise_14B_bf16.safetensors", "--dit-low",
               d + "wan2.2_t2v_low_noise_14B_bf16.safetensors"};
  else
    p.files = {"--dit", d + "wan2.2_ti2v_5B_bf16.safetensors"};
  const bool v22 = !two_experts;
  p.files = plus(p.files, {"--text-encoder", p.comfy + "/text_encoders/umt5_xxl_fp16.safetensors", "--vae",
                           p.comfy + (v22 ? "/vae/wan2.2_vae.safetensors" : "/vae/wan_2.1_vae.safetensors"),
                           "--tokenizer", p.comfy + "/tokenizer"});
}

std::vector<std::string> run_args(const TempDir& t, const std::string& name, int frames, const char* size) {
  return {"generate", "--prompt", "a red fox in the snow", "--size", size, "--frames", std::to_string(frames),
          "--steps", "3", "--seed", "7", "--save-latents", t / (name + ".safetensors"), "--output",
          t / (name + ".y4m")};
}

}  // namespace

TEST(ComponentsCli, SameLatentsAsTheFolderRun) {
  Pair p;
  make_pair(p, "tiny", true);
  const TempDir& t = p.t;
  // The prompt encoded once by the folder's text encoder: both runs then differ only in where the DiT
  // and VAE come from, and the bf16 DiTs hold the same values: bit-identical latents.
  ASSERT_EQ(run_wan({"encode-prompt", "--model", p.folder, "--prompt", "a red fox", "--output", t / "pe.safetensors"}).code, 0);
  ASSERT_EQ(run_wan({"encode-prompt", "--model", p.folder, "--default-negative", "--output", t / "ne.safetensors"}).code, 0);
  auto embeds = [&](std::vector<std::string> a) {
    a.erase(a.begin() + 1, a.begin() + 3);  // no --prompt
    return plus(a, {"--prompt-embeds", t / "pe.safetensors", "--negative-prompt-embeds", t / "ne.safetensors"});
  };
  auto r = run_wan(plus(embeds(run_args(t, "folder_e", 5, "64x64")), {"--model", p.folder}));
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> files = p.files;
  files.erase(files.begin() + 4, files.begin() + 6);  // no text encoder needed
  r = run_wan(plus(embeds(run_args(t, "comfy_e", 5, "64x64")), files));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("comfyui"), std::string::npos);
  const wan::Tensor a = load_tensor(t / "folder_e.safetensors", "latents");
  const wan::Tensor b = load_tensor(t / "comfy_e.safetensors", "latents");
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()));

  // The whole run from the files, text encoder included: ComfyUI's is fp16 (the folder's bf16).
  ASSERT_EQ(run_wan(plus(run_args(t, "folder", 5, "64x64"), {"--model", p.folder})).code, 0);
  r = run_wan(plus(run_args(t, "comfy", 5, "64x64"), p.files));
  ASSERT_EQ(r.code, 0) << r.err;
  const double d = max_rel(load_tensor(t / "comfy.safetensors", "latents"), load_tensor(t / "folder.safetensors", "latents"));
  EXPECT_LT(d, 2e-3);
  EXPECT_GT(fs::file_size(t / "comfy.y4m"), 0u);
}

TEST(ComponentsCli, Ti2vFromOneDitFile) {
  Pair p;
  make_pair(p, "tiny-ti2v", false);
  const TempDir& t = p.t;
  ASSERT_EQ(run_wan(plus(run_args(t, "folder", 5, "64x64"), {"--model", p.folder})).code, 0);
  const auto r = run_wan(plus(run_args(t, "comfy", 5, "64x64"), p.files));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_LT(max_rel(load_tensor(t / "comfy.safetensors", "latents"), load_tensor(t / "folder.safetensors", "latents")),
            2e-3);
}

TEST(ComponentsCli, RefusalsAreOneLineExitTwo) {
  Pair p;
  make_pair(p, "tiny", true);
  const TempDir& t = p.t;
  const std::string d = p.comfy + "/diffusion_models/";
  const std::vector<std::vector<std::string>> cases = {
      {"--dit-high", d + "wan2.2_t2v_high_noise_14B_bf16.safetensors"},              // no low expert
      plus(p.files, {"--model", p.folder}),                                          // two ways at once
      {"--dit-high", d + "wan2.2_t2v_high_noise_14B_bf16.safetensors", "--dit-low",  // a VAE as the low expert
       p.comfy + "/vae/wan_2.1_vae.safetensors"},
      {"--dit-high", t / "missing.safetensors", "--dit-low", d + "wan2.2_t2v_low_noise_14B_bf16.safetensors"},
  };
  for (const auto& c : cases) {
    const auto r = run_wan(plus(run_args(t, "bad", 5, "64x64"), c));
    EXPECT_EQ(r.code, 2) << r.err;
    int lines = 0;
    for (char ch : r.err) lines += ch == '\n';
    EXPECT_EQ(lines, 1) << r.err;
    EXPECT_EQ(r.out.find("load DiT"), std::string::npos);
    EXPECT_FALSE(fs::exists(t / "bad.y4m"));
  }
}
