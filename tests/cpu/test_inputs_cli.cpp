// What `wan` does with questionable inputs, run as a user runs it (the binary at WAN_BINARY): prompts
// that are cut or not UTF-8, a checkpoint whose config disagrees with its tensors or whose files are
// damaged, and the one-line messages and exit codes of every such case (README "Exit codes").
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "formats/safetensors.h"
#include "run_util.h"

namespace fs = std::filesystem;
using wan::cat;
using wan::test::TempDir;
using Result = wan::test::RunResult;

namespace {

Result run_wan(const std::vector<std::string>& args) { return wan::test::run_captured(WAN_BINARY, args); }

// A fresh tiny random checkpoint (official layout) in `dir`.
std::string tiny_model(const TempDir& t, const std::string& name = "tiny") {
  const std::string ck = t / name;
  const Result m = run_wan({"make-checkpoint", "--config", "tiny", "--layout", "official", "--output", ck});
  EXPECT_EQ(m.code, 0) << m.err;
  return ck;
}

// Replaces `"key": <number>` in a JSON config file.
void set_config_number(const std::string& file, const std::string& key, const std::string& value) {
  std::string s = wan::test::slurp(file);
  const std::regex re("\"" + key + "\": *[0-9]+");
  ASSERT_TRUE(std::regex_search(s, re)) << file << " has no " << key;
  s = std::regex_replace(s, re, "\"" + key + "\": " + value);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << s;
}

std::vector<std::string> generate(const std::string& model, const std::string& prompt, const std::string& out) {
  return {"generate", "--model", model, "--prompt", prompt, "--size", "32x32", "--frames", "5",
          "--steps", "2", "--seed", "3", "--output", out};
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

// The official code tokenizes to the DiT's text_len: a config with text_len 4 runs (the prompt cut to
// 3 tokens + EOS) instead of failing inside the DiT, and the cut is said, with its size.
TEST(PromptsCli, ShortTextLenCutsThePromptAndSaysSo) {
  TempDir t;
  const std::string ck = tiny_model(t);
  for (const char* expert : {"high_noise_model", "low_noise_model"})
    set_config_number(ck + "/" + expert + "/config.json", "text_len", "4");
  const Result r = run_wan(generate(ck, "a red fox runs through the snow at dawn", t / "o.y4m"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(t / "o.y4m"));
  const std::smatch m = [&] {
    std::smatch mm;
    std::regex_search(r.err, mm, std::regex("has ([0-9]+) tokens but the model takes 3 \\(and EOS\\): its last ([0-9]+) "
                                            "tokens are dropped"));
    return mm;
  }();
  ASSERT_EQ(m.size(), 3u) << r.err;
  EXPECT_EQ(std::stoi(m[1]) - std::stoi(m[2]), 3) << r.err;
}

// Over 512 tokens with the real text_len: the run goes on with the first 511 and says how many went.
TEST(PromptsCli, PromptOverTheLimitSaysHowManyTokensWereDropped) {
  TempDir t;
  const std::string ck = tiny_model(t);
  std::string longp;
  for (int i = 0; i < 700; ++i) longp += "fox ";
  Result r = run_wan(generate(ck, longp, t / "o.y4m"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("but the model takes 511 (and EOS): its last "), std::string::npos) << r.err;
  r = run_wan(generate(ck, "a short prompt", t / "p.y4m"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("dropped"), std::string::npos) << r.err;
}

// Invalid UTF-8 is refused before any work, in one line that quotes the text printably.
TEST(PromptsCli, InvalidUtf8IsRefusedInOneLine) {
  TempDir t;
  const std::string ck = tiny_model(t);
  for (const std::vector<std::string>& args :
       {generate(ck, "caf\xe9 \x1b[31mred", t / "o.y4m"),
        std::vector<std::string>{"encode-prompt", "--model", ck, "--prompt", "\xff\xfe", "--output", t / "e.st"}}) {
    const Result r = run_wan(args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("not valid UTF-8"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "a raw escape byte reached the terminal: " << r.err;
    EXPECT_FALSE(fs::exists(t / "o.y4m"));
    EXPECT_FALSE(fs::exists(t / "e.st"));
  }
}

// Values that parse but make no sense, and forgotten values, name the option (not a later argument).
TEST(PromptsCli, ForgottenValueAndNonFiniteScale) {
  TempDir t;
  const std::string ck = tiny_model(t);
  Result r = run_wan({"generate", "--model", ck, "--prompt", "--output", t / "o.y4m"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("option --prompt needs a value, but the next argument is the option --output"),
            std::string::npos)
      << r.err;
  std::vector<std::string> a = generate(ck, "a fox", t / "o.y4m");
  a.insert(a.end(), {"--guide-scale", "inf"});
  r = run_wan(a);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("'inf' must be a finite number"), std::string::npos) << r.err;
}

namespace {

void truncate_by_one(const std::string& file) {
  const auto n = fs::file_size(file);
  fs::resize_file(file, n - 1);
}

}  // namespace

// A damaged expert file is found while planning, before the text encoder loads, whatever expert the
// schedule would use first, and even when the schedule gives that expert no step.
TEST(CheckpointCli, DamagedExpertIsRefusedBeforeAnyModelLoads) {
  TempDir t;
  for (const char* expert : {"high_noise_model", "low_noise_model"}) {
    const std::string ck = tiny_model(t, expert);
    truncate_by_one(ck + "/" + expert + "/diffusion_pytorch_model.safetensors");
    std::vector<std::string> a = generate(ck, "a red fox", t / "o.y4m");
    a.insert(a.end(), {"--steps", "1"});  // one step: the high-noise expert's only
    const Result r = run_wan(a);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(std::string(expert) + "/diffusion_pytorch_model.safetensors"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("text encoder"), std::string::npos) << "refused only after loading: " << r.err;
    EXPECT_FALSE(fs::exists(t / "o.y4m"));
  }
}

// A config that disagrees with its tensors is an error naming the first mismatch, in generate and in
// inspect (which prints its report and exits 2); the untouched checkpoint is ok with exit 0.
TEST(CheckpointCli, ConfigThatDisagreesWithItsTensorsIsAnError) {
  TempDir t;
  const std::string ck = tiny_model(t);
  Result r = run_wan({"inspect", ck});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("status: ok"), std::string::npos) << r.out;
  for (const char* expert : {"high_noise_model", "low_noise_model"})
    set_config_number(ck + "/" + expert + "/config.json", "num_layers", "1");
  r = run_wan(generate(ck, "a red fox", t / "o.y4m"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("tensor 'blocks.1."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does the config match the weights?"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t / "o.y4m"));
  r = run_wan({"inspect", ck});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("status: INCOMPLETE"), std::string::npos) << r.out;
}

// Work that cannot fit, or exceeds the DiT's RoPE, is refused in under a second with one line that
// says what was asked, what it needs and what fits: generate, decode and forward alike.
TEST(MemoryCli, RequestsThatCannotFitAreRefusedAtOnce) {
  TempDir t;
  const std::string ck = tiny_model(t);
  const std::string big = t / "big.safetensors";
  wan::Tensor lat = wan::Tensor::empty(wan::DType::F32, {16, 1, 512, 512});
  for (int64_t i = 0; i < lat.numel(); ++i) lat.f32()[i] = 0.5f;
  wan::write_safetensors(big, {{"latents", lat}});
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"generate", "--model", ck, "--prompt", "cat", "--size", "192x128", "--frames", "100001", "--steps", "1",
        "--output", t / "o.y4m"},
       "--frames 100001: 25001 latent frames exceed the DiT's RoPE"},
      {{"generate", "--model", ck, "--prompt", "cat", "--size", "16000x16000", "--frames", "1", "--steps", "1",
        "--output", t / "o.y4m"},
       "of host memory (weights "},
      {{"decode", "--model", ck, "--latents", big, "--output", t / "d.y4m"},
       "decoding [16, 1, 512, 512] latents (1 frames at 4096x4096) needs "},
      {{"forward", "--model", ck, "--size", "100000x100000", "--frames", "1"}, "token grid exceeds the DiT's RoPE"},
  };
  // Planned for a machine of 16 GB (WAN_HOST_MEMORY), so the refusals do not depend on this one's RAM.
  const std::vector<std::string> env = {"WAN_HOST_MEMORY=16000000000"};
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = wan::test::run_captured(WAN_BINARY, c.args, &env);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.code, 2) << c.args[0] << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
    EXPECT_LT(s, 5.0) << c.args[0] << " took " << s << " s to refuse";
    EXPECT_FALSE(fs::exists(t / "o.y4m"));
    EXPECT_FALSE(fs::exists(t / "d.y4m"));
  }
}
