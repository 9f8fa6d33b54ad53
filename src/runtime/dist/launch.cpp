// Rank launching, NCCL bootstrap and cooperative failure (see launch.h).
//
// Threads of one launch in one process: one worker per local rank (runs fn), the caller of launch()
// as supervisor (hang watchdog, NCCL async-error polling, stopping communicators after a failure),
// the control channel's I/O thread (multi-process), and a reaper started by the first
// failure (exits the process if ranks do not return within the grace period).
// Locking: LaunchState::mu guards the failure, the in-process barrier and the communicator list; it is
// never held while calling into the control channel or NCCL abort/revoke.
#include "runtime/dist/launch.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <thread>

#include "core/log.h"
#include "runtime/dist/bootstrap.h"
#include "runtime/dist/rendezvous.h"

#ifdef WAN_HAVE_NCCL
#include "kernels/check.h"
#endif

namespace wan::dist {
namespace {

using Clock = std::chrono::steady_clock;
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

constexpr int kDefaultPort = 29517;
constexpr double kDefaultTimeout = 600, kDefaultGrace = 20, kDefaultPeerTimeout = 30;

const char* getenv_nonempty(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v && *v ? v : nullptr;
}

long long parse_int(const char* name, const char* v) {
  WAN_CHECK(*v == '-' || (*v >= '0' && *v <= '9'), name, "='", v, "' is not an integer");
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  WAN_CHECK(end != v && *end == '\0' && errno == 0, name, "='", v, "' is not an integer");
  return x;
}

double env_seconds(const char* name, double def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  WAN_CHECK(end != v && *end == '\0' && std::isfinite(x) && x > 0, name, "='", v,
            "' is not a positive number of seconds");
  return x;
}

#ifdef WAN_HAVE_NCCL
// ncclCommRevoke (NCCL >= 2.28), looked up at run time: the library found at run time may be older
// than the header this was built with.
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
RevokeFn nccl_revoke() {
  static const RevokeFn fn = [] {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess || v < 22800) return RevokeFn(nullptr);
    return reinterpret_cast<RevokeFn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
  }();
  return fn;
}
#endif

struct Settings {
  double timeout_s = kDefaultTimeout;      // rendezvous limit and hang watchdog
  double grace_s = kDefaultGrace;          // after a failure, how long ranks get to return
  double peer_timeout_s = kDefaultPeerTimeout;
  bool revoke = true;                      // ncclCommRevoke (else ncclCommAbort) on failure
  BootstrapKind bootstrap = BootstrapKind::Auto;  // WAN_BOOTSTRAP
};

Settings settings_from_env(const LaunchOptions& opt) {
  Settings s;
  WAN_CHECK(opt.timeout_s >= 0 && std::isfinite(opt.timeout_s), "launch timeout must be >= 0 s");
  s.timeout_s = opt.timeout_s > 0 ? opt.timeout_s : env_seconds("WAN_DIST_TIMEOUT", kDefaultTimeout);
  s.grace_s = env_seconds("WAN_DIST_ABORT_GRACE", kDefaultGrace);
  s.peer_timeout_s = env_seconds("WAN_DIST_PEER_TIMEOUT", kDefaultPeerTimeout);
  s.bootstrap = parse_bootstrap([](const char* n) { return std::getenv(n); }, mpi_built());
  const char* m = std::getenv("WAN_DIST_ABORT_MODE");
  if (m && *m) {
    WAN_CHECK(!std::strcmp(m, "revoke") || !std::strcmp(m, "abort"), "WAN_DIST_ABORT_MODE='", m,
              "': expected revoke or abort");
    s.revoke = !std::strcmp(m, "revoke");
  }
#ifdef WAN_HAVE_NCCL
  if (!nccl_revoke()) s.revoke = false;
#endif
  return s;
}

std::string with_rank(int rank, const std::string& msg) { return cat("rank ", rank, ": ", msg); }

}  // namespace

namespace detail {

enum Phase : int { kRunning = 0, kWaiting = 1, kDone = 2 };

struct Slot {
  std::atomic<int64_t> progress_ns{0};
  std::atomic<int> phase{kRunning};
};

#ifdef WAN_HAVE_NCCL
struct CommEntry {
  ncclComm_t comm = nullptr;
  int slot = 0;
  bool stopping = false;  // the supervisor is revoking/aborting it now
  bool stopped = false;   // revoked (still to be freed) or aborted (freed: freed == true)
  bool freed = false;
};
#endif

struct LaunchState {
  Settings s;
  int nslots = 1;
  bool nccl = false;
  std::unique_ptr<Slot[]> slots;
  std::vector<RankContext>* ctxs = nullptr;

  std::atomic<bool> aborted{false};
  std::atomic<bool> all_done{false};
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Failure> failure;  // the first failure seen here (provisional on ranks > 0)
  bool final_verdict = false;      // failure is the launch's verdict (in-process: always)
  int finished = 0;                // worker threads that have ended
  int barrier_count = 0;
  uint64_t barrier_gen = 0;
  std::unique_ptr<ControlChannel> channel;
#ifdef WAN_HAVE_NCCL
  std::vector<CommEntry> comms;
#endif

  Failure current() {
    std::lock_guard<std::mutex> lk(mu);
    return failure ? *failure : Failure{"launch aborted", ErrorKind::Internal};
  }
  [[noreturn]] void throw_failure() {
    const Failure f = current();
    throw Error(f.message, f.kind);
  }
  // The reaper: started by the first failure, joined by launch(). If the ranks have not all returned
  // grace_s after the failure, it prints the failure and ends the process.
  std::thread reaper;
  void start_reaper();

  // A local failure. The first one aborts the launch; across processes it goes to rank 0.
  void fail(Failure f) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!failure) {
        failure = f;
        final_verdict = !channel;
        first = true;
        aborted = true;
      }
    }
    if (!first) return;
    cv.notify_all();
    LOG_DEBUG("dist: failure: ", f.message);
    start_reaper();
    if (channel) channel->report_failure(f);
  }
  // The verdict from the control channel: it replaces any local failure.
  void on_verdict(const Failure& f) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      first = !failure;
      failure = f;
      final_verdict = true;
      aborted = true;
    }
    cv.notify_all();
    if (first) start_reaper();
  }

  void stamp(int slot) { slots[slot].progress_ns.store(now_ns(), std::memory_order_relaxed); }

  void barrier(int slot, bool final) {
    if (aborted.load()) throw_failure();
    bool ok = true;
    if (channel) {
      slots[slot].phase = kWaiting;
      ok = channel->barrier(final);
      if (!ok)
        if (auto v = channel->verdict()) {
          slots[slot].phase = kRunning;
          throw Error(v->message, v->kind);
        }
    } else if (nslots > 1) {
      std::unique_lock<std::mutex> lk(mu);
      slots[slot].phase = kWaiting;
      const uint64_t gen = barrier_gen;
      if (++barrier_count == nslots) {
        barrier_count = 0;
        ++barrier_gen;
        for (int i = 0; i < nslots; ++i)
          if (slots[i].phase == kWaiting) slots[i].phase = kRunning;
        cv.notify_all();
      } else {
        cv.wait(lk, [&] { return barrier_gen != gen || aborted.load(); });
      }
      ok = barrier_gen != gen;
    }
    slots[slot].phase = kRunning;
    stamp(slot);
    if (!ok || aborted.load()) throw_failure();
  }
};

void LaunchState::start_reaper() {
  std::lock_guard<std::mutex> lk(mu);
  if (reaper.joinable()) return;
  reaper = std::thread([this] {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(s.grace_s));
    {
      std::unique_lock<std::mutex> lk(mu);
      if (cv.wait_until(lk, deadline, [&] { return all_done.load(); })) return;
    }
    const Failure f = current();
    LOG_DEBUG("dist: ranks did not return within ", s.grace_s, " s of the failure; exiting");
    std::fprintf(stderr, "error: %s\n", f.message.c_str());
    std::fflush(stderr);
    std::_Exit(f.kind == ErrorKind::BadInput ? 2 : 1);
  });
}

}  // namespace detail

using detail::LaunchState;

// ---------------------------------------------------------------------------------------------------
// Options and environment

LaunchOptions parse_launch_options(const std::string& gpus, const std::string& devices) {
  WAN_CHECK(gpus.empty() || devices.empty(), "--gpus and --devices cannot be given together");
  LaunchOptions o;
  if (!gpus.empty()) {
    const long long n = parse_int("--gpus", gpus.c_str());
    WAN_CHECK(n >= 1 && n <= 1024, "--gpus ", n, ": expected 1..1024");
    for (int i = 0; i < n; ++i) o.devices.push_back(i);
  } else if (!devices.empty()) {
    std::set<int> seen;
    size_t p = 0;
    while (p <= devices.size()) {
      const size_t q = std::min(devices.find(',', p), devices.size());
      const std::string item = devices.substr(p, q - p);
      WAN_CHECK(!item.empty(), "--devices '", devices, "': empty entry (expected e.g. 0,1,2)");
      const long long d = parse_int("--devices entry", item.c_str());
      WAN_CHECK(d >= 0 && d < 1024, "--devices: device ", d, " is out of range");
      WAN_CHECK(seen.insert(static_cast<int>(d)).second, "--devices: device ", d, " is listed twice");
      o.devices.push_back(static_cast<int>(d));
      p = q + 1;
    }
  }
  return o;
}

std::optional<LauncherEnv> parse_launcher_env(const EnvLookup& env) {
  struct Source {
    const char* name;
    const char* rank;
    std::vector<const char*> size;
    std::vector<const char*> local;
  };
  const Source sources[] = {
      {"WAN", "WAN_RANK", {"WAN_WORLD_SIZE"}, {"WAN_LOCAL_RANK"}},
      {"OMPI", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"}, {"OMPI_COMM_WORLD_LOCAL_RANK"}},
      {"PMI", "PMI_RANK", {"PMI_SIZE"}, {"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}},
      {"SLURM", "SLURM_PROCID", {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, {"SLURM_LOCALID"}},
  };
  for (const Source& src : sources) {
    const char* rank_v = getenv_nonempty(env, src.rank);
    const char* size_v = nullptr;
    const char* size_name = src.size[0];
    for (const char* n : src.size)
      if ((size_v = getenv_nonempty(env, n))) {
        size_name = n;
        break;
      }
    if (!rank_v && !size_v) continue;
    // srun sets SLURM_PROCID in every step; without a task count it says nothing about a world.
    if (!std::strcmp(src.name, "SLURM") && !size_v) continue;
    WAN_CHECK(rank_v, size_name, " is set but ", src.rank, " is not");
    WAN_CHECK(size_v, src.rank, " is set but ", src.size[0], " is not");
    LauncherEnv e;
    e.source = src.name;
    const long long world = parse_int(size_name, size_v), rank = parse_int(src.rank, rank_v);
    WAN_CHECK(world >= 1 && world <= 65536, size_name, "=", world, ": expected 1..65536");
    WAN_CHECK(rank >= 0 && rank < world, src.rank, "=", rank, " is outside 0..", world - 1, " (", size_name, "=",
              world, ")");
    e.world = static_cast<int>(world);
    e.rank = static_cast<int>(rank);
    const char* local_name = nullptr;
    const char* local_v = getenv_nonempty(env, "WAN_LOCAL_RANK");
    if (local_v) local_name = "WAN_LOCAL_RANK";
    for (size_t i = 0; !local_v && i < src.local.size(); ++i)
      if ((local_v = getenv_nonempty(env, src.local[i]))) local_name = src.local[i];
    if (local_v) {
      const long long l = parse_int(local_name, local_v);
      WAN_CHECK(l >= 0 && l < world, local_name, "=", l, " is outside 0..", world - 1);
      e.local_rank = static_cast<int>(l);
    } else {
      WAN_CHECK(world == 1, "the ", src.name, " launcher environment gives no local rank (set WAN_LOCAL_RANK)");
    }
    // Rank 0's address: given, or loopback when the launcher says all ranks share this node.
    const char* addr = getenv_nonempty(env, "WAN_MASTER_ADDR");
    if (!addr) addr = getenv_nonempty(env, "MASTER_ADDR");
    if (addr) {
      e.master_addr = addr;
    } else {
      const char* local_size = nullptr;
      if (e.source == "OMPI") local_size = getenv_nonempty(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
      if (e.source == "PMI") local_size = getenv_nonempty(env, "MPI_LOCALNRANKS");
      if (e.source == "WAN") local_size = getenv_nonempty(env, "WAN_LOCAL_WORLD_SIZE");
      bool one_node = local_size && std::strtoll(local_size, nullptr, 10) == world;
      if (e.source == "SLURM") {
        const char* nodes = getenv_nonempty(env, "SLURM_STEP_NUM_NODES");
        if (!nodes) nodes = getenv_nonempty(env, "SLURM_NNODES");
        one_node = nodes && !std::strcmp(nodes, "1");
      }
      if (one_node || world == 1) e.master_addr = "127.0.0.1";
    }
    const char* port_name = "WAN_MASTER_PORT";
    const char* port = getenv_nonempty(env, port_name);
    if (!port && (port = getenv_nonempty(env, "MASTER_PORT"))) port_name = "MASTER_PORT";
    if (port) {
      char* end = nullptr;
      const long p = std::strtol(port, &end, 10);
      WAN_CHECK(*port >= '0' && *port <= '9' && *end == '\0' && p >= 1 && p <= 65535, port_name, "='", port,
                "' is not a TCP port (1..65535)");
      e.master_port = static_cast<int>(p);
    } else {
      e.master_port = kDefaultPort;
    }
    if (const char* j = getenv_nonempty(env, "WAN_JOB_ID")) {
      e.job = j;
    } else if (e.source == "OMPI") {
      if (const char* jid = getenv_nonempty(env, "OMPI_MCA_ess_base_jobid")) e.job = jid;
    } else if (e.source == "SLURM") {
      const char* jid = getenv_nonempty(env, "SLURM_JOB_ID");
      const char* sid = getenv_nonempty(env, "SLURM_STEP_ID");
      if (jid) e.job = cat(jid, ".", sid ? sid : "");
    }
    return e;
  }
  return std::nullopt;
}

bool launcher_environment() {
  return parse_launcher_env([](const char* n) { return std::getenv(n); }).has_value();
}

// ---------------------------------------------------------------------------------------------------
// RankContext

void RankContext::check_abort() const {
  if (!state_) return;
  if (state_->aborted.load(std::memory_order_acquire)) state_->throw_failure();
  state_->stamp(slot_);
}
bool RankContext::aborted() const { return state_ && state_->aborted.load(std::memory_order_acquire); }
void RankContext::barrier() const {
  if (state_) state_->barrier(slot_, false);
}

#ifdef WAN_HAVE_NCCL
void RankContext::register_comm(ncclComm_t c) const {
  WAN_ASSERT(state_ && c);
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    detail::CommEntry e;
    e.comm = c;
    e.slot = slot_;
    state_->comms.push_back(e);
  }
  state_->cv.notify_all();  // the supervisor stops it at once if the launch has already failed
}
void RankContext::unregister_comm(ncclComm_t c) const {
  WAN_ASSERT(state_ && c);
  std::unique_lock<std::mutex> lk(state_->mu);
  state_->cv.wait(lk, [&] {
    for (const auto& e : state_->comms)
      if (e.comm == c && e.stopping) return false;
    return true;
  });
  auto& v = state_->comms;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it->comm != c) continue;
    const bool freed = it->freed;
    v.erase(it);
    if (freed) {  // aborted (and freed) by the watchdog: the caller must not touch it again
      lk.unlock();
      state_->throw_failure();
    }
    return;
  }
}
void RankContext::sync(cudaStream_t s) const {
  const cudaError_t e = cudaStreamSynchronize(s);
  check_abort();
  CUDA_CHECK(e);
}
void RankContext::check_nccl(ncclResult_t r, const char* what) const {
  if (r == ncclSuccess || r == ncclInProgress) return;
  check_abort();
  throw Error(cat("NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ") in ", what),
              ErrorKind::Internal);
}
#endif

// ---------------------------------------------------------------------------------------------------
// Test hook

void maybe_fail(const RankContext& ctx, const char* tag) {
  const char* r = std::getenv("WAN_DIST_FAIL_RANK");
  if (!r || !*r) return;
  if (parse_int("WAN_DIST_FAIL_RANK", r) != ctx.rank) return;
  const char* at = std::getenv("WAN_DIST_FAIL_AT");
  if (at && *at && std::strcmp(at, tag) != 0) return;
  if ((!at || !*at) && !std::strcmp(tag, "bootstrap")) return;  // named only: tcp peers would wait out the timeout
  const char* m = std::getenv("WAN_DIST_FAIL_MODE");
  const std::string mode = m && *m ? m : "throw";
  LOG_WARN("dist: rank ", ctx.rank, ": forced failure (", mode, ") at '", tag, "'");
  if (mode == "throw")
    throw Error(cat("forced failure at '", tag, "' (WAN_DIST_FAIL_RANK=", ctx.rank, ")"), ErrorKind::Internal);
  if (mode == "exit") {
    std::fflush(stderr);
    std::_Exit(3);
  }
  if (mode == "hang") {  // no progress marks: the hang watchdog (or a failure elsewhere) ends it
    WAN_CHECK(ctx.state_, "WAN_DIST_FAIL_MODE=hang outside launch()");
    while (!ctx.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ctx.check_abort();
    return;
  }
  if (mode == "oom") {
#ifdef WAN_HAVE_NCCL
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size_t(1) << 50);  // 1 PiB: a real out-of-memory error
    if (e == cudaSuccess) cudaFree(p);
    cudaGetLastError();
    if (e != cudaSuccess)
      throw Error(cat("forced failure at '", tag, "': cudaMalloc of 1 PiB: ", cudaGetErrorString(e), " (CUDA error ",
                      static_cast<int>(e), ")"),
                  ErrorKind::Internal);
#endif
    throw std::bad_alloc();
  }
  WAN_THROW("WAN_DIST_FAIL_MODE='", mode, "': expected throw, exit, hang or oom");
}

// ---------------------------------------------------------------------------------------------------
// launch

namespace {

#ifdef WAN_HAVE_NCCL
// Stops every communicator not yet stopped (revoke, or abort = free). Runs on the supervisor.
void stop_comms(LaunchState& st) {
  std::vector<ncclComm_t> todo;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    for (auto& e : st.comms)
      if (!e.stopping && !e.stopped) {
        e.stopping = true;
        todo.push_back(e.comm);
      }
  }
  if (todo.empty()) return;
  std::vector<bool> freed(todo.size(), false);
  for (size_t i = 0; i < todo.size(); ++i) {
    ncclResult_t r = ncclInvalidUsage;
    if (st.s.revoke) r = nccl_revoke()(todo[i], 0);  // 0: NCCL_REVOKE_DEFAULT
    if (r != ncclSuccess && r != ncclInProgress) {
      if (st.s.revoke) LOG_WARN("dist: ncclCommRevoke failed (", ncclGetErrorString(r), "); aborting instead");
      ncclCommAbort(todo[i]);
      freed[i] = true;
    }
  }
  {
    std::lock_guard<std::mutex> lk(st.mu);
    for (auto& e : st.comms)
      for (size_t i = 0; i < todo.size(); ++i)
        if (e.comm == todo[i] && e.stopping) {
          e.stopping = false;
          e.stopped = true;
          e.freed = freed[i];
        }
  }
  st.cv.notify_all();
  LOG_DEBUG("dist: stopped ", todo.size(), " NCCL communicator(s)");
}

// Fails the owner of any communicator with an asynchronous NCCL error.
void poll_async_errors(LaunchState& st) {
  std::optional<Failure> f;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    for (auto& e : st.comms) {
      if (e.stopping || e.stopped) continue;
      ncclResult_t a = ncclSuccess;
      if (ncclCommGetAsyncError(e.comm, &a) != ncclSuccess) continue;
      if (a == ncclSuccess || a == ncclInProgress) continue;
      const char* last = ncclGetLastError(e.comm);
      f = Failure{with_rank((*st.ctxs)[e.slot].rank, cat("NCCL asynchronous error: ", ncclGetErrorString(a),
                                                         last && *last ? cat(" (", last, ")") : std::string())),
                  ErrorKind::Internal};
      break;
    }
  }
  if (f) st.fail(*f);
}

// A worker's communicators after fn: destroyed on success, aborted after a failure. After a failure
// nothing is freed until every communicator of the launch in this process is stopped: a kernel of one
// rank may still be reading another rank's buffers (in-process peers share them over NVLink).
void release_comms(LaunchState& st, int slot, bool ok) {
  std::vector<detail::CommEntry> mine;
  {
    std::unique_lock<std::mutex> lk(st.mu);
    st.cv.wait(lk, [&] {
      for (const auto& e : st.comms)
        if ((e.slot == slot && e.stopping) || (!ok && !e.stopped)) return false;
      return true;
    });
    for (auto it = st.comms.begin(); it != st.comms.end();) {
      if (it->slot == slot) {
        mine.push_back(*it);
        it = st.comms.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto it = mine.rbegin(); it != mine.rend(); ++it) {  // registered ones first, world last
    if (it->freed) continue;
    const ncclResult_t r = ok && !it->stopped ? ncclCommDestroy(it->comm) : ncclCommAbort(it->comm);
    if (r != ncclSuccess) LOG_WARN("dist: freeing an NCCL communicator: ", ncclGetErrorString(r));
  }
}
#endif

struct Plan {
  bool multi = false;
  int world = 1;
  std::vector<RankContext> ranks;  // this process's ranks
  std::optional<LauncherEnv> env;
};

// need_addr: the tcp bootstrap needs rank 0's address from the environment (the mpi one sends it).
Plan plan_launch(const LaunchOptions& opt, const std::optional<LauncherEnv>& env, bool need_addr) {
  Plan p;
  p.env = env;
  int ndev = -1;
#ifdef WAN_HAVE_NCCL
  if (opt.nccl) {
    ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
      cudaGetLastError();
      ndev = 0;
    }
    WAN_CHECK(ndev > 0, "multi-GPU launch: no CUDA device is visible");
  }
#else
  WAN_CHECK(!opt.nccl, "this build has no NCCL: multi-GPU runs need a build with CUDA and NCCL");
#endif
  auto check_dev = [&](int d, const char* what) {
    WAN_CHECK(ndev < 0 || (d >= 0 && d < ndev), what, ": device ", d, " does not exist (", ndev,
              " visible GPU", ndev == 1 ? "" : "s", ")");
  };
  if (p.env) {
    p.multi = true;
    p.world = p.env->world;
    RankContext c;
    c.rank = p.env->rank;
    c.world = p.env->world;
    c.local_rank = p.env->local_rank;
    c.in_process = false;
    if (!opt.devices.empty()) {
      WAN_CHECK(c.local_rank < static_cast<int>(opt.devices.size()), "local rank ", c.local_rank,
                " has no device in --devices/--gpus (", opt.devices.size(), " given)");
      c.device = opt.devices[c.local_rank];
    } else {
      c.device = ndev == 1 ? 0 : c.local_rank;
    }
    check_dev(c.device, cat("rank ", c.rank, " (local rank ", c.local_rank, ")").c_str());
    WAN_CHECK(p.world == 1 || !need_addr || !p.env->master_addr.empty(), "multi-process launch (", p.env->source,
              ", world size ", p.world, ") needs rank 0's address: set WAN_MASTER_ADDR (and WAN_MASTER_PORT, default ",
              kDefaultPort, ")");
    p.ranks.push_back(c);
  } else {
    const std::vector<int> devs = opt.devices.empty() ? std::vector<int>{0} : opt.devices;
    std::set<int> seen;
    for (int d : devs) {
      check_dev(d, "--devices/--gpus");
      WAN_CHECK(seen.insert(d).second, "--devices: device ", d, " is listed twice");
    }
    p.world = static_cast<int>(devs.size());
    for (int i = 0; i < p.world; ++i) {
      RankContext c;
      c.rank = c.local_rank = i;
      c.world = p.world;
      c.device = devs[i];
      c.in_process = true;
      p.ranks.push_back(c);
    }
  }
  return p;
}

void run_rank(LaunchState& st, RankContext& ctx, const std::function<void(RankContext&)>& fn,
              const std::vector<uint8_t>& unique_id) {
  [[maybe_unused]] bool ok = false;
  try {
    ctx.check_abort();
#ifdef WAN_HAVE_NCCL
    if (st.nccl) CUDA_CHECK(cudaSetDevice(ctx.device));
#endif
    maybe_fail(ctx, "init");
    // Every rank is alive and on its device before any enters NCCL's (blocking) init, so a rank that
    // fails before it cannot leave the others waiting inside it.
    st.barrier(ctx.slot_, false);
#ifdef WAN_HAVE_NCCL
    if (st.nccl) {
      ncclUniqueId id;
      WAN_ASSERT(unique_id.size() == sizeof id.internal, "NCCL unique id of ", unique_id.size(), " bytes");
      std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 1;
      ncclComm_t comm = nullptr;
      NCCL_CHECK(ncclCommInitRankConfig(&comm, ctx.world, id, ctx.rank, &cfg));
      ctx.comm = comm;
      ctx.register_comm(comm);
      ctx.check_abort();
    }
#endif
    maybe_fail(ctx, "start");
    fn(ctx);
    ctx.check_abort();
    st.barrier(ctx.slot_, true);
    ok = true;
  } catch (const Error& e) {
    st.fail({with_rank(ctx.rank, e.what()), e.kind()});
  } catch (const std::bad_alloc&) {
    st.fail({with_rank(ctx.rank, "out of host memory"), ErrorKind::Internal});
  } catch (const std::exception& e) {
    st.fail({with_rank(ctx.rank, cat("internal: ", e.what())), ErrorKind::Internal});
  } catch (...) {
    st.fail({with_rank(ctx.rank, "internal: unknown exception"), ErrorKind::Internal});
  }
  st.slots[ctx.slot_].phase = detail::kDone;
#ifdef WAN_HAVE_NCCL
  if (st.nccl) {
    release_comms(st, ctx.slot_, ok);
    ctx.comm = nullptr;
  }
#endif
  {
    std::lock_guard<std::mutex> lk(st.mu);
    ++st.finished;
  }
  st.cv.notify_all();
}

}  // namespace

void launch(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn) {
  WAN_ASSERT(fn, "launch without a function");
  const Settings settings = settings_from_env(opt);
  const EnvLookup getenv_fn = [](const char* n) { return std::getenv(n); };
  std::optional<LauncherEnv> env = parse_launcher_env(getenv_fn);
  const BootstrapKind boot = env && env->world > 1 ? choose_bootstrap(settings.bootstrap, getenv_fn, mpi_built())
                                                   : BootstrapKind::Tcp;
  const bool use_mpi = boot == BootstrapKind::Mpi;
  bool one_node = false;  // mpi: every rank shares this node
#ifdef WAN_HAVE_MPI
  if (use_mpi) {
    mpi::set_finalize_at_exit(false);  // until this launch ends well
    const mpi::World mw = mpi::init();
    WAN_CHECK(mw.world == env->world && mw.rank == env->rank, "MPI bootstrap: MPI gives rank ", mw.rank, " of ",
              mw.world, " but the ", env->source, " launcher environment says rank ", env->rank, " of ", env->world,
              " (is this the launcher's MPI? start with its mpirun or srun --mpi=pmix, or set WAN_BOOTSTRAP=tcp)");
    if (!getenv_nonempty(getenv_fn, "WAN_LOCAL_RANK")) env->local_rank = mw.local_rank;
    one_node = mw.local_size == mw.world;
  }
#endif

  // Under the mpi bootstrap a failure of this rank from here to the exchange is not thrown at once: the
  // exchange hands it to every rank (bootstrap.h). Elsewhere it is thrown (tcp: the other ranks end at
  // the rendezvous timeout, naming this rank).
  Plan plan;
  auto st = std::make_unique<LaunchState>();
  std::vector<uint8_t> unique_id;  // the NCCL unique id: made in-process or on rank 0, sent to the others
  BootstrapInfo root_info;         // mpi: what rank 0 sends
  std::unique_ptr<TcpListener> listener;
  std::optional<Failure> early;
  try {
    plan = plan_launch(opt, env, /*need_addr=*/!use_mpi);
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off (issue 5), unless set explicitly
    st->s = settings;
    st->nccl = opt.nccl;
    st->nslots = static_cast<int>(plan.ranks.size());
    st->slots.reset(new detail::Slot[st->nslots]);
    st->ctxs = &plan.ranks;
    for (int i = 0; i < st->nslots; ++i) {
      plan.ranks[i].state_ = st.get();
      plan.ranks[i].slot_ = i;
      plan.ranks[i].bootstrap = !plan.multi ? "in-process" : plan.world == 1 ? "none" : bootstrap_name(boot);
    }
    if (plan.multi && plan.world > 1) maybe_fail(plan.ranks[0], "bootstrap");
#ifdef WAN_HAVE_NCCL
    if (opt.nccl && (!plan.multi || plan.ranks[0].rank == 0)) {
      ncclUniqueId id;
      NCCL_CHECK(ncclGetUniqueId(&id));
      unique_id.assign(id.internal, id.internal + sizeof id.internal);
    }
#endif
    if (use_mpi && plan.ranks[0].rank == 0) {
      // An explicit WAN_MASTER_PORT/ADDR is honoured; else an ephemeral port and rank 0's addresses.
      const bool port_given =
          getenv_nonempty(getenv_fn, "WAN_MASTER_PORT") || getenv_nonempty(getenv_fn, "MASTER_PORT");
      listener = std::make_unique<TcpListener>(port_given ? env->master_port : 0);
      const char* addr = getenv_nonempty(getenv_fn, "WAN_MASTER_ADDR");
      if (!addr) addr = getenv_nonempty(getenv_fn, "MASTER_ADDR");
      root_info.addr = addr ? addr : control_addresses(one_node);
      root_info.port = listener->port();
      root_info.blob = unique_id;
      std::random_device rd;
      root_info.job = cat("mpi-", std::hex, rd(), rd());
    }
  } catch (const Error& e) {
    if (!use_mpi) throw;
    early = Failure{with_rank(env->rank, e.what()), e.kind()};
  } catch (const std::bad_alloc&) {
    if (!use_mpi) throw;
    early = Failure{with_rank(env->rank, "out of host memory"), ErrorKind::Internal};
  }

  if (plan.multi || early) {  // early: a failed plan, still a multi-process launch
    if (!early) {
      const RankContext& c = plan.ranks[0];
      LOG_INFO("dist: rank ", c.rank, " of ", c.world, " (", plan.env->source, ", ", c.bootstrap,
               " bootstrap), local rank ", c.local_rank, ", device ", c.device);
    }
    if (env->world > 1) {
      RendezvousConfig rc;
      rc.addr = env->master_addr;
      rc.port = env->master_port;
      rc.rank = env->rank;
      rc.world = env->world;
      rc.job = env->job;
      rc.timeout_s = settings.timeout_s;
      rc.heartbeat_timeout_s = settings.peer_timeout_s;
#ifdef WAN_HAVE_MPI
      if (use_mpi) {  // throws the lowest failing rank's failure on every rank
        const BootstrapInfo got = mpi::exchange(early, root_info, settings.timeout_s);
        unique_id = got.blob;
        rc.addr = got.addr;
        rc.port = got.port;
        rc.job = got.job;
      }
#endif
      LaunchState* raw = st.get();
      st->channel = ControlChannel::open(rc, use_mpi ? std::vector<uint8_t>{} : unique_id,
                                         [raw](const Failure& f) { raw->on_verdict(f); }, std::move(listener));
      if (!use_mpi) unique_id = st->channel->blob();
    }
  } else {
    std::string devs;
    for (const auto& c : plan.ranks) devs += cat(devs.empty() ? "" : ",", c.device);
    LOG_INFO("dist: ", plan.world, " rank", plan.world == 1 ? "" : "s", " in this process on device",
             plan.world == 1 ? " " : "s ", devs);
  }

  const auto t_start = now_ns();
  for (int i = 0; i < st->nslots; ++i) st->slots[i].progress_ns = t_start;
  std::vector<std::thread> workers;
  workers.reserve(st->nslots);
  for (int i = 0; i < st->nslots; ++i)
    workers.emplace_back([&, i] { run_rank(*st, plan.ranks[i], fn, unique_id); });

  // Supervisor: hang watchdog, NCCL async errors, stopping communicators after a failure.
  const int64_t timeout_ns = static_cast<int64_t>(settings.timeout_s * 1e9);
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(st->mu);
      if (st->finished == st->nslots) break;
      st->cv.wait_for(lk, std::chrono::milliseconds(100));
      if (st->finished == st->nslots) break;
    }
    if (!st->aborted) {
      const int64_t now = now_ns();
      int done = 0, waiting = -1;
      for (int i = 0; i < st->nslots; ++i) {
        const int ph = st->slots[i].phase.load();
        if (ph == detail::kDone) ++done;
        if (ph == detail::kWaiting) waiting = i;
        if (ph == detail::kRunning && now - st->slots[i].progress_ns.load() > timeout_ns) {
          st->fail({with_rank(plan.ranks[i].rank,
                              cat("no progress for ", settings.timeout_s,
                                  " s (hang watchdog, WAN_DIST_TIMEOUT; a peer may be stuck or the ranks' "
                                  "collectives do not match)")),
                    ErrorKind::Internal});
          break;
        }
      }
      if (!st->aborted && !st->channel && done > 0 && waiting >= 0) {
        // A rank waits in a barrier while another has passed the final one: barrier() counts differ.
        std::optional<Failure> mismatch;
        {
          std::lock_guard<std::mutex> lk(st->mu);  // phases change to/from waiting under this lock
          int d = -1, w = -1;
          for (int i = 0; i < st->nslots; ++i) {
            if (st->slots[i].phase == detail::kDone) d = i;
            if (st->slots[i].phase == detail::kWaiting) w = i;
          }
          if (d >= 0 && w >= 0)
            mismatch = Failure{with_rank(plan.ranks[w].rank,
                                         cat("waits in a barrier that rank ", plan.ranks[d].rank,
                                             " (finished) never reaches: the ranks called barrier() a "
                                             "different number of times")),
                               ErrorKind::Internal};
        }
        if (mismatch) st->fail(*mismatch);
      }
#ifdef WAN_HAVE_NCCL
      if (!st->aborted) poll_async_errors(*st);
#endif
    }
#ifdef WAN_HAVE_NCCL
    if (st->aborted) stop_comms(*st);
#endif
  }
  for (auto& w : workers) w.join();

  std::optional<Failure> f;
  bool final_verdict;
  {
    std::lock_guard<std::mutex> lk(st->mu);
    f = st->failure;
    final_verdict = st->final_verdict;
  }
  if (f && st->channel && !final_verdict) {
    // A rank > 0 failed locally: the verdict (rank 0's choice) is what every rank reports.
    if (auto v = st->channel->wait_verdict(5.0)) f = *v;
  }
  if (st->channel) {
    st->channel->close(3.0);
    st->channel.reset();
  }
  {
    std::lock_guard<std::mutex> lk(st->mu);
    st->all_done = true;
  }
  st->cv.notify_all();
  if (st->reaper.joinable()) st->reaper.join();
  st->ctxs = nullptr;
  if (f) throw Error(f->message, f->kind);
#ifdef WAN_HAVE_MPI
  if (use_mpi) mpi::set_finalize_at_exit(true);
#endif
}

}  // namespace wan::dist
