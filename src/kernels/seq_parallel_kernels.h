// Memory-bound kernels of the sequence-parallel DiT forward (spec §8): the data reshuffles
// around the Ulysses all-to-alls and the output all-gather, the log-sum-exp merge of ring attention and
// the patch embedding of one rank's token slice. Host launchers on raw device pointers and a stream; no
// model types, no communication (the caller moves the bytes through kernels/seq_comm.h).
//
// Invariants: every copy moves 16-byte vectors (W, ld_i·elem and every pointer must be multiples of 16
// bytes: checked, wan::Error); nothing is rounded or reordered within a row, so the reshuffles are exact.
// The merge is fp32 and deterministic (one thread per 8 output elements, fixed order). Launchers never
// synchronise; they are capturable in CUDA graphs.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace wan::cuda {

// Layout names (U = group size, n = tensors moved together, R = rows per tensor = Bl·Lc tokens of the
// local slice, W = bytes of one row's moved part, Du = heads/U · 128):
//   token-major    T_i[r·ld_i + j·W ...]            (row r of tensor i; part j of its columns)
//   chunked        C[((j·n + i)·R + r)·W ...]       (what an all-to-all sends to / receives from rank j)
//   sequence-major S_i[((b·U + j)·Lc + t)·W ...]    (tensor i with the U slices of sample b in order, r = b·Lc + t)
// Ulysses all-to-all #1: token-major q|k|v [Bl, Lc, H·128] --pack--> chunked --a2a--> chunked --unpack-->
// sequence-major [Bl, U·Lc, Du]; all-to-all #2 runs the same mappings the other way.

constexpr int kMaxMovedTensors = 3;  // q, k, v

// Token-major <-> chunked. T_i has row stride ld_bytes[i]; part j of row r starts at j·W bytes.
struct TokenMajor {
  char* t[kMaxMovedTensors] = {};
  int64_t ld_bytes[kMaxMovedTensors] = {};
};
// to_chunks: C <- T; else T <- C. n tensors, U parts per row, rows R, W bytes per part.
void token_major_chunks(const TokenMajor& tm, char* chunks, int n, int64_t U, int64_t rows, int64_t W,
                        bool to_chunks, cudaStream_t stream);

// Chunked <-> sequence-major. S_i dense with row W bytes; chunk (j, i) holds Bl·Lc rows (b, t).
struct SeqMajor {
  char* s[kMaxMovedTensors] = {};
};
void seq_major_chunks(const SeqMajor& sm, char* chunks, int n, int64_t U, int64_t Bl, int64_t Lc, int64_t W,
                      bool to_chunks, cudaStream_t stream);

// Ring attention merge of a partial result into the running one, per (sample b, query row l, head h) row of
// 128 values: o_part bf16 [B, Lq, H, 128] with lse_part f32 [B, H, Lq] (the attention's natural-log LSE)
// into acc f32 [B, Lq, H, 128] with acc_lse f32 [B, H, Lq]:
//   first: acc = o_part, acc_lse = lse_part;
//   else:  m = max(la, lb), wa = exp(la - m), wb = exp(lb - m), acc = (acc·wa + o·wb)/(wa + wb),
//          acc_lse = m + log(wa + wb);
//   out (when not null, the last block): bf16(acc) [B, Lq, H, 128], acc/acc_lse then need not be written.
void ring_merge(const __nv_bfloat16* o_part, const float* lse_part, float* acc, float* acc_lse, __nv_bfloat16* out,
                int64_t B, int64_t Lq, int64_t H, bool first, cudaStream_t stream);

// Patch-embedding im2col of the token slice [offset, offset + S) of each sample (as patchify_bf16 in
// dit_kernels.h, which covers [0, S)): x f32 [B, C, T, H, W] -> rows bf16 [B, S, K], K = C·pt·ph·pw in
// (c, qt, qh, qw) order; tokens >= f·h·w (sequence padding) are zero rows. K % 8 == 0.
void patchify_slice_bf16(const float* x, __nv_bfloat16* rows, int64_t B, int64_t C, int64_t T, int64_t H, int64_t W,
                         int pt, int ph, int pw, int64_t offset, int64_t S, cudaStream_t stream);

}  // namespace wan::cuda
