// Tile grid and blend of the tiled VAE decode (see vae_tiling.h). Host code shared by the CPU reference
// and the GPU decoder: the blend is plain f32 arithmetic in a fixed order, so the same decoded tiles give
// bit-identical video.
#include "models/vae/vae_tiling.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/vae_ops.h"

namespace wan {

VaeTiling vae_tiling_from_pixels(int64_t tile_px_h, int64_t tile_px_w, int sf) {
  WAN_CHECK(sf > 0 && tile_px_h > 0 && tile_px_w > 0 && tile_px_h % (4 * sf) == 0 && tile_px_w % (4 * sf) == 0,
            "VAE tile ", tile_px_w, "x", tile_px_h, ": not a multiple of ", 4 * sf, " pixels");
  VaeTiling t;
  t.tile_h = tile_px_h / sf;
  t.tile_w = tile_px_w / sf;
  t.overlap_h = t.tile_h / 4;
  t.overlap_w = t.tile_w / 4;
  return t;
}

std::vector<int64_t> vae_tile_starts(int64_t n, int64_t tile, int64_t overlap) {
  WAN_CHECK(n >= 1, "VAE tiling: ", n, " latent pixels");
  if (tile <= 0 || tile >= n) return {0};
  WAN_CHECK(overlap >= 0 && overlap < tile, "VAE tiling: overlap ", overlap, " of a ", tile, "-pixel tile");
  // The fewest tiles whose stride is at most tile - overlap, spread evenly (rounded) from 0 to n - tile:
  // every neighbour overlap is at least `overlap`, and no short last step wastes a tile on a few pixels.
  const int64_t gaps = (n - tile + (tile - overlap) - 1) / (tile - overlap);
  std::vector<int64_t> s;
  for (int64_t i = 0; i <= gaps; ++i) s.push_back((2 * i * (n - tile) + gaps) / (2 * gaps));
  return s;
}

std::pair<int64_t, int64_t> vae_tile_size(int64_t h, int64_t w, const VaeTiling& t) {
  if (!t.on()) return {h, w};
  return {std::min(t.tile_h, h), std::min(t.tile_w, w)};
}

std::vector<VaeTile> vae_tile_grid(int64_t h, int64_t w, const VaeTiling& t) {
  const auto [th, tw] = vae_tile_size(h, w, t);
  std::vector<VaeTile> grid;
  for (int64_t y : vae_tile_starts(h, th, t.overlap_h))
    for (int64_t x : vae_tile_starts(w, tw, t.overlap_w)) grid.push_back(VaeTile{y, x, th, tw});
  return grid;
}

int64_t vae_tile_count(int64_t h, int64_t w, const VaeTiling& t) {
  return static_cast<int64_t>(vae_tile_grid(h, w, t).size());
}

std::vector<std::vector<float>> vae_blend_weights(int64_t n, int64_t tile, int64_t overlap, int sf) {
  const std::vector<int64_t> s = vae_tile_starts(n, tile, overlap);
  const int64_t t = std::min(tile <= 0 ? n : tile, n), k = static_cast<int64_t>(s.size()), P = t * sf;
  std::vector<std::vector<double>> raw(static_cast<size_t>(k), std::vector<double>(static_cast<size_t>(P), 1.0));
  std::vector<double> sum(static_cast<size_t>(n * sf), 0.0);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t x0 = sf * s[static_cast<size_t>(i)];
    for (int64_t p = 0; p < P; ++p) {
      const int64_t x = x0 + p;  // absolute pixel
      double& r = raw[static_cast<size_t>(i)][static_cast<size_t>(p)];
      if (i > 0) {  // rises over the overlap with the previous tile
        const int64_t end = sf * (s[static_cast<size_t>(i - 1)] + t), len = end - x0;
        if (x < end) r *= (static_cast<double>(x - x0) + 0.5) / static_cast<double>(len);
      }
      if (i + 1 < k) {  // falls over the overlap with the next tile (the mirror of its rise)
        const int64_t start = sf * s[static_cast<size_t>(i + 1)], len = x0 + P - start;
        if (x >= start) r *= 1.0 - (static_cast<double>(x - start) + 0.5) / static_cast<double>(len);
      }
      sum[static_cast<size_t>(x)] += r;
    }
  }
  std::vector<std::vector<float>> w(static_cast<size_t>(k), std::vector<float>(static_cast<size_t>(P)));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t p = 0; p < P; ++p) {
      const double r = raw[static_cast<size_t>(i)][static_cast<size_t>(p)];
      const double tot = sum[static_cast<size_t>(sf * s[static_cast<size_t>(i)] + p)];
      w[static_cast<size_t>(i)][static_cast<size_t>(p)] = r == tot ? 1.0f : static_cast<float>(r / tot);
    }
  return w;
}

namespace {

// latents [z, T, h, w] f32 -> the tile's [z, T, th, tw] copy.
Tensor latent_tile(const Tensor& lat, const VaeTile& t) {
  const int64_t zt = lat.dim(0) * lat.dim(1), h = lat.dim(2), w = lat.dim(3);
  Tensor out = Tensor::empty(DType::F32, {lat.dim(0), lat.dim(1), t.h, t.w});
  for (int64_t p = 0; p < zt; ++p)
    for (int64_t y = 0; y < t.h; ++y)
      std::memcpy(out.f32() + (p * t.h + y) * t.w, lat.f32() + (p * h + t.y0 + y) * w + t.x0,
                  static_cast<size_t>(t.w) * sizeof(float));
  return out;
}

}  // namespace

Tensor vae_tiled_decode(const Tensor& latents, const VaeTiling& tiling, int sf, bool clamp,
                        const VaeTileDecoder& decode_tile) {
  WAN_CHECK(latents.ndim() == 4 && latents.dim(1) >= 1, "VAE tiled decode: latents ", latents.shape().str(),
            " are not [z, T, h, w]");
  const Tensor lat = latents.to_f32();
  const int64_t h = lat.dim(2), w = lat.dim(3), H = sf * h, W = sf * w;
  const auto [th, tw] = vae_tile_size(h, w, tiling);
  const std::vector<int64_t> ys = vae_tile_starts(h, th, tiling.overlap_h), xs = vae_tile_starts(w, tw, tiling.overlap_w);
  const auto wy = vae_blend_weights(h, th, tiling.overlap_h, sf), wx = vae_blend_weights(w, tw, tiling.overlap_w, sf);
  const int64_t TH = sf * th, TW = sf * tw;
  Tensor video;
  std::vector<float> wrow(static_cast<size_t>(TW));
  for (size_t iy = 0; iy < ys.size(); ++iy)
    for (size_t ix = 0; ix < xs.size(); ++ix) {
      const Tensor v = decode_tile(latent_tile(lat, VaeTile{ys[iy], xs[ix], th, tw}));
      WAN_CHECK(v.ndim() == 4 && v.dim(0) == 3 && v.dim(2) == TH && v.dim(3) == TW && v.dtype() == DType::F32,
                "VAE tiled decode: a tile decoded to ", v.shape().str(), ", expected [3, F, ", TH, ", ", TW, "] f32");
      if (!video.defined()) video = Tensor::f32({3, v.dim(1), H, W});  // zero-filled
      WAN_CHECK(v.dim(1) == video.dim(1), "VAE tiled decode: tiles of ", v.dim(1), " and ", video.dim(1), " frames");
      const int64_t planes = 3 * v.dim(1), Y0 = sf * ys[iy], X0 = sf * xs[ix];
      for (int64_t pl = 0; pl < planes; ++pl)
        for (int64_t y = 0; y < TH; ++y) {
          const float a = wy[iy][static_cast<size_t>(y)];
          for (int64_t x = 0; x < TW; ++x) wrow[static_cast<size_t>(x)] = a * wx[ix][static_cast<size_t>(x)];
          const float* src = v.f32() + (pl * TH + y) * TW;
          float* dst = video.f32() + (pl * H + Y0 + y) * W + X0;
          for (int64_t x = 0; x < TW; ++x) dst[x] += wrow[static_cast<size_t>(x)] * src[x];
        }
    }
  if (clamp) vae::clamp_inplace(video, -1.0f, 1.0f);
  return video;
}

}  // namespace wan
