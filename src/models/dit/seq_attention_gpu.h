// The DiT's self-attention when the token sequence is split over ranks (spec §8): Ulysses
// (all-to-all over heads), Ring (key/value blocks passed around the ring, partial outputs merged with the
// log-sum-exp) and their 2D hybrid (Ulysses inside a ring group, ring across). Used by DiTGpu
// (dit_gpu.cpp); communication goes through kernels/seq_comm.h, so this file has no NCCL dependency.
//
// Invariants: run() enqueues work on `stream` (and the side stream, joined back before it returns), never
// synchronises the host and is capturable in a CUDA graph (events fork/join the side stream); every rank
// of the groups calls it with the same geometry. The buffers come from the DiT arena (plan_buffers lists
// them, bind() takes them); set_key_lengths() must have filled the k_lens table (outside any capture)
// for the geometry used. Numerics: one bf16 rounding of each partial output before the fp32 merge (the
// attention kernels emit bf16); U-only runs are the single-GPU attention up to the masking of padding.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention_cudnn.h"  // AttentionShape, AttentionArgs
#include "kernels/seq_comm.h"

namespace wan::cuda {

// Sequence layout: each sample's padded sequence of P·S tokens (P = U·R) is split into P contiguous
// slices; the rank of sequence rank c = ring rank·U + Ulysses rank holds tokens [c·S, (c+1)·S).
//   Ulysses: q|k|v [B, S, H·128] (this rank's tokens, all heads) --all-to-all--> [B, U·S, H/U·128] (the
//            ring block's U·S tokens, this rank's H/U heads); the attention output goes back the same way.
//   Ring:    the ring block (tokens [r·U·S, (r+1)·U·S) of ring rank r) attends to all R blocks; the k|v
//            block travels r -> r+1 on a side stream while the current block's attention runs on the
//            main stream (double buffer), and each partial output is merged in fp32 with the LSE.
// Padding keys (token index >= the real length L) are excluded with per-sample key lengths (k_lens);
// a ring block made only of padding is skipped. Query rows of padding tokens are computed and ignored.

class SeqParallelAttention {
 public:
  struct Geometry {
    int64_t B = 1;      // samples on this rank
    int64_t S = 1;      // tokens per sample on this rank (the slice)
    int64_t L = 1;      // real tokens per sample (<= U·R·S)
    int64_t heads = 1;  // all heads
    int U = 1, R = 1;
    int64_t D() const { return heads * 128; }
    int64_t rows() const { return B * S; }
    int64_t block() const { return U * S; }  // ring block tokens
    int64_t heads_per_rank() const { return heads / U; }
    bool padded() const { return static_cast<int64_t>(U) * R * S != L; }
  };
  struct Buffers {
    __nv_bfloat16 *send = nullptr, *recv = nullptr;  // [3·rows·D] each (U > 1)
    __nv_bfloat16* q = nullptr;                      // [rows·D] the ring block's queries (U > 1)
    __nv_bfloat16* kv[2] = {nullptr, nullptr};       // [2·rows·D] k | v of one block (kv[1]: R > 1)
    __nv_bfloat16* o = nullptr;                      // [rows·D] attention output, head layout (U > 1)
    __nv_bfloat16* o_part = nullptr;                 // [rows·D] one block's output (R > 1)
    float *lse_part = nullptr, *acc = nullptr, *acc_lse = nullptr;  // [rows·H], [rows·D], [rows·H] (R > 1)
    int32_t* k_lens = nullptr;  // [R][k_lens_stride] valid keys of each ring step's block, per sample
  };
  // The attention kernel the DiT runs (cuDNN or the own one), with its workspace bound.
  using AttentionFn = std::function<void(const AttentionShape&, const AttentionArgs&, cudaStream_t)>;

  // (name, bytes) of every buffer the geometry needs, in Buffers order; none when U = R = 1.
  static std::vector<std::pair<std::string, size_t>> plan_buffers(const Geometry& g);
  // The attention shape of every block (the same for every ring step): queries = keys = one ring block,
  // this rank's heads, masked when the sequence is padded, with the LSE when R > 1.
  static AttentionShape attention_shape(const Geometry& g);
  // Row stride of the k_lens table: B rounded up to 4 (each step's row 16-byte aligned for cuDNN).
  static int64_t k_lens_stride(const Geometry& g) { return (g.B + 3) / 4 * 4; }
  // Valid keys of ring step i's block for this rank (0: the block is all padding and skipped).
  static int64_t step_keys(const Geometry& g, int ring_rank, int step);

  // Comms: ulysses (size U) and ring (size R); null for degree 1. Creates the side stream and events on
  // the current device.
  SeqParallelAttention(SeqComm* ulysses, SeqComm* ring);
  ~SeqParallelAttention();
  SeqParallelAttention(const SeqParallelAttention&) = delete;
  SeqParallelAttention& operator=(const SeqParallelAttention&) = delete;

  void bind(const Buffers& b) { buf_ = b; }
  // Uploads the k_lens table of `g` (host -> device, synchronous on `stream`'s order; call outside a
  // graph capture, before the forward that uses it).
  void set_key_lengths(const Geometry& g, cudaStream_t stream);
  // q, k: [rows, D] dense (RMSNorm + RoPE outputs), v: [rows, v_ld] (a column slice of the fused QKV
  // output); out: [rows, D] dense, this rank's tokens, all heads.
  void run(const Geometry& g, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t v_ld,
           __nv_bfloat16* out, const AttentionFn& attention, cudaStream_t stream);

 private:
  SeqComm* ulysses_;
  SeqComm* ring_;
  Buffers buf_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t ev_ready_ = nullptr;
  std::vector<cudaEvent_t> ev_attn_, ev_recv_;  // per ring step
  std::vector<int32_t> k_lens_host_;
};

}  // namespace wan::cuda
