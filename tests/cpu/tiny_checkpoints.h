// The tiny random-weight checkpoints that the loader tests (CPU stream loader, GPU loader) read:
// make_tiny_checkpoint writes one (`wan make-checkpoint --config tiny` in the given layout and DiT
// dtype; shard > 0 caps the shard size so the weights span several files), and
// make_tiny_checkpoint_set writes the four that both suites cover into one folder:
//   off_f32, off_bf16   official layout, fp32 / bf16 DiT
//   dif_f32, dif_bf16   diffusers layout, fp32 / bf16 DiT (dif_bf16 in ~300 kB shards)
#pragma once
#include <cstdint>
#include <string>

#include "ckpt/layout.h"
#include "core/dtype.h"
#include "gen/make_checkpoint.h"
#include "test_util.h"

namespace wan::test {

inline void make_tiny_checkpoint(const std::string& out, Layout layout, DType dtype, uint64_t seed,
                                 uint64_t shard = 0) {
  gen::MakeCheckpointOptions o;
  o.config = "tiny";
  o.layout = layout;
  o.dtype = dtype;
  o.seed = seed;
  o.out = out;
  if (shard) o.max_shard_bytes = shard;
  gen::make_checkpoint(o);
}

inline void make_tiny_checkpoint_set(const TempDir& dir, uint64_t seed) {
  make_tiny_checkpoint(dir / "off_f32", Layout::Official, DType::F32, seed);
  make_tiny_checkpoint(dir / "off_bf16", Layout::Official, DType::BF16, seed);
  make_tiny_checkpoint(dir / "dif_f32", Layout::Diffusers, DType::F32, seed);
  make_tiny_checkpoint(dir / "dif_bf16", Layout::Diffusers, DType::BF16, seed, 300000);  // several shards
}

}  // namespace wan::test
