// Tests of the streaming checkpoint loader (ckpt/stream.h) on checkpoints written by make-checkpoint
// (official fp32/bf16 with .pth text encoder and VAE, diffusers fp32/bf16 sharded) and on a ComfyUI
// fp8_scaled file built from one: a host sink that reassembles every tensor from its chunks and
// converts it to f32 gives bytes identical to WeightStore::get_f32 for every tensor of every
// component, for chunk sizes below, above and not dividing tensor sizes, 1 and 4 readers, rings of 2
// and 3 buffers, and three release styles (in the sink, from another thread, through reclaim), with
// the ring given whole or grown while the load runs (StreamOptions::grow: none or one buffer given,
// the rest added by the grow thread with random delays). Every byte arrives exactly once, and the
// sink never holds more than K buffers. A growing ring: reads begin before it is complete, it stops
// being grown once every chunk has a buffer. Failures: a file truncated before the load, a file
// truncated during the load, a sink that throws (wan::Error and another type), a grow function that
// throws, adds nothing or adds a null buffer: one clear error, no hang (each load runs under a 30 s
// guard), buffers released.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/layout.h"
#include "test_util.h"
#include "tiny_checkpoints.h"
#include "ckpt/stream.h"
#include "core/dtype.h"
#include "core/error.h"
#include "testing/make_checkpoint.h"
#include "formats/safetensors.h"

namespace fs = std::filesystem;
using namespace wan;

namespace {

using wan::test::TempDir;

// Runs f on another thread and fails the whole test binary at once if it hangs. With a progress
// counter (chunks delivered so far), a hang is 60 s without a new chunk: a slow but moving load
// (sanitizers on a busy 2-core CI machine take minutes over the tiny-chunk sweeps) is not one.
// Without a counter, f must finish within 120 s.
template <typename F>
auto guarded(F f, const std::atomic<uint64_t>* progress = nullptr) {
  auto fut = std::async(std::launch::async, std::move(f));
  const auto stall_limit = std::chrono::seconds(progress ? 60 : 120);
  auto count = [progress] { return progress ? progress->load() : uint64_t{0}; };
  uint64_t last = count();
  auto last_change = std::chrono::steady_clock::now();
  while (fut.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
    const auto now = std::chrono::steady_clock::now();
    if (const uint64_t c = count(); c != last) {
      last = c;
      last_change = now;
    } else if (now - last_change > stall_limit) {
      std::fprintf(stderr, "stream loader test: load made no progress for %lld s (hang)\n",
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(stall_limit).count()));
      std::_Exit(3);
    }
  }
  return fut.get();
}

enum class Release { InSink, OtherThread, Reclaim };
const char* release_name(Release r) {
  return r == Release::InSink ? "in-sink" : r == Release::OtherThread ? "other-thread" : "reclaim";
}

// A host sink: reassembles tensors, counts coverage and outstanding buffers.
struct HostSink {
  const LoadPlan& plan;
  int K;
  Release mode;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<uint8_t>> seen;  // per byte: times delivered
  std::atomic<int> outstanding{0};
  std::atomic<int> max_outstanding{0};
  std::atomic<int> over_bound{0};
  std::atomic<uint64_t> calls{0};
  // OtherThread
  std::mutex qm;
  std::condition_variable qcv;
  std::deque<StagingLease> queue;
  bool stop = false;
  std::thread releaser;
  // Reclaim
  std::deque<StagingLease> held;

  HostSink(const LoadPlan& p, int k, Release m) : plan(p), K(k), mode(m) {
    for (const PlanTensor& t : plan.tensors) {
      bytes.emplace_back(t.span.length);
      seen.emplace_back(t.span.length, 0);
    }
    if (mode == Release::OtherThread) releaser = std::thread([this] { release_loop(); });
  }
  ~HostSink() { stop_releaser(); }
  void stop_releaser() {
    if (!releaser.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(qm);
      stop = true;
    }
    qcv.notify_all();
    releaser.join();
  }
  void release_loop() {
    std::mt19937 rng(7);
    for (;;) {
      StagingLease l;
      {
        std::unique_lock<std::mutex> lk(qm);
        qcv.wait(lk, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        l = std::move(queue.front());
        queue.pop_front();
      }
      // An "H2D copy" in flight: a short sleep for one release in eight, a yield otherwise (a sleep on
      // every one of the ~50 000 tiny chunks made single loads take seconds, minutes under sanitizers).
      if (rng() % 8 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
      else
        std::this_thread::yield();
      --outstanding;
      l.release();
    }
  }
  void operator()(const Chunk& c, const void* staging, StagingLease lease) {
    int now = ++outstanding;
    if (now > K) ++over_bound;
    int m = max_outstanding.load();
    while (now > m && !max_outstanding.compare_exchange_weak(m, now)) {
    }
    ++calls;
    EXPECT_EQ(c.t, &plan.tensors[c.tensor]);
    EXPECT_EQ(c.dtype, plan.tensors[c.tensor].span.dtype);
    EXPECT_EQ(c.offset % 64, 0u);
    EXPECT_EQ(c.length % dtype_size(c.dtype), 0u);
    EXPECT_EQ(c.last, c.offset + c.length == plan.tensors[c.tensor].span.length);
    EXPECT_TRUE(c.buffer >= 0 && c.buffer < K);
    EXPECT_TRUE(lease.held());
    std::memcpy(bytes[c.tensor].data() + c.offset, staging, c.length);
    for (uint64_t i = 0; i < c.length; ++i) ++seen[c.tensor][c.offset + i];
    switch (mode) {
      case Release::InSink:
        --outstanding;
        lease.release();
        break;
      case Release::OtherThread: {
        std::lock_guard<std::mutex> lk(qm);
        queue.push_back(std::move(lease));
        qcv.notify_one();
        break;
      }
      case Release::Reclaim: held.push_back(std::move(lease)); break;
    }
  }
  void reclaim() {
    if (held.empty()) return;
    --outstanding;
    held.front().release();
    held.pop_front();
  }
};

// f32 of a reassembled tensor, as the GPU conversion kernel will compute it.
Tensor to_f32(const PlanTensor& t, const std::vector<uint8_t>& b) {
  Tensor raw = Tensor::empty(t.span.dtype, t.span.shape);
  if (!b.empty()) std::memcpy(raw.data(), b.data(), b.size());
  Tensor f = raw.dtype() == DType::F32 ? raw.clone() : raw.to_f32();
  if (t.span.scaled)
    for (int64_t i = 0; i < f.numel(); ++i) f.f32()[i] = f.f32()[i] * t.span.scale;
  return f;
}

struct Source {
  std::string what;
  std::vector<std::unique_ptr<WeightStore>> stores;
  LoadPlan plan;
  std::vector<const WeightStore*> store_of;  // per plan tensor
};

Source open_all(const std::string& root, const std::string& what) {
  Source s;
  s.what = what;
  CheckpointInfo info = detect_checkpoint(root);
  for (const Component& c : info.components) {
    if (c.role == Role::Tokenizer) continue;
    s.stores.push_back(open_weights(info, c.role));
    const WeightStore& st = *s.stores.back();
    size_t first = s.plan.add(st);
    EXPECT_EQ(first, s.store_of.size());
    EXPECT_TRUE(s.plan.fallback.empty()) << what << ": " << role_name(c.role);
    EXPECT_EQ(s.plan.tensors.size() - first, st.names().size());
    s.store_of.resize(s.plan.tensors.size(), &st);
  }
  return s;
}

// Loads the whole plan through a host sink and checks every tensor and the ring bound. `given` of the
// K buffers are passed to run(); the others come from a grow function (random delays before each).
void load_and_compare(const Source& src, size_t chunk, int threads, int K, Release mode, int given) {
  SCOPED_TRACE(cat(src.what, ": chunk ", chunk, ", threads ", threads, ", ring ", K, " (", given, " given), release ",
                   release_name(mode)));
  const size_t buf_bytes = (chunk / 64 * 64) + 128;  // a little larger than a chunk
  std::vector<std::shared_ptr<void>> bufs;
  std::vector<void*> staging;
  for (int i = 0; i < K; ++i) {
    bufs.push_back(aligned_alloc_shared(buf_bytes));
    if (i < given) staging.push_back(bufs.back().get());
  }
  HostSink sink(src.plan, K, mode);
  StreamOptions opt;
  opt.chunk_bytes = chunk;
  opt.threads = threads;
  if (mode == Release::Reclaim) opt.reclaim = [&] { sink.reclaim(); };
  int grown = 0;
  if (given < K) {
    opt.grow = [&](const StreamOptions::AddStaging& add) {
      std::mt19937 rng(static_cast<uint32_t>(chunk + threads + K));
      for (int i = given; i < K; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));  // "pinning"
        if (!add(bufs[static_cast<size_t>(i)].get())) return;
        ++grown;
      }
    };
  }
  StreamLoader loader(opt);
  StreamStats stats = guarded(
      [&] {
        return loader.run(src.plan, staging, buf_bytes,
                          [&](const Chunk& c, const void* p, StagingLease l) { sink(c, p, std::move(l)); });
      },
      &sink.calls);
  sink.stop_releaser();
  EXPECT_EQ(stats.buffers, given + grown);
  EXPECT_GE(stats.buffers, 1);
  EXPECT_LE(stats.max_outstanding, stats.buffers);
  EXPECT_LE(stats.first_read_seconds, stats.seconds);
  EXPECT_EQ(stats.bytes, src.plan.total_bytes());
  EXPECT_EQ(stats.chunks, sink.calls.load());
  EXPECT_EQ(stats.chunks, plan_chunks(src.plan, chunk).size());
  EXPECT_LE(stats.max_outstanding, K);
  EXPECT_GE(stats.max_outstanding, 1);
  EXPECT_EQ(sink.over_bound.load(), 0);
  EXPECT_LE(sink.max_outstanding.load(), K);
  EXPECT_EQ(sink.outstanding.load(), 0);
  EXPECT_TRUE(sink.held.empty());

  size_t multi_chunk = 0;
  for (size_t i = 0; i < src.plan.tensors.size(); ++i) {
    const PlanTensor& t = src.plan.tensors[i];
    const auto& seen = sink.seen[i];
    ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](uint8_t v) { return v == 1; }))
        << t.name << ": a byte not delivered exactly once";
    if (t.span.length > chunk / 64 * 64) ++multi_chunk;
    Tensor want = src.store_of[i]->get_f32(t.name);
    Tensor got = to_f32(t, sink.bytes[i]);
    ASSERT_EQ(want.shape(), got.shape()) << t.name;
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.nbytes())) << t.name << " differs from get_f32";
  }
  if (chunk < 4096) {
    EXPECT_GT(multi_chunk, 10u);  // tensors really were split
  }
}

class StreamLoaderTest : public ::testing::Test {
 protected:
  static TempDir* dir;
  static void SetUpTestSuite() { dir = new TempDir(); }
  // The named tiny checkpoint (tiny_checkpoints.h), written on first use: each test writes only the
  // one it reads.
  static std::string ckpt(const std::string& name) { return wan::test::tiny_checkpoint(*dir, name, 11); }
  static void TearDownTestSuite() {
    delete dir;
    dir = nullptr;
  }
};
TempDir* StreamLoaderTest::dir = nullptr;

void sweep(const Source& s) {
  const size_t chunks[] = {64 * 17, 4096 + 64, size_t{1} << 20};
  int k = 0, grown = 0;
  for (size_t chunk : chunks)
    for (int threads : {1, 4})
      for (int K : {2, 3}) {
        Release mode = static_cast<Release>(k++ % 3);
        load_and_compare(s, chunk, threads, K, mode, K);
        if (::testing::Test::HasFatalFailure()) return;
        // The same with the ring grown while the load runs (none or one buffer given), once per chunk size.
        if (threads == 4 && K == 3) {
          load_and_compare(s, chunk, threads, K, static_cast<Release>(k % 3), grown++ % 2);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
}

TEST_F(StreamLoaderTest, OfficialF32MatchesGetF32) {
  Source s = open_all(ckpt("off_f32"), "official fp32");
  // The official layout's text encoder and VAE are .pth files: those go through the same loader.
  bool pth = false;
  for (const PlanTensor& t : s.plan.tensors) pth |= t.span.path.size() > 4 && t.span.path.ends_with(".pth");
  EXPECT_TRUE(pth);
  sweep(s);
}
TEST_F(StreamLoaderTest, OfficialBf16MatchesGetF32) { sweep(open_all(ckpt("off_bf16"), "official bf16")); }
TEST_F(StreamLoaderTest, DiffusersF32MatchesGetF32) { sweep(open_all(ckpt("dif_f32"), "diffusers fp32")); }
TEST_F(StreamLoaderTest, DiffusersBf16ShardedMatchesGetF32) {
  Source s = open_all(ckpt("dif_bf16"), "diffusers bf16 sharded");
  std::set<std::string> files;
  for (const PlanTensor& t : s.plan.tensors) files.insert(t.span.path);
  EXPECT_GE(files.size(), 4u);  // shards of both experts, text encoder, VAE
  sweep(s);
}

TEST_F(StreamLoaderTest, ComfyFp8ScaledMatchesGetF32) {
  // An fp8_scaled ComfyUI file made from the tiny official high-noise expert.
  CheckpointInfo off = detect_checkpoint(ckpt("off_f32"));
  auto src = open_weights(off, Role::DiTHigh);
  std::vector<std::pair<std::string, Tensor>> ts;
  int k = 0;
  for (const std::string& n : src->names()) {
    Tensor f = src->get_f32(n);
    const std::string p = std::string("model.diffusion_model.") + n;
    if (n.ends_with(".weight") && f.ndim() == 2) {
      const float scale = 0.0125f * static_cast<float>(1 + k++ % 3);
      Tensor q = Tensor::empty(DType::F8E4M3, f.shape());
      auto* d = static_cast<uint8_t*>(q.data());
      for (int64_t i = 0; i < f.numel(); ++i) d[i] = f32_to_f8e4m3(f.f32()[i] / scale);
      Tensor s = Tensor::f32(Shape{1});
      s.f32()[0] = scale;
      ts.emplace_back(p, q);
      ts.emplace_back(p.substr(0, p.size() - 7) + ".scale_weight", s);
    } else {
      ts.emplace_back(p, f);
    }
  }
  ASSERT_GT(k, 10);
  const std::string file = *dir / "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors";
  write_safetensors(file, ts);
  CheckpointInfo info = detect_checkpoint(file);
  ASSERT_TRUE(info.fp8_scaled);
  Source s;
  s.what = "comfyui fp8_scaled";
  s.stores.push_back(open_weights(info, info.components.at(0).role));
  s.plan.add(*s.stores[0]);
  s.store_of.assign(s.plan.tensors.size(), s.stores[0].get());
  int scaled = 0;
  for (const PlanTensor& t : s.plan.tensors) scaled += t.span.scaled && t.span.dtype == DType::F8E4M3;
  EXPECT_EQ(scaled, k);
  sweep(s);
}

TEST(StreamLoader, PlanChunksCoverInFileOrder) {
  LoadPlan plan;
  RawSpan a{"/b.bin", 1000, 4 * 300, DType::F32, Shape{300}};
  RawSpan b{"/a.bin", 8, 2 * 7, DType::BF16, Shape{7}};
  RawSpan c{"/b.bin", 8, 0, DType::F32, Shape{0}};
  RawSpan d{"/b.bin", 16, 64, DType::U8, Shape{64}};
  plan.add("a", a);
  plan.add("b", b);
  plan.add("c", c);
  plan.add("d", d);
  std::vector<Chunk> ch = plan_chunks(plan, 500);  // rounded down to 448
  ASSERT_EQ(ch.size(), 1u + 1u + 3u);
  EXPECT_EQ(ch[0].tensor, 1u);  // /a.bin first
  EXPECT_EQ(ch[1].tensor, 3u);  // then /b.bin by offset: d (16), a (1000); c is empty
  EXPECT_EQ(ch[2].tensor, 0u);
  EXPECT_EQ(ch[2].length, 448u);
  EXPECT_EQ(ch[3].offset, 448u);
  EXPECT_EQ(ch[4].offset, 896u);
  EXPECT_EQ(ch[4].length, 1200u - 896u);
  EXPECT_TRUE(ch[4].last && !ch[3].last && ch[0].last);
  EXPECT_EQ(plan_chunks(plan, 1)[0].length, 14u);  // at least 64 per chunk
  EXPECT_EQ(plan.total_bytes(), 1200u + 14u + 64u);
}

TEST(StreamLoader, PriorityComesBeforeFileOrder) {
  // A lower priority is read first whatever its file (the GPU loader reads the text encoder first).
  LoadPlan plan;
  plan.add("late", RawSpan{"/a.bin", 0, 4 * 64, DType::F32, Shape{64}}, 1);
  plan.add("early", RawSpan{"/z.bin", 512, 4 * 64, DType::F32, Shape{64}}, 0);
  plan.add("early2", RawSpan{"/z.bin", 0, 4 * 32, DType::F32, Shape{32}}, 0);
  plan.add("last", RawSpan{"/b.bin", 0, 2 * 8, DType::BF16, Shape{8}}, 7);
  std::vector<Chunk> ch = plan_chunks(plan, 128);
  ASSERT_EQ(ch.size(), 1u + 2u + 2u + 1u);
  EXPECT_EQ(ch[0].tensor, 2u);  // priority 0, /z.bin offset 0
  EXPECT_EQ(ch[1].tensor, 1u);  // priority 0, /z.bin offset 512
  EXPECT_EQ(ch[2].tensor, 1u);
  EXPECT_EQ(ch[3].tensor, 0u);  // priority 1
  EXPECT_EQ(ch[5].tensor, 3u);  // priority 7
  EXPECT_EQ(ch[3].t->priority, 1);
}

TEST(StreamLoader, BadArgumentsAreErrors) {
  LoadPlan plan;
  auto buf = aligned_alloc_shared(1024);
  std::vector<void*> staging{buf.get()};
  auto sink = [](const Chunk&, const void*, StagingLease) {};
  StreamOptions o;
  o.chunk_bytes = 4096;
  EXPECT_THROW(StreamLoader(o).run(plan, staging, 1024, sink), Error);  // chunk > buffer
  o.chunk_bytes = 1024;
  EXPECT_THROW(StreamLoader(o).run(plan, {}, 1024, sink), Error);       // no buffers (and no grow)
  EXPECT_NO_THROW(StreamLoader(o).run(plan, staging, 1024, sink));      // empty plan
  plan.add("x", RawSpan{"/nonexistent/file.safetensors", 0, 16, DType::F32, Shape{4}});
  try {
    StreamLoader(o).run(plan, staging, 1024, sink);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/file.safetensors"), std::string::npos) << e.what();
  }
}

// A fresh DiT-only checkpoint whose files the failure tests may damage.
struct Damaged {
  TempDir t;
  std::unique_ptr<WeightStore> store;
  LoadPlan plan;
  std::string big;  // the largest file of the plan
  Damaged(DType dtype) {
    gen::MakeCheckpointOptions o;
    o.config = "tiny";
    o.layout = Layout::Official;
    o.dtype = dtype;
    o.dit_only = true;
    o.out = t / "ck";
    gen::make_checkpoint(o);
    CheckpointInfo info = detect_checkpoint(o.out + "/high_noise_model");  // dit_only: the expert folder
    store = open_weights(info, info.components.at(0).role);
    plan.add(*store);
    uint64_t most = 0;
    for (const PlanTensor& p : plan.tensors)
      if (fs::file_size(p.span.path) > most) most = fs::file_size(p.span.path), big = p.span.path;
  }
};

struct Ring {
  std::vector<std::shared_ptr<void>> bufs;
  std::vector<void*> ptrs;
  Ring(int K, size_t bytes) {
    for (int i = 0; i < K; ++i) {
      bufs.push_back(aligned_alloc_shared(bytes));
      ptrs.push_back(bufs.back().get());
    }
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    guarded(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StreamLoader, FileTruncatedBeforeLoadIsOneClearError) {
  Damaged d(DType::F32);
  const uint64_t size = fs::file_size(d.big);
  fs::resize_file(d.big, size / 2);
  Ring r(2, 4096);
  StreamOptions o;
  o.chunk_bytes = 4096;
  o.threads = 4;
  std::atomic<int> calls{0};
  std::string msg = error_of([&] {
    StreamLoader(o).run(d.plan, r.ptrs, 4096, [&](const Chunk&, const void*, StagingLease) { ++calls; });
  });
  ASSERT_FALSE(msg.empty());
  EXPECT_NE(msg.find(d.big), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end of the file"), std::string::npos) << msg;
  EXPECT_EQ(calls.load(), 0);  // checked before any read
}

TEST(StreamLoader, FileTruncatedDuringLoadIsOneClearError) {
  for (int threads : {1, 4}) {
    Damaged d(DType::BF16);
    const uint64_t size = fs::file_size(d.big);
    Ring r(3, 1024);
    StreamOptions o;
    o.chunk_bytes = 1024;
    o.threads = threads;
    std::atomic<int> outstanding{0}, calls{0};
    std::string msg = error_of([&] {
      StreamLoader(o).run(d.plan, r.ptrs, 1024, [&](const Chunk&, const void*, StagingLease l) {
        EXPECT_LE(++outstanding, 3);
        if (calls++ == 0) fs::resize_file(d.big, size / 3);  // under the loader's feet
        --outstanding;
        l.release();
      });
    });
    ASSERT_FALSE(msg.empty()) << "threads " << threads;
    EXPECT_NE(msg.find(d.big), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated while loading"), std::string::npos) << msg;
    EXPECT_GE(calls.load(), 1);
  }
}

TEST(StreamLoader, SinkErrorsPropagateWithoutHanging) {
  Damaged d(DType::F32);
  for (int threads : {1, 4})
    for (bool keep : {false, true}) {
      SCOPED_TRACE(cat("threads ", threads, keep ? ", leases kept by the sink" : ""));
      Ring r(2, 2048);
      StreamOptions o;
      o.chunk_bytes = 2048;
      o.threads = threads;
      std::deque<StagingLease> kept;
      if (keep) {
        o.reclaim = [&] {
          if (!kept.empty()) kept.pop_front();  // dropping the last copy releases
        };
      }
      std::atomic<int> calls{0};
      std::string msg = error_of([&] {
        StreamLoader(o).run(d.plan, r.ptrs, 2048, [&](const Chunk&, const void*, StagingLease l) {
          if (keep) kept.push_back(l);
          if (++calls == 7) WAN_THROW("sink boom");
        });
      });
      EXPECT_NE(msg.find("sink boom"), std::string::npos) << msg;
      EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
      EXPECT_EQ(calls.load(), 7);  // nothing delivered after the failure
      kept.clear();                // late releases after run() returned are harmless
    }
  // Another exception type keeps its type.
  Ring r(2, 2048);
  StreamOptions o;
  o.chunk_bytes = 2048;
  o.threads = 4;
  EXPECT_THROW(guarded([&] {
                 StreamLoader(o).run(d.plan, r.ptrs, 2048, [&](const Chunk& c, const void*, StagingLease) {
                   if (c.offset > 0) throw std::out_of_range("custom");
                 });
               }),
               std::out_of_range);
}

TEST(StreamLoader, ReclaimThatThrowsPropagates) {
  Damaged d(DType::F32);
  Ring r(2, 1024);
  StreamOptions o;
  o.chunk_bytes = 1024;
  o.threads = 4;
  std::deque<StagingLease> kept;
  o.reclaim = [&] { WAN_THROW("reclaim boom"); };
  std::string msg = error_of([&] {
    StreamLoader(o).run(d.plan, r.ptrs, 1024,
                        [&](const Chunk&, const void*, StagingLease l) { kept.push_back(std::move(l)); });
  });
  EXPECT_NE(msg.find("reclaim boom"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// Growing ring (StreamOptions::grow)

// Reads begin on the first buffer while the rest of the ring is still to come: the grow function
// adds one buffer, waits until the sink has seen several chunks, then adds the rest. Every tensor
// still arrives whole and exact.
TEST(StreamLoader, GrowingRingReadsBeforeItIsComplete) {
  Damaged d(DType::F32);
  const size_t chunk = 1024;
  const int K = 4;
  Ring r(K, chunk);
  HostSink sink(d.plan, K, Release::InSink);
  StreamOptions o;
  o.chunk_bytes = chunk;
  o.threads = 4;
  std::atomic<bool> read_before_rest{false};
  std::atomic<int> added{0};
  // `added` counts a buffer before add() hands it over (a reader may use it before add() returns).
  auto offer = [&](const StreamOptions::AddStaging& add, int k) {
    ++added;
    if (add(r.ptrs[static_cast<size_t>(k)])) return true;
    --added;
    return false;
  };
  o.grow = [&](const StreamOptions::AddStaging& add) {
    if (!offer(add, 0)) return;
    for (int i = 0; i < 10000 && sink.calls.load() < 5; ++i)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    read_before_rest = sink.calls.load() >= 5;
    for (int k = 1; k < K; ++k)
      if (!offer(add, k)) return;
  };
  const StreamStats st = guarded([&] {
    return StreamLoader(o).run(d.plan, {}, chunk, [&](const Chunk& c, const void* p, StagingLease l) {
      EXPECT_TRUE(c.buffer >= 0 && c.buffer < added.load()) << "a buffer not yet added";
      sink(c, p, std::move(l));
    });
  });
  EXPECT_TRUE(read_before_rest.load()) << "the load waited for the whole ring";
  const size_t n_chunks = plan_chunks(d.plan, chunk).size();
  ASSERT_GT(n_chunks, 20u);
  EXPECT_EQ(st.chunks, n_chunks);
  EXPECT_EQ(sink.calls.load(), n_chunks);
  EXPECT_EQ(st.buffers, added.load());
  EXPECT_GE(st.buffers, 1);
  EXPECT_LE(st.buffers, K);
  EXPECT_GT(st.first_read_seconds, 0.0);
  EXPECT_LE(st.first_read_seconds, st.seconds);
  for (size_t i = 0; i < d.plan.tensors.size(); ++i) {
    const PlanTensor& t = d.plan.tensors[i];
    ASSERT_TRUE(std::all_of(sink.seen[i].begin(), sink.seen[i].end(), [](uint8_t v) { return v == 1; })) << t.name;
    const Tensor want = d.store->get_f32(t.name), got = to_f32(t, sink.bytes[i]);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.nbytes())) << t.name << " differs from get_f32";
  }
}

// Once every chunk has its buffer, add() refuses more: a grow function that would add many buffers
// slowly is stopped early (run() joins it, so without the refusal it would last 2 s).
TEST(StreamLoader, GrowingStopsWhenEveryChunkHasABuffer) {
  TempDir dir("stream_grow_stop");
  const std::string path = dir / "one.bin";  // 64 random floats at offset 0
  std::vector<float> v(64);
  std::mt19937 rng(std::random_device{}());
  for (float& x : v) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(v.data(), 4, 64, f), 64u);
    std::fclose(f);
  }
  LoadPlan plan;
  plan.add("w", RawSpan{path, 0, 256, DType::F32, Shape{64}});
  ASSERT_EQ(plan_chunks(plan, 1024).size(), 1u);
  constexpr int kMany = 1000;
  Ring r(kMany, 1024);
  StreamOptions o;
  o.chunk_bytes = 1024;
  o.threads = 2;
  int added = 0;
  bool refused = false;
  o.grow = [&](const StreamOptions::AddStaging& add) {
    for (int k = 0; k < kMany; ++k) {
      if (!add(r.ptrs[static_cast<size_t>(k)])) {
        refused = true;
        return;
      }
      ++added;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  std::vector<float> got(64, std::nanf(""));
  const StreamStats st = guarded([&] {
    return StreamLoader(o).run(plan, {}, 1024, [&](const Chunk& c, const void* p, StagingLease l) {
      std::memcpy(reinterpret_cast<char*>(got.data()) + c.offset, p, c.length);
      l.release();
    });
  });
  EXPECT_TRUE(refused);
  EXPECT_LT(added, 100);
  EXPECT_EQ(st.buffers, added);
  EXPECT_EQ(st.chunks, 1u);
  EXPECT_EQ(0, std::memcmp(got.data(), v.data(), 256));
}

TEST(StreamLoader, GrowErrorsAreOneClearErrorWithoutHanging) {
  Damaged d(DType::F32);
  Ring r(3, 1024);
  auto run_with = [&](std::function<void(const StreamOptions::AddStaging&)> grow, std::vector<void*> given) {
    StreamOptions o;
    o.chunk_bytes = 1024;
    o.threads = 4;
    o.grow = std::move(grow);
    std::atomic<int> calls{0};
    const std::string msg = error_of([&] {
      StreamLoader(o).run(d.plan, given, 1024, [&](const Chunk&, const void*, StagingLease l) {
        ++calls;
        l.release();
      });
    });
    return std::make_pair(msg, calls.load());
  };
  // Throws after one buffer (readers may have started on it), or before any.
  for (int before : {0, 1}) {
    const auto [msg, calls] = run_with(
        [&](const StreamOptions::AddStaging& add) {
          if (before) add(r.ptrs[0]);
          WAN_THROW("pinning boom");
        },
        {});
    EXPECT_NE(msg.find("pinning boom"), std::string::npos) << msg;
    if (!before) {
      EXPECT_EQ(calls, 0);
    }
  }
  // Throws with a buffer given: the load still fails (no silent smaller ring).
  {
    const auto [msg, calls] =
        run_with([&](const StreamOptions::AddStaging&) { WAN_THROW("pinning boom"); }, {r.ptrs[0]});
    EXPECT_NE(msg.find("pinning boom"), std::string::npos) << msg;
  }
  // Adds nothing and returns, none given: no buffer will ever come.
  {
    const auto [msg, calls] = run_with([&](const StreamOptions::AddStaging&) {}, {});
    EXPECT_NE(msg.find("no staging buffers"), std::string::npos) << msg;
    EXPECT_EQ(calls, 0);
  }
  // A null buffer.
  {
    const auto [msg, calls] = run_with([&](const StreamOptions::AddStaging& add) { add(nullptr); }, {});
    EXPECT_NE(msg.find("null staging buffer"), std::string::npos) << msg;
  }
  // A file error while the ring grows: the file's error, and the grow thread is told to stop.
  {
    fs::resize_file(d.big, fs::file_size(d.big) / 2);
    std::atomic<bool> refused{false};
    const auto [msg, calls] = run_with(
        [&](const StreamOptions::AddStaging& add) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the range check fails meanwhile
          refused = !add(r.ptrs[0]);
        },
        {});
    EXPECT_NE(msg.find("past the end of the file"), std::string::npos) << msg;
    EXPECT_EQ(calls, 0);
    EXPECT_TRUE(refused.load()) << "a buffer was taken after run() had failed";
  }
}

}  // namespace
