// How the processes of a multi-process launch find each other: NCCL bootstrapped through MPI when
// built with it, or through a TCP rendezvous given by environment variables; the same code path
// either way.
//
// Two bootstraps deliver the same three things to every rank: its rank, world size and local rank; the
// NCCL unique id made by rank 0; rank 0's control-channel address (rendezvous.h). launch() continues on
// one code path after either (control channel, NCCL init, failure propagation).
//  - tcp: rank/world/local rank from the launcher's environment (launch.h); rank 0 serves a TCP
//    rendezvous at WAN_MASTER_ADDR:WAN_MASTER_PORT that carries the unique id.
//  - mpi (builds with MPI, WAN_HAVE_MPI): rank/world from MPI_COMM_WORLD, the local rank from
//    MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) (WAN_LOCAL_RANK still overrides it); rank 0 binds an
//    ephemeral TCP port (WAN_MASTER_PORT when set) and broadcasts, over MPI, the unique id, its address
//    (WAN_MASTER_ADDR when set; 127.0.0.1 when every rank shares its node; else its host name and
//    interface addresses, tried in turn) and a random job token. No WAN_MASTER_* is needed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/dist/launch.h"
#include "runtime/dist/rendezvous.h"

namespace wan::dist {

// Choice (WAN_BOOTSTRAP=auto|tcp|mpi, default auto): auto takes mpi when built with MPI and the
// environment is an MPI launcher's (OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, PMIX_RANK,
// MPI_LOCALNRANKS: mpirun, mpiexec, srun --mpi=pmix|pmi2) and WAN_RANK is not set (a launch by hand);
// else tcp, e.g. under plain srun. WAN_BOOTSTRAP=mpi in a build without MPI is one clear error, as is
// any other value (checked at every launch). Only multi-process launches of more than one rank use a
// bootstrap.
enum class BootstrapKind { Auto, Tcp, Mpi };

bool mpi_built();  // this build has the MPI bootstrap (WAN_HAVE_MPI)
// WAN_BOOTSTRAP: unset, empty or "auto" -> Auto; "tcp"; "mpi". Throws wan::Error on any other value,
// and on "mpi" when !built_with_mpi.
BootstrapKind parse_bootstrap(const EnvLookup& env, bool built_with_mpi);
// The environment shows an MPI launcher (see "Choice" above).
bool mpi_launcher_env(const EnvLookup& env);
// The bootstrap of a multi-process launch: Tcp or Mpi (never Auto).
BootstrapKind choose_bootstrap(BootstrapKind requested, const EnvLookup& env, bool built_with_mpi);
const char* bootstrap_name(BootstrapKind k);  // "auto", "tcp", "mpi"

// What rank 0 sends every rank in the MPI bootstrap.
struct BootstrapInfo {
  std::vector<uint8_t> blob;  // the NCCL unique id (128 bytes), or empty (host-only ranks)
  std::string addr;           // rank 0's control-channel address, or candidates separated by commas
  int port = 0;               // rank 0's control-channel port
  std::string job;            // job token of the control channel
};
std::string encode_bootstrap_info(const BootstrapInfo& info);
BootstrapInfo decode_bootstrap_info(const std::string& bytes);  // throws wan::Error when malformed

// Rank 0's control-channel address when every rank shares its node: 127.0.0.1; else this host's name,
// then the IPv4 addresses of its up, non-loopback interfaces (not docker*/virbr*/veth*), comma-separated.
std::string control_addresses(bool one_node);

#ifdef WAN_HAVE_MPI
namespace mpi {

// Failures before the exchange (MPI): the exchange is a bounded collective (non-blocking MPI calls
// polled against WAN_DIST_TIMEOUT). Every rank first says whether it failed (bad --devices, no
// device, no free port, forced test failure, ...); if any did, every rank throws the lowest failing
// rank's failure, the same message everywhere. A rank that never reaches the exchange (stuck) makes the
// others fail with the timeout error; a rank that dies makes mpirun end the job.
// MPI's life: MPI_Init_thread (MPI_THREAD_SERIALIZED; all MPI calls come from the thread that calls
// launch(), or from exit) runs at the first MPI launch unless MPI is already initialised; if it was
// initialised here, MPI_Finalize runs at process exit (atexit) only when the last MPI launch ended
// well. After a failure MPI_Finalize is never called (it synchronises with the other ranks, so it could
// hang on a stuck or dead one): the process prints its one error and exits with code 1 or 2; at exit
// it first waits, at most 3 s (a non-blocking barrier), until every rank is exiting, so that each rank
// has printed its error before mpirun, seeing the first non-zero exit, ends the job. mpirun then
// reports the non-zero exit and ends any rank still running (a stuck one).

struct World {
  int rank = 0, world = 1;
  int local_rank = 0, local_size = 1;  // within the ranks that share this node (MPI_COMM_TYPE_SHARED)
};
// MPI_Init_thread unless MPI is initialised already (then nothing is finalised here either); the
// communicator the bootstrap uses (a duplicate of MPI_COMM_WORLD whose errors are returned, not fatal)
// and this rank's place. Collective: every rank of MPI_COMM_WORLD calls it (it does not time out).
World init();
// Collective over every rank, bounded by timeout_s: `mine` is this rank's failure before the
// exchange, if any; `root` is rank 0's info (ignored elsewhere). Returns rank 0's info on every rank,
// or throws on every rank the failure of the lowest failing rank (its message and kind). A rank that
// does not arrive within timeout_s is a wan::Error on the ranks that did.
BootstrapInfo exchange(const std::optional<Failure>& mine, const BootstrapInfo& root, double timeout_s);
// Whether MPI_Finalize may run at exit (when init() initialised MPI): launch() clears it when an MPI
// launch starts and sets it when the launch ends well.
void set_finalize_at_exit(bool ok);

}  // namespace mpi
#endif

}  // namespace wan::dist
