// Streaming weight upload: checkpoint file -> pinned staging -> device weights, bounded by the slower
// of page-cache reads and host-to-device copies. The GPU sink of ckpt/stream.h.
//
// Invariants (details below the namespace line):
// - results are bit-identical to the host path (get_f32, rounded to nearest even), NaN payloads aside;
// - groups arrive in the order their first target was added; wait_group() returns once a group is on
//   the device;
// - an error stops all new work and surfaces as one wan::Error naming the file and tensor;
// - staging is freed on the caller's thread only (finish() or the destructor), never on the load thread,
//   so a CUDA graph capture running beside the load is never invalidated;
// - the destructor cancels a running load and waits for it; it never throws.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "ckpt/stream.h"
#include "core/tensor.h"

namespace wan::cuda {

// A DeviceLoader takes a list of targets (the stored bytes of a tensor as a RawSpan, the device
// destination, its dtype bf16 or f32), possibly of several components (a completion group each),
// and on a background thread:
//   1. uploads the few tensors without a byte range (strided .pth tensors) through their fallback
//      getter (host conversion, as the old upload did);
//   2. runs a StreamLoader (reader threads, pread) over a ring of K pinned staging buffers
//      (cudaHostAlloc, one at a time on the StreamLoader's grow thread: the readers start on the
//      first buffer instead of waiting ~30 ms for the whole ring to be pinned) and, for each filled
//      buffer, enqueues on its own copy stream either one
//      cudaMemcpyAsync straight into the destination (same dtype, unscaled) or a copy into the
//      buffer's device staging slot, and then on a second stream, after that copy, a conversion
//      kernel (fp32 / fp16 / bf16 / fp8 e4m3 / fp8 e5m2 / fp64, times the fp8_scaled scale, -> bf16 or
//      fp32; 16-byte vector accesses), so copies never wait for conversions; then records the
//      buffer's event. Leases are handed back when their event has completed (polled after each
//      enqueue; the reclaim hook waits on the oldest), so at most K buffers are in flight.
// No synchronous per-tensor copies, no conversion on the host, no host copy of a whole shard: host
// memory is the K staging buffers.
//
// Invariants:
// - Results are bit-identical to the old host path (get_f32, then round to nearest even to bf16;
//   fp8_scaled: f32(fp8) * scale in f32, then rounded), except that NaN payloads of a same-dtype
//   copy are kept (the host path made them the canonical NaN).
// - Groups: read in the order their first target was added (a text encoder added first is on the
//   device first); wait_group() returns once every byte of the group is on the device.
// - Errors (a short or failing read, a file truncated during the load, a CUDA error, cancel()):
//   the load stops issuing work (no new read, copy or conversion), the loader's own streams are
//   synchronised, and then wait_group() / finish() throw one wan::Error naming the file and tensor.
// - Staging (pinned host buffers, device staging, streams, events) is freed on the caller's thread,
//   never on the load thread, whether the load succeeded or failed: by finish() (which frees it,
//   then returns the statistics or throws the error) or by the destructor. Freeing device memory and
//   freeing (unpinning) pinned host memory synchronise the device, which would invalidate a CUDA graph
//   capture running on another thread (the DiT's warm-up beside the load) and bury the loader's clear
//   error under that capture's CUDA error; the caller knows when no capture runs, the load thread does
//   not. Apart from allocating and pinning the ring at the start, the load threads only enqueue on,
//   query and synchronise the loader's own non-blocking streams and events, also after a failure,
//   which a cudaStreamCaptureModeThreadLocal capture on another thread (the engine's mode) tolerates;
//   wait_group() frees nothing, so it may be called during a capture. On success the load is done
//   (LoadStats::seconds) as soon as every weight is on the device; finish() frees the staging after
//   that (LoadStats::free_seconds). The destination memory belongs to the caller (it may be freed once
//   finish() or the destructor has returned).
// - The destructor cancels a running load and waits for it; it never throws.

struct LoadTarget {
  std::string name;                  // for errors, e.g. "DiT expert 1 weight blocks.3.ffn.0.weight"
  std::optional<RawSpan> span;       // the stored bytes; nullopt: `fallback` supplies the tensor
  std::function<Tensor()> fallback;  // host tensor of any float dtype; used when !span
  void* dst = nullptr;               // device memory: shape.numel() elements of dtype, 16-byte aligned
  DType dtype = DType::BF16;         // BF16, F32 or F8E4M3 (then shape is [rows, K] and scale_dst is set)
  // F8E4M3: the tensor is assembled in fp32 as for `merge` (merged first when it has a hook), then
  // quantised by rows (kernels/fp8_quant.h, the scheme of core/fp8_rows.h) into dst and the fp32 row
  // scales scale_dst [rows] (16-byte aligned). A fallback tensor goes up in fp32 and takes the same kernel.
  // Stored e4m3 bytes without a merge (ComfyUI fp8_scaled) are used as stored instead: copied as they
  // are, every row scale set to the tensor's scale_weight (1 when unscaled).
  float* scale_dst = nullptr;
  Shape shape;                       // the source's shape must equal it
  int group = 0;                     // completion group (one per component)
  // Optional: a change to the tensor's fp32 values before they are rounded to `dtype` (the LoRA merge,
  // lora/lora_gpu.h). The tensor is then assembled in fp32 in a device work buffer of its own
  // (shape.numel() floats, allocated and freed stream-ordered on the conversion stream: no device
  // synchronisation): every chunk is converted into it, and once the last one is in, merge(work,
  // stream) enqueues its work on `stream` and the result is rounded once into dst. merge is called on
  // the load thread, serialised with the other sink calls; it must only enqueue on `stream`.
  std::function<void(float* work, cudaStream_t stream)> merge;
};

// Tuning (measured on the H100 machine, bench/results/load-*.json): the ring must hold the buffers
// being read (one per reader) plus those whose copy is in flight, so K = readers + 4 keeps the copy
// engine fed; 8 MB chunks cost ~150 us each at 55 GB/s, far above the ~10 us of enqueueing one, and a
// smaller ring is quicker to pin (pinned host = device staging = K x 8 MB); 32 MB chunks were slower.
struct LoadOptions {
  int device = 0;
  size_t buffer_bytes = size_t{32} << 20;  // per staging buffer (and chunk); rounded down to 64
  int buffers = 4;                         // K >= 2
  int threads = 4;                         // reader threads
  // Test hook, called (serialised) for every chunk after its read, before its copy is enqueued.
  std::function<void(const Chunk&)> on_chunk;
  // Readers and ring for this machine: hardware threads - 4, clamped to [2, 8], readers; K = readers
  // + 4 buffers of 8 MB.
  static LoadOptions tuned(int device = 0);
};

struct LoadStats {
  uint64_t bytes = 0;            // bytes streamed from files
  uint64_t chunks = 0;           // buffers copied
  uint64_t converted_chunks = 0; // ... of which went through a conversion kernel
  int tensors = 0;               // streamed tensors
  int fallback_tensors = 0;      // uploaded through their getter
  uint64_t fallback_bytes = 0;   // destination bytes of those
  double seconds = 0;            // start() to every weight on the device (staging freed after)
  double setup_seconds = 0;      // start() to the first read: streams, events, the files opened and the
                                 // first staging buffer pinned (the rest are pinned while reading)
  double stream_seconds = 0;     // the StreamLoader run (from opening the files: it overlaps the end
                                 // of setup_seconds) and the last copies
  double free_seconds = 0;       // finish(): freeing the staging on the caller's thread (after `seconds`)
  StreamStats stream;            // the reader side
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes + fallback_bytes) / seconds / 1e9 : 0; }
};

class DeviceLoader {
 public:
  explicit DeviceLoader(LoadOptions opt = {});
  ~DeviceLoader();
  DeviceLoader(const DeviceLoader&) = delete;
  DeviceLoader& operator=(const DeviceLoader&) = delete;

  // Before start(), from any thread: checks the target (destination, dtype, shape and byte count of
  // the span) and throws wan::Error naming it.
  void add(LoadTarget t);
  // Fixes the read order of a group before any of its targets is added (else: its first add()).
  void add_group(int group);
  size_t size() const;
  // Starts the background load (once).
  void start();
  // Blocks until every target of `group` is on the device; throws the load's error if it failed
  // before that (freeing nothing). A group with no targets is complete at once.
  void wait_group(int group);
  // Waits for the whole load, frees the staging on this thread (success or failure: not while another
  // thread captures a CUDA graph), then throws the load's error (every call) or returns the statistics.
  LoadStats finish();
  // Stops a running load at the next chunk (finish() then throws "cancelled").
  void cancel();
  const LoadOptions& options() const;
  // Device bytes the loader allocates while it runs (the staging slots, when any target converts).
  static size_t device_bytes(const LoadOptions& o);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// add() every target, start(), finish().
LoadStats load_to_device(std::vector<LoadTarget> targets, const LoadOptions& opt = {});

// dst[i] = convert(src[i]) for i < n on `stream`: src of dtype src_type (any float dtype), times
// `scale` in f32 when scaled, rounded to dst_type (BF16 or F32) as core/dtype.h rounds.
void convert_weights(const void* src, DType src_type, bool scaled, float scale, void* dst, DType dst_type, int64_t n,
                     cudaStream_t stream);
// scales[0, rows) = scale on `stream` (the row scales of an e4m3 tensor stored with one scale).
void row_scales_fill(float* scales, int64_t rows, float scale, cudaStream_t stream);

}  // namespace wan::cuda
