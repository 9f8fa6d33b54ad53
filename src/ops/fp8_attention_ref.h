// CPU float32 reference of the engine's FP8 (e4m3fn) attention, the test oracle of the GPU kernel: it
// follows the kernel's scheme literally, fp32 operation order included (fp8_attention_ref.cpp spells
// each step). Per (sample, head): K is smoothed by its mean over the valid keys (softmax-invariant), Q
// and the smoothed K are quantised in blocks of 128 tokens x 128 dims, V per channel over the valid
// keys (all through core/fp8_rows.h); scores are exact sums of e4m3 products; the online softmax runs
// over key tiles of key_tile keys with P scaled by 2^offset and rounded to e4m3 before P·V. The default
// options are the kernel's scheme (lazy rescale, row sums of the rounded P); both off is the eager one
// the kernel started from (P scaled by 2^8, l summed before the rounding).
// Invariants: keys j >= k_lens[b] enter nothing (not the mean, not an amax, not a sum), so a masked
// call equals the unmasked call on the truncated keys bit for bit; results do not depend on the
// thread count (every value is computed by one task in a fixed order).
#pragma once
#include <cstdint>

namespace wan::ops {

struct Fp8AttentionRefOptions {
  int key_tile = 128;  // BN of the online softmax: 128 or 256 (the kernel's two tile shapes)
  // The kernel's lazy rescale: the running row max m moves only when a tile's max exceeds it by more than
  // 2 (log2 units: the accumulator is then rescaled), and P = 2^(s·f − m + 6) (<= 256) instead of
  // 2^(s·f − m + 8); the LSE subtracts 6.
  bool lazy_rescale = true;
  // The row sum l adds each P after its rounding to e4m3, as the kernel does (it sums the P tile on the
  // tensor cores), instead of before.
  bool l_of_rounded_p = true;
};

// q [B, Lq, H, D], k and v [B, Lk, H, D] dense token-major fp32 (bf16-exact values in practice), D = 128.
// k_lens (nullable, int64 [B]): keys j >= k_lens[b] are masked; each length is clamped to [1, Lk].
// scale: the softmax scale, 0 for 1/sqrt(128). out [B, Lq, H, D] fp32; lse (nullable) [B, H, Lq], the
// natural-log sum of exp(scale · q·k) over the valid keys, the smoothing's shift restored (so partial
// results over key subsets merge by LSE as unsmoothed ones would). out must not alias q, k or v.
// Throws wan::Error for D != 128, a size < 1, a null operand or a key_tile other than 128 / 256.
void attention_fp8_ref(const float* q, const float* k, const float* v, float* out, float* lse, int64_t B,
                       int64_t Lq, int64_t Lk, int64_t H, int64_t D, const int64_t* k_lens, float scale,
                       const Fp8AttentionRefOptions& opt = {});

}  // namespace wan::ops
