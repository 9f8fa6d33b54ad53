// The tiny random-weight checkpoints that the loader tests (CPU stream loader, GPU loader) read:
// make_tiny_checkpoint writes one (`wan make-checkpoint --config tiny` in the given layout and DiT
// dtype; shard > 0 caps the shard size so the weights span several files), and
// make_tiny_checkpoint_set writes the four that both suites cover into one folder (tiny_checkpoint
// writes one of them):
//   off_f32, off_bf16   official layout, fp32 / bf16 DiT
//   dif_f32, dif_bf16   diffusers layout, fp32 / bf16 DiT (dif_bf16 in ~300 kB shards)
#pragma once
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "ckpt/layout.h"
#include "core/dtype.h"
#include "testing/make_checkpoint.h"
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

// The set: folder name, layout, DiT dtype, shard cap (0: one file per component).
struct TinyCheckpointKind {
  const char* name;
  Layout layout;
  DType dtype;
  uint64_t shard;
};
inline constexpr TinyCheckpointKind kTinyCheckpoints[] = {
    {"off_f32", Layout::Official, DType::F32, 0},
    {"off_bf16", Layout::Official, DType::BF16, 0},
    {"dif_f32", Layout::Diffusers, DType::F32, 0},
    {"dif_bf16", Layout::Diffusers, DType::BF16, 300000},  // several shards
};

// One member of the set, by its folder name, written into dir unless it is already there; returns
// its path. A suite whose tests each read one checkpoint (ctest runs every test in a process of its
// own) writes only that one, not all four (~60 MB each).
inline std::string tiny_checkpoint(const TempDir& dir, const std::string& name, uint64_t seed) {
  for (const TinyCheckpointKind& k : kTinyCheckpoints) {
    if (name != k.name) continue;
    const std::string out = dir / name;
    if (!std::filesystem::exists(out)) make_tiny_checkpoint(out, k.layout, k.dtype, seed, k.shard);
    return out;
  }
  throw std::invalid_argument("tiny_checkpoint: no checkpoint named " + name);
}

inline void make_tiny_checkpoint_set(const TempDir& dir, uint64_t seed) {
  for (const TinyCheckpointKind& k : kTinyCheckpoints) tiny_checkpoint(dir, k.name, seed);
}

}  // namespace wan::test
