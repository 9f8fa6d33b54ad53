// Internal to the GPU DiT (dit_gpu.cpp, dit_gpu_plan.cpp): the geometry of one forward (everything derived
// from config, shape and parallel layout), the arena constants, and the memory-plan helpers the creation
// uses. Invariant: DiTGpu::plan() and the forward derive every size from the same Geometry.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

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
DeviceTable build_weight_table(const DiTConfig& cfg);  // check_config, then the placed dit_weight_table

std::string gib(size_t bytes);  // "12.34" (GiB, two decimals)

// Throws when the plan of (shape, experts) does not fit `free_bytes`, naming the frames that would.
void check_fit(const DiTConfig& cfg, const DiTShape& shape, int experts, size_t attn_ws, size_t free_bytes,
               int device, const dist::Layout& par = {});
// `p` (a plan without cuDNN's workspace) with the workspace: plan() adds it last, so no other buffer
// moves and the result equals plan(..., attn_ws, ...).
MemoryPlan with_attention_workspace(MemoryPlan p, size_t attn_ws);

}  // namespace wan::cuda::dit_gpu_detail
