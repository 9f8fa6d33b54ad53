// Streaming checkpoint loads: chunking, the staging ring, reader threads (see stream.h).
// Invariants: a buffer index is handed out only while it is marked free, and marked free again only
// by its lease (release() or the last copy's destructor), so "busy" buffers are exactly those being
// filled or held by the sink (the ring bound). Locks: the sink mutex may be held while taking the
// ring mutex (a lease released inside the sink), never the other way round. Every reader thread is
// joined before run() returns or throws; after the first failure no reader claims a new chunk and
// every reader waiting for a buffer wakes up. A growing ring (StreamOptions::grow) appends buffers
// (free) under the ring mutex; readers take a buffer's pointer under it too, so appends never race a
// read of the list. The grow thread is joined on every way out of run().
#include "ckpt/stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/clock.h"
#include "core/error.h"
#include "formats/gguf_quant.h"

namespace wan {

// ---------------------------------------------------------------------------------------------
// Plan

size_t LoadPlan::add(const WeightStore& store, const std::vector<std::string>& names) {
  const size_t first = tensors.size();
  const std::vector<std::string> all = names.empty() ? store.names() : std::vector<std::string>();
  for (const std::string& n : names.empty() ? all : names) {
    std::optional<RawSpan> r = store.raw_span(n);
    if (r) tensors.push_back({n, std::move(*r)});
    else fallback.push_back(n);
  }
  return first;
}

uint64_t LoadPlan::total_bytes() const {
  uint64_t b = 0;
  for (const PlanTensor& t : tensors) b += t.span.length;
  return b;
}

namespace {
size_t round_chunk(size_t chunk_bytes) { return std::max<size_t>(64, chunk_bytes / 64 * 64); }
}  // namespace

std::vector<Chunk> plan_chunks(const LoadPlan& plan, size_t chunk_bytes) {
  const uint64_t cb = round_chunk(chunk_bytes);
  std::vector<size_t> order(plan.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PlanTensor &ta = plan.tensors[a], &tb = plan.tensors[b];
    if (ta.priority != tb.priority) return ta.priority < tb.priority;
    const RawSpan &x = ta.span, &y = tb.span;
    return x.path != y.path ? x.path < y.path : x.offset < y.offset;
  });
  std::vector<Chunk> out;
  for (size_t i : order) {
    const PlanTensor& t = plan.tensors[i];
    for (uint64_t off = 0; off < t.span.length; off += cb) {
      Chunk c;
      c.tensor = i;
      c.t = &t;
      c.offset = off;
      c.length = std::min<uint64_t>(cb, t.span.length - off);
      c.dtype = t.span.dtype;
      c.last = off + c.length == t.span.length;
      out.push_back(c);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Staging ring

namespace detail {

struct StreamState {
  std::mutex m;
  std::condition_variable cv;
  std::vector<void*> buffers;  // the ring: given, then grown (appended)
  std::vector<char> busy;      // per buffer
  int n_busy = 0, max_busy = 0;
  size_t unserved = 0;         // chunks not yet given a buffer
  bool grow_done = true;       // no more buffers will be added
  bool closed = false;         // run() is leaving: refuse further buffers
  std::atomic<bool> failed{false};
  std::exception_ptr error;

  void free_buffer(int i) {
    {
      std::lock_guard<std::mutex> lk(m);
      if (!busy[i]) return;
      busy[i] = 0;
      --n_busy;
    }
    cv.notify_all();
  }
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lk(m);
      if (!error) error = std::move(e);
      failed = true;
    }
    cv.notify_all();
  }
  static StagingLease lease(const std::shared_ptr<StreamState>& st, int buffer);
};

}  // namespace detail

struct StagingLease::Token {
  std::shared_ptr<detail::StreamState> st;
  int buffer = 0;
  std::atomic<bool> done{false};
  void release() {
    if (!done.exchange(true)) st->free_buffer(buffer);
  }
  ~Token() { release(); }
};

void StagingLease::release() {
  if (token_) token_->release();
}
bool StagingLease::held() const { return token_ && !token_->done.load(); }

StagingLease detail::StreamState::lease(const std::shared_ptr<StreamState>& st, int buffer) {
  StagingLease l;
  l.token_ = std::make_shared<StagingLease::Token>();
  l.token_->st = st;
  l.token_->buffer = buffer;
  return l;
}

// ---------------------------------------------------------------------------------------------
// Loader

namespace {


struct OpenFile {
  int fd = -1;
  uint64_t size = 0;
};

// Descriptors of every file of a plan, closed on destruction.
struct Files {
  std::map<std::string, OpenFile> by_path;
  ~Files() {
    for (auto& [p, f] : by_path)
      if (f.fd >= 0) ::close(f.fd);
  }
  const OpenFile& open(const std::string& path) {
    auto it = by_path.find(path);
    if (it != by_path.end()) return it->second;
    OpenFile f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) WAN_THROW(path, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) {
      int err = errno;
      ::close(f.fd);
      WAN_THROW(path, ": cannot stat: ", std::strerror(err));
    }
    f.size = static_cast<uint64_t>(st.st_size);
#ifdef POSIX_FADV_SEQUENTIAL
    ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    return by_path.emplace(path, f).first->second;
  }
};

uint64_t current_size(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Reads exactly c.length bytes of chunk c into dst; a short read or an I/O error throws.
void read_chunk(const OpenFile& f, const Chunk& c, void* dst) {
  const RawSpan& s = c.t->span;
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < c.length) {
    const uint64_t at = s.offset + c.offset + done;
    const size_t want = static_cast<size_t>(std::min<uint64_t>(c.length - done, uint64_t{1} << 30));
    ssize_t n = ::pread(f.fd, p + done, want, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      WAN_THROW(s.path, ": tensor '", c.t->name, "': read error at file offset ", at, ": ", std::strerror(errno));
    if (n == 0)
      WAN_THROW(s.path, ": tensor '", c.t->name, "': file ends at byte ", current_size(f.fd), " but the tensor's bytes ",
                "run to ", s.offset + s.length, " (truncated while loading?)");
    done += static_cast<uint64_t>(n);
  }
}

struct ReaderStats {
  double read_s = 0, wait_s = 0;
  uint64_t bytes = 0, chunks = 0;
};

}  // namespace

StreamLoader::StreamLoader(StreamOptions opt) : opt_(std::move(opt)) {}

StreamStats StreamLoader::run(const LoadPlan& plan, const std::vector<void*>& staging, size_t buffer_bytes,
                              const ChunkSink& sink) const {
  const Clock::time_point t0 = Clock::now();
  const size_t cb = round_chunk(opt_.chunk_bytes);
  const bool grows = static_cast<bool>(opt_.grow);
  WAN_CHECK(!staging.empty() || grows, "stream loader: no staging buffers");
  WAN_CHECK(cb <= buffer_bytes, "stream loader: chunk size ", cb, " bytes exceeds the staging buffers (", buffer_bytes,
            " bytes)");
  for (void* p : staging) WAN_CHECK(p != nullptr, "stream loader: null staging buffer");
  WAN_CHECK(static_cast<bool>(sink), "stream loader: no sink");
  for (const PlanTensor& t : plan.tensors) {
    const RawSpan& s = t.span;
    if (s.ggml_type != 0) {  // GGUF blocks: the type's bytes for the element count
      const auto info = ggml_type_info(s.ggml_type);
      WAN_CHECK(info.has_value(), s.path, ": tensor '", t.name, "': unknown GGUF type ", s.ggml_type);
      const uint64_t want = ggml_nbytes(static_cast<GgmlType>(s.ggml_type), s.shape.numel());
      WAN_CHECK(s.length == want, s.path, ": tensor '", t.name, "': ", s.length, " bytes planned but shape ",
                s.shape.str(), " of ", info->name, " has ", want);
      continue;
    }
    const size_t es = dtype_size(s.dtype);
    WAN_CHECK(s.length == static_cast<uint64_t>(s.shape.numel()) * es, s.path, ": tensor '", t.name, "': ",
              s.length, " bytes planned but shape ", s.shape.str(), " of ", dtype_name(s.dtype), " has ",
              static_cast<uint64_t>(s.shape.numel()) * es);
  }

  const std::vector<Chunk> chunks = plan_chunks(plan, cb);
  auto st = std::make_shared<detail::StreamState>();
  st->buffers = staging;
  st->busy.assign(staging.size(), 0);
  st->unserved = chunks.size();
  st->grow_done = !grows;
  std::mutex sink_m;
  std::atomic<size_t> next{0};
  std::mutex stats_m;
  ReaderStats total;
  std::once_flag first_read;
  double first_read_s = 0;

  // Buffers from the grow thread join the ring free, while a chunk still lacks one.
  const StreamOptions::AddStaging add = [&st](void* p) -> bool {
    WAN_CHECK(p != nullptr, "stream loader: null staging buffer");
    {
      std::lock_guard<std::mutex> lk(st->m);
      if (st->failed || st->closed || st->unserved == 0) return false;
      st->buffers.push_back(p);
      st->busy.push_back(0);
    }
    st->cv.notify_all();
    return true;
  };
  // The grow thread: started before the files are opened (their opening overlaps the first buffer's
  // making), closed and joined on every way out of run().
  struct GrowThread {
    detail::StreamState& st;
    std::thread t;
    void stop() {
      {
        std::lock_guard<std::mutex> lk(st.m);
        st.closed = true;
      }
      if (t.joinable()) t.join();
    }
    ~GrowThread() { stop(); }
  } grower{*st, {}};
  if (grows) {
    auto body = [this, &st, &add] {
      try {
        opt_.grow(add);
      } catch (...) {
        st->fail(std::current_exception());
      }
      {
        std::lock_guard<std::mutex> lk(st->m);
        st->grow_done = true;
      }
      st->cv.notify_all();
    };
    try {
      grower.t = std::thread(body);
    } catch (...) {
      st->grow_done = true;
      throw;
    }
  }

  // Open every file once and check every range against its size before reading anything.
  Files files;
  std::vector<const OpenFile*> file_of(plan.tensors.size(), nullptr);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlanTensor& t = plan.tensors[i];
    const RawSpan& s = t.span;
    if (s.length == 0) continue;
    const OpenFile& f = files.open(s.path);
    file_of[i] = &f;
    WAN_CHECK(s.length <= f.size && s.offset <= f.size - s.length, s.path, ": tensor '", t.name, "': bytes [",
              s.offset, ", ", s.offset + s.length, ") lie past the end of the file (", f.size, " bytes; truncated?)");
  }

  auto run_reclaim = [&]() -> bool {  // false after a failure
    std::lock_guard<std::mutex> lk(sink_m);
    if (st->failed) return false;
    try {
      opt_.reclaim();
      return true;
    } catch (...) {
      st->fail(std::current_exception());
      return false;
    }
  };
  // A free buffer (marked busy; its memory in *buffer), or -1 once the load has failed.
  auto acquire = [&](ReaderStats& rs, void** buffer) -> int {
    const Clock::time_point w0 = Clock::now();
    std::unique_lock<std::mutex> lk(st->m);
    for (;;) {
      if (st->failed) return -1;
      const int n = static_cast<int>(st->busy.size());
      for (int b = 0; b < n; ++b) {
        if (st->busy[b]) continue;
        st->busy[b] = 1;
        st->max_busy = std::max(st->max_busy, ++st->n_busy);
        --st->unserved;
        *buffer = st->buffers[static_cast<size_t>(b)];
        rs.wait_s += seconds_since(w0);
        return b;
      }
      if (n == 0 && st->grow_done) {  // the grow thread ended without adding any
        lk.unlock();
        st->fail(std::make_exception_ptr(Error("stream loader: no staging buffers (none given, none grown)")));
        return -1;
      }
      if (opt_.reclaim && st->n_busy > 0) {
        lk.unlock();
        if (!run_reclaim()) return -1;
        lk.lock();
        if (st->n_busy < static_cast<int>(st->busy.size()) || st->failed) continue;
        st->cv.wait_for(lk, std::chrono::milliseconds(1));
      } else {
        st->cv.wait(lk);  // a release, a grown buffer, the grow thread's end or a failure wakes it
      }
    }
  };
  auto reader = [&] {
    ReaderStats rs;
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= chunks.size()) break;
      void* buffer = nullptr;
      const int b = acquire(rs, &buffer);
      if (b < 0) break;
      Chunk c = chunks[i];
      c.buffer = b;
      StagingLease lease = detail::StreamState::lease(st, b);  // frees the buffer however we leave
      try {
        const Clock::time_point r0 = Clock::now();
        std::call_once(first_read, [&] { first_read_s = seconds_since(t0); });
        read_chunk(*file_of[c.tensor], c, buffer);
        rs.read_s += seconds_since(r0);
      } catch (...) {
        st->fail(std::current_exception());
        break;
      }
      {
        // The failure is recorded before the sink mutex is let go: no sink call follows a throw.
        std::lock_guard<std::mutex> lk(sink_m);
        if (st->failed) break;
        try {
          sink(c, buffer, std::move(lease));
        } catch (const Error& e) {
          st->fail(std::make_exception_ptr(e.with_context(cat(c.t->span.path, ": tensor '", c.t->name, "'"))));
          break;
        } catch (...) {
          st->fail(std::current_exception());
          break;
        }
      }
      rs.bytes += c.length;
      ++rs.chunks;
    }
    std::lock_guard<std::mutex> lk(stats_m);
    total.read_s += rs.read_s;
    total.wait_s += rs.wait_s;
    total.bytes += rs.bytes;
    total.chunks += rs.chunks;
  };

  const int n_threads = static_cast<int>(std::max<size_t>(1, std::min<size_t>(std::max(opt_.threads, 1), chunks.size())));
  std::vector<std::thread> threads;
  try {
    for (int i = 1; i < n_threads; ++i) threads.emplace_back(reader);
  } catch (...) {
    st->fail(std::current_exception());
  }
  reader();  // the caller reads too
  for (std::thread& t : threads) t.join();
  grower.stop();  // every chunk has its buffer (or the load failed): no more are taken

  if (st->error) std::rethrow_exception(st->error);
  // Success: wait until the sink has handed back every buffer.
  {
    std::unique_lock<std::mutex> lk(st->m);
    while (st->n_busy > 0 && !st->failed) {
      if (opt_.reclaim) {
        lk.unlock();
        run_reclaim();
        lk.lock();
        if (st->n_busy > 0 && !st->failed) st->cv.wait_for(lk, std::chrono::milliseconds(1));
      } else {
        st->cv.wait(lk);
      }
    }
  }
  if (st->error) std::rethrow_exception(st->error);
  WAN_ASSERT(total.chunks == chunks.size(), "delivered ", total.chunks, " of ", chunks.size(), " chunks");

  StreamStats s;
  s.bytes = total.bytes;
  s.chunks = total.chunks;
  s.read_seconds = total.read_s;
  s.wait_seconds = total.wait_s;
  {
    std::lock_guard<std::mutex> lk(st->m);
    s.max_outstanding = st->max_busy;
    s.buffers = static_cast<int>(st->busy.size());
  }
  s.first_read_seconds = first_read_s;
  s.seconds = seconds_since(t0);
  return s;
}

}  // namespace wan
