// The streaming weight upload (load_gpu.h): the background load thread, the GPU sink of the
// StreamLoader and the group bookkeeping.
// Threads: the caller (add/start/wait_group/finish/cancel), the load thread (fallback uploads, then
// StreamLoader::run, whose readers call the sink and the reclaim hook one at a time, and whose grow
// thread pins the staging buffers one by one while the readers use the first ones). The sink
// state (pending leases, group counters) is touched only under StreamLoader's sink serialisation;
// `m` guards what the caller reads (state, error, recorded groups).
// Resources: everything the load thread (and the grow thread) allocates lives in a Resources object
// that synchronises the copy and conversion streams before freeing, so neither success nor failure
// leaves memory or copies behind. The load thread never frees it: on success and on failure alike it
// synchronises its own two streams (cudaStreamSynchronize of non-blocking streams that no capture
// touches: legal beside a cudaStreamCaptureModeThreadLocal capture on another thread, which is how
// the engine captures) and hands the object to Impl::leftover, which finish() or the destructor free
// on the caller's thread. The group events belong to the Impl and outlive the load thread (a waiter
// may still synchronise one). add() / add_group() / start() take `m` too: objects may register their
// tensors from several threads.
#include "runtime/load_gpu.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/clock.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "kernels/fp8_quant.h"
#include "kernels/gguf_dequant.h"

namespace wan::cuda {

namespace {

size_t round64(size_t b) { return std::max<size_t>(64, b / 64 * 64); }

// An e4m3 destination whose stored bytes are e4m3 already (ComfyUI fp8_scaled, one scale per tensor, or
// plain e4m3) and that no merge changes: the bytes go up as stored and every row scale is the tensor's
// (row_scales_fill), so the GEMM multiplies exactly the stored values: no fp32 round trip, no second
// rounding onto another grid.
bool stored_e4m3(const LoadTarget& t) {
  return t.dtype == DType::F8E4M3 && !t.merge && t.span && t.span->dtype == DType::F8E4M3 && t.span->ggml_type == 0;
}

// The tensor is assembled in fp32 before it reaches dst: merged, or quantised by rows (e4m3).
bool assembles_f32(const LoadTarget& t) { return t.merge || (t.dtype == DType::F8E4M3 && !stored_e4m3(t)); }

bool needs_conversion(const LoadTarget& t) {
  if (stored_e4m3(t)) return false;
  return t.span && (t.span->dtype != t.dtype || t.span->scaled || assembles_f32(t) || t.span->ggml_type != 0);
}

// A whole fp32 tensor in `work` (device) -> the target: merged, then rounded once or quantised by rows.
void finish_f32(const LoadTarget& t, float* work, cudaStream_t s) {
  if (t.merge) t.merge(work, s);
  if (t.dtype == DType::F8E4M3)
    quantize_rows_fp8(work, t.shape[0], t.shape.numel() / t.shape[0], static_cast<uint8_t*>(t.dst), t.scale_dst, s);
  else
    convert_weights(work, DType::F32, false, 1.0f, t.dst, t.dtype, t.shape.numel(), s);
}

// What the load thread allocates; the destructor quiesces both streams first, never throws.
struct Resources {
  cudaStream_t copy = nullptr;  // H2D copies, in chunk order
  cudaStream_t conv = nullptr;  // conversion kernels, each after its chunk's copy (copies never wait on them)
  std::vector<cudaEvent_t> slot_events;  // per buffer: its copy (and conversion) done
  std::vector<cudaEvent_t> copy_events;  // per buffer: its copy done (the conversion waits on it)
  std::vector<cudaEvent_t> group_copy;   // per group: its last copy enqueued (the group event waits on it)
  // Per buffer, sized K before the load and filled by the grow thread as it makes each buffer (only
  // distinct elements are written, each before its buffer joins the ring): pinned staging
  // (cudaHostAlloc) and, for loads that convert, its device slot.
  std::vector<void*> pinned;
  std::vector<void*> dev_slots;
  void sync() {
    if (copy) cudaStreamSynchronize(copy);
    if (conv) cudaStreamSynchronize(conv);
  }
  void release() {
    sync();
    for (auto* v : {&slot_events, &copy_events, &group_copy}) {
      for (cudaEvent_t e : *v)
        if (e) cudaEventDestroy(e);
      v->clear();
    }
    for (void* p : pinned)
      if (p) cudaFreeHost(p);
    for (void* p : dev_slots)
      if (p) cudaFree(p);
    pinned.clear();
    dev_slots.clear();
    if (copy) cudaStreamDestroy(copy);
    if (conv) cudaStreamDestroy(conv);
    copy = conv = nullptr;
    cudaGetLastError();  // nothing sticky from the clean-up reaches the caller's next check
  }
  ~Resources() { release(); }
};

// Host conversion of a fallback tensor to the destination dtype, as the old upload did: a raw copy
// when the dtype already matches, else through f32 (round to nearest even).
std::vector<uint8_t> host_bytes(const LoadTarget& t, const Tensor& src) {
  const size_t n = static_cast<size_t>(t.shape.numel());
  std::vector<uint8_t> out(n * dtype_size(t.dtype));
  if (src.dtype() == t.dtype && src.view().is_contiguous()) {
    if (n) std::memcpy(out.data(), src.data(), out.size());
    return out;
  }
  const Tensor f = (src.dtype() == DType::F32 && src.view().is_contiguous()) ? src : src.to_f32();
  if (t.dtype == DType::F32) {
    if (n) std::memcpy(out.data(), f.data(), out.size());
  } else {
    convert_from_f32(t.dtype, f.f32(), out.data(), n);
  }
  return out;
}

void create_events(std::vector<cudaEvent_t>& v, size_t n) {
  v.assign(n, nullptr);
  for (cudaEvent_t& e : v) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

}  // namespace

LoadOptions LoadOptions::tuned(int device) {
  LoadOptions o;
  o.device = device;
  // 8 readers already read the page cache faster than one copy engine takes it (H100 machine: 41 GB/s
  // with 8 or 16 readers, 31 with 4); more only take cores from the text encoding and warm-up that
  // overlap the load. Keep 4 hardware threads for those.
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  o.threads = std::clamp(hw == 0 ? 4 : hw - 4, 2, 8);
  o.buffers = o.threads + 4;
  o.buffer_bytes = size_t{8} << 20;
  return o;
}

struct DeviceLoader::Impl {
  LoadOptions opt;
  std::vector<LoadTarget> targets;
  std::map<int, int> group_index;  // group id -> dense index, in order of first appearance
  std::vector<cudaEvent_t> group_events;

  std::mutex m;
  std::condition_variable cv;
  enum class State { Idle, Running, Done } state = State::Idle;
  std::vector<char> group_done;  // event recorded (or nothing to copy)
  std::exception_ptr error;
  LoadStats stats;
  std::thread thread;
  std::atomic<bool> cancelled{false};
  // After the load, successful or not: the staging (pinned and device memory, streams, events), its
  // streams synchronised, freed by finish() or the destructor on the caller's thread. Freeing (and
  // unpinning) synchronises the device, which must not happen while another thread captures a CUDA
  // graph (the DiT's warm-up runs beside the load): the caller knows when no capture runs, the load
  // thread does not. A failed load is no exception: freeing there invalidated the other thread's
  // capture, and the user saw that capture's CUDA error instead of the loader's clear one.
  std::unique_ptr<Resources> leftover;

  ~Impl() {
    cancelled = true;
    if (thread.joinable()) thread.join();
    leftover.reset();
    for (cudaEvent_t e : group_events)
      if (e) cudaEventDestroy(e);
    cudaGetLastError();
  }

  void mark_group(int gi) {
    {
      std::lock_guard<std::mutex> lk(m);
      group_done[static_cast<size_t>(gi)] = 1;
    }
    cv.notify_all();
  }

  void run();
  void load(Resources& r);
  void upload_fallbacks(Resources& r);
  void upload_merged_fallback(Resources& r, const LoadTarget& t, const Tensor& src);

  // One load's streaming part on the load thread: the plan of streamed tensors and the staging
  // buffers in flight. grow() runs on the StreamLoader's grow thread, sink() and reclaim() under its
  // sink serialisation.
  struct StreamJob {
    Impl& impl;
    Resources& r;
    const size_t buf;  // staging buffer and chunk bytes
    const int dev;
    LoadPlan plan;
    std::vector<size_t> target_of;  // plan tensor -> target
    std::vector<int64_t> remaining;  // chunks still to enqueue, per group
    bool convert = false;            // some target needs a conversion kernel (so device slots)
    int K = 0;                       // staging buffers
    struct Pending {
      int buffer;
      StagingLease lease;
    };
    std::deque<Pending> pending;  // in enqueue order
    uint64_t converted = 0;
    // Merged tensors (LoadTarget::merge), per plan tensor: the fp32 work buffer (allocated at its first
    // chunk) and the chunks still to come.
    std::vector<float*> work;
    std::vector<int64_t> chunks_left;
    // GGUF block-quantised tensors (RawSpan::ggml_type): the stored bytes assembled on the device (chunks
    // cut blocks anywhere), dequantised once the last chunk is in.
    std::vector<void*> raw;

    StreamJob(Impl& l, Resources& res, size_t buffer_bytes) : impl(l), r(res), buf(buffer_bytes), dev(l.opt.device) {}
    bool plan_targets();
    void make_ring();
    void grow(const StreamOptions::AddStaging& add);
    void reclaim();
    void release_finished();
    void sink(const Chunk& c, const void* host, StagingLease lease);
    void issue(const Chunk& c, const void* host);
    void issue_quantised(const Chunk& c, const LoadTarget& t, const void* slot);
    void run(Clock::time_point t0);
  };
};

void DeviceLoader::Impl::run() {
  const Clock::time_point t0 = Clock::now();
  std::unique_ptr<Resources> r;
  std::exception_ptr err;
  try {
    r = std::make_unique<Resources>();
    load(*r);
  } catch (const Error& e) {
    err = std::make_exception_ptr(e.with_context("streaming the weights to the GPU"));
  } catch (const std::exception& e) {
    err = std::make_exception_ptr(Error(cat("streaming the weights to the GPU: ", e.what()), ErrorKind::Internal));
  } catch (...) {
    err = std::make_exception_ptr(Error("streaming the weights to the GPU: unknown error", ErrorKind::Internal));
  }
  // Success: every weight is on the device. Failure: no more work is issued (the readers and the grow
  // thread are joined); what was enqueued finishes here, on the loader's own streams only. Either way
  // the staging is kept for finish() / the destructor to free on the caller's thread (Impl::leftover).
  if (r) {
    r->sync();
    (void)cudaGetLastError();  // a failed load's CUDA error is in `err`; nothing sticks to this thread
  }
  std::lock_guard<std::mutex> lk(m);
  leftover = std::move(r);
  stats.seconds = seconds_since(t0);
  error = std::move(err);
  state = State::Done;
  cv.notify_all();
}

void DeviceLoader::Impl::load(Resources& r) {
  const Clock::time_point t0 = Clock::now();
  CUDA_CHECK(cudaSetDevice(opt.device));
  const size_t buf = round64(opt.buffer_bytes);
  CUDA_CHECK(cudaStreamCreateWithFlags(&r.copy, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&r.conv, cudaStreamNonBlocking));
  upload_fallbacks(r);
  StreamJob job(*this, r, buf);
  if (!job.plan_targets()) return;
  job.make_ring();
  job.run(t0);
}

// Tensors without a byte range: through their getter, converted on the host (rare: strided .pth).
void DeviceLoader::Impl::upload_fallbacks(Resources& r) {
  for (const LoadTarget& t : targets) {
    if (t.span) continue;
    if (cancelled) WAN_THROW("cancelled");
    Tensor src;
    WAN_WITH_CONTEXT(t.name, src = t.fallback());
    WAN_CHECK(src.defined(), t.name, ": missing");
    WAN_CHECK(src.shape() == t.shape, t.name, ": shape ", src.shape().str(), ", expected ", t.shape.str());
    WAN_CHECK(dtype_is_float(src.dtype()), t.name, ": dtype ", dtype_name(src.dtype()), " is not a float type");
    if (assembles_f32(t)) {
      upload_merged_fallback(r, t, src);
    } else {
      const std::vector<uint8_t> bytes = host_bytes(t, src);
      CUDA_CHECK(cudaMemcpyAsync(t.dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, r.copy));
      CUDA_CHECK(cudaStreamSynchronize(r.copy));
    }
    ++stats.fallback_tensors;
    stats.fallback_bytes += static_cast<uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
  }
}

// A fallback tensor with a merge or an e4m3 destination: f32 on the device, merged, rounded once (or
// quantised) into dst.
void DeviceLoader::Impl::upload_merged_fallback(Resources& r, const LoadTarget& t, const Tensor& src) {
  const Tensor f = (src.dtype() == DType::F32 && src.view().is_contiguous()) ? src : src.to_f32();
  const int64_t n = t.shape.numel();
  void* work = nullptr;
  CUDA_CHECK(cudaMallocAsync(&work, static_cast<size_t>(n) * 4, r.copy));
  CUDA_CHECK(cudaMemcpyAsync(work, f.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, r.copy));
  finish_f32(t, static_cast<float*>(work), r.copy);
  CUDA_CHECK(cudaFreeAsync(work, r.copy));
  CUDA_CHECK(cudaStreamSynchronize(r.copy));
}

// The streamed tensors, read group by group in the order groups were added. Returns false when
// there is nothing to stream.
bool DeviceLoader::Impl::StreamJob::plan_targets() {
  remaining.assign(impl.group_events.size(), 0);
  for (size_t i = 0; i < impl.targets.size(); ++i) {
    const LoadTarget& t = impl.targets[i];
    if (!t.span || t.span->length == 0) continue;
    const int gi = impl.group_index.at(t.group);
    plan.add(t.name, *t.span, gi);
    target_of.push_back(i);
    const int64_t chunks = static_cast<int64_t>((t.span->length + buf - 1) / buf);
    remaining[static_cast<size_t>(gi)] += chunks;
    work.push_back(nullptr);
    raw.push_back(nullptr);
    chunks_left.push_back(chunks);
    convert |= needs_conversion(t);
  }
  impl.stats.tensors = static_cast<int>(plan.tensors.size());
  for (size_t g = 0; g < remaining.size(); ++g)
    if (remaining[g] == 0) impl.mark_group(static_cast<int>(g));  // nothing to stream: the fallbacks are done
  return !plan.tensors.empty();
}

// The ring's events and (empty) buffer slots; the grow thread fills the slots.
void DeviceLoader::Impl::StreamJob::make_ring() {
  // A small plan needs no more buffers than it has chunks' worth of bytes (at least 2).
  const uint64_t chunks_worth = (plan.total_bytes() + buf - 1) / buf;
  K = static_cast<int>(std::max<uint64_t>(2, std::min<uint64_t>(static_cast<uint64_t>(impl.opt.buffers), chunks_worth)));
  create_events(r.slot_events, static_cast<size_t>(K));
  create_events(r.copy_events, static_cast<size_t>(K));
  create_events(r.group_copy, impl.group_events.size());
  r.pinned.assign(static_cast<size_t>(K), nullptr);
  r.dev_slots.assign(static_cast<size_t>(K), nullptr);
}

// The staging ring is made buffer by buffer on the StreamLoader's grow thread while the readers
// already fill the first ones: pinning costs milliseconds per 8 MB (~30 ms for the tuned ring of
// 12), which would all come before the first read if made in one piece. Buffer k is the ring's
// k-th (the ring starts empty), so the sink finds its device slot at index c.buffer. Everything
// lands in `r` as it is made: every way out frees it (after the streams are synchronised).
void DeviceLoader::Impl::StreamJob::grow(const StreamOptions::AddStaging& add) {
  CUDA_CHECK(cudaSetDevice(dev));  // this thread's device: pinned memory is mapped for it
  for (size_t k = 0; k < static_cast<size_t>(K); ++k) {
    if (impl.cancelled) WAN_THROW("cancelled");
    void* host = nullptr;
    CUDA_CHECK(cudaHostAlloc(&host, buf, cudaHostAllocPortable));
    r.pinned[k] = host;
    if (convert) {
      void* slot = nullptr;
      CUDA_CHECK(cudaMalloc(&slot, buf));
      r.dev_slots[k] = slot;
    }
    if (!add(host)) return;  // every chunk has its buffer, or the load stopped
  }
}

// The StreamLoader's reclaim hook: waits for the oldest buffer in flight and hands it back.
void DeviceLoader::Impl::StreamJob::reclaim() {
  if (pending.empty()) return;
  CUDA_CHECK(cudaSetDevice(dev));
  CUDA_CHECK(cudaEventSynchronize(r.slot_events[static_cast<size_t>(pending.front().buffer)]));
  pending.front().lease.release();
  pending.pop_front();
}

// Hands back every buffer whose copy (and conversion) has finished, oldest first.
void DeviceLoader::Impl::StreamJob::release_finished() {
  while (!pending.empty()) {
    const cudaError_t q = cudaEventQuery(r.slot_events[static_cast<size_t>(pending.front().buffer)]);
    if (q == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is no error
      return;
    }
    CUDA_CHECK(q);
    pending.front().lease.release();
    pending.pop_front();
  }
}

// The sink: enqueues one filled buffer's copy (and conversion), then its group's event when it was
// the group's last chunk, then hands back the buffers already done.
void DeviceLoader::Impl::StreamJob::sink(const Chunk& c, const void* host, StagingLease lease) {
  if (impl.cancelled) WAN_THROW("cancelled");
  if (impl.opt.on_chunk) impl.opt.on_chunk(c);
  CUDA_CHECK(cudaSetDevice(dev));
  issue(c, host);
  pending.push_back({c.buffer, std::move(lease)});
  const size_t gi = static_cast<size_t>(c.t->priority);
  if (--remaining[gi] == 0) {
    // Every copy of the group is enqueued on `copy`, every conversion on `conv`: the group event
    // on `conv` after a wait for `copy` completes when all of them have.
    CUDA_CHECK(cudaEventRecord(r.group_copy[gi], r.copy));
    CUDA_CHECK(cudaStreamWaitEvent(r.conv, r.group_copy[gi], 0));
    CUDA_CHECK(cudaEventRecord(impl.group_events[gi], r.conv));
    impl.mark_group(static_cast<int>(gi));
  }
  release_finished();
}

// One buffer's copy straight into the destination, or into its device slot and then a conversion
// on `conv` after it; the buffer's slot event completes when the destination is written.
void DeviceLoader::Impl::StreamJob::issue(const Chunk& c, const void* host) {
  const LoadTarget& t = impl.targets[target_of[c.tensor]];
  const RawSpan& s = c.t->span;
  const size_t ss = dtype_size(s.dtype), ds = dtype_size(t.dtype);
  const int64_t first = static_cast<int64_t>(c.offset / ss), n = static_cast<int64_t>(c.length / ss);
  char* dst = static_cast<char*>(t.dst) + static_cast<size_t>(first) * ds;
  const size_t b = static_cast<size_t>(c.buffer);
  if (!needs_conversion(t)) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, c.length, cudaMemcpyHostToDevice, r.copy));
    if (stored_e4m3(t) && --chunks_left[c.tensor] == 0)
      row_scales_fill(t.scale_dst, t.shape[0], s.scaled ? s.scale : 1.0f, r.copy);
    CUDA_CHECK(cudaEventRecord(r.slot_events[b], r.copy));
  } else {
    void* slot = r.dev_slots[b];
    CUDA_CHECK(cudaMemcpyAsync(slot, host, c.length, cudaMemcpyHostToDevice, r.copy));
    CUDA_CHECK(cudaEventRecord(r.copy_events[b], r.copy));
    CUDA_CHECK(cudaStreamWaitEvent(r.conv, r.copy_events[b], 0));
    if (s.ggml_type != 0) {
      issue_quantised(c, t, slot);
    } else if (assembles_f32(t)) {
      float*& w = work[c.tensor];
      const int64_t numel = t.shape.numel();
      if (!w) CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&w), static_cast<size_t>(numel) * 4, r.conv));
      convert_weights(slot, s.dtype, s.scaled, s.scale, w + first, DType::F32, n, r.conv);
      if (--chunks_left[c.tensor] == 0) {  // the whole tensor is in (chunks may come in any order)
        finish_f32(t, w, r.conv);
        CUDA_CHECK(cudaFreeAsync(w, r.conv));
        w = nullptr;
      }
    } else {
      convert_weights(slot, s.dtype, s.scaled, s.scale, dst, t.dtype, n, r.conv);
    }
    CUDA_CHECK(cudaEventRecord(r.slot_events[b], r.conv));
    ++converted;
  }
}

// A chunk of a GGUF block-quantised tensor (on `conv`, after its copy into `slot`): into the tensor's
// device copy of its stored bytes; the last one dequantises it (into the fp32 work buffer first when it
// is merged) and frees the bytes, stream-ordered.
void DeviceLoader::Impl::StreamJob::issue_quantised(const Chunk& c, const LoadTarget& t, const void* slot) {
  const RawSpan& s = c.t->span;
  void*& q = raw[c.tensor];
  if (!q) CUDA_CHECK(cudaMallocAsync(&q, s.length, r.conv));
  CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(q) + c.offset, slot, c.length, cudaMemcpyDeviceToDevice, r.conv));
  if (--chunks_left[c.tensor] != 0) return;
  const int64_t numel = t.shape.numel();
  if (assembles_f32(t)) {
    float* w = nullptr;
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&w), static_cast<size_t>(numel) * 4, r.conv));
    gguf_dequantize_gpu(s.ggml_type, q, numel, w, DType::F32, r.conv);
    finish_f32(t, w, r.conv);
    CUDA_CHECK(cudaFreeAsync(w, r.conv));
  } else {
    gguf_dequantize_gpu(s.ggml_type, q, numel, t.dst, t.dtype, r.conv);
  }
  CUDA_CHECK(cudaFreeAsync(q, r.conv));
  q = nullptr;
}

// Runs the StreamLoader over the plan, then waits for the last copies and fills the statistics.
void DeviceLoader::Impl::StreamJob::run(Clock::time_point t0) {
  StreamOptions so;
  so.chunk_bytes = buf;
  so.threads = std::max(1, impl.opt.threads);
  so.grow = [this](const StreamOptions::AddStaging& add) { grow(add); };
  so.reclaim = [this] { reclaim(); };
  auto on_chunk = [this](const Chunk& c, const void* host, StagingLease lease) { sink(c, host, std::move(lease)); };

  // `loader` is destroyed before `pending` (a member of this job) on every way out.
  StreamLoader loader(so);
  const Clock::time_point t1 = Clock::now();
  const double before_run = seconds_since(t0);
  LoadStats& stats = impl.stats;
  try {
    stats.stream = loader.run(plan, {}, buf, on_chunk);
  } catch (...) {
    // The readers are joined; leases still pending refer to buffers whose copies may be in flight:
    // let them finish before the buffers are freed (Resources), then drop the leases. Work buffers of
    // tensors cut short go back stream-ordered (no device synchronisation).
    for (float*& w : work)
      if (w) cudaFreeAsync(w, r.conv), w = nullptr;
    for (void*& q : raw)
      if (q) cudaFreeAsync(q, r.conv), q = nullptr;
    r.sync();
    pending.clear();
    throw;
  }
  r.sync();
  CUDA_CHECK(cudaGetLastError());
  pending.clear();
  stats.stream_seconds = seconds_since(t1);
  stats.setup_seconds = before_run + stats.stream.first_read_seconds;
  stats.bytes = stats.stream.bytes;
  stats.chunks = stats.stream.chunks;
  stats.converted_chunks = converted;
}

DeviceLoader::DeviceLoader(LoadOptions opt) : impl_(std::make_unique<Impl>()) {
  WAN_CHECK(opt.buffers >= 2, "weight loader: at least 2 staging buffers (got ", opt.buffers, ")");
  WAN_CHECK(opt.buffer_bytes >= 64, "weight loader: staging buffers of at least 64 bytes");
  impl_->opt = std::move(opt);
}

DeviceLoader::~DeviceLoader() = default;

void DeviceLoader::add_group(int group) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.m);
  WAN_CHECK(m.state == Impl::State::Idle, "weight loader: add_group() after start()");
  if (!m.group_index.count(group)) {
    m.group_index.emplace(group, static_cast<int>(m.group_index.size()));
    m.group_done.push_back(0);
  }
}

void DeviceLoader::add(LoadTarget t) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.m);
  WAN_CHECK(m.state == Impl::State::Idle, "weight loader: add() after start()");
  WAN_CHECK(t.dst != nullptr, t.name, ": no device destination");
  WAN_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32 || t.dtype == DType::F8E4M3, t.name,
            ": destination dtype ", dtype_name(t.dtype), " (expected bf16, f32 or f8_e4m3)");
  WAN_CHECK(reinterpret_cast<uintptr_t>(t.dst) % 16 == 0, t.name, ": device destination is not 16-byte aligned");
  if (t.dtype == DType::F8E4M3)
    WAN_CHECK(t.shape.ndim == 2 && t.scale_dst && reinterpret_cast<uintptr_t>(t.scale_dst) % 16 == 0, t.name,
              ": an e4m3 destination needs a matrix shape and 16-byte aligned row scales");
  if (t.span) {
    const RawSpan& s = *t.span;
    WAN_CHECK(s.shape == t.shape, t.name, ": shape ", s.shape.str(), ", expected ", t.shape.str());
    if (s.ggml_type != 0) {  // block-quantised: the store sized the bytes from the type
      WAN_CHECK(gguf_gpu_supported(s.ggml_type), t.name, ": GGUF type ", s.ggml_type, " has no GPU dequantisation");
      WAN_CHECK(s.length > 0, t.name, ": no stored bytes");
    } else {
      WAN_CHECK(dtype_is_float(s.dtype), t.name, ": dtype ", dtype_name(s.dtype), " is not a float type");
      WAN_CHECK(s.length == static_cast<uint64_t>(s.shape.numel()) * dtype_size(s.dtype), t.name, ": ", s.length,
                " stored bytes for shape ", s.shape.str(), " of ", dtype_name(s.dtype));
    }
  } else {
    WAN_CHECK(static_cast<bool>(t.fallback), t.name, ": neither a byte range nor a getter");
  }
  if (!m.group_index.count(t.group)) {
    m.group_index.emplace(t.group, static_cast<int>(m.group_index.size()));
    m.group_done.push_back(0);
  }
  m.targets.push_back(std::move(t));
}

size_t DeviceLoader::size() const {
  std::lock_guard<std::mutex> lk(impl_->m);
  return impl_->targets.size();
}

void DeviceLoader::start() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.m);
  WAN_CHECK(m.state == Impl::State::Idle, "weight loader: start() twice");
  CUDA_CHECK(cudaSetDevice(m.opt.device));
  m.group_events.assign(m.group_index.size(), nullptr);
  for (cudaEvent_t& e : m.group_events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  m.state = Impl::State::Running;
  m.thread = std::thread([&m] { m.run(); });
}

void DeviceLoader::wait_group(int group) {
  Impl& m = *impl_;
  auto it = m.group_index.find(group);
  if (it == m.group_index.end()) return;  // nothing of that group to load
  const size_t gi = static_cast<size_t>(it->second);
  std::unique_lock<std::mutex> lk(m.m);
  WAN_CHECK(m.state != Impl::State::Idle, "weight loader: wait_group() before start()");
  m.cv.wait(lk, [&] { return m.group_done[gi] || m.state == Impl::State::Done; });
  if (m.state == Impl::State::Done) {
    // A failed load's staging stays for finish() / the destructor: this frees nothing, so it may be
    // called while another thread captures.
    if (m.error && !m.group_done[gi]) std::rethrow_exception(m.error);
    return;  // the stream was synchronised
  }
  cudaEvent_t ev = m.group_events[gi];  // recorded; the Impl owns it until destruction
  lk.unlock();
  CUDA_CHECK(cudaEventSynchronize(ev));
}

LoadStats DeviceLoader::finish() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.m);
  WAN_CHECK(m.state != Impl::State::Idle, "weight loader: finish() before start()");
  m.cv.wait(lk, [&] { return m.state == Impl::State::Done; });
  std::unique_ptr<Resources> staging = std::move(m.leftover);
  const std::exception_ptr err = m.error;
  LoadStats stats = m.stats;
  lk.unlock();
  if (staging) {
    const Clock::time_point t0 = Clock::now();
    staging.reset();  // on this thread, failed load or not: see Impl::leftover
    stats.free_seconds = seconds_since(t0);
  }
  if (err) std::rethrow_exception(err);
  return stats;
}

void DeviceLoader::cancel() { impl_->cancelled = true; }

const LoadOptions& DeviceLoader::options() const { return impl_->opt; }

size_t DeviceLoader::device_bytes(const LoadOptions& o) {
  return round64(o.buffer_bytes) * static_cast<size_t>(std::max(o.buffers, 0));
}

LoadStats load_to_device(std::vector<LoadTarget> targets, const LoadOptions& opt) {
  DeviceLoader l(opt);
  for (LoadTarget& t : targets) l.add(std::move(t));
  l.start();
  return l.finish();
}

}  // namespace wan::cuda
