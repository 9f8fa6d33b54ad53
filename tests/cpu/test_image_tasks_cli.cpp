// `wan generate` for the image-to-video tasks, run as a user runs it (the binary at WAN_BINARY): the
// I2V fixture's golden run through the CLI, byte-identical reruns, the official and diffusers layouts
// of one make-checkpoint model giving identical latents (tiny-i2v and tiny-ti2v, with an image), and
// every bad image input refused with exit 2, one line and no output file, before any model loads.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "run_util.h"
#include "tensor_compare.h"

namespace fs = std::filesystem;
using wan::cat;
using wan::test::TempDir;

namespace {

using wan::test::load_tensor;
using wan::test::max_rel;

const std::string kI2v = std::string(WAN_FIXTURES) + "/i2v";
const std::string kTi2v = std::string(WAN_FIXTURES) + "/ti2v";
using Result = wan::test::RunResult;

Result run_wan(const std::vector<std::string>& args) { return wan::test::run_captured(WAN_BINARY, args); }

// tests/fixtures/i2v/README.md's run.
std::vector<std::string> i2v_args(const TempDir& t) {
  return {"generate", "--model", kI2v + "/model", "--image", kI2v + "/image.png", "--prompt-embeds",
          kI2v + "/prompt_embeds.safetensors", "--negative-prompt-embeds", kI2v + "/negative_prompt_embeds.safetensors",
          "--init-latents", kI2v + "/init_latents.safetensors", "--steps", "4", "--schedule", "diffusers",
          "--guide-scale", "3,4", "--size", "64x48", "--frames", "9", "--output", t / "out.y4m", "--save-latents",
          t / "lat.safetensors"};
}

std::vector<std::string> ti2v_args(const TempDir& t) {
  return {"generate", "--model", kTi2v + "/model", "--prompt-embeds", kTi2v + "/prompt_embeds.safetensors",
          "--negative-prompt-embeds", kTi2v + "/negative_prompt_embeds.safetensors", "--init-latents",
          kTi2v + "/init_latents.safetensors", "--steps", "5", "--shift", "5", "--guide-scale", "5", "--size", "96x64",
          "--frames", "9", "--output", t / "out.y4m"};
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// exit 2, one line on stderr containing `want`, and no file left in t.
void expect_refused(const std::vector<std::string>& args, const TempDir& t, const std::string& want) {
  const Result r = run_wan(args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(t.files().empty()) << "outputs left behind";
}

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

}  // namespace

TEST(ImageTasksCli, I2vGoldenRunMatchesDiffusersAndRerunsByteIdentical) {
  TempDir t, j;
  Result r = run_wan(plus(i2v_args(t), {"--json", j / "run.json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("encode image"), std::string::npos) << r.err;
  const auto js = nlohmann::json::parse(wan::test::slurp(j / "run.json"));
  EXPECT_GT(js.at("timings").at("image_encode_s").get<double>(), 0.0) << js.dump();
  const double rel = max_rel(load_tensor(t / "lat.safetensors", "latents"), load_tensor(kI2v + "/expected.safetensors", "latents"));
  printf("  CLI i2v final latents max rel err vs diffusers %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  const std::string first = wan::test::slurp(t / "out.y4m"), lat = wan::test::slurp(t / "lat.safetensors");
  fs::remove(t / "out.y4m");
  fs::remove(t / "lat.safetensors");
  r = run_wan(i2v_args(t));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(wan::test::slurp(t / "out.y4m"), first);
  EXPECT_EQ(wan::test::slurp(t / "lat.safetensors"), lat);
}

TEST(ImageTasksCli, BothLayoutsGiveIdenticalLatents) {
  // One make-checkpoint model per task in the official and the diffusers layout (same values): the
  // same image and seed must give the same latents, byte for byte.
  TempDir t;
  struct Case {
    const char* config;
    std::string image, size;
  };
  for (const Case& c : {Case{"tiny-i2v", kI2v + "/image.png", "64x48"}, Case{"tiny-ti2v", kTi2v + "/image.png", "96x64"}}) {
    std::string lat[2];
    int i = 0;
    for (const char* layout : {"official", "diffusers"}) {
      const std::string ck = t / cat(c.config, "_", layout), out = t / cat(c.config, "_", layout, ".st");
      Result m = run_wan({"make-checkpoint", "--config", c.config, "--layout", layout, "--out", ck});
      ASSERT_EQ(m.code, 0) << m.err;
      Result r = run_wan({"generate", "--model", ck, "--image", c.image, "--prompt", "a red fox in the snow", "--size",
                          c.size, "--frames", "5", "--steps", "2", "--seed", "3", "--save-latents", out, "--output",
                          out + ".y4m"});
      ASSERT_EQ(r.code, 0) << c.config << " " << layout << ": " << r.err;
      lat[i++] = wan::test::slurp(out);
      fs::remove_all(ck);
    }
    EXPECT_FALSE(lat[0].empty()) << c.config;
    EXPECT_EQ(lat[0], lat[1]) << c.config;
  }
}

TEST(ImageTasksCli, BadImageInputIsRefusedBeforeAnyModelLoads) {
  TempDir t, in;
  const std::string text = in / "notes.txt", empty = in / "empty.png", bomb = in / "bomb.ppm";
  write(text, "this is not an image\n");
  write(empty, "");
  write(bomb, "P6\n100000 100000\n255\n");  // a header claiming 10^10 pixels
  auto no_image = i2v_args(t);
  no_image.erase(no_image.begin() + 3, no_image.begin() + 5);  // drop --image FILE
  expect_refused(no_image, t, "--image");
  auto with_image = [&](const std::string& f) {
    auto a = i2v_args(t);
    a[4] = f;
    return a;
  };
  expect_refused(with_image(in / "missing.png"), t, "--image");
  expect_refused(with_image(text), t, "--image");
  expect_refused(with_image(empty), t, "--image");
  expect_refused(with_image(bomb), t, "--image");
  expect_refused(with_image(in.str()), t, "--image");  // a directory
  // The task decides which images it takes.
  expect_refused(plus(ti2v_args(t), {"--image", kTi2v + "/image.png", "--last-image", kTi2v + "/image.png"}), t,
                 "--last-image");
  const std::string t2v = std::string(WAN_FIXTURES) + "/pipeline";
  expect_refused({"generate", "--model", t2v + "/model", "--prompt-embeds", t2v + "/prompt_embeds.safetensors",
                  "--negative-prompt-embeds", t2v + "/negative_prompt_embeds.safetensors", "--image",
                  kI2v + "/image.png", "--output", t / "x.y4m"},
                 t, "--image");
  // An output that is the image itself is refused (inputs are never overwritten).
  auto over = i2v_args(t);
  const std::string copy = in / "image_copy.png";
  fs::copy_file(kI2v + "/image.png", copy);
  over[4] = copy;
  for (size_t i = 0; i + 1 < over.size(); ++i)
    if (over[i] == "--save-latents") over[i + 1] = copy;
  const Result r = run_wan(over);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(wan::test::slurp(copy), wan::test::slurp(kI2v + "/image.png"));
}

TEST(ImageTasksCli, Ti2vRunsTextOnlyAndWithAnImage) {
  TempDir t;
  for (bool image : {false, true}) {
    auto a = plus(ti2v_args(t), {"--save-latents", t / cat("lat", image, ".safetensors")});
    if (image) a = plus(a, {"--image", kTi2v + "/image.png"});
    const Result r = run_wan(a);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string file = kTi2v + (image ? "/expected_i2v.safetensors" : "/expected_t2v.safetensors");
    const double rel = max_rel(load_tensor(t / cat("lat", image, ".safetensors"), "latents"), load_tensor(file, "latents"));
    printf("  CLI ti2v %s final latents max rel err %.2e\n", image ? "image" : "text", rel);
    EXPECT_LE(rel, 1e-4);
    fs::remove(t / "out.y4m");
  }
}
