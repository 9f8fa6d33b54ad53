// Cooperative failure of a launch (see launch.h, "Failure"): the shared failure state and barrier,
// the reaper, RankContext's abort-aware calls, the supervisor's watchdog loop, stopping and freeing
// NCCL communicators, and the maybe_fail test hook.
// Invariants: the first failure wins locally, a verdict from the control channel replaces it; no
// communicator is freed while another rank of this process may still use it; LaunchState::mu is
// never held while calling into the control channel or NCCL abort/revoke.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/log.h"
#include "runtime/dist/launch_state.h"

#ifdef WAN_HAVE_NCCL
#include "kernels/check.h"
#endif

namespace wan::dist {
namespace detail {

void LaunchState::fail(Failure f) {
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

void LaunchState::on_verdict(const Failure& f) {
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

void LaunchState::barrier(int slot, bool final) {
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
  if (detail::parse_int("WAN_DIST_FAIL_RANK", r) != ctx.rank) return;
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
// Communicators and the supervisor

namespace detail {
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
#endif

// Fails a rank that has made no progress for the timeout (the hang watchdog). Returns the number of
// finished ranks and, in `waiting`, one rank waiting in a barrier (-1: none).
int check_hangs(LaunchState& st, int& waiting) {
  const auto& ranks = *st.ctxs;
  const int64_t timeout_ns = static_cast<int64_t>(st.s.timeout_s * 1e9);
  const int64_t now = now_ns();
  int done = 0;
  waiting = -1;
  for (int i = 0; i < st.nslots; ++i) {
    const int ph = st.slots[i].phase.load();
    if (ph == kDone) ++done;
    if (ph == kWaiting) waiting = i;
    if (ph == kRunning && now - st.slots[i].progress_ns.load() > timeout_ns) {
      st.fail({with_rank(ranks[i].rank, cat("no progress for ", st.s.timeout_s,
                                            " s (hang watchdog, WAN_DIST_TIMEOUT; a peer may be stuck or the ranks' "
                                            "collectives do not match)")),
               ErrorKind::Internal});
      break;
    }
  }
  return done;
}

// In-process: a rank waits in a barrier while another has passed the final one, so barrier() counts
// differ; that rank would wait forever.
void check_barrier_mismatch(LaunchState& st) {
  const auto& ranks = *st.ctxs;
  std::optional<Failure> mismatch;
  {
    std::lock_guard<std::mutex> lk(st.mu);  // phases change to/from waiting under this lock
    int d = -1, w = -1;
    for (int i = 0; i < st.nslots; ++i) {
      if (st.slots[i].phase == kDone) d = i;
      if (st.slots[i].phase == kWaiting) w = i;
    }
    if (d >= 0 && w >= 0)
      mismatch = Failure{with_rank(ranks[w].rank, cat("waits in a barrier that rank ", ranks[d].rank,
                                                      " (finished) never reaches: the ranks called barrier() a "
                                                      "different number of times")),
                         ErrorKind::Internal};
  }
  if (mismatch) st.fail(*mismatch);
}

}  // namespace

void supervise(LaunchState& st) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(st.mu);
      if (st.finished == st.nslots) break;
      st.cv.wait_for(lk, std::chrono::milliseconds(100));
      if (st.finished == st.nslots) break;
    }
    if (!st.aborted) {
      int waiting = -1;
      const int done = check_hangs(st, waiting);
      if (!st.aborted && !st.channel && done > 0 && waiting >= 0) check_barrier_mismatch(st);
#ifdef WAN_HAVE_NCCL
      if (!st.aborted) poll_async_errors(st);
#endif
    }
#ifdef WAN_HAVE_NCCL
    if (st.aborted) stop_comms(st);
#endif
  }
}

#ifdef WAN_HAVE_NCCL
// After a failure nothing is freed until every communicator of the launch in this process is stopped:
// a kernel of one rank may still be reading another rank's buffers (in-process peers share them over
// NVLink).
void release_comms(LaunchState& st, int slot, bool ok) {
  std::vector<CommEntry> mine;
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

}  // namespace detail
}  // namespace wan::dist
