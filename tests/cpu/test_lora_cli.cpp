// `wan generate` with LoRAs, presets and explicit timesteps, run as a user runs them (the binary at
// WAN_BINARY): the diffusers end-to-end oracle of tests/fixtures/lora/e2e (a LoRA per expert fused by
// diffusers, 2 steps of WanPipeline) within 1e-4; strength 0 equal to no LoRA bit for bit; the same
// delta in official, kohya and PEFT keys giving identical latents; the plan's per-expert report; every
// refusal (exit 2, one line, before any model loads, no output); `wan presets`; --preset and
// --timesteps reaching the plan.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "run_util.h"
#include "tensor_compare.h"

namespace fs = std::filesystem;
using wan::cat;
using wan::test::load_tensor;
using wan::test::max_rel;
using wan::test::TempDir;

namespace {

const std::string kFix = std::string(WAN_FIXTURES);
const std::string kPipe = kFix + "/pipeline";
const std::string kE2e = kFix + "/lora/e2e";

wan::test::RunResult run_wan(const std::vector<std::string>& args) {
  return wan::test::run_captured(WAN_BINARY, args);
}

// The e2e fixture's run (tests/fixtures/lora/README.md), latents only.
std::vector<std::string> e2e_args(const std::string& latents) {
  return {"generate", "--model", kPipe + "/model", "--prompt-embeds", kPipe + "/prompt_embeds.safetensors",
          "--negative-prompt-embeds", kPipe + "/negative_prompt_embeds.safetensors", "--init-latents",
          kPipe + "/init_latents.safetensors", "--steps", "2", "--schedule", "diffusers", "--guide-scale", "3,4",
          "--save-latents", latents, "--output", latents + ".y4m"};
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST(LoraCli, PerExpertLorasMatchDiffusersEndToEnd) {
  TempDir t("lora_cli");
  const auto r = run_wan(plus(e2e_args(t / "lat.safetensors"), {"--lora-high", kE2e + "/high.safetensors:0.9",
                                                                 "--lora-low", kE2e + "/low.safetensors:0.7",
                                                                 "--verbose"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const wan::Tensor got = load_tensor(t / "lat.safetensors", "latents");
  const wan::Tensor want = load_tensor(kE2e + "/expected.safetensors", "latents");
  EXPECT_LE(max_rel(got, want), 1e-4);
  // The plan names each expert's file, its format and the tensors it changes (--verbose: the names).
  EXPECT_NE((r.out + r.err).find("lora     high-noise expert"), std::string::npos) << r.out;
  EXPECT_NE((r.out + r.err).find("lora     low-noise expert"), std::string::npos) << r.out;
  EXPECT_NE((r.out + r.err).find("kohya"), std::string::npos) << r.out;
  EXPECT_NE((r.out + r.err).find("blocks.0.self_attn.q.weight"), std::string::npos) << r.out;

  // Without the LoRAs the latents differ (the oracle above is not met by the base model).
  const auto b = run_wan(e2e_args(t / "base.safetensors"));
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_GT(max_rel(load_tensor(t / "base.safetensors", "latents"), want), 1e-3);
}

TEST(LoraCli, ScaleZeroIsTheBaseModelBitForBit) {
  TempDir t("lora_cli0");
  ASSERT_EQ(run_wan(e2e_args(t / "base.safetensors")).code, 0);
  const auto r = run_wan(plus(e2e_args(t / "zero.safetensors"),
                              {"--lora", kE2e + "/high.safetensors:0", "--lora-low", kE2e + "/low.safetensors:0"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(wan::test::slurp(t / "zero.safetensors").size(), wan::test::slurp(t / "base.safetensors").size());
  const wan::Tensor a = load_tensor(t / "base.safetensors", "latents"), z = load_tensor(t / "zero.safetensors", "latents");
  ASSERT_EQ(a.nbytes(), z.nbytes());
  EXPECT_EQ(0, std::memcmp(a.data(), z.data(), a.nbytes()));
}

TEST(LoraCli, SameDeltaInEveryKeyFormatGivesIdenticalLatents) {
  TempDir t("lora_fmt");
  std::vector<std::string> files;
  for (const char* fmt : {"official", "kohya", "peft"}) {
    fs::create_directories(t / fmt);
    const std::string f = t / (std::string(fmt) + "/l.safetensors");
    const auto m = run_wan({"make-lora", "--model", kPipe + "/model", "--rank", "3", "--alpha", "1.5", "--format", fmt,
                            "--dtype", "fp32", "--seed", "5", "--output", f});
    ASSERT_EQ(m.code, 0) << m.err;
    const auto r = run_wan(plus(e2e_args(t / (std::string(fmt) + ".safetensors")), {"--lora", f + ":2"}));
    ASSERT_EQ(r.code, 0) << r.err;
    files.push_back(t / (std::string(fmt) + ".safetensors"));
  }
  const wan::Tensor a = load_tensor(files[0], "latents");
  for (size_t i = 1; i < files.size(); ++i) {
    const wan::Tensor b = load_tensor(files[i], "latents");
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes())) << files[i];
  }
}

TEST(LoraCli, BadLorasAreOneLineExitTwoBeforeAnyModelLoads) {
  TempDir t("lora_bad");
  // Not safetensors; keys that match nothing; a shape that disagrees (a LoRA made for another config).
  const std::string junk = t / "junk.safetensors", other = t / "other.safetensors", nomatch = t / "nomatch.safetensors";
  { std::ofstream(junk) << "this is not a safetensors file at all"; }
  ASSERT_EQ(run_wan({"make-lora", "--config", "t2v-A14B", "--layers", "1", "--rank", "2", "--output", other}).code, 0);
  {
    // keys of no Wan module
    wan::Tensor x = wan::Tensor::f32(wan::Shape{2, 2});
    wan::write_safetensors(nomatch, {{"text_model.encoder.layers.0.q.lora_down.weight", x},
                                     {"text_model.encoder.layers.0.q.lora_up.weight", x}});
  }
  struct Case {
    std::vector<std::string> extra;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--lora", junk}, "junk.safetensors"},
      {{"--lora", t / "missing.safetensors"}, "missing.safetensors"},
      {{"--lora", nomatch}, "nomatch.safetensors"},
      {{"--lora-high", other}, "other.safetensors"},
      {{"--lora", ":0.5"}, "--lora"},
  };
  for (const Case& c : cases) {
    const std::string out = t / "out.safetensors";
    const auto r = run_wan(plus(e2e_args(out), c.extra));
    SCOPED_TRACE(c.extra.back());
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("load DiT"), std::string::npos) << r.out;  // refused while planning
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST(LoraCli, PresetsAreListedAndReachThePlan) {
  const auto l = run_wan({"presets"});
  ASSERT_EQ(l.code, 0) << l.err;
  EXPECT_NE(l.out.find("lightning-4step"), std::string::npos);
  EXPECT_NE(l.out.find("lightx2v-4step"), std::string::npos);
  const auto j = run_wan({"presets", "--json"});
  ASSERT_EQ(j.code, 0);
  EXPECT_NE(j.out.find("\"timesteps\": ["), std::string::npos);

  TempDir t("lora_preset");
  // The tiny random-weight A14B: a preset fills steps, schedule, shift, guide and solver; the user's
  // explicit option wins; --timesteps alone selects step-distill.
  auto plan = [&](const std::vector<std::string>& extra) {
    return run_wan(plus({"generate", "--weights", "random", "--config", "tiny", "--prompt", "a cat", "--size", "64x64",
                         "--frames", "5", "--save-latents", t / "l.safetensors", "--output", t / "l.y4m"},
                        extra));
  };
  auto r = plan({"--preset", "lightning-4step"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("euler, 4 steps, lightning schedule, shift 5, timesteps 1000 .. 625"), std::string::npos)
      << r.out;
  EXPECT_NE((r.out + r.err).find("(preset lightning-4step)"), std::string::npos);
  EXPECT_NE((r.out + r.err).find("high-noise 2 steps (guide 1), low-noise 2 steps (guide 1)"), std::string::npos) << r.out;
  r = plan({"--preset", "lightning-4step", "--shift", "3"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("shift 3"), std::string::npos) << r.out;
  r = plan({"--timesteps", "1000,750,500,250", "--shift", "5"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("step-distill, 4 steps, timesteps list, shift 5, timesteps 1000 .. 625"), std::string::npos)
      << r.out;
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--preset", "turbo"}, {"--timesteps", "1000,1000,500"}, {"--timesteps", "0,x"},
           {"--preset", "lightx2v-4step", "--steps", "6"}}) {
    r = plan(bad);
    EXPECT_EQ(r.code, 2) << bad.back() << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
  }
  r = run_wan({"generate", "--weights", "random", "--task", "ti2v-5B", "--config", "tiny2.2", "--prompt", "x",
               "--preset", "lightning-4step", "--output", t / "x.y4m"});
  EXPECT_EQ(r.code, 2) << r.err;
}
