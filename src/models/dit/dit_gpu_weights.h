// Internal to the GPU DiT (dit_gpu.cpp): the layout of one expert's weight allocation and the three
// ways to fill or read it (host upload, random draw on the GPU, download for CPU references).
//
// Layout: every official tensor (spec §3.2) is one contiguous range of the allocation, in the dtype the
// forward consumes it in (bf16: GEMM weights/biases and the q/k RMSNorm weights; fp32: modulation
// tables, norm3, time MLP/projection, head). Fused GEMMs are made by placement, not by copies: the
// self-attention q, k, v weights are consecutive ([3D, D] rows q|k|v) as are their biases ([3D]), and
// the cross-attention k, v weights and biases ([2D, D], [2D]), so one GEMM computes all three (two).
// Invariants: every range starts 16-byte aligned (256 for a new group); shapes are the official ones
// (patch embedding [D, C, pt, ph, pw] is the flattened [D, C·pt·ph·pw] the GEMM reads).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/config.h"
#include "core/tensor.h"
#include "models/dit/dit_gpu.h"
#include "runtime/load_gpu.h"

namespace wan::cuda::dit_gpu_detail {

struct WeightEntry {
  std::string name;  // official name
  DType dtype = DType::BF16;
  Shape shape;
  size_t offset = 0, bytes = 0;
  float scale = 0.0f, offset_value = 0.0f;  // random init: normal·scale + offset_value
};

struct WeightTable {
  std::vector<WeightEntry> entries;
  std::unordered_map<std::string, size_t> index;
  size_t bytes = 0;  // the whole allocation
  const WeightEntry& at(const std::string& name) const;  // throws wan::Error naming the tensor
};

size_t align_up(size_t v, size_t a);
constexpr size_t kGroupAlign = 256;  // a new group of tensors starts on this boundary

// Builds a WeightTable (shared by the GPU DiT and the GPU text encoder, t5_gpu.cpp): tensors are placed in
// order; add() starts a new kGroupAlign-aligned range, append() places a tensor right after the previous
// one (a fused GEMM operand; must stay 16-byte aligned). scale/offset are the random init.
class TableBuilder {
 public:
  void add(const std::string& name, DType t, Shape s, float scale, float offset = 0.0f) {
    put(name, t, s, scale, offset, align_up(table_.bytes, kGroupAlign));
  }
  void append(const std::string& name, DType t, Shape s, float scale, float offset = 0.0f);
  // Linear layer `name` [out, in] (+ bias [out]) with the default-init scale of its fan-in.
  void linear(const std::string& name, DType t, int64_t out, int64_t in) {
    const float sc = linear_scale(in);
    add(name + ".weight", t, {out, in}, sc);
    add(name + ".bias", t, {out}, sc);
  }
  WeightTable take() {
    table_.bytes = align_up(table_.bytes, kGroupAlign);
    return std::move(table_);
  }
  // PyTorch's default Linear init U(±1/√fan_in) approximated by N(0, 1/(3·fan_in)).
  static float linear_scale(int64_t fan_in);

 private:
  void put(const std::string& name, DType t, Shape s, float scale, float offset, size_t at);
  WeightTable table_;
};

// Checks the parts of cfg this engine relies on (head_dim 128, widths multiples of 8, ...).
void check_config(const DiTConfig& cfg);
WeightTable build_weight_table(const DiTConfig& cfg);

// Fills dev (table.bytes). Without `span`: from the callback, one tensor at a time, converting on the
// host in chunks (host peak: the source tensor + a 16 MB staging chunk). With `span`: streamed from the
// files through pinned staging and converted on the GPU (load_gpu.h, LoadOptions::tuned() on the
// current device); tensors without a byte range go through the callback. With `loader` (not started):
// only adds the tensors to it as completion group `group`; the caller starts it and waits for it.
// Errors name the tensor ("<what> weight <name>").
void upload_weights(const WeightTable& table, void* dev, const DiTWeightGetter& get, const char* what = "DiT",
                    const DiTWeightSpan& span = {}, DeviceLoader* loader = nullptr, int group = 0);
// The streaming upload's targets of a table (what upload_weights hands the loader): one per tensor, its
// span when `span` gives one, else the getter as the fallback.
std::vector<LoadTarget> weight_targets(const WeightTable& table, void* dev, const DiTWeightGetter& get, const char* what,
                                       const DiTWeightSpan& span, int group = 0);
// Draws every tensor on the GPU (see random_weight_seed); scratch holds at least max_small_floats()
// floats (staging of the bf16 tensors that have an offset).
void draw_random_weights(const WeightTable& table, void* dev, uint64_t seed, float* scratch, size_t scratch_floats,
                         cudaStream_t stream);
size_t max_small_floats(const WeightTable& table);
Tensor download_weight(const WeightTable& table, const void* dev, const std::string& name);

}  // namespace wan::cuda::dit_gpu_detail
