// The engine's own FP8 attention forward for Hopper (sm_90a), opt-in beside the exact bf16 OwnAttention
// (attention_own.h): the same contract (bf16 Q/K/V views in the projections' token-major layout, bf16 O,
// optional key lengths and log-sum-exp), plus a workspace for the quantised copies.
// Scheme (the CPU reference ops::attention_fp8_ref, ops/fp8_attention_ref.h, spells every operation):
//   Q: e4m3 with one scale per 128 query rows of a head (core/fp8_rows.h's rule on the block amax);
//   K: smoothed (the per-(sample, head, channel) mean over the valid keys subtracted: softmax ignores it),
//      then e4m3 with one scale per 128 keys of a head; the LSE gets scale·q·mean back, so it equals the
//      unsmoothed attention's (ring attention merges partial results by it);
//   V: e4m3 with one scale per (sample, head, channel), stored transposed [head dim][keys] (FP8 wgmma
//      reads both operands K-major) with the keys of each 16 permuted so that each thread writes the P of
//      its own accumulator elements (no shuffles);
//   P: exp2(s·f − m + 6) rounded to e4m3 for P·V, the running max m moving only when a tile's exceeds it
//      by more than 2 (lazy rescale: P <= 256, O rescaled only on a move; WAN_ATTN_FP8_LAZY=0: eager, P =
//      exp2(s·f − m + 8)); the row sum l of the rounded P (the tensor cores sum each 128-key tile, fp32
//      adds the tiles); fp32 accumulators throughout.
// Invariants: no host synchronisation; capturable in CUDA graphs; the workspace is the caller's.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_cudnn.h"  // AttentionShape, AttentionArgs

namespace wan::cuda {

// Where the quantised tensors live in the workspace (offsets in bytes, each 256-byte aligned). The K/V
// side comes first and its offsets depend only on B·H and Lk, so a call with another Lq finds a previous
// call's K/V quantisation where it left it (Fp8KV::Reuse).
struct Fp8AttentionLayout {
  int64_t BH = 0, Lq = 0, Lk = 0, Lk16 = 0;  // Lk16: Lk rounded up to 16 (the transposed V's row length)
  int64_t q_tiles = 0, k_blocks = 0, chunks = 0;
  size_t q = 0, k = 0, vt = 0;               // e4m3 [BH, Lq, 128], [BH, Lk, 128], [BH, 128, Lk16]
  size_t q_scale = 0, k_scale = 0;           // fp32 [BH, q_tiles], [BH, k_blocks]
  size_t v_amax = 0;                         // uint32 magnitude bits [BH, 128]
  size_t k_partial = 0, k_mean = 0;          // fp32 [BH, chunks, 128], [BH, 128]
  size_t q_mean_dot = 0;                     // fp32 [BH, Lq]: q·mean (the LSE's correction)
  size_t bytes = 0;
};
Fp8AttentionLayout fp8_attention_layout(const AttentionShape& s);

// What OwnAttentionFp8::run quantises. Reuse: Q only; the workspace must hold the K/V quantisation of
// the previous run() on it, with the same K and V (values, B, H, Lk, strides, key lengths) and no other
// use of the workspace since: the chunked forward's query chunks of one sample (dit_gpu_chunked.cpp).
enum class Fp8KV : uint8_t { Quantize, Reuse };

class OwnAttentionFp8 {
 public:
  // True when the current device is sm_90 and the binary has the sm_90a kernel.
  static bool supported();
  // Throws wan::Error (BadInput) for a shape this kernel cannot run (head dim, output type, strides).
  static void validate(const AttentionShape& s);
  static size_t workspace_size(const AttentionShape& s) { return fp8_attention_layout(s).bytes; }
  // Quantises Q/K/V (Q alone with Fp8KV::Reuse) into the workspace and runs the attention, all on `stream`.
  static void run(const AttentionShape& s, const AttentionArgs& a, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, Fp8KV kv = Fp8KV::Quantize);
};

// Whether run() uses the lazy rescale (the default; WAN_ATTN_FP8_LAZY=0: eager), for emulations to match.
bool fp8_attention_lazy_rescale();

// The quantisation passes alone (attention_fp8_quant.cu; run() calls it first): fills the workspace's
// q, k, vt, scales, mean and q·mean (when s.lse) from a's bf16 Q/K/V; with Fp8KV::Reuse only q, its
// scales and q·mean (from the k mean already there).
void fp8_attention_quantize(const AttentionShape& s, const AttentionArgs& a, const Fp8AttentionLayout& l,
                            uint8_t* workspace, cudaStream_t stream, Fp8KV kv = Fp8KV::Quantize);

}  // namespace wan::cuda
