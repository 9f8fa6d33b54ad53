// Internal to the GPU DiT (dit_gpu.cpp, dit_gpu_plan.cpp, dit_gpu_time.cpp, dit_gpu_weights.cpp): the
// geometry of one forward (everything derived from config, shape and parallel layout), the arena
// constants, the memory-plan helpers the creation uses, the attention shapes of a geometry, the device
// pointers of an expert's weights, and the time side of the forward (timestep checks, time MLP, the
// modulation vectors that pick a token's timestep row).
// Invariant: DiTGpu::plan() and the forward derive every size from the same Geometry.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/attention_cudnn.h"  // AttentionShape
#include "kernels/dit_kernels.h"      // ModVec
#include "models/config.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/seq_attention_gpu.h"
#include "models/weights_gpu.h"
#include "runtime/dist/parallel_layout.h"

namespace wan::cuda::dit_gpu_detail {

constexpr size_t kAlign = 256;
// Kept free beyond the plan: cuBLASLt/cuDNN handles and their lazily loaded kernels, graph
// executables, the CUDA context's growth.
constexpr size_t kReserveBytes = size_t{512} << 20;
constexpr int kRopeMaxPos = kDiTRopePositions;
constexpr double kMiB = 1024.0 * 1024.0;

inline size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Everything derived from (config, shape, parallel degrees). Single-GPU: Bg = B, S = Lpad = L.
struct Geometry {
  int64_t B, C, Co, T, H, W;   // B: samples this rank runs (the global batch / the cfg degree)
  int pt, ph, pw;
  int64_t f, gh, gw, L, rows;  // grid after patching, real tokens per sample, B·S rows on this rank
  int64_t K, OP;               // patch features (C·P), head features (Co·P)
  int64_t D, F, NH, TL, TD, FQ;
  int64_t Bg;                  // the global batch (forward()'s inputs and output)
  int64_t S, Lpad;             // tokens per sample on this rank (its slice), padded tokens per sample
  dist::Layout par;
  bool one_latent = false;  // DiTShape::one_latent
  bool first_frame = false; // DiTShape::first_frame_t
  int64_t first_tokens = 0; // gh·gw: the tokens of the first patch frame (latent frame 0 at patch (1, 2, 2))
  bool seq_parallel() const { return par.seq() > 1; }
  // The first block's self-attention part can run for sample 0 alone (DiTGpu::Impl::block): more than
  // one sample here and a whole sequence per rank; it does with one latent.
  bool can_share_first() const { return B > 1 && !seq_parallel(); }
  bool share_first() const { return one_latent && can_share_first(); }
};

Geometry geometry(const DiTConfig& c, const DiTShape& s, const dist::Layout& par = {});
SeqParallelAttention::Geometry spa_geometry(const Geometry& g);

// Checks the parts of cfg this engine relies on (head_dim 128, widths multiples of 8, ...).
void check_config(const DiTConfig& cfg);
// check_config, then the placed dit_weight_table; with Fp8 the blocks' GEMM weights stored as e4m3 rows.
DeviceTable build_weight_table(const DiTConfig& cfg, DiTGemm gemm = DiTGemm::Bf16);

std::string gib(size_t bytes);  // "12.34" (GiB, two decimals)

// Throws when the plan of (shape, experts) does not fit `free_bytes`, naming the frames that would.
void check_fit(const DiTConfig& cfg, const DiTShape& shape, int experts, size_t attn_ws, size_t free_bytes,
               int device, const dist::Layout& par = {}, DiTGemm gemm = DiTGemm::Bf16, WeightResidency res = {});
// `p` (a plan without cuDNN's workspace) with the workspace: plan() adds it last, so no other buffer
// moves and the result equals plan(..., attn_ws, ...).
MemoryPlan with_attention_workspace(MemoryPlan p, size_t attn_ws);

// The self-attention shape of g (`one_sample`: the first block's shared self-attention,
// Geometry::share_first()) and the cross-attention's.
AttentionShape self_attn_shape(const Geometry& g, bool one_sample = false);
AttentionShape cross_attn_shape(const Geometry& g);
// The attentions of one chunk of n rows of one sample (WeightResidency::chunks, dit_gpu_chunked.cpp).
AttentionShape chunk_self_attn_shape(const Geometry& g, int64_t n);
AttentionShape chunk_cross_attn_shape(const Geometry& g, int64_t n);
// Rows per chunk of a sample of S rows in `chunks` chunks (MemoryPlan::chunk_rows); 0 for chunks <= 1.
int64_t chunk_rows_of(int64_t S, int chunks);
// Every attention shape a forward of g runs; `any_sharing`: also the shared first block's, whether g
// shares or not (create() sizes cuDNN's workspace for any forward up to its maximal geometry). With
// chunk_rows > 0 (a chunked plan): the chunks' shapes instead (the full chunk and the remainder).
std::vector<AttentionShape> attention_shapes(const Geometry& g, bool any_sharing, int64_t chunk_rows = 0);

// ---- an expert's weights (dit_gpu_weights.cpp) ----
// Device pointers of one block's weights. With DiTGemm::Fp8 the seven GEMM weights (*_w of qkv, o, cq,
// ckv, co, f0, f2) point to e4m3 bytes and their *_s to the fp32 row scales; in Bf16 every *_s is null.
struct BlockPtrs {
  const float* mod;                      // [6D] f32
  const bf16 *qkv_w, *qkv_b;             // [3D, D], [3D]
  const bf16 *o_w, *o_b, *nq, *nk;       // [D, D], [D], [D], [D]
  const float *n3w, *n3b;                // [D] f32
  const bf16 *cq_w, *cq_b;               // [D, D], [D]
  const bf16 *ckv_w, *ckv_b;             // [2D, D], [2D]
  const bf16 *co_w, *co_b, *cnq, *cnk;   // [D, D], [D], [D], [D]
  const bf16 *f0_w, *f0_b, *f2_w, *f2_b; // [F, D], [F], [D, F], [D]
  const float *qkv_s, *o_s, *cq_s, *ckv_s, *co_s, *f0_s, *f2_s;  // [3D], [D], [D], [2D], [D], [F], [D]
};
struct TimeMlp;
struct ExpertPtrs;
// Resolves every pointer once from the table (checks that fused weights and scales are contiguous):
// base + the tensor's offset, or addr(offset) (the residency's mapping, dit_gpu_residency.cpp).
ExpertPtrs resolve(const DeviceTable& t, const void* base, int layers);
ExpertPtrs resolve(const DeviceTable& t, const std::function<const char*(size_t offset)>& addr, int layers);

// Where the blocks lie in an expert's allocation: block i's tensors (e4m3 scales included) fill
// [blocks[i].first, blocks[i].second), ascending and disjoint, each starting on a group boundary; every
// other tensor lies outside [begin, end) (before: the embeddings and time MLP; after: the head).
struct BlockLayout {
  std::vector<std::pair<size_t, size_t>> blocks;
  size_t begin = 0, end = 0;
  size_t max_block = 0;  // the largest block's bytes
  size_t nonblock(size_t total) const { return begin + (total - end); }
};
BlockLayout block_layout(const DeviceTable& t, int layers);
// The entries of t that start in one of `ranges` ({begin, end, new offset of begin}), moved with their
// scales: a table for filling or reading just those bytes at other addresses. bytes = the last range's end.
DeviceTable sub_table(const DeviceTable& t, const std::vector<std::tuple<size_t, size_t, size_t>>& ranges);

// ---- the time side of the forward (dit_gpu_time.cpp; spec §2.4, §2.7, §2.9, §7.5.3) ----
// One expert's fp32 time MLP and projection: time_embedding.0 [D, FQ], [D]; .2 [D, D], [D];
// time_projection.1 [6D, D], [6D].
struct TimeMlp {
  const float *w0, *b0, *w2, *b2, *wp, *bp;
};
struct ExpertPtrs {
  const bf16 *pe_w, *pe_b;                                    // [D, K], [D]
  const bf16 *te0_w, *te0_b, *te2_w, *te2_b;                  // [D, TD], [D], [D, D], [D]
  TimeMlp time;                                               // fp32 time MLP and projection
  std::vector<BlockPtrs> blocks;
  const float *hmod, *head_w, *head_b;                        // [2D], [OP, D], [OP]
  int expert = 0;  // its index in the DiT (the residency's copies read that expert's host memory)
};
// A forward's time embedding on the device: e [B, D] and e0 [B, 6D] of t, e_first and e0_first of t_first
// (read only with Geometry::first_frame); token0: the sequence index of this rank's first row of a sample.
struct TimeRows {
  const float *e, *e0, *e_first, *e0_first;
  int64_t token0;
};
// y[M, N] = x[M, K]·w[N, K]ᵀ + b, all fp32: the forward's GEMM (bracketed when profiling).
using LinearF32 = std::function<void(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t K,
                                     int64_t N, cudaStream_t s)>;
// Checks DiTInputs::t and t_first against g: t_first given iff Geometry::first_frame; with one latent each
// equal across the samples. in.t is non-null (checked by the caller).
void check_timesteps(const Geometry& g, const DiTInputs& in);
// e [B, D] and e0 [B, 6D] of the B timesteps t (device), fp32 with the sinusoid in float64; sinus [B, FQ],
// temb [B, D] and e_silu [B, D] are scratch.
void time_embedding(const TimeMlp& w, const Geometry& g, const float* t, float* sinus, float* temb, float* e_silu,
                    float* e, float* e0, const LinearF32& linear, cudaStream_t s);
// Chunk k of a block's `modulation + e0` (0..5: shift, scale, gate of the self-attention, then of the
// FFN) and of the head's `modulation + e` (0, 1: shift, scale) for this rank's rows [B, S] of g.
ModVec block_mod(const float* modulation, int k, const Geometry& g, const TimeRows& tr);
ModVec head_mod(const float* modulation, int k, const Geometry& g, const TimeRows& tr);

}  // namespace wan::cuda::dit_gpu_detail
