// Streaming checkpoint loads: the host side of "file -> staging -> device" at hardware speed.
// A LoadPlan lists the tensors to load and where their bytes lie (WeightStore::raw_span: file,
// offset, length, stored dtype, fp8 scale). StreamLoader cuts every tensor into chunks of at most
// chunk_bytes, reads them with `threads` reader threads (pread, sequential per file, whole plan in
// priority, then file order) into a ring of K caller-provided staging buffers (pinned memory on the
// GPU path), and hands each filled buffer to a sink with a StagingLease. The sink consumes the
// buffer (on the GPU, runtime/load_gpu.h: enqueue the H2D copy and the conversion kernel, record an
// event) and releases the lease, now or later, from any thread; only then is that buffer refilled.
//
// Invariants (in full below the namespace line): at most K staging buffers are in use at any time;
// every planned byte is delivered exactly once, in whole-element chunks inside one tensor; sink calls
// are serialised; any error stops the load and run() throws it, naming the file and tensor; on
// success run() returns only once every lease is released; reads never fault on a truncated file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/layout.h"

namespace wan {

// Invariants:
// - Ring bound: at most K buffers are being filled or held by the sink at any time, so the host
//   memory the load needs is the K staging buffers, whatever the checkpoint size; no shard is ever
//   copied whole.
// - Every byte of every planned tensor is delivered exactly once, in chunks that hold whole
//   elements (chunk_bytes is a multiple of 64), each chunk inside one tensor; order across chunks is
//   unspecified (several readers), so a sink must place chunks by (tensor, offset).
// - Sink calls (and the reclaim hook) are serialised: one at a time, on some reader thread.
// - Errors: a file shorter than a planned range (checked up front, and any short read while
//   loading, e.g. a file truncated mid-load), a read error, or an exception from the sink stop the
//   load: no new chunk is started, every reader thread is joined, and run() throws the first error
//   (a wan::Error naming the file and the tensor; sink errors keep their type, wan::Errors get that
//   context). run() never waits on a lease after an error: the sink owner must quiesce its own
//   asynchronous work (e.g. synchronise its stream) before freeing the staging buffers.
// - On success run() returns only when every lease has been released (calling reclaim while it
//   waits), so the staging buffers are free again.
// - Reads use pread on descriptors of their own, not the stores' mappings: a file truncated under
//   the load gives a short read (a clear error), never SIGBUS.
// - Growing ring (StreamOptions::grow): buffers made while the load runs join the ring as they come,
//   so the first read waits for one buffer, not for all of them; the grow thread is joined before
//   run() returns or throws, and the ring bound is then the number of buffers given plus grown.

struct PlanTensor {
  std::string name;  // as the caller names it (internal name; may repeat across components)
  RawSpan span;
  int priority = 0;  // read order: lower first (e.g. the text encoder before the DiT experts)
};

struct LoadPlan {
  std::vector<PlanTensor> tensors;  // in the order added; Chunk::tensor indexes this
  // Tensors without a single byte range (WeightStore::raw_span() == nullopt): load with get().
  std::vector<std::string> fallback;

  // Adds the named tensors of a store (all of store.names() when `names` is empty). Returns the
  // index of the first tensor added (they are consecutive, in the order of `names`).
  size_t add(const WeightStore& store, const std::vector<std::string>& names = {});
  void add(std::string name, RawSpan span, int priority = 0) {
    tensors.push_back({std::move(name), std::move(span), priority});
  }
  uint64_t total_bytes() const;
};

struct Chunk {
  size_t tensor = 0;         // index into LoadPlan::tensors
  const PlanTensor* t = nullptr;
  uint64_t offset = 0;       // byte offset within the tensor (a multiple of 64)
  uint64_t length = 0;       // bytes (whole elements); > 0
  DType dtype = DType::F32;  // stored dtype
  int buffer = 0;            // staging buffer index in [0, K)
  bool last = false;         // the tensor's last chunk (by offset, not by arrival)
};

// Chunks of a plan in read order (by priority, then file, then file offset); zero-byte tensors give none.
// chunk_bytes is rounded down to a multiple of 64 (at least 64).
std::vector<Chunk> plan_chunks(const LoadPlan& plan, size_t chunk_bytes);

namespace detail {
struct StreamState;
}

// The right to one staging buffer. Copyable; release() (by any copy, from any thread, once is
// enough) or destruction of the last copy hands the buffer back to the loader. Releasing after the
// loader has returned is harmless.
class StagingLease {
 public:
  StagingLease() = default;
  void release();
  bool held() const;

 private:
  struct Token;
  std::shared_ptr<Token> token_;
  friend struct detail::StreamState;
};

// Consumes one filled staging buffer. `staging` holds c.length bytes of tensor c.tensor starting at
// byte c.offset, valid until the lease is released.
using ChunkSink = std::function<void(const Chunk& c, const void* staging, StagingLease lease)>;

struct StreamOptions {
  size_t chunk_bytes = size_t{32} << 20;  // rounded down to a multiple of 64; <= the staging buffer size
  int threads = 4;                        // reader threads (1: the caller reads)
  // Called (serialised with the sink) when a reader needs a buffer and none is free; a sink that
  // releases leases only when asked (e.g. after cudaEventSynchronize on its oldest pending copy)
  // releases at least one here. Without it, releases must come from elsewhere (synchronously in the
  // sink, a CUDA host callback, another thread).
  std::function<void()> reclaim;
  // Optional: staging buffers made while the load runs (e.g. pinned one at a time: pinning takes
  // milliseconds per buffer, and the first read then waits for one buffer instead of the whole ring).
  // run() calls grow(add) once, on a thread of its own started before it opens the files; grow makes
  // buffers of buffer_bytes and hands each to the readers with add(buffer) (at once usable), and stops
  // when add returns false (the load failed or stopped, or every chunk already has its buffer: the
  // buffer just made is not used). An exception from grow (or a null buffer) fails the load. The
  // buffers stay grow's owner's: free them after run() has returned (it joins the thread first).
  // run()'s staging may then be empty.
  using AddStaging = std::function<bool(void* buffer)>;
  std::function<void(const AddStaging& add)> grow;
};

struct StreamStats {
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  double seconds = 0;          // wall time of run()
  double read_seconds = 0;     // summed over readers: time in pread
  double wait_seconds = 0;     // summed over readers: time waiting for a free buffer
  int max_outstanding = 0;     // most buffers filling or held at once (<= K)
  int buffers = 0;             // K: the ring's buffers at the end (given + grown)
  double first_read_seconds = 0;  // run() start -> the first read begins (files opened, a buffer free)
};

class StreamLoader {
 public:
  explicit StreamLoader(StreamOptions opt = {});
  // Loads the whole plan through the K = staging.size() buffers of buffer_bytes each (K >= 1, or
  // K >= 0 with StreamOptions::grow, plus the buffers it adds).
  StreamStats run(const LoadPlan& plan, const std::vector<void*>& staging, size_t buffer_bytes,
                  const ChunkSink& sink) const;
  const StreamOptions& options() const { return opt_; }

 private:
  StreamOptions opt_;
};

}  // namespace wan
