// The streamed GPU decode: vae_video_rgb8 quantises exactly as the host's quantize_unit_to_u8, and a
// decoder planned on another thread (as run_generate does while the DiT runs) delivers, chunk by chunk,
// the bytes of the host quantisation of the whole-video decode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "formats/video.h"
#include "kernels/vae_kernels.h"
#include "models/vae/vae_gpu.h"
#include "pipeline/models.h"
#include "test_vae_gpu_ref.h"

using namespace wan;
using namespace wan::gpu_test;
using namespace wan::vae_gpu_test;

TEST(VaeGpuKernels, VideoRgb8QuantisesLikeTheHost) {
  REQUIRE_GPU();
  const int64_t F = 5, HW = 1237;  // odd sizes
  std::vector<float> v = randn(0x5EED0 + 17, size_t(3 * F * HW), 0.8f);  // 18 555 values
  ASSERT_GT(v.size(), size_t(9000));
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -1.0f, 1.0f, 0.0f, -0.0f,
                            1.0f / 255.0f * 2.0f - 1.0f, std::nextafter(-1.0f, 0.0f), 0.99999994f, 1.5f, -7.0f};
  for (size_t i = 0; i < sizeof specials / sizeof *specials; ++i) v[i * 97] = specials[i];
  for (size_t i = 0; i < 4000; ++i) v[5000 + i] = -1.0f + float(i) / 2000.0f;  // steps across [-1, 1]
  DevBuf<float> dv(v.size());
  dv.upload(v);
  const int64_t f0 = 1, f1 = 4;
  DevBuf<uint8_t> out(size_t((f1 - f0) * HW * 3 + 64));
  out.poison();
  cuda::vae_video_rgb8(dv.p, F, HW, f0, f1, out.p, nullptr);
  const std::vector<uint8_t> got = out.download();
  const std::vector<uint8_t> want = video_to_rgb8(v.data(), int(F), 1, int(HW));  // [F, 1, HW, 3]
  for (int64_t i = 0; i < (f1 - f0) * HW * 3; ++i)
    ASSERT_EQ(got[size_t(i)], want[size_t(f0 * HW * 3 + i)]) << "byte " << i;
  for (size_t i = size_t((f1 - f0) * HW * 3); i < got.size(); ++i) ASSERT_EQ(got[i], 0xFF) << "wrote past the end";
}

namespace {

void expect_streamed_equals_whole(const VaeConfig& c, const VaeWeights& w, int64_t T, int64_t h, int64_t wd,
                                  uint64_t seed) {
  const Tensor z = random_latents(c.z_dim, T, h, wd, seed);
  const Tensor whole = gpu_vae_decode_tracked(c, w, z, 0, nullptr);
  const int F = int(whole.dim(1)), H = int(whole.dim(2)), W = int(whole.dim(3));
  const std::vector<uint8_t> want = video_to_rgb8(whole.f32(), F, H, W);

  std::unique_ptr<GpuVaeDecoder> dec;
  std::thread planner([&] { dec = plan_gpu_vae_decoder(c, w, h, wd, 0); });  // no device memory taken
  planner.join();
  std::vector<uint8_t> got(want.size(), 0xAB);
  std::vector<int> readies;
  int64_t peak = 0;
  const Tensor none = dec->decode(z, &peak, got.data(), [&](int n) {
    // Frames [0, n) are final when announced: compare them now, before later chunks land.
    const size_t bytes = size_t(n) * H * W * 3;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << "frames before " << n;
    readies.push_back(n);
  });
  EXPECT_FALSE(none.defined());
  EXPECT_GT(peak, 0);
  ASSERT_EQ(readies.size(), size_t(T)) << "one delivery per latent frame";
  for (size_t i = 1; i < readies.size(); ++i) EXPECT_GT(readies[i], readies[i - 1]);
  EXPECT_EQ(readies.back(), F);
  EXPECT_EQ(got, want);
  const Tensor again = dec->decode(z, nullptr, nullptr, {});  // allocated once, decodes again
  ASSERT_EQ(again.nbytes(), whole.nbytes());
  EXPECT_EQ(std::memcmp(again.f32(), whole.f32(), whole.nbytes()), 0);
}

}  // namespace

TEST(VaeGpuStream, Wan21StreamedFramesAreTheHostQuantisedDecode) {
  REQUIRE_GPU();
  const VaeConfig c = vae_preset("wan2.1");
  expect_streamed_equals_whole(c, random_weights(c, 4243), 4, 8, 12, 901);
}

TEST(VaeGpuStream, Wan22StreamedFramesAreTheHostQuantisedDecode) {
  REQUIRE_GPU();
  const VaeConfig c = vae_preset("tiny2.2");
  expect_streamed_equals_whole(c, random_weights(c, 4244), 3, 6, 10, 902);
}

TEST(VaeGpuStream, LatentsOfAnotherSizeThanPlannedAreRefused) {
  REQUIRE_GPU();
  const VaeConfig c = vae_preset("tiny2.2");
  auto dec = plan_gpu_vae_decoder(c, random_weights(c, 4245), 6, 10, 0);
  std::vector<uint8_t> buf(1 << 20);
  EXPECT_THROW(dec->decode(random_latents(c.z_dim, 2, 6, 12, 903), nullptr, buf.data(), [](int) {}), Error);
}
