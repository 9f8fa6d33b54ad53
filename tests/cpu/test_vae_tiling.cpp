// The tiled VAE decode (src/models/vae/vae_tiling.h, vae_decode_tiled in vae_cpu.h): the tile grid covers
// every latent pixel with tiles of one size; the blend weights of each pixel sum to 1; a tiling of one tile
// is vae_decode bit for bit; and the tiled decode of random tiny VAEs (Wan 2.1 and 2.2 configs) stays
// within a measured relative L2 of the untiled one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "models/config.h"
#include "models/vae/vae_cpu.h"
#include "models/vae/vae_tiling.h"
#include "vae_test_weights.h"

namespace wan {
namespace {

VaeWeights random_vae(const VaeConfig& c, uint64_t seed) { return test::random_vae_test_weights(c, seed); }
Tensor random_latents(int64_t z, int64_t T, int64_t h, int64_t w, uint64_t seed) {
  return test::random_vae_test_latents(z, T, h, w, seed);
}

double rel_l2(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape().str(), ref.shape().str());
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double d = static_cast<double>(a.f32()[i]) - ref.f32()[i];
    num += d * d;
    den += static_cast<double>(ref.f32()[i]) * ref.f32()[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST(VaeTiling, StartsCoverWithOneSizeSpreadEvenly) {
  EXPECT_EQ(vae_tile_starts(10, 0, 0), std::vector<int64_t>{0});
  EXPECT_EQ(vae_tile_starts(10, 10, 2), std::vector<int64_t>{0});
  EXPECT_EQ(vae_tile_starts(10, 16, 4), std::vector<int64_t>{0});
  EXPECT_EQ(vae_tile_starts(10, 8, 2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(vae_tile_starts(14, 8, 2), (std::vector<int64_t>{0, 6}));      // exact fit: no shift
  EXPECT_EQ(vae_tile_starts(15, 8, 2), (std::vector<int64_t>{0, 4, 7}));   // spread evenly
  EXPECT_EQ(vae_tile_starts(90, 64, 16), (std::vector<int64_t>{0, 26}));   // 720p height, 512-px Wan 2.1 tile
  EXPECT_THROW(vae_tile_starts(10, 4, 4), Error);
  for (int64_t n = 1; n <= 70; ++n)
    for (int64_t tile : {1, 2, 4, 8, 16, 32})
      for (int64_t ov = 0; ov < tile; ov += std::max<int64_t>(1, tile / 4)) {
        const auto s = vae_tile_starts(n, tile, ov);
        const int64_t t = std::min(tile, n);
        std::vector<int> covered(static_cast<size_t>(n), 0);
        for (size_t i = 0; i < s.size(); ++i) {
          ASSERT_GE(s[i], 0);
          ASSERT_LE(s[i] + t, n);
          if (i > 0) {
            ASSERT_GT(s[i], s[i - 1]);
            ASSERT_GE(s[i - 1] + t - s[i], ov) << "neighbours overlap at least the overlap";
          }
          for (int64_t x = s[i]; x < s[i] + t; ++x) covered[static_cast<size_t>(x)] = 1;
        }
        for (int64_t x = 0; x < n; ++x) ASSERT_EQ(covered[static_cast<size_t>(x)], 1) << n << " " << tile << " " << ov;
      }
}

TEST(VaeTiling, GridIsRowMajorOfOneTileSize) {
  const VaeTiling t = vae_tiling_from_pixels(512, 384, 8);  // latent 64 x 48, overlaps 16 and 12
  EXPECT_EQ(t.tile_h, 64);
  EXPECT_EQ(t.tile_w, 48);
  EXPECT_EQ(t.overlap_h, 16);
  EXPECT_EQ(t.overlap_w, 12);
  const auto g = vae_tile_grid(90, 160, t);  // 720p, Wan 2.1
  ASSERT_EQ(g.size(), 2u * 5u);
  EXPECT_EQ(vae_tile_count(90, 160, t), 10);
  for (const VaeTile& x : g) {
    EXPECT_EQ(x.h, 64);
    EXPECT_EQ(x.w, 48);
  }
  EXPECT_EQ(g[1].x0, 28);  // 5 columns at 0, 28, 56, 84, 112
  EXPECT_EQ(g[4].x0, 112);
  EXPECT_EQ(g[5].y0, 26);
  EXPECT_EQ(vae_tile_count(90, 160, VaeTiling{}), 1);
  EXPECT_EQ(vae_tile_size(20, 30, t), (std::pair<int64_t, int64_t>{20, 30}));  // clamped: one tile
  EXPECT_THROW(vae_tiling_from_pixels(500, 512, 8), Error);
  EXPECT_THROW(vae_tiling_from_pixels(512, 480, 16), Error);  // 30 latent pixels: no whole 1/4 overlap
}

TEST(VaeTiling, BlendWeightsSumToOneAndRampOverTheOverlap) {
  for (int sf : {8, 16})
    for (int64_t n : {5, 10, 15, 33, 90})
      for (int64_t tile : {4, 6, 8, 64})
        for (int64_t ov : {int64_t{0}, tile / 4, tile / 2}) {
          if (ov >= tile) continue;
          const auto s = vae_tile_starts(n, tile, ov);
          const auto w = vae_blend_weights(n, tile, ov, sf);
          ASSERT_EQ(w.size(), s.size());
          const int64_t P = sf * std::min(tile, n);
          std::vector<double> sum(static_cast<size_t>(sf * n), 0.0);
          for (size_t i = 0; i < s.size(); ++i) {
            ASSERT_EQ(static_cast<int64_t>(w[i].size()), P);
            for (int64_t p = 0; p < P; ++p) {
              const float v = w[i][static_cast<size_t>(p)];
              ASSERT_GT(v, 0.0f);
              ASSERT_LE(v, 1.0f);
              sum[static_cast<size_t>(sf * s[i] + p)] += v;
            }
          }
          for (double v : sum) ASSERT_NEAR(v, 1.0, 1e-6) << "sf " << sf << " n " << n << " tile " << tile << " ov " << ov;
        }
  // Two tiles over 10 latent pixels, 8 wide: overlap 6 latent = 48 pixels; interior weights exactly 1.
  const auto w = vae_blend_weights(10, 8, 2, 8);
  EXPECT_EQ(w[0][0], 1.0f);
  EXPECT_EQ(w[0][15], 1.0f);
  EXPECT_FLOAT_EQ(w[1][0], 0.5f / 48);
  EXPECT_FLOAT_EQ(w[0][16], 1.0f - 0.5f / 48);
  EXPECT_EQ(w[1][63], 1.0f);
}

TEST(VaeTiling, BlendOfConstantTilesIsTheConstantAndTheGridOrderIsRowMajor) {
  // Each tile decodes to the mean of its latents broadcast: the blend of tiles of a constant field is that
  // constant everywhere, and the tiles come in row-major order.
  const Tensor lat = Tensor::f32({2, 2, 9, 13});
  for (int64_t i = 0; i < lat.numel(); ++i) lat.f32()[i] = 0.25f;
  std::vector<std::pair<int64_t, int64_t>> seen;
  const VaeTiling t{4, 8, 1, 2};
  const Tensor v = vae_tiled_decode(lat, t, 2, true, [&](const Tensor& tile) {
    seen.emplace_back(tile.dim(2), tile.dim(3));
    Tensor out = Tensor::f32({3, 5, 2 * tile.dim(2), 2 * tile.dim(3)});
    for (int64_t i = 0; i < out.numel(); ++i) out.f32()[i] = 4 * tile.f32()[0];  // 1.0, clamped stays
    return out;
  });
  EXPECT_EQ(v.shape().str(), Tensor::f32({3, 5, 18, 26}).shape().str());
  EXPECT_EQ(static_cast<int64_t>(seen.size()), vae_tile_count(9, 13, t));
  for (const auto& s : seen) EXPECT_EQ(s, (std::pair<int64_t, int64_t>{4, 8}));
  for (int64_t i = 0; i < v.numel(); ++i) ASSERT_NEAR(v.f32()[i], 1.0f, 1e-6f) << i;
}

TEST(VaeTiling, OneTileIsTheUntiledDecodeBitForBit) {
  const VaeConfig c = vae_preset("tiny2.1");
  const VaeWeights w = random_vae(c, 71);
  const Tensor z = random_latents(c.z_dim, 2, 4, 6, 72);
  const Tensor ref = vae_decode(c, w, z);
  for (const VaeTiling& t : {VaeTiling{}, VaeTiling{4, 6, 1, 1}, VaeTiling{8, 8, 2, 2}}) {
    const Tensor v = vae_decode_tiled(c, w, z, t);
    ASSERT_EQ(v.nbytes(), ref.nbytes());
    EXPECT_EQ(std::memcmp(v.f32(), ref.f32(), ref.nbytes()), 0);
  }
}

// Tiled vs untiled on random tiny VAEs, 3 latent frames (first chunk, Rep and cached time_convs), tiles
// of 8 latent pixels with an overlap of 2 and of 4, over latent 12x20. Measured (x86-64, these seeds):
// Wan 2.1 (tiny2.1) rel L2 0.340 / 0.289 (overlap 2 / 4), Wan 2.2 (tiny2.2) 0.342 / 0.284; bound 0.5. Large
// because the tiles are tiny next to the decoder's receptive field (and the middle block's attention spans
// the whole frame, here only the tile); tests/gpu/test_vae_tiling_gpu.cu prints the real-size figures.
TEST(VaeTiling, TiledDecodeIsCloseToUntiled) {
  for (const char* preset : {"tiny2.1", "tiny2.2"}) {
    const VaeConfig c = vae_preset(preset);
    const VaeWeights w = random_vae(c, 81);
    const Tensor z = random_latents(c.z_dim, 3, 12, 20, 82);
    const Tensor ref = vae_decode(c, w, z);
    for (int64_t ov : {2, 4}) {
      const VaeTiling t{8, 8, ov, ov};
      int last = 0, total = 0;
      const Tensor v = vae_decode_tiled(c, w, z, t, true, [&](int done, int all) {
        EXPECT_EQ(done, last + 1);
        last = done;
        total = all;
      });
      EXPECT_EQ(total, 3 * vae_tile_count(12, 20, t));
      EXPECT_EQ(last, total);
      const double e = rel_l2(v, ref);
      std::printf("[ %s ] tiles 8x8 overlap %lld (%lld tiles): tiled vs untiled rel L2 %.4e\n", preset,
                  static_cast<long long>(ov), static_cast<long long>(vae_tile_count(12, 20, t)), e);
      EXPECT_GT(e, 0.0);
      EXPECT_LT(e, 0.5);
      for (int64_t i = 0; i < v.numel(); ++i) ASSERT_LE(std::fabs(v.f32()[i]), 1.0f);
    }
  }
}

}  // namespace wan
