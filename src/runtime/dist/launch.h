// Rank launching, NCCL bootstrap and cooperative failure for multi-GPU runs.
//
// launch(opt, fn) runs fn once per rank, on one code path for both ways of starting ranks: threads of
// one process (one per device), or one process per rank started by mpirun, srun or by hand. Either way
// the ranks meet (bootstrap.h), get an NCCL world communicator and a control channel (rendezvous.h).
// Invariants: if any rank fails, every rank ends with the same wan::Error within seconds; nothing
// hangs (a rank that does not return after a failure ends its process); NVLink multicast stays off
// (NCCL_NVLS_ENABLE=0 unless already set). Details: above launch(), LauncherEnv and maybe_fail().
// Implementation: launch.cpp (the launch), launch_failure.cpp (watchdog, failure, communicators),
// launch_env.cpp (options and environment), launch_state.h (their shared state).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

#ifdef WAN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace wan::dist {

namespace detail {
struct LaunchState;
}

struct LaunchOptions {
  std::vector<int> devices;  // in-process: one rank (thread) per device; multi-process: by local rank
  bool nccl = true;          // make the NCCL world communicator (false: host-only ranks; CPU tests)
  double timeout_s = 0;      // rendezvous limit and hang watchdog; 0: WAN_DIST_TIMEOUT, else 600 s
};

// The CLI's --gpus N and --devices 0,1,... (empty string = not given; giving both is an error).
// Neither: one rank on device 0.
LaunchOptions parse_launch_options(const std::string& gpus, const std::string& devices);

// One rank's view of the launch.
struct RankContext {
  int rank = 0, world = 1, local_rank = 0, device = 0;
  bool in_process = true;  // threads of one process, or one process per rank (mpirun/srun/env)
  std::string bootstrap;   // how the ranks met: "in-process", "tcp", "mpi", or "none" (a launcher's only rank)
#ifdef WAN_HAVE_NCCL
  ncclComm_t comm = nullptr;  // world communicator (blocking), initialised; `device` is current
#endif

  // Throws the failure (same message on every rank) if any rank has failed; else marks this rank as
  // making progress (the hang watchdog's signal).
  void check_abort() const;
  bool aborted() const;  // no throw, no progress mark
  // Host barrier over all ranks; throws the failure instead of hanging if a rank fails meanwhile.
  void barrier() const;
#ifdef WAN_HAVE_NCCL
  // Hands a communicator made inside fn (ncclCommSplit of comm, ...) to the launch: it is stopped with
  // the others on failure, and destroyed (before the world communicator) when fn has returned on every
  // rank, or aborted after a failure. The caller must not destroy it; unregister_comm() takes it back.
  void register_comm(ncclComm_t c) const;
  void unregister_comm(ncclComm_t c) const;
  // cudaStreamSynchronize(s) then check_abort(), then a CUDA error check: the abort-aware way to wait
  // for a collective (after a failure elsewhere it throws the failure, not NCCL's or CUDA's symptom).
  void sync(cudaStream_t s) const;
  // Checks an NCCL call's result the abort-aware way: after a failure elsewhere, calls on stopped
  // communicators fail with NCCL's own error (e.g. "internal error" from a revoked communicator);
  // this throws the launch's failure instead. Else a failed call is "NCCL error N (...) in <what>".
  void check_nccl(ncclResult_t r, const char* what) const;
#endif

  detail::LaunchState* state_ = nullptr;  // owned by launch()
  int slot_ = 0;                          // index of this rank among the process's ranks
};

// launch(opt, fn) runs fn once per rank, on one code path for both ways of starting ranks:
//  - in-process: no launcher environment. One thread per device in opt.devices (the CLI's --gpus N or
//    --devices 0,1,...); the NCCL unique id is made in the process, each thread calls
//    ncclCommInitRankConfig with its device current.
//  - multi-process: started by mpirun, srun or by hand with WAN_RANK. One rank per process; rank, world
//    size and local rank come from the launcher's environment (in this order of precedence):
//      WAN_RANK / WAN_WORLD_SIZE / WAN_LOCAL_RANK
//      OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK   (Open MPI mpirun)
//      PMI_RANK / PMI_SIZE / MPI_LOCALRANKID or PMI_LOCAL_RANK                   (MPICH, Intel MPI)
//      SLURM_PROCID / SLURM_STEP_NUM_TASKS or SLURM_NTASKS / SLURM_LOCALID       (srun)
//    WAN_LOCAL_RANK, when set, overrides the local rank of any launcher. (SLURM: a batch script run
//    outside srun with SLURM_NTASKS > 1 looks like rank 0 of a job; it then fails at the rendezvous
//    timeout, naming the missing ranks.) Rank 0 serves a TCP rendezvous at
//    WAN_MASTER_ADDR:WAN_MASTER_PORT (MASTER_ADDR / MASTER_PORT accepted too). The address defaults to
//    127.0.0.1 when the launcher says every rank is on one node (OMPI_COMM_WORLD_LOCAL_SIZE,
//    MPI_LOCALNRANKS or WAN_LOCAL_WORLD_SIZE equal to the world size; SLURM_STEP_NUM_NODES or
//    SLURM_NNODES = 1), the port to 29517. Rank 0 sends every rank the NCCL unique id; the connections
//    stay open as the control channel (rendezvous.h). A job token (WAN_JOB_ID, else the launcher's job
//    id) keeps ranks of another job that reach the same port out.
//    The device is opt.devices[local_rank] when devices are given, device 0 when the process sees one
//    GPU (CUDA_VISIBLE_DEVICES per rank), else local_rank.
//    That is the tcp bootstrap. A build with MPI started by mpirun/mpiexec (or srun --mpi=...) uses
//    the mpi bootstrap instead (bootstrap.h; WAN_BOOTSTRAP=tcp|mpi forces one): rank, world size and
//    local rank come from MPI, and the unique id and rank 0's control address go over MPI, so no
//    WAN_MASTER_ADDR/PORT is needed. Either way the same code path continues: control channel, NCCL
//    init, failure propagation. Under MPI a rank's error before that point (bad --devices, ...)
//    reaches every rank as "rank R: <message>".
//
// Failure: if any rank fails, every rank ends with the same wan::Error within seconds.
//  - a rank's exception (bad input, out of memory, NCCL or CUDA error) becomes the failure
//    "rank R: <message>"; across processes rank 0 decides the verdict and relays it to all (so two
//    ranks failing at once still give one message everywhere);
//  - a lost peer (process died or was killed: its control connection closed; or silent for
//    WAN_DIST_PEER_TIMEOUT s, default 30) is "lost peer rank R: ...";
//  - a hang: a rank that makes no progress (see check_abort) for WAN_DIST_TIMEOUT s (default 600; also
//    the rendezvous's limit) fails with "rank R: no progress for T s ...";
//  - NCCL asynchronous errors (ncclCommGetAsyncError, polled every 100 ms) fail the rank that owns
//    the communicator.
//  On the first failure, a watchdog thread per process stops every NCCL communicator of the launch
//  (the world one and those given to register_comm): ncclCommRevoke (NCCL >= 2.28) or ncclCommAbort
//  (WAN_DIST_ABORT_MODE=revoke|abort), so ranks blocked in NCCL kernels or in cudaStreamSynchronize
//  return. Ranks then see the failure at their next check_abort(). A rank that has not returned
//  WAN_DIST_ABORT_GRACE s (default 20) after the failure is not waited for: the process prints
//  "error: <message>" and exits (code 2 for bad input, else 1), so nothing hangs.
//
// Rules for code running inside fn:
//  - wait for collectives with ctx.sync(stream) and check NCCL results with ctx.check_nccl(r, what), or
//    call ctx.check_abort() after every stream synchronisation that follows a collective, and at least
//    every few seconds in long loops (it is also the progress signal of the hang watchdog; a rank busy
//    alone for longer than WAN_DIST_TIMEOUT must call it while it works);
//  - ranks that wait for a busy rank should wait in ctx.barrier(), not inside a collective;
//  - every rank calls barrier() the same number of times.
//
// Runs fn once per rank (as above). Returns when every rank has returned; throws one
// wan::Error (the verdict: "rank R: <message>" or "lost peer rank R: ...") on every rank/process if
// any rank failed. Bad options or environment (device out of range, rank >= world, no master address,
// a port in use, ...) are a wan::Error before any rank starts (under the mpi bootstrap, on every rank:
// "rank R: <message>" of the lowest failing rank).
void launch(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn);

// What the launcher's environment says (see launch() above); nullopt when the process was not
// started by a launcher. Throws wan::Error naming the variable on malformed values.
struct LauncherEnv {
  std::string source;  // "WAN", "OMPI", "PMI" or "SLURM"
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;  // empty when not given and not known to be single-node
  int master_port = 0;
  std::string job;  // job token from the launcher (job/step id), may be empty
};
using EnvLookup = std::function<const char*(const char*)>;  // getenv-like
std::optional<LauncherEnv> parse_launcher_env(const EnvLookup& env);
bool launcher_environment();  // true when started by mpirun/srun/WAN_RANK

// Test hook: maybe_fail(ctx, tag) fails rank WAN_DIST_FAIL_RANK at the point named WAN_DIST_FAIL_AT
// (any point when unset). WAN_DIST_FAIL_MODE: throw (default) | exit (the process dies at once, like a
// crash) | hang (stops making progress until the failure is noticed) | oom (a real out-of-memory error:
// a huge cudaMalloc, or host bad_alloc without CUDA). launch() calls it at "bootstrap" (multi-process,
// before the ranks exchange the unique id; only when WAN_DIST_FAIL_AT names it; "hang" there stops the
// process for good: the other ranks fail at their bootstrap timeout and the launcher ends it), "init"
// (before the NCCL communicator is made) and "start" (just before fn).
void maybe_fail(const RankContext& ctx, const char* tag);

}  // namespace wan::dist
