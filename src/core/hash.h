// The engine's one string hash and integer mixer. Random weights (their per-tensor keys), component seeds
// and the state file's settings fingerprint are all built from these two, so a value written by one part
// of the engine is reproduced by every other (CPU and GPU random weights, make-checkpoint and the engine).
// Invariant: the constants are FNV-1a 64's (offset basis 0xCBF29CE484222325, prime 0x100000001B3) and
// SplitMix64's finaliser; changing either changes every random weight and every saved state's fingerprint.
#pragma once
#include <cstdint>
#include <string_view>

namespace wan {

constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char ch : s) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001B3ull;
  }
  return h;
}

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static_assert(fnv1a64("") == 0xCBF29CE484222325ull && fnv1a64("a") == 0xAF63DC4C8601EC8Cull, "FNV-1a 64");

}  // namespace wan
