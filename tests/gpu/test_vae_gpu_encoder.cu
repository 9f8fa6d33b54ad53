// The GPU Wan 2.1 and Wan 2.2 VAE encoders (src/models/vae/vae_gpu_encoder.h) against the CPU fp32
// reference vae_encode (src/models/vae/vae_cpu.h), in both convolution modes (cuDNN 3-D, folded 2-D),
// on random weights and fresh random videos, with the arena and the output poisoned with NaN bytes and
// every convolution's sampled outputs re-checked in fp32 (which covers the strided down-sampling convs):
//   - tiny configurations ("tiny2.1", "tiny2.2") and the real widths (base 96, base 160), at odd latent
//     sizes, 1 frame (one chunk) and 1 + 4k frames (later chunks: the cached causal convs, the kept
//     frame of downsample3d's time_conv, AvgDown3D's time padding on the first chunk), and Wan 2.1's
//     I2V input (an image, then zero frames);
//   - determinism (two encodes and two encoder objects give bit-identical latents; a video prefix
//     encodes to a latent prefix), device_bytes planned from the config = what create() holds (+ the
//     fixed reserve), refusals;
//   - timing at the engine's sizes (I2V-A14B: 81 frames of 1280x720, an image then zeros; TI2V-5B: one
//     1280x704 image), printing seconds, the plan, the profile and the peak memory.
// Precision rule (issue 4, as the decoder's): relative L2 error of the normalised latents against the
// fp32 CPU encode at most twice that of the same encoder computed plainly in bf16 on the CPU
// (test_vae_gpu_ref.h), and that baseline under 0.1 (a sanity bound on the baseline itself).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/check.h"
#include "models/vae/vae_cpu.h"
#include "models/vae/vae_gpu_encoder.h"
#include "test_vae_gpu_ref.h"

namespace wan::vae_gpu_test {
namespace {

using namespace wan::gpu_test;
using cuda::VaeConvMode;
using cuda::VaeEncoderGpu;
using cuda::VaeGpuOptions;

const char* mode_name(VaeConvMode m) { return m == VaeConvMode::Conv3d ? "conv3d" : "folded2d"; }

struct Model {
  VaeConfig config;
  VaeWeights weights;
};

// Random-weight models of the presets "tiny2.1", "wan2.1", "tiny2.2", "wan2.2", made once.
const Model& model(const std::string& preset) {
  static std::map<std::string, Model> models;
  auto it = models.find(preset);
  if (it == models.end()) {
    Model m;
    m.config = vae_preset(preset);
    uint64_t seed = 5150;
    for (char ch : preset) seed = seed * 131 + static_cast<uint8_t>(ch);
    m.weights = random_weights(m.config, seed);
    it = models.emplace(preset, std::move(m)).first;
  }
  return it->second;
}

// GPU encode through the device API into a NaN-poisoned output (every element must be written).
Tensor gpu_encode(VaeEncoderGpu& enc, const Tensor& video) {
  const int64_t F = video.dim(1), T = enc.latent_frames(F), sf = enc.spatial_factor();
  const int64_t h = video.dim(2) / sf, w = video.dim(3) / sf, z = enc.z_dim();
  DevBuf<float> v(static_cast<size_t>(video.numel())), lat(static_cast<size_t>(z * T * h * w));
  v.upload(std::vector<float>(video.f32(), video.f32() + video.numel()));
  lat.poison();
  enc.encode(v.p, F, lat.p, nullptr);
  Tensor out = Tensor::f32({z, T, h, w});
  const std::vector<float> host = lat.download();
  std::memcpy(out.f32(), host.data(), host.size() * sizeof(float));
  return out;
}

cuda::VaeGpuShape latent_shape(const VaeConfig& c, const Tensor& video) {
  const int sf = vae_spatial_factor(c);
  return {video.dim(2) / sf, video.dim(3) / sf};
}

// GPU vs fp32 CPU vs plain-bf16 CPU for one model and video, both conv modes, with the conv self-check.
void check_encode(const Model& m, const Tensor& video, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor ref = vae_encode(m.config, m.weights, video);
  const auto t1 = std::chrono::steady_clock::now();
  const Tensor base = encode_bf16_plain(m.config, m.weights, video);
  const Err eb = error_vs(base, ref);
  std::printf("[ %s ] video %s -> latents %s, CPU fp32 encode %.2f s\n", what.c_str(), video.shape().str().c_str(),
              ref.shape().str().c_str(), std::chrono::duration<double>(t1 - t0).count());
  for (VaeConvMode mode : {VaeConvMode::Conv3d, VaeConvMode::Folded2d}) {
    VaeGpuOptions o;
    o.conv_mode = mode;
    o.poison = true;
    o.self_check = true;
    auto enc = VaeEncoderGpu::create(m.config, m.weights, latent_shape(m.config, video), o);
    const Tensor out = gpu_encode(*enc, video);
    ASSERT_EQ(out.shape().str(), ref.shape().str()) << what;
    expect_within_2x_baseline(error_vs(out, ref), eb, what + " " + mode_name(mode));
    EXPECT_GT(enc->conv_calls_checked(), 0) << what;
    EXPECT_EQ(enc->self_check_nonfinite(), 0) << what << " " << mode_name(mode);
    EXPECT_LE(enc->self_check_max_err(), 1.0f / 128) << what << " " << mode_name(mode) << ": a cuDNN conv differs "
                                                     << "from the direct fp32 one on the same bf16 operands";
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Against the CPU reference.

TEST(VaeGpuEncode21, TinyMatchesCpu) {
  REQUIRE_GPU();
  const Model& m = model("tiny2.1");
  check_encode(m, random_video(1, 40, 56, 11), "tiny2.1 1 frame 40x56");
  check_encode(m, random_video(9, 40, 56, 12), "tiny2.1 9 frames 40x56");
  check_encode(m, random_video(9, 40, 56, 13, /*zero_from=*/1), "tiny2.1 image + 8 zero frames 40x56");
}

TEST(VaeGpuEncode21, RealWidthsMatchesCpu) {
  REQUIRE_GPU();
  const Model& m = model("wan2.1");
  check_encode(m, random_video(1, 72, 56, 21), "wan2.1 1 frame 72x56");
  check_encode(m, random_video(5, 72, 56, 22), "wan2.1 5 frames 72x56");
}

TEST(VaeGpuEncode22, TinyMatchesCpu) {
  REQUIRE_GPU();
  const Model& m = model("tiny2.2");
  check_encode(m, random_video(1, 80, 112, 31), "tiny2.2 1 frame 80x112");
  check_encode(m, random_video(9, 80, 112, 32), "tiny2.2 9 frames 80x112");
}

TEST(VaeGpuEncode22, RealWidthsMatchesCpu) {
  REQUIRE_GPU();
  const Model& m = model("wan2.2");
  check_encode(m, random_video(1, 48, 80, 41), "wan2.2 1 frame 48x80");
  check_encode(m, random_video(5, 48, 80, 42), "wan2.2 5 frames 48x80");
}

// ---------------------------------------------------------------------------------------------
// Determinism, memory plan, refusals.

TEST(VaeGpuEncode, Deterministic) {
  REQUIRE_GPU();
  for (const char* preset : {"tiny2.1", "wan2.2"}) {
    const Model& m = model(preset);
    const int sf = vae_spatial_factor(m.config);
    const Tensor video = random_video(9, 3 * sf, 5 * sf, 51);
    Tensor prefix = Tensor::f32({3, 5, 3 * sf, 5 * sf});
    const int64_t fr = 3 * sf * 5 * sf;
    for (int64_t c = 0; c < 3; ++c) std::memcpy(prefix.f32() + c * 5 * fr, video.f32() + c * 9 * fr, 5 * fr * 4);
    for (VaeConvMode mode : {VaeConvMode::Conv3d, VaeConvMode::Folded2d}) {
      SCOPED_TRACE(std::string(preset) + " " + mode_name(mode));
      VaeGpuOptions o;
      o.conv_mode = mode;
      auto a = VaeEncoderGpu::create(m.config, m.weights, {3, 5}, o);
      const Tensor z1 = gpu_encode(*a, video);
      const Tensor z2 = gpu_encode(*a, video);
      a.reset();
      auto b = VaeEncoderGpu::create(m.config, m.weights, {3, 5}, o);
      const Tensor z3 = gpu_encode(*b, video);
      EXPECT_EQ(std::memcmp(z1.f32(), z2.f32(), z1.nbytes()), 0) << "two encodes differ";
      EXPECT_EQ(std::memcmp(z1.f32(), z3.f32(), z1.nbytes()), 0) << "two encoders differ";
      // The first 5 frames encode to the first 2 latent frames of the 9-frame encode (causality).
      const Tensor y = gpu_encode(*b, prefix);
      ASSERT_EQ(y.dim(1), 2);
      const int64_t lf = 3 * 5;
      for (int64_t c = 0; c < m.config.z_dim; ++c)
        ASSERT_EQ(std::memcmp(y.f32() + c * 2 * lf, z1.f32() + c * 3 * lf, 2 * lf * 4), 0)
            << "channel " << c << ": a prefix of the video does not encode to a prefix of the latents";
    }
  }
}

// device_bytes (planned on the config's shapes, before any weights exist) is what create() then holds
// (weights + arena) plus the one fixed reserve, for both versions, tiny and real widths, both modes.
TEST(VaeGpuEncode, DeviceBytesPlannedFromTheConfigMatchCreate) {
  REQUIRE_GPU();
  long long reserve = -1;
  for (const char* preset : {"tiny2.1", "wan2.1", "tiny2.2", "wan2.2"})
    for (VaeConvMode mode : {VaeConvMode::Conv3d, VaeConvMode::Folded2d})
      for (cuda::VaeGpuShape shape : {cuda::VaeGpuShape{5, 7}, cuda::VaeGpuShape{8, 12}, cuda::VaeGpuShape{30, 52}}) {
        SCOPED_TRACE(std::string(preset) + " " + mode_name(mode) + " " + std::to_string(shape.height) + "x" +
                     std::to_string(shape.width));
        const Model& m = model(preset);
        VaeGpuOptions o;
        o.conv_mode = mode;
        const size_t planned = VaeEncoderGpu::device_bytes(m.config, shape, o);
        auto enc = VaeEncoderGpu::create(m.config, m.weights, shape, o);
        const long long held = static_cast<long long>(enc->weight_bytes() + enc->arena_bytes());
        const long long r = static_cast<long long>(planned) - held;
        if (reserve < 0) reserve = r;
        EXPECT_EQ(r, reserve);
        EXPECT_GT(held, 0);
      }
  EXPECT_GE(reserve, 0);
  EXPECT_LT(reserve, 1ll << 30);
}

TEST(VaeGpuEncode, RejectsUnsupportedInputs) {
  REQUIRE_GPU();
  const Model& m = model("tiny2.1");
  auto enc = VaeEncoderGpu::create(m.config, m.weights, {5, 7});
  EXPECT_EQ(enc->z_dim(), 16);
  EXPECT_EQ(enc->spatial_factor(), 8);
  EXPECT_THROW(enc->encode(Tensor::f32({3, 4, 40, 56})), Error);  // 4 frames: not 1 + 4k
  EXPECT_THROW(enc->encode(Tensor::f32({3, 5, 40, 64})), Error);  // planned for 40x56
  EXPECT_THROW(enc->encode(Tensor::f32({4, 5, 40, 56})), Error);  // channels
  VaeConfig bad = model("tiny2.2").config;
  bad.patch = 1;  // a Wan 2.2 VAE without its pixel patchify
  EXPECT_THROW(VaeEncoderGpu::device_bytes(bad, {5, 7}), Error);
  VaeWeights broken = m.weights;
  broken.encoder.middle0.conv2.weight = Tensor::f32({64, 64, 3, 3, 2});
  try {
    VaeEncoderGpu::create(m.config, broken, {5, 7});
    FAIL() << "a wrong shape must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.middle.0.residual.6"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Timing at the engine's sizes (prints; asserts only finite latents and the conv self-check).

namespace {
// Best of `reps` timed encodes of `video` (after a warm-up), then one more with the profile and the
// conv self-check.
void time_encode(const Model& m, const Tensor& video, const char* what, int reps) {
  CUDA_CHECK(cudaDeviceSynchronize());
  size_t free0 = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  const cuda::VaeGpuShape shape = latent_shape(m.config, video);
  const int64_t F = video.dim(1), T = 1 + (F - 1) / 4;
  DevBuf<float> dv(static_cast<size_t>(video.numel())), dz(static_cast<size_t>(m.config.z_dim * T * shape.height *
                                                                                shape.width));
  dv.upload(std::vector<float>(video.f32(), video.f32() + video.numel()));
  auto t0 = std::chrono::steady_clock::now();
  auto enc = VaeEncoderGpu::create(m.config, m.weights, shape);
  const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  StreamGuard st;
  enc->encode(dv.p, F, dz.p, st.s);  // warm-up (lazy module loads)
  CUDA_CHECK(cudaStreamSynchronize(st.s));
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    t0 = std::chrono::steady_clock::now();
    enc->encode(dv.p, F, dz.p, st.s);
    CUDA_CHECK(cudaStreamSynchronize(st.s));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  size_t free1 = 0;
  CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(nonfinite(dz.download()), 0u) << what;
  std::printf("[ %s ] video %s -> latents [%d, %lld, %lld, %lld]: encode %.3f s (best of %d), plan %.2f s; weights "
              "%.1f MiB, arena %.1f MiB, peak device memory in use %.2f GiB (incl. video + latents %.2f GiB)\n",
              what, video.shape().str().c_str(), m.config.z_dim, (long long)T, (long long)shape.height,
              (long long)shape.width, best, reps, plan_s, enc->weight_bytes() / 1048576.0,
              enc->arena_bytes() / 1048576.0, (free0 - free1) / 1073741824.0, (dv.n + dz.n) * 4.0 / 1073741824.0);
  enc.reset();
  VaeGpuOptions p;
  p.profile = true;
  p.self_check = true;
  auto ep = VaeEncoderGpu::create(m.config, m.weights, shape, p);
  std::printf("%s", ep->plan_str().c_str());
  ep->encode(dv.p, F, dz.p, st.s);
  std::printf("profile (with events and self-check kernels):\n%s", ep->profile_report().c_str());
  std::printf("conv self-check: %lld calls, max rel err %.3e, non-finite %lld\n", (long long)ep->conv_calls_checked(),
              ep->self_check_max_err(), (long long)ep->self_check_nonfinite());
  std::fflush(stdout);
  EXPECT_LE(ep->self_check_max_err(), 1.0f / 128) << what;
  EXPECT_EQ(ep->self_check_nonfinite(), 0) << what;
}
}  // namespace

TEST(VaeGpuTiming, EncodeI2v720pAndTi2v704p) {
  REQUIRE_GPU();
  time_encode(model("wan2.1"), random_video(81, 720, 1280, 61, /*zero_from=*/1), "I2V-A14B wan2.1 image + 80 zeros", 2);
  time_encode(model("wan2.2"), random_video(1, 704, 1280, 62), "TI2V-5B wan2.2 one image", 3);
}

}  // namespace wan::vae_gpu_test
