// A model's weights in one device allocation (the GPU DiT's experts, the GPU text encoder): the placement
// of its weight table (models/*/weights.h) and the three ways to fill or read it (host upload, random
// draw on the GPU, download for CPU references).
//
// DiT layout: every official tensor (spec §3.2) is one contiguous range of the allocation, in the dtype the
// forward consumes it in (bf16: GEMM weights/biases and the q/k RMSNorm weights; fp32: modulation
// tables, norm3, time MLP/projection, head). Fused GEMMs are made by placement, not by copies: the
// self-attention q, k, v weights are consecutive ([3D, D] rows q|k|v) as are their biases ([3D]), and
// the cross-attention k, v weights and biases ([2D, D], [2D]), so one GEMM computes all three (two).
// FP8 GEMM weights (dtype F8E4M3, DiTGemm::Fp8): e4m3 bytes [N, K] plus fp32 scales [N] (core/fp8_rows.h);
// a fusion group's scale ranges follow its weights, back to back in the same order, so one GEMM reads them.
// Invariants: every range starts 16-byte aligned (256 for a new group); shapes are the official ones
// (patch embedding [D, C, pt, ph, pw] is the flattened [D, C·pt·ph·pw] the GEMM reads).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/layout.h"
#include "core/tensor.h"
#include "models/weight_spec.h"
#include "runtime/load_gpu.h"

namespace wan::cuda {

// Where a model's weights come from: the tensor stored under an official name (host, any float dtype),
// and, for streaming, the byte range of that tensor in its file (none: the getter is used).
using WeightGetter = std::function<Tensor(const std::string& official_name)>;
using WeightSpanFn = std::function<std::optional<RawSpan>(const std::string& official_name)>;
// A change to a tensor's fp32 values before they are rounded to the device dtype (the LoRA merge):
// for an official name, the hook, or an empty function when the tensor is kept. The hook gets the
// tensor in fp32 (LoadTarget::merge's work buffer: dtype F32) or, on the device already, in its
// storage dtype F32 or BF16, to be merged in place with one rounding (kernels/lora_merge.h).
using WeightMerge = std::function<void(void* w, DType dtype, cudaStream_t stream)>;
using WeightMergeFn = std::function<WeightMerge(const std::string& official_name)>;

namespace dit_gpu_detail {

struct DeviceEntry {
  std::string name;  // official name
  DType dtype = DType::BF16;
  Shape shape;
  size_t offset = 0, bytes = 0;
  float scale = 0.0f, offset_value = 0.0f;  // random init: normal·scale + offset_value (normal_draw)
  size_t scale_offset = 0;  // F8E4M3: the fp32 row scales [shape[0]] at this byte offset
  bool fp8() const { return dtype == DType::F8E4M3; }
  // One past its last byte, its e4m3 row scales included.
  size_t end() const {
    return fp8() ? std::max(offset + bytes, scale_offset + static_cast<size_t>(rows()) * 4) : offset + bytes;
  }
  int64_t rows() const { return shape[0]; }                 // F8E4M3: [rows, cols]
  int64_t cols() const { return shape.numel() / shape[0]; }
};

// A model's weight table (models/*/weights.h) placed in one allocation.
struct DeviceTable {
  std::vector<DeviceEntry> entries;
  std::unordered_map<std::string, size_t> index;
  size_t bytes = 0;  // the whole allocation
  const DeviceEntry& at(const std::string& name) const;  // throws wan::Error naming the tensor
};

size_t align_up(size_t v, size_t a);
constexpr size_t kGroupAlign = 256;  // a new group of tensors starts on this boundary

// Places the rows of `rows` (shared by the GPU DiT and the GPU text encoder): each row not in a fusion
// group starts a new kGroupAlign-aligned range; the rows of one fusion group are placed back to back
// (16-byte aligned, in table order) where the group's first row falls. F8E4M3 rows (2-D) take
// shape[0]·4 more bytes of scales, placed after the group's data.
DeviceTable place_weights(const WeightTable& rows);


// Fills dev (table.bytes). Without `span`: from the callback, one tensor at a time, converting on the
// host in chunks (host peak: the source tensor + a 16 MB staging chunk). With `span`: streamed from the
// files through pinned staging and converted on the GPU (load_gpu.h, LoadOptions::tuned() on the
// current device); tensors without a byte range go through the callback. With `loader` (not started):
// only adds the tensors to it as completion group `group`; the caller starts it and waits for it.
// Errors name the tensor ("<what> weight <name>").
// With `merge`, every tensor it gives a hook for is merged in fp32 before its one rounding (load_gpu.h
// LoadTarget::merge), on either path. F8E4M3 entries are quantised by rows from the fp32 values (host
// path: ops::quantize_rows_fp8; streamed: the GPU quantiser, bit-identical).
void upload_weights(const DeviceTable& table, void* dev, const WeightGetter& get, const char* what = "DiT",
                    const WeightSpanFn& span = {}, DeviceLoader* loader = nullptr, int group = 0,
                    const WeightMergeFn& merge = {});
// The streaming upload's targets of a table (what upload_weights hands the loader): one per tensor, its
// span when `span` gives one, else the getter as the fallback.
std::vector<LoadTarget> weight_targets(const DeviceTable& table, void* dev, const WeightGetter& get, const char* what,
                                       const WeightSpanFn& span, int group = 0, const WeightMergeFn& merge = {});
// Merges the tensors `merge` gives hooks for into weights already on the device (after a random draw),
// in place: fp32 and bf16 tensors go to the hook as they are (bf16: a second rounding after the
// draw's), others are widened to an fp32 work buffer (stream-ordered) and rounded back. Enqueued on
// `stream`. Returns the number of tensors merged. F8E4M3 entries are skipped: draw_random_weights
// merges them before their quantisation.
int apply_weight_merges(const DeviceTable& table, void* dev, const WeightMergeFn& merge, cudaStream_t stream);
// Draws every tensor on the GPU (random_weight_key of the row name, normal_draw of its rule); scratch holds at least max_small_floats()
// floats (staging of the bf16 tensors that have an offset, and of one row of every F8E4M3 tensor).
// F8E4M3 tensors: the fp32 values n·scale + offset, merged by `merge`'s hook when it gives one (whole
// tensor in a stream-ordered work buffer), then quantised by rows (without a hook: in row chunks of the
// scratch).
void draw_random_weights(const DeviceTable& table, void* dev, uint64_t seed, float* scratch, size_t scratch_floats,
                         cudaStream_t stream, const WeightMergeFn& merge = {});
size_t max_small_floats(const DeviceTable& table);
Tensor download_weight(const DeviceTable& table, const void* dev, const std::string& name);

}  // namespace dit_gpu_detail
}  // namespace wan::cuda
