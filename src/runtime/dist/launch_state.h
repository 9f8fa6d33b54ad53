// The state one launch() shares between its threads (internal to launch*.cpp; see launch.h).
//
// Threads of one launch in one process: one worker per local rank (runs fn), the caller of launch()
// as supervisor (hang watchdog, NCCL async-error polling, stopping communicators after a failure),
// the control channel's I/O thread (multi-process), and a reaper started by the first failure (exits
// the process if ranks do not return within the grace period).
// Locking: LaunchState::mu guards the failure, the in-process barrier and the communicator list; it is
// never held while calling into the control channel or NCCL abort/revoke.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/dist/bootstrap.h"
#include "runtime/dist/launch.h"
#include "runtime/dist/rendezvous.h"

namespace wan::dist::detail {

using Clock = std::chrono::steady_clock;
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

constexpr int kDefaultPort = 29517;
constexpr double kDefaultTimeout = 600, kDefaultGrace = 20, kDefaultPeerTimeout = 30;

// Environment helpers (launch_env.cpp).
const char* getenv_nonempty(const EnvLookup& env, const char* name);
long long parse_int(const char* name, const char* v);  // a whole decimal integer, else wan::Error naming `name`
inline std::string with_rank(int rank, const std::string& msg) { return cat("rank ", rank, ": ", msg); }

#ifdef WAN_HAVE_NCCL
// ncclCommRevoke (NCCL >= 2.28), looked up at run time: the library found at run time may be older
// than the header this was built with. nullptr when absent.
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
RevokeFn nccl_revoke();
#endif

struct Settings {
  double timeout_s = kDefaultTimeout;      // rendezvous limit and hang watchdog
  double grace_s = kDefaultGrace;          // after a failure, how long ranks get to return
  double peer_timeout_s = kDefaultPeerTimeout;
  bool revoke = true;                      // ncclCommRevoke (else ncclCommAbort) on failure
  BootstrapKind bootstrap = BootstrapKind::Auto;  // WAN_BOOTSTRAP
};
Settings settings_from_env(const LaunchOptions& opt);  // WAN_DIST_* (launch_env.cpp)

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

// Member functions are defined in launch_failure.cpp.
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
  void fail(Failure f);
  // The verdict from the control channel: it replaces any local failure.
  void on_verdict(const Failure& f);

  void stamp(int slot) { slots[slot].progress_ns.store(now_ns(), std::memory_order_relaxed); }

  void barrier(int slot, bool final);
};

// The supervisor's loop (runs on the caller of launch()): hang watchdog, barrier-count mismatch, NCCL
// async errors, stopping communicators after a failure. Returns when every worker has finished.
void supervise(LaunchState& st);

#ifdef WAN_HAVE_NCCL
// A worker's communicators after fn: destroyed on success, aborted after a failure.
void release_comms(LaunchState& st, int slot, bool ok);
#endif

}  // namespace wan::dist::detail
