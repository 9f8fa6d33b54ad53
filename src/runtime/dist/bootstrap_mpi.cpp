// The MPI bootstrap (see bootstrap.h). Compiled only when CMake finds MPI (WAN_HAVE_MPI).
// Every MPI call of the engine is here. The exchange uses non-blocking collectives polled against a
// deadline, so a rank that never arrives is a timeout error, not a hang; MPI errors on the bootstrap's
// communicator are returned (MPI_ERRORS_RETURN) and become wan::Error.

// The C API only: no MPI C++ bindings (Open MPI and MPICH would otherwise need their C++ library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "runtime/dist/bootstrap.h"

namespace wan::dist::mpi {
namespace {

using Clock = std::chrono::steady_clock;

std::mutex g_mu;
MPI_Comm g_comm = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD (errors returned)
World g_world;
std::atomic<bool> g_finalize_ok{true};
std::atomic<bool> g_in_step{true};  // every collective posted here has completed (none timed out)
constexpr double kExitWait = 3.0;   // after a failure: how long a rank waits at exit for the others

std::string error_string(int code) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(code, s, &n) != MPI_SUCCESS) return cat("MPI error ", code);
  return std::string(s, static_cast<size_t>(n));
}
void check(int code, const char* what) {
  if (code != MPI_SUCCESS)
    throw Error(cat("MPI bootstrap: ", what, " failed: ", error_string(code)), ErrorKind::Internal);
}

void wait(MPI_Request& req, Clock::time_point deadline, double timeout_s, const char* what);

// Runs at exit when init() initialised MPI. After a failure no MPI_Finalize (a peer may be stuck or
// gone; see bootstrap.h): the ranks only wait (at most kExitWait s) until every rank is exiting, so
// each has printed its error before mpirun, seeing the first non-zero exit, ends the others.
void at_exit() {
  int fin = 0;
  if (MPI_Finalized(&fin) != MPI_SUCCESS || fin) return;
  if (!g_finalize_ok.load()) {
    if (!g_in_step.load() || g_comm == MPI_COMM_NULL) return;
    try {
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Ibarrier(g_comm, &req), "MPI_Ibarrier");
      wait(req, Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kExitWait)),
           kExitWait, "MPI_Ibarrier");
    } catch (const Error&) {
    }
    return;
  }
  if (g_comm != MPI_COMM_NULL) MPI_Comm_free(&g_comm);
  MPI_Finalize();
}

void wait(MPI_Request& req, Clock::time_point deadline, double timeout_s, const char* what) {
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if (Clock::now() >= deadline)
      throw Error(cat("MPI bootstrap: timed out after ", timeout_s, " s in ", what,
                      ": not every rank reached the exchange (a rank may be stuck before it; WAN_DIST_TIMEOUT "
                      "sets the limit)"),
                  ErrorKind::Internal);
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(5000));
  }
}

}  // namespace

World init() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_comm != MPI_COMM_NULL) return g_world;
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  WAN_CHECK(!fin, "MPI bootstrap: MPI was finalised already in this process");
  if (!inited) {
    // SERIALIZED: the engine's MPI calls come from the thread that calls launch() (or from exit).
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    std::atexit(at_exit);
    LOG_DEBUG("dist: MPI initialised (thread level ", provided, ")");
  }
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  World w;
  check(MPI_Comm_rank(comm, &w.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(comm, &w.world), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  check(MPI_Comm_rank(node, &w.local_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(node, &w.local_size), "MPI_Comm_size");
  MPI_Comm_free(&node);
  g_comm = comm;
  g_world = w;
  return w;
}

BootstrapInfo exchange(const std::optional<Failure>& mine, const BootstrapInfo& root, double timeout_s) {
  World w;
  MPI_Comm comm;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    WAN_ASSERT(g_comm != MPI_COMM_NULL, "mpi::exchange before mpi::init");
    w = g_world;
    comm = g_comm;
  }
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  g_in_step = false;  // until every collective below has completed
  // 1. Who failed: {failed, kind} from every rank.
  int status[2] = {mine ? 1 : 0, mine && mine->kind == ErrorKind::BadInput ? 0 : 1};
  std::vector<int> all(2 * static_cast<size_t>(w.world));
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Iallgather(status, 2, MPI_INT, all.data(), 2, MPI_INT, comm, &req), "MPI_Iallgather");
  wait(req, deadline, timeout_s, "MPI_Iallgather");
  int failed = -1;
  for (int r = 0; r < w.world && failed < 0; ++r)
    if (all[2 * r]) failed = r;
  // 2. The lowest failing rank's message, or rank 0's info: its length, then its bytes.
  const int from = failed >= 0 ? failed : 0;
  std::string msg;
  if (w.rank == from) msg = failed >= 0 ? mine->message : encode_bootstrap_info(root);
  uint64_t len = msg.size();
  check(MPI_Ibcast(&len, 1, MPI_UINT64_T, from, comm, &req), "MPI_Ibcast");
  wait(req, deadline, timeout_s, "MPI_Ibcast");
  WAN_CHECK(len <= (1u << 20), "MPI bootstrap: rank ", from, " sent a message of ", len, " bytes");
  msg.resize(len);
  if (len > 0) {
    check(MPI_Ibcast(msg.data(), static_cast<int>(len), MPI_CHAR, from, comm, &req), "MPI_Ibcast");
    wait(req, deadline, timeout_s, "MPI_Ibcast");
  }
  g_in_step = true;
  if (failed >= 0)
    throw Error(msg.empty() ? cat("rank ", failed, ": failed before the MPI bootstrap") : msg,
                all[2 * failed + 1] == 0 ? ErrorKind::BadInput : ErrorKind::Internal);
  return decode_bootstrap_info(msg);
}

void set_finalize_at_exit(bool ok) { g_finalize_ok = ok; }

}  // namespace wan::dist::mpi
