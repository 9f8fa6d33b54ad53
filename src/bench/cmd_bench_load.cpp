// `wan bench --load PATH` (also `wan bench-load PATH`): start-up at hardware speed, measured
// against the hardware in one run on one checkpoint.
// What is measured (say it, so numbers are never mistaken for something else; each step says more):
// - files: every file holding a streamed tensor of the text encoder and the DiT expert(s) (the VAE is
//   read on the host and is not part of the GPU load), read once whole first to put it in the page
//   cache: every number below is a page-cache number;
// - the hardware (measure_hardware): page-cache reads with 1 thread and all threads, pinned H2D;
// - load (time_load): the engine's path file -> GPU weights, per component alone and all together;
//   bound = min(read all threads, H2D); fraction = load / bound (target >= 0.8 for fp32 and bf16);
// - first step (--first-step, first_step): `wan generate` as a child process, process start to the first
//   denoising step and its critical path, and a projection for the full-size T2V-A14B.
// JSON (--json): device, commit ($WAN_COMMIT), date, checkpoint, layout, rows, the bandwidths, the bound,
// the fractions and the targets; first_step.critical_path (<milestone>_at_s), first_step.startup_trace,
// cuda_context_s.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/layout.h"
#include "bench/bench_common.h"
#include "bench/commands.h"
#include "models/config.h"
#include "core/clock.h"
#include "core/error.h"
#include "pipeline/files.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"

#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/check.h"
#include "lora/lora_gpu.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/weights.h"
#include "runtime/load_gpu.h"
#include "kernels/rng.h"
#include "models/umt5/umt5_gpu.h"
#endif

namespace wan::cli {
namespace {

constexpr double kGB = 1e9;

// The command line's checkpoint, device and JSON path, read and checked before any device work.
struct LoadSettings {
  std::string path, json_path;
  int device = 0;
};

LoadSettings parse_settings(const api::Values& args) {
  LoadSettings s;
  s.path = args.get_or("load", "");
  if (s.path.empty() && !args.positional().empty()) s.path = args.positional()[0];
  WAN_CHECK(!s.path.empty(), "wan bench --load PATH: missing the checkpoint PATH");
  s.device = args.device("device");
  s.json_path = args.get_or("json", "");
  if (!s.json_path.empty()) check_output_path(s.json_path, "--json");  // before any work
  return s;
}

#ifdef WAN_HAVE_CUDA

// ---- page-cache reads ----

struct Piece {
  int file;
  uint64_t offset, length;
};
constexpr uint64_t kPiece = uint64_t{16} << 20;

struct FileSet {
  std::vector<std::string> paths;
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
};

// Reads `pieces` with `threads` threads (each takes the next piece) into touched host buffers; returns the
// bytes read. The 1-thread test reads at most --read1-gb GB (the first files), the parallel one all files.
uint64_t read_pieces(const FileSet& fs, const std::vector<Piece>& pieces, int threads) {
  std::vector<int> fds;
  for (const std::string& p : fs.paths) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    WAN_CHECK(fd >= 0, p, ": cannot open");
    fds.push_back(fd);
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    std::vector<char> buf(kPiece);
    std::fill(buf.begin(), buf.end(), 1);  // touched: page faults are not timed
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= pieces.size() || failed) break;
      const Piece& pc = pieces[i];
      uint64_t done = 0;
      while (done < pc.length) {
        const ssize_t n = ::pread(fds[static_cast<size_t>(pc.file)], buf.data(), pc.length - done,
                                  static_cast<off_t>(pc.offset + done));
        if (n <= 0) {
          failed = true;
          break;
        }
        done += static_cast<uint64_t>(n);
      }
      bytes += done;
    }
  };
  std::vector<std::thread> th;
  for (int t = 1; t < threads; ++t) th.emplace_back(worker);
  worker();
  for (std::thread& t : th) t.join();
  for (int fd : fds) ::close(fd);
  WAN_CHECK(!failed, "read test: a read failed");
  return bytes;
}

std::vector<Piece> pieces_of(const FileSet& fs, uint64_t limit) {
  std::vector<Piece> v;
  uint64_t total = 0;
  for (size_t f = 0; f < fs.paths.size() && total < limit; ++f)
    for (uint64_t o = 0; o < fs.sizes[f] && total < limit; o += kPiece) {
      const uint64_t n = std::min(kPiece, fs.sizes[f] - o);
      v.push_back({static_cast<int>(f), o, n});
      total += n;
    }
  return v;
}

// ---- H2D ----

// cudaMemcpyAsync from cudaHostAlloc buffers (4 x 256 MB, cycled) to device buffers on one stream, timed
// with CUDA events: 16 GB in 256 MB copies, and 8 GB in the loader's chunk size.
double h2d_gbps(int device, size_t chunk, uint64_t total) {
  CUDA_CHECK(cudaSetDevice(device));
  constexpr int kBufs = 4;
  const size_t buf = std::max(chunk, size_t{256} << 20);
  void* host = nullptr;
  void* dev = nullptr;
  CUDA_CHECK(cudaHostAlloc(&host, buf * kBufs, cudaHostAllocDefault));
  std::memset(host, 1, buf * kBufs);
  const cudaError_t me = cudaMalloc(&dev, buf * kBufs);
  if (me != cudaSuccess) {
    cudaFreeHost(host);
    CUDA_CHECK(me);
  }
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  const uint64_t n = std::max<uint64_t>(1, total / chunk);
  auto copy = [&](uint64_t i) {
    const size_t slot = (i * chunk) % (buf * kBufs - chunk + 1);
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dev) + slot, static_cast<char*>(host) + slot, chunk,
                               cudaMemcpyHostToDevice, s));
  };
  for (uint64_t i = 0; i < 8; ++i) copy(i);  // warm-up
  CUDA_CHECK(cudaEventRecord(e0, s));
  for (uint64_t i = 0; i < n; ++i) copy(i);
  CUDA_CHECK(cudaEventRecord(e1, s));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(dev);
  cudaFreeHost(host);
  return static_cast<double>(n * chunk) / (ms * 1e-3) / kGB;
}

// ---- the engine's load ----

struct LoadRow {
  std::string what;
  uint64_t bytes = 0;
  double seconds = 0, alloc_seconds = 0, gbps = 0;
  double setup_seconds = 0, stream_seconds = 0;  // the loader's start to its first read; its StreamLoader run
  uint64_t chunks = 0, converted = 0;
  int fallback = 0;
  cuda::LoadOptions opt;
};

// Loads the given components of `info` to the GPU exactly as the pipeline's fast start does (one
// DeviceLoader, the text encoder as group 0, the experts as group 1, through T5EncoderGpu / DiTGpu as
// `wan generate` does) and frees them again. Bytes = streamed file bytes; seconds = the loader's wall time
// from start() to every weight on the device (its staging included: the first buffer pinned before the
// first read, the others while reading; "setup s" = start() to the first read; the weight allocations
// and the objects are timed apart).
// With `lora`, each expert's terms (lora/lora_gpu.h) are merged as its tensors arrive, as `wan generate
// --lora` does.
LoadRow time_load(const CheckpointInfo& info, const std::vector<Role>& roles, const T5Config* t5,
                  const cuda::LoadOptions& lo, const std::string& what, const std::vector<LoraSpec>& lora = {}) {
  LoadRow row;
  row.what = what;
  row.opt = lo;
  std::vector<std::unique_ptr<WeightStore>> stores;
  std::unique_ptr<cuda::T5EncoderGpu> te;
  std::unique_ptr<cuda::DiTGpu> dit;
  auto loader = std::make_unique<cuda::DeviceLoader>(lo);
  const Clock::time_point t0 = Clock::now();
  std::vector<cuda::DiTWeightSource> sources;
  for (Role r : roles) {
    stores.push_back(open_weights(info, r));
    WeightStore* ws = stores.back().get();
    if (r == Role::TextEncoder) {
      cuda::T5WeightSource src;
      src.get = [ws](const std::string& n) { return ws->get(n); };
      src.span = [ws](const std::string& n) { return ws->raw_span(n); };
      src.loader = loader.get();
      src.group = 0;
      te = std::make_unique<cuda::T5EncoderGpu>(*t5, src, lo.device);
    } else {
      cuda::DiTWeightSource src = cuda::DiTWeightSource::from([ws](const std::string& n) { return ws->get_f32(n); });
      src.span = [ws](const std::string& n) { return ws->raw_span(n); };
      src.loader = loader.get();
      src.group = 1;
      if (!lora.empty()) {
        const LoraExpert e = r == Role::DiTLow ? LoraExpert::Low : r == Role::DiTHigh ? LoraExpert::High : LoraExpert::All;
        src.merge = cuda::lora_merge_hooks(
            std::make_shared<const LoraSet>(load_lora_set(lora, e, dit_weight_table(info.dit))));
      }
      sources.push_back(std::move(src));
    }
  }
  if (!sources.empty()) {
    cuda::DiTGpu::Options opt;
    opt.device = lo.device;
    opt.defer_arena = true;  // weights only: the arena is never allocated here
    dit = std::make_unique<cuda::DiTGpu>(cuda::DiTGpu::create(info.dit, sources, cuda::DiTShape{2, 1, 16, 16}, opt));
  }
  row.alloc_seconds = seconds_since(t0);
  loader->start();
  const cuda::LoadStats st = loader->finish();
  loader.reset();
  row.bytes = st.bytes + st.fallback_bytes;
  row.seconds = st.seconds;
  row.gbps = st.gb_per_s();
  row.setup_seconds = st.setup_seconds;
  row.stream_seconds = st.stream_seconds;
  row.chunks = st.chunks;
  row.converted = st.converted_chunks;
  row.fallback = st.fallback_tensors;
  return row;
}

nlohmann::ordered_json row_json(const LoadRow& r) {
  nlohmann::ordered_json j;
  j["name"] = r.what;
  j["bytes"] = r.bytes;
  j["seconds"] = r.seconds;
  j["gb_per_s"] = r.gbps;
  j["alloc_seconds"] = r.alloc_seconds;
  j["loader_setup_seconds"] = r.setup_seconds;
  j["loader_stream_seconds"] = r.stream_seconds;
  j["chunks"] = r.chunks;
  j["converted_chunks"] = r.converted;
  j["fallback_tensors"] = r.fallback;
  j["threads"] = r.opt.threads;
  j["buffers"] = r.opt.buffers;
  j["buffer_mb"] = static_cast<double>(r.opt.buffer_bytes) / (1 << 20);
  return j;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  WAN_CHECK(n > 0, "cannot find the wan executable (/proc/self/exe)");
  buf[n] = 0;
  return buf;
}

// One child `wan generate` (--device cuda, 4 steps at shift 1 so that both experts are used and
// loaded) with --timings-json and the fast start's trace (WAN_STARTUP_TRACE).
struct FirstStep {
  nlohmann::json timings;  // the --timings-json file
  nlohmann::json trace;    // the start-up trace (pipeline/startup.h); empty object if none was written
  std::string log;         // the child's output
};

FirstStep run_first_step(const CheckpointInfo& info, int device, const std::string& size, int64_t frames) {
  char tmpl[] = "/tmp/wan-bench-load-XXXXXX";
  WAN_CHECK(::mkdtemp(tmpl) != nullptr, "cannot make a temporary folder");
  const std::string dir = tmpl, tj = dir + "/timings.json", vid = dir + "/video.y4m", log = dir + "/generate.log",
                    tr = dir + "/startup.json";
  const std::string cmd = cat("WAN_STARTUP_TRACE='", tr, "' '", self_exe(), "' generate --model '", info.root,
                              "' --device cuda:", device,
                              " --prompt 'a red fox running through fresh snow at sunrise' --size ", size, " --frames ",
                              frames, " --steps 4 --shift 1 --seed 1 --output '", vid, "' --timings-json '", tj,
                              "' > '", log, "' 2>&1");
  printf("\nfirst step: %s\n", cmd.c_str());
  fflush(stdout);
  const int rc = std::system(cmd.c_str());
  FirstStep r;
  {
    std::ifstream lf(log);
    std::stringstream ls;
    ls << lf.rdbuf();
    r.log = ls.str();
  }
  auto clean = [&] {
    for (const std::string& f : {tj, vid, log, tr}) std::remove(f.c_str());
    ::rmdir(dir.c_str());
  };
  if (rc != 0) {
    printf("%s", r.log.c_str());
    clean();
    WAN_THROW("--first-step: wan generate failed (status ", rc, ")");
  }
  try {
    std::ifstream jf(tj);
    r.timings = nlohmann::json::parse(jf);
    std::ifstream tf(tr);
    r.trace = tf.good() ? nlohmann::json::parse(tf) : nlohmann::json::object();
  } catch (const std::exception& e) {
    clean();
    WAN_THROW("--first-step: cannot read the child's timings (", e.what(), ")");
  }
  clean();
  return r;
}

// Process start -> first denoising step, milestone by milestone (process ages of the child, seconds):
// the plan's end and the first step from its timings, the rest from its start-up trace.
struct Milestone {
  const char* key;   // JSON name
  const char* what;  // printed
  double at;
};
std::vector<Milestone> critical_path(const FirstStep& f) {
  const nlohmann::json m = f.trace.value("marks", nlohmann::json::object());
  auto mark = [&](const char* k) { return m.value(k, 0.0); };
  return {
      {"libraries_loaded", "shared libraries loaded (static init)", mark("libraries_loaded")},
      {"plan_done", "plan done (CUDA context, checkpoint detected, fits)", f.timings.value("plan_done_at_s", 0.0)},
      {"fast_start_entered", "fast start entered", mark("entered")},
      {"loader_started", "objects set up, loader started", mark("loader_started")},
      {"streaming", "reads begin (first staging buffer pinned)", mark("streaming")},
      {"text_encoder_resident", "text encoder resident", mark("text_resident")},
      {"text_encoded", "prompts encoded", mark("text_encoded")},
      {"warm_up_done", "warm-up done (arena, plans, graphs)", mark("warm_up_done")},
      {"weights_resident", "all weights resident", mark("weights_resident")},
      {"fast_start_returned", "fast start returned", mark("returned")},
      {"first_step", "first denoising step", f.timings.at("timings").value("startup_to_first_step_s", 0.0)},
  };
}

nlohmann::ordered_json critical_path_json(const FirstStep& f) {
  nlohmann::ordered_json j;
  for (const Milestone& m : critical_path(f)) j[cat(m.key, "_at_s")] = m.at;
  return j;
}

void print_critical_path(const FirstStep& f, double cuda_context_s) {
  printf("  critical path (child process age, s)%s:\n", f.trace.empty() ? " (no start-up trace)" : "");
  for (const Milestone& m : critical_path(f)) {
    printf("    %-54s %7.3f\n", m.what, m.at);
    if (std::string(m.key) == "plan_done")
      printf("    %-54s %7.3f\n", "  (CUDA context creation alone, in this process)", cuda_context_s);
  }
  printf("    (loader set-up to the first read %.3f s; staging freed after the load in %.3f s)\n",
         f.trace.value("loader_setup_s", 0.0), f.trace.value("staging_free_s", 0.0));
}

// ---- the command's steps ----

// This process's first CUDA calls: the context creation's cost on this machine (what the child's plan
// overlaps with detecting the checkpoint).
struct CudaStart {
  double bench_started_at = 0, cuda_context_s = 0;
  cudaDeviceProp prop{};
};

CudaStart start_cuda(int device) {
  CudaStart c;
  c.bench_started_at = process_age_seconds();
  const Clock::time_point t_ctx = Clock::now();
  WAN_CHECK(cuda::device_count() > device && device >= 0, "wan bench --load: no CUDA device ", device);
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaFree(nullptr));
  c.cuda_context_s = seconds_since(t_ctx);
  CUDA_CHECK(cudaGetDeviceProperties(&c.prop, device));
  return c;
}

// The checkpoint's streamed components: the text encoder (if any) and the DiT expert(s).
struct Parts {
  CheckpointInfo info;
  std::vector<Role> experts;
  bool has_te = false;
  T5Config t5;
  std::vector<Role> all_roles() const {  // the text encoder first, as the fast start loads them
    std::vector<Role> roles = experts;
    if (has_te) roles.insert(roles.begin(), Role::TextEncoder);
    return roles;
  }
};

Parts open_checkpoint(const std::string& path) {
  Parts p;
  p.info = detect_checkpoint(path);
  for (Role r : {Role::DiTHigh, Role::DiTLow, Role::DiT})
    if (p.info.has(r)) p.experts.push_back(r);
  WAN_CHECK(!p.experts.empty(), path, ": no DiT expert to load");
  p.has_te = p.info.has(Role::TextEncoder);
  if (p.has_te) p.t5 = t5_config_for(p.info);
  return p;
}

// The loader's settings (its tuned defaults, then --threads, --buffers, --buffer-mb) and --read-threads.
cuda::LoadOptions loader_options(const api::Values& args, int device, int& read_threads) {
  cuda::LoadOptions lo = cuda::LoadOptions::tuned(device);
  if (args.get("threads")) {
    lo.threads = static_cast<int>(args.get_int("threads", lo.threads));
    lo.buffers = lo.threads + 4;
  }
  lo.buffers = static_cast<int>(args.get_int("buffers", lo.buffers));
  lo.buffer_bytes = static_cast<size_t>(args.get_double("buffer-mb", 8) * (1 << 20));
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  read_threads = static_cast<int>(args.get_int("read-threads", hw > 0 ? hw : 8));
  WAN_CHECK(read_threads >= 1, "--read-threads: at least 1");
  WAN_CHECK(lo.threads >= 1 && lo.buffers >= 2 && lo.buffer_bytes >= 64, "wan bench --load: bad --threads / --buffers / --buffer-mb");
  return lo;
}

// The files of the streamed tensors, each once.
FileSet streamed_files(const Parts& p) {
  FileSet files;
  std::set<std::string> seen;
  for (Role r : p.all_roles()) {
    auto st = open_weights(p.info, r);
    for (const std::string& n : st->names()) {
      const std::optional<RawSpan> sp = st->raw_span(n);
      if (sp && seen.insert(sp->path).second) {
        struct stat sb {};
        WAN_CHECK(::stat(sp->path.c_str(), &sb) == 0, sp->path, ": cannot stat");
        files.paths.push_back(sp->path);
        files.sizes.push_back(static_cast<uint64_t>(sb.st_size));
        files.total += static_cast<uint64_t>(sb.st_size);
      }
    }
  }
  return files;
}

// What the hardware does: page-cache reads (after the warming read) and pinned H2D.
struct HardwareRates {
  double warm_s = 0, read1 = 0, readn = 0, h2d = 0, h2d_chunk = 0, bound = 0;
  uint64_t b1 = 0, bn = 0;
};

HardwareRates measure_hardware(const FileSet& files, int read_threads, uint64_t read1_limit, int device,
                               const cuda::LoadOptions& lo) {
  HardwareRates h;
  // 1. Warm the page cache, then the read bandwidths.
  const std::vector<Piece> all = pieces_of(files, UINT64_MAX);
  Clock::time_point t0 = Clock::now();
  read_pieces(files, all, read_threads);
  h.warm_s = seconds_since(t0);
  printf("warm read (fills the page cache; every number below reads from it): %.2f GB in %.2f s\n",
         files.total / kGB, h.warm_s);
  const std::vector<Piece> some = pieces_of(files, read1_limit);
  t0 = Clock::now();
  h.b1 = read_pieces(files, some, 1);
  h.read1 = static_cast<double>(h.b1) / seconds_since(t0) / kGB;
  t0 = Clock::now();
  h.bn = read_pieces(files, all, read_threads);
  h.readn = static_cast<double>(h.bn) / seconds_since(t0) / kGB;
  printf("page-cache read: 1 thread %.2f GB/s (%.2f GB), %d threads %.2f GB/s (%.2f GB)\n", h.read1, h.b1 / kGB,
         read_threads, h.readn, h.bn / kGB);

  // 2. Pinned H2D.
  h.h2d = h2d_gbps(device, size_t{256} << 20, uint64_t{16} << 30);
  h.h2d_chunk = h2d_gbps(device, lo.buffer_bytes, uint64_t{8} << 30);
  h.bound = std::min(h.readn, h.h2d);
  printf("pinned H2D: %.2f GB/s (256 MB copies), %.2f GB/s (%.0f MB copies); bound min(read, H2D) = %.2f GB/s\n",
         h.h2d, h.h2d_chunk, lo.buffer_bytes / 1048576.0, h.bound);
  return h;
}

// 3. The engine's load: each component alone, then all together (the pipeline's fast start), and with
// --sweep other reader / buffer settings. Returns the rows; `combined` is the all-together one.
std::vector<LoadRow> time_loads(const Parts& p, const cuda::LoadOptions& lo, bool sweep, LoadRow& combined,
                                const std::vector<LoraSpec>& lora) {
  std::vector<LoadRow> rows;
  const T5Config* t5 = p.has_te ? &p.t5 : nullptr;
  if (p.has_te) rows.push_back(time_load(p.info, {Role::TextEncoder}, &p.t5, lo, "text encoder"));
  for (Role r : p.experts) rows.push_back(time_load(p.info, {r}, nullptr, lo, role_name(r)));
  const std::vector<Role> all_roles = p.all_roles();
  combined = time_load(p.info, all_roles, t5, lo, "all (text encoder + experts)");
  rows.push_back(combined);
  if (!lora.empty()) {  // the same loads with the LoRA merged on the way in (the header parse is timed too)
    for (Role r : p.experts) {
      const Clock::time_point t0 = Clock::now();
      LoadRow row = time_load(p.info, {r}, nullptr, lo, cat(role_name(r), " + LoRA"), lora);
      row.alloc_seconds = seconds_since(t0) - row.seconds;  // LoRA headers, allocation and hooks
      rows.push_back(row);
    }
    rows.push_back(time_load(p.info, all_roles, t5, lo, "all + LoRA", lora));
  }
  if (sweep) {
    const std::pair<int, size_t> cfgs[] = {{4, 8}, {12, 8}, {16, 8}, {8, 4}, {8, 16}, {8, 32}};
    for (const auto& [th, mb] : cfgs) {
      cuda::LoadOptions o = lo;
      o.threads = th;
      o.buffers = th + 4;
      o.buffer_bytes = mb << 20;
      rows.push_back(time_load(p.info, all_roles, t5, o, cat("all, ", th, " readers, ", mb, " MB")));
    }
  }
  return rows;
}

void print_loads(const std::vector<LoadRow>& rows, const LoadRow& combined, double bound) {
  printf("\n%-34s %8s %8s %8s %9s %8s %8s\n", "load (file -> GPU weights)", "GB", "s", "GB/s", "of bound",
         "setup s", "stream s");
  for (const LoadRow& r : rows)
    printf("%-34s %8.2f %8.3f %8.2f %9.2f %8.3f %8.3f\n", r.what.c_str(), r.bytes / kGB, r.seconds, r.gbps,
           r.gbps / bound, r.setup_seconds, r.stream_seconds);
  const double fraction = combined.gbps / bound;
  printf("load speed / min(parallel read, H2D) = %.2f / %.2f = %.3f (target >= 0.8: %s)\n", combined.gbps, bound,
         fraction, fraction >= 0.8 ? "met" : "NOT met");
}

nlohmann::ordered_json result_json(const Parts& p, const CudaStart& cs, const FileSet& files, const HardwareRates& h,
                                   int read_threads, const cuda::LoadOptions& lo, const std::vector<LoadRow>& rows,
                                   const LoadRow& combined) {
  const double fraction = combined.gbps / h.bound;
  nlohmann::ordered_json J;
  J["bench"] = "load";
  J["device"] = cs.prop.name;
  J["commit"] = bench_commit();
  J["date"] = utc_now();
  J["checkpoint"] = p.info.root;
  J["layout"] = layout_name(p.info.layout);
  J["dit_layers"] = p.info.dit.num_layers;
  J["files"] = files.paths.size();
  J["file_bytes"] = files.total;
  J["page_cache"] = "warm: every file read once with all threads before the measurements";
  J["warm_read_s"] = h.warm_s;
  J["read_1thread_gb_per_s"] = h.read1;
  J["read_1thread_bytes"] = h.b1;
  J["read_threads"] = read_threads;
  J["loader_threads"] = lo.threads;
  J["loader_buffers"] = lo.buffers;
  J["loader_buffer_mb"] = static_cast<double>(lo.buffer_bytes) / (1 << 20);
  J["read_all_threads_gb_per_s"] = h.readn;
  J["h2d_gb_per_s"] = h.h2d;
  J["h2d_chunk_gb_per_s"] = h.h2d_chunk;
  J["bound_gb_per_s"] = h.bound;
  J["cuda_context_s"] = cs.cuda_context_s;
  J["process_age_at_bench_start_s"] = cs.bench_started_at;
  nlohmann::ordered_json jr = nlohmann::ordered_json::array();
  for (const LoadRow& r : rows) jr.push_back(row_json(r));
  J["rows"] = jr;
  J["load_gb_per_s"] = combined.gbps;
  J["fraction_of_bound"] = fraction;
  J["target_fraction"] = 0.8;
  J["fraction_met"] = fraction >= 0.8;
  return J;
}

// The full-size T2V-A14B at the measured rates: 2 fp32 experts + bf16 UMT5-XXL (+ the VAE, read on the host
// meanwhile). The fixed part (process, CUDA and library start, plan) is the measured start-up minus its load.
nlohmann::ordered_json project_full_model(double load_gbps, double bound, double startup, double load_s,
                                          double text_s) {
  const DiTConfig full = dit_preset("t2v-A14B");
  const T5Config xxl = t5_preset("umt5-xxl");
  const double full_bytes = 2.0 * static_cast<double>(dit_f32_bytes(full)) + static_cast<double>(t5_f32_bytes(xxl)) / 2;
  const double full_vae = static_cast<double>(vae_f32_bytes(vae_preset("wan2.1")));
  const double rate = load_gbps * kGB;
  const double full_load = full_bytes / rate, fixed = std::max(0.0, startup - load_s);
  const double full_ideal = full_bytes / (bound * kGB);
  printf("projection, full T2V-A14B (2 x %.1f GB fp32 experts + %.1f GB bf16 text encoder; VAE %.2f GB on the "
         "host meanwhile): load %.1f s at %.2f GB/s, start -> first step about %.1f s (bound 1.3 x %.1f + text = "
         "%.1f s); needs the %.0f GB in the page cache (or a disk that reads at that speed)\n",
         dit_f32_bytes(full) / kGB, t5_f32_bytes(xxl) / 2 / kGB, full_vae / kGB, full_load, load_gbps,
         full_load + fixed, full_ideal, 1.3 * full_ideal + text_s, (full_bytes + full_vae) / kGB);
  nlohmann::ordered_json pj;
  pj["bytes"] = full_bytes;
  pj["vae_bytes"] = full_vae;
  pj["load_s"] = full_load;
  pj["startup_to_first_step_s"] = full_load + fixed;
  pj["target_s"] = 1.3 * full_ideal + text_s;
  pj["note"] = "measured rates applied to the full model; needs the files in the page cache or an equally fast disk";
  return pj;
}

// 4. Process start to the first denoising step, as a child `wan generate` (one run: the fast start the
// target is judged on): timings.startup_to_first_step_s against 1.3 x bytes / bound + the text encoding
// time, and its critical path milestone by milestone (child process ages); the CUDA context's creation
// is timed in this process as the reference for the child's plan. Then the full model's projection.
void first_step(const api::Values& args, const Parts& p, int device, double bound, double load_gbps,
                double cuda_context_s, nlohmann::ordered_json& J) {
  WAN_CHECK(p.has_te, "--first-step: the checkpoint has no text encoder");
  const std::string size = args.get_or("size", "832x480");
  const int64_t frames = args.get_int("frames", 5);
  const FirstStep fsr = run_first_step(p.info, device, size, frames);
  const nlohmann::json& g = fsr.timings;
  const nlohmann::json& t = g.at("timings");
  const double startup = t.at("startup_to_first_step_s").get<double>();
  const double text_s = t.at("text_encode_s").get<double>();
  const double load_s = t.at("load_s").get<double>();
  const uint64_t gen_bytes = g.value("load_bytes", uint64_t{0});
  const double ideal = static_cast<double>(gen_bytes) / (bound * kGB);
  const double limit = 1.3 * ideal + text_s;
  printf("%s", fsr.log.c_str());
  printf("process start -> first step %.2f s (load %.2f s, %.2f GB at %.2f GB/s; warm-up %.2f s; text %.3f s)\n",
         startup, load_s, gen_bytes / kGB, g.value("load_gb_per_s", 0.0), t.value("warm_up_s", 0.0), text_s);
  printf("  breakdown: plan done %.3f s after the process start; the load began after it and streamed after "
         "%.3f s of set-up (text encoder and DiT objects, weight allocations)\n",
         g.value("plan_done_at_s", 0.0), g.value("load_setup_s", 0.0));
  print_critical_path(fsr, cuda_context_s);
  printf("bound: bytes / min(read, H2D) = %.2f s; target 1.3 x %.2f + text %.3f = %.2f s: %s (%.2f x bytes/bound)\n",
         ideal, ideal, text_s, limit, startup <= limit ? "met" : "NOT met", ideal > 0 ? (startup - text_s) / ideal : 0);
  nlohmann::ordered_json pj = project_full_model(load_gbps, bound, startup, load_s, text_s);
  nlohmann::ordered_json fj;
  fj["size"] = size;
  fj["frames"] = frames;
  fj["startup_to_first_step_s"] = startup;
  fj["load_s"] = load_s;
  fj["load_bytes"] = gen_bytes;
  fj["load_gb_per_s"] = g.value("load_gb_per_s", 0.0);
  fj["warm_up_s"] = t.value("warm_up_s", 0.0);
  fj["plan_done_at_s"] = g.value("plan_done_at_s", 0.0);
  fj["load_setup_s"] = g.value("load_setup_s", 0.0);
  fj["text_encode_s"] = text_s;
  fj["bytes_over_bound_s"] = ideal;
  fj["target_s"] = limit;
  fj["met"] = startup <= limit;
  fj["critical_path"] = critical_path_json(fsr);
  fj["generate_timings"] = g.at("timings");
  fj["startup_trace"] = fsr.trace;
  J["first_step"] = fj;
  J["projection_full_t2v_a14b"] = pj;
}

#endif  // WAN_HAVE_CUDA

}  // namespace

api::Option lora_option() {
  api::Option l = api::option("lora", api::Kind::String, "PATH[:SCALE]", "",
                         "also time the experts' loads with this LoRA merged as they stream (repeatable)");
  l.repeatable = true;
  return l;
}

const api::CommandSpec& bench_load_spec() {
  static const api::CommandSpec s = [] {
    using api::Kind;
    using api::Option;
    api::CommandSpec c;
    c.name = "bench-load";
    c.summary = "checkpoint load to the GPU vs page-cache read and H2D (= bench --load)";
    c.usage = {"bench --load PATH [options]", "bench-load PATH [options]"};
    c.about =
        "Measures checkpoint loading on the GPU against the hardware: page-cache read bandwidth (1 thread, all "
        "threads), pinned host-to-device bandwidth, and the engine's file -> GPU weights speed per component "
        "and all together (the text encoder and the DiT experts), as a fraction of min(parallel read, H2D). "
        "The files are read once first to warm the page cache.";
    Option threads = bench_int_option("threads", "its tuned count, hardware threads - 4 in [2, 8]", 1, 1024,
                                      "loader reader threads");
    Option read_threads =
        bench_int_option("read-threads", "all hardware threads", 1, 4096, "threads of the parallel read test");
    c.options = {
        api::option("load", Kind::Path, "PATH", "", "the checkpoint (or give PATH alone)"),
        threads,
        read_threads,
        bench_int_option("buffers", "threads + 4", 2, 1024, "loader staging buffers", "K"),
        api::option("buffer-mb", Kind::Float, "M", "8", "loader staging buffer size in MB"),
        api::option("sweep", Kind::Flag, "", "", "also time the combined load with other reader / buffer settings"),
        api::option("read1-gb", Kind::Float, "G", "8", "bytes for the 1-thread read test"),
        lora_option(),
        api::option("first-step", Kind::Flag, "", "",
                    "also run `wan generate` as a child: process start to the first step and its critical path"),
        api::option("size", Kind::Size, "", "832x480", "its video size"),
        bench_int_option("frames", "5", 1, 1e6, "its frames"),
        bench_device_option(),
        bench_json_option(),
    };
    c.max_positional = 1;
    c.positional_name = "PATH";
    return c;
  }();
  return s;
}

int cmd_bench_load(int argc, char** argv) {
  // `wan bench --load PATH ...` arrives here with argv[0] = "bench"; `--load` may also be given as the
  // positional PATH of `wan bench-load`.
  const api::Values args = api::parse_argv(bench_load_spec(), argc, argv);
  if (api::print_help_if_asked(args, bench_load_spec())) return 0;
  const LoadSettings s = parse_settings(args);
#ifndef WAN_HAVE_CUDA
  (void)s;
  WAN_THROW("wan bench --load: this build of wan has no CUDA support (configure with a CUDA toolkit)");
#else
  const CudaStart cs = start_cuda(s.device);
  const Parts p = open_checkpoint(s.path);
  int read_threads = 0;
  const cuda::LoadOptions lo = loader_options(args, s.device, read_threads);
  const FileSet files = streamed_files(p);
  printf("checkpoint %s (%s): %zu files, %.2f GB (text encoder + %zu expert(s))\n", p.info.root.c_str(),
         layout_name(p.info.layout), files.paths.size(), files.total / kGB, p.experts.size());
  printf("device %s; loader: %d readers, %d x %.0f MB staging; CUDA context created in %.3f s (process age at "
         "the bench's start %.3f s)\n",
         cs.prop.name, lo.threads, lo.buffers, lo.buffer_bytes / 1048576.0, cs.cuda_context_s, cs.bench_started_at);

  const uint64_t read1_limit = static_cast<uint64_t>(args.get_double("read1-gb", 8) * kGB);
  const HardwareRates h = measure_hardware(files, read_threads, read1_limit, s.device, lo);
  LoadRow combined;
  std::vector<LoraSpec> lora;
  for (const std::string& l : args.all("lora")) lora.push_back(parse_lora_arg(l, LoraExpert::All, "lora"));
  const std::vector<LoadRow> rows = time_loads(p, lo, args.flag("sweep"), combined, lora);
  print_loads(rows, combined, h.bound);
  nlohmann::ordered_json J = result_json(p, cs, files, h, read_threads, lo, rows, combined);
  if (args.flag("first-step")) first_step(args, p, s.device, h.bound, combined.gbps, cs.cuda_context_s, J);
  if (!s.json_path.empty()) write_json_file(s.json_path, J);
  return 0;
#endif
}

}  // namespace wan::cli
