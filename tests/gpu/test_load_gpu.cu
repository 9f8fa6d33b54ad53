// The streaming weight upload (src/runtime/load_gpu.h) and the warm-up (DiTGpu::warm_up):
// (a) the conversion kernel against core/dtype.h's host conversions, bit for bit, for every float
//     source dtype (random bit patterns: NaN, inf, subnormals included), scaled or not, to bf16 and
//     f32, aligned (vector path) and unaligned (scalar path), odd lengths;
// (b) every tensor of every component of every layout (official fp32 / bf16 with the .pth text
//     encoder and VAE, diffusers fp32 / bf16 sharded, ComfyUI fp16 and fp8_scaled, tiny checkpoints
//     written by make-checkpoint) streamed to the device equals the plain reference read (get_f32,
//     rounded to nearest even when the destination is bf16), byte for byte, for chunks of 64 bytes,
//     of 64·17 bytes (not dividing the tensors) and the tuned size; tensors without a byte range go
//     through their getter;
// (c) the DiT and text encoder uploads (upload_weights / T5EncoderGpu) streamed equal the old host
//     path bit for bit (DiT: the whole weight allocation; T5: its encoder output);
// (d) failures: a file truncated before the load, a file truncated during the load (reader hook), a
//     byte range past the end of its file: one clear wan::Error naming the file, no hang (a 60 s guard),
//     no device memory left allocated (cudaMemGetInfo before/after, after a warm-up load) also through
//     DiTGpu::create; a destroyed running loader stops; a cancel() right after start() (while the
//     staging ring is still being pinned) stops it too; a load that fails (file truncated, cancel())
//     while another thread holds a CUDA graph capture open (the engine's mode, ThreadLocal) leaves
//     that capture valid (the load thread frees nothing; finish() frees the staging) and still gives
//     its one clear error;
// (e) groups: after wait_group(g) group g is complete while later groups may still stream;
// (f) warm-up: graphs captured before the weights arrive (deferred arena, shared loader), then the
//     first forward replays them and equals an eager forward bit for bit;
// (g) `wan generate`'s fast start (text encoder and experts streamed together, encoding and then the
//     warm-up during the load) gives the same latents and video as the one-after-the-other path, bit
//     for bit; its start-up trace (WAN_STARTUP_TRACE) has every milestone, in order.
// Every load also checks the staging ring (pinned one buffer at a time while the readers start):
// at most K buffers, the set-up (until the first read) inside the load's time, the staging freed by
// finish().
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../cpu/test_util.h"
#include "../cpu/tiny_checkpoints.h"
#include "ckpt/layout.h"
#include "ckpt/stream.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/check.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/dit_gpu_geometry.h"  // build_weight_table
#include "models/weights_gpu.h"
#include "runtime/load_gpu.h"
#include "models/umt5/umt5_gpu.h"
#include "testing/make_checkpoint.h"
#include "gpu_test_util.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"
#include "pipeline/startup.h"
#include "formats/safetensors.h"

namespace fs = std::filesystem;
using namespace wan;
using cuda::DeviceLoader;
using cuda::LoadOptions;
using cuda::LoadTarget;
using wan::test::TempDir;

namespace {

// Runs f on another thread; a hang past 60 s fails the whole binary at once.
template <typename F>
auto guarded(F f) {
  auto fut = std::async(std::launch::async, std::move(f));
  if (fut.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "load test: did not finish within 60 s (hang)\n");
    std::_Exit(3);
  }
  return fut.get();
}

size_t free_device_bytes() {
  size_t f = 0, t = 0;
  CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return f;
}

LoadOptions small_options(size_t buffer_bytes, int buffers, int threads) {
  LoadOptions o;
  o.buffer_bytes = buffer_bytes;
  o.buffers = buffers;
  o.threads = threads;
  return o;
}

// ---------------------------------------------------------------------------------------------
// (a) conversion kernel

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(g());
  return v;
}

// Host reference: element i of src as f32 (core/dtype.h), times scale, rounded to dst.
std::vector<uint8_t> host_convert(const std::vector<uint8_t>& src, DType st, bool scaled, float scale, DType dt,
                                  size_t n) {
  std::vector<float> f(n);
  convert_to_f32(st, src.data(), f.data(), n);
  if (scaled)
    for (float& x : f) x = x * scale;
  std::vector<uint8_t> out(n * dtype_size(dt));
  if (dt == DType::F32) std::memcpy(out.data(), f.data(), out.size());
  else convert_from_f32(dt, f.data(), out.data(), n);
  return out;
}

TEST(LoadGpu, ConversionKernelMatchesHostBitForBit) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType st : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2, DType::F64})
    for (DType dt : {DType::BF16, DType::F32})
      for (bool scaled : {false, true})
        for (size_t misalign : {size_t{0}, size_t{1}}) {
          const size_t n = 100003;  // odd: a vector tail
          SCOPED_TRACE(cat(dtype_name(st), " -> ", dtype_name(dt), scaled ? " scaled" : "", misalign ? " unaligned" : ""));
          const size_t ss = dtype_size(st), ds = dtype_size(dt);
          const std::vector<uint8_t> src = random_bytes(n * ss, seed++);
          const float scale = scaled ? 0.0137f : 1.0f;
          const std::vector<uint8_t> want = host_convert(src, st, scaled, scale, dt, n);
          gpu_test::DevBuf<uint8_t> dsrc((n + 8) * ss), ddst((n + 8) * ds);
          ddst.poison();
          uint8_t* s_ptr = dsrc.p + misalign * ss;  // one element off: the scalar path
          uint8_t* d_ptr = ddst.p + misalign * ds;
          CUDA_CHECK(cudaMemcpy(s_ptr, src.data(), src.size(), cudaMemcpyHostToDevice));
          cuda::convert_weights(s_ptr, st, scaled, scale, d_ptr, dt, static_cast<int64_t>(n), nullptr);
          const std::vector<uint8_t> got = ddst.download();
          ASSERT_EQ(0, std::memcmp(got.data() + misalign * ds, want.data(), want.size()));
        }
}

// ---------------------------------------------------------------------------------------------
// (b) every tensor of every layout

class Checkpoints : public ::testing::Test {
 protected:
  static TempDir* dir;
  static void SetUpTestSuite() {
    dir = new TempDir("load_gpu");
    wan::test::make_tiny_checkpoint_set(*dir, 23);
    // ComfyUI single files from the official fp32 high-noise expert: fp16, and fp8_scaled.
    CheckpointInfo off = detect_checkpoint(*dir / "off_f32");
    auto src = open_weights(off, Role::DiTHigh);
    std::vector<std::pair<std::string, Tensor>> f16, f8;
    int k = 0;
    for (const std::string& n : src->names()) {
      Tensor f = src->get_f32(n);
      const std::string p = "model.diffusion_model." + n;
      Tensor h = Tensor::empty(DType::F16, f.shape());
      convert_from_f32(DType::F16, f.f32(), h.data(), static_cast<size_t>(f.numel()));
      f16.emplace_back(p, h);
      if (n.ends_with(".weight") && f.ndim() == 2) {
        const float scale = 0.0125f * static_cast<float>(1 + k++ % 3);
        Tensor q = Tensor::empty(DType::F8E4M3, f.shape());
        auto* d = static_cast<uint8_t*>(q.data());
        for (int64_t i = 0; i < f.numel(); ++i) d[i] = f32_to_f8e4m3(f.f32()[i] / scale);
        Tensor s = Tensor::f32(Shape{1});
        s.f32()[0] = scale;
        f8.emplace_back(p, q);
        f8.emplace_back(p.substr(0, p.size() - 7) + ".scale_weight", s);
      } else {
        f8.emplace_back(p, f);
      }
    }
    write_safetensors(*dir / "wan2.2_t2v_high_noise_14B_fp16.safetensors", f16);
    write_safetensors(*dir / "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", f8);
  }
  static void TearDownTestSuite() {
    delete dir;
    dir = nullptr;
  }
};
TempDir* Checkpoints::dir = nullptr;

struct Component {
  std::string what;
  std::unique_ptr<WeightStore> store;
};

std::vector<Component> components_of(const std::string& path) {
  std::vector<Component> v;
  CheckpointInfo info = detect_checkpoint(path);
  for (const wan::Component& c : info.components) {
    if (c.role == Role::Tokenizer) continue;
    v.push_back({cat(path, " ", role_name(c.role)), open_weights(info, c.role)});
  }
  return v;
}

// Streams every tensor of the components (destination bf16 / f32 alternating; every 7th tensor
// through its getter instead of its byte range) and compares with get_f32 (+ RNE to bf16).
void stream_and_compare(const std::vector<Component>& comps, const LoadOptions& opt) {
  SCOPED_TRACE(cat("buffer ", opt.buffer_bytes, " B x ", opt.buffers, ", ", opt.threads, " readers"));
  struct Ref {
    size_t offset;
    std::vector<uint8_t> want;
    std::string name;
  };
  std::vector<Ref> refs;
  std::vector<LoadTarget> targets;
  size_t bytes = 0;
  int k = 0, spans = 0, fallbacks = 0;
  for (const Component& c : comps)
    for (const std::string& n : c.store->names()) {
      const DType dt = k++ % 2 ? DType::BF16 : DType::F32;
      Tensor f = c.store->get_f32(n);
      Ref r;
      r.offset = bytes;
      r.name = cat(c.what, " ", n);
      r.want.resize(static_cast<size_t>(f.numel()) * dtype_size(dt));
      if (dt == DType::F32) std::memcpy(r.want.data(), f.data(), r.want.size());
      else convert_from_f32(dt, f.f32(), r.want.data(), static_cast<size_t>(f.numel()));
      LoadTarget t;
      t.name = r.name;
      t.dtype = dt;
      t.shape = f.shape();
      t.group = static_cast<int>(&c - comps.data());
      if (k % 7 != 0) t.span = c.store->raw_span(n);
      const WeightStore* ws = c.store.get();
      if (!t.span) t.fallback = [ws, n] { return ws->get_f32(n); };
      (t.span ? spans : fallbacks)++;
      bytes += (r.want.size() + 255) / 256 * 256;
      refs.push_back(std::move(r));
      targets.push_back(std::move(t));
    }
  ASSERT_GT(spans, 20);
  ASSERT_GT(fallbacks, 2);
  gpu_test::DevBuf<uint8_t> dev(bytes);
  dev.poison();
  for (size_t i = 0; i < targets.size(); ++i) targets[i].dst = dev.p + refs[i].offset;
  const cuda::LoadStats st = guarded([&] { return cuda::load_to_device(targets, opt); });
  EXPECT_EQ(st.tensors + st.fallback_tensors, static_cast<int>(targets.size()));
  EXPECT_EQ(st.fallback_tensors, fallbacks);
  EXPECT_GE(st.stream.buffers, 1);  // the ring grows only while chunks wait for a buffer
  EXPECT_LE(st.stream.buffers, opt.buffers);
  EXPECT_LE(st.stream.max_outstanding, st.stream.buffers);
  EXPECT_GT(st.setup_seconds, 0.0);
  EXPECT_LT(st.setup_seconds, st.seconds);
  EXPECT_LE(st.stream.first_read_seconds, st.stream.seconds);
  EXPECT_GT(st.free_seconds, 0.0);  // finish() freed the staging
  const std::vector<uint8_t> got = dev.download();
  for (const Ref& r : refs)
    ASSERT_EQ(0, std::memcmp(got.data() + r.offset, r.want.data(), r.want.size())) << r.name << " differs";
}

void sweep_layout(const std::vector<Component>& comps) {
  stream_and_compare(comps, small_options(64 * 17, 3, 4));      // chunks not dividing the tensors
  stream_and_compare(comps, LoadOptions::tuned());               // the pipeline's settings
  stream_and_compare(comps, small_options(size_t{1} << 20, 2, 1));  // 1 reader, a ring of 2
}

TEST_F(Checkpoints, OfficialF32EveryTensorBitIdentical) {
  REQUIRE_GPU();
  auto comps = components_of(*dir / "off_f32");
  bool pth = false;
  for (const Component& c : comps)
    for (const std::string& n : c.store->names()) {
      auto sp = c.store->raw_span(n);
      pth |= sp && sp->path.ends_with(".pth");
    }
  EXPECT_TRUE(pth) << "the official layout's text encoder and VAE are .pth files";
  sweep_layout(comps);
}
TEST_F(Checkpoints, OfficialBf16EveryTensorBitIdentical) {
  REQUIRE_GPU();
  sweep_layout(components_of(*dir / "off_bf16"));
}
TEST_F(Checkpoints, DiffusersF32EveryTensorBitIdentical) {
  REQUIRE_GPU();
  sweep_layout(components_of(*dir / "dif_f32"));
}
TEST_F(Checkpoints, DiffusersBf16ShardedEveryTensorBitIdentical) {
  REQUIRE_GPU();
  sweep_layout(components_of(*dir / "dif_bf16"));
}
TEST_F(Checkpoints, ComfyFp16EveryTensorBitIdentical) {
  REQUIRE_GPU();
  auto comps = components_of(*dir / "wan2.2_t2v_high_noise_14B_fp16.safetensors");
  ASSERT_EQ(comps.size(), 1u);
  EXPECT_EQ(comps[0].store->dtype("blocks.0.ffn.0.weight"), DType::F16);
  sweep_layout(comps);
}
TEST_F(Checkpoints, ComfyFp8ScaledEveryTensorBitIdentical) {
  REQUIRE_GPU();
  auto comps = components_of(*dir / "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors");
  ASSERT_EQ(comps.size(), 1u);
  auto sp = comps[0].store->raw_span("blocks.0.ffn.0.weight");
  ASSERT_TRUE(sp && sp->scaled && sp->dtype == DType::F8E4M3);
  sweep_layout(comps);
}

TEST_F(Checkpoints, Chunks64BytesOddSizes) {
  REQUIRE_GPU();
  // 64-byte chunks over the biases, norms and embeddings of one expert (sizes that are not multiples
  // of anything in particular): thousands of copies through a ring of 2.
  CheckpointInfo info = detect_checkpoint(*dir / "off_f32");
  std::vector<Component> comps;
  comps.push_back({"high", open_weights(info, Role::DiTHigh)});
  stream_and_compare(comps, small_options(64, 2, 3));
}

// ---------------------------------------------------------------------------------------------
// (c) DiT and text encoder: streamed == old host path

TEST_F(Checkpoints, DiTUploadStreamedEqualsHostPath) {
  REQUIRE_GPU();
  for (const char* layout : {"off_f32", "dif_bf16", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                             "wan2.2_t2v_high_noise_14B_fp16.safetensors"}) {
    SCOPED_TRACE(layout);
    CheckpointInfo info = detect_checkpoint(*dir / layout);
    auto store = open_weights(info, info.has(Role::DiTHigh) ? Role::DiTHigh : Role::DiT);
    WeightStore* ws = store.get();
    const auto table = cuda::dit_gpu_detail::build_weight_table(info.dit);
    auto get = [ws](const std::string& n) { return ws->get_f32(n); };
    auto span = [ws](const std::string& n) { return ws->raw_span(n); };
    gpu_test::DevBuf<uint8_t> a(table.bytes), b(table.bytes);
    CUDA_CHECK(cudaMemset(a.p, 0, table.bytes));
    CUDA_CHECK(cudaMemset(b.p, 0, table.bytes));  // the gaps between ranges compare equal
    cuda::dit_gpu_detail::upload_weights(table, a.p, get, "DiT");                       // host conversion
    guarded([&] { cuda::dit_gpu_detail::upload_weights(table, b.p, get, "DiT", span); });  // streamed
    const auto ha = a.download(), hb = b.download();
    ASSERT_EQ(0, std::memcmp(ha.data(), hb.data(), ha.size()));
  }
}

TEST_F(Checkpoints, TextEncoderStreamedEqualsHostPath) {
  REQUIRE_GPU();
  for (const char* layout : {"off_f32", "dif_bf16"}) {  // .pth and diffusers safetensors
    SCOPED_TRACE(layout);
    CheckpointInfo info = detect_checkpoint(*dir / layout);
    const T5Config cfg = t5_config_for(info);
    auto store = open_weights(info, Role::TextEncoder);
    WeightStore* ws = store.get();
    cuda::T5WeightSource host, streamed;
    host.get = streamed.get = [ws](const std::string& n) { return ws->get(n); };
    streamed.span = [ws](const std::string& n) { return ws->raw_span(n); };
    std::vector<int32_t> ids;
    std::mt19937 g(5);
    for (int i = 0; i < 37; ++i) ids.push_back(static_cast<int32_t>(g() % static_cast<unsigned>(cfg.vocab)));
    cuda::T5EncoderGpu ta(cfg, host, 0);
    const Tensor oa = ta.encode(ids.data(), static_cast<int64_t>(ids.size()));
    Tensor ob;
    guarded([&] {
      cuda::T5EncoderGpu tb(cfg, streamed, 0);
      ob = tb.encode(ids.data(), static_cast<int64_t>(ids.size()));
    });
    ASSERT_EQ(oa.shape(), ob.shape());
    double sq = 0;
    for (int64_t i = 0; i < oa.numel(); ++i) sq += static_cast<double>(oa.f32()[i]) * oa.f32()[i];
    EXPECT_GT(sq, 0.0);
    ASSERT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.nbytes())) << "streamed text encoder output differs";
  }
}

// ---------------------------------------------------------------------------------------------
// (d) failures

struct Damaged {
  TempDir t{"load_gpu_damaged"};
  CheckpointInfo info;
  std::unique_ptr<WeightStore> store;
  std::string big;  // the expert's largest file
  Damaged() {
    gen::MakeCheckpointOptions o;
    o.config = "tiny";
    o.layout = Layout::Official;
    o.dit_only = true;
    o.seed = 4;
    o.out = t / "ck";
    gen::make_checkpoint(o);
    info = detect_checkpoint(o.out + "/high_noise_model");
    store = open_weights(info, info.components.at(0).role);
    uint64_t most = 0;
    for (const std::string& n : store->names()) {
      auto sp = store->raw_span(n);
      if (sp && fs::file_size(sp->path) > most) most = fs::file_size(sp->path), big = sp->path;
    }
  }
  cuda::DiTWeightSource source(DeviceLoader* loader = nullptr) {
    WeightStore* ws = store.get();
    cuda::DiTWeightSource s = cuda::DiTWeightSource::from([ws](const std::string& n) { return ws->get_f32(n); });
    s.span = [ws](const std::string& n) { return ws->raw_span(n); };
    s.loader = loader;
    return s;
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

// A load that succeeds first: kernels and library state that stay loaded are not counted as leaks.
void warm_once(Damaged& d) {
  cuda::DiTGpu::Options opt;
  opt.defer_arena = true;
  auto g = cuda::DiTGpu::create(d.info.dit, {d.source()}, cuda::DiTShape{}, opt);
  CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(LoadGpuErrors, TruncatedBeforeLoadThroughDiTCreate) {
  REQUIRE_GPU();
  Damaged d;
  warm_once(d);
  const size_t before = free_device_bytes();
  fs::resize_file(d.big, fs::file_size(d.big) / 2);
  cuda::DiTGpu::Options opt;
  opt.defer_arena = true;
  const std::string msg =
      error_of([&] { auto g = cuda::DiTGpu::create(d.info.dit, {d.source()}, cuda::DiTShape{}, opt); });
  EXPECT_NE(msg.find(d.big), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
  EXPECT_EQ(free_device_bytes(), before) << "device memory left allocated after the error";
}

TEST(LoadGpuErrors, TruncatedDuringLoadIsOneClearErrorAndFreesEverything) {
  REQUIRE_GPU();
  Damaged d;
  warm_once(d);
  const size_t before = free_device_bytes();
  LoadOptions o = small_options(4096, 3, 2);
  bool cut = false;
  o.on_chunk = [&](const Chunk& c) {  // after the first chunk of the big file: cut it to a quarter
    if (!cut && c.t->span.path == d.big) {
      cut = true;
      fs::resize_file(d.big, fs::file_size(d.big) / 4);
    }
  };
  const std::string msg = error_of([&] {
    DeviceLoader loader(o);
    cuda::DiTGpu::Options opt;
    opt.defer_arena = true;
    auto g = cuda::DiTGpu::create(d.info.dit, {d.source(&loader)}, cuda::DiTShape{}, opt);
    loader.start();
    loader.finish();
  });
  EXPECT_TRUE(cut);
  EXPECT_NE(msg.find(d.big), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("\n"), std::string::npos) << "one line: " << msg;
  EXPECT_EQ(free_device_bytes(), before) << "device memory left allocated after the error";
}

TEST(LoadGpuErrors, RangePastTheEndAndBadTargets) {
  REQUIRE_GPU();
  Damaged d;
  warm_once(d);
  const size_t before = free_device_bytes();
  // A span whose header entry points past the end of its file (a corrupted header).
  const std::string name = "blocks.0.ffn.0.weight";
  RawSpan sp = *d.store->raw_span(name);
  sp.offset = fs::file_size(sp.path) - sp.length / 2;
  {
    gpu_test::DevBuf<uint8_t> dst(sp.length);
    LoadTarget t;
    t.name = name;
    t.span = sp;
    t.dst = dst.p;
    t.dtype = DType::F32;
    t.shape = sp.shape;
    const std::string msg = error_of([&] { cuda::load_to_device({t}, small_options(1 << 16, 2, 2)); });
    EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    // Wrong shape / no destination / unaligned destination: refused by add().
    LoadTarget bad = t;
    bad.shape = Shape{3};
    DeviceLoader l;
    EXPECT_THROW(l.add(bad), Error);
    bad = t;
    bad.dst = nullptr;
    EXPECT_THROW(l.add(bad), Error);
    bad = t;
    bad.dst = dst.p + 2;
    EXPECT_THROW(l.add(bad), Error);
  }
  EXPECT_EQ(free_device_bytes(), before);
}

TEST(LoadGpuErrors, CancelAndDestroyWhileRunningStopAndFree) {
  REQUIRE_GPU();
  Damaged d;
  warm_once(d);
  const size_t before = free_device_bytes();
  cuda::DiTGpu::Options opt;
  opt.defer_arena = true;
  // cancel() at the 10th chunk: the load stops with "cancelled".
  const std::string msg = error_of([&] {
    LoadOptions o = small_options(64, 2, 2);  // many tiny chunks: far from done at the 10th
    DeviceLoader* self = nullptr;
    int n = 0;
    o.on_chunk = [&](const Chunk&) {
      if (++n == 10) self->cancel();
    };
    std::unique_ptr<cuda::DiTGpu> g;  // declared first: destroyed after the loader
    DeviceLoader loader(o);
    self = &loader;
    g = std::make_unique<cuda::DiTGpu>(cuda::DiTGpu::create(d.info.dit, {d.source(&loader)}, cuda::DiTShape{}, opt));
    loader.start();
    loader.finish();
  });
  EXPECT_NE(msg.find("cancelled"), std::string::npos) << msg;
  EXPECT_EQ(free_device_bytes(), before);
  // cancel() at once after start(): the ring is still being pinned (or not begun); the load stops
  // with "cancelled" whichever thread sees it first, and frees what was pinned.
  // The first chunk waits for the cancel() (so the load cannot finish first), and there are hundreds.
  const std::string early = error_of([&] {
    std::atomic<bool> asked{false};
    LoadOptions o = small_options(4096, 12, 4);
    o.on_chunk = [&](const Chunk&) {
      for (int i = 0; i < 5000 && !asked; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    std::unique_ptr<cuda::DiTGpu> g;
    DeviceLoader loader(o);
    g = std::make_unique<cuda::DiTGpu>(cuda::DiTGpu::create(d.info.dit, {d.source(&loader)}, cuda::DiTShape{}, opt));
    loader.start();
    loader.cancel();
    asked = true;
    loader.finish();
  });
  EXPECT_NE(early.find("cancelled"), std::string::npos) << early;
  EXPECT_EQ(free_device_bytes(), before);
  // Destroyed while running, without finish(): stops, no hang.
  guarded([&] {
    std::unique_ptr<cuda::DiTGpu> g;
    DeviceLoader loader(small_options(64, 2, 2));
    g = std::make_unique<cuda::DiTGpu>(cuda::DiTGpu::create(d.info.dit, {d.source(&loader)}, cuda::DiTShape{}, opt));
    loader.start();
    return 0;
  });
  EXPECT_EQ(free_device_bytes(), before);
}

// The capture thread's graph nodes: p[i] += 1.
__global__ void add_one(int* p, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) p[i] += 1;
}

// CUDA graph captures on a stream of their own, as DiTGpu's warm-up makes them beside a load
// (cudaStreamCaptureModeThreadLocal on a non-blocking stream): after `go`, capture 0 stays open,
// a node every 200 us (at most kMaxNodes), until `stop` (the load fails meanwhile); captures 1..3 of
// 8 nodes follow at once. Each is ended, instantiated, launched once and synchronised; every CUDA
// status that is not success is kept.
struct Capturer {
  static constexpr int kCaptures = 4;
  static constexpr int kCounters = 256;
  static constexpr int kMaxNodes = 1000;  // capture 0 stays open longer than that takes (10 s at most)
  cudaStream_t s;
  int* counters;  // device, kCounters
  std::atomic<bool> go{false}, open{false}, stop{false};
  std::vector<std::string> errors;  // "capture i: call: error"
  int captures = 0;                 // launched and synchronised without an error
  int64_t nodes = 0;                // add_one nodes launched (each counter went up by that many)
  std::thread t;

  void note(int i, const char* call, cudaError_t e) {
    if (e != cudaSuccess) errors.push_back(cat("capture ", i, ": ", call, ": ", cudaGetErrorString(e)));
  }
  // One capture of `n` nodes (n < 0: until `stop`); false after an error.
  bool capture(int i, int n) {
    const size_t before = errors.size();
    note(i, "cudaStreamBeginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (errors.size() != before) return false;
    open = true;
    int made = 0;
    const Clock::time_point t0 = Clock::now();
    while (n < 0 ? !stop && seconds_since(t0) < 10 : made < n) {
      if (made < kMaxNodes) {
        add_one<<<1, kCounters, 0, s>>>(counters, kCounters);
        note(i, "kernel launch", cudaGetLastError());
        ++made;
      }
      if (n < 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    note(i, "cudaStreamIsCapturing", cudaStreamIsCapturing(s, &status));
    if (status != cudaStreamCaptureStatusActive)
      errors.push_back(cat("capture ", i, ": no longer active (status ", static_cast<int>(status), ")"));
    cudaGraph_t graph = nullptr;
    note(i, "cudaStreamEndCapture", cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec = nullptr;
    if (graph) note(i, "cudaGraphInstantiate", cudaGraphInstantiate(&exec, graph, 0));
    if (exec) {
      note(i, "cudaGraphLaunch", cudaGraphLaunch(exec, s));
      note(i, "cudaStreamSynchronize", cudaStreamSynchronize(s));
      cudaGraphExecDestroy(exec);
    }
    if (graph) cudaGraphDestroy(graph);
    if (errors.size() != before || !exec) return false;
    ++captures;
    nodes += made;
    return true;
  }
  void start(int device) {
    t = std::thread([this, device] {
      note(-1, "cudaSetDevice", cudaSetDevice(device));
      const Clock::time_point t0 = Clock::now();
      while (!go && !stop && seconds_since(t0) < 30) std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (!go) return;
      for (int i = 0; i < kCaptures; ++i)
        if (!capture(i, i == 0 ? -1 : 8)) return;
    });
  }
  void join() {
    stop = true;
    if (t.joinable()) t.join();
  }
};

TEST(LoadGpuErrors, FailureDuringAGraphCaptureOnAnotherThreadKeepsTheCaptureValid) {
  REQUIRE_GPU();
  // 32 tensors of 1 MiB of f32 (fresh random values) in one file, loaded to bf16: every chunk is
  // converted, so the ring has device slots (4 x 1 MiB, seen by cudaMemGetInfo if they leaked).
  constexpr int kTensors = 32, kRing = 4;
  constexpr int64_t kElems = int64_t{1} << 18;
  constexpr size_t kBytes = static_cast<size_t>(kElems) * 4;
  TempDir dir("load_gpu_capture");
  const std::string path = dir / "weights.bin";
  std::vector<float> data(static_cast<size_t>(kTensors * kElems));
  {
    std::mt19937 g(std::random_device{}());
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& x : data) x = nd(g);
  }
  auto write_file = [&] {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
    ASSERT_TRUE(f.good());
  };
  gpu_test::DevBuf<uint16_t> dst(data.size());
  auto add_targets = [&](DeviceLoader& l) {
    for (int i = 0; i < kTensors; ++i) {
      LoadTarget t;
      t.name = cat("capture test tensor ", i);
      t.span = RawSpan{path, static_cast<uint64_t>(i) * kBytes, kBytes, DType::F32, Shape{kElems}};
      t.dst = dst.p + static_cast<size_t>(i) * static_cast<size_t>(kElems);
      t.dtype = DType::BF16;
      t.shape = Shape{kElems};
      l.add(std::move(t));
    }
  };
  // kRing readers: while the first chunk's hook sleeps, the others take every buffer of the ring as it
  // is pinned, so a chunk in buffer kRing - 1 comes soon: the ring is complete (the grow thread
  // allocates nothing more) before any capture begins.
  const LoadOptions base = small_options(kBytes, kRing, kRing);

  // A load that succeeds (bit-exact), and a capture, first: kernels and library state that stay loaded
  // are not counted as leaks.
  write_file();
  guarded([&] {
    DeviceLoader l(base);
    add_targets(l);
    l.start();
    return l.finish();
  });
  {
    const std::vector<uint16_t> got = dst.download();
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(data[i])) << "element " << i;
  }
  gpu_test::StreamGuard cs;
  gpu_test::DevBuf<int> counters(Capturer::kCounters);
  std::vector<int> init(Capturer::kCounters);
  {
    std::mt19937 g(std::random_device{}());
    for (int& v : init) v = static_cast<int>(g() % 100000);
  }
  {
    // Without a load the captures work (else the test below would say nothing about the loader).
    Capturer warm{cs.s, counters.p};
    warm.start(0);
    warm.go = true;
    const Clock::time_point t0 = Clock::now();
    while (!warm.open && seconds_since(t0) < 20) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    warm.join();  // capture 0 runs until `stop`
    ASSERT_TRUE(warm.errors.empty()) << warm.errors.front();
    ASSERT_EQ(warm.captures, Capturer::kCaptures);
  }
  const size_t before = free_device_bytes();

  for (const bool cancel : {false, true}) {
    SCOPED_TRACE(cancel ? "cancel()" : "file truncated during the load");
    write_file();
    counters.upload(init);
    Capturer cap{cs.s, counters.p};
    cap.start(0);
    LoadOptions o = base;
    DeviceLoader* self = nullptr;
    int chunks = 0;
    bool fired = false, opened = false;
    o.on_chunk = [&](const Chunk& c) {  // serialised: one reader at a time
      if (++chunks == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (fired || c.buffer != kRing - 1) return;
      fired = true;
      cap.go = true;
      const Clock::time_point t0 = Clock::now();
      while (!cap.open && seconds_since(t0) < 20) std::this_thread::sleep_for(std::chrono::microseconds(100));
      opened = cap.open;
      // The load fails while the capture is open: the chunks still to read lie past the new end.
      if (cancel) self->cancel();
      else fs::resize_file(path, kBytes * kTensors / 4);
    };
    std::string waited, finished, again;
    guarded([&] {
      DeviceLoader loader(o);
      self = &loader;
      add_targets(loader);
      loader.start();
      try {
        loader.wait_group(0);  // frees nothing: the capture is still open
      } catch (const Error& e) {
        waited = e.what();
      }
      cap.join();  // capture 0 ends now, 1..3 follow; then no capture runs
      finished = error_of([&] { loader.finish(); });  // frees the staging here
      again = error_of([&] { loader.finish(); });
      return 0;
    });
    cap.join();
    EXPECT_TRUE(fired) << "no chunk came in buffer " << kRing - 1 << " (" << chunks << " chunks)";
    EXPECT_TRUE(opened) << "the capture never began";
    std::string errs;
    for (const std::string& e : cap.errors) errs += e + "\n";
    EXPECT_TRUE(cap.errors.empty()) << "the failed load broke the capture on the other thread:\n" << errs;
    EXPECT_EQ(cap.captures, Capturer::kCaptures) << errs;
    EXPECT_GE(cap.nodes, 1 + 8 * (Capturer::kCaptures - 1));
    const std::vector<int> got = counters.download();
    for (int i = 0; i < Capturer::kCounters; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], init[static_cast<size_t>(i)] + cap.nodes) << "counter " << i;
    EXPECT_NE(waited.find(path), std::string::npos) << waited;
    EXPECT_NE(waited.find(cancel ? "cancelled" : "truncated"), std::string::npos) << waited;
    EXPECT_NE(waited.find("capture test tensor "), std::string::npos) << waited;
    EXPECT_EQ(waited.find('\n'), std::string::npos) << "one line: " << waited;
    EXPECT_EQ(finished, waited);
    EXPECT_EQ(again, waited);
    // The staging went with finish() / the destructor: 4 MiB of device slots if it leaked.
    const size_t after = free_device_bytes();
    EXPECT_LE(before > after ? before - after : 0, size_t{1} << 20)
        << "device memory left allocated after the failed load: " << before << " -> " << after << " bytes free";
  }
}

// ---------------------------------------------------------------------------------------------
// (e) groups

TEST_F(Checkpoints, WaitGroupGivesACompleteGroup) {
  REQUIRE_GPU();
  CheckpointInfo info = detect_checkpoint(*dir / "off_f32");
  auto te = open_weights(info, Role::TextEncoder);
  auto hi = open_weights(info, Role::DiTHigh);
  // Group 5 (the text encoder's tensors) is added first and so read first; group 9 after it.
  std::vector<LoadTarget> ts;
  std::vector<std::pair<size_t, std::vector<uint8_t>>> want0;
  size_t bytes = 0;
  for (const WeightStore* s : {te.get(), hi.get()})
    for (const std::string& n : s->names()) {
      LoadTarget t;
      t.name = n;
      t.span = s->raw_span(n);
      t.dtype = DType::F32;
      t.shape = s->shape(n);
      t.group = s == te.get() ? 5 : 9;
      if (t.group == 5) {
        Tensor f = s->get_f32(n);
        want0.push_back({bytes, std::vector<uint8_t>(static_cast<const uint8_t*>(f.data()),
                                                     static_cast<const uint8_t*>(f.data()) + f.nbytes())});
      }
      t.dst = reinterpret_cast<void*>(bytes);  // rebased below
      bytes += (static_cast<size_t>(t.shape.numel()) * 4 + 255) / 256 * 256;
      ts.push_back(std::move(t));
    }
  gpu_test::DevBuf<uint8_t> dev(bytes);
  dev.poison();
  DeviceLoader l(small_options(256, 2, 2));  // small chunks: the experts keep streaming for a while
  for (LoadTarget& t : ts) {
    t.dst = dev.p + reinterpret_cast<size_t>(t.dst);
    l.add(std::move(t));
  }
  l.start();
  guarded([&] {
    l.wait_group(5);
    l.wait_group(12345);  // no such group: nothing to wait for
    return 0;
  });
  std::vector<uint8_t> got(bytes);
  CUDA_CHECK(cudaMemcpy(got.data(), dev.p, bytes, cudaMemcpyDeviceToHost));  // the loader's stream is not the legacy one
  for (const auto& [off, w] : want0) ASSERT_EQ(0, std::memcmp(got.data() + off, w.data(), w.size()));
  const cuda::LoadStats st = guarded([&] { return l.finish(); });
  EXPECT_GT(st.chunks, 100u);
}

// ---------------------------------------------------------------------------------------------
// (f) warm-up

TEST_F(Checkpoints, WarmUpBeforeTheWeightsThenReplayEqualsEager) {
  REQUIRE_GPU();
  CheckpointInfo info = detect_checkpoint(*dir / "dif_bf16");
  auto hi = open_weights(info, Role::DiTHigh), lo = open_weights(info, Role::DiTLow);
  const DiTConfig& c = info.dit;
  const cuda::DiTShape s{2, 3, 6, 10};
  DeviceLoader loader(LoadOptions::tuned());
  std::vector<cuda::DiTWeightSource> src;
  for (WeightStore* ws : {hi.get(), lo.get()}) {
    cuda::DiTWeightSource w = cuda::DiTWeightSource::from([ws](const std::string& n) { return ws->get_f32(n); });
    w.span = [ws](const std::string& n) { return ws->raw_span(n); };
    w.loader = &loader;
    src.push_back(std::move(w));
  }
  cuda::DiTGpu::Options opt;
  opt.defer_arena = true;
  cuda::DiTGpu gpu = cuda::DiTGpu::create(c, src, s, opt);
  // Capture both experts' graphs before a single weight byte has been copied.
  gpu.warm_up({{0, s}, {1, s}, {0, cuda::DiTShape{1, 3, 6, 10}}});
  EXPECT_EQ(gpu.graphs_captured(), 3u);
  loader.start();
  guarded([&] { return loader.finish(); });

  const size_t nx = static_cast<size_t>(2 * c.in_dim * s.frames * s.height * s.width);
  const std::vector<float> x = gpu_test::randn(71, nx, 1.0f);
  const std::vector<float> ctx = gpu_test::randn(72, static_cast<size_t>(2 * 9 * c.text_dim), 0.5f);
  const float t[2] = {937.0f, 937.0f};
  const int64_t lens[2] = {9, 5};
  cuda::DiTInputs in;
  in.x = x.data();
  in.t = t;
  in.context = ctx.data();
  in.ctx_rows = 9;
  in.ctx_lens = lens;
  for (int e = 0; e < 2; ++e) {
    std::vector<float> replay(nx, std::nanf("")), eager(nx, std::nanf(""));
    gpu.forward(e, s, in, replay.data(), nullptr);  // the warm-up's graph
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(gpu.graphs_captured(), 3u);
    gpu.set_use_graphs(false);
    gpu.forward(e, s, in, eager.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    gpu.set_use_graphs(true);
    size_t finite = 0;
    for (float v : replay) finite += std::isfinite(v);
    EXPECT_EQ(finite, nx) << "expert " << e;
    EXPECT_EQ(0, std::memcmp(replay.data(), eager.data(), nx * 4)) << "expert " << e << ": replay differs from eager";
  }
}

// ---------------------------------------------------------------------------------------------
// (g) the pipeline's fast start: same latents and video as the one-after-the-other path

nlohmann::json read_trace(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path << ": no start-up trace written";
  return nlohmann::json::parse(f);
}

TEST_F(Checkpoints, PipelineFastStartEqualsSequentialLoad) {
  REQUIRE_GPU();
  GenerateOptions o;
  o.model = *dir / "off_f32";
  o.prompt = "a red fox runs through the snow";
  o.width = 64;
  o.height = 48;
  o.frames = 9;
  o.steps = 6;
  o.seed = 5;
  o.device = "cuda";
  GeneratePlan fast = plan_generate(o);
  ASSERT_TRUE(fast.fast_start) << "the tiny model fits next to its text encoder";
  GeneratePlan seq = fast;
  seq.fast_start = false;
  const std::string trace = *dir / "startup_trace.json";
  // a: the fast start (with its trace); b: no fast start at all.
  GenerateResult a;
  nlohmann::json ta;
  {
    test::EnvGuard tr;
    tr.set("WAN_STARTUP_TRACE", trace);
    a = guarded([&] { return run_generate(fast, {}); });
    ta = read_trace(trace);
  }
  const GenerateResult b = guarded([&] { return run_generate(seq, {}); });
  EXPECT_EQ(ta.value("version", 0), kStartupTraceVersion) << ta.dump();
  EXPECT_FALSE(ta.contains("warm_up_order")) << ta.dump();
  // Every milestone happened, in order: the warm-up after the encoding, the first read before the
  // text encoder is resident.
  const nlohmann::json& m = ta.at("marks");
  for (const char* k : {"libraries_loaded", "entered", "loader_started", "streaming", "text_resident", "text_encoded",
                        "warm_up_done", "weights_resident", "returned"})
    EXPECT_GT(m.value(k, 0.0), 0.0) << k << " in " << ta.dump();
  EXPECT_LE(m.value("libraries_loaded", 0.0), m.value("entered", 0.0));
  EXPECT_LE(m.value("entered", 0.0), m.value("loader_started", 0.0));
  EXPECT_LE(m.value("streaming", 0.0), m.value("text_resident", 0.0) + 0.02);  // streaming: the loader's clock
  EXPECT_LE(m.value("loader_started", 0.0), m.value("text_resident", 0.0));
  EXPECT_LE(m.value("streaming", 0.0), m.value("weights_resident", 0.0));
  EXPECT_LE(m.value("text_resident", 0.0), m.value("text_encoded", 0.0));
  EXPECT_GE(m.value("warm_up_done", 0.0), m.value("text_encoded", 0.0));
  for (const char* k : {"text_encoded", "warm_up_done", "weights_resident"})
    EXPECT_LE(m.value(k, 0.0), m.value("returned", 0.0) + 0.02) << k;  // weights_resident: the loader's clock
  EXPECT_GT(ta.value("warm_up_s", 0.0), 0.0);
  EXPECT_GT(ta.value("loader_setup_s", 0.0), 0.0);
  EXPECT_LT(ta.value("loader_setup_s", 0.0), ta.value("load_wall_s", 0.0));
  EXPECT_GT(ta.value("staging_free_s", 0.0), 0.0);
  EXPECT_GT(a.timings.load_wall, 0.0);
  EXPECT_GT(a.timings.warm_up, 0.0);
  EXPECT_GT(a.timings.startup, 0.0);
  EXPECT_GT(a.load_bytes, 0u);
  EXPECT_EQ(b.timings.load_wall, 0.0);
  EXPECT_GT(b.timings.warm_up, 0.0);  // the sequential path warms up too
  ASSERT_EQ(a.latents.shape(), b.latents.shape());
  EXPECT_EQ(0, std::memcmp(a.latents.data(), b.latents.data(), b.latents.nbytes())) << "fast start changed the latents";
  ASSERT_EQ(a.video.shape(), b.video.shape());
  EXPECT_EQ(0, std::memcmp(a.video.data(), b.video.data(), b.video.nbytes())) << "fast start changed the video";
}

}  // namespace
