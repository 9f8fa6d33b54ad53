// The engine's own fused attention forward for Hopper (sm_90a): FlashAttention-3-class machinery written
// from the public PTX ISA (no code from other repositories). Same contract as CudnnAttention
// (attention_cudnn.h): O = softmax(Q·Kᵀ·scale)·V per (sample, head), non-causal, head dim 128, bf16
// Q/K/V/O in the token-major layout the projections write (Q [B, Lq, H, 128], K/V [B, Lk, H, 128] with a
// free token stride, so Q/K/V may be views into a fused QKV output), optional per-sample key lengths
// (k_lens, device int32 [B], 1 <= k_lens[b] <= Lk) and optional log-sum-exp output [B, H, Lq] (natural log).
//
// Invariants: no workspace; no host synchronisation; capturable in CUDA graphs (tensor maps are kernel
// parameters built on the host per call). Requires an sm_90 device and 16-byte aligned pointers with
// token strides multiple of 8 elements; supported() says whether this device can run it.
#pragma once
#include <cuda_runtime.h>

#include "kernels/attention_cudnn.h"  // AttentionShape, AttentionArgs

namespace wan::cuda {

// Kernel (attention_own.cu): work items of (128 query rows, head, sample); one CTA per item for long key
// sequences, a persistent grid (one CTA per SM looping over items) for short ones (<= 1024 keys, the text);
// 3 warpgroups:
//   - producer (1 thread issues, registers released with setmaxnreg): TMA (cp.async.bulk.tensor, 128-byte
//     swizzle) loads of Q once per item (two Q buffers with 128-key tiles, so the next item's Q loads
//     during the current one) and of K/V tiles (176 keys, or 128 for short sequences) into a 2-stage
//     shared-memory ring, K issued one tile ahead of V; completion on mbarriers (separate K and V barriers
//     so Q·Kᵀ starts before V lands); each consumer warp frees a stage with one mbarrier arrive;
//   - 2 consumers (64 query rows each): S = Q·Kᵀ with wgmma m64nNk16 (both operands from shared memory),
//     online softmax in fp32 (exp2 with the scale folded into one FMA, row max over the quad by shuffles),
//     P rounded to bf16 and kept in registers as the A operand of O += P·V (wgmma, V read N-major through
//     the descriptor: no transpose pass). The next tile's Q·Kᵀ is issued before this tile's softmax
//     finishes with P·V, so the softmax overlaps the tensor cores; the two consumers also take turns
//     issuing (ping-pong on named barriers), so one's softmax runs under the other's wgmmas. Row max and
//     sum use 4 independent chains per row; O's rescale by the previous tile's factors runs after the
//     next Q·Kᵀ is issued (on the tensor cores meanwhile), just before the P·V that accumulates into O.
//     With 128-key tiles (persistent grid) the pipeline runs across items: an item's last P·V is issued
//     with the next item's first Q·Kᵀ and its epilogue runs under the other consumer's wgmmas. The
//     epilogue writes O in 16-byte stores (a 4x4 transpose over each quad of lanes), whole sectors.
// Numerics: fp32 scores, softmax and accumulation; P rounded to bf16 before P·V (as cuDNN and FA3);
// O = acc / rowsum rounded once to bf16. Ragged lengths: TMA zero-fills rows past Lq / Lk, keys >= the
// valid length are masked to -inf in the last tile, rows >= Lq are not stored.

class OwnAttention {
 public:
  // True when the current device is sm_90 (Hopper) and the binary has the sm_90a kernel.
  static bool supported();
  // Throws wan::Error (BadInput) for a shape this kernel cannot run (head dim, output type, strides).
  static void validate(const AttentionShape& s);
  // Enqueues the attention on `stream`.
  static void run(const AttentionShape& s, const AttentionArgs& a, cudaStream_t stream);
};

}  // namespace wan::cuda
