// The image-to-video tasks on the GPU (bf16: the VAE encoder, the DiT with I2V's 36 input channels or
// TI2V's per-token timesteps, the decoder) against the CPU float32 pipeline on make-checkpoint tiny
// models (VAE widths the GPU kernels take), with the same image and seed: latents and video within the
// T2V pipeline's GPU bounds; reruns bit-identical; the image encoder a stage of the run's memory plan;
// both tasks under --precision fp8 (FP8 GEMMs and self-attention) near the exact GPU run.
// The image is a PPM written here (the GPU machine's build may lack FFmpeg; PPM needs nothing).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "gpu_test_model.h"
#include "kernels/gemm.h"
#include "kernels/rng.h"
#include "pipeline/pipeline.h"
#include "runtime/memory_plan.h"

using namespace wan;
namespace fs = std::filesystem;

namespace {

const fs::path& work_dir() {
  static const fs::path d = fs::temp_directory_path() / ("wan_gpu_image_" + std::to_string(getpid()));
  return d;
}

// A make-checkpoint model of `config`, written once per test binary run.
std::string model(const std::string& config) {
  const std::string d = (work_dir() / config).string();
  if (!fs::exists(d)) {
    fs::create_directories(work_dir());
    const std::string cmd = std::string(WAN_BINARY) + " make-checkpoint --config " + config +
                            " --layout official --seed 7 --out " + d + " > /dev/null";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("make-checkpoint failed: " + cmd);
  }
  return d;
}

// A smooth colour image of w x h as binary PPM.
std::string image(int w, int h) {
  const std::string path = (work_dir() / ("image_" + std::to_string(w) + "x" + std::to_string(h) + ".ppm")).string();
  fs::create_directories(work_dir());
  std::ofstream f(path, std::ios::binary);
  f << "P6\n" << w << " " << h << "\n255\n";
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const unsigned char px[3] = {static_cast<unsigned char>(128 + 100 * std::sin(0.21 * x + 0.05 * y)),
                                   static_cast<unsigned char>(128 + 90 * std::cos(0.13 * y - 0.07 * x)),
                                   static_cast<unsigned char>((x * 7 + y * 3) % 256)};
      f.write(reinterpret_cast<const char*>(px), 3);
    }
  return path;
}

GenerateOptions options(const std::string& config, const std::string& device, bool with_image) {
  GenerateOptions o;
  o.model = model(config);
  o.prompt = "a red fox runs through the snow";
  const bool ti2v = config == "tiny-ti2v";
  o.width = ti2v ? 96 : 64;
  o.height = 64;
  o.frames = 9;
  o.steps = 6;
  o.seed = 5;
  o.device = device;
  if (with_image) o.image_file = image(o.width.value(), o.height.value());
  return o;
}

using gpu_test::rel_l2;

void compare(const std::string& config, bool with_image) {
  const GenerateResult cpu = run_generate(plan_generate(options(config, "cpu", with_image)), {});
  const GenerateResult gpu = run_generate(plan_generate(options(config, "cuda", with_image)), {});
  const double lat = rel_l2(gpu.latents, cpu.latents), vid = rel_l2(gpu.video, cpu.video);
  printf("%s%s, 6 steps: latents rel L2 %.3e, video rel L2 %.3e (GPU bf16 vs CPU fp32)\n", config.c_str(),
         with_image ? " with an image" : "", lat, vid);
  EXPECT_LT(lat, 2e-2) << config;
  EXPECT_LT(vid, 3e-2) << config;
  EXPECT_GT(lat, 0.0) << config;
  for (int64_t i = 0; i < gpu.latents.numel(); ++i) ASSERT_TRUE(std::isfinite(gpu.latents.f32()[i])) << i;
}

}  // namespace

TEST(GpuImageTasks, I2vMatchesCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  compare("tiny-i2v", true);
  fs::remove_all(work_dir());
}

TEST(GpuImageTasks, Ti2vTextAndImageMatchCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  compare("tiny-ti2v", false);
  compare("tiny-ti2v", true);
  fs::remove_all(work_dir());
}

TEST(GpuImageTasks, RerunsAreBitIdenticalAndTheEncoderIsPlanned) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const char* config : {"tiny-i2v", "tiny-ti2v"}) {
    const GeneratePlan p = plan_generate(options(config, "cuda", true));
    ASSERT_TRUE(p.memory);
    EXPECT_GT(p.vae_encoder_device_bytes, 0) << config;
    EXPECT_EQ(p.memory->stage_peak(p.device, RunStage::ImageEncode), static_cast<size_t>(p.vae_encoder_device_bytes))
        << p.memory->str();
    const GenerateResult a = run_generate(p, {});
    const GenerateResult b = run_generate(plan_generate(options(config, "cuda", true)), {});
    ASSERT_EQ(a.latents.nbytes(), b.latents.nbytes());
    EXPECT_EQ(std::memcmp(a.latents.data(), b.latents.data(), a.latents.nbytes()), 0) << config;
    ASSERT_EQ(a.video.nbytes(), b.video.nbytes());
    EXPECT_EQ(std::memcmp(a.video.data(), b.video.data(), a.video.nbytes()), 0) << config;
  }
  fs::remove_all(work_dir());
}

// --precision fp8 on both image tasks (I2V's 36-channel input, TI2V's per-token timesteps): the run
// works, names its numerics, and stays within the full forward's FP8 bound of the exact GPU run.
TEST(GpuImageTasks, Fp8RunsBothImageTasks) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!cuda::fp8_supported(0)) GTEST_SKIP() << "no FP8 GEMMs on this GPU";
  for (const char* config : {"tiny-i2v", "tiny-ti2v"}) {
    const GenerateOptions e = options(config, "cuda", true);
    GenerateOptions f = e;
    f.gemm = "fp8";
    f.attention = "own-fp8";
    const GenerateResult exact = run_generate(plan_generate(e), {});
    const GeneratePlan p = plan_generate(f);
    EXPECT_NE(p.fingerprint.find("fp8 block GEMMs, fp8 self-attention"), std::string::npos) << p.fingerprint;
    const GenerateResult r = run_generate(p, {});
    const double lat = rel_l2(r.latents, exact.latents), vid = rel_l2(r.video, exact.video);
    printf("%s with an image, 6 steps, --precision fp8 vs exact: latents rel L2 %.3e, video %.3e\n", config, lat, vid);
    EXPECT_GT(lat, 0.0) << config << ": the FP8 path ran";
    EXPECT_LT(lat, 6e-2) << config;
    EXPECT_LT(vid, 6e-2) << config;
  }
  fs::remove_all(work_dir());
}
