// The tiled GPU VAE decode (VaeDecoderGpu::decode_tiled, src/models/vae/vae_gpu.h; the grid and blend of
// src/models/vae/vae_tiling.h): against the CPU fp32 tiled reference vae_decode_tiled on fresh random
// inputs (precision rule of test_vae_gpu.cu: at most twice the error of the same tiled decode done plainly
// in bf16 on the CPU), against the GPU untiled decode (within the CPU-measured tiling bound), the tiled
// decoder's device bytes below the untiled one's at real sizes, and, at the real widths, the tiled vs
// untiled relative L2 of the candidate tiles printed (recorded in ARCHITECTURE.md / the report).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "models/vae/vae_cpu.h"
#include "models/vae/vae_gpu.h"
#include "models/vae/vae_tiling.h"
#include "test_vae_gpu_ref.h"

using namespace wan;
using namespace wan::gpu_test;
using namespace wan::vae_gpu_test;
using cuda::VaeDecoderGpu;

namespace {

struct TinyCase {
  const char* preset;
  uint64_t seed;
};

// The same tiled decode with each tile done plainly in bf16 on the CPU: the precision baseline.
Tensor tiled_bf16_plain(const VaeConfig& c, const VaeWeights& w, const Tensor& z, const VaeTiling& t, bool clamp) {
  return vae_tiled_decode(z, t, vae_spatial_factor(c), clamp,
                          [&](const Tensor& tile) { return decode_bf16_plain(c, w, tile, false); });
}

}  // namespace

TEST(VaeTilingGpu, TiledMatchesTheCpuTiledReference) {
  REQUIRE_GPU();
  for (const TinyCase& k : {TinyCase{"tiny2.1", 91}, TinyCase{"tiny2.2", 92}}) {
    const VaeConfig c = vae_preset(k.preset);
    const VaeWeights w = random_weights(c, k.seed);
    const Tensor z = random_latents(c.z_dim, 3, 12, 20, k.seed + 100);
    for (int64_t ov : {2, 4}) {
      const VaeTiling t{8, 8, ov, ov};
      for (bool clamp : {false, true}) {
        const Tensor ref = vae_decode_tiled(c, w, z, t, clamp);
        const Tensor base = tiled_bf16_plain(c, w, z, t, clamp);
        auto dec = VaeDecoderGpu::create(c, w, {8, 8});
        int64_t tiles = 0;
        const Tensor out = dec->decode_tiled(z, t, clamp, [&](int64_t n) { tiles = n; });
        EXPECT_EQ(tiles, vae_tile_count(12, 20, t));
        const Err e = error_vs(out, ref);
        EXPECT_EQ(e.nonfinite, 0u);
        expect_within_2x_baseline(e, error_vs(base, ref),
                                  std::string(k.preset) + " tiled 8x8 overlap " + std::to_string(ov) +
                                      (clamp ? " clamped" : ""));
      }
    }
  }
}

// GPU tiled vs GPU untiled: the CPU test (tests/cpu/test_vae_tiling.cpp TiledDecodeIsCloseToUntiled) bounds
// the tiling's own error on these models; bf16 adds its rounding (about 1e-2 relative L2) on both sides.
TEST(VaeTilingGpu, TiledIsCloseToUntiledOnTheGpu) {
  REQUIRE_GPU();
  for (const TinyCase& k : {TinyCase{"tiny2.1", 93}, TinyCase{"tiny2.2", 94}}) {
    const VaeConfig c = vae_preset(k.preset);
    const VaeWeights w = random_weights(c, k.seed);
    const Tensor z = random_latents(c.z_dim, 3, 12, 20, k.seed + 100);
    const VaeTiling t{8, 8, 2, 2};
    const Tensor cpu_e_ref = vae_decode(c, w, z, true);
    const double cpu_e = error_vs(vae_decode_tiled(c, w, z, t, true), cpu_e_ref).rel_l2;
    const Tensor untiled = VaeDecoderGpu::create(c, w, {12, 20})->decode(z, true);
    const Tensor tiled = VaeDecoderGpu::create(c, w, {8, 8})->decode_tiled(z, t, true);
    const Err e = error_vs(tiled, untiled);
    std::printf("[ %s ] GPU tiled vs untiled rel L2 %.4e (CPU fp32: %.4e)\n", k.preset, e.rel_l2, cpu_e);
    EXPECT_EQ(e.nonfinite, 0u);
    EXPECT_LE(e.rel_l2, 1.5 * cpu_e + 3e-2) << k.preset;
  }
}

// The decoder of a tile takes less device memory than the decoder of the frame, at real widths and sizes:
// Wan 2.1 at 1280x720 (latent 90x160) and Wan 2.2 at 1280x704 (44x80), tiles of 512, 384 and 256 pixels.
TEST(VaeTilingGpu, TileDecoderBytesAreBelowTheUntiledAtRealSizes) {
  REQUIRE_GPU();
  struct Size {
    const char* preset;
    int64_t h, w;
  };
  for (const Size& s : {Size{"wan2.1", 90, 160}, Size{"wan2.2", 44, 80}}) {
    const VaeConfig c = vae_preset(s.preset);
    const int sf = vae_spatial_factor(c);
    const size_t untiled = VaeDecoderGpu::device_bytes(c, {s.h, s.w});
    size_t prev = untiled;
    for (int64_t px : {512, 384, 256}) {
      const VaeTiling t = vae_tiling_from_pixels(px, px, sf);
      const auto [th, tw] = vae_tile_size(s.h, s.w, t);
      const size_t b = VaeDecoderGpu::device_bytes(c, {th, tw});
      std::printf("[ %s %lldx%lld ] decoder %.0f MiB untiled, %.0f MiB with %lld-pixel tiles (%lld tiles)\n",
                  s.preset, static_cast<long long>(sf * s.w), static_cast<long long>(sf * s.h), untiled / 1048576.0,
                  b / 1048576.0, static_cast<long long>(px), static_cast<long long>(vae_tile_count(s.h, s.w, t)));
      EXPECT_LT(b, untiled) << s.preset << " " << px;
      EXPECT_LE(b, prev) << s.preset << " " << px;
      prev = b;
    }
  }
}

// The number to record: tiled vs untiled relative L2 of the GPU decode at real widths (random weights)
// and real sizes, 3 latent frames, for each candidate tile of --vae-tile auto.
TEST(VaeTilingGpu, RealWidthsTiledVsUntiledPrinted) {
  REQUIRE_GPU();
  struct Size {
    const char* preset;
    int64_t h, w;
    uint64_t seed;
  };
  for (const Size& s : {Size{"wan2.1", 90, 160, 95}, Size{"wan2.2", 44, 80, 96}}) {
    const VaeConfig c = vae_preset(s.preset);
    const VaeWeights w = random_weights(c, s.seed);
    const int sf = vae_spatial_factor(c);
    const Tensor z = random_latents(c.z_dim, 3, s.h, s.w, s.seed + 1);
    const Tensor untiled = VaeDecoderGpu::create(c, w, {s.h, s.w})->decode(z, true);
    for (int64_t px : {512, 384, 256}) {
      const VaeTiling t = vae_tiling_from_pixels(px, px, sf);
      const auto [th, tw] = vae_tile_size(s.h, s.w, t);
      const Tensor tiled = VaeDecoderGpu::create(c, w, {th, tw})->decode_tiled(z, t, true);
      const Err e = error_vs(tiled, untiled);
      std::printf("[ record %s %lldx%lld ] %lld-pixel tiles (%lld tiles): tiled vs untiled rel L2 %.4e, max abs %.3e\n",
                  s.preset, static_cast<long long>(sf * s.w), static_cast<long long>(sf * s.h),
                  static_cast<long long>(px), static_cast<long long>(vae_tile_count(s.h, s.w, t)), e.rel_l2, e.max_abs);
      EXPECT_EQ(e.nonfinite, 0u);
      EXPECT_LT(e.rel_l2, 1.0);
    }
  }
}
