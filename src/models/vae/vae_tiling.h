// Spatial tiling of the VAE decode (issue 27, low memory): the latent frame is cut into overlapping tiles
// of one size, each tile decoded alone (all frames, the usual causal chunks), and the decoded tiles blended
// into the video with linear ramps over their overlaps (diffusers' AutoencoderKLWan.tiled_decode blends the
// same way, rows then columns). A decoder's memory then scales with the tile, not the frame.
// Not exact: the middle block's per-frame self-attention and every convolution see only their tile, so
// tiled video differs slightly from the untiled decode; the overlap hides the seams.
// Invariants: every tile has the same size (clamped to the latent size; the tiles of a row or column are
// spread evenly from edge to edge), so one decoder planned for that size decodes them all; every latent
// pixel is covered; at every pixel the blend weights of the tiles covering it sum to 1 (a tile's interior
// is copied with weight exactly 1); one tile is the untiled decode, which callers run as the plain path.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace wan {

// Latent units. tile 0: no tiling (one tile of the whole frame).
struct VaeTiling {
  int64_t tile_h = 0, tile_w = 0;        // latent pixels per tile
  int64_t overlap_h = 0, overlap_w = 0;  // latent pixels neighbouring tiles share at least
  bool on() const { return tile_h > 0 && tile_w > 0; }
  bool operator==(const VaeTiling&) const = default;
};

// The tiling of a pixel tile (`tile_px_h` x `tile_px_w`, multiples of 4 · sf) with a 1/4 overlap: the
// overlap diffusers uses (256-pixel tiles, 192-pixel stride), in latent pixels.
VaeTiling vae_tiling_from_pixels(int64_t tile_px_h, int64_t tile_px_w, int sf);

// One axis: the starts of tiles of min(tile, n) latent pixels over n: the fewest with steps of at most
// tile - overlap, spread evenly from 0 to n - tile (so every tile stays inside and neighbours share at
// least `overlap`). tile <= 0 or tile >= n: {0}.
std::vector<int64_t> vae_tile_starts(int64_t n, int64_t tile, int64_t overlap);

struct VaeTile {
  int64_t y0 = 0, x0 = 0, h = 0, w = 0;  // latent pixels
};
// Row-major grid of tiles over latent h x w; all of size vae_tile_size.
std::vector<VaeTile> vae_tile_grid(int64_t h, int64_t w, const VaeTiling& t);
// The latent size of every tile of the grid: (min(tile_h, h), min(tile_w, w)), or (h, w) untiled.
std::pair<int64_t, int64_t> vae_tile_size(int64_t h, int64_t w, const VaeTiling& t);
// Tiles in the grid (1: the untiled decode).
int64_t vae_tile_count(int64_t h, int64_t w, const VaeTiling& t);

// One axis' blend weights in pixels: for each tile of vae_tile_starts(n, tile, overlap), sf · tile weights.
// Inside an overlap of length L pixels the incoming tile's raw weight rises as (i + 0.5) / L and the
// outgoing one's falls as its mirror; elsewhere 1; the raw weights are then divided by their sum at each
// pixel (which only matters where three tiles meet: short frames cut into tiles with a large overlap).
std::vector<std::vector<float>> vae_blend_weights(int64_t n, int64_t tile, int64_t overlap, int sf);

// Decodes one latent tile [z, T, th, tw] (f32) to its video [3, F, sf · th, sf · tw] (f32, not clamped).
using VaeTileDecoder = std::function<Tensor(const Tensor& latent_tile)>;

// latents [z, T, h, w] (any float dtype) -> video [3, F, sf·h, sf·w] f32 (allocated here; F from the first
// tile): each tile of the grid decoded by decode_tile in row-major order and accumulated with its 2-D
// weight (the product of the axes' blend weights), then clamped to [-1, 1] when clamp.
Tensor vae_tiled_decode(const Tensor& latents, const VaeTiling& tiling, int sf, bool clamp,
                        const VaeTileDecoder& decode_tile);

}  // namespace wan
