// Multi-process bootstrap and control channel over TCP (host-only: no CUDA, no NCCL).
//
// Rendezvous (rank 0 serves). Rank 0 listens on `port`, accepts one connection from every other rank,
// checks each hello (protocol, job token, world size, rank in range and unique) and answers every rank
// with the same blob (the NCCL unique id: 128 bytes; at most kMaxBlob). Ranks > 0 connect to
// addr:port, retrying while rank 0 is not up yet. Everything is bounded by timeout_s: a missing rank,
// a wrong world size, a port in use or an unreachable rank 0 is one clear wan::Error, never a hang.
// A rendezvous error that rank 0 detects is also sent to the ranks already connected, so they fail
// with the same message.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace wan::dist {

// A rank's failure as every rank reports it: a complete message ("rank 1: out of device memory",
// "lost peer rank 2: ...") and the error kind that decides the CLI's exit code.
struct Failure {
  std::string message;
  ErrorKind kind = ErrorKind::Internal;
};

struct RendezvousConfig {
  std::string addr;                  // rank 0's host name or address, or a comma-separated list of
                                     // candidates tried in turn (unused on rank 0)
  int port = 0;                      // rank 0's TCP port; on rank 0, 0 picks a free port (see port())
  int rank = 0, world = 1;
  std::string job;                   // job token; a connection with another token is refused
  double timeout_s = 600;            // bound on the whole rendezvous
  double heartbeat_timeout_s = 30;   // silence after which a connected peer counts as lost
};

// A TCP socket listening on every local address (dual-stack IPv6, else IPv4). Port 0: an ephemeral
// port, see port(). Throws wan::Error when the port cannot be bound (in use, ...).
class TcpListener {
 public:
  explicit TcpListener(int port);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  int port() const { return port_; }
  int release();  // hands over the socket (the caller closes it)

 private:
  int fd_ = -1, port_ = 0;
};

// Control channel. The connections stay open for the whole launch:
//  - failure: a rank that fails sends its Failure to rank 0; rank 0 decides the verdict (the first
//    failure it sees, its own included) and sends it to every rank. The verdict is what every rank
//    reports, so all ranks fail with the same message even when two fail at once.
//  - lost peer: a connection that closes before the final barrier (the process died, was killed,
//    closed its socket), or is silent for heartbeat_timeout_s (frozen host), is the failure
//    "lost peer rank R: ..." (decided by rank 0 for ranks > 0; by each rank > 0 for rank 0).
//  - barrier: abortable; returns false (instead of hanging) once a verdict is known.
//  - heartbeat: both ends send a ping every second.
// Invariants: every blocking call is bounded (deadline, verdict, or lost peer); the failure handler
// is called at most once per process, with the verdict; after the final barrier releases, closing
// connections are expected and are not failures.
//
// Rank 0's address may be a comma-separated list of candidates (the MPI bootstrap sends rank 0's host
// name and interface addresses): a rank > 0 tries each in turn until one answers. Rank 0 may be handed
// a socket it bound earlier (TcpListener; the MPI bootstrap binds an ephemeral port first, then sends
// its address to the other ranks).
class ControlChannel {
 public:
  static constexpr size_t kMaxBlob = 4096;
  using FailureHandler = std::function<void(const Failure&)>;

  // Runs the rendezvous and starts the channel's I/O thread. Rank 0 sends `blob` to every rank (others
  // pass {}). on_failure is called once with the verdict, from the I/O thread or from the caller of
  // report_failure(); it must not call back into the channel. Throws wan::Error on any rendezvous
  // failure (message names the variable or the peer at fault). Rank 0 serves on `listener` when given
  // (cfg.port is then ignored), else it binds cfg.port.
  static std::unique_ptr<ControlChannel> open(const RendezvousConfig& cfg, std::vector<uint8_t> blob,
                                              FailureHandler on_failure = {},
                                              std::unique_ptr<TcpListener> listener = nullptr);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  const std::vector<uint8_t>& blob() const { return blob_; }
  int rank() const { return cfg_.rank; }
  int world() const { return cfg_.world; }
  int port() const { return port_; }  // the port rank 0 listened on

  // A local failure: rank 0 makes it the verdict (unless one exists) and sends it to all; a rank > 0
  // sends it to rank 0, whose verdict comes back through on_failure.
  void report_failure(const Failure& f);
  std::optional<Failure> verdict() const;
  // Waits up to timeout_s for the verdict (a rank > 0 after reporting a local failure).
  std::optional<Failure> wait_verdict(double timeout_s) const;

  // Waits until every rank has called barrier() the same number of times: true; false when a verdict
  // ends the wait first. `final` marks the last barrier of the launch: once it releases, connections
  // may close without that being a lost peer.
  bool barrier(bool final = false);

  // Ends the channel: rank 0 half-closes every connection and waits (at most drain_s) for the peers
  // to close theirs, so no peer misses the last message; then the I/O thread stops.
  void close(double drain_s = 3.0);

  struct Conn;  // one TCP connection (rank 0: one per peer; rank > 0: one to rank 0)

 private:
  explicit ControlChannel(const RendezvousConfig& cfg);
  void serve(int listen_fd);   // rank 0's rendezvous
  void join();                 // rank > 0's rendezvous
  void io_loop();
  void handle(int peer, uint32_t type, const std::string& payload);
  void set_verdict(const Failure& f);  // first verdict wins; rank 0 also sends it to all
  void lost(int peer, const std::string& why);
  void release(uint64_t gen, bool final);  // rank 0: barrier gen complete
  void send_to(int peer, uint32_t type, const std::string& payload);

  RendezvousConfig cfg_;
  int port_ = 0;
  std::vector<uint8_t> blob_;
  FailureHandler on_failure_;
  std::vector<std::unique_ptr<Conn>> conns_;  // rank 0: index = peer rank (0 unused); else [0] = rank 0
  int wake_[2] = {-1, -1};                    // self-pipe that interrupts the I/O thread's poll
  std::thread io_;

  std::recursive_mutex send_all_mu_;  // held while a verdict or a release goes to every peer
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::optional<Failure> verdict_;
  bool closing_ = false, stop_ = false;
  uint64_t my_gen_ = 0, released_gen_ = 0;
  std::map<uint64_t, int> arrivals_;  // rank 0: barrier gen -> ranks arrived
};

// Host-side socket helpers, exposed for tests. free_tcp_port(): a port that was free a moment ago.
int free_tcp_port();

}  // namespace wan::dist
